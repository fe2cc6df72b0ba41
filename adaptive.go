package pipeline

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gopipeline/pipeline/internal/adaptive"
)

// WithAdaptiveWorkers makes the number of the stage's active workers adapt to what the
// service it calls can take: the limit moves between min and the stage's workers (its
// maximum) from the latency and errors the stage measures. Workers above the limit
// wait, without an item, until it grows again; the stage's queue is unchanged.
//
// The limit starts at min and is revised once per window of completed attempts (6 per
// active worker, at least 16), not per item. A window measures only the attempts that
// began under the current limit with no more attempts in flight than it allows (the
// calls of a higher limit still draining say nothing of this one). Its mean latency of
// successful attempts, against the floor (the lowest window mean of the last 8,
// measured again after each cut), tells how many of the stage's calls wait in the
// service's queue: limit × (1 − floor/mean), as TCP Vegas reckons a connection's
// queued packets.
//
//   - Errors rise (at least 1 attempt in 10 of the window failed with a transient error
//     or a timeout): the limit shrinks by a quarter.
//   - Calls queue (more than three quarters of one, and more than the latency's usual
//     spread explains): the service is saturated, and the limit is cut to what it
//     serves at the floor latency, limit × floor / mean (at least 1 less): the knee,
//     which [Report.Bottleneck] names. The window after a cut measures the floor
//     again: if the latency did not fall with the concurrency, nor at one more cut
//     (by a quarter) that tells, the service itself got slower, and its latency there
//     is the new floor. Each time a cut comes back to
//     the same knee, the limit waits twice as long (4, 8, ... up to 64 windows) before
//     it probes above it again, so that probing a known knee costs little latency.
//   - Otherwise, if nothing queues (less than half a call) and every active worker was
//     busy at some point of the window (more of them could have been used), it grows:
//     by 1, and by twice as much at each next window that still finds nothing queued
//     (at most half the limit), so that it catches up with a service scaled up.
//
// So it grows while throughput grows with the workers and latency stays at its floor,
// settles within a call or two above the concurrency where the service starts
// queueing, and follows that knee when it moves (a service scaled up or down) and the
// floor when it moves (a service that got slower or faster for good). It suits a stage
// whose attempts call something with a steady latency under its knee (a database, an
// API); with latencies that vary widely from item to item, prefer a fixed number.
//
// [StageReport].Limit gives the current limit and LimitHistory its latest changes;
// each change is an [EventLimit]. [Report.Bottleneck] reads the limit as the stage's
// workers. It panics if min < 1; the stage's constructor panics if min is more than the
// stage's workers, or if the stage has [WithKey] (each key's worker must run).
//
// An adaptive stage reads the clock twice, and takes a lock and two atomic adds, per
// attempt: about 60 ns per item and stage on bench's no-op 3x4 shape
// (BenchmarkClientOverhead), nothing next to a call of a service.
func WithAdaptiveWorkers(min int) StageOption {
	if min < 1 {
		panic(fmt.Sprintf("pipeline: WithAdaptiveWorkers(%d): the minimum must be at least 1", min))
	}
	return stageOpt(func(c *config) {
		c.client.add(policyMaker{
			name: "WithAdaptiveWorkers", order: orderAdaptive,
			make: func(env policyEnv) hook {
				return &adaptivePolicy{env: env, a: adaptive.New(min, env.workers, env.r.started)}
			},
			check: func(workers int, keyedBy string) string {
				switch {
				case min > workers:
					return fmt.Sprintf("WithAdaptiveWorkers(%d): the minimum is more than the stage's %d workers", min, workers)
				case keyedBy != "":
					return "WithAdaptiveWorkers and " + keyedBy + " together; a keyed stage needs every worker for its keys"
				}
				return ""
			},
		})
	})
}

// adaptivePolicy is one run's adaptive limit of a stage as a policy: it counts each
// attempt in flight and measures it. The workers above the limit wait in the worker
// loop (gate), between runs of items.
type adaptivePolicy struct {
	env policyEnv
	a   *adaptive.Limit // internal/adaptive: the limit and its revision
}

func (p *adaptivePolicy) before(_ context.Context, t ticket, _ func() error) (ticket, error) {
	t.began, t.measured = p.a.Begin()
	t.inflight = true
	return t, nil
}

func (p *adaptivePolicy) cancel(t ticket) {
	if t.inflight {
		p.a.Cancel()
	}
}

func (p *adaptivePolicy) after(t ticket, err error, class Class) bool {
	if c := p.a.End(t.began, t.measured, err != nil && counts(err, class)); c != nil {
		p.env.r.emit(p.env.r.ctx, Event{Kind: EventLimit, Stage: p.env.stage, Limit: c.Limit})
	}
	return false
}

func (p *adaptivePolicy) fill(s *StageReport) {
	var h []adaptive.Change
	s.Limit, h = p.a.Report()
	s.LimitHistory = make([]LimitChange, len(h)) // never nil: the stage is adaptive
	for i, c := range h {
		s.LimitHistory[i] = LimitChange(c)
	}
}

// adaptiveReport is the adaptive limits' part of the report's text.
var adaptiveReport = policyReport{
	warnings: func(_ Report, b Bottleneck, s StageReport) []string {
		if s.Name != b.Stage || s.LimitHistory == nil {
			return nil
		}
		knee := s.Limit // the limit after the last cut for latency is the knee; the limit probes above it now and then
		for _, c := range slices.Backward(s.LimitHistory) {
			if c.Reason == "latency" {
				knee = c.Limit
				break
			}
		}
		switch {
		case s.Limit < s.Workers && b.Suggested > s.Limit:
			return []string{fmt.Sprintf("stage %q: the adaptive limit holds it at %d of %d workers: what it calls saturates at about %d concurrent calls; the target rate needs a faster service, not more workers",
				s.Name, s.Limit, s.Workers, knee)}
		case s.Limit == s.Workers && b.Suggested > s.Workers:
			return []string{fmt.Sprintf("stage %q: the adaptive limit reached the stage's %d workers without saturating what it calls: allow more workers",
				s.Name, s.Workers)}
		}
		return nil
	},
	lines: func(b *strings.Builder, s StageReport) {
		if s.LimitHistory == nil {
			return
		}
		fmt.Fprintf(b, "adaptive %s: limit %d of %d workers", s.Name, s.Limit, s.Workers)
		if n := len(s.LimitHistory); n > 0 {
			fmt.Fprintf(b, ", last changed at %v (%s)", s.LimitHistory[n-1].At.Round(time.Millisecond), s.LimitHistory[n-1].Reason)
		}
		b.WriteString("\n")
	},
	line: func(s StageReport) string {
		if s.LimitHistory != nil {
			return fmt.Sprintf(" limit=%d/%d", s.Limit, s.Workers)
		}
		return ""
	},
}

// LimitChange is one change of an adaptive stage's limit.
type LimitChange struct {
	At     time.Duration // since the run started
	Limit  int
	Reason string // "grow", "latency" or "errors"
}
