package pgpipe

import (
	"cmp"
	"context"
	"database/sql/driver"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
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

// keyType is how the lanes take the values of a key column, by the column's type: two
// values that PostgreSQL takes as one key must share a lane (else two writers write
// the key at once, in any order), while two keys sharing a lane cost only balance, so
// a keyType may take values as equal that PostgreSQL does not.
type keyType struct {
	kind keyKind
	// round is, for a time of a timestamp(p) column (keyWall, keyInstant), the
	// microseconds PostgreSQL rounds it to: 10^(6-p); 0 or 1 keeps them all.
	round int64
}

type keyKind uint8

const (
	keyPlain   keyKind = iota // as the de-duplication takes them (keyValue), a time by its instant
	keyInstant                // timestamptz: a time's instant, in the column's precision
	keyWall                   // timestamp without time zone: a time's wall clock, whatever its location
	keyDay                    // date: the day of a time's wall clock
	keyPadded                 // char(n), varchar(n): trailing spaces do not count
	keyFolded                 // citext: letter case does not count
	keyFloat4                 // float4: a float64 as it rounds to float32
	keyOpaque                 // a nondeterministic collation: the column is left out of the hash
)

// keyTypesSQL reads the type of each key column $2 of table $1 (a domain's base type),
// its modifier (the n of varchar(n), the p of timestamp(p)) and whether its collation
// is deterministic (a nondeterministic one may take strings with other bytes as equal:
// case or accents ignored).
const keyTypesSQL = `SELECT a.attname, bt.typname,
		CASE t.typtype WHEN 'd' THEN t.typtypmod ELSE a.atttypmod END, coalesce(c.collisdeterministic, true)
	FROM pg_attribute a
	JOIN pg_type t ON t.oid = a.atttypid
	JOIN pg_type bt ON bt.oid = CASE t.typtype WHEN 'd' THEN t.typbasetype ELSE t.oid END
	LEFT JOIN pg_collation c ON c.oid = a.attcollation
	WHERE a.attrelid = $1::regclass AND a.attnum > 0 AND NOT a.attisdropped AND a.attname = ANY($2)`

// keyTypes returns the keyType of each key column, read from the server once per writer.
func (w *writerCore) keyTypes(ctx context.Context) ([]keyType, error) {
	w.keyMu.Lock()
	types := w.keyT
	w.keyMu.Unlock()
	if types != nil {
		return types, nil
	}
	w.stats.roundTrips.Add(1)
	rows, err := w.pool.Query(ctx, keyTypesSQL, w.ident.Sanitize(), w.cfg.key)
	if err != nil {
		return nil, err
	}
	types = make([]keyType, len(w.cfg.key))
	var (
		name, typ     string
		typmod        int32
		deterministic bool
	)
	_, err = pgx.ForEachRow(rows, []any{&name, &typ, &typmod, &deterministic}, func() error {
		if i := slices.Index(w.cfg.key, name); i >= 0 {
			types[i] = keyTypeOf(typ, typmod, deterministic)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	w.keyMu.Lock()
	w.keyT = types
	w.keyMu.Unlock()
	return types, nil
}

// keyTypeOf is the keyType of a column of type typ (pg_type's name) with modifier
// typmod (-1 for none).
func keyTypeOf(typ string, typmod int32, deterministic bool) keyType {
	switch {
	case !deterministic:
		return keyType{kind: keyOpaque}
	case typ == "timestamp" || typ == "timestamptz":
		t := keyType{kind: keyInstant}
		if typ == "timestamp" {
			t.kind = keyWall
		}
		if 0 <= typmod && typmod < 6 {
			t.round = int64(math.Pow10(6 - int(typmod)))
		}
		return t
	case typ == "date":
		return keyType{kind: keyDay}
	case typ == "bpchar", typ == "varchar" && typmod >= 0: // varchar(n) cuts trailing spaces past n
		return keyType{kind: keyPadded}
	case typ == "citext":
		return keyType{kind: keyFolded}
	case typ == "float4":
		return keyType{kind: keyFloat4}
	}
	return keyType{}
}

// str is the string a key column of type t hashes for s.
func (t keyType) str(s string) string {
	switch t.kind {
	case keyPadded:
		return strings.TrimRight(s, " ")
	case keyFolded:
		return strings.Map(foldRune, s)
	}
	return s
}

// foldRune maps letters that differ only in case to one: the lower case of their upper
// case, so that those a locale's lower() maps otherwise share one too (the Turkish I, ı,
// İ and i; K and the Kelvin sign; σ and ς).
func foldRune(r rune) rune {
	if r < utf8.RuneSelf {
		if 'A' <= r && r <= 'Z' {
			r += 'a' - 'A'
		}
		return r
	}
	return unicode.ToLower(unicode.ToUpper(r))
}

// float is the float64 a key column of type t hashes for f.
func (t keyType) float(f float64) float64 {
	if t.kind == keyFloat4 {
		return float64(float32(f))
	}
	return f
}

// pgEpoch is 2000-01-01 00:00:00 UTC, PostgreSQL's timestamps' zero, in Unix seconds.
const pgEpoch = 946684800

// micros returns the microseconds since pgEpoch of a time whose seconds since 1970
// (its instant's, or its wall clock's) are sec and whose fraction is ns, rounded as
// PostgreSQL rounds a timestamp(p) (AdjustTimestampForTypmod: half away from zero, to
// t.round microseconds).
func (t keyType) micros(sec int64, ns int) int64 {
	us := (sec-pgEpoch)*1_000_000 + int64(ns/1000)
	if r := t.round; r > 1 {
		if us >= 0 {
			us = (us + r/2) / r * r
		} else {
			us = -((-us + r/2) / r * r)
		}
	}
	return us
}
