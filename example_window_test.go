package pipeline_test

import (
	"context"
	"fmt"
	"time"

	"github.com/gopipeline/pipeline"
)

// click is an event of the window examples: a user's click at a moment.
type click struct {
	User string
	At   time.Time
}

// at returns the moment m:s past noon on 2026-12-02, UTC.
func at(m, s int) time.Time { return time.Date(2026, 12, 2, 12, m, s, 0, time.UTC) }

func clickUser(c click) string    { return c.User }
func clickTime(c click) time.Time { return c.At }

// countClicks counts the clicks of a window.
func countClicks(n int, _ click) int { return n + 1 }

// printWindows prints window results as "key [start, end) value count".
func printWindows[K comparable, V any](rs []pipeline.WindowResult[K, V], err error) {
	for _, r := range rs {
		upd := ""
		if r.Update {
			upd = " (update)"
		}
		fmt.Printf("%v [%s, %s) %v%s\n", r.Key, r.Start.Format("15:04:05"), r.End.Format("15:04:05"), r.Value, upd)
	}
	if err != nil {
		fmt.Println(err)
	}
}

// This example shows Window with Tumbling windows: clicks per user per minute. A
// window fires when the watermark (the latest click seen, here with no delay) passes
// its end, and the rest fire when the input ends.
func ExampleWindow() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{
		{"ann", at(0, 5)},
		{"bob", at(0, 30)},
		{"ann", at(0, 59)},
		{"ann", at(1, 0)},
		{"bob", at(2, 10)},
	})
	perMinute := pipeline.Window(clicks, pipeline.Tumbling(time.Minute), clickUser, clickTime, pipeline.Fold(0, countClicks))
	printWindows(pipeline.Collect(context.Background(), perMinute))
	// Output:
	// ann [12:00:00, 12:01:00) 2
	// bob [12:00:00, 12:01:00) 1
	// ann [12:01:00, 12:02:00) 1
	// bob [12:02:00, 12:03:00) 1
}

// This example shows Tumbling windows keyed by user, with an aggregate made by
// Reduce: the largest amount each user spent per minute.
func ExampleTumbling() {
	type spend struct {
		User   string
		At     time.Time
		Amount int
	}
	p := pipeline.New()
	spends := pipeline.FromSlice(p, []spend{
		{"ann", at(0, 10), 5},
		{"ann", at(0, 20), 9},
		{"ann", at(1, 10), 3},
	})
	largest := pipeline.Window(spends, pipeline.Tumbling(time.Minute),
		func(s spend) string { return s.User }, func(s spend) time.Time { return s.At },
		pipeline.Reduce(func(a, b spend) spend {
			if b.Amount > a.Amount {
				return b
			}
			return a
		}))
	rs, err := pipeline.Collect(context.Background(), largest)
	for _, r := range rs {
		fmt.Println(r.Key, r.Start.Format("15:04"), r.Value.Amount, r.Count)
	}
	fmt.Println(err)
	// Output:
	// ann 12:00 9 2
	// ann 12:01 3 1
	// <nil>
}

// This example shows Sliding windows: clicks over the last two minutes, every minute.
// A click falls into the two windows that hold it.
func ExampleSliding() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{{"ann", at(0, 30)}, {"ann", at(1, 30)}})
	recent := pipeline.Window(clicks, pipeline.Sliding(2*time.Minute, time.Minute), clickUser, clickTime, pipeline.Fold(0, countClicks))
	printWindows(pipeline.Collect(context.Background(), recent))
	// Output:
	// ann [11:59:00, 12:01:00) 1
	// ann [12:00:00, 12:02:00) 2
	// ann [12:01:00, 12:03:00) 1
}

// This example shows Session windows: a user's clicks less than a minute apart are
// one session. The aggregate must merge the values of two sessions that a click
// brings together: here FoldMerge adds the counts.
func ExampleSession() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{
		{"ann", at(0, 0)},
		{"ann", at(0, 40)},
		{"ann", at(5, 0)},
	})
	sessions := pipeline.Window(clicks, pipeline.Session(time.Minute), clickUser, clickTime,
		pipeline.FoldMerge(0, countClicks, func(a, b int) int { return a + b }))
	printWindows(pipeline.Collect(context.Background(), sessions))
	// Output:
	// ann [12:00:00, 12:01:40) 2
	// ann [12:05:00, 12:06:00) 1
}

// This example shows Fold: the value of a window starts at the initial value (here a
// map) and takes each item in.
func ExampleFold() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{{"ann", at(0, 1)}, {"bob", at(0, 2)}, {"ann", at(0, 3)}})
	// One window for every user: the key is the same for all.
	byUser := pipeline.Window(clicks, pipeline.Tumbling(time.Hour), func(click) string { return "all" }, clickTime,
		pipeline.Fold(map[string]int(nil), func(m map[string]int, c click) map[string]int {
			if m == nil {
				m = map[string]int{}
			}
			m[c.User]++
			return m
		}))
	printWindows(pipeline.Collect(context.Background(), byUser))
	// Output:
	// all [12:00:00, 13:00:00) map[ann:2 bob:1]
}

// This example shows FoldMerge: an aggregate that can merge the values of two windows,
// as session windows need. The third click closes the gap between the first two
// sessions, which merge.
func ExampleFoldMerge() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{{"ann", at(0, 0)}, {"ann", at(1, 30)}, {"ann", at(0, 45)}})
	sessions := pipeline.Window(clicks, pipeline.Session(time.Minute), clickUser, clickTime,
		pipeline.FoldMerge(0, countClicks, func(a, b int) int { return a + b }), pipeline.WithMaxDelay(time.Minute))
	printWindows(pipeline.Collect(context.Background(), sessions))
	// Output:
	// ann [12:00:00, 12:02:30) 3
}

// This example shows Reduce: the value of a window is its first item, reduced with
// each later one.
func ExampleReduce() {
	p := pipeline.New()
	temps := pipeline.FromSlice(p, []int{21, 25, 19})
	hottest := pipeline.Window(temps, pipeline.Tumbling(time.Hour), func(int) string { return "room" },
		func(int) time.Time { return at(0, 0) }, pipeline.Reduce(func(a, b int) int { return max(a, b) }))
	printWindows(pipeline.Collect(context.Background(), hottest))
	// Output:
	// room [12:00:00, 13:00:00) 25
}

// This example shows WithMaxDelay: with a delay of 30 s, a click 20 s behind the latest
// one still counts in its minute, which fires only once the watermark (the latest
// click less the delay) passes its end.
func ExampleWithMaxDelay() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{{"ann", at(0, 50)}, {"ann", at(1, 10)}, {"ann", at(0, 55)}})
	perMinute := pipeline.Window(clicks, pipeline.Tumbling(time.Minute), clickUser, clickTime, pipeline.Fold(0, countClicks),
		pipeline.WithMaxDelay(30*time.Second))
	printWindows(pipeline.Collect(context.Background(), perMinute))
	// Output:
	// ann [12:00:00, 12:01:00) 2
	// ann [12:01:00, 12:02:00) 1
}

// This example shows WithAllowedLateness: the minute 12:00 fires when the click at
// 12:01:10 arrives; the click at 12:00:55 arrives after that, within the lateness, and
// the window comes out again, updated.
func ExampleWithAllowedLateness() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{{"ann", at(0, 50)}, {"ann", at(1, 10)}, {"ann", at(0, 55)}})
	perMinute := pipeline.Window(clicks, pipeline.Tumbling(time.Minute), clickUser, clickTime, pipeline.Fold(0, countClicks),
		pipeline.WithAllowedLateness(time.Minute))
	printWindows(pipeline.Collect(context.Background(), perMinute))
	// Output:
	// ann [12:00:00, 12:01:00) 1
	// ann [12:00:00, 12:01:00) 2 (update)
	// ann [12:01:00, 12:02:00) 1
}

// This example shows WithLateItems: a click behind the watermark is set aside as a
// dead letter whose ErrType is "late", and the report counts it.
func ExampleWithLateItems() {
	p := pipeline.New()
	late := pipeline.NewDeadLetterBuffer[click](10)
	clicks := pipeline.FromSlice(p, []click{{"ann", at(0, 50)}, {"ann", at(1, 10)}, {"ann", at(0, 55)}})
	perMinute := pipeline.Window(clicks, pipeline.Tumbling(time.Minute), clickUser, clickTime, pipeline.Fold(0, countClicks),
		pipeline.WithLateItems(late.Add))
	printWindows(pipeline.Collect(context.Background(), perMinute))
	for _, d := range late.Items() {
		fmt.Println("late:", d.Item.At.Format("15:04:05"), d.ErrType)
	}
	s, _ := p.Report().Stage("Window")
	fmt.Println("dead-lettered:", s.DeadLettered, "late:", s.Windows.Late)
	// Output:
	// ann [12:00:00, 12:01:00) 1
	// ann [12:01:00, 12:02:00) 1
	// late: 12:00:55 late
	// dead-lettered: 1 late: 1
}

// This example shows WithIdleTimeout: the source sends one click and then waits until
// its window came out; without the idle timeout the window would wait for the next
// click or the end of the input, neither of which comes. Real code would wait a few
// seconds; the output does not depend on the value.
func ExampleWithIdleTimeout() {
	out := make(chan struct{})
	p := pipeline.New()
	clicks := pipeline.Generate(p, func(ctx context.Context, emit func(click) error) error {
		if err := emit(click{"ann", at(0, 59)}); err != nil {
			return err
		}
		select { // idle until the window came out
		case <-out:
		case <-ctx.Done():
		}
		return nil
	})
	perMinute := pipeline.Window(clicks, pipeline.Tumbling(time.Second), clickUser, clickTime, pipeline.Fold(0, countClicks),
		pipeline.WithIdleTimeout(time.Millisecond))
	pipeline.To(perMinute, pipeline.NewSink("print", 1, func(_ context.Context, r pipeline.WindowResult[string, int]) error {
		fmt.Println(r.Key, r.Start.Format("15:04:05"), r.Value)
		close(out)
		return nil
	}))
	fmt.Println(p.Run(context.Background()))
	// Output:
	// ann 12:00:59 1
	// <nil>
}

// This example shows WithMaxWindows: with room for one window, the click of a second
// minute fires the first minute's window early: the watermark moves to its end.
func ExampleWithMaxWindows() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{{"ann", at(0, 10)}, {"ann", at(1, 10)}})
	perMinute := pipeline.Window(clicks, pipeline.Tumbling(time.Minute), clickUser, clickTime, pipeline.Fold(0, countClicks),
		pipeline.WithMaxDelay(5*time.Minute), pipeline.WithMaxWindows(1))
	printWindows(pipeline.Collect(context.Background(), perMinute))
	s, _ := p.Report().Stage("Window")
	fmt.Println("fired early:", s.Windows.Forced)
	// Output:
	// ann [12:00:00, 12:01:00) 1
	// ann [12:01:00, 12:02:00) 1
	// fired early: 1
}

// This example shows WithWindowBackpressure: with room for one window, the stage
// waits, taking no input, until the idle clock brings the first window to its time.
// Real code would have an idle timeout of seconds; here it is a millisecond and the
// watermark is a second short of the window's end.
func ExampleWithWindowBackpressure() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{{"ann", at(0, 59)}, {"bob", at(1, 0)}})
	perSecond := pipeline.Window(clicks, pipeline.Tumbling(time.Second), clickUser, clickTime, pipeline.Fold(0, countClicks),
		pipeline.WithMaxDelay(time.Second), pipeline.WithMaxWindows(1),
		pipeline.WithWindowBackpressure(), pipeline.WithIdleTimeout(time.Millisecond))
	printWindows(pipeline.Collect(context.Background(), perSecond))
	s, _ := p.Report().Stage("Window")
	fmt.Println("fired early:", s.Windows.Forced)
	// Output:
	// ann [12:00:59, 12:01:00) 1
	// bob [12:01:00, 12:01:01) 1
	// fired early: 0
}

// This example shows WindowReport: the state of a window stage in its report, here
// read from a sink while the second window is open (the source waits for the sink).
func ExampleWindowReport() {
	seen := make(chan struct{})
	p := pipeline.New()
	clicks := pipeline.Generate(p, func(ctx context.Context, emit func(click) error) error {
		for _, c := range []click{{"ann", at(0, 10)}, {"ann", at(1, 20)}} {
			if err := emit(c); err != nil {
				return err
			}
		}
		select {
		case <-seen:
		case <-ctx.Done():
		}
		return nil
	})
	perMinute := pipeline.Window(clicks, pipeline.Tumbling(time.Minute), clickUser, clickTime, pipeline.Fold(0, countClicks),
		pipeline.WithMaxDelay(10*time.Second))
	pipeline.To(perMinute, pipeline.NewSink("print", 1, func(_ context.Context, r pipeline.WindowResult[string, int]) error {
		if s, _ := p.Snapshot().Stage("Window"); r.Start.Equal(at(0, 0)) {
			w := s.Windows
			fmt.Println("open:", w.Open, "watermark:", w.Watermark.Format("15:04:05"), "lag:", w.Lag)
			close(seen)
		}
		return nil
	}))
	fmt.Println(p.Run(context.Background()))
	// Output:
	// open: 1 watermark: 12:01:10 lag: 10s
	// <nil>
}

// This example shows WithWindowWorkers: the keys spread over two workers, each with
// its own windows and watermark. Results of different workers come out in any order.
func ExampleWithWindowWorkers() {
	p := pipeline.New()
	clicks := pipeline.FromSlice(p, []click{{"ann", at(0, 5)}, {"bob", at(0, 30)}, {"ann", at(0, 59)}, {"cyd", at(1, 0)}})
	perMinute := pipeline.Window(clicks, pipeline.Tumbling(time.Minute), clickUser, clickTime, pipeline.Fold(0, countClicks),
		pipeline.WithWindowWorkers(2))
	printWindows(pipeline.Collect(context.Background(), perMinute))
	// Unordered output:
	// ann [12:00:00, 12:01:00) 2
	// bob [12:00:00, 12:01:00) 1
	// cyd [12:01:00, 12:02:00) 1
}

// This example shows WithWatermarkPer over a Merge: the clicks of two sites, each in
// time order, and the second site's arrive late, after all of the first's. With one
// watermark for both, the first site's clicks would have taken it to 12:02:30 and
// every click of the second site would be late; with one per site, the second holds
// the windows open until its own clicks pass them.
func ExampleWithWatermarkPer() {
	type siteClick struct {
		click
		Site int
	}
	p := pipeline.New()
	first := make(chan struct{})
	site := func(n int, wait <-chan struct{}, clicks ...click) *pipeline.Stream[siteClick] {
		return pipeline.Generate(p, func(ctx context.Context, emit func(siteClick) error) error {
			if n == 0 {
				defer close(first)
			} else {
				<-wait
			}
			for _, c := range clicks {
				if err := emit(siteClick{c, n}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	clicks := pipeline.Merge(
		site(0, nil, click{"ann", at(0, 10)}, click{"ann", at(1, 20)}, click{"ann", at(2, 30)}),
		site(1, first, click{"bob", at(0, 40)}, click{"bob", at(0, 50)}, click{"bob", at(1, 5)}),
	)
	perMinute := pipeline.Window(clicks, pipeline.Tumbling(time.Minute),
		func(c siteClick) string { return c.User }, func(c siteClick) time.Time { return c.At },
		pipeline.Fold(0, func(n int, _ siteClick) int { return n + 1 }),
		pipeline.WithWatermarkPer(2, func(c siteClick) int { return c.Site }))
	printWindows(pipeline.Collect(context.Background(), perMinute))
	// Output:
	// ann [12:00:00, 12:01:00) 1
	// bob [12:00:00, 12:01:00) 2
	// ann [12:01:00, 12:02:00) 1
	// bob [12:01:00, 12:02:00) 1
	// ann [12:02:00, 12:03:00) 1
}
