package pipeline

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
)

// A stage that calls a service can be a good client of it: [WithRateLimit] and
// [WithRateLimitPerKey] pace its attempts, [WithCircuitBreaker] holds its items while
// the service is down instead of failing them, and [WithAdaptiveWorkers] moves the
// number of its active workers with the latency it measures. This file ties them to
// the worker loop; each has a file of its own (ratelimit.go, breaker.go, adaptive.go).
//
// A stage with none of these options has a nil client: the worker loop tests it, held
// in a register, once per item and once per attempt (about 5 instructions per item and
// stage; callgrind counts 0.85 % more instructions for bench's S5 3x4 shape), and
// takes no lock, atomic, clock read or allocation for it.

// clientConfig is the part of a stage's config set by the options of this file's
// family.
type clientConfig struct {
	limiter  Limiter
	keyLimit any // func(In) Limiter, checked by the stage (WithRateLimitPerKey)
	breaker  *Breaker
	adaptMin int // WithAdaptiveWorkers: the least active workers (0: not adaptive)
	adaptSet bool
}

func (c clientConfig) any() bool {
	return c.limiter != nil || c.keyLimit != nil || c.breaker != nil || c.adaptSet
}

// client is one run's state of a stage's client options, shared by its workers.
type client[In any] struct {
	r       *run
	row     *row
	stage   string
	lim     Limiter
	keyLim  func(In) Limiter
	brk     *breakerState
	adapt   *adaptive
	workers int
	waitCtx context.Context // the run's context without its deadline, for limiters

	throttled atomic.Int64 // nanoseconds spent waiting for tokens, by all workers
}

// noDeadline is a context without a deadline, canceled with its parent (at the
// parent's deadline too). Limiters get it: a rate.Limiter refuses at once a wait that
// would end past its context's deadline, which would fail the run early with a
// limiter's error, where waiting until the deadline ends it with the deadline's.
type noDeadline struct{ context.Context }

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// checkClient validates the client options of a stage at construction.
func (st *Stage[In, Out]) checkClient(ctor string) {
	c := st.cfg.client
	if c.keyLimit != nil {
		if _, ok := c.keyLimit.(func(In) Limiter); !ok {
			var zero In
			panic(fmt.Sprintf("pipeline: %s(%q): WithRateLimitPerKey for another item type on a stage of %T", ctor, st.name, zero))
		}
	}
	if c.adaptSet {
		if c.adaptMin > st.workers {
			panic(fmt.Sprintf("pipeline: %s(%q): WithAdaptiveWorkers(%d): the minimum is more than the stage's %d workers",
				ctor, st.name, c.adaptMin, st.workers))
		}
		if st.cfg.key != nil {
			panic(fmt.Sprintf("pipeline: %s(%q): WithAdaptiveWorkers and WithKey together; a keyed stage needs every worker for its keys",
				ctor, st.name))
		}
	}
}

// newClient returns the run's client state of stage st, or nil when it has no client
// option.
func newClient[In, Out any](r *run, rw *row, st *Stage[In, Out]) *client[In] {
	c := st.cfg.client
	if !c.any() {
		return nil
	}
	cl := &client[In]{r: r, row: rw, stage: rw.name, lim: c.limiter, workers: st.workers, waitCtx: noDeadline{r.ctx}}
	if c.keyLimit != nil {
		cl.keyLim = c.keyLimit.(func(In) Limiter)
	}
	if c.breaker != nil {
		cl.brk = newBreakerState(*c.breaker, r, rw.name)
	}
	if c.adaptSet {
		cl.adapt = newAdaptive(c.adaptMin, st.workers, r.started)
	}
	rw.client = cl
	return cl
}

// clientRow is what a row's report reads of its stage's client.
type clientRow interface {
	fill(s *StageReport)
}

// fill sets the client's figures in a report of its stage.
func (cl *client[In]) fill(s *StageReport) {
	if cl.brk != nil {
		s.Breaker = cl.brk.report()
	}
	if cl.adapt != nil {
		s.Limit, s.LimitHistory = cl.adapt.report()
	}
	s.Throttled = time.Duration(cl.throttled.Load())
}

// acquire is called before each attempt: it waits while the breaker holds the stage's
// items, then for the rate limiters' tokens. It returns the attempt's ticket, or why it
// cannot begin: the run's cause, or a fatal error (a breaker open too long, a limiter
// that failed).
func (cl *client[In]) acquire(ctx context.Context, v In) (t ticket, err error) {
	if cl.brk != nil {
		if t.probe, err = cl.brk.allow(ctx); err != nil {
			return t, err
		}
	}
	if cl.lim != nil {
		err = cl.wait(ctx, cl.lim)
	}
	if err == nil && cl.keyLim != nil {
		err = cl.wait(ctx, cl.keyLim(v))
	}
	if err != nil {
		if cl.brk != nil {
			cl.brk.cancelProbe(t.probe)
		}
		return t, err
	}
	if cl.adapt != nil {
		t.began = cl.adapt.begin()
	}
	return t, nil
}

// wait takes a token of l. An error of the limiter's own (not the run stopping) is
// fatal.
func (cl *client[In]) wait(ctx context.Context, l Limiter) error {
	wctx := cl.waitCtx
	if ctx != cl.r.ctx { // not the run's: keep it as it is
		wctx = ctx
	}
	t0 := time.Now()
	err := l.Wait(wctx)
	cl.throttled.Add(int64(time.Since(t0)))
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return fmt.Errorf("rate limiter: %w", err)
}

// settle is called after each attempt with its error (nil on success) and class. It
// reports whether the item is held: the attempt failed while the breaker is (now) not
// closed, so it does not count as one of the item's attempts, and the item is tried
// again once the breaker lets it.
func (cl *client[In]) settle(t ticket, err error, class Class) (held bool) {
	failure := err != nil && counts(err, class)
	if cl.adapt != nil {
		cl.adapt.end(cl.r, cl.stage, t.began, failure)
	}
	if cl.brk == nil {
		return false
	}
	if err != nil && !failure && class == ClassFatal { // the run stops: nothing to hold
		cl.brk.cancelProbe(t.probe)
		return false
	}
	return cl.brk.record(t.probe, failure, err)
}

// counts reports whether an attempt's error tells that the service is failing (and
// not that the item is bad): a transient error or a timeout.
func counts(err error, class Class) bool {
	return class == ClassTransient || errors.Is(err, ErrTimeout)
}

// ended is called by a worker that found the stage's input closed and drained, so that
// workers parked by the adaptive limit see it too and exit.
func (cl *client[In]) ended() {
	if cl.adapt != nil {
		cl.adapt.close()
	}
}

// clientWarnings are the findings of [Report.Bottleneck] about the client options:
// an adaptive bottleneck held below its maximum (more workers would only queue at the
// service), a breaker not closed.
func (r Report) clientWarnings(b Bottleneck) []string {
	var out []string
	for _, s := range r.Stages {
		if s.Breaker != nil && s.Breaker.State != BreakerClosed {
			out = append(out, fmt.Sprintf("stage %q: circuit breaker %s for %v: what it calls is failing",
				s.Name, s.Breaker.State, s.Breaker.TimeOpen.Round(time.Millisecond)))
		}
		if s.Name == b.Stage && s.Throttled > 0 && r.Elapsed > 0 && s.Workers > 0 {
			if share := float64(s.Throttled) / (float64(r.Elapsed) * float64(s.Workers)); share >= 0.5 {
				out = append(out, fmt.Sprintf("stage %q: its workers spent %d%% of their time waiting for its rate limit: it runs at its quota, and more workers will not help",
					s.Name, int(share*100)))
			}
		}
		if s.Name != b.Stage || s.LimitHistory == nil {
			continue
		}
		switch {
		case s.Limit < s.Workers && b.Suggested > s.Limit:
			out = append(out, fmt.Sprintf("stage %q: the adaptive limit holds it at %d of %d workers: what it calls saturates at about %d concurrent calls; the target rate needs a faster service, not more workers",
				s.Name, s.Limit, s.Workers, s.Limit))
		case s.Limit == s.Workers && b.Suggested > s.Workers:
			out = append(out, fmt.Sprintf("stage %q: the adaptive limit reached the stage's %d workers without saturating what it calls: allow more workers",
				s.Name, s.Workers))
		}
	}
	return out
}

// clientLines are the lines of [Report.String] about breakers and adaptive limits.
func (r Report) clientLines() string {
	var b strings.Builder
	for _, s := range r.Stages {
		if br := s.Breaker; br != nil {
			fmt.Fprintf(&b, "breaker %s: %s, opened %d times, open %v, %d attempts held\n",
				s.Name, br.State, br.Opened, br.TimeOpen.Round(time.Millisecond), br.Held)
		}
		if s.LimitHistory != nil {
			fmt.Fprintf(&b, "adaptive %s: limit %d of %d workers", s.Name, s.Limit, s.Workers)
			if n := len(s.LimitHistory); n > 0 {
				fmt.Fprintf(&b, ", last changed at %v (%s)", s.LimitHistory[n-1].At.Round(time.Millisecond), s.LimitHistory[n-1].Reason)
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}

// clientLine is what [Report.Line] adds for a stage's breaker and adaptive limit.
func (s StageReport) clientLine() string {
	var out string
	if s.Breaker != nil && s.Breaker.State != BreakerClosed {
		out += " breaker=" + s.Breaker.State.String()
	}
	if s.LimitHistory != nil {
		out += fmt.Sprintf(" limit=%d/%d", s.Limit, s.Workers)
	}
	return out
}
