package pipeline

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/gopipeline/pipeline/internal/ratelimit"
)

// Limiter paces the attempts of a stage: Wait blocks until one more attempt may start,
// or returns an error when ctx is done first (or when it can never allow one). It must
// be safe for concurrent use. A [*rate.Limiter] of golang.org/x/time/rate is one, as
// is any limiter with the same Wait method (one backed by a shared store, say, to pace
// several processes).
type Limiter interface {
	Wait(ctx context.Context) error
}

// WithRateLimit makes every attempt of the stage (the first of an item and each retry)
// wait for a token of l first, so that the stage's workers together start at most as
// many attempts as l allows. A [*rate.Limiter] made with rate.NewLimiter(100, 10)
// allows 100 attempts per second on average and bursts of 10.
//
// The wait is not part of the attempt: [WithTimeout] starts after it. It ends when the
// run stops. An error of l's own while the run goes on (a rate.Limiter whose burst is 0,
// or whose wait would pass the context's deadline) fails the run.
//
// Pass the same l to several stages, or to stages of several pipelines, and they share
// its rate: a quota that a service grants to the whole process. With
// [WithRateLimitPerKey] too, an attempt waits for both. It panics if l is nil.
//
// The time the workers spend waiting is the stage's [StageReport].Throttled, and
// [Report.Bottleneck] says when a stage runs at its quota. A rate-limited stage pays the
// limiter's Wait and two clock reads per attempt; a stage without it pays nothing.
func WithRateLimit(l Limiter) StageOption {
	if l == nil {
		panic("pipeline: WithRateLimit(nil)")
	}
	return stageOpt(func(c *config) {
		c.client.add(policyMaker{name: "WithRateLimit", order: orderLimit, serial: true, make: func(env policyEnv) hook {
			return &limitHook{env: env, l: l}
		}})
	})
}

// WithRateLimitPerKey gives each key of the stage's items a rate limit of its own:
// at most perSecond attempts per second on average for the items of one key, with
// bursts of burst (a token bucket of golang.org/x/time/rate), for a service that grants
// a quota per tenant, per account or per host. Items of different keys do not wait for
// each other's tokens.
//
// What it does not do: let a cold key overtake a hot one. A worker waiting for a key's
// token holds its item meanwhile, and the stage takes its items in the order they
// come. When one key's items come faster than its quota, they occupy every worker,
// then fill the stage's queue, and the source blocks: the other keys' items behind them
// wait too, and the whole stage runs at the hot key's pace (with a sequential source
// and bounded memory, nothing can pass what stands before it; [WithKey] does not
// change that, as its lanes fill the same way). To cap a hot key instead, bound the
// wait with [WithMaxTokenWait]: an item that would wait longer for its token is shed
// to the dead-letter destination, and the items behind it go on.
//
// The limiters belong to the option value: stages (and runs) given the same value share
// them. A key's limiter is dropped once it has been idle long enough to have refilled
// its bucket, so that the memory grows with the keys active in the last burst/perSecond
// seconds, not with every key ever seen.
//
// In must be the stage's input type: the stage's constructor panics otherwise. It
// panics if key is nil, perSecond is not positive and finite, or burst < 1.
func WithRateLimitPerKey[In any, K comparable](key func(In) K, perSecond float64, burst int) StageOption {
	if key == nil {
		panic("pipeline: WithRateLimitPerKey: nil key function")
	}
	if !(perSecond > 0) || math.IsInf(perSecond, 0) || burst < 1 {
		panic(fmt.Sprintf("pipeline: WithRateLimitPerKey(%v, %d): need a finite rate > 0 and a burst >= 1", perSecond, burst))
	}
	k := ratelimit.NewKeyed[K](perSecond, burst) // internal/ratelimit
	fn := func(v In) Limiter { return keyWait[K]{k, key(v)} }
	return stageOpt(func(c *config) {
		c.client.add(policyMaker{name: "WithRateLimitPerKey", order: orderKeyLimit, serial: true, make: func(env policyEnv) policy[In] {
			return &keyLimitPolicy[In]{env: env, lim: fn}
		}})
	})
}

// WithMaxTokenWait bounds how long an attempt of the stage may wait for a token of its
// rate limits ([WithRateLimit], [WithRateLimitPerKey]): an attempt that would wait
// longer is not made, and its item is shed: set aside at once as an item error
// ([ClassItem]) with a [*ThrottledError] (matching [ErrThrottled]), so that
// [WithDeadLetter] gets it and the report counts it under "*pipeline.ThrottledError";
// a stage without a dead-letter destination fails the run with it, as with any item
// error. Use it to cap a hot key, whose items would otherwise pace every key's (see
// WithRateLimitPerKey), or to shed load past a quota rather than queue it.
//
// A token of a [*rate.Limiter] or of WithRateLimitPerKey is reserved only when it comes
// within d, so a shed attempt takes none. Another [Limiter] is given a context that
// ends d from now, and an attempt whose wait ends that way is shed. The stage's
// constructor panics if the stage has no rate limit; it panics if d is not positive.
func WithMaxTokenWait(d time.Duration) StageOption {
	if d <= 0 {
		panic(fmt.Sprintf("pipeline: WithMaxTokenWait(%v): the bound must be positive", d))
	}
	return stageOpt(func(c *config) { c.client.maxTokenWait = d })
}

// limitHook is one run's WithRateLimit policy of a stage: before each attempt, a token.
type limitHook struct {
	env       policyEnv
	l         Limiter
	throttled atomic.Int64 // nanoseconds spent waiting for tokens, by all workers
}

func (p *limitHook) before(ctx context.Context, t ticket, _ func() error) (ticket, error) {
	return t, waitToken(ctx, &p.env, p.l, &p.throttled)
}
func (p *limitHook) cancel(ticket)                   {}
func (p *limitHook) after(ticket, error, Class) bool { return false }
func (p *limitHook) fill(s *StageReport)             { s.Throttled += time.Duration(p.throttled.Load()) }

// keyLimitPolicy is one run's WithRateLimitPerKey policy of a stage: before each
// attempt, a token of the item's key.
type keyLimitPolicy[In any] struct {
	env       policyEnv
	lim       func(In) Limiter
	throttled atomic.Int64 // nanoseconds spent waiting for tokens, by all workers
}

func (p *keyLimitPolicy[In]) before(ctx context.Context, v In, t ticket, _ func() error) (ticket, error) {
	return t, waitToken(ctx, &p.env, p.lim(v), &p.throttled)
}
func (p *keyLimitPolicy[In]) cancel(ticket)                   {}
func (p *keyLimitPolicy[In]) after(ticket, error, Class) bool { return false }
func (p *keyLimitPolicy[In]) fill(s *StageReport)             { s.Throttled += time.Duration(p.throttled.Load()) }

// waitToken takes a token of l, adding the time it waited to throttled. An error of
// the limiter's own (not the run stopping) is fatal; a wait past the stage's
// WithMaxTokenWait is a *ThrottledError.
func waitToken(ctx context.Context, env *policyEnv, l Limiter, throttled *atomic.Int64) error {
	wctx := env.waitCtx
	if ctx != env.r.ctx { // not the run's: a sink's (the run's with a value), or else kept as it is
		if sc, ok := ctx.(*sinkCtx); ok && sc.Context == env.r.ctx {
			wctx = sc.wait
		} else {
			wctx = ctx
		}
	}
	t0 := time.Now()
	var err error
	shed := false
	switch bl := l.(type) {
	case boundedLimiter:
		shed, err = bl.waitAtMost(wctx, env.maxTokenWait)
	case *rate.Limiter:
		shed, err = ratelimit.WaitAtMost(wctx, bl, env.maxTokenWait) // internal/ratelimit
	default:
		if env.maxTokenWait == 0 {
			err = l.Wait(wctx)
			break
		}
		bctx, cancel := context.WithTimeoutCause(wctx, env.maxTokenWait, errShed)
		err = l.Wait(bctx)
		shed = err != nil && ctx.Err() == nil && errors.Is(context.Cause(bctx), errShed)
		cancel()
	}
	throttled.Add(int64(time.Since(t0)))
	switch {
	case shed:
		return &ThrottledError{Stage: env.stage, MaxWait: env.maxTokenWait}
	case err == nil:
		return nil
	case ctx.Err() != nil:
		return context.Cause(ctx)
	}
	return fmt.Errorf("rate limiter: %w", err)
}

// errShed is the cause of the context that bounds a Limiter's wait.
var errShed = errors.New("pipeline: token wait bound")

// boundedLimiter is a Limiter that can refuse a token that would come too late.
type boundedLimiter interface {
	// waitAtMost waits for a token if it comes within d (any time when d is 0), and
	// reports whether it would not (shed: no token taken).
	waitAtMost(ctx context.Context, d time.Duration) (shed bool, err error)
}

// limitReport is the rate limits' part of the report's text.
var limitReport = policyReport{
	warnings: func(r Report, b Bottleneck, s StageReport) []string {
		if s.Name == b.Stage && s.Throttled > 0 && r.Elapsed > 0 && s.Workers > 0 {
			if share := float64(s.Throttled) / (float64(r.Elapsed) * float64(s.Workers)); share >= 0.5 {
				return []string{fmt.Sprintf("stage %q: its workers spent %d%% of their time waiting for its rate limit: it runs at its quota, and more workers will not help",
					s.Name, int(share*100))}
			}
		}
		return nil
	},
}

// keyWait is one key's Limiter of a WithRateLimitPerKey option: its Wait takes a token
// of key's bucket in the option's set of buckets.
type keyWait[K comparable] struct {
	k   *ratelimit.Keyed[K]
	key K
}

// Wait implements Limiter.
func (w keyWait[K]) Wait(ctx context.Context) error {
	_, err := w.k.WaitAtMost(ctx, w.key, 0)
	return err
}

// waitAtMost implements boundedLimiter.
func (w keyWait[K]) waitAtMost(ctx context.Context, d time.Duration) (shed bool, err error) {
	return w.k.WaitAtMost(ctx, w.key, d)
}
