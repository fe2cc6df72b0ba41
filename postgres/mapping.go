package pgpipe

import (
	"bytes"
	"cmp"
	"database/sql/driver"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode"
)

// Mapping turns a value of T into the columns of one table row. Make one with [Struct]
// (from the struct's fields and their db tags) or [Func] (a function of your own).
// A Mapping is immutable and safe for concurrent use.
type Mapping[T any] struct {
	columns []string
	// fill appends the values of *v's columns to buf[:0] and returns it; the values are
	// used before the next call, so buf may be reused. They may point into *v.
	fill func(v *T, buf []any) []any
	// Struct mappings: the mapped fields' indexes and whether T is a pointer, so that
	// the writer can encode common field types, and read a key, without boxing them
	// (copy.go, key.go).
	fields []int
	ptr    bool
}

// Columns returns the mapped column names, in order.
func (m Mapping[T]) Columns() []string { return append([]string(nil), m.columns...) }

// Func returns a mapping of the given columns whose values, in the same order, are
// values(v). values may return a new slice each time or reuse one.
// It panics if columns is empty or has duplicates, or values is nil.
func Func[T any](columns []string, values func(v T) []any) Mapping[T] {
	if values == nil {
		panic("pgpipe: Func: nil values function")
	}
	checkColumns("Func", columns)
	return Mapping[T]{columns: append([]string(nil), columns...), fill: func(v *T, _ []any) []any { return values(*v) }}
}

// Struct returns the mapping of a struct type T (or a pointer to one): each exported
// field is a column, named by its `db:"name"` tag, or else by the field's name in
// snake_case (UserID becomes user_id); `db:"-"` leaves a field out. Embedded structs
// are not flattened. It reads T's fields once, with reflection. Fields of the common
// types (int64, int32, int16, int, string, float64, float32, bool, []byte) going into
// columns of the matching PostgreSQL type are encoded straight from the row, with no
// allocation; others are handed to pgx's encoders. It panics if T is not a struct, maps
// no field, or maps a field that no PostgreSQL type can take (a channel, a function, a
// complex number, an unsafe pointer): pgx refused every row of it at write time, and
// each was set aside as a row error.
func Struct[T any]() Mapping[T] {
	t := reflect.TypeFor[T]()
	ptr := t.Kind() == reflect.Pointer
	if ptr {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		panic(fmt.Sprintf("pgpipe: Struct[%s]: not a struct type", t))
	}
	var cols []string
	var idx []int
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name := f.Tag.Get("db")
		if name == "-" {
			continue
		}
		if name == "" {
			name = snake(f.Name)
		}
		if unwritable(f.Type) {
			panic(fmt.Sprintf("pgpipe: Struct[%s]: field %s (column %q) is a %s, which no PostgreSQL type takes; leave it out with `db:\"-\"`", t, f.Name, name, f.Type))
		}
		cols = append(cols, name)
		idx = append(idx, i)
	}
	if len(cols) == 0 {
		panic(fmt.Sprintf("pgpipe: Struct[%s]: no exported field to map", t))
	}
	checkColumns("Struct", cols)
	return Mapping[T]{columns: cols, fields: idx, ptr: ptr, fill: func(v *T, buf []any) []any {
		rv := reflect.ValueOf(v).Elem()
		if ptr {
			rv = rv.Elem()
		}
		buf = buf[:0]
		for _, i := range idx {
			buf = append(buf, rv.Field(i).Interface())
		}
		return buf
	}}
}

// unwritable reports whether a field of type t can never be encoded: a channel, a
// function, a complex number or an unsafe pointer (or a pointer to one).
func unwritable(t reflect.Type) bool {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if valuer := reflect.TypeFor[driver.Valuer](); t.Implements(valuer) || reflect.PointerTo(t).Implements(valuer) {
		return false // it says what it is
	}
	switch t.Kind() {
	case reflect.Chan, reflect.Func, reflect.Complex64, reflect.Complex128, reflect.UnsafePointer:
		return true
	}
	return false
}

func checkColumns(ctor string, cols []string) {
	if len(cols) == 0 {
		panic(fmt.Sprintf("pgpipe: %s: no columns", ctor))
	}
	seen := map[string]bool{}
	for _, c := range cols {
		if c == "" || seen[c] {
			panic(fmt.Sprintf("pgpipe: %s: empty or duplicate column name %q in %v", ctor, c, cols))
		}
		seen[c] = true
	}
}

// snake converts a Go field name to snake_case: ID → id, UserID → user_id.
func snake(s string) string {
	r := []rune(s)
	var b strings.Builder
	for i, c := range r {
		if unicode.IsUpper(c) {
			prevLower := i > 0 && !unicode.IsUpper(r[i-1])
			nextLower := i > 0 && i+1 < len(r) && unicode.IsLower(r[i+1]) && unicode.IsUpper(r[i-1])
			if prevLower || nextLower {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(c))
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// compareValues orders two key values of the same column: nil (NULL) first, the
// common key types directly, anything else by its printed form.
func compareValues(a, b any) int {
	if a == nil || b == nil { // not by the printed form: NULL is not the string "<nil>"
		switch {
		case a != nil:
			return 1
		case b != nil:
			return -1
		}
		return 0
	}
	switch x := a.(type) {
	case int:
		if y, ok := b.(int); ok {
			return cmp.Compare(x, y)
		}
	case int64:
		if y, ok := b.(int64); ok {
			return cmp.Compare(x, y)
		}
	case int32:
		if y, ok := b.(int32); ok {
			return cmp.Compare(x, y)
		}
	case uint64:
		if y, ok := b.(uint64); ok {
			return cmp.Compare(x, y)
		}
	case string:
		if y, ok := b.(string); ok {
			return strings.Compare(x, y)
		}
	case []byte:
		if y, ok := b.([]byte); ok {
			return bytes.Compare(x, y)
		}
	case time.Time:
		if y, ok := b.(time.Time); ok {
			// By the instant, then the wall clock: equal only when both are, as a
			// timestamptz (the instant) and a timestamp without time zone (the wall
			// clock) each take them as one key; times of one instant in two locations
			// were one key here, and all but the last row lost where PostgreSQL keeps
			// the wall clock. One instant in two locations, one key to a timestamptz,
			// is left to the write (see WithUpsert).
			if c := x.Compare(y); c != 0 {
				return c
			}
			return cmp.Compare(wallClock(x), wallClock(y))
		}
	case float64:
		if y, ok := b.(float64); ok {
			return cmp.Compare(x, y)
		}
	}
	return strings.Compare(fmt.Sprint(a), fmt.Sprint(b))
}

// deref returns the value v points to, when it is a pointer (as [Struct]'s values are),
// and nil (NULL) for a nil pointer.
func deref(v any) any {
	switch x := v.(type) { // the common key types without reflection
	case *int64:
		return elem(x)
	case *string:
		return elem(x)
	case *int:
		return elem(x)
	case *int32:
		return elem(x)
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return nil
		}
		return rv.Elem().Interface()
	}
	return v
}

// elem is *p, or nil for a nil p.
func elem[E any](p *E) any {
	if p == nil {
		return nil
	}
	return *p
}

// valueSize estimates the bytes a value takes in a COPY: a string's or a byte
// slice's length (of a named type too: json.RawMessage), the sum of an array's or a
// map's elements, what a driver.Valuer gives, and 12 for anything else (a number, a
// time, a struct encoded as JSON, which it does not measure).
func valueSize(v any) int {
	v = deref(v) // once: for the switch below and for reflection
	switch x := v.(type) {
	case string:
		return len(x) + 4
	case []byte:
		return len(x) + 4
	case nil:
		return 4
	case int64, int, int32, float64, bool, time.Time:
		return 12
	case driver.Valuer:
		if dv, err := x.Value(); err == nil {
			if _, again := dv.(driver.Valuer); !again {
				return valueSize(dv)
			}
		}
		return 12
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.String:
		return rv.Len() + 4
	case reflect.Slice, reflect.Array:
		if rv.Type().Elem().Kind() == reflect.Uint8 {
			return rv.Len() + 4
		}
		n := 4
		for i := range rv.Len() {
			n += valueSize(rv.Index(i).Interface())
		}
		return n
	case reflect.Map:
		n := 4
		for it := rv.MapRange(); it.Next(); {
			n += valueSize(it.Key().Interface()) + valueSize(it.Value().Interface())
		}
		return n
	}
	return 12
}
