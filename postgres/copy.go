package pgpipe

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The writer sends COPY's binary format itself, instead of through pgx's CopyFrom, for
// two reasons: it encodes each column with an encode plan it keeps for the column's Go
// type (pgx looks the plan up again for every value, which costs several times the
// encoding itself), and it knows which row a value that cannot be encoded belongs to.

// copyHeader starts a binary COPY stream: the signature, no flags, no extension.
var copyHeader = []byte("PGCOPY\n\377\r\n\000\000\000\000\000\000\000\000\000")

// encodeError is a value of row index, for column, that the driver could not encode.
type encodeError struct {
	index  int
	column string
	err    error
}

func (e *encodeError) Error() string { return e.err.Error() }
func (e *encodeError) Unwrap() error { return e.err }

// oidCache keeps the column types of a table, asked once per writer.
type oidCache struct {
	mu   sync.Mutex
	oids map[string][]uint32 // by table
}

// columnOIDs returns the type OIDs of table's columns, as the server describes them.
func (w *writerCore) columnOIDs(ctx context.Context, conn *pgx.Conn, table pgx.Identifier) ([]uint32, error) {
	key := table.Sanitize()
	w.oidc.mu.Lock()
	oids, ok := w.oidc.oids[key]
	w.oidc.mu.Unlock()
	if ok {
		return oids, nil
	}
	w.stats.roundTrips.Add(1)
	sd, err := conn.Prepare(ctx, "", fmt.Sprintf("SELECT %s FROM %s", quoteAll(w.columns), key))
	if err != nil {
		return nil, err
	}
	oids = make([]uint32, len(sd.Fields))
	for i, f := range sd.Fields {
		oids[i] = f.DataTypeOID
	}
	w.oidc.mu.Lock()
	if w.oidc.oids == nil {
		w.oidc.oids = map[string][]uint32{}
	}
	w.oidc.oids[key] = oids
	w.oidc.mu.Unlock()
	return oids, nil
}

// copyReader encodes rows into COPY's binary format as pgconn reads it (from a
// goroutine of pgconn's own).
type copyReader[T any] struct {
	rows  []T
	next  int
	cols  []string // the columns' names, for errors
	fill  func(*T, []any) []any
	m     *pgtype.Map
	oids  []uint32
	plans []columnPlan
	vals  []any
	// Struct mappings: the fields and, per column, a direct encoder (nil: through pgx).
	fields  []int
	ptr     bool
	direct  []fieldEncoder
	buf     []byte
	off     int
	started bool  // the header is out
	done    bool  // the trailer is out
	err     error // the mapping's failure or an encode error, also returned by Read
}

// columnPlan is the encode plan of one column for one Go type.
type columnPlan struct {
	t    reflect.Type
	plan pgtype.EncodePlan
}

// Read hands out whole buffers of len(p) bytes (but the last), so that each COPY data
// message is full: a short one after each full one would double the messages.
func (r *copyReader[T]) Read(p []byte) (int, error) {
	if len(r.buf)-r.off < len(p) && !r.done && r.err == nil {
		r.fillBuf(len(p))
	}
	if r.off == len(r.buf) {
		if r.err != nil {
			return 0, r.err
		}
		return 0, io.EOF
	}
	n := copy(p, r.buf[r.off:])
	r.off += n
	return n, nil
}

// fillBuf keeps the bytes not yet read and encodes rows after them until want bytes
// are ready, or the rows end.
func (r *copyReader[T]) fillBuf(want int) {
	r.buf = r.buf[:copy(r.buf, r.buf[r.off:])]
	r.off = 0
	if r.next == 0 && !r.started {
		r.buf = append(r.buf, copyHeader...)
		r.started = true
	}
	for len(r.buf) < want && r.next < len(r.rows) {
		mark := len(r.buf)
		var err error
		if r.buf, err = r.encodeRow(r.buf, r.next); err != nil {
			r.buf = r.buf[:mark] // send the rows before; fail after them
			r.err = err
			return
		}
		r.next++
	}
	if r.next == len(r.rows) {
		r.buf = binary.BigEndian.AppendUint16(r.buf, 0xffff) // the trailer
		r.done = true
	}
}

func (r *copyReader[T]) encodeRow(buf []byte, i int) (out []byte, err error) {
	defer func() {
		if v := recover(); v != nil {
			out, err = buf, fmt.Errorf("pgpipe: the row mapping panicked: %v", v)
		}
	}()
	if r.direct != nil {
		return r.encodeFields(buf, i)
	}
	r.vals = r.fill(&r.rows[i], r.vals)
	if len(r.vals) != len(r.oids) {
		return buf, fmt.Errorf("pgpipe: the row mapping returned %d values for %d columns", len(r.vals), len(r.oids))
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(r.vals)))
	for c, v := range r.vals {
		sp := len(buf)
		buf = binary.BigEndian.AppendUint32(buf, 0xffffffff) // NULL, unless a value follows
		if v == nil {
			continue
		}
		var enc []byte
		if t := reflect.TypeOf(v); t.Kind() == reflect.Pointer {
			enc, err = r.m.Encode(r.oids[c], pgtype.BinaryFormatCode, v, buf) // nil pointers and valuers
		} else {
			cp := &r.plans[c]
			if cp.t != t {
				cp.t, cp.plan = t, r.m.PlanEncode(r.oids[c], pgtype.BinaryFormatCode, v)
			}
			if cp.plan == nil {
				enc, err = r.m.Encode(r.oids[c], pgtype.BinaryFormatCode, v, buf) // its error says why
			} else {
				enc, err = cp.plan.Encode(v, buf)
			}
		}
		if err != nil {
			enc, err = r.fromText(c, v, buf, err)
		}
		if err != nil {
			return buf, r.encodeError(i, c, err)
		}
		buf = placed(buf, enc, sp)
	}
	return buf, nil
}

// placed ends a value whose encoding into buf began at sp with a NULL: enc, when not
// nil, is buf with the value appended, and the value's length replaces the NULL.
func placed(buf, enc []byte, sp int) []byte {
	if enc == nil {
		return buf
	}
	binary.BigEndian.PutUint32(enc[sp:], uint32(len(enc)-sp-4))
	return enc
}

// encodeError is the error of row i's value for column c.
func (r *copyReader[T]) encodeError(i, c int, err error) *encodeError {
	name := strconv.Itoa(c)
	if c < len(r.cols) {
		name = r.cols[c]
	}
	return &encodeError{index: i, column: name, err: fmt.Errorf("column %q: %w", name, err)}
}

// encodeValue encodes v for column c, falling back to text for a string.
func (r *copyReader[T]) encodeValue(c int, v any, buf []byte) ([]byte, error) {
	enc, err := r.m.Encode(r.oids[c], pgtype.BinaryFormatCode, v, buf)
	if err != nil {
		return r.fromText(c, v, buf, err)
	}
	return enc, nil
}

// fromText encodes a string value for a column of another type (a number, a date) as
// PostgreSQL would read it in text: parsed by the column type's text decoder, then
// encoded in binary. Other values keep their encoding error, err.
func (r *copyReader[T]) fromText(c int, v any, buf []byte, err error) ([]byte, error) {
	s, ok := v.(string)
	if !ok {
		return nil, err
	}
	var parsed any
	if perr := r.m.Scan(r.oids[c], pgtype.TextFormatCode, []byte(s), &parsed); perr != nil {
		return nil, fmt.Errorf("%q is not a value of the column's type: %w", s, perr)
	}
	return r.m.Encode(r.oids[c], pgtype.BinaryFormatCode, parsed, buf)
}

// encodeFields encodes row i of a struct mapping: the direct encoders read the fields
// in place; the other fields go through pgx's plans.
func (r *copyReader[T]) encodeFields(buf []byte, i int) ([]byte, error) {
	rv := reflect.ValueOf(&r.rows[i]).Elem()
	if r.ptr {
		rv = rv.Elem()
	}
	buf = binary.BigEndian.AppendUint16(buf, uint16(len(r.fields)))
	for c, fi := range r.fields {
		f := rv.Field(fi)
		sp := len(buf)
		buf = binary.BigEndian.AppendUint32(buf, 0xffffffff) // NULL, unless a value follows
		var (
			enc []byte
			err error
		)
		if d := r.direct[c]; d != nil {
			enc, err = d(f, buf)
		} else if f.Kind() == reflect.String {
			enc, err = r.encodeValue(c, f.Interface(), buf)
		} else {
			v := f.Interface()
			cp := &r.plans[c]
			if cp.plan == nil && cp.t == nil {
				cp.t, cp.plan = f.Type(), r.m.PlanEncode(r.oids[c], pgtype.BinaryFormatCode, v)
			}
			if cp.plan == nil || f.Kind() == reflect.Pointer || f.Kind() == reflect.Interface {
				enc, err = r.m.Encode(r.oids[c], pgtype.BinaryFormatCode, v, buf)
			} else {
				enc, err = cp.plan.Encode(v, buf)
			}
		}
		if err != nil {
			return buf, r.encodeError(i, c, err)
		}
		buf = placed(buf, enc, sp)
	}
	return buf, nil
}

// fieldEncoder appends a field's value in binary format to buf; nil means NULL.
type fieldEncoder func(f reflect.Value, buf []byte) ([]byte, error)

// directEncoders returns, per field, an encoder that needs no boxing and no plan, for
// the exact builtin Go types (a named type may have encoding methods of its own) going
// into columns of the matching type; nil where pgx must encode.
func directEncoders(t reflect.Type, fields []int, oids []uint32) []fieldEncoder {
	encs := make([]fieldEncoder, len(fields))
	for c, fi := range fields {
		ft := t.Field(fi).Type
		switch oid := oids[c]; {
		case isInt(ft) && oid == pgtype.Int8OID:
			encs[c] = func(f reflect.Value, buf []byte) ([]byte, error) {
				return binary.BigEndian.AppendUint64(buf, uint64(f.Int())), nil
			}
		case isInt(ft) && oid == pgtype.Int4OID:
			encs[c] = intEncoder(math.MinInt32, math.MaxInt32, "int4", 4)
		case isInt(ft) && oid == pgtype.Int2OID:
			encs[c] = intEncoder(math.MinInt16, math.MaxInt16, "int2", 2)
		case ft == reflect.TypeFor[string]() && (oid == pgtype.TextOID || oid == pgtype.VarcharOID):
			encs[c] = func(f reflect.Value, buf []byte) ([]byte, error) { return append(buf, f.String()...), nil }
		case ft == reflect.TypeFor[float64]() && oid == pgtype.Float8OID:
			encs[c] = func(f reflect.Value, buf []byte) ([]byte, error) {
				return binary.BigEndian.AppendUint64(buf, math.Float64bits(f.Float())), nil
			}
		case ft == reflect.TypeFor[float32]() && oid == pgtype.Float4OID:
			encs[c] = func(f reflect.Value, buf []byte) ([]byte, error) {
				return binary.BigEndian.AppendUint32(buf, math.Float32bits(float32(f.Float()))), nil
			}
		case ft == reflect.TypeFor[bool]() && oid == pgtype.BoolOID:
			encs[c] = func(f reflect.Value, buf []byte) ([]byte, error) {
				if f.Bool() {
					return append(buf, 1), nil
				}
				return append(buf, 0), nil
			}
		case ft == reflect.TypeFor[[]byte]() && oid == pgtype.ByteaOID:
			encs[c] = func(f reflect.Value, buf []byte) ([]byte, error) {
				if f.IsNil() {
					return nil, nil
				}
				return append(buf, f.Bytes()...), nil
			}
		}
	}
	return encs
}

func isInt(t reflect.Type) bool {
	switch t {
	case reflect.TypeFor[int64](), reflect.TypeFor[int](), reflect.TypeFor[int32](), reflect.TypeFor[int16](), reflect.TypeFor[int8]():
		return true
	}
	return false
}

// intEncoder encodes an integer field into a column of size bytes, checking its range.
func intEncoder(lo, hi int64, name string, size int) fieldEncoder {
	return func(f reflect.Value, buf []byte) ([]byte, error) {
		n := f.Int()
		if n < lo || n > hi {
			return nil, fmt.Errorf("%d is out of range for %s", n, name)
		}
		if size == 4 {
			return binary.BigEndian.AppendUint32(buf, uint32(int32(n))), nil
		}
		return binary.BigEndian.AppendUint16(buf, uint16(int16(n))), nil
	}
}

// copyLine returns the row of a COPY that PostgreSQL's error context names ("COPY t,
// line 17, column x: ..."), 0-based, or -1.
func copyLine(where string) int {
	if !strings.HasPrefix(where, "COPY ") {
		return -1
	}
	_, rest, ok := strings.Cut(where, ", line ")
	if !ok {
		return -1
	}
	end := strings.IndexFunc(rest, func(r rune) bool { return r < '0' || r > '9' })
	if end < 0 {
		end = len(rest)
	}
	n, err := strconv.Atoi(rest[:end])
	if err != nil || n < 1 {
		return -1
	}
	return n - 1
}
