package pipeline

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

func TestZZOrdered(t *testing.T) {
	for _, workers := range []int{1, 3, 8} {
		p := New(WithBuffer(4))
		n := 5000
		items := make([]int, n)
		for i := range items {
			items[i] = i
		}
		st := NewFlatStage("sq", workers, func(_ context.Context, v int, emit func(int)) error {
			if rand.IntN(50) == 0 {
				time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
			}
			if v%7 == 0 {
				return Permanent(errors.New("seven"))
			}
			if v%5 == 0 {
				return nil
			}
			emit(v)
			if v%3 == 0 {
				emit(-v)
			}
			return nil
		}, WithOrdered(0))
		out, err := Collect(t.Context(), Then(FromSlice(p, items), st))
		if err != nil {
			t.Fatal(err)
		}
		exp := []int{}
		for i := range n {
			if i%7 == 0 || i%5 == 0 {
				continue
			}
			exp = append(exp, i)
			if i%3 == 0 {
				exp = append(exp, -i)
			}
		}
		if len(out) != len(exp) {
			t.Fatalf("len %d vs %d", len(out), len(exp))
		}
		for i := range out {
			if out[i] != exp[i] {
				t.Fatalf("at %d: %d vs %d", i, out[i], exp[i])
			}
		}
		t.Log(p.Report())
	}
	// keyed
	p := New()
	type kv struct{ k, v int }
	var items []kv
	for i := range 3000 {
		items = append(items, kv{i % 10, i})
	}
	out, err := Collect(t.Context(), Then(FromSlice(p, items), NewStage("k", 4, func(_ context.Context, x kv) (kv, error) { return x, nil }, WithKey(func(x kv) int { return x.k }))))
	if err != nil || len(out) != 3000 {
		t.Fatal(err, len(out))
	}
	last := map[int]int{}
	for _, x := range out {
		if l, ok := last[x.k]; ok && l > x.v {
			t.Fatal("order", x)
		}
		last[x.k] = x.v
	}
}
