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
	out.open = func(r *run, c into[Out]) []*row {
		return s.open(r, into[In]{out: func(h *hand) sender[In] {
			snd := c.out(h)
			return wrap(snd, func(v In, pos uint64) error { return snd.put(fn(v), pos) })
		}, done: c.done, rows: c.rows})
	}
	return out
}

// Filter returns a stream of the items of s for which keep returns true. Like [Map], it
// runs inline. Dropped items are counted in the [Report], in a row of kind [KindFilter]
// named by [WithName], or else "Filter" ("Filter#2", ... when there are several); its
// In is what reached it, its Out what it let through. It counts them per chunk of
// items, so an item costs no atomic operation.
func Filter[T any](s *Stream[T], keep func(T) bool, opts ...FilterOption) *Stream[T] {
	s.check("Filter")
	if keep == nil {
		panic("pipeline: Filter(nil)")
	}
	cfg := configure("Filter", opts, FilterOption.filterOption)
	s.consume("Filter")
	name := s.p.rowName(cfg.name, "Filter")
	out := newStream[T](s.p, s.desc+" | Filter")
	out.open = func(r *run, c into[T]) []*row {
		next, done := c.out, c.done
		rw := r.newRow(name, KindFilter, 0, 0, nil)
		rw.filtered, rw.arrived = new(atomic.Int64), new(atomic.Int64)
		wireInput(r, rw, s, func(h *hand) sender[T] {
			snd := next(h)
			// arrived and filtered count the items of the producer's current chunk, added
			// to the row when it flushes (or drops) them.
			var arrived, filtered int64
			commit := func() {
				if arrived != 0 {
					rw.arrived.Add(arrived)
				}
				if filtered != 0 {
					rw.filtered.Add(filtered)
				}
				arrived, filtered = 0, 0
			}
			return sender[T]{
				put: func(v T, pos uint64) error {
					// A panic in keep, or in an inline operator after the filter, fails the
					// item upstream (in the row whose goroutine runs it): then it never
					// arrived here.
					if keep(v) {
						err := snd.put(v, pos)
						arrived++
						return err
					}
					arrived++
					filtered++
					snd.settle(pos) // dropped: done with
					return nil
				},
				flush: func() error { err := snd.flush(); commit(); return err },
				drop:  func() { snd.drop(); commit() },
				track: snd.track,
			}
		}, done)
		r.addRow(rw)
		return []*row{rw}
	}
	return out
}
