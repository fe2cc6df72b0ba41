package pipeline

import "sync/atomic"

// Map returns a stream of fn applied to each item of s. It is an inline operator: fn
// runs in the goroutines that produce s (a source's, or the upstream stage's workers),
// with no queue and no goroutine of its own, so it costs one function call per item.
// Use it for cheap, non-failing transformations; fn must be safe for concurrent use
// when s comes from a stage with several workers. A panic in fn fails the run under
// the upstream's name. For work that can fail, block or retry, use a [Stage].
func Map[In, Out any](s *Stream[In], fn func(In) Out) *Stream[Out] {
	s.check("Map")
	if fn == nil {
		panic("pipeline: Map(nil)")
	}
	s.consume("Map")
	out := newStream[Out](s.p, s.desc+" | Map")
	out.open = func(r *run, push pushFunc[Out], done func()) {
		s.open(r, func(v In, pos uint64) error { return push(fn(v), pos) }, done)
	}
	return out
}

// Filter returns a stream of the items of s for which keep returns true. Like [Map], it
// runs inline. Dropped items are counted in the [Report], in a row of kind "filter"
// named by [WithName], or else "Filter" ("Filter#2", ... when there are several); its
// In is what reached it, its Out what it let through. Counting costs an atomic add per
// item, and one more per dropped item.
func Filter[T any](s *Stream[T], keep func(T) bool, opts ...FilterOption) *Stream[T] {
	s.check("Filter")
	if keep == nil {
		panic("pipeline: Filter(nil)")
	}
	cfg := configure("Filter", opts, FilterOption.filterOption)
	s.consume("Filter")
	name := s.p.rowName(cfg.name, "Filter")
	out := newStream[T](s.p, s.desc+" | Filter")
	out.open = func(r *run, push pushFunc[T], done func()) {
		rw := r.newRow(name, kindFilter, 0, 0, nil)
		rw.filtered, rw.arrived = new(atomic.Int64), new(atomic.Int64)
		wireInput(r, rw, s, func(v T, pos uint64) (err error) {
			// A panic in keep, or in an inline operator after the filter, fails the item
			// upstream (in the row whose goroutine runs it): then it never arrived here.
			rw.arrived.Add(1)
			returned := false
			defer func() {
				if !returned {
					rw.arrived.Add(-1)
				}
			}()
			if keep(v) {
				err = push(v, pos)
				returned = true
				return err
			}
			returned = true
			rw.filtered.Add(1)
			r.track.done(pos)
			return nil
		}, done)
		r.addRow(rw)
		r.feeds(rw)
	}
	return out
}
