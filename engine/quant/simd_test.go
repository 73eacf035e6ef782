package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// withGeneric runs f with the SIMD kernels switched off.
func withGeneric(f func()) {
	old := useSIMD
	useSIMD = false
	defer func() { useSIMD = old }()
	f()
}

func sameBits(a, b float32) bool {
	return math.Float32bits(a) == math.Float32bits(b) || (a != a && b != b)
}

// randomCodes fills b with random bytes, forcing some -128 codes.
func randomCodes(r *rand.Rand, b []byte) {
	for i := range b {
		b[i] = byte(r.Uint32())
		if r.IntN(50) == 0 {
			b[i] = 0x80
		}
	}
}

// TestSIMDMatchesGeneric holds the SIMD kernels (if this build has any) to
// the pure-Go ones: integer sums exactly, float lanes bit for bit, on
// random bytes (every code pattern, -128 included) and on real quantized
// rows, for block counts around the chunk and unroll sizes.
func TestSIMDMatchesGeneric(t *testing.T) {
	t.Logf("SIMD kernels: %s", simdName())
	r := rand.New(rand.NewPCG(5, 6))
	for _, nb := range []int{1, 2, 7, 63, 64, 65, 130} {
		w, a := make([]byte, 292*nb), make([]byte, 292*nb)
		randomCodes(r, w)
		randomCodes(r, a)
		for _, k := range []struct {
			name string
			f    func(w, a []byte, out []int32)
		}{{"q8_0", q8_0Sums}, {"q4_K", q4KSums}, {"q6_K", q6KSums}} {
			got, want := make([]int32, nb), make([]int32, nb)
			k.f(w, a, got)
			withGeneric(func() { k.f(w, a, want) })
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("%s nb=%d block %d: simd %d, generic %d", k.name, nb, i, got[i], want[i])
				}
			}
		}
	}
	// Float lanes: random magnitudes over a wide exponent range.
	for _, n := range []int{32, 64, 96, 1024, 4096 + 32} {
		a, b := make([]float32, n), make([]float32, n)
		for i := range a {
			a[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(40)-20))
			b[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(40)-20))
		}
		var got, want [32]float32
		dotF32Lanes(a, b, &got)
		withGeneric(func() { dotF32Lanes(a, b, &want) })
		if got != want {
			t.Fatalf("dotF32Lanes n=%d: simd %v, generic %v", n, got, want)
		}
		h1, h2 := make([]byte, 2*n), make([]byte, 2*n)
		for i := range n {
			binary.LittleEndian.PutUint16(h1[2*i:], uint16(r.Uint32())&0x7bff|uint16(r.Uint32())&0x8000)
			binary.LittleEndian.PutUint16(h2[2*i:], uint16(r.Uint32())&0x7bff|uint16(r.Uint32())&0x8000)
		}
		got, want = [32]float32{}, [32]float32{}
		dotF16Lanes(h1, h2, &got)
		withGeneric(func() { dotF16Lanes(h1, h2, &want) })
		for l := range got {
			if !sameBits(got[l], want[l]) {
				t.Fatalf("dotF16Lanes n=%d lane %d: simd %g, generic %g", n, l, got[l], want[l])
			}
		}
	}
	// Whole VecDot on quantized rows, every weight type.
	for _, typ := range weightTypes {
		n := 9 * QK_K
		wq, xc := quantRow(t, typ, randomRows(1, n)), convertRow(t, typ, randomRows(2, n))
		got := VecDot(typ, wq, xc, n)
		var want float32
		withGeneric(func() { want = VecDot(typ, wq, xc, n) })
		if !sameBits(got, want) {
			t.Errorf("%s VecDot: simd %g, generic %g", typ, got, want)
		}
	}
}
