package pipeline_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// misplaced are options given where they have no meaning: each line must fail to
// compile with the error that names the scope's option interface.
var misplaced = []struct{ code, want string }{
	{`pipeline.New(pipeline.WithTimeout(time.Second))`, "PipelineOption"},
	{`pipeline.New(pipeline.WithRetry(3, nil))`, "PipelineOption"},
	{`pipeline.New(pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]))`, "PipelineOption"},
	{`pipeline.New(pipeline.WithOrdered(4))`, "PipelineOption"},
	{`pipeline.New(pipeline.WithLinger(time.Second))`, "PipelineOption"},
	{`pipeline.New(pipeline.WithSaveEvery(2))`, "PipelineOption"},
	{`pipeline.New(pipeline.WithName("x"))`, "PipelineOption"},
	{`pipeline.New(pipeline.WithTotal(3))`, "PipelineOption"},
	{`pipeline.NewStage("s", 1, fn, pipeline.WithTotal(3))`, "StageOption"},
	{`pipeline.Batch(src, 2, pipeline.WithTotal(3))`, "BatchOption"},
	{`pipeline.Collect(ctx, src, pipeline.WithTotal(3))`, "CollectOption"},
	{`pipeline.NewStage("s", 1, fn, pipeline.WithObserver(func(pipeline.Event) {}))`, "StageOption"},
	{`pipeline.NewStage("s", 1, fn, pipeline.WithLinger(time.Second))`, "StageOption"},
	{`pipeline.NewStage("s", 1, fn, pipeline.WithMaxRedo(5))`, "StageOption"},
	{`pipeline.NewSink("s", 1, sink, pipeline.WithName("x"))`, "StageOption"},
	{`pipeline.Batch(src, 2, pipeline.WithTimeout(time.Second))`, "BatchOption"},
	{`pipeline.Batch(src, 2, pipeline.WithRetry(2, nil))`, "BatchOption"},
	{`pipeline.Batch(src, 2, pipeline.WithSaveEvery(2))`, "BatchOption"},
	{`pipeline.FromCheckpoint(p, store, from, pipeline.WithTimeout(time.Second))`, "CheckpointOption"},
	{`pipeline.FromCheckpoint(p, store, from, pipeline.WithBuffer(3))`, "CheckpointOption"},
	{`pipeline.FromSlice(p, []int{1}, pipeline.WithBuffer(3))`, "SourceOption"},
	{`pipeline.FromSlice(p, []int{1}, pipeline.WithSaveEvery(3))`, "SourceOption"},
	{`pipeline.Filter(src, keep, pipeline.WithBuffer(3))`, "FilterOption"},
	{`pipeline.Collect(ctx, src, pipeline.WithTimeout(time.Second))`, "CollectOption"},
	{`pipeline.OpenDeadLetterFile[int]("f", pipeline.WithName("x"))`, "DeadLetterFileOption"},
	{`pipeline.Replay[int](p, "f", "", pipeline.WithSyncEvery(3))`, "ReplayOption"},
	{`pipeline.ReadDeadLetters[int]("f", pipeline.WithSyncEvery(3))`, "ReadOption"},
	{`pipeline.FromSlice(p, []int{1}, pipeline.WithLag(lag))`, "SourceOption"},
	{`pipeline.Generate(p, gen, pipeline.WithLag(lag))`, "SourceOption"},
	{`pipeline.NewStage("s", 1, fn, pipeline.WithLag(lag))`, "StageOption"},
	{`pipeline.New(pipeline.WithLag(lag))`, "PipelineOption"},
	{`pipeline.FromAcked(p, acked, pipeline.WithTotal(3))`, "AckOption"},
}

// placed are the same options where they belong: they must compile.
const placed = `
	pipeline.New(pipeline.WithBuffer(3), pipeline.WithClassifier(classify), pipeline.WithErrorBudget(budget), pipeline.WithObserver(func(pipeline.Event) {}))
	pipeline.NewStage("s", 1, fn, pipeline.WithTimeout(time.Second), pipeline.WithRetry(2, nil), pipeline.WithBuffer(3),
		pipeline.WithClassifier(classify), pipeline.WithErrorBudget(budget), pipeline.WithOrdered(4), pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int]))
	pipeline.Batch(src, 2, pipeline.WithLinger(time.Second), pipeline.WithBuffer(3), pipeline.WithName("b"), pipeline.WithMaxBytes(9, func(int) int { return 1 }))
	pipeline.FromCheckpoint(p, store, from, pipeline.WithSaveEvery(2), pipeline.WithMaxRedo(9), pipeline.WithSaveInterval(time.Second), pipeline.WithName("c"))
	pipeline.FromSlice(p, []int{1}, pipeline.WithName("s"))
	pipeline.FromCheckpoint(p, store, from, pipeline.WithTotal(3))
	pipeline.Generate(p, func(context.Context, func(int) error) error { return nil }, pipeline.WithTotal(3))
	pipeline.Filter(src, keep, pipeline.WithName("f"))
	pipeline.Collect(ctx, src, pipeline.WithName("out"), pipeline.WithBuffer(3))
	pipeline.OpenDeadLetterFile[int]("f", pipeline.WithCodec[int](pipeline.JSONCodec[int]{}), pipeline.WithSyncEvery(3))
	pipeline.Replay[int](p, "f", "", pipeline.WithCodec[int](pipeline.JSONCodec[int]{}), pipeline.WithName("r"))
	pipeline.ReadDeadLetters[int]("f", pipeline.WithCodec[int](pipeline.JSONCodec[int]{}))
	pipeline.FromAcked(pipeline.New(), acked, pipeline.WithLag(lag), pipeline.WithMaxPending(3), pipeline.WithName("a"))
	pipeline.FromCheckpoint(pipeline.New(), store, from, pipeline.WithLag(lag))
`

const optPrelude = `package optcheck

import (
	"context"
	"iter"
	"time"

	"github.com/gopipeline/pipeline"
)

var (
	ctx      = context.Background()
	p        = pipeline.New()
	src      = pipeline.FromSlice(p, []int{1})
	store    pipeline.CheckpointStore
	from     func(context.Context, int64) iter.Seq2[int, error]
	fn       = func(_ context.Context, v int) (int, error) { return v, nil }
	sink     = func(context.Context, int) error { return nil }
	keep     = func(int) bool { return true }
	classify = func(error) pipeline.Class { return pipeline.ClassItem }
	budget   = pipeline.Budget{MaxRatio: 0.5, MinSample: 1}
	lag      = func() []pipeline.PartitionLag { return nil }
	gen      = func(context.Context, func(int) error) error { return nil }
	acked    = func(context.Context, func(int, func(pipeline.Settlement)) error) error { return nil }
)

func use() {
`

// TestMisplacedOptionsDoNotCompile builds snippets with the go command (through an
// overlay, so that nothing is written to the module) and checks that each misplaced
// option is a compile error naming the right option interface, while the same options
// in their places compile.
func TestMisplacedOptionsDoNotCompile(t *testing.T) {
	t.Parallel()
	gocmd, err := exec.LookPath("go")
	require.NoError(t, err, "the go command is needed to type-check the snippets")
	wd, err := os.Getwd()
	require.NoError(t, err)
	tmp := t.TempDir()
	build := func(name, body string) (string, error) {
		src := filepath.Join(tmp, name+".go")
		require.NoError(t, os.WriteFile(src, []byte(optPrelude+body+"}\n"), 0o600))
		virtual := filepath.Join(wd, "internal", "optcheck_"+name, "x.go") // never on disk
		overlay, err := json.Marshal(map[string]map[string]string{"Replace": {virtual: src}})
		require.NoError(t, err)
		ov := filepath.Join(tmp, name+".json")
		require.NoError(t, os.WriteFile(ov, overlay, 0o600))
		cmd := exec.Command(gocmd, "build", "-overlay="+ov, "-gcflags=-e", "./internal/optcheck_"+name)
		cmd.Dir = wd
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	out, err := build("placed", placed)
	require.NoError(t, err, "options in their places must compile:\n%s", out)

	var body strings.Builder
	for _, m := range misplaced {
		body.WriteString("\t_ = " + m.code + "\n")
	}
	body.WriteString("\t_ = []any{ctx, src, store, from, fn, sink, keep, lag, gen, acked}\n")
	out, err = build("misplaced", body.String())
	require.Error(t, err, "misplaced options compiled")
	lineRe := regexp.MustCompile(`x?\.go:(\d+):\d+: (.*)`)
	errs := map[int]string{}
	for l := range strings.SplitSeq(out, "\n") {
		if m := lineRe.FindStringSubmatch(l); m != nil {
			n, _ := strconv.Atoi(m[1])
			errs[n] = m[2]
		}
	}
	first := strings.Count(optPrelude, "\n") + 1
	for i, m := range misplaced {
		msg, ok := errs[first+i]
		if assert.Truef(t, ok, "%s compiled, want an error\n%s", m.code, out) {
			assert.Containsf(t, msg, "pipeline."+m.want, "%s", m.code)
		}
	}
}

// TestOptionTypesListTheirOptions checks that the doc comment of each option interface
// links to exactly the options that satisfy it, read from the package's source: a
// function whose result is the interface, or a concrete option type with the
// interface's method.
func TestOptionTypesListTheirOptions(t *testing.T) {
	t.Parallel()
	fset := token.NewFileSet()
	names, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var files []*ast.File
	for _, name := range names {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	docs := map[string]string{}         // interface -> its doc comment
	methods := map[string]string{}      // the interface's unexported method -> interface
	implements := map[string][]string{} // concrete type -> the methods it has
	results := map[string]string{}      // exported function -> its result type's name
	for _, f := range files {
		for _, d := range f.Decls {
			switch d := d.(type) {
			case *ast.GenDecl:
				for _, sp := range d.Specs {
					ts, ok := sp.(*ast.TypeSpec)
					if !ok || !strings.HasSuffix(ts.Name.Name, "Option") {
						continue
					}
					if it, ok := ts.Type.(*ast.InterfaceType); ok && len(it.Methods.List) == 1 {
						docs[ts.Name.Name] = d.Doc.Text()
						methods[it.Methods.List[0].Names[0].Name] = ts.Name.Name
					}
				}
			case *ast.FuncDecl:
				if d.Recv != nil {
					recv := d.Recv.List[0].Type
					if id, ok := recv.(*ast.Ident); ok {
						implements[id.Name] = append(implements[id.Name], d.Name.Name)
					}
					continue
				}
				if !d.Name.IsExported() || d.Type.Results == nil || len(d.Type.Results.List) != 1 {
					continue
				}
				if id, ok := d.Type.Results.List[0].Type.(*ast.Ident); ok {
					results[d.Name.Name] = id.Name
				}
			}
		}
	}
	require.Contains(t, docs, "StageOption")
	want := map[string][]string{}
	for fn, res := range results {
		if _, ok := docs[res]; ok {
			want[res] = append(want[res], fn)
			continue
		}
		for _, m := range implements[res] {
			if in, ok := methods[m]; ok {
				want[in] = append(want[in], fn)
			}
		}
	}
	link := regexp.MustCompile(`\[(With\w+)\]`)
	for in, doc := range docs {
		var listed []string
		for _, m := range link.FindAllStringSubmatch(doc, -1) {
			listed = append(listed, m[1])
		}
		assert.ElementsMatchf(t, want[in], listed, "%s's doc comment lists its options", in)
	}
}
