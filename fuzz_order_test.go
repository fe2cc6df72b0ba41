package pipeline_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/gopipeline/pipeline"
)

// Outcomes of an item in FuzzReorder, chosen by its fuzz byte.
const (
	reorderOne     = iota // one output
	reorderNone           // filtered out: no output
	reorderDead           // dead-lettered
	reorderSeveral        // three outputs
	reorderTimeout        // never released: its attempt times out, and it is dead-lettered
	reorderOutcomes
)

// reorderTimeoutAfter is FuzzReorder's per-attempt timeout, in the bubble's time.
const reorderTimeoutAfter = time.Second

// FuzzReorder drives an ordered flat stage whose items each wait for the test to
// release them: inside a synctest bubble, the test waits until every goroutine is
// blocked, then releases one of the items in flight, chosen by the next byte of order,
// and so on, so the fuzz input chooses the completion order among whatever the workers
// and the window let run at once. Whatever the order, and with items filtered out,
// dead-lettered, flat-mapped or timed out (the stage has a timeout; an item the test
// never releases meets it when the test, with nothing else to release, lets the
// bubble's time pass), the stage's outputs come out in input order and its window
// never stalls (some item in flight can always be released or time out).
func FuzzReorder(f *testing.F) {
	f.Add(uint8(4), uint8(3), uint8(2), []byte{0, 0, 0, 0, 0, 0, 0, 0}, []byte{255, 1, 2, 3})
	f.Add(uint8(1), uint8(0), uint8(0), []byte{0, 1, 2, 3}, []byte{0})
	f.Add(uint8(8), uint8(1), uint8(4), []byte{1, 1, 2, 2, 0, 3, 1, 2, 0, 0, 3, 2}, []byte{7, 6, 5, 4, 3, 2, 1})
	f.Add(uint8(3), uint8(0), uint8(1), []byte("\x00\x02\x01\x03\x00\x00\x02\x01\x03\x00\x00\x02\x01\x03\x00\x01"), []byte{9, 200, 13})
	f.Add(uint8(6), uint8(9), uint8(3), []byte{}, []byte{})
	f.Add(uint8(2), uint8(3), uint8(1), []byte{4, 0, 4, 3, 0, 4, 4, 1, 0, 2, 4, 0}, []byte{3, 1, 2}) // items that time out, two workers held by them at once
	f.Fuzz(func(t *testing.T, workers, window, buf uint8, outcomes, order []byte) {
		if len(outcomes) > 48 {
			outcomes = outcomes[:48]
		}
		n := len(outcomes)
		w, win, b := 1+int(workers)%8, int(window)%10, int(buf)%5
		var want []int
		for i, o := range outcomes {
			switch o % reorderOutcomes {
			case reorderOne:
				want = append(want, 4*i)
			case reorderSeveral:
				want = append(want, 4*i, 4*i+1, 4*i+2)
			}
		}
		synctest.Test(t, func(t *testing.T) {
			release := make([]chan struct{}, n)
			for i := range release {
				release[i] = make(chan struct{})
			}
			var (
				mu      sync.Mutex
				waiting []int // items started and not yet released
			)
			fn := func(ctx context.Context, i int, emit func(int)) error {
				mu.Lock()
				waiting = append(waiting, i)
				mu.Unlock()
				select {
				case <-release[i]:
				case <-ctx.Done():
					mu.Lock() // timed out (or the run stops): no longer the test's to release
					if k := slices.Index(waiting, i); k >= 0 {
						waiting = slices.Delete(waiting, k, k+1)
					}
					mu.Unlock()
					return ctx.Err()
				}
				switch outcomes[i] % reorderOutcomes {
				case reorderOne:
					emit(4 * i)
				case reorderDead:
					return pipeline.Permanent(errBoom)
				case reorderSeveral:
					emit(4 * i)
					emit(4*i + 1)
					emit(4*i + 2)
				}
				return nil
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			p := pipeline.New(pipeline.WithBuffer(b))
			s := pipeline.Then(pipeline.FromSlice(p, ints(n)),
				pipeline.NewFlatStage("ord", w, fn, pipeline.WithOrdered(win), discardDead[int](), pipeline.WithTimeout(reorderTimeoutAfter)))
			var (
				got []int
				err error
			)
			done := make(chan struct{})
			go func() {
				defer close(done)
				got, err = pipeline.Collect(ctx, s)
			}()
			toRelease := 0
			for _, o := range outcomes {
				if o%reorderOutcomes != reorderTimeout {
					toRelease++
				}
			}
			for step := 0; step < toRelease; {
				synctest.Wait() // every goroutine is blocked: the items in flight are known
				mu.Lock()
				var free []int // where in waiting the items are that the test may release
				for k, i := range waiting {
					if outcomes[i]%reorderOutcomes != reorderTimeout {
						free = append(free, k)
					}
				}
				if len(free) == 0 {
					inFlight := len(waiting)
					mu.Unlock()
					if inFlight > 0 { // only items that time out: let them
						time.Sleep(reorderTimeoutAfter)
						continue
					}
					cancel()
					<-done
					t.Fatalf("stalled: %d of %d items released, none in flight (workers %d, window %d, buffer %d)", step, toRelease, w, win, b)
				}
				k := free[0]
				if len(order) > 0 {
					k = free[int(order[step%len(order)])%len(free)]
				}
				i := waiting[k]
				waiting = slices.Delete(waiting, k, k+1)
				mu.Unlock()
				close(release[i])
				step++
			}
			<-done
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !slices.Equal(want, got) {
				t.Fatalf("outputs out of input order (workers %d, window %d, buffer %d):\ngot  %v\nwant %v", w, win, b, got, want)
			}
			rep := p.Report()
			checkAccounting(t, rep)
			checkChain(t, rep)
			if ord := row(t, rep, "ord"); ord.In != int64(n) || ord.Out != int64(len(want)) || ord.Window != 0 {
				t.Fatalf("ord row: In %d, Out %d, Window %d; want %d, %d, 0", ord.In, ord.Out, ord.Window, n, len(want))
			}
		})
	})
}

// FuzzBatch batches fuzzed items (their byte is their size) by count and, when
// useBytes, by bytes. With one producer the grouping is deterministic: no batch is empty
// or has more than size items, none passes maxBytes unless it is a single item, each
// batch but the last ended because it was full or the next item would not fit, the
// batches in order are the input, and the flushes by reason add up to the batches.
func FuzzBatch(f *testing.F) {
	f.Add(uint8(3), uint8(10), true, []byte{1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint8(0), uint8(0), false, []byte{})
	f.Add(uint8(15), uint8(63), true, []byte{39, 39, 0, 0, 1, 38, 20, 20, 20, 20})
	f.Add(uint8(1), uint8(5), true, []byte{6, 0, 6, 5, 0, 0, 1})
	f.Add(uint8(7), uint8(255), false, []byte("the quick brown fox jumps over the lazy dog"))
	f.Fuzz(func(t *testing.T, sizeB, maxB uint8, useBytes bool, sizes []byte) {
		if len(sizes) > 200 {
			sizes = sizes[:200]
		}
		n := len(sizes)
		size, maxBytes := 1+int(sizeB)%16, 1+int(maxB)%64
		itemSize := func(i int) int { return int(sizes[i]) % 40 }
		var opts []pipeline.BatchOption
		if useBytes {
			opts = append(opts, pipeline.WithMaxBytes(maxBytes, itemSize))
		}
		p := pipeline.New()
		got, err := pipeline.Collect(t.Context(), pipeline.Batch(pipeline.FromSlice(p, ints(n)), size, opts...))
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
		var all []int
		for k, b := range got {
			if len(b) == 0 || len(b) > size {
				t.Fatalf("batch %d has %d items (size %d)", k, len(b), size)
			}
			bytes := 0
			for _, i := range b {
				bytes += itemSize(i)
			}
			if useBytes && len(b) > 1 && bytes > maxBytes {
				t.Fatalf("batch %d of %d items has %d bytes (max %d)", k, len(b), bytes, maxBytes)
			}
			if k < len(got)-1 && len(b) < size {
				if !useBytes || bytes+itemSize(got[k+1][0]) <= maxBytes {
					t.Fatalf("batch %d (%d items, %d bytes) was flushed early: the next item fits", k, len(b), bytes)
				}
			}
			all = append(all, b...)
		}
		if !slices.Equal(ints(n), append([]int{}, all...)) {
			t.Fatalf("the batches are not the input in order: %v", got)
		}
		rep := p.Report()
		checkAccounting(t, rep)
		bt := checkBatchRow(t, rep, "Batch")
		if bt.In != int64(n) || bt.Succeeded != int64(n) || bt.Out != int64(len(got)) {
			t.Fatalf("batch row: In %d, Succeeded %d, Out %d; want %d, %d, %d", bt.In, bt.Succeeded, bt.Out, n, n, len(got))
		}
		if fl := bt.Flushes; fl.Linger != 0 || fl.Checkpoint != 0 || fl.End > 1 || (!useBytes && fl.Bytes != 0) {
			t.Fatalf("unexpected flush reasons %+v", fl)
		}
	})
}
