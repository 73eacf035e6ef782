package quant

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

func f32b(bits uint32) float32 { return math.Float32frombits(bits) }

func TestFP32ToFP16Cases(t *testing.T) {
	cases := []struct {
		f    float32
		want uint16
	}{
		{1, 0x3c00},
		{-2, 0xc000},
		{0.5, 0x3800},
		{65504, 0x7bff},
		{65519.99, 0x7bff},                       // below the halfway point to 2^16
		{65520, 0x7c00},                          // tie between 65504 (odd) and 2^16: even -> inf
		{1e6, 0x7c00},                            // overflow
		{f32b(0x3f801000), 0x3c00},               // 1+2^-11: tie, 0x3c00 is even
		{f32b(0x3f803000), 0x3c02},               // 1+3*2^-11: tie, rounds up to even 0x3c02
		{f32b(0x3f801001), 0x3c01},               // just above the tie
		{float32(math.Ldexp(1, -14)), 0x0400},    // smallest normal
		{float32(math.Ldexp(1, -24)), 0x0001},    // smallest subnormal
		{float32(math.Ldexp(1, -25)), 0x0000},    // tie between 0 and 2^-24: even -> 0
		{float32(math.Ldexp(3, -25)), 0x0002},    // 1.5 units: tie -> 2
		{float32(math.Ldexp(5, -25)), 0x0002},    // 2.5 units: tie -> 2
		{float32(math.Ldexp(1023, -24)), 0x03ff}, // largest subnormal
		{float32(math.Ldexp(2047, -25)), 0x0400}, // 1023.5 units: tie -> 1024 = smallest normal
		{float32(math.Ldexp(1, -26)), 0x0000},
		{f32b(0x00000001), 0x0000}, // float32 subnormal
		{f32b(0x80000000), 0x8000}, // -0
		{float32(math.Inf(1)), 0x7c00},
		{float32(math.Inf(-1)), 0xfc00},
		{f32b(0x7fc00000), 0x7e00}, // quiet NaN
		{f32b(0x7f800001), 0x7e00}, // signalling NaN, payload below the kept bits: quieted
		{f32b(0xffa02000), 0xff01}, // NaN keeps sign and top payload bits
	}
	for _, c := range cases {
		if got := FP32ToFP16(c.f); got != c.want {
			t.Errorf("FP32ToFP16(%g = %#08x) = %#04x, want %#04x", c.f, math.Float32bits(c.f), got, c.want)
		}
	}
}

func TestFP16ToFP32Cases(t *testing.T) {
	cases := []struct {
		h    uint16
		want float64
	}{
		{0x3c00, 1}, {0xc000, -2}, {0x7bff, 65504}, {0x0001, math.Ldexp(1, -24)},
		{0x03ff, math.Ldexp(1023, -24)}, {0x0400, math.Ldexp(1, -14)}, {0x8000, 0},
		{0x7c00, math.Inf(1)}, {0xfc00, math.Inf(-1)}, {0x3555, 0.333251953125},
	}
	for _, c := range cases {
		if got := FP16ToFP32(c.h); float64(got) != c.want {
			t.Errorf("FP16ToFP32(%#04x) = %g, want %g", c.h, got, c.want)
		}
	}
	if got := FP16ToFP32(0x8000); !math.Signbit(float64(got)) {
		t.Error("FP16ToFP32(0x8000) lost the sign of -0")
	}
	for _, h := range []uint16{0x7c01, 0x7e00, 0xffff} {
		if got := FP16ToFP32(h); !math.IsNaN(float64(got)) {
			t.Errorf("FP16ToFP32(%#04x) = %g, want NaN", h, got)
		}
	}
	// Every non-NaN half survives the round trip.
	for i := range 1 << 16 {
		h := uint16(i)
		if h&0x7c00 == 0x7c00 && h&0x3ff != 0 {
			continue
		}
		if got := FP32ToFP16(FP16ToFP32(h)); got != h {
			t.Fatalf("round trip %#04x -> %#04x", h, got)
		}
	}
}

// TestFP32ToFP16Nearest checks round-to-nearest-even as a property: for
// random finite float32 in the half range, no neighbouring half is closer,
// and on an exact tie the chosen half is even.
func TestFP32ToFP16Nearest(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 200000 {
		f := float32(math.Ldexp(r.Float64()*2-1, r.IntN(42)-26))
		h := FP32ToFP16(f)
		if h&0x7fff >= 0x7c00 {
			t.Fatalf("%g -> %#04x not finite", f, h)
		}
		got := float64(FP16ToFP32(h))
		err := math.Abs(float64(f) - got)
		for _, nb := range []uint16{h + 1, h - 1} {
			if nb&0x7fff >= 0x7c00 || nb&0x8000 != h&0x8000 {
				continue
			}
			e2 := math.Abs(float64(f) - float64(FP16ToFP32(nb)))
			if e2 < err || (e2 == err && h&1 == 1) {
				t.Fatalf("%g (%#08x) -> %#04x (err %g), neighbour %#04x err %g", f, math.Float32bits(f), h, err, nb, e2)
			}
		}
	}
}

func TestBF16(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80},
		{0x3f808000, 0x3f80}, // tie, low even
		{0x3f818000, 0x3f82}, // tie, odd -> up
		{0x3f808001, 0x3f81},
		{0x3f807fff, 0x3f80},
		{0x7f7fffff, 0x7f80}, // max float rounds to inf
		{0x7f800000, 0x7f80},
		{0xff800000, 0xff80},
		{0x7f800001, 0x7fc0}, // NaN: high bits | 64
		{0xff812345, 0xffc1},
		{0x00008000, 0x0000}, // subnormal tie -> even (kept, not flushed)
		{0x00018000, 0x0002},
		{0x80010000, 0x8001},
	}
	for _, c := range cases {
		if got := FP32ToBF16(f32b(c.in)); got != c.want {
			t.Errorf("FP32ToBF16(%#08x) = %#04x, want %#04x", c.in, got, c.want)
		}
	}
	if got := BF16ToFP32(0xc0a0); got != -5 {
		t.Errorf("BF16ToFP32(0xc0a0) = %g, want -5", got)
	}
}

func TestConvertQ8_0(t *testing.T) {
	// amax 254 -> d = fp16(2), multiplier 127/254 = 0.5: ties round to even.
	x := make([]float32, 32)
	in := []float32{1, 3, 5, -5, 7, -7, 254, -253, 2, 0.9, 9, 11}
	want := []int8{0, 2, 2, -2, 4, -4, 127, -126, 1, 0, 4, 6}
	copy(x, in)
	dst := make([]byte, 34)
	if err := ConvertActivation(Q4_0, x, dst); err != nil {
		t.Fatal(err)
	}
	if d := binary.LittleEndian.Uint16(dst); d != 0x4000 {
		t.Errorf("d = %#04x, want 0x4000 (2.0)", d)
	}
	for i, w := range want {
		if got := int8(dst[2+i]); got != w {
			t.Errorf("q[%d] (x=%g) = %d, want %d", i, in[i], got, w)
		}
	}
	// Q8_1 adds s = fp16(d * sum q) with the float32 d = 254/127 = 2.
	dst1 := make([]byte, 36)
	if err := ConvertActivation(Q5_1, x, dst1); err != nil {
		t.Fatal(err)
	}
	sum := 0
	for _, w := range want {
		sum += int(w)
	}
	if s := binary.LittleEndian.Uint16(dst1[2:]); s != FP32ToFP16(float32(2*sum)) {
		t.Errorf("q8_1 s = %#04x, want fp16(%d)", s, 2*sum)
	}
	// The scale is fp16(amax/127) while codes use the float32 127/amax:
	// amax = 100 gives d = fp16(0.787401..) = 0x3a4d (0.787597..).
	x2 := make([]float32, 32)
	x2[0], x2[1] = 100, 50.2
	if err := ConvertActivation(Q8_0, x2, dst); err != nil {
		t.Fatal(err)
	}
	if d := binary.LittleEndian.Uint16(dst); d != 0x3a4d {
		t.Errorf("d(100/127) = %#04x, want 0x3a4d", d)
	}
	if q := int8(dst[3]); q != 64 { // 50.2*1.27 = 63.754 -> 64
		t.Errorf("q(50.2) = %d, want 64", q)
	}
	// All zero block: d = 0, codes 0.
	if err := ConvertActivation(Q8_0, make([]float32, 32), dst); err != nil {
		t.Fatal(err)
	}
	for i, b := range dst {
		if b != 0 {
			t.Fatalf("zero block byte %d = %d", i, b)
		}
	}
}

func TestConvertQ8K(t *testing.T) {
	x := make([]float32, QK_K)
	x[0], x[1], x[2], x[3], x[17] = -4, 2, 4, 0.1, -2
	dst := make([]byte, 292)
	if err := ConvertActivation(Q4_K, x, dst); err != nil {
		t.Fatal(err)
	}
	// m = -4 (first of largest |x|), s = -127/m = 31.75, d = 1/31.75.
	if d := math.Float32frombits(binary.LittleEndian.Uint32(dst)); d != float32(1)/31.75 {
		t.Errorf("d = %g, want 1/31.75", d)
	}
	// 2*31.75 = 63.5 -> 64 (even); 0.1*31.75 = 3.175 -> 3.
	for i, w := range map[int]int8{0: -127, 1: 64, 2: 127, 3: 3, 17: -64, 4: 0} {
		if got := int8(dst[4+i]); got != w {
			t.Errorf("q[%d] = %d, want %d", i, got, w)
		}
	}
	b0 := int16(binary.LittleEndian.Uint16(dst[4+QK_K:]))
	b1 := int16(binary.LittleEndian.Uint16(dst[4+QK_K+2:]))
	if b0 != -127+64+127+3 || b1 != -64 {
		t.Errorf("bsums = %d, %d", b0, b1)
	}
	// +4 first: m = +4, every code flips sign (-63.5 -> -64, even).
	x[0], x[2] = 4, -4
	if err := ConvertActivation(Q6_K, x, dst); err != nil {
		t.Fatal(err)
	}
	if d := math.Float32frombits(binary.LittleEndian.Uint32(dst)); d != float32(1)/-31.75 {
		t.Errorf("d = %g, want -1/31.75", d)
	}
	if q := int8(dst[5]); q != -64 {
		t.Errorf("q[1] = %d, want -64", q)
	}
}

func TestConvertFloat(t *testing.T) {
	x := []float32{1, f32b(0x3f801000), 65520, -0.1}
	dst := make([]byte, 8)
	if err := ConvertActivation(F16, x, dst); err != nil {
		t.Fatal(err)
	}
	for i, w := range []uint16{0x3c00, 0x3c00, 0x7c00, FP32ToFP16(-0.1)} {
		if got := binary.LittleEndian.Uint16(dst[2*i:]); got != w {
			t.Errorf("F16[%d] = %#04x, want %#04x", i, got, w)
		}
	}
	if err := ConvertActivation(BF16, x, dst); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint16(dst[2:]); got != 0x3f80 {
		t.Errorf("BF16[1] = %#04x", got)
	}
	d32 := make([]byte, 16)
	if err := ConvertActivation(F32, x, d32); err != nil {
		t.Fatal(err)
	}
	if math.Float32frombits(binary.LittleEndian.Uint32(d32[12:])) != -0.1 {
		t.Error("F32 copy")
	}
}

func TestErrors(t *testing.T) {
	if _, err := ActivationBytes(Type(99), 32); !errors.Is(err, ErrUnknownType) {
		t.Errorf("unknown type: %v", err)
	}
	if _, err := ActivationBytes(Q2_K, 256); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Q2_K: %v", err)
	}
	if _, err := ActivationBytes(Q4_K, 100); !errors.Is(err, ErrSize) {
		t.Errorf("Q4_K 100: %v", err)
	}
	if err := Dequantize(Q8_0, make([]byte, 33), make([]float32, 32)); !errors.Is(err, ErrSize) {
		t.Errorf("short Q8_0: %v", err)
	}
	if err := Dequantize(Q3_K, make([]byte, 110), make([]float32, 256)); !errors.Is(err, ErrUnsupported) {
		t.Errorf("Q3_K: %v", err)
	}
	if err := Quantize(Q4_0, make([]float32, 31), make([]byte, 18)); !errors.Is(err, ErrSize) {
		t.Errorf("Quantize 31: %v", err)
	}
	if err := ConvertActivation(Q8_0, make([]float32, 32), make([]byte, 36)); !errors.Is(err, ErrSize) {
		t.Errorf("Convert wrong dst: %v", err)
	}
	if _, err := CheckedVecDot(Q8_0, make([]byte, 34), make([]byte, 33), 32); !errors.Is(err, ErrSize) {
		t.Errorf("VecDot short a: %v", err)
	}
	if v := VecDot(Q8_0, make([]byte, 34), make([]byte, 33), 32); !math.IsNaN(float64(v)) {
		t.Errorf("VecDot on bad input = %g, want NaN", v)
	}
	if _, err := F32.RowBytes(math.MaxInt); !errors.Is(err, ErrSize) {
		t.Errorf("RowBytes overflow: %v", err)
	}
	if err := MatMul(Q8_0, make([]byte, 34), 1, 32, make([]float32, 32), 1, make([]float32, 2), 1); !errors.Is(err, ErrSize) {
		t.Errorf("MatMul wrong y: %v", err)
	}
	if tt, err := ParseType("q4_k"); err != nil || tt != Q4_K {
		t.Errorf("ParseType(q4_k) = %v, %v", tt, err)
	}
	if _, err := ParseType("Q9"); !errors.Is(err, ErrUnknownType) {
		t.Errorf("ParseType(Q9): %v", err)
	}
}

// TestConvertProperty re-derives every Q8_0 and Q8_K code of random blocks
// from the ACTIVATIONS.md formulas written independently (float64 rounding
// of the explicitly rounded float32 product), across scales from 1e-6 to
// 1e6.
func TestConvertProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 9))
	for it := range 200 {
		x := make([]float32, QK_K)
		scale := math.Pow(10, float64(it%13-6))
		for i := range x {
			x[i] = float32(r.NormFloat64() * scale)
		}
		q8 := make([]byte, 8*34)
		qk := make([]byte, 292)
		if err := ConvertActivation(Q8_0, x, q8); err != nil {
			t.Fatal(err)
		}
		if err := ConvertActivation(Q4_K, x, qk); err != nil {
			t.Fatal(err)
		}
		for b := range 8 {
			var amax float32
			for _, v := range x[32*b : 32*b+32] {
				amax = max(amax, float32(math.Abs(float64(v))))
			}
			if d := binary.LittleEndian.Uint16(q8[34*b:]); d != FP32ToFP16(amax/127) {
				t.Fatalf("q8_0 block %d: d %#04x", b, d)
			}
			id := float32(127) / amax
			for j, v := range x[32*b : 32*b+32] {
				p := float32(v * id)
				if want := int8(math.RoundToEven(float64(p))); int8(q8[34*b+2+j]) != want {
					t.Fatalf("q8_0 x=%g: code %d, want %d", v, int8(q8[34*b+2+j]), want)
				}
			}
		}
		var m, amax float32
		for _, v := range x {
			if a := float32(math.Abs(float64(v))); a > amax {
				amax, m = a, v
			}
		}
		iscale := -127 / m
		if d := math.Float32frombits(binary.LittleEndian.Uint32(qk)); d != 1/iscale {
			t.Fatalf("q8_K d = %g, want %g", d, 1/iscale)
		}
		for j, v := range x {
			p := float32(iscale * v)
			want := int8(min(127, math.RoundToEven(float64(p))))
			if int8(qk[4+j]) != want {
				t.Fatalf("q8_K x=%g: code %d, want %d", v, int8(qk[4+j]), want)
			}
		}
	}
}

// TestConvertQ8KRoundedProduct builds activations whose float32 product
// s*x is exactly k+0.5 while the exact product is not: ggml rounds the
// product to float32 first, then rounds half to even. A compiler fusing the
// multiply into nearest_int's magic add (FMA on arm64) would round the
// exact product instead and get k or k+1 by its sign.
func TestConvertQ8KRoundedProduct(t *testing.T) {
	const m = -3 // s = -127/m = 42.333332
	s := float32(-127) / float32(m)
	x := make([]float32, QK_K)
	x[0] = m
	want := map[int]int8{0: -127}
	n := 1
	for k := 0; k < 127 && n < QK_K; k++ {
		v0 := float32((float64(k) + 0.5) / float64(s))
		for d := -4; d <= 4 && n < QK_K; d++ {
			v := math.Float32frombits(uint32(int32(math.Float32bits(v0)) + int32(d)))
			p := v * s
			if float64(p) == float64(k)+0.5 && float64(v)*float64(s) != float64(k)+0.5 {
				x[n] = v
				want[n] = int8(k + k&1) // tie to even
				n++
			}
		}
	}
	if n < 20 {
		t.Fatalf("found only %d tie cases", n-1)
	}
	dst := make([]byte, 292)
	if err := ConvertActivation(Q6_K, x, dst); err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		if got := int8(dst[4+i]); got != w {
			t.Errorf("x=%.9g (s*x rounds to %g): code %d, want %d", x[i], x[i]*s, got, w)
		}
	}
}

// TestConvertQ8KKernel holds ConvertActivation's Q8_K conversion on each
// SIMD path (the AVX-512 kernel where there is one) to quantizeQ8KBlock,
// byte for byte, over rows of several blocks: random values across
// scales, ties of |x| (+a and -a: the first one sets the sign), zero and
// negative-zero blocks, infinities, subnormals, and NaN blocks between
// others (the kernel stops before them and the Go code converts them).
func TestConvertQ8KKernel(t *testing.T) { eachSIMDPath(t, testConvertQ8KKernel) }

func testConvertQ8KKernel(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	const nb = 6
	for trial := range 200 {
		x := make([]float32, nb*QK_K)
		for b := range nb {
			blk := x[b*QK_K : (b+1)*QK_K]
			scale := float32(math.Pow(10, r.Float64()*14-7))
			for i := range blk {
				blk[i] = float32(r.NormFloat64()) * scale
			}
			switch (trial + b) % 9 {
			case 1: // a tie of |x|, the negative one first or second
				i, j := r.IntN(QK_K), r.IntN(QK_K)
				blk[i], blk[j] = 1e9, 1e9
				if r.IntN(2) == 0 {
					blk[min(i, j)] = -1e9
				} else {
					blk[max(i, j)] = -1e9
				}
			case 2:
				clear(blk)
			case 3:
				for i := range blk {
					blk[i] = float32(math.Copysign(0, -1))
				}
			case 4:
				blk[r.IntN(QK_K)] = float32(math.Inf(1 - 2*r.IntN(2)))
			case 5:
				blk[r.IntN(QK_K)] = float32(math.NaN())
			case 6:
				for i := range blk {
					blk[i] = math.Float32frombits(uint32(r.IntN(1 << 23))) // subnormals
				}
			case 7: // every code at the limits
				for i := range blk {
					blk[i] = float32(1 - 2*(i&1))
				}
			}
		}
		got, want := make([]byte, nb*292), make([]byte, nb*292)
		for i := range got {
			got[i], want[i] = 0xa5, 0xa5 // every byte must be written
		}
		if err := ConvertActivation(Q4_K, x, got); err != nil {
			t.Fatal(err)
		}
		for b := range nb {
			quantizeQ8KBlock(x[b*QK_K:(b+1)*QK_K], want[b*292:(b+1)*292])
		}
		if !bytes.Equal(got, want) {
			for i := range got {
				if got[i] != want[i] {
					t.Fatalf("trial %d: byte %d (block %d, offset %d) = %#x, want %#x", trial, i, i/292, i%292, got[i], want[i])
				}
			}
		}
	}
}

// BenchmarkConvertQ8K converts one 2048-float row (8 blocks, a model
// row of the 35B shape) to Q8_K per SIMD path.
func BenchmarkConvertQ8K(b *testing.B) {
	x := randomRows(51, 2048)
	dst := make([]byte, 8*292)
	for _, p := range simdPaths() {
		b.Run(p, func(b *testing.B) {
			old, _ := SetSIMDPath(p)
			defer SetSIMDPath(old)
			for b.Loop() {
				if err := ConvertActivation(Q4_K, x, dst); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
