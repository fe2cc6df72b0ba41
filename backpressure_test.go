package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// counted returns a sequence of 0 ... n-1 that adds each item to taken as it yields it.
func counted(n int, taken *atomic.Int64) iter.Seq[int] {
	return func(yield func(int) bool) {
		for i := range n {
			taken.Add(1)
			if !yield(i) {
				return
			}
		}
	}
}

// countReleased returns a sink's function that waits for release (or its context's
// end), then counts its item in n.
func countReleased(release <-chan struct{}, n *atomic.Int64) func(context.Context, int) error {
	return func(ctx context.Context, _ int) error {
		select {
		case <-release:
		case <-ctx.Done():
			return ctx.Err()
		}
		n.Add(1)
		return nil
	}
}

// TestBackpressure blocks the sink of source → s1 → sink and lets a fast source run
// until everything is blocked (synctest.Wait: every goroutine of the bubble is durably
// blocked, with no time passing and no sleep). The source must then have given up at
// most one item per queue slot, one per busy worker and one for itself, whatever the
// input size; after the sink is released, every item arrives and no queue's peak
// exceeds its capacity.
func TestBackpressure(t *testing.T) {
	t.Parallel()
	const n = 1000 // far more than the pipeline can hold
	for _, buf := range []int{0, 1, 4, 16} {
		for _, workers := range []int{1, 3} {
			t.Run(fmt.Sprintf("buf=%d/workers=%d", buf, workers), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					var taken atomic.Int64
					src := counted(n, &taken)
					release := make(chan struct{})
					var delivered atomic.Int64
					p := pipeline.New(pipeline.WithBuffer(buf))
					s := pipeline.Then(pipeline.FromSeq(p, src), pipeline.NewStage("s1", workers, identity))
					pipeline.To(s, pipeline.NewSink("sink", workers, countReleased(release, &delivered)))
					errc := runAsync(t.Context(), p)

					synctest.Wait() // everything is blocked on the sink
					// Two queues of buf, s1's workers each holding one item (blocked
					// sending it), the sink's workers each holding one, and the source
					// holding the one it could not send.
					bound := int64(2*buf + 2*workers + 1)
					assert.LessOrEqual(t, taken.Load(), bound, "items taken while the sink is blocked")
					assert.Equal(t, bound, taken.Load(), "the pipeline should fill up to its bound")
					assert.Zero(t, delivered.Load())

					close(release)
					require.NoError(t, <-errc)
					assert.Equal(t, int64(n), delivered.Load())
					rep := p.Report()
					checkReport(t, rep)
					for _, name := range []string{"s1", "sink"} {
						r := row(t, rep, name)
						assert.Equal(t, buf, r.QueueCap)
						assert.LessOrEqual(t, r.PeakQueue, buf, "peak of %s's queue", name)
					}
					assert.Equal(t, buf, row(t, rep, "sink").PeakQueue, "the sink's queue was full")
				})
			})
		}
	}
}

// TestBufferPerStage checks that a stage's WithBuffer overrides the pipeline's, and
// that the default is DefaultBuffer.
func TestBufferPerStage(t *testing.T) {
	t.Parallel()
	p := pipeline.New(pipeline.WithBuffer(7))
	s := pipeline.Then(pipeline.FromSlice(p, ints(10)), pipeline.NewStage("a", 1, identity))
	s = pipeline.Then(s, pipeline.NewStage("b", 1, identity, pipeline.WithBuffer(3)))
	_, err := pipeline.Collect(t.Context(), s)
	require.NoError(t, err)
	rep := p.Report()
	assert.Equal(t, 7, row(t, rep, "a").QueueCap)
	assert.Equal(t, 3, row(t, rep, "b").QueueCap)

	p = pipeline.New()
	_, err = pipeline.Collect(t.Context(), pipeline.Then(pipeline.FromSlice(p, ints(10)), pipeline.NewStage("a", 1, identity)))
	require.NoError(t, err)
	assert.Equal(t, pipeline.DefaultBuffer, row(t, p.Report(), "a").QueueCap)
}

// TestRoomAfterRun checks that a worker gives back the room of every item of a run it
// finished: the first item of a run counts as started when taken, each other one before
// its function is called. The stage's worker first takes a run of two items (1 and 2),
// then blocks on the first item of a burst: the source must get rid of exactly one
// item in the worker, buf in the queue and one in its hand, as if no run had come
// before.
func TestRoomAfterRun(t *testing.T) {
	t.Parallel()
	for _, buf := range []int{2, 3, 8} {
		t.Run(fmt.Sprintf("buf=%d", buf), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const first, burst = 1000, 2000 // the items the worker blocks on
				gates := map[int]chan struct{}{first: make(chan struct{}), burst: make(chan struct{})}
				phase2 := make(chan struct{})
				var emitted atomic.Int64
				p := pipeline.New(pipeline.WithBuffer(buf))
				src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
					for _, v := range []int{first, 1, 2} { // 1 and 2 wait in the queue behind first
						emitted.Add(1)
						if err := emit(v); err != nil {
							return err
						}
					}
					<-phase2
					for v := burst; v < burst+100; v++ {
						emitted.Add(1)
						if err := emit(v); err != nil {
							return err
						}
					}
					return nil
				})
				s := pipeline.Then(src, pipeline.NewStage("s1", 1, func(_ context.Context, v int) (int, error) {
					if g, ok := gates[v]; ok {
						<-g
					}
					return v, nil
				}))
				pipeline.To(s, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
				errc := runAsync(t.Context(), p)

				synctest.Wait() // the worker blocks on first; 1 and 2 are queued
				close(gates[first])
				synctest.Wait() // the run of 1 and 2 is done; the worker waits for items
				emitted.Store(0)
				close(phase2)
				synctest.Wait() // the worker blocks on burst
				assert.Equal(t, int64(1+buf+1), emitted.Load(), "items the source got rid of")
				close(gates[burst])
				require.NoError(t, <-errc)
				checkReport(t, p.Report())
			})
		})
	}
}

// TestRoomDuringRun blocks the worker on the second item of a run (y): y's room is free
// while its function runs, so the source gets rid of buf items in the queue and one in
// its hand; and a function that waits for the source to get that far does not wait
// forever (as a stage joining what its own upstream sends elsewhere may).
func TestRoomDuringRun(t *testing.T) {
	t.Parallel()
	for _, buf := range []int{2, 4} {
		for _, waitsForSource := range []bool{false, true} {
			t.Run(fmt.Sprintf("buf=%d/waitsForSource=%v", buf, waitsForSource), func(t *testing.T) {
				t.Parallel()
				synctest.Test(t, func(t *testing.T) {
					const first, y, burst = 1000, 2, 2000
					gateFirst, gateY, phase2 := make(chan struct{}), make(chan struct{}), make(chan struct{})
					var emitted atomic.Int64
					p := pipeline.New(pipeline.WithBuffer(buf))
					src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
						for _, v := range []int{first, 1, y} { // 1 and y wait behind first: one run
							if err := emit(v); err != nil {
								return err
							}
						}
						<-phase2
						for v := burst; v < burst+100; v++ {
							if emitted.Add(1) == int64(buf+1) && waitsForSource {
								close(gateY) // the source got this far: y may finish
							}
							if err := emit(v); err != nil {
								return err
							}
						}
						return nil
					})
					s := pipeline.Then(src, pipeline.NewStage("s1", 1, func(ctx context.Context, v int) (int, error) {
						g := map[int]chan struct{}{first: gateFirst, y: gateY}[v]
						if g != nil {
							select {
							case <-g:
							case <-ctx.Done():
								return 0, ctx.Err()
							}
						}
						return v, nil
					}))
					pipeline.To(s, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
					ctx, cancel := context.WithCancel(t.Context())
					defer cancel()
					errc := runAsync(ctx, p)

					synctest.Wait() // the worker blocks on first; 1 and y are queued
					close(gateFirst)
					synctest.Wait() // the worker blocks on y, the run's second item
					close(phase2)
					synctest.Wait()
					if waitsForSource {
						select {
						case err := <-errc:
							require.NoError(t, err)
						default:
							t.Fatal("y waits for the source, which waits for room that y's start freed")
						}
						return
					}
					assert.Equal(t, int64(buf+1), emitted.Load(), "items the source got rid of while y runs")
					close(gateY)
					require.NoError(t, <-errc)
					checkReport(t, p.Report())
				})
			})
		}
	}
}

// TestHandledItemsAreCollectable checks that the pipeline keeps no item it has handled
// while it waits: once idle (the source held open), and while a worker sleeps in a
// retry's backoff for a later item of the same run (a worker's run, a queue's ring and
// a sender's buffer must all have let it go). Item a carries a cleanup; item b fails
// once, with an hour's backoff.
func TestHandledItemsAreCollectable(t *testing.T) {
	for _, backoff := range []bool{false, true} {
		t.Run(fmt.Sprintf("backoff=%v", backoff), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var freed, failed atomic.Bool
				release, next := make(chan struct{}), make(chan struct{})
				p := pipeline.New()
				src := pipeline.Generate(p, func(ctx context.Context, emit func(*[64]byte) error) error {
					if err := emit(new([64]byte)); err != nil { // the first run is of one item; the next may be longer
						return err
					}
					<-next
					a := new([64]byte)
					runtime.AddCleanup(a, func(f *atomic.Bool) { f.Store(true) }, &freed)
					if err := emit(a); err != nil {
						return err
					}
					if backoff {
						b := new([64]byte)
						b[0] = 1
						if err := emit(b); err != nil {
							return err
						}
					}
					select { // the pipeline stays open
					case <-release:
					case <-ctx.Done():
					}
					return nil
				})
				s := pipeline.Then(src, pipeline.NewStage("pass", 1, func(_ context.Context, v *[64]byte) (*[64]byte, error) {
					if v[0] == 1 && !failed.Swap(true) {
						return nil, pipeline.Transient(errors.New("once"))
					}
					return v, nil
				}, pipeline.WithRetry(2, pipeline.ConstantBackoff(time.Hour))))
				var sunk atomic.Int64
				pipeline.To(s, pipeline.NewSink("sink", 1, func(context.Context, *[64]byte) error { sunk.Add(1); return nil }))
				done := make(chan error, 1) // a failed assertion leaves the run no one to send to
				go func() { done <- p.Run(t.Context()) }()
				synctest.Wait()
				close(next)
				synctest.Wait()
				require.Equal(t, int64(2), sunk.Load(), "a went through")
				require.Equal(t, backoff, failed.Load(), "b is in its backoff")
				for range 20 { // the cleanup runs on a goroutine of the runtime's, outside the bubble
					runtime.GC()
					if freed.Load() {
						break
					}
					runtime.Gosched()
				}
				assert.True(t, freed.Load(), "the handled item is still reachable while the pipeline waits")
				close(release)
				require.NoError(t, <-done)
			})
		})
	}
}
