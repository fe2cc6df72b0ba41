package pgpipe

import (
	"cmp"
	"database/sql/driver"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"
)

// The upsert modes find a row's key twice: to choose its lane (lanes.of) and to
// de-duplicate a batch (dedupe). Both boxed every column of every row (the mapping's
// fill): reading the key's fields alone, unboxed when each has one of the common key
// types (keyKinds), took S6's upsert5000x4 from 299 k to 344 k rows/s
// (bench/results/s6-upsert-ab.txt).

// keyKinds returns, for a struct mapping m whose key columns cols all map fields of
// type string, int, int64, int32, uint64 or float64 (the types themselves, not named
// types), the kind of each; nil otherwise. The values of those fields are hashed
// (lanes.of) and compared (dedupe) as their boxed values would be (compareValues).
func keyKinds[T any](m Mapping[T], cols []int) []reflect.Kind {
	if m.fields == nil || len(cols) == 0 {
		return nil
	}
	t := reflect.TypeFor[T]()
	if m.ptr {
		t = t.Elem()
	}
	kinds := make([]reflect.Kind, len(cols))
	for j, c := range cols {
		ft := t.Field(m.fields[c]).Type
		switch ft {
		case reflect.TypeFor[string](), reflect.TypeFor[int](), reflect.TypeFor[int64](),
			reflect.TypeFor[int32](), reflect.TypeFor[uint64](), reflect.TypeFor[float64]():
			kinds[j] = ft.Kind()
		default:
			return nil
		}
	}
	return kinds
}

// value returns the struct *v (or **v) of a struct mapping, for its fields.
func (m *Mapping[T]) value(v *T) reflect.Value {
	rv := reflect.ValueOf(v).Elem()
	if m.ptr {
		rv = rv.Elem()
	}
	return rv
}

// key appends to dst the values of *v's columns cols (indexes into its columns),
// dereferenced (deref), and returns it, with scratch for reuse. A struct mapping reads
// those fields alone; another mapping fills scratch with every value and picks.
func (m *Mapping[T]) key(v *T, cols []int, dst, scratch []any) (keys, buf []any) {
	if m.fields != nil {
		rv := m.value(v)
		for _, c := range cols {
			dst = append(dst, keyValue(rv.Field(m.fields[c]).Interface()))
		}
		return dst, scratch
	}
	scratch = m.fill(v, scratch[:0])
	for _, c := range cols {
		dst = append(dst, keyValue(scratch[c]))
	}
	return dst, scratch
}

// keyValue is a key column's value as PostgreSQL gets it, for comparing keys:
// dereferenced (deref), a driver.Valuer's value (sql.NullInt64{} is NULL, and a valid
// one its int64), nil for a nil byte slice, which pgx writes as NULL too, and a time to
// the microsecond, as PostgreSQL keeps it. A key NULL through a value type was compared
// by its printed form, so that rows PostgreSQL inserts each (NULLs are distinct) were
// taken for one key, and all but the last lost; two times within a microsecond were two
// keys, which PostgreSQL met as one twice in a statement, and refused.
func keyValue(v any) any {
	v = deref(v)
	switch x := v.(type) {
	case []byte:
		if x == nil {
			return nil
		}
	case time.Time:
		return x.Truncate(time.Microsecond)
	case driver.Valuer:
		if dv, err := x.Value(); err == nil {
			return dv
		}
	}
	return v
}

// cell is a key column's value of one row, read by its kind (keyKinds): s for a
// string, else w holds the bits of the int (as an int64), uint64 or float64.
type cell struct {
	s string
	w uint64
}

// dedupe returns the rows of batch sorted by key, keeping the last row of each key. A
// row whose key has a NULL is kept whatever follows it: PostgreSQL's ON CONFLICT finds
// no conflict for it (NULLs are distinct in a unique index), and inserts every such row.
func (w *Writer[T]) dedupe(batch []T) []T {
	nc := len(w.keyIdx)
	var null []bool                // boxed keys: whether row i's key has a NULL
	var compare func(a, b int) int // rows a and b by key, as compareValues orders each column
	if kinds := w.kinds; kinds != nil {
		cells := make([]cell, len(batch)*nc)
		for i := range batch {
			rv := w.mapping.value(&batch[i])
			for j, c := range w.keyIdx {
				f, x := rv.Field(w.mapping.fields[c]), &cells[i*nc+j]
				switch kinds[j] {
				case reflect.String:
					x.s = f.String()
				case reflect.Uint64:
					x.w = f.Uint()
				case reflect.Float64:
					x.w = math.Float64bits(f.Float())
				default:
					x.w = uint64(f.Int())
				}
			}
		}
		compare = func(a, b int) int {
			for j, k := range kinds {
				x, y := &cells[a*nc+j], &cells[b*nc+j]
				var c int
				switch k {
				case reflect.String:
					c = strings.Compare(x.s, y.s)
				case reflect.Uint64:
					c = cmp.Compare(x.w, y.w)
				case reflect.Float64:
					c = cmp.Compare(math.Float64frombits(x.w), math.Float64frombits(y.w))
				default:
					c = cmp.Compare(int64(x.w), int64(y.w))
				}
				if c != 0 {
					return c
				}
			}
			return 0
		}
	} else {
		flat := make([]any, 0, len(batch)*nc) // every row's key, one after the other
		var buf []any
		null = make([]bool, len(batch))
		for i := range batch {
			n := len(flat)
			flat, buf = w.mapping.key(&batch[i], w.keyIdx, flat, buf)
			null[i] = slices.Contains(flat[n:], nil)
		}
		compare = func(a, b int) int {
			for j := range nc {
				if c := compareValues(flat[a*nc+j], flat[b*nc+j]); c != 0 {
					return c
				}
			}
			return 0
		}
	}
	order := make([]int, len(batch))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, compare)
	out := make([]T, 0, len(batch))
	for i, r := range order {
		if i+1 < len(order) && compare(r, order[i+1]) == 0 && (null == nil || !null[r]) {
			continue // a later row has the same key: it wins
		}
		out = append(out, batch[r])
	}
	return out
}
