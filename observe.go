package pipeline

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// EventKind says what an [Event] reports.
type EventKind uint8

const (
	// EventRetry is sent when an attempt failed with a transient error and will be retried.
	EventRetry EventKind = iota + 1
	// EventDeadLetter is sent when an item was set aside.
	EventDeadLetter
	// EventBudget is sent when an error budget tripped.
	EventBudget
	// EventCheckpoint is sent when a checkpointed run saved its position.
	EventCheckpoint
	// EventStageDone is sent when every worker of a stage has exited.
	EventStageDone
	// EventBreakerOpen is sent when a stage's circuit breaker opens; Err is the failure
	// that opened it.
	EventBreakerOpen
	// EventBreakerHalfOpen is sent when an open circuit breaker lets probes through.
	EventBreakerHalfOpen
	// EventBreakerClosed is sent when a circuit breaker closes after its probes
	// succeeded.
	EventBreakerClosed
	// EventLimit is sent when an adaptive stage's limit of active workers changes; Limit
	// is the new one.
	EventLimit
	// EventStuck is sent, once per attempt, when an attempt of a stage with [WithTimeout]
	// has run for a quarter of the timeout past it (1 ms at least): its function does not
	// return after its context is done. It comes between 1¼ and 1½ times the timeout
	// after the attempt began (for timeouts of 4 ms or more; d+1 ms to d+2 ms below),
	// also after the run was canceled. Age is how long the attempt had run, to within a
	// quarter of the timeout (never more than it had).
	EventStuck
)

// String returns the kind's name: "retry", "dead-letter", "budget", "checkpoint",
// "stage-done", "breaker-open", "breaker-half-open", "breaker-closed", "limit" or "stuck".
func (k EventKind) String() string { return enumName("EventKind", eventKindNames[:], k) }

var eventKindNames = [...]string{
	EventRetry: "retry", EventDeadLetter: "dead-letter", EventBudget: "budget", EventCheckpoint: "checkpoint",
	EventStageDone: "stage-done", EventBreakerOpen: "breaker-open", EventBreakerHalfOpen: "breaker-half-open",
	EventBreakerClosed: "breaker-closed", EventLimit: "limit", EventStuck: "stuck",
}

// enumName returns the name of v, a value of the enumeration typ whose names are names
// (indexed by value): names[v], or typ(v) for a value without one, as fmt prints an
// undefined value.
func enumName[E ~uint8](typ string, names []string, v E) string {
	if int(v) < len(names) && names[v] != "" {
		return names[v]
	}
	return fmt.Sprintf("%s(%d)", typ, uint8(v))
}

// Event is something worth knowing that happened in a run. Only rare things are events
// (no event is sent per successful item), so an observer costs nothing on the hot path.
type Event struct {
	Kind     EventKind
	Stage    string // the stage, or "checkpoint"
	Attempt  int    // EventRetry: the attempt that failed; EventDeadLetter: attempts made
	Err      error  // EventRetry, EventDeadLetter: the error; EventBudget: the budget error; EventBreakerOpen: the failure
	Position int64  // EventCheckpoint: the position saved
	Limit    int    // EventLimit: the adaptive stage's new limit
	// Key is, for an event of a breaker per key ([WithBreakerPerKey]: EventBreakerOpen,
	// EventBreakerHalfOpen, EventBreakerClosed), the key as fmt's %v prints it, or
	// "(other keys)" for the breaker that the keys past [KeyBounds].Keys share; "" for
	// any other event, and for a stage's or shared breaker.
	Key string
	// Age is, for EventStuck, how long the attempt had run: at least that, and less than a
	// quarter of the timeout more (1 ms at least).
	Age time.Duration
}

// WithObserver makes a pipeline call fn for every [Event] of its runs, from the
// goroutine where the event happened: fn must be quick and safe for concurrent use, and
// must not keep Err beyond the call if memory matters. A panic in fn fails the run like
// a panic in a stage. It is a pipeline option ([New]); several observers are all called,
// in order.
func WithObserver(fn func(Event)) PipelineOption {
	if fn == nil {
		panic("pipeline: WithObserver(nil)")
	}
	return pipelineOpt(func(c *config) {
		c.observers = append(c.observers, func(_ context.Context, e Event) { fn(e) })
	})
}

// WithLogger logs every [Event] of a pipeline's runs to l: retries and adaptive limit
// changes at Debug, dead letters, stuck attempts and an opening circuit breaker at Warn, a tripped
// budget at Error, checkpoints, finished stages and a breaker's other transitions at
// Info.
//
// Each record is logged with the context of the event: for an item's event (a retry, a
// dead letter, a tripped budget) the context its stage's function was given, less its
// per-attempt deadline; for the others the run's. Both carry the values of the context
// given to [Pipeline.Run], [Collect] or [All], so a handler finds there what the caller
// put in it (a trace's span, a request ID). It is a pipeline option ([New]), called like
// a [WithObserver] function, in order with them.
func WithLogger(l *slog.Logger) PipelineOption {
	if l == nil {
		panic("pipeline: WithLogger(nil)")
	}
	return pipelineOpt(func(c *config) { c.observers = append(c.observers, logEvent(l)) })
}

// logEvent returns the observer of [WithLogger]: it logs e to l with ctx.
func logEvent(l *slog.Logger) func(context.Context, Event) {
	return func(ctx context.Context, e Event) {
		switch e.Kind {
		case EventRetry:
			l.LogAttrs(ctx, slog.LevelDebug, "pipeline: retrying item", slog.String("stage", e.Stage),
				slog.Int("attempt", e.Attempt), slog.String("error", e.Err.Error()))
		case EventDeadLetter:
			l.LogAttrs(ctx, slog.LevelWarn, "pipeline: item dead-lettered", slog.String("stage", e.Stage),
				slog.Int("attempts", e.Attempt), slog.String("error", e.Err.Error()))
		case EventBudget:
			l.LogAttrs(ctx, slog.LevelError, "pipeline: error budget tripped", slog.String("stage", e.Stage),
				slog.String("error", e.Err.Error()))
		case EventCheckpoint:
			l.LogAttrs(ctx, slog.LevelInfo, "pipeline: checkpoint saved", slog.Int64("position", e.Position))
		case EventStageDone:
			l.LogAttrs(ctx, slog.LevelInfo, "pipeline: stage done", slog.String("stage", e.Stage))
		case EventBreakerOpen:
			l.LogAttrs(ctx, slog.LevelWarn, "pipeline: circuit breaker open", breakerAttrs(e, slog.String("error", errText(e.Err)))...)
		case EventBreakerHalfOpen:
			l.LogAttrs(ctx, slog.LevelInfo, "pipeline: circuit breaker half-open", breakerAttrs(e)...)
		case EventBreakerClosed:
			l.LogAttrs(ctx, slog.LevelInfo, "pipeline: circuit breaker closed", breakerAttrs(e)...)
		case EventLimit:
			l.LogAttrs(ctx, slog.LevelDebug, "pipeline: adaptive limit changed", slog.String("stage", e.Stage),
				slog.Int("limit", e.Limit))
		case EventStuck:
			l.LogAttrs(ctx, slog.LevelWarn, "pipeline: attempt stuck: the function does not return after its context is done",
				slog.String("stage", e.Stage), slog.Duration("age", e.Age))
		}
	}
}

// breakerAttrs are the attributes of a breaker's event: its stage, its key when it is
// a breaker per key's, then more.
func breakerAttrs(e Event, more ...slog.Attr) []slog.Attr {
	attrs := []slog.Attr{slog.String("stage", e.Stage)}
	if e.Key != "" {
		attrs = append(attrs, slog.String("key", e.Key))
	}
	return append(attrs, more...)
}

// emit sends e to the pipeline's observers, if any. A panic in an observer does not
// unwind the goroutine that sent the event (a worker mid-count, the saver, Run itself):
// it is recovered here and fails the run as a *PanicError of the stage "observer". ctx
// is the context of the event's item (the one its stage's function was given), or the
// run's; [WithLogger] logs with it.
func (r *run) emit(ctx context.Context, e Event) {
	if len(r.p.cfg.observers) == 0 {
		return
	}
	defer guard(nil, func(err error) { r.fail(&StageError{Stage: "observer", Err: err}) })
	for _, fn := range r.p.cfg.observers {
		fn(ctx, e)
	}
}

// errText is err's message, or "" for nil.
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
