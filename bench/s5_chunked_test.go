package bench

import (
	"context"
	"runtime"

	"golang.org/x/sync/errgroup"
)

// impl=chunked, for information beside impl=handwritten (which stays the per-item
// reference of every ratio): the same goroutines written by hand to move items in
// chunks, as a careful user would without the library. The source hands out chunks of
// s5Chunk items (sub-slices, no copy) over a channel of one, each worker applies fn to a
// whole chunk into an output buffer, and one goroutine hands the chunks to the sink
// (putting them back in order first, when ordered). A semaphore of s5ChunksInFlight
// tokens bounds the chunks between the source and the sink, so at most
// s5ChunksInFlight × s5Chunk items (256) are in flight: about what the library holds
// with buffers of 100 (a queue, the runs its workers took, and the sink's queue). The
// output buffers go back to a free list, so a run allocates a few of them in all.

const (
	s5Chunk          = 64
	s5ChunksInFlight = 4
)

type outChunk[Out any] struct {
	seq int // index of the chunk
	out []Out
}

func chunkedHandwritten[In, Out any](ctx context.Context, items []In, workers int, ordered bool, fn func(context.Context, In) (Out, error), sink func(Out) error) error {
	g, ctx := errgroup.WithContext(ctx)
	sem := make(chan struct{}, s5ChunksInFlight) // a token per chunk between the source and the sink
	src := make(chan int, 1)                     // the index of a chunk of items
	free := make(chan []Out, s5ChunksInFlight)   // output buffers the sink gave back
	g.Go(func() error {
		defer close(src)
		for c := 0; c*s5Chunk < len(items); c++ {
			if err := send(ctx, sem, struct{}{}); err != nil {
				return err
			}
			if err := send(ctx, src, c); err != nil {
				return err
			}
		}
		return nil
	})
	done := make(chan outChunk[Out], 1)
	goWorkers(g, workers, done, func() error {
		for c := range src {
			var buf []Out
			select {
			case buf = <-free:
			default:
				buf = make([]Out, 0, s5Chunk)
			}
			for _, v := range items[c*s5Chunk : min((c+1)*s5Chunk, len(items))] {
				w, err := fn(ctx, v)
				if err != nil {
					return err
				}
				buf = append(buf, w)
			}
			if err := send(ctx, done, outChunk[Out]{c, buf}); err != nil {
				return err
			}
		}
		return nil
	})
	g.Go(func() error {
		// At most s5ChunksInFlight chunks are out, all with indexes in
		// [next, next+s5ChunksInFlight): a ring of that many never overwrites one.
		ring := make([][]Out, s5ChunksInFlight)
		next := 0
		emit := func(out []Out) error {
			for _, v := range out {
				if err := sink(v); err != nil {
					return err
				}
			}
			clear(out)
			free <- out[:0] // never blocks: one buffer per token
			<-sem
			return nil
		}
		for c := range done {
			if !ordered {
				if err := emit(c.out); err != nil {
					return err
				}
				continue
			}
			ring[c.seq%s5ChunksInFlight] = c.out
			for ring[next%s5ChunksInFlight] != nil {
				out := ring[next%s5ChunksInFlight]
				ring[next%s5ChunksInFlight] = nil
				if err := emit(out); err != nil {
					return err
				}
				next++
			}
		}
		return nil
	})
	return g.Wait()
}

// s5Chunked is impl=chunked of shape 1xP: one stage of sh.workers, in chunks.
func s5Chunked(ctx context.Context, sh s5Shape, items []int) (int, error) {
	n := 0
	err := chunkedHandwritten(ctx, items, sh.workers, false, identity, func(int) error { n++; return nil })
	return n, err
}

// s5CPUChunked is impl=chunked of shape=cpu: the ordered stage, in chunks.
func s5CPUChunked(ctx context.Context, lines []string) (s5Count, error) {
	var agg aggregate
	err := chunkedHandwritten(ctx, lines, runtime.GOMAXPROCS(0), true, parse, agg.add)
	return s5Count{items: agg.n}, err
}
