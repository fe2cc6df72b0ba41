package dashboard_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/dashboard"
)

// This example shows how a service mounts the dashboard beside its other handlers, and
// how a script reads the pipelines' figures from data.json.
func Example() {
	p := pipeline.New()
	ids := pipeline.FromSlice(p, []int{1, 2, 3, 4, 5, 6})
	checked := pipeline.Then(ids, pipeline.NewStage("check", 2, func(_ context.Context, id int) (int, error) {
		if id%3 == 0 {
			return 0, pipeline.Permanent(errors.New("not a valid id"))
		}
		return id, nil
	}, pipeline.WithDeadLetter(pipeline.DiscardDeadLetter[int])))
	pipeline.To(checked, pipeline.NewSink("save", 1, func(context.Context, int) error { return nil }))

	h := dashboard.New()
	h.Add("import", p)
	mux := http.NewServeMux()
	mux.Handle("/debug/pipeline/", h) // the page is at /debug/pipeline/
	srv := httptest.NewServer(mux)    // a real service: srv.RegisterOnShutdown(h.Close)
	defer srv.Close()
	defer h.Close()

	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}

	res, err := http.Get(srv.URL + "/debug/pipeline/data.json")
	if err != nil {
		fmt.Println(err)
		return
	}
	var data struct {
		Version   int
		Pipelines []struct {
			Name   string
			Stages []struct {
				Name         string
				In           int64
				DeadLettered int64 `json:"dead_lettered"`
				Causes       []struct{ Message string }
			}
		}
	}
	err = json.NewDecoder(res.Body).Decode(&data)
	if cerr := res.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("version", data.Version)
	for _, pl := range data.Pipelines {
		for _, s := range pl.Stages {
			fmt.Printf("%s/%s: in %d, dead-lettered %d", pl.Name, s.Name, s.In, s.DeadLettered)
			for _, c := range s.Causes {
				fmt.Printf(" (%s)", c.Message)
			}
			fmt.Println()
		}
	}
	// Output:
	// version 1
	// import/FromSlice: in 6, dead-lettered 0
	// import/check: in 6, dead-lettered 2 (not a valid id)
	// import/save: in 4, dead-lettered 0
}

// This example shows a service that serves the dashboard and shuts down cleanly while
// someone is watching: Close, registered with RegisterOnShutdown, ends the live
// streams, which Shutdown alone would wait for until its context expired.
func ExampleHandler_Close() {
	h := dashboard.New(dashboard.WithInterval(500 * time.Millisecond))
	h.Add("import", pipeline.New())
	mux := http.NewServeMux()
	mux.Handle("/debug/pipeline/", h)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	srv.RegisterOnShutdown(h.Close)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println(err)
		return
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()

	// A viewer: what the page's EventSource does, here a GET that reads the first line.
	res, err := http.Get("http://" + ln.Addr().String() + "/debug/pipeline/events")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(res.Header.Get("Content-Type"))
	line, err := bufio.NewReader(res.Body).ReadString('\n')
	fmt.Printf("%q %v\n", line, err)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	fmt.Println("shutdown:", srv.Shutdown(ctx))
	fmt.Println("serve:", <-served)
	fmt.Println("close:", res.Body.Close())
	// Output:
	// text/event-stream
	// "retry: 2000\n" <nil>
	// shutdown: <nil>
	// serve: http: Server closed
	// close: <nil>
}

// This example shows the history a handler keeps while a pipeline runs: data.json's
// "history" holds one point per refresh for each stage (rate, queue fill, recent p99,
// retries and dead letters per second), which the page draws as small charts.
// WithHistory sets how far back it goes.
func ExampleWithHistory() {
	started, release := make(chan struct{}), make(chan struct{})
	p := pipeline.New()
	ids := pipeline.FromSlice(p, []int{1, 2, 3})
	held := pipeline.Then(ids, pipeline.NewStage("call", 1, func(ctx context.Context, id int) (int, error) {
		if id == 1 {
			close(started)
		}
		select { // the run stays in progress until the example has read the history
		case <-release:
			return id, nil
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}))
	pipeline.To(held, pipeline.NewSink("save", 1, func(context.Context, int) error { return nil }))

	h := dashboard.New(dashboard.WithHistory(30 * time.Minute))
	defer h.Close() // the handler refreshes in the background until Close
	h.Add("import", p)
	srv := httptest.NewServer(h)
	defer srv.Close()
	ran := make(chan error, 1)
	go func() { ran <- p.Run(context.Background()) }()
	<-started

	res, err := http.Get(srv.URL + "/data.json")
	if err != nil {
		fmt.Println(err)
		return
	}
	var data struct {
		Pipelines []struct {
			History struct {
				Seconds []float64
				Stages  []struct {
					Name string
					Rate []float64 `json:"rate_per_second"`
					P99  []float64 `json:"p99_seconds"`
				}
			}
		}
	}
	err = json.NewDecoder(res.Body).Decode(&data)
	if cerr := res.Body.Close(); err == nil {
		err = cerr
	}
	close(release)
	if err := <-ran; err != nil {
		fmt.Println(err)
	}
	if err != nil {
		fmt.Println(err)
		return
	}
	hist := data.Pipelines[0].History
	fmt.Println("points:", len(hist.Seconds))
	for _, s := range hist.Stages {
		fmt.Printf("%s: %d rates, %d p99s\n", s.Name, len(s.Rate), len(s.P99))
	}
	// Output:
	// points: 1
	// FromSlice: 1 rates, 0 p99s
	// call: 1 rates, 1 p99s
	// save: 1 rates, 1 p99s
}

// This example shows WithRowStats putting a connector's own counters, here the rows a
// database sink wrote and rejected, on the row of its stage: on the page and in
// data.json as the stage's "counters".
func ExampleWithRowStats() {
	var written, rejected atomic.Int64 // a connector's counters, read while it runs
	p := pipeline.New()
	batches := pipeline.Batch(pipeline.FromSlice(p, []int{1, 2, 3, 4, 5}), 5)
	pipeline.To(batches, pipeline.NewSink("save", 1, func(_ context.Context, rows []int) error {
		for _, r := range rows {
			if r == 4 {
				rejected.Add(1) // say, a row the database refused
				continue
			}
			written.Add(1)
		}
		return nil
	}))

	h := dashboard.New(dashboard.WithHistory(0))
	defer h.Close()
	h.Add("import", p, dashboard.WithRowStats("save", func() map[string]int64 {
		return map[string]int64{"rows written": written.Load(), "rows rejected": rejected.Load()}
	}))
	if err := p.Run(context.Background()); err != nil {
		fmt.Println(err)
		return
	}

	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/pipeline/data.json", nil))
	var data struct {
		Pipelines []struct {
			Stages []struct {
				Name     string
				Counters map[string]int64
			}
		}
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &data); err != nil {
		fmt.Println(err)
		return
	}
	for _, s := range data.Pipelines[0].Stages {
		if s.Counters != nil {
			fmt.Println(s.Name, s.Counters)
		}
	}
	// Output:
	// save map[rows rejected:1 rows written:4]
}
