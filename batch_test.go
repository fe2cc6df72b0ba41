package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// flushTotal returns the number of flushes over every reason.
func flushTotal(f pipeline.Flushes) int64 {
	return f.Size + f.Bytes + f.Linger + f.End + f.Checkpoint
}

// checkBatchRow checks the row of a batch stage: In = Succeeded + Failed + NotStarted,
// no count is negative, and its flushes by reason add up to the batches it sent.
func checkBatchRow(t *testing.T, rep pipeline.Report, name string) pipeline.StageReport {
	t.Helper()
	b := row(t, rep, name)
	assert.Equal(t, pipeline.KindBatch, b.Kind)
	for _, c := range []int64{b.In, b.Succeeded, b.Out, b.Failed, b.NotStarted, b.DeadLettered, b.Retried} {
		assert.GreaterOrEqualf(t, c, int64(0), "batch row %q has a negative count\n%v", name, rep)
	}
	assert.Equalf(t, b.In, b.Succeeded+b.Failed+b.NotStarted, "batch row %q: In != Succeeded+Failed+NotStarted\n%v", name, rep)
	assert.Equalf(t, b.Out, flushTotal(b.Flushes), "batch row %q: batches sent != flushes by reason (%+v)", name, b.Flushes)
	return b
}

// TestBatchBySize checks batching by count alone over inputs around the batch size:
// every batch but the last is full, the batches in order are the input, and the flush
// reasons add up to the number of batches (Size for full ones, End for a partial last).
func TestBatchBySize(t *testing.T) {
	t.Parallel()
	for _, size := range []int{1, 7, 1000} {
		for _, n := range []int{0, 1, 999, 1000, 1001} {
			t.Run(fmt.Sprintf("size=%d/n=%d", size, n), func(t *testing.T) {
				t.Parallel()
				p := pipeline.New()
				batches, err := pipeline.Collect(t.Context(), pipeline.Batch(pipeline.FromSlice(p, ints(n)), size))
				require.NoError(t, err)
				require.Len(t, batches, (n+size-1)/size)
				for i, b := range batches {
					if i < len(batches)-1 {
						assert.Len(t, b, size, "batch %d is not full", i)
					} else {
						assert.Len(t, b, n-size*i, "last batch")
					}
				}
				assert.Equal(t, ints(n), append([]int{}, slices.Concat(batches...)...))
				rep := p.Report()
				checkAccounting(t, rep)
				b := checkBatchRow(t, rep, "Batch")
				assert.Equal(t, int64(n), b.In)
				assert.Equal(t, int64(n), b.Succeeded)
				end := int64(0)
				if n%size != 0 {
					end = 1
				}
				assert.Equal(t, pipeline.Flushes{Size: int64(n / size), End: end}, b.Flushes)
				assert.Equal(t, int64(len(batches)), row(t, rep, "Collect").In)
			})
		}
	}
}

// TestBatchByBytes checks WithMaxBytes: no batch passes the byte limit unless it is one
// oversized item, the count limit still holds, and the batches are exactly the greedy
// grouping the documentation describes (flush before an item would pass the limit, and
// when the count is reached), with the flushes counted by reason.
func TestBatchByBytes(t *testing.T) {
	t.Parallel()
	const n, size, maxBytes = 500, 10, 100
	items := make([]string, n)
	for i := range items {
		l := (i * 37) % 23 // 0..22 bytes: batches end by count or by bytes
		if i%53 == 7 {
			l = 150 // larger than maxBytes: a batch of its own
		}
		items[i] = strings.Repeat("x", l)
	}
	// The expected grouping, by the documented rule.
	var (
		want      [][]string
		cur       []string
		curBytes  int
		wantFlush pipeline.Flushes
	)
	for _, it := range items {
		if len(cur) > 0 && curBytes+len(it) > maxBytes {
			want, cur, curBytes = append(want, cur), nil, 0
			wantFlush.Bytes++
		}
		cur, curBytes = append(cur, it), curBytes+len(it)
		if len(cur) == size {
			want, cur, curBytes = append(want, cur), nil, 0
			wantFlush.Size++
		}
	}
	if len(cur) > 0 {
		want = append(want, cur)
		wantFlush.End++
	}

	p := pipeline.New()
	s := pipeline.Batch(pipeline.FromSlice(p, items), size,
		pipeline.WithMaxBytes(maxBytes, func(s string) int { return len(s) }))
	got, err := pipeline.Collect(t.Context(), s)
	require.NoError(t, err)
	for i, b := range got {
		bytes := 0
		for _, it := range b {
			bytes += len(it)
		}
		assert.LessOrEqualf(t, len(b), size, "batch %d has too many items", i)
		if len(b) > 1 {
			assert.LessOrEqualf(t, bytes, maxBytes, "batch %d of %d items has too many bytes", i, len(b))
		}
	}
	assert.Equal(t, want, got)
	assert.Equal(t, items, slices.Concat(got...))
	rep := p.Report()
	b := checkBatchRow(t, rep, "Batch")
	assert.Equal(t, wantFlush, b.Flushes)
	assert.Positive(t, b.Flushes.Bytes)
	assert.Positive(t, b.Flushes.Size)
}

// batchArrival is a batch and when (in virtual time since the test began) a sink got it.
type batchArrival struct {
	at    time.Duration
	batch []int
}

// TestBatchLinger checks WithLinger in virtual time. A partial batch is flushed exactly
// the linger after its first item arrived (not its last), and counted as a Linger flush;
// the end of the input flushes the rest at once.
func TestBatchLinger(t *testing.T) {
	t.Parallel()
	const linger = 50 * time.Millisecond
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var got []batchArrival // the sink has one worker
		firstSeen := make(chan struct{})
		p := pipeline.New()
		src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
			if err := emitInts(emit, 3); err != nil {
				return err
			}
			<-firstSeen // the first batch waits for its linger
			if err := emit(3); err != nil {
				return err
			}
			time.Sleep(20 * time.Millisecond)
			if err := emit(4); err != nil { // the batch's second item: its linger still runs from item 3
				return err
			}
			time.Sleep(100 * time.Millisecond)
			return emit(5) // then the input ends
		})
		pipeline.ToBatches(src, 10, pipeline.NewSink("sink", 1, func(_ context.Context, b []int) error {
			got = append(got, batchArrival{time.Since(start), b})
			if len(got) == 1 {
				close(firstSeen)
			}
			return nil
		}), pipeline.WithLinger(linger))
		require.NoError(t, p.Run(t.Context()))
		assert.Equal(t, []batchArrival{
			{linger, []int{0, 1, 2}},
			{2 * linger, []int{3, 4}},
			{linger + 20*time.Millisecond + 100*time.Millisecond, []int{5}},
		}, got)
		rep := p.Report()
		checkAccounting(t, rep)
		b := checkBatchRow(t, rep, "Batch")
		assert.Equal(t, pipeline.Flushes{Linger: 2, End: 1}, b.Flushes)
	})
}

// TestBatchLingerAfterFullBatch fills a batch (flushed by size) and then sends nothing
// for longer than the linger: the linger timer of the flushed batch must not flush an
// empty batch.
func TestBatchLingerAfterFullBatch(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var got []batchArrival
		p := pipeline.New()
		src := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
			if err := emitInts(emit, 2); err != nil {
				return err
			}
			time.Sleep(200 * time.Millisecond)
			return emit(2)
		})
		pipeline.ToBatches(src, 2, pipeline.NewSink("sink", 1, func(_ context.Context, b []int) error {
			got = append(got, batchArrival{time.Since(start), b})
			return nil
		}), pipeline.WithLinger(50*time.Millisecond))
		require.NoError(t, p.Run(t.Context()))
		assert.Equal(t, []batchArrival{{0, []int{0, 1}}, {200 * time.Millisecond, []int{2}}}, got)
		b := checkBatchRow(t, p.Report(), "Batch")
		assert.Equal(t, pipeline.Flushes{Size: 1, End: 1}, b.Flushes)
	})
}

// TestFlattenUndoesBatch checks that Flatten(Batch(x)) is x, in order, with one
// producer, for batching by count, by bytes and with a linger.
func TestFlattenUndoesBatch(t *testing.T) {
	t.Parallel()
	const n = 1000
	cases := []struct {
		name string
		opts []pipeline.BatchOption
	}{
		{"count", nil},
		{"bytes", []pipeline.BatchOption{pipeline.WithMaxBytes(20, func(i int) int { return i % 9 })}},
		{"linger", []pipeline.BatchOption{pipeline.WithLinger(time.Millisecond), pipeline.WithBuffer(1)}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			s := pipeline.Flatten(pipeline.Batch(pipeline.FromSlice(p, ints(n)), 7, c.opts...))
			s = pipeline.Then(s, pipeline.NewStage("after", 1, identity))
			got, err := pipeline.Collect(t.Context(), s)
			require.NoError(t, err)
			assert.Equal(t, ints(n), got)
			rep := p.Report()
			checkAccounting(t, rep)
			checkBatchRow(t, rep, "Batch")
			assert.Equal(t, int64(n), row(t, rep, "after").In)
		})
	}
}

// TestToBatchesRetryAndDeadLetter feeds batches into a sink with WithRetry and
// WithDeadLetter: the first attempt of every batch fails transiently and is retried, and
// one batch fails permanently on its retry and is dead-lettered whole. Every item is
// then either committed once or in the dead-lettered batch.
func TestToBatchesRetryAndDeadLetter(t *testing.T) {
	t.Parallel()
	const n, size, poison = 1000, 50, 123
	var (
		mu        sync.Mutex
		attempts  = map[int]int{} // by the batch's first item
		committed []int
	)
	dead := pipeline.NewDeadLetterBuffer[[]int](10)
	sink := pipeline.NewSink("sink", 3, func(_ context.Context, b []int) error {
		mu.Lock()
		defer mu.Unlock()
		attempts[b[0]]++
		if attempts[b[0]] == 1 {
			return pipeline.Transient(fmt.Errorf("batch %d: first attempt: %w", b[0], errBoom))
		}
		if slices.Contains(b, poison) {
			return pipeline.Permanent(fmt.Errorf("batch %d: poison: %w", b[0], errBoom))
		}
		committed = append(committed, b...)
		return nil
	}, pipeline.WithRetry(3, nil), pipeline.WithDeadLetter(dead.Add))
	p := pipeline.New()
	pipeline.ToBatches(pipeline.FromSlice(p, ints(n)), size, sink)
	require.NoError(t, p.Run(t.Context()))

	dls := dead.Items()
	require.Len(t, dls, 1)
	assert.Equal(t, ints(n)[100:150], dls[0].Item, "the whole batch is dead-lettered")
	assert.Equal(t, 2, dls[0].Attempts)
	assert.Contains(t, dls[0].FirstError, "first attempt")
	assert.Contains(t, dls[0].LastError, "poison")
	mu.Lock()
	all := append(slices.Clone(committed), dls[0].Item...)
	mu.Unlock()
	slices.Sort(all)
	assert.Equal(t, ints(n), all, "every item committed once or dead-lettered")

	rep := p.Report()
	checkAccounting(t, rep)
	b := checkBatchRow(t, rep, "Batch")
	assert.Equal(t, pipeline.Flushes{Size: n / size}, b.Flushes)
	sr := row(t, rep, "sink")
	assert.Equal(t, int64(n/size), sr.In)
	assert.Equal(t, int64(n/size-1), sr.Succeeded)
	assert.Equal(t, int64(1), sr.DeadLettered)
	assert.Equal(t, int64(n/size), sr.Retried)
}

// TestBatchRunFailsMidBatch stops a run while a batch is partial, by a failing sink or
// a canceled parent: the items of the partial batch count as failed in the batch row,
// and every row's accounting holds. The source holds back its end until the batch stage
// has stopped (synctest.Wait), so the counts are exact.
func TestBatchRunFailsMidBatch(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"sink fails", "parent canceled"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const emitted, size = 15, 10 // one full batch, then 5 items in a partial one
				ctx, cancel := context.WithCancelCause(t.Context())
				defer cancel(nil)
				fail, srcEnd := make(chan struct{}), make(chan struct{})
				p := pipeline.New()
				src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
					if err := emitInts(emit, emitted); err != nil {
						return err
					}
					<-srcEnd // not ctx: the test lets the source end once the batch stage stopped
					return ctx.Err()
				})
				pipeline.ToBatches(src, size, pipeline.NewSink("sink", 1, func(ctx context.Context, _ []int) error {
					if how != "sink fails" {
						return nil
					}
					select {
					case <-fail:
						return errBoom
					case <-ctx.Done():
						return ctx.Err()
					}
				}))
				errc := runAsync(ctx, p)
				synctest.Wait() // the sink has the full batch, the batch stage holds 5 items
				if how == "sink fails" {
					close(fail)
				} else {
					cancel(errOrderStop)
				}
				synctest.Wait() // the batch stage has stopped
				close(srcEnd)
				err := <-errc

				rep := p.Report()
				checkAccounting(t, rep)
				b := checkBatchRow(t, rep, "Batch")
				assert.Equal(t, int64(emitted), b.In)
				assert.Equal(t, int64(size), b.Succeeded, "items of the flushed batch")
				assert.Equal(t, int64(emitted-size), b.Failed, "items of the partial batch")
				assert.Zero(t, b.NotStarted)
				assert.Equal(t, pipeline.Flushes{Size: 1}, b.Flushes)
				sr := row(t, rep, "sink")
				assert.Equal(t, int64(1), sr.In)
				assert.Equal(t, int64(emitted), row(t, rep, "Generate").Out)
				if how == "sink fails" {
					require.ErrorIs(t, err, errBoom)
					serr, ok := errors.AsType[*pipeline.StageError](err)
					require.True(t, ok, "want a *StageError, got %T", err)
					assert.Equal(t, "sink", serr.Stage)
					assert.Equal(t, int64(1), sr.Failed)
				} else {
					require.ErrorIs(t, err, errOrderStop)
					assert.Equal(t, int64(1), sr.Succeeded)
				}
			})
		})
	}
}

// TestBatchUpstreamFailureFailsPartialBatch makes the source itself fail while the
// batch stage holds a partial batch. The documentation says the items of a partial batch
// count as failed when the run stops; the partial batch must not be flushed downstream
// (where a sink could still commit it) as if the input had ended.
func TestBatchUpstreamFailureFailsPartialBatch(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ emitted, size int }{{5, 10}, {5, 3}} {
		t.Run(fmt.Sprintf("emitted=%d/size=%d", c.emitted, c.size), func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			src := pipeline.Generate(p, func(_ context.Context, emit func(int) error) error {
				for i := range c.emitted {
					if err := emit(i); err != nil {
						return err
					}
				}
				return errBoom
			})
			pipeline.ToBatches(src, c.size, pipeline.NewSink("sink", 1, func(context.Context, []int) error { return nil }))
			err := p.Run(t.Context())
			require.ErrorIs(t, err, errBoom)
			rep := p.Report()
			checkAccounting(t, rep)
			b := checkBatchRow(t, rep, "Batch")
			full := c.emitted / c.size * c.size
			assert.Equal(t, int64(full), b.Succeeded, "items of full batches")
			assert.Equal(t, int64(c.emitted-full), b.Failed, "items of the partial batch")
			assert.Zero(t, b.Flushes.End, "the input did not end: the run failed")
		})
	}
}

// TestBatchCheckpointKeepsBatchesFull runs a checkpointed source into a concurrent stage
// and a batch sink that is the bottleneck (10 ms per batch, in virtual time), with the
// default WithMaxRedo. The items all settle in time, so the documentation promises the
// default limit never slows the run: every batch should be full, and the run should
// take about n/size sink calls of 10 ms.
func TestBatchCheckpointKeepsBatchesFull(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n, size, perBatch = 20_000, 500, 10 * time.Millisecond
		start := time.Now()
		p := pipeline.New()
		src := pipeline.FromCheckpoint(p, &memStore{}, func(_ context.Context, pos int64) iter.Seq2[int, error] {
			return func(yield func(int, error) bool) {
				for i := int(pos); i < n && yield(i, nil); i++ {
				}
			}
		})
		s := pipeline.Then(src, pipeline.NewStage("work", 8, identity))
		pipeline.ToBatches(s, size, pipeline.NewSink("sink", 1, func(context.Context, []int) error {
			time.Sleep(perBatch) // a bulk insert
			return nil
		}))
		require.NoError(t, p.Run(t.Context()))
		rep := p.Report()
		assert.Equal(t, int64(n), rep.Checkpoint)
		b := checkBatchRow(t, rep, "Batch")
		assert.Equal(t, pipeline.Flushes{Size: n / size}, b.Flushes)
		assert.LessOrEqual(t, time.Since(start), (n/size+1)*perBatch, "virtual time of the run")
	})
}

// TestBatchMisuse checks the programmer errors of Batch and its options.
func TestBatchMisuse(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	src := func() *pipeline.Stream[int] { return pipeline.FromSlice(p, ints(3)) }
	size := func(s string) int { return len(s) }
	assertPanicsPipeline(t, func() { pipeline.Batch(src(), 0) })
	assertPanicsPipeline(t, func() { pipeline.Batch(src(), -1) })
	msg := assertPanicsPipeline(t, func() { pipeline.Batch(src(), 5, pipeline.WithMaxBytes(10, size)) })
	assert.Contains(t, msg, "WithMaxBytes")
	assertPanicsPipeline(t, func() {
		pipeline.ToBatches(src(), 0, pipeline.NewSink("sink", 1, func(context.Context, []int) error { return nil }))
	})
	assertPanicsPipeline(t, func() { pipeline.WithMaxBytes(0, size) })
	assertPanicsPipeline(t, func() { pipeline.WithMaxBytes[string](10, nil) })
	assertPanicsPipeline(t, func() { pipeline.WithLinger(0) })
	assertPanicsPipeline(t, func() { pipeline.WithLinger(-time.Second) })
}

// TestFlattenInlinePanicCountsHandedItems: after Batch and Flatten, a panic in the next
// inline operator (a Map, a Filter's keep, the next stage's key function) counted the
// whole batch as failed in the batch row, though its earlier items had already reached
// the next row; as with a Tee branch, the batch counts as sent and the items the panic
// kept from the next row count as failed there.
func TestFlattenInlinePanicCountsHandedItems(t *testing.T) {
	t.Parallel()
	const n, size, panicAt = 12, 4, 2
	for _, next := range []string{"map", "filter", "key"} {
		t.Run(next, func(t *testing.T) {
			t.Parallel()
			p := pipeline.New()
			s := pipeline.Flatten(pipeline.Batch(pipeline.FromSlice(p, ints(n)), size))
			boom := func(i int) {
				if i == panicAt {
					panic("inline")
				}
			}
			first := "sink" // the row after Flatten
			var opts []pipeline.StageOption
			switch next {
			case "map":
				s = pipeline.Map(s, func(i int) int { boom(i); return i })
			case "filter":
				s = pipeline.Filter(s, func(i int) bool { boom(i); return true }, pipeline.WithName("keep"))
				first = "keep"
			case "key":
				opts = append(opts, pipeline.WithKey(func(i int) int { boom(i); return i }))
			}
			pipeline.To(s, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }, opts...))

			err := p.Run(t.Context())

			_, isPanic := errors.AsType[*pipeline.PanicError](err)
			require.Truef(t, isPanic, "want a panic, got %v", err)
			se, ok := errors.AsType[*pipeline.StageError](err)
			require.True(t, ok)
			assert.Equal(t, "Batch", se.Stage, "the row the item came from")
			rep := p.Report()
			checkAccounting(t, rep)
			checkConservation(t, rep)
			b := checkBatchRow(t, rep, "Batch")
			assert.Equal(t, int64(size), b.Succeeded, "the batch was handed on\n%v", rep)
			assert.Zero(t, b.Failed, "no item of the batch failed in the batch row\n%v", rep)
			f := row(t, rep, first)
			assert.Equal(t, int64(size), f.In, "every item of the batch reached %s\n%v", first, rep)
			assert.Equal(t, int64(size-panicAt), f.Failed, "the panicking item and those after it\n%v", rep)
		})
	}
}

// A panicking WithMaxBytes size function is recovered, and the items of the partial batch
// and the item being sized stay in the accounting (they vanished from it).
func TestBatchSizerPanicKeepsItemsCounted(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, []int{1, 2, 3})
	size := func(v int) int {
		if v == 3 {
			panic("sizer")
		}
		return 1
	}
	pipeline.ToBatches(src, 10, pipeline.NewSink("sink", 1, func(context.Context, []int) error { return nil }),
		pipeline.WithMaxBytes(100, size))
	err := p.Run(context.Background())
	var pe *pipeline.PanicError
	require.ErrorAs(t, err, &pe)
	rep := p.Report()
	b := row(t, rep, "Batch")
	assert.Equal(t, row(t, rep, "FromSlice").Out, b.In, "batch In != what the source sent\n%v", rep)
	assert.Equal(t, b.In, b.Succeeded+b.DeadLettered+b.Failed+b.NotStarted, "%v", rep)
}

// When the run stops during a byte-limit flush, the item that triggered the flush is
// counted (failed), so the batch row adds up.
func TestBatchByteFlushUnderCancelCountsItem(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancelCause(t.Context())
		defer cancel(nil)
		p := pipeline.New()
		batches := pipeline.Batch(pipeline.FromSlice(p, ints(6)), 10,
			pipeline.WithMaxBytes(2, func(int) int { return 1 }), pipeline.WithBuffer(0))
		pipeline.To(batches, pipeline.NewSink("sink", 1, func(ctx context.Context, _ []int) error {
			<-ctx.Done()
			return ctx.Err()
		}, pipeline.WithBuffer(0)))
		errc := runAsync(ctx, p)
		synctest.Wait() // the sink holds [0 1]; the batch pushes [2 3], made room for by 4
		cancel(errBoom)
		require.ErrorIs(t, <-errc, errBoom)
		rep := p.Report()
		checkAccounting(t, rep)
		b := row(t, rep, "Batch")
		assert.Equal(t, b.In, b.Succeeded+b.Failed+b.NotStarted, "batch row\n%v", rep)
	})
}

// A Filter after Flatten counts items as its In (it was taken from its feeder's Out, which
// counts batches).
func TestFilterAfterFlattenCountsItemsIn(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, ints(10))
	f := pipeline.Filter(pipeline.Flatten(pipeline.Batch(src, 5)), func(v int) bool { return v%2 == 0 }, pipeline.WithName("even"))
	pipeline.To(f, pipeline.NewSink("sink", 1, func(context.Context, int) error { return nil }))
	require.NoError(t, p.Run(context.Background()))
	rep := p.Report()
	t.Log("\n", rep)
	ev := row(t, rep, "even")
	assert.Equal(t, int64(10), ev.In)
	assert.Equal(t, int64(5), ev.Out)
	assert.Equal(t, row(t, rep, "sink").In, ev.Out)
}

// runtime.Goexit in a Batch's sizer fails the run with ErrGoexit and the item in hand is
// counted (it was counted nowhere).
func TestBatchSizerGoexitCountsItem(t *testing.T) {
	p := pipeline.New()
	src := pipeline.FromSlice(p, ints(3))
	b := pipeline.Batch(src, 10, pipeline.WithMaxBytes(100, func(v int) int {
		if v == 1 {
			runtime.Goexit()
		}
		return 1
	}))
	pipeline.To(b, pipeline.NewSink("sink", 1, func(context.Context, []int) error { return nil }))
	err := p.Run(context.Background())
	require.ErrorIs(t, err, pipeline.ErrGoexit)
	rep := p.Report()
	t.Log("\n", rep)
	checkAccounting(t, rep)
	bt := row(t, rep, "Batch")
	assert.Equal(t, bt.In, bt.Succeeded+bt.Failed+bt.NotStarted, "batch row")
}

// TestBatchTakesAFromSliceInPlace: a FromSlice straight into a Batch has its items
// taken by the batcher in place, as a stage's workers do: no goroutine of the source
// holds an item while the batcher waits. While the sink blocks, the
// batch's queue reads as full, and its row counts as not started only the items the
// batcher took and has not batched, no more than its queue's room (the source's
// goroutine would have left its ring full besides); when the run is canceled there,
// the items never taken are the source's, not started. Whether it completes or
// stops, the batch takes exactly what the source sent and every row adds up.
func TestBatchTakesAFromSliceInPlace(t *testing.T) {
	t.Parallel()
	const n, size, buf = 100, 4, 8
	for _, ending := range []string{"complete", "cancel"} {
		t.Run(ending, func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				defer cancel()
				p := pipeline.New(pipeline.WithBuffer(buf))
				release := make(chan struct{})
				var c collector[[]int]
				pipeline.To(pipeline.Batch(pipeline.FromSlice(p, ints(n)), size), pipeline.NewSink("sink", 1, func(ctx context.Context, b []int) error {
					if ending == "cancel" {
						select {
						case <-release:
						case <-ctx.Done():
							return ctx.Err()
						}
					}
					return c.add(ctx, b)
				}))
				errc := make(chan error, 1)
				go func() { errc <- p.Run(ctx) }()
				if ending == "cancel" {
					synctest.Wait() // the sink holds the first batch; the batcher waits for room
					full := p.Snapshot()
					assert.Zero(t, row(t, full, "FromSlice").InFlight, "no item in the source's hands: it has no goroutine\n%v", full)
					snap := row(t, full, "Batch")
					assert.Equal(t, buf, snap.QueueLen, "the batch's queue while the sink blocks")
					assert.LessOrEqual(t, snap.NotStarted, int64(buf), "taken and not batched, no more than the queue's room, and none queued")
					cancel()
				}
				err := <-errc
				rep := p.Report()
				checkAccounting(t, rep)
				src, b := row(t, rep, "FromSlice"), checkBatchRow(t, rep, "Batch")
				assert.Equal(t, src.Out, b.In, "the batch took what the source sent\n%v", rep)
				assert.Equal(t, int64(n), src.Out+src.NotStarted, "the source's items: sent or not started\n%v", rep)
				if ending == "complete" {
					require.NoError(t, err)
					assert.Equal(t, ints(n), slices.Concat(c.got()...))
					return
				}
				require.ErrorIs(t, err, context.Canceled)
				assert.LessOrEqual(t, b.NotStarted, int64(buf+1), "taken and not batched: a run, the queue's room and one\n%v", rep)
				assert.Positive(t, src.NotStarted, "never taken: the source's\n%v", rep)
				assert.LessOrEqual(t, src.Out, int64((buf+2)*size+buf+1), "taken: the batches in the sink's hands and queue, one in hand, and the queue's room\n%v", rep)
			})
		})
	}
}
