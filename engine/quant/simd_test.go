package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

// eachSIMDPath runs test once per SIMD kernel path of this CPU (a subtest
// each; "none" alone when there is none), restoring the path in use.
func eachSIMDPath(t *testing.T, test func(t *testing.T)) {
	for _, p := range simdPaths() {
		if p == "none" && len(simdPaths()) > 1 {
			continue
		}
		t.Run(p, func(t *testing.T) {
			old, err := SetSIMDPath(p)
			if err != nil {
				t.Fatal(err)
			}
			defer SetSIMDPath(old)
			test(t)
		})
	}
}

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
func TestSIMDMatchesGeneric(t *testing.T) { eachSIMDPath(t, testSIMDMatchesGeneric) }

func testSIMDMatchesGeneric(t *testing.T) {
	t.Logf("SIMD kernels: %s", simdName())
	r := rand.New(rand.NewPCG(5, 6))
	kernels := []struct {
		name   string
		wb, ab int // block bytes of weight and activation
		f      func(w, a []byte, nb int) float32
	}{
		{"q8_0", 34, 34, q8_0Dot},
		{"q4_K", 144, 292, q4KDot},
		{"q5_K", 176, 292, q5KDot},
		{"q6_K", 210, 292, q6KDot},
		{"q4_0", 18, 34, q4_0Dot},
		{"q5_0", 22, 34, q5_0Dot},
		{"q4_1", 20, 36, q4_1Dot},
		{"q5_1", 24, 36, q5_1Dot},
	}
	for _, nb := range []int{1, 2, 7, 63, 64, 65, 130} {
		for _, sane := range []bool{true, false} {
			w, a := make([]byte, 292*nb), make([]byte, 292*nb)
			randomCodes(r, w)
			randomCodes(r, a)
			got, want := make([]int32, nb), make([]int32, nb)
			q8_0Sums(w, a, got)
			withGeneric(func() { genericQ8_0Sums(w, a, want) })
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("q8_0Sums nb=%d block %d: %d, generic %d", nb, i, got[i], want[i])
				}
			}
			for _, k := range kernels {
				if sane { // finite scales, so the float results compare exactly
					saneScales(r, w, a, k.wb, k.ab, nb)
				}
				g := k.f(w, a, nb)
				var want float32
				withGeneric(func() { want = k.f(w, a, nb) })
				if !sameBits(g, want) {
					t.Fatalf("%s nb=%d sane=%v: simd %g, generic %g", k.name, nb, sane, g, want)
				}
			}
		}
	}
	// Multi-row kernels: four activation rows against one weight row must
	// give each row's single-row bits.
	for _, typ := range []Type{Q4_K, Q6_K, Q8_0, Q5_K} {
		for _, nb := range []int{1, 3, 8} {
			n := nb * QK_K
			rb, _ := typ.RowBytes(n)
			ab, _ := ActivationBytes(typ, n)
			w, a := make([]byte, rb), make([]byte, 4*ab)
			randomCodes(r, w)
			randomCodes(r, a)
			if typ != Q8_0 {
				for j := range 4 {
					saneScales(r, w, a[j*ab:], typ.BlockBytes(), 292, nb)
				}
			}
			var out [4]float32
			if !vecDot4(typ, w, a, ab, n, &out) {
				continue
			}
			for j := range 4 {
				var want float32
				withGeneric(func() { want = vecDot(typ, w, a[j*ab:(j+1)*ab], n) })
				if !sameBits(out[j], want) {
					t.Fatalf("%s vecDot4 nb=%d row %d: %g, generic %g", typ, nb, j, out[j], want)
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
	for _, n := range []int{64, 4096 + 32} {
		h1, h2 := make([]byte, 2*n), make([]byte, 2*n)
		randomCodes(r, h1)
		randomCodes(r, h2)
		var got, want [32]float32
		dotBF16Lanes(h1, h2, &got)
		withGeneric(func() { dotBF16Lanes(h1, h2, &want) })
		for l := range got {
			if !sameBits(got[l], want[l]) {
				t.Fatalf("dotBF16Lanes n=%d lane %d: simd %g, generic %g", n, l, got[l], want[l])
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

// saneScales overwrites the float scales of nb weight blocks (bytes wb) and
// activation blocks (ab) with random finite values: fp16 d and dmin/m of
// the weight at 0 and 2 (Q4_0/Q5_0/Q8_0 blocks then get their first code
// bytes overwritten, harmless), or d at 208 for Q6_K; fp16 d (and s) at 0
// (and 2) for Q8_0 (Q8_1) activations, float32 d at 0 for Q8_K.
func saneScales(r *rand.Rand, w, a []byte, wb, ab, nb int) {
	f16 := func() uint16 { return FP32ToFP16(float32(math.Ldexp(r.Float64()+0.5, r.IntN(12)-10))) }
	for b := range nb {
		x, y := w[wb*b:], a[ab*b:]
		if wb == 210 {
			binary.LittleEndian.PutUint16(x[208:], f16())
		} else {
			binary.LittleEndian.PutUint16(x, f16())
			binary.LittleEndian.PutUint16(x[2:], f16())
		}
		switch ab {
		case 34:
			binary.LittleEndian.PutUint16(y, f16())
		case 36:
			binary.LittleEndian.PutUint16(y, f16())
			binary.LittleEndian.PutUint16(y[2:], f16())
		default:
			binary.LittleEndian.PutUint32(y, math.Float32bits(float32(r.NormFloat64()/100)))
		}
	}
}
