// Command pgonce shows Kafka into PostgreSQL exactly once, across crashes: it starts a
// Kafka cluster in the process (franz-go's kfake, which speaks Kafka's protocol), three
// consumer processes in one group (this program again, with -member) that write each
// record of a 12-partition topic as a row of PostgreSQL with its offsets in the same
// transaction (kafka.WithOffsetStore, kafkapg.NewSink), and SIGKILLs one of them at a
// time, again and again, restarting it each time. At the end it counts the rows: each
// record is there once, with no unique key to hide a duplicate.
//
//	export DATABASE_URL=$(scripts/postgres.sh start)
//	go run ./kafka/examples/pgonce -records 20000 -kills 4
//
// It prints what it did and the count, and exits 1 if a record is missing or
// written twice.
package main

import (
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gopipeline/pipeline"
	"github.com/gopipeline/pipeline/kafka"
	"github.com/gopipeline/pipeline/kafka/kafkapg"
	pgpipe "github.com/gopipeline/pipeline/postgres"
)

const (
	topic      = "orders"
	partitions = 12
	group      = "pgonce"
)

// order is a row of the table: the record's id, and where it came from.
type order struct {
	ID        int64 `db:"id"`
	Partition int32 `db:"partition"`
	Offset    int64 `db:"kafka_offset"`
}

func main() {
	member := flag.Int("member", 0, "run as consumer process n (the program starts these itself)")
	brokers := flag.String("brokers", "", "the seed brokers of a member")
	table := flag.String("table", "pgonce_orders", "the table the rows go into (made anew, with the offsets' store of the same name)")
	records := flag.Int("records", 20_000, "how many records to produce")
	kills := flag.Int("kills", 4, "how many times to SIGKILL a member")
	flag.Parse()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		fmt.Fprintln(os.Stderr, "pgonce: DATABASE_URL is not set; start a server with  export DATABASE_URL=$(scripts/postgres.sh start)")
		os.Exit(2)
	}
	var err error
	if *member > 0 {
		err = runMember(url, strings.Split(*brokers, ","), *table, *member)
	} else {
		err = run(url, *table, *records, *kills)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgonce:", err)
		os.Exit(1)
	}
}

// runMember is consumer process n: records → a stage keyed by partition (each
// partition's records in offset order) → batches of up to 500 → PostgreSQL, the
// batch's rows and its partitions' offsets in one transaction. It runs until its
// standard input closes (a graceful stop), or until it is killed. Its group
// membership is static (KIP-345): a member restarted after a crash takes the dead
// one's place, and its partitions, at once, rather than after its session expires.
func runMember(url string, brokers []string, table string, n int) error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	src := kafka.NewSource([]kgo.Opt{
		kgo.SeedBrokers(brokers...),
		kgo.InstanceID(fmt.Sprintf("pgonce-%d", n)),
		kgo.SessionTimeout(time.Second), // a killed member not restarted loses its partitions a second later
		kgo.HeartbeatInterval(100 * time.Millisecond),
		kgo.RebalanceTimeout(10 * time.Second), // a rebalance waits at most this for the members to rejoin
		kgo.FetchMaxWait(100 * time.Millisecond),
		kgo.RetryBackoffFn(func(int) time.Duration { return 50 * time.Millisecond }),
	}, group, []string{topic}, idCodec{},
		kafka.WithOffsetStore(kafkapg.NewOffsets(pool, table)), // where a partition's new owner starts
		kafka.WithRevokeTimeout(200*time.Millisecond), kafka.WithMaxPending(1500),
		kafka.WithRequestTimeout(5*time.Second))
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		src.Stop()
	}()
	p := pipeline.New()
	rows := pipeline.Then(src.Stream(p), pipeline.NewStage("order", 4,
		func(_ context.Context, m kafka.Message[int64]) (kafka.Message[order], error) {
			return kafka.Message[order]{ // the input record's topic, partition and offset stay
				Topic: m.Topic, Partition: m.Partition, Offset: m.Offset,
				Value: order{ID: m.Value, Partition: m.Partition, Offset: m.Offset},
			}, nil
		}, pipeline.WithKey(kafka.Message[int64].TopicPartition)))
	w := pgpipe.NewWriter(pool, table, pgpipe.Struct[order]())
	pipeline.ToBatches(rows, 500, kafkapg.NewSink("orders", src, w), pipeline.WithLinger(20*time.Millisecond))
	return p.Run(ctx)
}

// run is the parent: the cluster, the table, the members, the kills and the count.
// It gives up after ten minutes, or when a member exits by itself.
func run(url, table string, records, kills int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	for _, q := range []string{
		"DROP TABLE IF EXISTS " + table,
		"CREATE TABLE " + table + " (id bigint NOT NULL, partition integer NOT NULL, kafka_offset bigint NOT NULL)", // no key: a duplicate shows
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			return err
		}
	}
	var pe *pgconn.PgError
	if _, err := pool.Exec(ctx, "DELETE FROM "+kafkapg.Table+" WHERE job = $1", table); err != nil &&
		(!errors.As(err, &pe) || pe.Code != "42P01") { // undefined_table: no claim was ever made here
		return err
	}
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(partitions, topic), kfake.GroupMinSessionTimeout(100*time.Millisecond))
	if err != nil {
		return err
	}
	defer c.Close()
	brokers := strings.Join(c.ListenAddrs(), ",")
	start := time.Now()
	members := make([]*child, 3)
	for i := range members {
		if members[i], err = startMember(brokers, table, i+1); err != nil {
			return err
		}
	}
	defer func() {
		for _, m := range members {
			if m != nil {
				m.kill()
			}
		}
	}()
	chunk := records / (kills + 1)
	produced := 0
	for k := 0; k <= kills; k++ {
		n := chunk
		if k == kills {
			n = records - produced
		}
		if err := produce(ctx, c.ListenAddrs(), produced, n); err != nil {
			return err
		}
		produced += n
		if k == kills {
			break
		}
		// Kill a member once half of this chunk is in the table: its transaction is
		// cut off wherever it is (before, in or after COMMIT).
		if err := waitRows(ctx, pool, table, int64(produced-n/2), members); err != nil {
			return err
		}
		i := k % len(members)
		members[i].kill()
		fmt.Printf("killed member %d (pid %d) with %s rows in the table\n", i+1, members[i].cmd.Process.Pid, commas(rowsNow(ctx, pool, table)))
		if members[i], err = startMember(brokers, table, i+1); err != nil {
			return err
		}
	}
	if err := waitRows(ctx, pool, table, int64(records), members); err != nil {
		return err
	}
	for i, m := range members {
		if err := m.stop(); err != nil {
			return fmt.Errorf("member %d: %w", i+1, err)
		}
		members[i] = nil
	}
	var rows, ids int64
	if err := pool.QueryRow(ctx, "SELECT count(*), count(DISTINCT id) FROM "+table).Scan(&rows, &ids); err != nil {
		return err
	}
	fmt.Printf("%s records on %d partitions, 3 members, %d SIGKILLed and restarted: %s rows, %s distinct ids, in %v\n",
		commas(int64(records)), partitions, kills, commas(rows), commas(ids), time.Since(start).Round(100*time.Millisecond))
	if rows != int64(records) || ids != int64(records) {
		return fmt.Errorf("want each of the %d records once", records)
	}
	fmt.Println("each record written exactly once")
	return nil
}

// child is a member process.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed once it has exited, with err its Wait's
	err   error
}

func startMember(brokers, table string, n int) (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "-member", fmt.Sprint(n), "-brokers", brokers, "-table", table)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &child{cmd: cmd, stdin: stdin, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

// kill SIGKILLs the member and waits for its exit.
func (c *child) kill() {
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	<-c.done
}

// stop closes the member's input, so that it stops gracefully, and waits for it.
func (c *child) stop() error {
	_ = c.stdin.Close()
	select {
	case <-c.done:
		return c.err
	case <-time.After(time.Minute):
		c.kill()
		return errors.New("did not stop within a minute")
	}
}

// produce writes records from to from+n-1: record i to partition i % 12, its value i.
func produce(ctx context.Context, brokers []string, from, n int) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer cl.Close()
	recs := make([]*kgo.Record, 0, 1000)
	for i := from; i < from+n; i++ {
		recs = append(recs, &kgo.Record{Topic: topic, Partition: int32(i % partitions), Value: binary.BigEndian.AppendUint64(nil, uint64(i))})
		if len(recs) == cap(recs) || i == from+n-1 {
			if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
				return err
			}
			recs = recs[:0]
		}
	}
	return nil
}

// waitRows waits until the table holds want distinct ids (three minutes at most),
// while every member runs.
func waitRows(ctx context.Context, pool *pgxpool.Pool, table string, want int64, members []*child) error {
	deadline := time.Now().Add(3 * time.Minute)
	for {
		for i, m := range members {
			select {
			case <-m.done:
				return fmt.Errorf("member %d exited by itself: %w", i+1, m.err)
			default:
			}
		}
		var ids int64
		if err := pool.QueryRow(ctx, "SELECT count(DISTINCT id) FROM "+table).Scan(&ids); err != nil {
			return err
		}
		if ids >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d of %d ids in the table after three minutes", ids, want)
		}
		select {
		case <-time.After(20 * time.Millisecond):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func rowsNow(ctx context.Context, pool *pgxpool.Pool, table string) int64 {
	var n int64
	_ = pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&n)
	return n
}

// commas formats n with thousands separators.
func commas(n int64) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// idCodec is the records' value: an id as 8 big-endian bytes.
type idCodec struct{}

func (idCodec) Marshal(v int64) ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, uint64(v)), nil
}

func (idCodec) Unmarshal(data []byte, v *int64) error {
	if len(data) != 8 {
		return errors.New("not an 8-byte id")
	}
	*v = int64(binary.BigEndian.Uint64(data))
	return nil
}
