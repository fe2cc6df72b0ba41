// Command quickstart is the README's quick start as a program: a slice source, one
// typed stage with four workers, and Collect as the end of the pipeline. It prints the
// results and the run's report.
//
//	go run ./examples/quickstart
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strings"

	"github.com/gopipeline/pipeline"
)

// greeting is the output of the stage: a different type from its input, so the
// compiler checks the connection between the stages.
type greeting struct {
	Name string
	Text string
}

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "quickstart:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	p := pipeline.New()
	names := pipeline.FromSlice(p, []string{"ada", "grace", "edsger", "barbara", "ken"})
	greet := pipeline.NewStage("greet", 4, func(_ context.Context, name string) (greeting, error) {
		return greeting{Name: name, Text: "hello, " + strings.ToUpper(name[:1]) + name[1:]}, nil
	})
	greetings, err := pipeline.Collect(ctx, pipeline.Then(names, greet))

	// Four workers finish in any order: sort for a stable printout.
	slices.SortFunc(greetings, func(a, b greeting) int { return strings.Compare(a.Name, b.Name) })
	for _, g := range greetings {
		fmt.Println(g.Text)
	}
	fmt.Println()
	fmt.Print(p.Report())
	return err
}
