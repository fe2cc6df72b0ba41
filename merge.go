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
//
// A [Window] over a merged stream has one watermark over all its inputs unless it is
// given [WithWatermarkPer], with a function that tells from an item which input it
// came from: its watermark is then the least of its inputs'.
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
	out.open = func(r *run, c into[T]) []*row {
		left := new(atomic.Int32) // this run's inputs not ended yet
		left.Store(int32(len(streams)))
		end := func() {
			if left.Add(-1) == 0 {
				c.done()
			}
		}
		var feeders []*row
		for _, s := range streams {
			feeders = append(feeders, s.open(r, into[T]{out: c.out, done: end, rows: c.rows})...)
		}
		return feeders
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
	t := &tee[T]{s: s, n: n}
	outs := make([]*Stream[T], n)
	for i := range outs {
		out := newStream[T](s.p, fmt.Sprintf("%s | Tee[%d]", s.desc, i))
		out.open = func(r *run, c into[T]) []*row { return t.open(r, c) }
		outs[i] = out
	}
	return outs
}

// tee is the definition of a [Tee]: its upstream and its number of branches. What a
// run's wiring collects from the branches is the run's (teeWiring, in run.tees).
type tee[T any] struct {
	s *Stream[T]
	n int
}

// teeWiring is what one run has collected of a Tee's branches while it wires them.
type teeWiring[T any] struct{ branches []into[T] }

// open wires one branch into run r. Each branch is opened by its own consumer; the
// upstream is opened once all n have given theirs, inside the last branch's wiring.
// The earlier branches learn the rows that feed them only then, so their open
// returns none and the last one feeds their first rows itself: a drained budget must
// reach the source through any branch, and the report orders rows upstream first.
func (t *tee[T]) open(r *run, c into[T]) []*row {
	if r.tees == nil {
		r.tees = make(map[any]any)
	}
	tw, _ := r.tees[t].(*teeWiring[T])
	if tw == nil {
		tw = new(teeWiring[T])
		r.tees[t] = tw
	}
	tw.branches = append(tw.branches, c)
	if len(tw.branches) < t.n {
		return nil
	}
	delete(r.tees, t)
	bs := tw.branches
	rows := make([][]*row, len(bs)) // per branch, its first rows downstream
	for i, b := range bs {
		rows[i] = b.rows
	}
	feeders := t.s.open(r, into[T]{out: func(h *hand) sender[T] {
		snds := make([]sender[T], len(bs))
		for i, b := range bs {
			snds[i] = b.out(h)
		}
		return sender[T]{
			put: func(v T, pos uint64) error {
				snds[0].split(pos, len(snds)) // a copy per branch
				var first error
				for i, snd := range snds {
					if err := teePush(r, h, snd.put, v, pos, rows, i); err != nil && first == nil {
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
			track: snds[0].track,
		}
	}, done: func() {
		for _, b := range bs {
			b.done()
		}
	}, rows: slices.Concat(rows...)})
	for _, cs := range rows[:t.n-1] {
		for _, c := range cs {
			for _, f := range feeders {
				f.feed(c)
			}
		}
	}
	return feeders
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
