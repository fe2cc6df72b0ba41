// Package pipeline runs typed, concurrent data pipelines that do not lose items, leak
// goroutines or grow without bound.
//
// A pipeline is a chain (or tree) of sources, stages and sinks. Each stage has a name,
// its own number of workers and its own bounded input queue; stages of different item
// types are joined with generic functions, so the compiler checks every connection:
//
//	p := pipeline.New()
//	ids := pipeline.FromSlice(p, []int{1, 2, 3})
//	users := pipeline.Then(ids, pipeline.NewStage("fetch", 16, fetchUser))
//	pipeline.To(users, pipeline.NewSink("save", 2, saveUser))
//	err := p.Run(ctx)
//
// # Stages
//
// [NewStage] makes a one-to-one stage, [NewFlatStage] one that emits zero or more
// outputs per input (a filter or a flat-map), [NewSink] a terminal one. [Then] attaches a
// stage to a stream, [To] ends a stream in a sink; [Collect] and [All] end it in the
// caller (a slice, or a range-over-func loop) and run the pipeline. Cheap per-item
// transformations that need no goroutine of their own are inline operators ([Map],
// [Filter]): they run in the producing goroutines, with no queue; [ForEach] is the
// inline end, for a cheap consumer (a sum, a buffered writer). Sources are
// [FromSlice], [FromSeq], [FromSeq2], [FromChan], [Generate] and [Replay].
//
// A Stage is an immutable definition and may be used in several pipelines; within one
// pipeline stage names are unique. Every stream has exactly one consumer.
//
// # Backpressure
//
// Every queue is bounded ([WithBuffer], default [DefaultBuffer]). A producer that finds
// its next queue full blocks until there is room, so a slow stage slows the stages
// before it, back to the source. Memory is therefore a function of the configuration
// (queue sizes, workers, item size), never of the input size. The [Report] gives each
// queue's peak length.
//
// Items move between goroutines in runs: a producer reserves room in the next queue for
// several items at once and hands them over together, and a worker takes a run of
// waiting items (fewer, the slower its function: about 16 µs of work) and hands its
// outputs on at the end of the run. The room a worker's run takes stays reserved in the
// queue until the worker starts each item, so the bound still counts items: at most n
// wait in a queue of n, a busy worker holds one beyond it, and a blocked producer one.
// An idle pipeline hands each item on at once. A source whose next item may be long in
// coming ([Generate], [FromSeq], [FromChan], [FromAcked]) hands on each item as it
// emits it; [FromSlice] hands them on in chunks, and when it is the one input of a
// stage or a [Batch] (no operator or [Merge] in between, an unkeyed queue with room for
// one item or more) it has no goroutine at all: the workers take its items in place,
// within the bound.
//
// # Cancellation and errors
//
// One run shares one errgroup. These rules hold for every run:
//
//   - Every goroutine a run starts has exited before [Pipeline.Run] (or the loop over
//     [All], or [Collect]) returns, whatever happened.
//   - The first fatal error cancels the run's context, with that error as its
//     [context.Cause]; every stage and source stops, and Run returns that error, once,
//     as a [*StageError] naming the stage or source. Use [errors.Is] and [errors.As] (or
//     errors.AsType) to match it and its cause.
//   - A canceled parent context stops the run promptly, and Run returns
//     [context.Cause] of the parent.
//   - A panic in user code (a stage function, a source, a sink, an inline operator, a
//     dead-letter destination) is recovered as a [*PanicError] carrying the stack, and
//     fails the run like any fatal error. It never crashes the process, and it is never
//     retried, dead-lettered or counted by a budget.
//   - On success, queues are closed in stage order, so every item that entered has
//     reached its sink (or was filtered or dead-lettered) before Run returns nil.
//   - Only the sender closes a queue, and when the run stops every goroutine sleeping
//     on a queue is woken, so no goroutine stays blocked once the run stops.
//
// Stage functions must honour their context: a function that ignores cancellation
// keeps its run from returning until it does.
//
// # Error classes
//
// Each error a stage function returns has a class that decides what happens to the
// item: [ClassFatal] stops the run, [ClassItem] sets the item aside (dead-letters it) and
// carries on, [ClassTransient] retries it when the stage has [WithRetry] and attempts
// are left, and otherwise sets it aside. Setting aside needs a destination: on a stage
// without [WithDeadLetter], an item error stops the run like a fatal one, so that no
// item ever disappears unless a policy says where it goes. The class is decided, in
// order, by:
//
//	who                                   class
//	the run's context is done             none: the item counts as failed, Run returns the cause
//	a panic                               fatal, always
//	a marker: Transient, Permanent, Fatal the marker's class (the outermost wins)
//	the stage's WithClassifier            what it returns; it sees timeouts too (errors.Is(err, ErrTimeout))
//	the attempt ran past WithTimeout      item (a classifier or a Transient marker can retry it)
//	nothing of the above                  fatal: with no policy, a pipeline fails fast
//
// A classifier that returns an undefined [Class] fails the run. When an item's error
// stops the run, the [*StageError] says how many attempts were made and whether the
// stage lacked a [WithDeadLetter] to set the item aside.
//
// # Options
//
// Everything optional is an option value, and each scope has its own option type:
// [PipelineOption] for [New], [StageOption] for a stage, [BatchOption], [WindowOption],
// [SourceOption], [CheckpointOption], [AckOption], [FilterOption], [CollectOption],
// [ReplayOption], [DeadLetterFileOption] and [ReadOption]. An option given where it
// means nothing does not compile. An option that fits several scopes returns a concrete
// type implementing each of them: [WithBuffer] (a pipeline's default, a stage's, a
// batch's, a window stage's, the end read by [Collect]), [WithName] (the rows that have
// no name argument: sources, [Batch], [Window], [Filter], [ForEach], [Collect] and [All]),
// [WithTotal] (a source's and [FromCheckpoint]'s), [WithLag] ([FromAcked]'s and
// [FromCheckpoint]'s), [WithClassifier] and [WithErrorBudget] (a pipeline's default, or
// a stage's own), and [WithCodec]. A nil option panics.
//
// # Middleware
//
// Per-item policies are stage options, applied around each call of the stage
// function: [WithTimeout] bounds each attempt (waiting for room downstream is not part
// of it), [WithRetry] retries transient errors with a [Backoff], [WithDeadLetter] sends
// set-aside items to a destination ([DeadLetterBuffer], [DeadLetterFile], or any
// function), and [WithErrorBudget] stops a run whose failure ratio is too high, either
// aborting it or draining it. A stage with none of them adds no allocation per item.
//
// A timeout cancels the attempt's context; it cannot end a function that never looks
// at it, and such an attempt holds its worker, and the run, until it returns, even
// after the run is canceled. Under [WithTimeout] the run reports it: once an attempt
// has run a quarter of its timeout past it (1 ms at least), an [EventStuck] (and, with
// [WithLogger], a warning that the function does not return after its context is done)
// comes between 1¼ and 1½ times the timeout after the attempt began, once per attempt;
// [StageReport.OldestAttempt] shows, in [Pipeline.Snapshot], the age of the stage's
// oldest attempt that has run a quarter of its timeout. One goroutine per such stage
// watches its workers while they run; a stage without WithTimeout has none.
//
// # Clients of a service
//
// A stage that calls a service can be a good client of it. [WithRateLimit] paces its
// attempts with a [Limiter] (a [golang.org/x/time/rate.Limiter], shared by any stages
// given the same one), and [WithRateLimitPerKey] gives each key a quota of its own; the
// wait for a token is not part of [WithTimeout], and [WithMaxTokenWait] bounds it,
// shedding the items whose token is too far off (a hot key's, which would otherwise
// pace every key behind it). An error marked with [RetryAfter] (or any error with a
// RetryAfter() time.Duration method) makes its retry wait at least the delay the server
// asked for, up to a cap ([WithRetryAfterCap], 10 minutes by default) past which the
// item is set aside at once with a [*RetryAfterError].
//
// [WithCircuitBreaker] stops calling a service that fails wholesale: while the breaker
// is open the stage's workers wait, holding their items, probe the service after a
// while, and go on once it answers, so an outage sets no item aside and fails none (and
// an error budget does not count the held items); a breaker not closed for its MaxOpen
// in all over a window, across spells, fails the run with a [*BreakerError].
// Breaker.Counts says which errors count toward opening (leave a 429 out). A stage's
// breaker is its own, for the whole stage whatever the items' keys;
// [NewCircuitBreaker] makes one that the stages of several pipelines share with
// [WithSharedBreaker], so that one service's outage is seen once. [WithBreakerPerKey]
// gives each key a breaker of its own instead, for a service that fails for some keys
// only: a failing key's items are held out of the workers' hands (at most
// [KeyBounds].Held per key) while the workers go on with the other keys.
//
// [WithAdaptiveWorkers] moves the number of the stage's active workers between a
// minimum and its workers from the latency and errors it measures, settling where the
// service starts to queue and following that point when it moves. The report gives each
// breaker's state and time open and each adaptive stage's limit and its changes; each
// transition and change is an [Event]. A stage without these options pays nothing for
// them.
//
// # Ordering
//
// Concurrent stages emit in completion order by default. [WithOrdered] restores input
// order through a bounded reorder window (a slow head item stalls the output, never
// memory); dead-lettered and filtered items do not stall it. [WithKey] keeps order per key
// instead: items with one key go to one worker, in order, while other keys run
// concurrently; [WithPartition] does so for keys that are numbers, partition p on worker
// p modulo the workers, so that n partitions on n workers get a worker each. [Merge]
// joins streams in arrival order (fan-in); [Tee] copies a stream to several branches,
// the slowest setting the pace.
//
// # Batching
//
// [Batch] groups items by count, by bytes ([WithMaxBytes]) and by time ([WithLinger]),
// counting why each batch was flushed; [Flatten] undoes it; [ToBatches] feeds a sink that
// takes batches, such as a database's bulk insert.
//
// # Windows
//
// [Window] rolls a stream up by key over event time: [Tumbling], [Sliding] and
// [Session] windows, folded by [Fold], [FoldMerge] or [Reduce] into a [WindowResult]
// per window. A window fires when the watermark (the greatest event time seen less
// [WithMaxDelay], moved by the clock after [WithIdleTimeout]) reaches its end; a late
// item updates its window within [WithAllowedLateness] and is set aside past it
// ([WithLateItems], ErrType "late"), never dropped unseen. A stage holds at most
// [WithMaxWindows] windows. In a checkpointed run an item settles when every window it
// fell into has, so that a sink that commits each result writes each window once
// across a crash.
//
// # Checkpointing
//
// [FromCheckpoint] makes a source restartable: a [CheckpointStore] ([FileCheckpoint], or one of
// your own) keeps the position of the first source item whose effects are not all
// committed, a watermark over every item derived from it, whatever the stages reorder,
// split, batch, filter or dead-letter. The position is saved every [WithSaveEvery] items
// and [WithSaveInterval], only after the sink committed, and a crash redoes at most
// [WithMaxRedo] items, so sinks must be idempotent. A sink that writes into a
// transactional store can instead commit its effects and the progress together with
// [Commit]; a store that implements [CommittedStore] then lets a resumed run skip what
// was committed, so that nothing is redone.
//
// # Acknowledged sources
//
// [FromAcked] makes a source whose items carry a settle callback, called exactly once
// per item when its fate is known (an [Outcome] in a [Settlement]): committed once every
// item derived from it reached a sink that returned nil or was filtered out,
// dead-lettered once a destination took a derived item, handed back by a stage with
// [WithHandBack], or not processed when the run stopped first (told before Run
// returns). It follows derived items (split, batched, copied by a [Tee]) as a checkpoint
// does; [WithMaxPending] bounds the unsettled items. It is how a broker's
// acknowledgements follow each message: the jetstream module maps the outcomes onto
// NATS JetStream's. [FromAckedBatches] is the same source for a consumer that fetches
// messages in batches (the kafka module's): its emit hands over a whole batch at once,
// each item still settled on its own.
//
// # Accounting
//
// After each run, [Pipeline.Report] says where every item went. For each stage, In =
// Succeeded + DeadLettered + Failed + NotStarted: an item that entered a stage was
// finished, set aside, failed (its error was fatal, or it was in flight when the run
// stopped), or never started (still queued, or skipped after a drained budget).
package pipeline
