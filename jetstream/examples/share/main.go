// Command share runs one pipeline in several processes that share the work of one
// JetStream durable consumer, and checks that every message was processed once in
// effect.
//
//	go run ./jetstream/examples/share                  # starts an embedded server
//	go run ./jetstream/examples/share -url nats://...  # uses yours
//
// The parent process starts a NATS server in-process (loopback, random port, store in
// a temporary folder) unless given -url, makes the streams ORDERS (the input, -n
// messages) and INVOICES (the output, de-duplicated by Nats-Msg-Id), then starts
// -procs worker processes (this program again, with -worker). Each worker runs
// the same pipeline on its own connection:
//
//	jetstream.Source   the durable consumer "billing" on ORDERS; the server shares
//	                   the messages between the workers
//	price              8 workers, 1 ms of simulated I/O per order
//	jetstream.NewSink  batches of 100 published to INVOICES, with the order's id as
//	                   Nats-Msg-Id: a redelivered order is stored once
//
// Every message is acknowledged only after its invoice is stored. When INVOICES holds
// one invoice per order, the parent tells the workers to stop (SIGTERM: stop pulling,
// finish what is in flight, ack it), and prints what each did.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	natsjs "github.com/nats-io/nats.go/jetstream"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/jetstream"
)

func main() {
	url := flag.String("url", "", "the NATS server; empty: start one in this process")
	procs := flag.Int("procs", 3, "worker processes")
	n := flag.Int("n", 20_000, "orders to process")
	worker := flag.Bool("worker", false, "run as a worker (started by the parent)")
	flag.Parse()
	var err error
	if *worker {
		err = runWorker(*url)
	} else {
		err = runParent(*url, *procs, *n)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "share:", err)
		os.Exit(1)
	}
}

func runParent(url string, procs, n int) error {
	if procs < 1 || n < 1 {
		return errors.New("-procs and -n must be at least 1")
	}
	if url == "" {
		dir, err := os.MkdirTemp("", "share-example")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir) //nolint:errcheck // a temporary folder
		srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true})
		if err != nil {
			return err
		}
		go srv.Start()
		if !srv.ReadyForConnections(30 * time.Second) {
			return errors.New("the embedded server did not start")
		}
		defer func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		}()
		url = srv.ClientURL()
		fmt.Println("embedded server at", url)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := natsjs.New(nc)
	if err != nil {
		return err
	}
	ctx := context.Background()
	if err := setup(ctx, js, n); err != nil {
		return err
	}
	fmt.Printf("%d orders in ORDERS; starting %d workers\n", n, procs)
	start := time.Now()
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	cmds := make([]*exec.Cmd, procs)
	for i := range cmds {
		cmd := exec.Command(exe, "-worker", "-url", url)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return err
		}
		cmds[i] = cmd
		wg.Go(func() { // prefix each line of the worker's with its number
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				fmt.Printf("worker %d (pid %d): %s\n", i+1, cmd.Process.Pid, sc.Text())
			}
		})
	}
	invoices, err := js.Stream(ctx, "INVOICES")
	if err != nil {
		return err
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for deadline := time.Now().Add(5 * time.Minute); ; {
		info, err := invoices.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.Msgs == uint64(n) {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("INVOICES holds %d invoices of %d after 5 minutes", info.State.Msgs, n)
		}
		<-tick.C
	}
	elapsed := time.Since(start)
	for _, c := range cmds {
		if err := c.Process.Signal(syscall.SIGTERM); err != nil {
			return err
		}
	}
	wg.Wait()
	var errs []error
	for _, c := range cmds {
		errs = append(errs, c.Wait())
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	cons, err := js.Consumer(ctx, "ORDERS", "billing")
	if err != nil {
		return err
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("INVOICES holds %d invoices for %d orders, one each, in %v (%.0f orders/s); the consumer has %d pending, %d unacknowledged\n",
		n, n, elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), ci.NumPending, ci.NumAckPending)
	return nil
}

// setup makes ORDERS with n orders, INVOICES and the consumer.
func setup(ctx context.Context, js natsjs.JetStream, n int) error {
	for _, cfg := range []natsjs.StreamConfig{
		{Name: "ORDERS", Subjects: []string{"orders"}},
		{Name: "INVOICES", Subjects: []string{"invoices"}, Duplicates: 10 * time.Minute},
	} {
		if _, err := js.CreateStream(ctx, cfg); err != nil {
			return err
		}
	}
	var futures []natsjs.PubAckFuture
	wait := func() error {
		for _, f := range futures {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				return err
			}
		}
		futures = futures[:0]
		return nil
	}
	for i := range n {
		f, err := js.PublishAsync("orders", []byte(strconv.Itoa(i)))
		if err != nil {
			return err
		}
		if futures = append(futures, f); len(futures) == 1000 {
			if err := wait(); err != nil {
				return err
			}
		}
	}
	if err := wait(); err != nil {
		return err
	}
	_, err := js.CreateConsumer(ctx, "ORDERS", natsjs.ConsumerConfig{
		Durable: "billing", AckPolicy: natsjs.AckExplicitPolicy, AckWait: 10 * time.Second, MaxAckPending: 1000,
	})
	return err
}

// order is an order's id; invoice what the pipeline makes of it.
type (
	order   struct{ ID int }
	invoice struct {
		Order int `json:"order"`
		Cents int `json:"cents"`
	}
)

type orderCodec struct{}

func (orderCodec) Marshal(o order) ([]byte, error) { return []byte(strconv.Itoa(o.ID)), nil }

func (orderCodec) Unmarshal(b []byte, o *order) (err error) {
	o.ID, err = strconv.Atoi(string(b))
	return err
}

// runWorker runs the pipeline until SIGTERM, then prints what it did.
func runWorker(url string) error {
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Drain() //nolint:errcheck // the acks are flushed on the way out
	js, err := natsjs.New(nc, natsjs.WithPublishAsyncMaxPending(1000))
	if err != nil {
		return err
	}
	ctx := context.Background()
	cons, err := js.Consumer(ctx, "ORDERS", "billing")
	if err != nil {
		return err
	}
	p := pipeline.New()
	src := jetstream.NewSource(cons, orderCodec{})
	priced := pipeline.Then(src.Stream(p), pipeline.NewStage("price", 8, func(ctx context.Context, o order) (invoice, error) {
		select { // the price service
		case <-time.After(time.Millisecond):
		case <-ctx.Done():
			return invoice{}, ctx.Err()
		}
		return invoice{Order: o.ID, Cents: 100 + o.ID%900}, nil
	}))
	pipeline.ToBatches(priced, 100, jetstream.NewSink("invoices", 2, js, "invoices", pipeline.JSONCodec[invoice]{},
		func(v invoice) string { return strconv.Itoa(v.Order) },
		pipeline.WithRetry(10, pipeline.ExponentialBackoff(10*time.Millisecond, time.Second))),
		pipeline.WithLinger(20*time.Millisecond))
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM, os.Interrupt)
	defer signal.Stop(term)
	go func() {
		<-term
		src.Stop()
	}()
	if err := p.Run(ctx); err != nil {
		return err
	}
	st := src.Stats()
	fmt.Printf("%d orders delivered (%d redelivered), %d acked, %d handed back at the end\n", st.Delivered, st.Redelivered, st.Acked, st.NotProcessed)
	return nil
}
