package pipeline_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// slotService is a simulated service with a concurrency knee: it serves slots calls at
// once in flat time each, and queues the rest for a free slot.
type slotService struct {
	slots   chan struct{}
	flat    time.Duration
	mu      sync.Mutex
	lat     []time.Duration // every call's latency, as the caller sees it
	errFrom int64           // calls from this one on fail (0: none)
	calls   atomic.Int64
	jitter  *rand.Rand                        // when set: each call takes flat ± 10 %, drawn from it
	slower  func(time.Duration) time.Duration // when set: the service time, from the flat one
}

func newSlotService(slots int, flat time.Duration) *slotService {
	return &slotService{slots: make(chan struct{}, slots), flat: flat}
}

func (s *slotService) call(ctx context.Context, v int) (int, error) {
	t0 := time.Now()
	n := s.calls.Add(1)
	select {
	case s.slots <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	d := s.flat
	if s.slower != nil {
		d = s.slower(d)
	}
	if s.jitter != nil {
		s.mu.Lock()
		d += time.Duration(s.jitter.Int64N(int64(s.flat/5))) - s.flat/10
		s.mu.Unlock()
	}
	time.Sleep(d)
	<-s.slots
	s.mu.Lock()
	s.lat = append(s.lat, time.Since(t0))
	s.mu.Unlock()
	if s.errFrom > 0 && n >= s.errFrom {
		return 0, pipeline.Transient(errDown)
	}
	return v, nil
}

// quantile returns the q-quantile of the latencies of the calls from the i-th on.
func (s *slotService) quantile(q float64, from int) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := slices.Clone(s.lat[from:])
	slices.Sort(l)
	return l[int(q*float64(len(l)-1))]
}

// TestAdaptiveConverges is the done-when check for adaptive concurrency: a stage of up
// to 32 workers, starting at 1, calls a service with 8 slots (10 ms flat up to 8
// concurrent calls, then queueing). The limit settles within ±25 % of 8 (6 to 10) and
// the p99 latency stays within 1.5× the flat 10 ms, over the whole run; also when each
// call takes 10 ms ± 10 % (drawn from a seeded generator, so the run is repeatable).
func TestAdaptiveConverges(t *testing.T) {
	t.Parallel()
	for _, jitter := range []bool{false, true} {
		t.Run(fmt.Sprintf("jitter=%v", jitter), func(t *testing.T) {
			t.Parallel()
			testAdaptiveConverges(t, jitter)
		})
	}
}

func testAdaptiveConverges(t *testing.T, jitter bool) {
	synctest.Test(t, func(t *testing.T) {
		const n = 10000
		svc := newSlotService(8, 10*time.Millisecond)
		if jitter {
			svc.jitter = rand.New(rand.NewPCG(1, 2))
		}
		log := &eventLog{start: time.Now()}
		p := pipeline.New(pipeline.WithObserver(log.observe))
		st := pipeline.NewStage("call", 32, svc.call, pipeline.WithAdaptiveWorkers(1))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(n)), st), nopSink())

		done := make(chan struct{})
		t0 := time.Now()
		sampled := sampleLimit(p, "call", t0, done)
		require.NoError(t, p.Run(t.Context()))
		elapsed := time.Since(t0)
		close(done)
		synctest.Wait()
		samples := sampled.limits()

		rep := p.Report()
		checkReport(t, rep)
		call := row(t, rep, "call")
		require.NotEmpty(t, samples)
		settled := samples[len(samples)/4:] // after the first quarter of the run
		lo, hi := slices.Min(settled), slices.Max(settled)
		var sum int
		for _, l := range settled {
			sum += l
		}
		mean := float64(sum) / float64(len(settled))
		p50, p99 := svc.quantile(0.50, 0), svc.quantile(0.99, 0)
		rate := float64(n) / elapsed.Seconds()
		t.Logf("adaptive 1..32 on 8 slots of 10 ms: %d items in %v (%.0f/s, ideal 800/s); limit after the first quarter %d..%d, mean %.2f, final %d; p50 %v, p99 %v; %d limit changes",
			n, elapsed, rate, lo, hi, mean, call.Limit, p50, p99, len(log.kinds(pipeline.EventLimit)))
		t.Logf("history: %v", call.LimitHistory)
		assert.GreaterOrEqual(t, lo, 6)
		assert.LessOrEqual(t, hi, 10)
		assert.InDelta(t, 8, mean, 1)
		assert.GreaterOrEqual(t, call.Limit, 6)
		assert.LessOrEqual(t, call.Limit, 10)
		assert.LessOrEqual(t, p99, 15*time.Millisecond, "p99 within 1.5× the flat latency")
		assert.Greater(t, rate, 0.9*800, "throughput near the service's 800/s")
		require.NotEmpty(t, call.LimitHistory)
		assert.Equal(t, "grow", call.LimitHistory[0].Reason)
		assert.Equal(t, call.Limit, call.LimitHistory[len(call.LimitHistory)-1].Limit)
		assert.Equal(t, 32, call.Workers)
		assert.Contains(t, rep.String(), fmt.Sprintf("adaptive call: limit %d of 32 workers, last changed at ", call.Limit))
		assert.Contains(t, rep.Line(), fmt.Sprintf(" limit=%d/32", call.Limit))
	})
}

// TestAdaptiveFloorShift checks a service whose latency doubles for good (a database
// that got slower, with the same 8 slots): the limit first drops, taking the rise for
// saturation, then finds the new floor and settles at 8 again.
func TestAdaptiveFloorShift(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		svc := newSlotService(8, 10*time.Millisecond)
		svc.slower = func(d time.Duration) time.Duration {
			if time.Since(start) >= 5*time.Second {
				return 2 * d
			}
			return d
		}
		p := pipeline.New()
		st := pipeline.NewStage("call", 32, svc.call, pipeline.WithAdaptiveWorkers(1))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(12000)), st), nopSink())
		var at5, at15 atomic.Int64 // written by the timers' goroutines, read after Run
		time.AfterFunc(5*time.Second, func() { at5.Store(int64(row(t, p.Snapshot(), "call").Limit)) })
		time.AfterFunc(15*time.Second, func() { at15.Store(int64(row(t, p.Snapshot(), "call").Limit)) })
		require.NoError(t, p.Run(t.Context()))
		call := row(t, p.Report(), "call")
		t.Logf("limit %d before the slowdown, %d 10 s after it, %d at the end (%v); p99 of the last 4,000 calls %v",
			at5.Load(), at15.Load(), call.Limit, p.Report().Elapsed, svc.quantile(0.99, 8000))
		assert.InDelta(t, 8, at5.Load(), 1)
		assert.InDelta(t, 8, at15.Load(), 2)
		assert.InDelta(t, 8, call.Limit, 2)
		assert.LessOrEqual(t, svc.quantile(0.99, 8000), 30*time.Millisecond, "p99 within 1.5× the new flat 20 ms")
	})
}

// TestAdaptiveFixedOverload checks, for contrast, what the fixed 32 workers do to the
// same service: every call queues, p99 is 4× the flat latency, for the same throughput.
func TestAdaptiveFixedOverload(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		svc := newSlotService(8, 10*time.Millisecond)
		p := pipeline.New()
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(2000)), pipeline.NewStage("call", 32, svc.call)), nopSink())
		require.NoError(t, p.Run(t.Context()))
		p99 := svc.quantile(0.99, 0)
		t.Logf("fixed 32 workers on 8 slots: p99 %v", p99)
		assert.Equal(t, 40*time.Millisecond, p99)
		assert.Equal(t, 32, row(t, p.Report(), "call").Limit)
		assert.Nil(t, row(t, p.Report(), "call").LimitHistory)
	})
}

// TestAdaptiveErrors checks that rising errors shrink the limit, down to the minimum.
func TestAdaptiveErrors(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		svc := newSlotService(64, 10*time.Millisecond)
		svc.errFrom = 3000
		p := pipeline.New()
		st := pipeline.NewStage("call", 16, svc.call, pipeline.WithAdaptiveWorkers(2), discardDead[int]())
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(6000)), st), nopSink())
		var before atomic.Int64 // written by the timer's goroutine, read after Run
		time.AfterFunc(2*time.Second, func() { before.Store(int64(row(t, p.Snapshot(), "call").Limit)) })
		require.NoError(t, p.Run(t.Context()))
		call := row(t, p.Report(), "call")
		t.Logf("limit %d before the errors, %d at the end; history %v", before.Load(), call.Limit, call.LimitHistory)
		assert.Equal(t, int64(16), before.Load(), "no knee below 64 slots: it grew to its maximum")
		assert.Equal(t, 2, call.Limit, "errors shrank it to its minimum")
		assert.Equal(t, "errors", call.LimitHistory[len(call.LimitHistory)-1].Reason)
	})
}

// TestAdaptiveIdle checks that a stage that is not saturated (its input comes slowly)
// does not grow, that every parked worker exits at the end of the input, and that it
// works on an ordered stage.
func TestAdaptiveIdle(t *testing.T) {
	t.Parallel()
	for _, ordered := range []bool{false, true} {
		synctest.Test(t, func(t *testing.T) {
			opts := []pipeline.StageOption{pipeline.WithAdaptiveWorkers(2)}
			if ordered {
				opts = append(opts, pipeline.WithOrdered(0))
			}
			p := pipeline.New()
			src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
				for i := range 200 {
					time.Sleep(10 * time.Millisecond) // one item per 10 ms: 2 workers of 1 ms suffice
					if err := emit(i); err != nil {
						return err
					}
				}
				return nil
			})
			st := pipeline.NewStage("call", 8, func(_ context.Context, v int) (int, error) {
				time.Sleep(time.Millisecond)
				return v, nil
			}, opts...)
			out, err := pipeline.Collect(t.Context(), pipeline.Then(src, st))
			require.NoError(t, err)
			assert.Len(t, out, 200)
			if ordered {
				assert.True(t, slices.IsSorted(out))
			}
			call := row(t, p.Report(), "call")
			assert.Equal(t, 2, call.Limit)
			assert.Empty(t, call.LimitHistory)
		})
	}
}

// TestAdaptiveCancel checks that parked workers stop with the run.
func TestAdaptiveCancel(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		p := pipeline.New()
		st := pipeline.NewStage("call", 8, func(ctx context.Context, v int) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		}, pipeline.WithAdaptiveWorkers(1))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(100)), st), nopSink())
		require.ErrorIs(t, p.Run(ctx), context.DeadlineExceeded)
		checkReport(t, p.Report())
		assert.Equal(t, int64(1), row(t, p.Report(), "call").Failed, "one active worker, one item in flight")
	})
}

// TestAdaptiveBottleneck checks that Bottleneck reads an adaptive stage's limit as its
// workers and says that more workers would not help.
func TestAdaptiveBottleneck(t *testing.T) {
	t.Parallel()
	rep := pipeline.Report{Stages: []pipeline.StageReport{
		{Name: "src", Kind: pipeline.KindSource, Next: []string{"call"}},
		{
			Name: "call", Kind: pipeline.KindStage, Workers: 32, Limit: 8, QueueCap: 100, PeakQueue: 100,
			Latency:      pipeline.Latency{Count: 1000, P50: 10 * time.Millisecond, P99: 10 * time.Millisecond},
			LimitHistory: []pipeline.LimitChange{{At: time.Second, Limit: 8, Reason: "latency"}},
		},
	}}
	b := rep.Bottleneck(2000)
	assert.Equal(t, "call", b.Stage)
	assert.Equal(t, 8, b.Workers)
	assert.Equal(t, 25, b.Suggested)
	require.Len(t, b.Warnings, 1)
	assert.Contains(t, b.Warnings[0], "the adaptive limit holds it at 8 of 32 workers")
}

// TestAdaptiveOptionPanics checks the misuse of WithAdaptiveWorkers.
func TestAdaptiveOptionPanics(t *testing.T) {
	t.Parallel()
	id := func(_ context.Context, v int) (int, error) { return v, nil }
	assertPanicsPipeline(t, func() { pipeline.WithAdaptiveWorkers(0) })
	msg := assertPanicsPipeline(t, func() { pipeline.NewStage("s", 4, id, pipeline.WithAdaptiveWorkers(5)) })
	assert.Contains(t, msg, "more than the stage's 4 workers")
	msg = assertPanicsPipeline(t, func() {
		pipeline.NewStage("s", 4, id, pipeline.WithAdaptiveWorkers(1), pipeline.WithKey(func(v int) int { return v }))
	})
	assert.Contains(t, msg, "WithAdaptiveWorkers and WithKey")
	msg = assertPanicsPipeline(t, func() {
		pipeline.NewStage("s", 4, id, pipeline.WithPartition(func(v int) int { return v }), pipeline.WithAdaptiveWorkers(1))
	})
	assert.Contains(t, msg, "WithAdaptiveWorkers and WithPartition")
	msg = assertPanicsPipeline(t, func() {
		pipeline.NewStage("s", 4, id, pipeline.WithRateLimitPerKey(func(s string) string { return s }, 1, 1))
	})
	assert.Contains(t, msg, "WithRateLimitPerKey for another item type")
	assertPanicsPipeline(t, func() { pipeline.WithRateLimit(nil) })
	assertPanicsPipeline(t, func() { pipeline.WithRateLimitPerKey[int, int](nil, 1, 1) })
	assertPanicsPipeline(t, func() { pipeline.WithRateLimitPerKey(func(v int) int { return v }, 0, 1) })
	assertPanicsPipeline(t, func() { pipeline.WithRateLimitPerKey(func(v int) int { return v }, 1, 0) })
	assert.Equal(t, "limit", pipeline.EventLimit.String())
}

// An adaptive, ordered, dead-lettering stage fed by an acknowledged source keeps the order
// and settles every item exactly once.
func TestAdaptiveOrderedAckKeepsOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got []int
		runAcked(t, 300, 4, func(src *pipeline.Stream[int]) {
			s := pipeline.Then(src, pipeline.NewStage("ad", 8, func(_ context.Context, i int) (int, error) {
				time.Sleep(time.Duration(1+i%7) * time.Millisecond)
				if i%11 == 0 {
					return 0, pipeline.Permanent(errBoom)
				}
				return i, nil
			}, pipeline.WithAdaptiveWorkers(1), pipeline.WithOrdered(4), discardDead[int]()))
			pipeline.ToBatches(s, 5, pipeline.NewSink("s", 1, func(_ context.Context, b []int) error { got = append(got, b...); return nil }))
		})
		for i := 1; i < len(got); i++ {
			if got[i] < got[i-1] {
				t.Fatalf("out of order at %d: %v", i, got[i-1:i+1])
			}
		}
	})
}

// kneeService is a simulated service of c slots whose c can change: a call takes flat
// time in a slot, and waits in FIFO order for a free one. It records when each call
// started and how long it took, as the caller sees it.
type kneeService struct {
	flat  time.Duration
	start time.Time

	mu    sync.Mutex
	c     int
	busy  int
	queue []chan struct{}
	at    []time.Duration // when each call started, since start
	lat   []time.Duration
}

func newKneeService(c int, flat time.Duration) *kneeService {
	return &kneeService{c: c, flat: flat, start: time.Now()}
}

func (s *kneeService) call(_ context.Context, v int) (int, error) {
	t0 := time.Now()
	s.mu.Lock()
	if s.busy < s.c {
		s.busy++
		s.mu.Unlock()
	} else {
		ch := make(chan struct{})
		s.queue = append(s.queue, ch)
		s.mu.Unlock()
		<-ch // handed a slot
	}
	time.Sleep(s.flat)
	s.mu.Lock()
	s.release()
	s.at = append(s.at, t0.Sub(s.start))
	s.lat = append(s.lat, time.Since(t0))
	s.mu.Unlock()
	return v, nil
}

// release frees a slot, or hands it to the first waiting call.
func (s *kneeService) release() {
	if s.busy <= s.c && len(s.queue) > 0 {
		close(s.queue[0])
		s.queue = s.queue[1:]
		return
	}
	s.busy--
}

// setC changes the number of slots, handing new ones to waiting calls.
func (s *kneeService) setC(c int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.c = c
	for s.busy < s.c && len(s.queue) > 0 {
		s.busy++
		close(s.queue[0])
		s.queue = s.queue[1:]
	}
}

// p99 returns the 99th percentile latency of the calls that started in [from, to).
func (s *kneeService) p99(from, to time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	var l []time.Duration
	for i, at := range s.at {
		if at >= from && at < to {
			l = append(l, s.lat[i])
		}
	}
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return l[int(0.99*float64(len(l)-1))]
}

// limitSamples samples a stage's limit every 100 ms of virtual time while p runs.
type limitSamples struct {
	mu sync.Mutex
	at []time.Duration
	l  []int
}

func sampleLimit(p *pipeline.Pipeline, stage string, start time.Time, done <-chan struct{}) *limitSamples {
	s := &limitSamples{}
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
				if r, ok := p.Snapshot().Stage(stage); ok {
					s.mu.Lock()
					s.at, s.l = append(s.at, time.Since(start)), append(s.l, r.Limit)
					s.mu.Unlock()
				}
			}
		}
	}()
	return s
}

// limits returns the limits sampled.
func (s *limitSamples) limits() []int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.l)
}

// mean returns the mean of the samples taken in [from, to), and the time of the first
// sample of [from, to) from which on every sample of [from, to) is within ±tol of want.
func (s *limitSamples) mean(from, to time.Duration, want int, tol float64) (mean float64, within time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum, n int
	within = -1
	for i, at := range s.at {
		if at < from || at >= to {
			continue
		}
		sum, n = sum+s.l[i], n+1
		if ok := math.Abs(float64(s.l[i]-want)) <= tol*float64(want); !ok {
			within = -1
		} else if within < 0 {
			within = at
		}
	}
	return float64(sum) / float64(n), within
}

// runKneePhases runs an adaptive stage of 64 workers (from 1) against a knee service
// whose slots go through cs, phase long each, and returns the service, the samples and
// the report. The source emits until the last phase ends.
func runKneePhases(t *testing.T, cs []int, phase time.Duration) (*kneeService, *limitSamples, pipeline.Report) {
	t.Helper()
	svc := newKneeService(cs[0], 10*time.Millisecond)
	start := svc.start
	total := phase * time.Duration(len(cs))
	for i, c := range cs[1:] {
		time.AfterFunc(phase*time.Duration(i+1), func() { svc.setC(c) })
	}
	p := pipeline.New()
	src := pipeline.Generate(p, func(ctx context.Context, emit func(int) error) error {
		for i := 0; time.Since(start) < total; i++ {
			if err := emit(i); err != nil {
				return err
			}
		}
		return nil
	})
	pipeline.To(pipeline.Then(src, pipeline.NewStage("call", 64, svc.call, pipeline.WithAdaptiveWorkers(1))), nopSink())
	done := make(chan struct{})
	samples := sampleLimit(p, "call", start, done)
	require.NoError(t, p.Run(t.Context()))
	close(done)
	synctest.Wait()
	rep := p.Report()
	checkReport(t, rep)
	return svc, samples, rep
}

// TestAdaptiveKnee is the done-when check of issue 21 for a fixed knee: for C slots of
// 10 ms in {4, 8, 16, 32, 64}, the limit's mean over the second half of a 20 s phase
// is within ±25 % of C, p99 is at most 1.5× the uncongested 10 ms there, and
// Bottleneck names C as the knee (for C = 64, the stage's maximum: it says that more
// workers are needed).
func TestAdaptiveKnee(t *testing.T) {
	t.Parallel()
	for _, c := range []int{4, 8, 16, 32, 64} {
		t.Run(fmt.Sprintf("C=%d", c), func(t *testing.T) {
			t.Parallel()
			synctest.Test(t, func(t *testing.T) {
				const phase = 20 * time.Second
				svc, samples, rep := runKneePhases(t, []int{c}, phase)
				mean, _ := samples.mean(phase/2, phase, c, 0.25)
				p99 := svc.p99(phase/2, phase)
				call := row(t, rep, "call")
				b := rep.Bottleneck(float64(200 * c)) // twice what the service can do
				t.Logf("C=%d: limit mean %.2f over the second half, final %d, p99 %v, %d changes; %v", c, mean, call.Limit, p99, len(call.LimitHistory), b.Warnings)
				assert.InDelta(t, c, mean, 0.25*float64(c))
				assert.LessOrEqual(t, p99, 15*time.Millisecond)
				if c == 64 { // the stage's maximum: the sink, fed in bursts, may look the bottleneck
					return
				}
				require.Equal(t, "call", b.Stage)
				require.Len(t, b.Warnings, 1)
				var limit, knee int
				_, err := fmt.Sscanf(b.Warnings[0], "stage \"call\": the adaptive limit holds it at %d of 64 workers: what it calls saturates at about %d concurrent calls;", &limit, &knee)
				require.NoError(t, err, b.Warnings[0])
				assert.Equal(t, call.Limit, limit)
				assert.InDelta(t, c, knee, math.Max(1, 0.125*float64(c)), "the knee it names")
			})
		})
	}
}

// TestAdaptiveFollowsKnee is the done-when check of issue 21 for a knee that moves:
// across C = 8 → 32 → 4 → 16 (20 s each), the limit is within ±25 % of each new C
// within 5 s of the change and stays there, and p99 over the second half of each phase
// is at most 1.5× the uncongested 10 ms.
func TestAdaptiveFollowsKnee(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const phase = 20 * time.Second
		cs := []int{8, 32, 4, 16}
		svc, samples, rep := runKneePhases(t, cs, phase)
		for i, c := range cs {
			from := phase * time.Duration(i)
			mean, within := samples.mean(from, from+phase, c, 0.25)
			p99 := svc.p99(from+phase/2, from+phase)
			t.Logf("C=%d from %v: limit mean %.2f, within ±25%% from %v on, p99 of the second half %v", c, from, mean, within, p99)
			assert.GreaterOrEqual(t, within, from, "C=%d: the limit settles within ±25 %%", c)
			assert.LessOrEqual(t, within, from+5*time.Second, "C=%d: within 5 s of the change", c)
			assert.LessOrEqual(t, p99, 15*time.Millisecond, "C=%d", c)
		}
		t.Logf("history: %v", row(t, rep, "call").LimitHistory)
	})
}
