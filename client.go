package pipeline

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/gopipeline/pipeline/internal/adaptive"
)

// A stage that calls a service can be a good client of it: [WithRateLimit] and
// [WithRateLimitPerKey] pace its attempts, [WithCircuitBreaker] holds its items while
// the service is down instead of failing them, and [WithAdaptiveWorkers] moves the
// number of its active workers with the latency it measures. Each is a policy (one file
// each: ratelimit.go, breaker.go, adaptive.go): a hook the worker calls before each
// attempt, which may wait or refuse, and one after it, which sees the attempt's error
// and class and may hold the item. This file ties the policies of a stage together.
//
// A stage with none of these options has a nil client: the worker loop tests it, held
// in a register, once per item and once per attempt (about 5 instructions per item and
// stage; callgrind counts 0.85 % more instructions for bench's S5 3x4 shape), and
// takes no lock, atomic, clock read or allocation for it.
//
// A new policy is one file: an option that adds a [policyMaker] to the stage's
// clientConfig, and a type that implements policy (or hook, when it does not look at
// the item). Its figures go into the report through fill, and its lines through a
// policyReport.

// policy is one run's state of one client policy of a stage, shared by its workers.
type policy[In any] interface {
	// before is called before an attempt of v. It may wait (for a token, for a
	// breaker to let the attempt through); it returns nil when the attempt may begin,
	// or why it may not: the run's cause, or a fatal error. A policy that may keep
	// the attempt waiting for long (a breaker not closed) calls hold first, once:
	// the worker hands on what its run finished and publishes its counts
	// (worker.hold), and hold's error, if any, is before's.
	before(ctx context.Context, v In, t ticket, hold func() error) (ticket, error)
	// cancel gives back what before took for an attempt that will not begin (a later
	// policy refused it), or whose outcome will not be settled (the run stopped under
	// it, or its function panicked).
	cancel(t ticket)
	// after sees the attempt's outcome: err is nil on success, else the attempt's
	// error and its class. It reports whether the item is held: the attempt does not
	// count as one of the item's, and the item is tried again.
	after(t ticket, err error, class Class) (held bool)
	// fill sets the policy's figures in a report of the stage.
	fill(s *StageReport)
}

// perWorker is a policy that tells the stage's workers apart (a breaker per key, which
// keeps a key under the state that admitted its attempt until that attempt ends:
// breaker.go): worker i's client calls the policy that worker(i) returns in its stead.
type perWorker[In any] interface {
	worker(i int) policy[In]
}

// hook is a policy that does not look at the item.
type hook interface {
	before(ctx context.Context, t ticket, hold func() error) (ticket, error)
	cancel(t ticket)
	after(t ticket, err error, class Class) (held bool)
	fill(s *StageReport)
}

// itemless adapts a hook to policy[In].
type itemless[In any] struct{ h hook }

func (p itemless[In]) before(ctx context.Context, _ In, t ticket, hold func() error) (ticket, error) {
	return p.h.before(ctx, t, hold)
}
func (p itemless[In]) cancel(t ticket)                             { p.h.cancel(t) }
func (p itemless[In]) after(t ticket, err error, class Class) bool { return p.h.after(t, err, class) }
func (p itemless[In]) fill(s *StageReport)                         { p.h.fill(s) }

// ticket is what the policies gave an attempt before it began, for their after hooks.
type ticket struct {
	began    time.Duration // adaptive.go: when it began (adaptive.Limit.Begin's clock reading: 8 bytes, not a time.Time)
	inflight bool          // adaptive.go: it is counted in flight
	measured bool          // adaptive.go: its latency is measured
	probe    bool          // breaker.go: it is a half-open breaker's probe
	back     bool          // breaker.go: a breaker per key: the item was held and taken back, and its key's other held items do not hold it
	key      uint32        // breaker.go: a breaker per key: 1 + the index of the attempt's key state (0: none)
}

// policyEnv is what a policy is made with: its run, row and stage.
type policyEnv struct {
	r       *run
	row     *row
	stage   string
	workers int
	waitCtx context.Context // the run's context without its deadline, for waits
	raCap   time.Duration   // the longest Retry-After honoured (WithRetryAfterCap)

	maxTokenWait time.Duration // WithMaxTokenWait (ratelimit.go); 0: no bound
}

// policyMaker is what a client option stores in its stage's config.
type policyMaker struct {
	name  string // a later option of the same name replaces an earlier one
	order int    // policies apply in increasing order before an attempt (and after it)
	// make makes the policy of one run: a func(policyEnv) hook, or a
	// func(policyEnv) policy[In] for the stage's In (checked by the stage).
	make any
	// check, when not nil, validates the stage at construction: it returns the
	// message of a panic, or "".
	check func(workers int, keyedBy string) string // keyedBy: the stage's routing option (WithKey, WithPartition), or ""
	// serial: before may keep one item waiting while others of the stage could go
	// (a token of its key): a worker takes one item at a time, leaving the rest queued.
	serial bool
	// unordered: the policy cannot serve a stage with WithOrdered (the message of the
	// panic, or "").
	unordered string
}

// The orders of the policies: a breaker holds an attempt before it waits for a token,
// and the adaptive limit counts it in flight last.
const (
	orderBreaker = 10 * (iota + 1)
	orderLimit
	orderKeyLimit
	orderAdaptive
)

// clientConfig is the part of a stage's config set by the options of this file's
// family.
type clientConfig struct {
	makers        []policyMaker // by order
	retryAfterCap time.Duration // WithRetryAfterCap (retryafter.go); 0: the default
	maxTokenWait  time.Duration // WithMaxTokenWait (ratelimit.go); 0: no bound
}

func (c clientConfig) any() bool { return len(c.makers) > 0 }

// add adds or replaces a policy.
func (c *clientConfig) add(m policyMaker) {
	c.makers = slices.DeleteFunc(slices.Clone(c.makers), func(o policyMaker) bool { return o.name == m.name })
	i, _ := slices.BinarySearchFunc(c.makers, m.order, func(o policyMaker, order int) int { return o.order - order })
	c.makers = slices.Insert(c.makers, i, m)
}

// client is one run's state of a stage's client options, shared by its workers.
type client[In any] struct {
	policies []policy[In]
	// hooks are the policies when none looks at the item (the usual case): called
	// directly, not through itemless (callgrind: about 50 instructions fewer per
	// attempt of a breaker's stage); nil otherwise.
	hooks  []hook
	adapt  *adaptive.Limit // adaptive.go: the workers above its limit wait between runs; nil without
	keyed  heldItems[In]   // breaker.go: a breaker per key, which holds items out of the workers' hands; nil without
	serial bool            // a worker takes one item at a time (policyMaker.serial)
	split  bool            // a policy tells the workers apart (perWorker): each has its own client (forWorker)
}

// noDeadline is a context without a deadline, canceled with its parent (at the
// parent's deadline too). Limiters get it: a rate.Limiter refuses at once a wait that
// would end past its context's deadline, which would fail the run early with a
// limiter's error, where waiting until the deadline ends it with the deadline's.
type noDeadline struct{ context.Context }

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

// checkClient validates the client options of a stage at construction.
func (st *Stage[In, Out]) checkClient(ctor string) {
	if st.cfg.client.maxTokenWait > 0 && !slices.ContainsFunc(st.cfg.client.makers, func(m policyMaker) bool { return m.order == orderLimit || m.order == orderKeyLimit }) {
		panic(fmt.Sprintf("pipeline: %s(%q): WithMaxTokenWait without WithRateLimit or WithRateLimitPerKey", ctor, st.name))
	}
	for _, m := range st.cfg.client.makers {
		switch m.make.(type) {
		case func(policyEnv) hook, func(policyEnv) policy[In]:
		default:
			var zero In
			panic(fmt.Sprintf("pipeline: %s(%q): %s for another item type on a stage of %T", ctor, st.name, m.name, zero))
		}
		if m.unordered != "" && st.cfg.ordered {
			panic(fmt.Sprintf("pipeline: %s(%q): %s", ctor, st.name, m.unordered))
		}
		if m.check != nil {
			if msg := m.check(st.workers, st.cfg.keyBy); msg != "" {
				panic(fmt.Sprintf("pipeline: %s(%q): %s", ctor, st.name, msg))
			}
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
	env := policyEnv{r: r, row: rw, stage: rw.name, workers: st.workers, waitCtx: noDeadline{r.ctx}, raCap: c.retryAfterCapOf(), maxTokenWait: c.maxTokenWait}
	cl := &client[In]{}
	keyed := false
	for _, m := range c.makers {
		var p policy[In]
		switch mk := m.make.(type) {
		case func(policyEnv) hook:
			h := mk(env)
			if a, ok := h.(*adaptivePolicy); ok {
				cl.adapt = a.a
			}
			p = itemless[In]{h}
			cl.hooks = append(cl.hooks, h)
		case func(policyEnv) policy[In]:
			p = mk(env)
			keyed = true
			if h, ok := p.(heldItems[In]); ok {
				cl.keyed = h
			}
			if _, ok := p.(perWorker[In]); ok {
				cl.split = true
			}
		}
		cl.policies = append(cl.policies, p)
		cl.serial = cl.serial || m.serial
	}
	if keyed {
		cl.hooks = nil
	}
	rw.client = cl
	return cl
}

// forWorker returns the client of the stage's worker i: cl itself (nil without a
// client), or, when a policy tells the workers apart, a copy of cl with that policy's
// view for worker i. The run's cl (the row's) reports.
func (cl *client[In]) forWorker(i int) *client[In] {
	if cl == nil || !cl.split {
		return cl
	}
	c := *cl
	c.policies = slices.Clone(cl.policies)
	for j, p := range c.policies {
		if pw, ok := p.(perWorker[In]); ok {
			c.policies[j] = pw.worker(i)
		}
	}
	return &c
}

// clientRow is what a row's report reads of its stage's client.
type clientRow interface {
	fill(s *StageReport)
}

// fill sets the client's figures in a report of its stage.
func (cl *client[In]) fill(s *StageReport) {
	for _, p := range cl.policies {
		p.fill(s)
	}
}

// acquire is called before each attempt: it runs the policies' before hooks in order
// (a breaker's wait, then the rate limiters' tokens, then the adaptive count), from
// ticket t: what the attempt has already (a held item's admission by its key's
// breaker, the first policy, whose before lets it through: breaker.go). It sets *into
// to the attempt's ticket after each policy (so that what they took can be released
// if a later one's key function panics), or returns why the attempt cannot begin: the
// run's cause, or a fatal error (a breaker open too long, a limiter that failed). What
// the policies before the one that refused took is given back.
func (cl *client[In]) acquire(ctx context.Context, v In, t ticket, into *ticket, hold func() error) (err error) {
	*into = t
	if cl.hooks != nil {
		for i, h := range cl.hooks {
			if t, err = h.before(ctx, t, hold); err != nil {
				for j := i - 1; j >= 0; j-- {
					cl.hooks[j].cancel(t)
				}
				return err
			}
			*into = t
		}
		return nil
	}
	for i, p := range cl.policies {
		if t, err = p.before(ctx, v, t, hold); err != nil {
			for j := i - 1; j >= 0; j-- {
				cl.policies[j].cancel(t)
			}
			return err
		}
		*into = t
	}
	return nil
}

// release gives back what acquire took (t) for an attempt whose outcome will not be
// settled: each policy's cancel, as when a later policy refuses.
func (cl *client[In]) release(t ticket) {
	if cl.hooks != nil {
		for _, h := range cl.hooks {
			h.cancel(t)
		}
		return
	}
	for _, p := range cl.policies {
		p.cancel(t)
	}
}

// settle is called after each attempt with its error (nil on success) and class. It
// reports whether the item is held: a policy (a breaker not closed) asked that the
// attempt not count as one of the item's, and the item is tried again once the
// policies let it.
func (cl *client[In]) settle(t ticket, err error, class Class) (held bool) {
	if cl.hooks != nil {
		for _, h := range cl.hooks {
			if h.after(t, err, class) {
				held = true
			}
		}
		return held
	}
	for _, p := range cl.policies {
		if p.after(t, err, class) {
			held = true
		}
	}
	return held
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
		cl.adapt.Close()
	}
}

// policyReport is how a policy kind shows in the report's text: its warnings for
// [Report.Bottleneck], its lines for [Report.String] and its part of [Report.Line].
type policyReport struct {
	warnings func(r Report, b Bottleneck, s StageReport) []string
	lines    func(b *strings.Builder, s StageReport)
	line     func(s StageReport) string
}

// policyReports are the report parts of the policy kinds, in the order they print.
var policyReports = []policyReport{breakerReport, limitReport, adaptiveReport}

// clientWarnings are the findings of [Report.Bottleneck] about the client options:
// an adaptive bottleneck held below its maximum (more workers would only queue at the
// service), a breaker not closed, a stage at its quota.
func (r Report) clientWarnings(b Bottleneck) []string {
	var out []string
	for _, s := range r.Stages {
		for _, pr := range policyReports {
			if pr.warnings != nil {
				out = append(out, pr.warnings(r, b, s)...)
			}
		}
	}
	return out
}

// clientLines are the lines of [Report.String] about breakers and adaptive limits.
func (r Report) clientLines() string {
	var b strings.Builder
	for _, s := range r.Stages {
		for _, pr := range policyReports {
			if pr.lines != nil {
				pr.lines(&b, s)
			}
		}
	}
	return b.String()
}

// clientLine is what [Report.Line] adds for a stage's breaker and adaptive limit.
func (s StageReport) clientLine() string {
	var out strings.Builder
	for _, pr := range policyReports {
		if pr.line != nil {
			out.WriteString(pr.line(s))
		}
	}
	return out.String()
}
