package pipeline

import "hash/maphash"

// WithKey routes each item to a worker chosen by the hash of key(item): items with the
// same key are processed one at a time and in input order, items with different keys
// concurrently (unless their keys hash to the same worker: like a broker's partitions,
// a slow key delays the keys that share its worker). Each worker has a queue of its
// own, and the stage's buffer ([WithBuffer]) bounds the items waiting in all of them
// together. In must be the stage's input
// type; the stage's constructor panics otherwise, and also when the stage has
// [WithOrdered] (per-key order is already kept).
func WithKey[In any, K comparable](key func(In) K) StageOption {
	if key == nil {
		panic("pipeline: WithKey(nil)")
	}
	seed := maphash.MakeSeed()
	hash := func(v In) uint64 { return maphash.Comparable(seed, key(v)) }
	return stageOpt(func(c *config) { c.setKey("WithKey", hash) })
}

// WithPartition routes each item to the stage's worker partition(item), modulo its
// workers: as with [WithKey], the items of one partition are processed one at a time
// and in input order, and different partitions concurrently; but the number itself
// chooses the worker, not a hash of it. Use it when the partitions are known numbers,
// such as one lane per worker: n partitions 0 to n-1 on n workers get a worker each,
// where WithKey's hash puts two of four keys on one worker more often than not. It
// suits numbers that run densely from 0: a subset that is not dense modulo the workers
// (every other partition on an even number of workers, as a Kafka group member may be
// assigned) leaves workers idle, where WithKey's hash spreads them. A negative partition
// is taken as its conversion to uint64. In must be the stage's input type; the stage's
// constructor panics otherwise, with [WithOrdered], and with WithKey.
func WithPartition[In any](partition func(In) int) StageOption {
	if partition == nil {
		panic("pipeline: WithPartition(nil)")
	}
	hash := func(v In) uint64 { return uint64(partition(v)) }
	return stageOpt(func(c *config) { c.setKey("WithPartition", hash) })
}

// setKey records a routing option (WithKey or WithPartition) and its hash; a second one
// is kept in keyClash for the stage's constructor to report.
func (c *config) setKey(name string, hash any) {
	if c.keyBy != "" && c.keyClash == "" {
		c.keyClash = c.keyBy + " and " + name
	}
	c.key, c.keyBy = hash, name
}
