package pipeline

import (
	"context"
	"fmt"
	"reflect"
	"time"
)

// Each scope has its own option interface, so that an option given where it has no
// meaning is a compile error rather than a silent no-op. An option that fits several
// scopes ([WithBuffer], [WithName], [WithTotal], [WithClassifier], [WithErrorBudget],
// [WithCodec]) returns a concrete type that implements each of their interfaces.

// PipelineOption configures a whole pipeline: [New]. The options: [WithBuffer] (every
// stage's default queue), [WithClassifier] and [WithErrorBudget] (every stage's
// default), [WithObserver] and [WithLogger].
type PipelineOption interface{ pipelineOption(*config) } //nolint:revive // named for its scope, like StageOption and BatchOption beside it

// StageOption configures a stage: [NewStage], [NewFlatStage], [NewSink]. The options:
// for failures, [WithTimeout], [WithRetry], [WithRetryAfterCap], [WithClassifier],
// [WithDeadLetter], [WithErrorBudget] and [WithHandBack]; for order, [WithOrdered],
// [WithKey] and [WithPartition]; for its queue, [WithBuffer]; for a client of a service,
// [WithRateLimit], [WithRateLimitPerKey], [WithMaxTokenWait], [WithCircuitBreaker],
// [WithSharedBreaker], [WithBreakerPerKey] and [WithAdaptiveWorkers].
type StageOption interface{ stageOption(*config) }

// BatchOption configures [Batch] and [ToBatches]. The options: [WithLinger],
// [WithMaxBytes], [WithBuffer] and [WithName].
type BatchOption interface{ batchOption(*config) }

// SourceOption configures a source: [FromSlice], [FromSeq], [FromSeq2], [FromChan],
// [Generate]. The options: [WithName] and [WithTotal] (not for FromSlice).
type SourceOption interface{ sourceOption(*config) }

// CheckpointOption configures a checkpointed source: [FromCheckpoint]. The options:
// [WithSaveEvery], [WithSaveInterval], [WithMaxRedo], [WithTotal], [WithLag] and
// [WithName].
type CheckpointOption interface{ checkpointOption(*config) }

// FilterOption configures the inline operators [Filter] and [ForEach]. The option:
// [WithName].
type FilterOption interface{ filterOption(*config) }

// CollectOption configures the end of a pipeline read by [Collect] or [All]. The
// options: [WithBuffer] and [WithName].
type CollectOption interface{ collectOption(*config) }

// ReplayOption configures [Replay]. The options: [WithCodec] and [WithName].
type ReplayOption interface{ replayOption(*config) }

// DeadLetterFileOption configures [OpenDeadLetterFile]. The options: [WithCodec] and
// [WithSyncEvery].
type DeadLetterFileOption interface{ deadLetterFileOption(*config) }

// ReadOption configures [ReadDeadLetters]. The option: [WithCodec].
type ReadOption interface{ readOption(*config) }

// config is the resolved set of options of a stage, a batch, a source or a pipeline.
type config struct {
	name         string
	buffer       int
	bufferSet    bool
	timeout      time.Duration
	attempts     int
	backoff      Backoff
	classify     func(error) Class
	deadLetter   any // func(context.Context, DeadLetter[In]) error, checked by the stage
	budget       *Budget
	ordered      bool
	window       int
	key          any    // func(In) uint64, checked by the stage
	keyBy        string // the option that set key: WithKey or WithPartition
	keyClash     string // two routing options given: "WithKey and WithPartition", say
	linger       time.Duration
	maxBytes     int
	sizer        any // func(T) int, checked by Batch
	saveEvery    int
	observers    []func(context.Context, Event) // WithObserver, WithLogger: called with the context of the event's item, or of the run
	maxRedo      int
	saveInterval time.Duration
	codec        any // Codec[T], checked by its user
	syncEvery    int
	handBack     bool                  // WithHandBack (ack.go)
	total        int64                 // WithTotal: the items a source declares it holds, 0 if not declared
	lag          func() []PartitionLag // WithLag (lag.go): a tracked source's backlog per partition
	client       clientConfig          // rate limits, circuit breaker, adaptive workers (client.go)
}

func (c *config) bufferOr(d int) int {
	if c.bufferSet {
		return c.buffer
	}
	return d
}

// typed returns v, an option's function kept untyped in the config, as F, the type it
// has on items of type T; it panics when the option was made for another item type.
// where names the constructor (and stage), what the option, on the kind of step.
func typed[F, T any](v any, where, what, on string) F {
	f, ok := v.(F)
	if !ok { // the item type by reflect: %T of a zero T prints <nil> for an interface type
		panic(fmt.Sprintf("pipeline: %s: %s for another item type (%T) on %s of %v", where, what, v, on, reflect.TypeFor[T]()))
	}
	return f
}

// configure applies opts to a new config; where names the constructor for the panic
// that a nil option gets.
func configure[O any](where string, opts []O, apply func(O, *config)) config {
	var c config
	for i, o := range opts {
		if any(o) == nil {
			panic(fmt.Sprintf("pipeline: %s: option %d of %d is nil", where, i+1, len(opts)))
		}
		apply(o, &c)
	}
	return c
}

// Single-scope options are functions of these types.
type (
	pipelineOpt   func(*config)
	stageOpt      func(*config)
	batchOpt      func(*config)
	checkpointOpt func(*config)
	fileOpt       func(*config)
)

func (f pipelineOpt) pipelineOption(c *config)     { f(c) }
func (f stageOpt) stageOption(c *config)           { f(c) }
func (f batchOpt) batchOption(c *config)           { f(c) }
func (f checkpointOpt) checkpointOption(c *config) { f(c) }
func (f fileOpt) deadLetterFileOption(c *config)   { f(c) }

// BufferOption is the option [WithBuffer] returns: it fits [New], a stage, [Batch] and
// [Collect]/[All].
type BufferOption struct{ n int }

func (o BufferOption) set(c *config)            { c.buffer, c.bufferSet = o.n, true }
func (o BufferOption) pipelineOption(c *config) { o.set(c) }
func (o BufferOption) stageOption(c *config)    { o.set(c) }
func (o BufferOption) batchOption(c *config)    { o.set(c) }
func (o BufferOption) collectOption(c *config)  { o.set(c) }

// NameOption is the option [WithName] returns: it names a row of the report made by a
// source, [FromCheckpoint], [Replay], [Batch], [Filter] or the end read by
// [Collect]/[All].
type NameOption struct{ name string }

func (o NameOption) sourceOption(c *config)     { c.name = o.name }
func (o NameOption) checkpointOption(c *config) { c.name = o.name }
func (o NameOption) replayOption(c *config)     { c.name = o.name }
func (o NameOption) batchOption(c *config)      { c.name = o.name }
func (o NameOption) filterOption(c *config)     { c.name = o.name }
func (o NameOption) collectOption(c *config)    { c.name = o.name }

// WithName names the row that a source, [FromCheckpoint], [Replay], [Batch], [Filter],
// [ForEach] or the end of [Collect]/[All] adds to the [Report]; the report, errors,
// Snapshot and metrics then use it. Like a stage's name, it must be unique in the
// pipeline: the constructor panics otherwise. Without it, such a row is named after
// its constructor ("FromSlice", "Batch", "Filter", "Collect", ...), numbered when the name is taken
// ("Batch#2"). It panics if name is empty.
func WithName(name string) NameOption {
	if name == "" {
		panic("pipeline: WithName(\"\"): empty name")
	}
	return NameOption{name}
}

// TotalOption is the option [WithTotal] returns: it fits a source ([FromSeq],
// [FromSeq2], [FromChan], [Generate]) and [FromCheckpoint].
type TotalOption struct{ n int64 }

func (o TotalOption) sourceOption(c *config)     { c.total = o.n }
func (o TotalOption) checkpointOption(c *config) { c.total = o.n }

// WithTotal declares how many items a source will yield, for a source that cannot know
// it ([FromSeq], [FromSeq2], [FromChan], [Generate], [FromCheckpoint]), so that the
// source's [StageReport].Total, and with it the progress shown by a Snapshot's reader
// (a progress line, the web view's done / total, percent and ETA), is known. For
// [FromCheckpoint], n counts every position of the input, those settled by earlier runs
// included: a resumed run's progress starts at its [StageReport].Resumed.
//
// The total is taken as given: it is not checked against the items the source yields,
// and it changes neither In nor NotStarted, so the report's accounting holds whatever
// the source does. It panics if n < 1, and [FromSlice], whose total is its length,
// panics when given it.
func WithTotal(n int64) TotalOption {
	if n < 1 {
		panic(fmt.Sprintf("pipeline: WithTotal(%d): need at least 1", n))
	}
	return TotalOption{n}
}

// ClassifierOption is the option [WithClassifier] returns: it fits [New] (the default
// of every stage) and a stage.
type ClassifierOption struct{ fn func(error) Class }

func (o ClassifierOption) pipelineOption(c *config) { c.classify = o.fn }
func (o ClassifierOption) stageOption(c *config)    { c.classify = o.fn }

// BudgetOption is the option [WithErrorBudget] returns: it fits [New] (one budget shared
// by every stage) and a stage (a budget of its own).
type BudgetOption struct{ b Budget }

func (o BudgetOption) pipelineOption(c *config) { b := o.b; c.budget = &b }
func (o BudgetOption) stageOption(c *config)    { b := o.b; c.budget = &b }

// CodecOption is the option [WithCodec] returns: it fits [OpenDeadLetterFile],
// [ReadDeadLetters] and [Replay].
type CodecOption struct{ codec any }

func (o CodecOption) deadLetterFileOption(c *config) { c.codec = o.codec }
func (o CodecOption) readOption(c *config)           { c.codec = o.codec }
func (o CodecOption) replayOption(c *config)         { c.codec = o.codec }
