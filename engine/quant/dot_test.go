package quant

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
)

var weightTypes = []Type{F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K}

func TestDequantizeHandQ8_0(t *testing.T) {
	b := make([]byte, 34)
	binary.LittleEndian.PutUint16(b, 0x3800) // d = 0.5
	for j := range 32 {
		b[2+j] = byte(int8(j*8 - 128))
	}
	y := make([]float32, 32)
	if err := Dequantize(Q8_0, b, y); err != nil {
		t.Fatal(err)
	}
	for j := range 32 {
		if want := float32(j*8-128) / 2; y[j] != want {
			t.Errorf("y[%d] = %g, want %g", j, y[j], want)
		}
	}
}

func TestDequantizeHandQ4_0Q5_0(t *testing.T) {
	b := make([]byte, 18)
	binary.LittleEndian.PutUint16(b, 0x3400) // 0.25
	b[2], b[17] = 0x1f, 0x80                 // x0 = 15-8, x16 = 1-8; x15 = 0-8, x31 = 8-8
	y := make([]float32, 32)
	if err := Dequantize(Q4_0, b, y); err != nil {
		t.Fatal(err)
	}
	if y[0] != 1.75 || y[16] != -1.75 || y[15] != -2 || y[31] != 0 || y[1] != -2 {
		t.Errorf("Q4_0: %v", y)
	}
	b5 := make([]byte, 22)
	binary.LittleEndian.PutUint16(b5, 0x3c00)         // 1
	binary.LittleEndian.PutUint32(b5[2:], 1<<3|1<<20) // high bit of x3 and x20
	b5[6+3] = 0x02                                    // x3 low = 2, x19 low = 0
	b5[6+4] = 0x50                                    // x20 low = 5
	if err := Dequantize(Q5_0, b5, y); err != nil {
		t.Fatal(err)
	}
	if y[3] != 2 || y[20] != 5 || y[19] != -16 || y[0] != -16 {
		t.Errorf("Q5_0: x3=%g x20=%g x19=%g x0=%g", y[3], y[20], y[19], y[0])
	}
}

// TestDequantizeHandQ4_K packs a Q4_K block from the ggml-common.h layout
// description (scales[0..3] = sc0-3 | (sc4-7 >> 4) << 6, scales[4..7] =
// m0-3 | (m4-7 >> 4) << 6, scales[8..11] = sc4-7 & 15 | (m4-7 & 15) << 4;
// qs: 32 bytes per 64 elements, low nibbles first) and checks
// y = d*sc*q - dmin*m.
func TestDequantizeHandQ4_K(t *testing.T) {
	sc := [8]uint8{1, 2, 3, 4, 17, 33, 63, 48}
	mn := [8]uint8{5, 6, 7, 8, 20, 40, 0, 63}
	b := make([]byte, 144)
	binary.LittleEndian.PutUint16(b, 0x3c00)     // d = 1
	binary.LittleEndian.PutUint16(b[2:], 0x3800) // dmin = 0.5
	for j := range 4 {
		b[4+j] = sc[j] | (sc[j+4]>>4)<<6
		b[8+j] = mn[j] | (mn[j+4]>>4)<<6
		b[12+j] = sc[j+4]&15 | (mn[j+4]&15)<<4
	}
	code := func(i int) uint8 { return uint8((i*7 + i/32) % 16) }
	for i := range QK_K {
		chunk, half, l := i/64, (i%64)/32, i%32
		b[16+32*chunk+l] |= code(i) << (4 * half)
	}
	y := make([]float32, QK_K)
	if err := Dequantize(Q4_K, b, y); err != nil {
		t.Fatal(err)
	}
	for i := range QK_K {
		j := i / 32
		want := float64(sc[j])*float64(code(i)) - 0.5*float64(mn[j])
		if float64(y[i]) != want {
			t.Fatalf("y[%d] = %g, want %g", i, y[i], want)
		}
	}
}

// TestDequantizeHandQ6_K packs a Q6_K block element by element from the
// layout: element i, h = i/128, r = i%128: low 4 bits in ql[64h + r%64]
// (nibble r/64), high 2 bits in qh[32h + r%32] (bits 2*(r/32)), scale
// scales[i/16], value d*scale*(q-32).
func TestDequantizeHandQ6_K(t *testing.T) {
	b := make([]byte, 210)
	code := func(i int) uint8 { return uint8((i*37 + 11) % 64) }
	for i := range QK_K {
		h, r := i/128, i%128
		q := code(i)
		b[64*h+r%64] |= (q & 15) << (4 * (r / 64))
		b[128+32*h+r%32] |= (q >> 4) << (2 * (r / 32))
	}
	for j := range 16 {
		b[192+j] = byte(int8(j*17 - 128))
	}
	binary.LittleEndian.PutUint16(b[208:], 0x3400) // d = 0.25
	y := make([]float32, QK_K)
	if err := Dequantize(Q6_K, b, y); err != nil {
		t.Fatal(err)
	}
	for i := range QK_K {
		want := 0.25 * float64(i/16*17-128) * float64(int(code(i))-32)
		if float64(y[i]) != want {
			t.Fatalf("y[%d] = %g, want %g", i, y[i], want)
		}
	}
}

// quantRow quantizes x as t (test helper).
func quantRow(t *testing.T, typ Type, x []float32) []byte {
	t.Helper()
	rb, err := typ.RowBytes(len(x))
	if err != nil {
		t.Fatal(err)
	}
	q := make([]byte, rb)
	if err := Quantize(typ, x, q); err != nil {
		t.Fatal(err)
	}
	return q
}

func convertRow(t *testing.T, typ Type, x []float32) []byte {
	t.Helper()
	ab, err := ActivationBytes(typ, len(x))
	if err != nil {
		t.Fatal(err)
	}
	a := make([]byte, ab)
	if err := ConvertActivation(typ, x, a); err != nil {
		t.Fatal(err)
	}
	return a
}

// TestVecDotReference holds every VecDot to a float64 dot product of the
// independently dequantized weight and activation rows. The only
// differences allowed are float32 rounding (1e-6 per block of the sum of
// |terms|) and, for Q4_1/Q5_1, ggml's use of the fp16-rounded block sum s
// of the Q8_1 activation (2^-11 relative of each m*s term).
func TestVecDotReference(t *testing.T) {
	const n = 17 * QK_K // 136 blocks of 32: crosses the 64-block chunks
	for _, typ := range weightTypes {
		for seed := range uint64(3) {
			nn := n
			if typ.BlockSize() == 1 {
				nn = n + 7 // tail beyond the 32 lanes
			}
			w := randomRows(10+seed, nn)
			x := randomRows(20+seed, nn)
			if seed == 2 { // scale spread
				for i := range x {
					x[i] *= float32(math.Exp2(float64(i%7 - 3)))
				}
			}
			wq, xc := quantRow(t, typ, w), convertRow(t, typ, x)
			wd, xd := make([]float32, nn), make([]float32, nn)
			if err := Dequantize(typ, wq, wd); err != nil {
				t.Fatal(err)
			}
			if err := Dequantize(typ.VecDotType(), xc, xd); err != nil {
				t.Fatal(err)
			}
			var ref, mag float64
			for i := range wd {
				p := float64(wd[i]) * float64(xd[i])
				ref += p
				mag += math.Abs(p)
			}
			tol := 1e-6 * mag * float64(nn/typ.VecDotType().BlockSize()+1)
			tol = math.Min(tol, 2e-5*mag)
			if typ == Q4_1 || typ == Q5_1 {
				for b := 0; b < nn/32; b++ {
					m := float64(f16At(wq, b*typ.BlockBytes()+2))
					s := float64(f16At(xc, 36*b+2))
					tol += math.Abs(m*s) * math.Ldexp(1, -10)
				}
			}
			got, err := CheckedVecDot(typ, wq, xc, nn)
			if err != nil {
				t.Fatal(err)
			}
			if d := math.Abs(float64(got) - ref); !(d <= tol) {
				t.Errorf("%s seed %d: VecDot = %g, float64 reference %g (diff %g > tol %g)", typ, seed, got, ref, d, tol)
			}
		}
	}
}

// TestDotF32 checks DotF32 on exactly representable values and its lane
// order: the documented 32-lane sum gives a known result where a plain
// sequential sum would lose the small terms.
func TestDotF32(t *testing.T) {
	a := make([]float32, 100)
	b := make([]float32, 100)
	var want float64
	for i := range a {
		a[i], b[i] = float32(i%13)-6, float32(i%5)+0.5
		want += float64(a[i]) * float64(b[i])
	}
	if got := DotF32(a, b); float64(got) != want {
		t.Errorf("DotF32 = %g, want %g", got, want)
	}
	// Lanes 0..3 hold 2^24, 1, 1, 1. The tree adds lane 2 to lane 0
	// (2^24+1 rounds to 2^24) and lane 3 to lane 1 (2), then lane 1 to
	// lane 0: 2^24+2. A sequential sum would give 2^24.
	x := make([]float32, 64)
	y := make([]float32, 64)
	for i := range y {
		y[i] = 1
	}
	x[0], x[1], x[2], x[3] = 1<<24, 1, 1, 1
	if got := DotF32(x, y); got != 1<<24+2 {
		t.Errorf("DotF32 lane order: %.0f, want 2^24+2", got)
	}
	if DotF32(nil, nil) != 0 || DotF32(a[:3], b[:1]) != a[0]*b[0] {
		t.Error("DotF32 on short inputs")
	}
}

// TestMatMulInvariance: a row's outputs are bit-identical whether it is
// computed alone or among 64 rows, on 1, 2 or 7 goroutines, and equal to
// VecDot on the same converted row.
func TestMatMulInvariance(t *testing.T) {
	const rows, cols, m = 37, 2 * QK_K, 64
	x := randomRows(99, m*cols)
	for _, typ := range weightTypes {
		wq := quantRow(t, typ, randomRows(98, rows*cols))
		all := map[int][]float32{}
		for _, th := range []int{1, 2, 7, 0} {
			y := make([]float32, m*rows)
			if err := MatMul(typ, wq, rows, cols, x, m, y, th); err != nil {
				t.Fatal(err)
			}
			all[th] = y
		}
		rb, _ := typ.RowBytes(cols)
		for i := range m {
			alone := make([]float32, rows)
			if err := MatMul(typ, wq, rows, cols, x[i*cols:(i+1)*cols], 1, alone, 1); err != nil {
				t.Fatal(err)
			}
			xc := convertRow(t, typ, x[i*cols:(i+1)*cols])
			for r := range rows {
				v := VecDot(typ, wq[r*rb:(r+1)*rb], xc, cols)
				for th, y := range all {
					if math.Float32bits(y[i*rows+r]) != math.Float32bits(alone[r]) || math.Float32bits(v) != math.Float32bits(alone[r]) {
						t.Fatalf("%s row %d out %d threads %d: batch %g, alone %g, VecDot %g", typ, i, r, th, y[i*rows+r], alone[r], v)
					}
				}
			}
		}
	}
}

func TestParallelFor(t *testing.T) {
	for _, c := range []struct{ n, th int }{{10, 3}, {3, 10}, {1, 0}, {100, 7}, {0, 2}} {
		hits := make([]int, c.n)
		calls := 0
		done := make(chan [2]int, 64)
		ParallelFor(c.n, c.th, func(lo, hi int) { done <- [2]int{lo, hi} })
		close(done)
		for r := range done {
			calls++
			for i := r[0]; i < r[1]; i++ {
				hits[i]++
			}
		}
		for i, h := range hits {
			if h != 1 {
				t.Fatalf("n=%d threads=%d: index %d covered %d times", c.n, c.th, i, h)
			}
		}
		if c.th > 0 && calls > min(c.n, c.th) {
			t.Errorf("n=%d threads=%d: %d chunks", c.n, c.th, calls)
		}
	}
	_ = rand.Int
}

// TestVecDotF32Misaligned: F32 rows at odd byte offsets (possible in
// hand-made buffers) take the copying path and give the same bits.
func TestVecDotF32Misaligned(t *testing.T) {
	const n = 100
	w, x := randomRows(1, n), randomRows(2, n)
	wb, ab := make([]byte, 4*n+1), make([]byte, 4*n+1)
	for i := range n {
		binary.LittleEndian.PutUint32(wb[1+4*i:], math.Float32bits(w[i]))
		binary.LittleEndian.PutUint32(ab[1+4*i:], math.Float32bits(x[i]))
	}
	got := VecDot(F32, wb[1:], ab[1:], n)
	if want := DotF32(w, x); math.Float32bits(got) != math.Float32bits(want) {
		t.Errorf("misaligned VecDot = %g, DotF32 = %g", got, want)
	}
}

// TestMatMulConvertedNoAlloc: the single-goroutine path (used per chunk by
// the expert code) allocates nothing.
func TestMatMulConvertedNoAlloc(t *testing.T) {
	const rows, cols = 8, 2 * QK_K
	wq := quantRow(t, Q4_K, randomRows(1, rows*cols))
	xc := convertRow(t, Q4_K, randomRows(2, cols))
	y := make([]float32, rows)
	allocs := testing.AllocsPerRun(20, func() {
		if err := MatMulConverted(Q4_K, wq, rows, cols, xc, 1, y, 1); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("MatMulConverted(threads=1) allocates %.1f times per call", allocs)
	}
}
