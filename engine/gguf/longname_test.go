package gguf

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

// TestLongKeyAndName: a key or a tensor name whose length field was
// damaged into a large value that the file still holds is refused with a
// message of a few hundred bytes (the name cut to 64 bytes, its length
// given); the key refused past the GGUF limit of 2^16-1 bytes. Before,
// the message quoted the whole 40 MB.
func TestLongKeyAndName(t *testing.T) {
	le := binary.LittleEndian
	str := func(b []byte, s string) []byte { return append(le.AppendUint64(b, uint64(len(s))), s...) }
	head := func(nt, nkv uint64) []byte {
		b := le.AppendUint32([]byte("GGUF"), 3)
		return le.AppendUint64(le.AppendUint64(b, nt), nkv)
	}
	long := strings.Repeat("k", 200_000)
	key := le.AppendUint32(str(head(0, 1), long), uint32(TypeUint32))
	key = le.AppendUint32(key, 7)
	name := str(head(1, 0), strings.Repeat("n", 200_000))
	name = le.AppendUint32(name, 1)
	name = le.AppendUint64(name, 32)
	name = le.AppendUint32(name, 0)
	name = le.AppendUint64(name, 0)
	for what, b := range map[string][]byte{"key": key, "name": name} {
		_, err := Parse(b)
		if !errors.Is(err, ErrMalformed) || len(err.Error()) > 400 || !strings.Contains(err.Error(), "(200000 bytes)") {
			t.Errorf("%s of 200,000 bytes: %d-byte error %.300q, want ErrMalformed, short, giving the length", what, len(err.Error()), err)
		}
	}
}
