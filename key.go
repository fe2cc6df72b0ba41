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
	return stageOpt(func(c *config) { c.key = hash })
}
