package scenario

import (
	"encoding/binary"
	"errors"
)

// ErrNotAnID is IDCodec's error for a value that is not 8 bytes long.
var ErrNotAnID = errors.New("not an 8-byte id")

// IDCodec is a pipeline.Codec of an id as 8 big-endian bytes: the values of the records
// the Kafka tests produce.
type IDCodec[T ~int | ~int64] struct{}

// Marshal implements pipeline.Codec.
func (IDCodec[T]) Marshal(v T) ([]byte, error) {
	return binary.BigEndian.AppendUint64(nil, uint64(v)), nil
}

// Unmarshal implements pipeline.Codec.
func (IDCodec[T]) Unmarshal(data []byte, v *T) error {
	if len(data) != 8 {
		return ErrNotAnID
	}
	*v = T(binary.BigEndian.Uint64(data))
	return nil
}
