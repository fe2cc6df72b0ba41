// Package ratelimit holds the token waits of the root package's rate limits that it
// can bound (WithMaxTokenWait): a rate.Limiter's, and those of the per-key buckets of
// WithRateLimitPerKey (Keyed), which it makes on first use and drops once they are full
// again.
package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// WaitAtMost waits for a token of l if it comes within d (any time when d is 0), and
// reports whether it would not (shed: no token taken); an error when ctx is done first
// (its cause) or when l can never serve one.
func WaitAtMost(ctx context.Context, l *rate.Limiter, d time.Duration) (shed bool, err error) {
	if d == 0 {
		return false, l.Wait(ctx)
	}
	now := time.Now()
	r := l.ReserveN(now, 1)
	if !r.OK() {
		return false, fmt.Errorf("pipeline: rate limit: a burst of %d cannot serve one attempt", l.Burst())
	}
	return sleepReserved(ctx, r, now, d)
}

// sleepReserved waits for reservation r, made at now, or gives it back and reports
// shed when it comes later than d from now (d > 0), or when ctx is done first.
func sleepReserved(ctx context.Context, r *rate.Reservation, now time.Time, d time.Duration) (shed bool, err error) {
	delay := r.DelayFrom(now)
	if d > 0 && delay > d {
		r.CancelAt(now)
		return true, nil
	}
	if delay <= 0 {
		return false, nil
	}
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-t.C:
		return false, nil
	case <-ctx.Done():
		r.Cancel() // give the token back to the bucket
		return false, context.Cause(ctx)
	}
}

// Keyed is the set of per-key limiters of one of the root package's
// WithRateLimitPerKey options: a token bucket per key, dropped once it is full again.
type Keyed[K comparable] struct {
	limit rate.Limit
	burst int
	idle  time.Duration

	mu    sync.Mutex
	m     map[K]*rate.Limiter
	swept time.Time
}

// NewKeyed returns a set of per-key limiters of perSecond tokens a second and bursts of
// burst.
func NewKeyed[K comparable](perSecond float64, burst int) *Keyed[K] {
	return &Keyed[K]{
		limit: rate.Limit(perSecond), burst: burst, m: make(map[K]*rate.Limiter),
		idle: time.Duration(float64(burst) / perSecond * float64(time.Second)), // a bucket's time to refill
	}
}

// WaitAtMost takes a token of key's bucket if it comes within d (any time when d is
// 0), as the package's WaitAtMost does. It reserves the token under the set's lock, so
// that a sweep never drops a bucket between a caller finding it and taking from it (a
// new bucket would then hand out a second burst).
func (k *Keyed[K]) WaitAtMost(ctx context.Context, key K, d time.Duration) (shed bool, err error) {
	now := time.Now()
	r := k.reserve(key, now)
	if !r.OK() {
		return false, fmt.Errorf("pipeline: rate limit: a burst of %d cannot serve one attempt", k.burst)
	}
	return sleepReserved(ctx, r, now, d)
}

// reserve takes a token of key's bucket at now, making the bucket on first use. Every
// idle interval, it first drops the buckets that are full again (no token owed, none
// taken since they refilled): a new one would behave the same.
func (k *Keyed[K]) reserve(key K, now time.Time) *rate.Reservation {
	k.mu.Lock()
	defer k.mu.Unlock()
	if now.Sub(k.swept) >= k.idle && len(k.m) > 0 {
		for key, l := range k.m {
			if l.TokensAt(now) >= float64(k.burst) {
				delete(k.m, key)
			}
		}
		k.swept = now
	}
	l := k.m[key]
	if l == nil {
		l = rate.NewLimiter(k.limit, k.burst)
		k.m[key] = l
	}
	return l.ReserveN(now, 1)
}

// size returns how many keys have a limiter (tests).
func (k *Keyed[K]) size() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
