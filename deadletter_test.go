package pipeline_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gopipeline/pipeline"
)

// order is an item with some structure, to check the file codec round trip.
type order struct {
	ID    int      `json:"id"`
	Lines []string `json:"lines"`
}

// TestDeadLetterBuffer checks that a buffer keeps up to its size and counts the rest
// as overflow, while the report counts every dead letter.
func TestDeadLetterBuffer(t *testing.T) {
	t.Parallel()
	for _, workers := range []int{1, 4} {
		buf := pipeline.NewDeadLetterBuffer[int](3)
		p := pipeline.New()
		st := pipeline.NewStage("work", workers, failIf(func(v int) bool { return v%2 == 1 }), pipeline.WithDeadLetter(buf.Add))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(20)), st), nopSink())
		require.NoError(t, p.Run(t.Context()))

		items := buf.Items()
		assert.Len(t, items, 3)
		assert.Equal(t, int64(7), buf.Overflow())
		for _, dl := range items {
			assert.Equal(t, 1, dl.Item%2)
			assert.Equal(t, "work", dl.Stage)
		}
		rep := p.Report()
		checkReport(t, rep)
		assert.Equal(t, int64(10), rep.DeadLettered())
		causes := rep.Causes()
		require.Len(t, causes, 1)
		assert.Equal(t, "boom", causes[0].Message)
		assert.Equal(t, int64(10), causes[0].Count)
	}
	t.Run("zero size", func(t *testing.T) {
		t.Parallel()
		buf := pipeline.NewDeadLetterBuffer[int](0)
		require.NoError(t, buf.Add(t.Context(), pipeline.DeadLetter[int]{Item: 1}))
		assert.Empty(t, buf.Items())
		assert.Equal(t, int64(1), buf.Overflow())
	})
}

// writeDeadLetters runs a pipeline whose stage "check" dead-letters orders with an odd
// ID into a new file (dead.jsonl in a temporary folder), and returns the file's path and
// the dead-lettered orders.
func writeDeadLetters(t *testing.T) (string, []order) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "dead.jsonl")
	f, err := pipeline.OpenDeadLetterFile[order](path, pipeline.WithSyncEvery(2))
	require.NoError(t, err)
	var orders, bad []order
	for i := range 10 {
		o := order{ID: i, Lines: []string{fmt.Sprintf("line %d", i)}}
		orders = append(orders, o)
		if i%2 == 1 {
			bad = append(bad, o)
		}
	}
	p := pipeline.New()
	st := pipeline.NewStage("check", 3, func(_ context.Context, o order) (order, error) {
		if o.ID%2 == 1 {
			return o, pipeline.Permanent(&oddError{o.ID})
		}
		return o, nil
	}, pipeline.WithDeadLetter(f.Add))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, orders), st), pipeline.NewSink("save", 1, func(context.Context, order) error { return nil }))
	require.NoError(t, p.Run(t.Context()))
	require.NoError(t, f.Close())
	return path, bad
}

// oddError is the error of an order with an odd ID.
type oddError struct{ id int }

func (e *oddError) Error() string { return fmt.Sprintf("order %d: odd", e.id) }

// TestDeadLetterFile checks the JSON Lines file: what a run writes reads back
// (ReadDeadLetters), a truncated last line is ignored, and a corrupt line elsewhere is
// an error naming its line.
func TestDeadLetterFile(t *testing.T) {
	t.Parallel()
	t.Run("round trip", func(t *testing.T) {
		t.Parallel()
		path, bad := writeDeadLetters(t)
		dls, err := pipeline.ReadDeadLetters[order](path)
		require.NoError(t, err)
		require.Len(t, dls, len(bad))
		var items []order
		for _, dl := range dls {
			items = append(items, dl.Item)
			assert.Equal(t, "check", dl.Stage)
			assert.Equal(t, 1, dl.Attempts)
			assert.Equal(t, pipeline.ClassItem, dl.Class)
			assert.Equal(t, "*pipeline_test.oddError", dl.ErrType)
			assert.Equal(t, fmt.Sprintf("order %d: odd", dl.Item.ID), dl.LastError)
			assert.Equal(t, dl.LastError, dl.FirstError)
			assert.False(t, dl.Time.IsZero())
		}
		assert.ElementsMatch(t, bad, items)
	})
	t.Run("truncated last line", func(t *testing.T) {
		t.Parallel()
		path, bad := writeDeadLetters(t)
		appendFile(t, path, `{"stage":"check","item":{"id":11,"li`)
		dls, err := pipeline.ReadDeadLetters[order](path)
		require.NoError(t, err)
		assert.Len(t, dls, len(bad))
	})
	t.Run("corrupt middle line", func(t *testing.T) {
		t.Parallel()
		path, bad := writeDeadLetters(t)
		appendFile(t, path, "not json\n")
		f, err := pipeline.OpenDeadLetterFile[order](path)
		require.NoError(t, err)
		require.NoError(t, f.Add(t.Context(), pipeline.DeadLetter[order]{Stage: "check", Item: order{ID: 99}}))
		require.NoError(t, f.Close())
		_, err = pipeline.ReadDeadLetters[order](path)
		require.Error(t, err)
		assert.Contains(t, err.Error(), fmt.Sprintf("line %d", len(bad)+1))
	})
	t.Run("item of the wrong type", func(t *testing.T) {
		t.Parallel()
		path, _ := writeDeadLetters(t)
		_, err := pipeline.ReadDeadLetters[int](path)
		require.Error(t, err)
		assert.Contains(t, err.Error(), "line 1")
	})
	t.Run("missing file", func(t *testing.T) {
		t.Parallel()
		_, err := pipeline.ReadDeadLetters[int](filepath.Join(t.TempDir(), "none.jsonl"))
		require.ErrorIs(t, err, os.ErrNotExist)
	})
	t.Run("Add after Close", func(t *testing.T) {
		t.Parallel()
		f, err := pipeline.OpenDeadLetterFile[int](filepath.Join(t.TempDir(), "dead.jsonl"))
		require.NoError(t, err)
		require.NoError(t, f.Sync())
		require.NoError(t, f.Close())
		require.NoError(t, f.Close(), "Close twice is harmless")
		assert.Error(t, f.Add(t.Context(), pipeline.DeadLetter[int]{Item: 1}))
	})
}

// TestDeadLetterFileCorruptLastLine checks that a malformed last line that is complete
// (it ends in a newline, so no crash cut it short) is an error, not ignored: only a
// truncated last line is.
func TestDeadLetterFileCorruptLastLine(t *testing.T) {
	t.Parallel()
	path, bad := writeDeadLetters(t)
	appendFile(t, path, "not json\n")
	_, err := pipeline.ReadDeadLetters[order](path)
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("line %d", len(bad)+1))
}

// TestDeadLetterFileAppendAfterTruncation checks that a file whose last line was cut
// short by a crash stays readable after the next run appends to it: the partial line
// is dropped, and the new records are read back.
func TestDeadLetterFileAppendAfterTruncation(t *testing.T) {
	t.Parallel()
	path, bad := writeDeadLetters(t)
	appendFile(t, path, `{"stage":"check","item":{"id":11,"li`) // the crash
	f, err := pipeline.OpenDeadLetterFile[order](path)
	require.NoError(t, err)
	for _, id := range []int{21, 23} {
		require.NoError(t, f.Add(t.Context(), pipeline.DeadLetter[order]{Stage: "check", Item: order{ID: id}}))
	}
	require.NoError(t, f.Close())
	dls, err := pipeline.ReadDeadLetters[order](path)
	require.NoError(t, err)
	assert.Len(t, dls, len(bad)+2)
}

func appendFile(t *testing.T, path, text string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	require.NoError(t, err)
	_, err = f.WriteString(text)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

// TestReplay checks that Replay feeds the dead-lettered items of a file back through a
// stage, all of them or those of one stage.
func TestReplay(t *testing.T) {
	t.Parallel()
	path, bad := writeDeadLetters(t)
	// A record of another stage, to check the stage filter.
	f, err := pipeline.OpenDeadLetterFile[order](path)
	require.NoError(t, err)
	other := order{ID: 100}
	require.NoError(t, f.Add(t.Context(), pipeline.DeadLetter[order]{Stage: "other", Item: other}))
	require.NoError(t, f.Close())

	for _, tc := range []struct {
		stage string
		want  []order
	}{
		{"check", bad},
		{"", append(append([]order(nil), bad...), other)},
		{"nobody", nil},
	} {
		p := pipeline.New()
		fixed := pipeline.NewStage("check", 2, func(_ context.Context, o order) (int, error) { return o.ID, nil })
		got, err := pipeline.Collect(t.Context(), pipeline.Then(pipeline.Replay[order](p, path, tc.stage), fixed))
		require.NoError(t, err)
		var want []int
		for _, o := range tc.want {
			want = append(want, o.ID)
		}
		assert.ElementsMatch(t, want, got, "stage %q", tc.stage)
		checkReport(t, p.Report())
	}

	t.Run("missing file fails the run", func(t *testing.T) {
		t.Parallel()
		p := pipeline.New()
		_, err := pipeline.Collect(t.Context(), pipeline.Replay[int](p, filepath.Join(t.TempDir(), "none"), ""))
		require.ErrorIs(t, err, os.ErrNotExist)
		se, ok := errors.AsType[*pipeline.StageError](err)
		require.True(t, ok)
		assert.Equal(t, "Replay", se.Stage)
	})
}

// TestDeadLetterDestinationFails checks that a dead-letter destination that fails
// stops the run with its error, and that the item counts as failed, not dead-lettered.
func TestDeadLetterDestinationFails(t *testing.T) {
	t.Parallel()
	errDisk := errors.New("disk full")
	for _, workers := range []int{1, 4} {
		p := pipeline.New()
		st := pipeline.NewStage("work", workers, failIf(func(v int) bool { return v == 5 }),
			pipeline.WithDeadLetter(func(context.Context, pipeline.DeadLetter[int]) error { return errDisk }))
		pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(20)), st), nopSink())

		err := p.Run(t.Context())

		require.ErrorIs(t, err, errDisk)
		se, ok := errors.AsType[*pipeline.StageError](err)
		require.True(t, ok)
		assert.Equal(t, "work", se.Stage)
		rep := p.Report()
		checkReport(t, rep)
		w := row(t, rep, "work")
		assert.GreaterOrEqual(t, w.Failed, int64(1))
		assert.Zero(t, w.DeadLettered)
	}
}

// TestDeadLetterDestinationPanics checks that a panic in a dead-letter destination
// fails the run as a *PanicError, with the item counted as failed.
func TestDeadLetterDestinationPanics(t *testing.T) {
	t.Parallel()
	p := pipeline.New()
	st := pipeline.NewStage("work", 1, failIf(func(v int) bool { return v == 2 }),
		pipeline.WithDeadLetter(func(context.Context, pipeline.DeadLetter[int]) error { panic("no room") }))
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(5)), st), nopSink())
	err := p.Run(t.Context())
	pe, ok := errors.AsType[*pipeline.PanicError](err)
	require.True(t, ok, "%v", err)
	assert.Equal(t, "no room", pe.Value)
	rep := p.Report()
	checkReport(t, rep)
	assert.Equal(t, int64(1), row(t, rep, "work").Failed)
}

// badCodec produces something that is not one JSON value.
type badCodec struct{}

func (badCodec) Marshal(int) ([]byte, error)      { return []byte("not json"), nil }
func (badCodec) Unmarshal(_ []byte, _ *int) error { return nil }

// TestDeadLetterFileCodec checks a custom codec (here a JSON string of the number) and
// that a codec that does not produce a JSON value is an error.
func TestDeadLetterFileCodec(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "dead.jsonl")
	f, err := pipeline.OpenDeadLetterFile[int](path, pipeline.WithCodec[int](stringCodec{}), pipeline.WithSyncEvery(1))
	require.NoError(t, err)
	require.NoError(t, f.Add(t.Context(), pipeline.DeadLetter[int]{Stage: "s", Item: 42}))
	require.NoError(t, f.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	var rec map[string]any
	require.NoError(t, json.Unmarshal(raw, &rec))
	assert.Equal(t, "42", rec["item"])
	dls, err := pipeline.ReadDeadLetters[int](path, pipeline.WithCodec[int](stringCodec{}))
	require.NoError(t, err)
	require.Len(t, dls, 1)
	assert.Equal(t, 42, dls[0].Item)

	bf, err := pipeline.OpenDeadLetterFile[int](filepath.Join(t.TempDir(), "bad.jsonl"), pipeline.WithCodec[int](badCodec{}))
	require.NoError(t, err)
	defer func() { assert.NoError(t, bf.Close()) }()
	assert.Error(t, bf.Add(t.Context(), pipeline.DeadLetter[int]{Item: 1}))
}

type stringCodec struct{}

func (stringCodec) Marshal(v int) ([]byte, error) { return json.Marshal(fmt.Sprint(v)) }
func (stringCodec) Unmarshal(b []byte, v *int) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	_, err := fmt.Sscan(s, v)
	return err
}

// TestReportCauses checks how the report groups dead letters: by error type and by the
// message of the innermost error, with digits masked, most common first.
func TestReportCauses(t *testing.T) {
	t.Parallel()
	errReset := errors.New("connection reset")
	p := pipeline.New()
	st := pipeline.NewStage("fetch", 3, func(_ context.Context, v int) (int, error) {
		switch v % 4 {
		case 0:
			return 0, pipeline.Permanent(fmt.Errorf("fetch %d: %w", v, errReset))
		case 1:
			return 0, pipeline.Permanent(&codeError{500 + v%7})
		case 2:
			return 0, pipeline.Transient(fmt.Errorf("fetch %d: %w", v, errReset))
		}
		return v, nil
	}, discardDead[int]())
	pipeline.To(pipeline.Then(pipeline.FromSlice(p, ints(40)), st), nopSink())
	require.NoError(t, p.Run(t.Context()))
	rep := p.Report()
	causes := rep.Causes()
	require.Len(t, causes, 2, "%v", rep)
	assert.Equal(t, "connection reset", causes[0].Message, "ids do not split a group")
	assert.Equal(t, int64(20), causes[0].Count)
	assert.Equal(t, pipeline.Cause{Type: "*pipeline_test.codeError", Message: "status #", Count: 10}, causes[1])
	assert.Equal(t, causes, row(t, rep, "fetch").Causes)
	assert.Contains(t, rep.String(), "connection reset")
}

// TestClassText checks that a class is written by name in JSON, and read back.
func TestClassText(t *testing.T) {
	t.Parallel()
	for _, c := range []pipeline.Class{pipeline.ClassFatal, pipeline.ClassItem, pipeline.ClassTransient} {
		b, err := json.Marshal(c)
		require.NoError(t, err)
		assert.JSONEq(t, fmt.Sprintf("%q", c.String()), string(b))
		var back pipeline.Class
		require.NoError(t, json.Unmarshal(b, &back))
		assert.Equal(t, c, back)
	}
	var c pipeline.Class
	require.Error(t, json.Unmarshal([]byte(`"sometimes"`), &c))
	assert.Equal(t, "Class(9)", pipeline.Class(9).String())
}

// TestSetAside checks that the parts a sink's function sets aside itself (a database's
// rejected rows) are in its row of the report, with their causes, apart from its own
// items; and that SetAside outside a sink's function counts nothing.
func TestSetAside(t *testing.T) {
	t.Parallel()
	errOdd := errors.New("odd row 7 rejected")
	p := pipeline.New()
	nums := pipeline.Then(pipeline.FromSlice(p, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}), pipeline.NewStage("stage", 2, func(ctx context.Context, i int) (int, error) {
		pipeline.SetAside(ctx, errOdd) // not a sink: nothing
		return i, nil
	}))
	pipeline.ToBatches(nums, 4, pipeline.NewSink("load", 2, func(ctx context.Context, batch []int) error {
		for _, i := range batch {
			if i%2 == 1 {
				pipeline.SetAside(ctx, errOdd)
			}
		}
		return nil
	}))
	pipeline.SetAside(t.Context(), errOdd) // outside any run: nothing
	require.NoError(t, p.Run(t.Context()))
	rep := p.Report()
	checkAccounting(t, rep)
	load, _ := rep.Stage("load")
	assert.Equal(t, int64(5), load.SetAside)
	assert.Equal(t, int64(3), load.Succeeded, "the batches themselves succeeded")
	assert.Zero(t, load.DeadLettered)
	assert.Equal(t, []pipeline.Cause{{Type: "error", Message: "odd row # rejected", Count: 5}}, load.Causes)
	assert.Equal(t, int64(5), rep.DeadLettered())
	stage, _ := rep.Stage("stage")
	assert.Zero(t, stage.SetAside)
	assert.Empty(t, stage.Causes)
	assert.Contains(t, rep.String(), "sink load: 5 parts of its items set aside by its own function")
}

// The parent context is canceled (with a cause) while a dead-letter destination runs, and
// the destination gives up with ctx.Err(): Run returns context.Cause(parent) (doc: "the
// run's context is done: the item counts as failed, Run returns the cause").
func TestDeadLetterDestinationCanceledReturnsParentCause(t *testing.T) {
	errShutdown := errors.New("shutdown")
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	p := pipeline.New()
	src := pipeline.FromSlice(p, []int{1})
	pipeline.To(src, pipeline.NewSink("sink", 1, func(context.Context, int) error { return pipeline.Permanent(errBoom) },
		pipeline.WithDeadLetter(func(ctx context.Context, _ pipeline.DeadLetter[int]) error {
			cancel(errShutdown) // e.g. SIGINT while the dead letter is being written
			<-ctx.Done()
			return ctx.Err()
		})))
	err := p.Run(ctx)
	assert.ErrorIs(t, err, errShutdown, "got %v", err)
}

// A classifier's undefined class fails the run clearly, and one bad record never makes a
// dead-letter file unreadable.
func TestUndefinedClassFailsRunAndFileStaysReadable(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f, err := pipeline.OpenDeadLetterFile[int](filepath.Join(dir, "dead.jsonl"))
	require.NoError(t, err)
	p := pipeline.New()
	pipeline.To(pipeline.FromSlice(p, ints(3)), pipeline.NewSink("s", 1, func(context.Context, int) error { return errBoom },
		pipeline.WithClassifier(func(error) pipeline.Class { return pipeline.Class(7) }),
		pipeline.WithDeadLetter(f.Add)))
	err = p.Run(t.Context())
	require.ErrorIs(t, err, errBoom)
	assert.Contains(t, err.Error(), "undefined")
	assert.Zero(t, p.Report().DeadLettered())
	require.NoError(t, f.Close())

	// A file with one record the reader cannot decode among good ones.
	good := `{"stage":"s","item":1,"attempts":1,"class":"item","err_type":"error","first_error":"x","last_error":"x","time":"2026-01-01T00:00:00Z"}` + "\n"
	bad := strings.Replace(good, `"item"`, `"Class(7)"`, 1)
	bad = strings.Replace(bad, `"item":1`, `"item":2`, 1)
	bad = strings.Replace(bad, `"class":"item"`, `"class":"Class(7)"`, 1)
	path := filepath.Join(dir, "mixed.jsonl")
	require.NoError(t, os.WriteFile(path, []byte(good+bad+good), 0o600))
	dls, err := pipeline.ReadDeadLetters[int](path)
	var rerr *pipeline.DeadLetterReadError
	require.ErrorAs(t, err, &rerr)
	assert.Equal(t, []int{2}, rerr.Lines)
	assert.Len(t, dls, 2, "the good records are read")
	q := pipeline.New()
	got, err := pipeline.Collect(t.Context(), pipeline.Replay[int](q, path, ""))
	require.ErrorAs(t, err, &rerr, "Replay names the malformed lines")
	assert.Empty(t, got, "before it sends anything")
}

// A dead-letter line as v0.1 wrote it (class as a number) is still read.
func TestReadDeadLettersNumericClass(t *testing.T) {
	path := t.TempDir() + "/dl.jsonl"
	line := `{"stage":"s","item":1,"attempts":1,"class":1,"err_type":"error","first_error":"x","last_error":"x","time":"2026-01-01T00:00:00Z"}` + "\n"
	require.NoError(t, os.WriteFile(path, []byte(line), 0o644))
	dls, err := pipeline.ReadDeadLetters[int](path)
	require.NoError(t, err)
	assert.Len(t, dls, 1)
}
