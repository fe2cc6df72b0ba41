package pipeline

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
)

// PartitionLag is the backlog of one partition of a source ([WithLag]): the items a
// broker holds for the source that it has not consumed (or not committed) yet.
type PartitionLag struct {
	Partition string // the partition's label, such as "orders/3"
	Lag       int64  // items behind
}

// LagOption is the option [WithLag] returns: it fits [FromAcked] and [FromCheckpoint].
type LagOption struct{ fn func() []PartitionLag }

func (o LagOption) ackOption(c *config)        { c.lag = o.fn }
func (o LagOption) checkpointOption(c *config) { c.lag = o.fn }

// WithLag makes an acknowledged source ([FromAcked]) or a checkpointed one
// ([FromCheckpoint]) report its backlog per partition: fn returns, for each partition
// the source reads, the items not consumed yet, such as a Kafka consumer group's lag
// (the partition's high watermark minus its committed offset). The source's row of
// every report then carries them in [StageReport].Lag, and their sum in
// [StageReport.TotalLag]; [Report.String], [Report.Line] and the exporters (the
// Prometheus, OpenTelemetry and dashboard modules) show them.
//
// fn is called when a report is made, never per item: by every [Pipeline.Snapshot]
// during a run (from the goroutine that takes it), and once more for the final report,
// after every goroutine of the run has ended. It must be quick and safe to call from
// any goroutine; a panic in it is not recovered (it reaches the caller of Snapshot, or
// of Run for the final report). The report keeps the partitions in fn's order, adding
// up the lags of a label given twice; what fn returns is copied, so fn may reuse its
// slice. A nil result (the source knows nothing yet, or no longer: between runs) is a
// nil Lag; an empty one, a source that holds no partition now. The lags are taken as
// given, and change no other count of the report. It panics if fn is nil.
func WithLag(fn func() []PartitionLag) LagOption {
	if fn == nil {
		panic("pipeline: WithLag(nil)")
	}
	return LagOption{fn}
}

// TotalLag returns the sum of s.Lag: a source's items behind, over its partitions (0
// when it reports none).
func (s StageReport) TotalLag() int64 {
	var n int64
	for _, l := range s.Lag {
		n += l.Lag
	}
	return n
}

// readLag calls a source's WithLag function and returns what it said: a copy, with a
// label given twice merged into its first place.
func readLag(fn func() []PartitionLag) []PartitionLag {
	got := fn()
	if got == nil {
		return nil
	}
	out := make([]PartitionLag, 0, len(got))
	var at map[string]int // the index of each label in out, made once labels repeat
	for _, l := range got {
		if at == nil && len(out) < 16 { // few partitions: a scan is cheaper than a map
			if i := slices.IndexFunc(out, func(o PartitionLag) bool { return o.Partition == l.Partition }); i >= 0 {
				out[i].Lag += l.Lag
				continue
			}
			out = append(out, l)
			continue
		}
		if at == nil {
			at = make(map[string]int, len(got))
			for i, o := range out {
				at[o.Partition] = i
			}
		}
		if i, ok := at[l.Partition]; ok {
			out[i].Lag += l.Lag
			continue
		}
		at[l.Partition] = len(out)
		out = append(out, l)
	}
	return out
}

// lagShown is how many partitions [Report.String] names on a source's lag line: all of
// them, in the source's order, up to this many; else this many of the furthest behind,
// furthest first.
const lagShown = 6

// lagLine is the report's line about a source's lag ([WithLag]), "" for a row without:
//
//	source kafka: lag 1,234 on 3 partitions: orders/0 600, orders/1 634, orders/2 0
func (s StageReport) lagLine() string {
	if s.Lag == nil {
		return ""
	}
	parts := "partitions"
	if len(s.Lag) == 1 {
		parts = "partition"
	}
	line := fmt.Sprintf("source %s: lag %d on %d %s", s.Name, s.TotalLag(), len(s.Lag), parts)
	shown := s.Lag
	if len(shown) > lagShown { // the furthest behind first
		shown = slices.Clone(shown)
		slices.SortStableFunc(shown, func(a, b PartitionLag) int { return cmp.Compare(b.Lag, a.Lag) })
		shown = shown[:lagShown]
		line += ", furthest behind"
	}
	var b strings.Builder
	for i, l := range shown {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %d", l.Partition, l.Lag)
	}
	if b.Len() > 0 {
		line += ": " + b.String()
	}
	return line + "\n"
}
