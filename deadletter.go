package pipeline

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// DeadLetter is the record of an item set aside after its last attempt. It keeps the
// item and the errors' text, not the error values: an error can hold on to large values
// (a request body, a buffer) that should not outlive the attempt.
type DeadLetter[T any] struct {
	Stage      string    `json:"stage"`
	Item       T         `json:"item"`
	Attempts   int       `json:"attempts"`
	Class      Class     `json:"class"`
	ErrType    string    `json:"err_type"`    // Go type naming the last error ("timeout", or "error" for errors.New and fmt.Errorf values)
	FirstError string    `json:"first_error"` // text of the first attempt's error
	LastError  string    `json:"last_error"`  // text of the last attempt's error
	Time       time.Time `json:"time"`        // when the item was set aside
}

// WithDeadLetter sends each item that a stage sets aside (an item error, or a transient
// error out of attempts) to fn, from the worker that handled it; fn may be called from
// several workers at once. If fn returns an error, the item cannot be kept, so the run
// stops with that error. In a checkpointed run ([FromCheckpoint]), fn may call [Commit]
// with its ctx to write the record and the run's progress in one transaction, as a sink
// does: then a crash after the record was written never sets the item aside twice
// (pgpipe's DeadLetterTable does this when given the run's checkpoint). T must be the
// stage's input type: the stage's constructor panics otherwise. A stage without WithDeadLetter has nowhere to set an item
// aside, so there an item error (or a transient one out of attempts) stops the run:
// failing fast stays the default until a destination is given.
//
// Ready-made destinations: [DeadLetterBuffer.Add] (in memory) and [DeadLetterFile.Add]
// (a JSON Lines file).
func WithDeadLetter[T any](fn func(ctx context.Context, dl DeadLetter[T]) error) StageOption {
	if fn == nil {
		panic("pipeline: WithDeadLetter(nil)")
	}
	return stageOpt(func(c *config) { c.deadLetter = fn })
}

// SetAside tells the run that the function of a sink ([NewSink]), called with ctx, set
// aside one part of its current item itself, for cause: a row of a batch that a
// database rejected and that the connector put in a dead-letter table of its own (the
// postgres module's writer does this, once the batch committed). The report counts it
// in the sink's row, as [StageReport.SetAside], with cause among the row's Causes and
// Errors, and in [Report.DeadLettered]; the sink's own item (the batch) still counts
// as succeeded, so that In = Succeeded + DeadLettered + Failed + NotStarted holds in
// whole items. Call it once per part, after the part's fate is final; outside a sink's
// function it does nothing.
func SetAside(ctx context.Context, cause error) {
	rw, _ := ctx.Value(setAsideKey{}).(*row)
	if rw == nil || cause == nil {
		return
	}
	typ := errTypeName(cause)
	rw.setAside.Add(1)
	rw.addCause(typ, causeMessage(cause))
	rw.addError(typ, func(e *ErrorCount) { e.DeadLettered++ })
}

// setAsideKey is the context key of a sink worker's row, for SetAside.
type setAsideKey struct{}

// sinkCtx is a sink worker's context: the run's, with the row for SetAside as a value.
// A wait of the client's (a rate limit's token) recognizes it as the run's, and waits
// with wait, which has no deadline, as with the run's own (policyEnv.waitCtx).
type sinkCtx struct {
	context.Context // the run's
	row             *row
	wait            context.Context // noDeadline{this}
}

func newSinkCtx(run context.Context, rw *row) *sinkCtx {
	c := &sinkCtx{Context: run, row: rw}
	c.wait = noDeadline{c}
	return c
}

func (c *sinkCtx) Value(key any) any {
	if key == (setAsideKey{}) {
		return c.row
	}
	return c.Context.Value(key)
}

// DeadLetterBuffer keeps dead letters in memory, up to a fixed number; the ones past it
// are counted and dropped. It is safe for concurrent use.
type DeadLetterBuffer[T any] struct {
	mu       sync.Mutex
	max      int
	items    []DeadLetter[T]
	overflow int64
}

// NewDeadLetterBuffer returns a buffer that keeps at most max dead letters. It panics
// if max < 0.
func NewDeadLetterBuffer[T any](max int) *DeadLetterBuffer[T] {
	if max < 0 {
		panic(fmt.Sprintf("pipeline: NewDeadLetterBuffer(%d): negative size", max))
	}
	return &DeadLetterBuffer[T]{max: max}
}

// Add keeps dl, or counts it as overflow when the buffer is full. It never fails; its
// signature fits [WithDeadLetter].
func (b *DeadLetterBuffer[T]) Add(_ context.Context, dl DeadLetter[T]) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.items) < b.max {
		b.items = append(b.items, dl)
	} else {
		b.overflow++
	}
	return nil
}

// Items returns a copy of the kept dead letters, in the order they were added.
func (b *DeadLetterBuffer[T]) Items() []DeadLetter[T] {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]DeadLetter[T](nil), b.items...)
}

// Overflow returns how many dead letters arrived when the buffer was full.
func (b *DeadLetterBuffer[T]) Overflow() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.overflow
}

// Codec encodes items for a dead-letter file. [JSONCodec] is the default. Marshal must
// return one JSON value (for binary formats, a JSON string of base64, say), which is
// stored inline in the record's "item" field.
type Codec[T any] interface {
	Marshal(v T) ([]byte, error)
	Unmarshal(data []byte, v *T) error
}

// JSONCodec encodes items with encoding/json.
type JSONCodec[T any] struct{}

// Marshal implements [Codec].
func (JSONCodec[T]) Marshal(v T) ([]byte, error) { return json.Marshal(v) }

// Unmarshal implements [Codec].
func (JSONCodec[T]) Unmarshal(data []byte, v *T) error { return json.Unmarshal(data, v) }

// DeadLetterFile appends dead letters to a JSON Lines file, one record per line.
//
// Durability: each record is written to the file with one write call as it arrives, so
// a crash of the process loses nothing that Add returned for; [DeadLetterFile.Sync]
// (called by Close, and every syncEvery records when syncEvery > 0) asks the operating
// system to put it on disk, so a crash of the machine loses at most the records since
// the last sync. It is safe for concurrent use.
type DeadLetterFile[T any] struct {
	mu        sync.Mutex
	f         *os.File
	codec     Codec[T]
	syncEvery int
	unsynced  int
	buf       []byte
}

// WithCodec sets how [OpenDeadLetterFile], [ReadDeadLetters] and [Replay] encode and
// decode items; the default is [JSONCodec]. T must be the file's item type: the
// function given the option panics otherwise. It panics if codec is nil.
func WithCodec[T any](codec Codec[T]) CodecOption {
	if codec == nil {
		panic("pipeline: WithCodec(nil)")
	}
	return CodecOption{codec}
}

// WithSyncEvery makes a [DeadLetterFile] ask the operating system to put the file on
// disk every n records, so that a crash of the machine loses at most the records since
// the last sync. The default, 0, syncs only on Sync and Close. It panics if n < 0.
func WithSyncEvery(n int) DeadLetterFileOption {
	if n < 0 {
		panic(fmt.Sprintf("pipeline: WithSyncEvery(%d): negative count", n))
	}
	return fileOpt(func(c *config) { c.syncEvery = n })
}

// codecOf returns the codec of cfg ([JSONCodec] by default), panicking when it is for
// another item type.
func codecOf[T any](where string, cfg config) Codec[T] {
	if cfg.codec == nil {
		return JSONCodec[T]{}
	}
	return typed[Codec[T], T](cfg.codec, where, "WithCodec", "items")
}

// OpenDeadLetterFile opens (creating it if needed) the file at path for appending, with
// [WithCodec] and [WithSyncEvery] as options. A torn last line left by a crash is cut
// off first, so that new records start on a line of their own.
func OpenDeadLetterFile[T any](path string, opts ...DeadLetterFileOption) (*DeadLetterFile[T], error) {
	cfg := configure("OpenDeadLetterFile", opts, DeadLetterFileOption.deadLetterFileOption)
	codec, syncEvery := codecOf[T]("OpenDeadLetterFile", cfg), cfg.syncEvery
	f, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	if err := cutTornLine(f); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("pipeline: open dead-letter file: %w", err)
	}
	return &DeadLetterFile[T]{f: f, codec: codec, syncEvery: syncEvery}, nil
}

// cutTornLine truncates f after its last newline, if it does not end with one.
func cutTornLine(f *os.File) error {
	st, err := f.Stat()
	if err != nil || st.Size() == 0 {
		return err
	}
	size := st.Size()
	buf := make([]byte, 4096)
	for end := size; end > 0; {
		start := max(end-int64(len(buf)), 0)
		n, err := f.ReadAt(buf[:end-start], start)
		if err != nil && !errors.Is(err, io.EOF) {
			return err
		}
		if i := bytes.LastIndexByte(buf[:n], '\n'); i >= 0 {
			if keep := start + int64(i) + 1; keep != size {
				return f.Truncate(keep)
			}
			return nil
		}
		end = start
	}
	return f.Truncate(0) // not one whole line
}

// DiscardDeadLetter is a dead-letter destination that keeps nothing: give it to
// [WithDeadLetter] to let a stage set items aside (counted, by cause, in the run's
// [Report]) without storing them.
func DiscardDeadLetter[T any](context.Context, DeadLetter[T]) error { return nil }

// fileRecord is the line format: the DeadLetter with the item encoded by the codec.
type fileRecord struct {
	Stage      string          `json:"stage"`
	Item       json.RawMessage `json:"item"`
	Attempts   int             `json:"attempts"`
	Class      Class           `json:"class"`
	ErrType    string          `json:"err_type"`
	FirstError string          `json:"first_error"`
	LastError  string          `json:"last_error"`
	Time       time.Time       `json:"time"`
}

// Add appends dl as one line. Its signature fits [WithDeadLetter].
func (d *DeadLetterFile[T]) Add(_ context.Context, dl DeadLetter[T]) error {
	item, err := d.codec.Marshal(dl.Item)
	if err != nil {
		return fmt.Errorf("pipeline: encode dead letter: %w", err)
	}
	if !json.Valid(item) {
		return fmt.Errorf("pipeline: encode dead letter: the codec did not produce one JSON value")
	}
	line, err := json.Marshal(fileRecord{
		Stage: dl.Stage, Item: item, Attempts: dl.Attempts, Class: dl.Class, ErrType: dl.ErrType,
		FirstError: dl.FirstError, LastError: dl.LastError, Time: dl.Time,
	})
	if err != nil {
		return fmt.Errorf("pipeline: encode dead letter: %w", err)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return errors.New("pipeline: DeadLetterFile is closed")
	}
	d.buf = append(append(d.buf[:0], line...), '\n')
	if _, err := d.f.Write(d.buf); err != nil {
		return err
	}
	d.unsynced++
	if d.syncEvery > 0 && d.unsynced >= d.syncEvery {
		d.unsynced = 0
		return d.f.Sync()
	}
	return nil
}

// Sync flushes the file to stable storage.
func (d *DeadLetterFile[T]) Sync() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	d.unsynced = 0
	return d.f.Sync()
}

// Close syncs and closes the file. Add after Close returns an error.
func (d *DeadLetterFile[T]) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.f == nil {
		return nil
	}
	err := errors.Join(d.f.Sync(), d.f.Close())
	d.f = nil
	return err
}

// ReadDeadLetters returns the records of a dead-letter file, decoding items with the
// codec of [WithCodec] ([JSONCodec] by default). A last line without its newline (a
// crash mid-write) is ignored. A malformed line does not hide the others: every record
// that can be read is returned, together with an error that names each bad line (a
// [*DeadLetterReadError]). An error opening or reading the file returns no records.
func ReadDeadLetters[T any](path string, opts ...ReadOption) ([]DeadLetter[T], error) {
	cfg := configure("ReadDeadLetters", opts, ReadOption.readOption)
	return readDeadLetters(path, codecOf[T]("ReadDeadLetters", cfg))
}

func readDeadLetters[T any](path string, codec Codec[T]) ([]DeadLetter[T], error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read-only: Close cannot lose data
	var (
		out []DeadLetter[T]
		bad *DeadLetterReadError
	)
	rd := bufio.NewReader(f)
	for line := 1; ; line++ {
		b, err := rd.ReadBytes('\n')
		if errors.Is(err, io.EOF) { // b, if any, is a torn last line
			if bad != nil {
				return out, bad
			}
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		dl, err := decodeDeadLetter(b, codec)
		if err != nil {
			if bad == nil {
				bad = &DeadLetterReadError{Path: path}
			}
			bad.Lines = append(bad.Lines, line)
			bad.Errs = append(bad.Errs, err)
			continue
		}
		out = append(out, dl)
	}
}

func decodeDeadLetter[T any](b []byte, codec Codec[T]) (DeadLetter[T], error) {
	var rec fileRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return DeadLetter[T]{}, err
	}
	dl := DeadLetter[T]{
		Stage: rec.Stage, Attempts: rec.Attempts, Class: rec.Class, ErrType: rec.ErrType,
		FirstError: rec.FirstError, LastError: rec.LastError, Time: rec.Time,
	}
	if err := codec.Unmarshal(rec.Item, &dl.Item); err != nil {
		return DeadLetter[T]{}, fmt.Errorf("item: %w", err)
	}
	return dl, nil
}

// Replay returns a source of the items in a dead-letter file whose stage is stage (all
// items when stage is ""), in file order, so that they can be fed through the same stage
// again after a fix. Options: [WithCodec] (the file's codec) and [WithName] (the
// source's row). The file is read when the run starts. An error opening or reading it
// fails the run, and so do malformed lines, before any item is sent: the
// [*DeadLetterReadError] names them. To replay the readable records of such a file,
// feed what [ReadDeadLetters] returns to [FromSlice].
func Replay[T any](p *Pipeline, path, stage string, opts ...ReplayOption) *Stream[T] {
	cfg := configure("Replay", opts, ReplayOption.replayOption)
	codec := codecOf[T]("Replay", cfg)
	return newSourceNamed(p, "Replay", cfg.name, nil, 0, false, nil, func(ctx context.Context, emit func(T) error) error {
		dls, err := readDeadLetters(path, codec)
		if err != nil {
			return err
		}
		for _, dl := range dls {
			if stage != "" && dl.Stage != stage {
				continue
			}
			if err := emit(dl.Item); err != nil {
				return err
			}
		}
		return nil
	})
}

// setAside sets the item in hand aside after its last attempt: it gives it back to an
// acknowledged source ([WithHandBack]), or hands its record to the stage's destination.
// It returns the item's ending for end: without a destination the item fails, and a
// destination's error fails the run.
func (w *worker[In, Out]) setAside(ctx context.Context, v In, attempts int, class Class, first, last error) (outcome, error) {
	if class == ClassTransient && w.st.cfg.handBack && w.out.handsBack(w.pos) {
		w.f = fate{attempts: attempts, mark: w.handBackMark(attempts, first, last)} // ack.go
		return handedBack, last
	}
	if w.st.dl == nil { // nowhere to set it aside: an item error stops the run too
		w.f = fate{attempts: attempts, noDL: true}
		return failed, last
	}
	typ, msg := errTypeName(last), last.Error()
	firstMsg := msg
	if first != last { //nolint:errorlint // identity, not equivalence: the same error value
		firstMsg = first.Error()
	}
	rec := DeadLetter[In]{
		Stage: w.st.name, Item: v, Attempts: attempts, Class: class, ErrType: typ,
		FirstError: firstMsg, LastError: msg, Time: time.Now(),
	}
	w.publish() // the destination may wait
	// The destination may record the item's position with Commit (commit.go).
	dctx := w.out.scope(ctx, &w.pos)
	if err := w.st.dl(dctx, rec); err != nil {
		if ctx.Err() != nil { // the run stopped meanwhile: its cause, not the destination's echo
			return interrupted, context.Cause(ctx)
		}
		return interrupted, &StageError{Stage: w.st.name, Err: fmt.Errorf("dead-letter destination: %w", err)}
	}
	w.f = fate{attempts: attempts, mark: ackMark{dl: stripItem(rec)}}
	return deadLettered, last
}
