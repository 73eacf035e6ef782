package expert

import (
	"math"
	"testing"
)

// TestFirstNonFinite: exactly the float32s with all 8 exponent bits set
// (±Inf, quiet and signaling NaNs of either sign) are found, at their index;
// the largest finite values, subnormals and zeros are not.
func TestFirstNonFinite(t *testing.T) {
	finite := []uint32{0, 0x80000000, 1, 0x807fffff, 0x00800000, 0x7f7fffff, 0xff7fffff, 0x3f800000}
	bad := []uint32{0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0x7fffffff, 0xffffffff}
	v := make([]float32, 0, len(finite))
	for _, b := range finite {
		v = append(v, math.Float32frombits(b))
	}
	if i := FirstNonFinite(v); i != -1 {
		t.Fatalf("finite values: index %d (%#08x)", i, finite[i])
	}
	if FirstNonFinite(nil) != -1 {
		t.Fatal("empty slice")
	}
	for _, b := range bad {
		for _, at := range []int{0, 3, len(v) - 1} {
			w := append([]float32(nil), v...)
			w[at] = math.Float32frombits(b)
			if i := FirstNonFinite(w); i != at {
				t.Errorf("%#08x at %d: found at %d", b, at, i)
			}
		}
	}
}

// BenchmarkFirstNonFinite: the cost of validating a RESULT of 64 rows of
// d = 2048 (512 KiB), bytes/s.
func BenchmarkFirstNonFinite(b *testing.B) {
	v := make([]float32, 64*2048)
	for i := range v {
		v[i] = float32(i%1000) * 0.001
	}
	b.SetBytes(int64(4 * len(v)))
	for b.Loop() {
		if FirstNonFinite(v) != -1 {
			b.Fatal("non-finite")
		}
	}
}
