package pipeline

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
)

// Merge returns one stream of the items of all the given streams, in arrival order
// (fan-in). It has no queue of its own: every input sends straight into the queue of
// the merged stream's consumer, which bounds them all. The merged stream ends when every
// input has ended. An input that fails fails the run with its error, and a run that
// stops for any reason (an error, a canceled context, a loop over [All] broken early)
// stops every input. All streams must belong to one pipeline; Merge panics otherwise,
// or if given none.
//
// To merge the output of another pipeline, make it a source of this one:
// FromSeq2(p, All(ctx, other)).
func Merge[T any](streams ...*Stream[T]) *Stream[T] {
	if len(streams) == 0 {
		panic("pipeline: Merge of no streams")
	}
	for _, s := range streams {
		s.check("Merge")
	}
	p := streams[0].p
	descs := make([]string, len(streams))
	for i, s := range streams {
		if s.p != p {
			panic(fmt.Sprintf("pipeline: Merge of streams from different pipelines (%s)", s.desc))
		}
		descs[i] = s.desc
	}
	desc := "Merge(" + strings.Join(descs, ", ") + ")"
	for _, s := range streams {
		s.consume(desc)
	}
	out := newStream[T](p, desc)
	out.open = func(r *run, next outlet[T], done func()) {
		var left atomic.Int32
		left.Store(int32(len(streams)))
		var feeders []*row
		for _, s := range streams {
			r.feeders = nil
			s.open(r, next, func() {
				if left.Add(-1) == 0 {
					done()
				}
			})
			feeders = append(feeders, r.feeders...)
		}
		r.feeders = feeders
	}
	return out
}

// Tee returns n streams that each carry every item of s (broadcast). Each item is
// offered to the branches one after the other, so the slowest branch sets the pace of
// all (backpressure), and memory stays bounded by the branches' queues. The branches
// share the items: for pointer or slice items, they must not modify them. It panics if
// n < 1.
func Tee[T any](s *Stream[T], n int) []*Stream[T] {
	s.check("Tee")
	if n < 1 {
		panic(fmt.Sprintf("pipeline: Tee(%d): need at least one branch", n))
	}
	s.consume("Tee")
	// Each branch is opened by its own consumer; the upstream is opened once all n
	// have given their push function, within one run.
	var (
		cur       *run
		nexts     []outlet[T]
		dones     []func()
		consumers [][]*row // per branch, the first rows downstream of it
	)
	outs := make([]*Stream[T], n)
	for i := range outs {
		out := newStream[T](s.p, fmt.Sprintf("%s | Tee[%d]", s.desc, i))
		out.open = func(r *run, next outlet[T], done func()) {
			if cur != r {
				cur, nexts, dones, consumers = r, nil, nil, nil
			}
			nexts = append(nexts, next)
			dones = append(dones, done)
			consumers = append(consumers, r.consumers)
			if len(nexts) < n {
				r.feeders = nil // known once the upstream is wired, below
				return
			}
			// The upstream is wired below, inside the last branch's wiring: the rows of
			// the earlier branches learn their upstream here (a drained budget must reach
			// the source through any branch, and the report orders rows upstream first).
			defer func() {
				for _, cs := range consumers[:n-1] {
					for _, c := range cs {
						for _, f := range r.feeders {
							f.feed(c)
						}
					}
				}
			}()
			ns, ds, cs := nexts, dones, consumers
			prev := r.consumers // upstream of this Tee, every branch's first rows are fed
			r.consumers = slices.Concat(cs...)
			defer func() { r.consumers = prev }()
			s.open(r, func(h *hand) sender[T] {
				snds := make([]sender[T], len(ns))
				for i, next := range ns {
					snds[i] = next(h)
				}
				return sender[T]{
					put: func(v T, pos uint64) error {
						r.track.split(pos, len(snds))
						var first error
						for i, snd := range snds {
							if err := teePush(r, h, snd.put, v, pos, cs, i); err != nil && first == nil {
								first = err // offer it to every branch, so that each counts it
							}
						}
						return first
					},
					flush: func() error {
						var first error
						for _, snd := range snds {
							if err := snd.flush(); err != nil && first == nil {
								first = err
							}
						}
						return first
					},
					drop: func() {
						for _, snd := range snds {
							snd.drop()
						}
					},
				}
			}, func() {
				for _, d := range ds {
					d()
				}
			})
		}
		outs[i] = out
	}
	return outs
}

// teePush hands v to one branch. A panic in the branch's inline operators (Map, Filter,
// Flatten) fails the run under the name of the row v came from (whose goroutine h is),
// like any inline panic, and not under another row that feeds the branch (a stream
// merged in after the operator); the item counts as failed in the branch's first rows,
// while the upstream, whose item other branches may already hold, counts it as sent.
// A runtime.Goexit in branch i ends the offering: the item counts as lost in it and in
// the branches after it, and the run fails with ErrGoexit (the upstream's worker,
// unwinding, counts the item as failed).
func teePush[T any](r *run, h *hand, push pushFunc[T], v T, pos uint64, branches [][]*row, i int) (err error) {
	returned := false
	defer guard(&returned, func(perr error) {
		goexit := isGoexit(perr)
		lost := branches[i : i+1]
		if goexit { // the goroutine goes on exiting; no later branch is offered v
			lost = branches[i:]
		}
		for _, b := range lost {
			for _, c := range b {
				c.lost.Add(1)
			}
		}
		serr := &StageError{Stage: r.producerOf(h, branches[i]), Err: perr}
		r.fail(serr)
		if !goexit {
			err = serr
		}
	})
	err = push(v, pos)
	returned = true
	return err
}
