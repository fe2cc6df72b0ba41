package pgpipe

import (
	"context"
	"fmt"
	"hash/maphash"
	"slices"

	"github.com/jackc/pgx/v5"

	"github.com/gopipeline/pipeline"
)

// CommitTx is commit, for the tests that commit a transaction of their own: it
// records p in tx and commits it.
func (c *Checkpoint) CommitTx(ctx context.Context, tx pgx.Tx, p pipeline.Progress) error {
	return c.commit(ctx, tx, p, defaultConfig())
}

// Resolve is resolve, for a COMMIT of transaction xid (of backend pid, with mark)
// that failed with cause.
func (c *Checkpoint) Resolve(ctx context.Context, xid string, mark int64, pid uint32, cause error) error {
	return c.resolve(ctx, xid, mark, pid, cause, defaultConfig())
}

// KeyPaths de-duplicates batch by the key columns key and gives each row's lane of
// lanes (rows named by id: a row with a NaN is not equal to itself), as a writer of m
// does (fast: its key read unboxed when keyKinds allows it) and as a reference does
// (ref: every column filled and boxed, the key's values picked, hashed by hashKey and
// ordered by compareValues, the way the writer read keys before it read them unboxed);
// unboxed reports whether the writer read m's key unboxed. types gives the PostgreSQL
// type (pg_type's name) of key columns, for the lanes (keyTypeOf; "nondeterministic"
// for a text column of a nondeterministic collation); a column it leaves out is text.
// problem, if not empty, says what is wrong with the writer's lanes: two rows whose
// keys compareValues takes as equal in two lanes, a lane's rows out of batch order in
// its parts (split), or a part whose lane (lane) is not its rows'.
func KeyPaths[T any](m Mapping[T], key []string, types map[string]string, batch []T, lanes int, id func(T) int) (fast, ref, fastLanes, refLanes []int, unboxed bool, problem string) {
	w := &Writer[T]{mapping: m}
	w.columns, w.cfg = m.columns, defaultConfig()
	for _, k := range key {
		i := slices.Index(m.columns, k)
		if i < 0 {
			panic("KeyPaths: no column " + k)
		}
		w.keyIdx = append(w.keyIdx, i)
	}
	w.kinds = keyKinds(m, w.keyIdx)
	unboxed = w.kinds != nil
	l := newLanes(w, lanes)
	l.types = make([]keyType, len(key))
	for j, k := range key {
		if typ, ok := types[k]; ok {
			l.types[j] = keyTypeOf(typ, -1, typ != "nondeterministic")
		}
	}
	var h maphash.Hash
	h.SetSeed(l.seed)
	fastLanes = make([]int, len(batch))
	for i := range batch {
		fastLanes[i], _, _ = l.of(&batch[i], &h, nil, nil)
	}
	for _, v := range w.dedupe(batch) {
		fast = append(fast, id(v))
	}

	// The reference.
	keys := make([][]any, len(batch))
	refLanes = make([]int, len(batch))
	for i := range batch {
		all := m.fill(&batch[i], nil)
		for _, c := range w.keyIdx {
			keys[i] = append(keys[i], deref(all[c]))
		}
		h.Reset()
		hashKey(&h, keys[i], l.types)
		refLanes[i] = int(h.Sum64() % uint64(lanes))
	}
	cmpKeys := func(a, b int) int {
		for j := range keys[a] {
			if c := compareValues(keys[a][j], keys[b][j]); c != 0 {
				return c
			}
		}
		return 0
	}
	order := make([]int, len(batch))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, cmpKeys)
	for i, r := range order {
		if i+1 < len(order) && cmpKeys(r, order[i+1]) == 0 {
			if fastLanes[r] != fastLanes[order[i+1]] {
				problem = fmt.Sprintf("rows %d and %d: equal keys %v, lanes %d and %d", r, order[i+1], keys[r], fastLanes[r], fastLanes[order[i+1]])
			}
			if !slices.Contains(keys[r], nil) {
				continue // a later row has the same key: it wins
			}
		}
		ref = append(ref, id(batch[r]))
	}

	// The split: each lane's rows in batch order, in parts of that lane.
	want := make([][]int, lanes)
	for i := range batch {
		want[fastLanes[i]] = append(want[fastLanes[i]], id(batch[i]))
	}
	got := make([][]int, lanes)
	for _, part := range l.split(batch) {
		k := l.lane(part)
		for j := range part {
			if kj, _, _ := l.of(&part[j], &h, nil, nil); kj != k {
				problem = fmt.Sprintf("a part of lane %d holds a row of lane %d", k, kj)
			}
			got[k] = append(got[k], id(part[j]))
		}
	}
	for k := range want {
		if !slices.Equal(want[k], got[k]) {
			problem = fmt.Sprintf("lane %d: its parts hold %d rows, not its %d in batch order", k, len(got[k]), len(want[k]))
		}
	}
	return fast, ref, fastLanes, refLanes, unboxed, problem
}
