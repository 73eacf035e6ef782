package quant

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestVecDotRowsMatchesGeneric holds vecDotRows (the multi-row kernels
// where this build has them) to one generic vecDot per row, bit for bit:
// every weight type, row counts 0, 1, 2, odd and past a kernel unroll,
// rows packed or with an odd padded stride (rows at unaligned addresses,
// garbage in the padding), on real quantized rows and on random code bytes
// with finite scales.
func TestVecDotRowsMatchesGeneric(t *testing.T) { eachSIMDPath(t, testVecDotRowsMatchesGeneric) }

func testVecDotRowsMatchesGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, typ := range weightTypes {
		ns := []int{QK_K, 3 * QK_K}
		if typ.BlockSize() == 1 {
			ns = append(ns, 32, 40, 7)
		}
		if typ == F16 { // every activation buffer size class of f16Rows, and past it
			ns = append(ns, 2080, 4128, 16416)
		} else if typ.BlockSize() == 32 {
			ns = append(ns, 32, 96, 160, 224) // 1, 3, 5, 7 blocks: the Q8_0 kernels go 4 blocks at a time
		}
		for _, n := range ns {
			rb0, _ := typ.RowBytes(n)
			for _, pad := range []int{0, 21} {
				rb := rb0 + pad
				for _, rows := range []int{0, 1, 2, 7, 65} {
					for _, random := range []bool{false, true} {
						name := fmt.Sprintf("%s/n=%d/pad=%d/rows=%d/random=%v", typ, n, pad, rows, random)
						w := make([]byte, rows*rb)
						randomCodes(r, w)
						a := convertRow(t, typ, randomRows(r.Uint64(), n))
						for i := range rows {
							row := quantRow(t, typ, randomRows(r.Uint64(), n))
							if random && typ.BlockSize() > 1 {
								randomCodes(r, row)
								ab := 292
								if typ.BlockSize() == 32 {
									ab = len(a) / (n / 32)
								}
								saneScales(r, row, a, typ.BlockBytes(), ab, n/typ.BlockSize())
							}
							copy(w[i*rb:], row)
						}
						got := make([]float32, rows)
						vecDotRows(typ, w, rb, a, n, got)
						for i := range rows {
							var want float32
							withGeneric(func() { want = vecDot(typ, w[i*rb:i*rb+rb0], a, n) })
							if !sameBits(got[i], want) {
								t.Fatalf("%s: row %d = %g, generic vecDot %g", name, i, got[i], want)
							}
						}
					}
				}
			}
		}
	}
}

// TestDotF32MatchesGeneric holds DotF32 (the AVX2 kernel where present:
// lanes, tail and reduction) to the pure-Go path for every length 0..130
// and some longer ones, on values over a wide exponent range (so that the
// rounding of each add shows), plus infinities and NaN.
func TestDotF32MatchesGeneric(t *testing.T) { eachSIMDPath(t, testDotF32MatchesGeneric) }

func testDotF32MatchesGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	lengths := []int{1000, 4096 + 17}
	for n := range 131 {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		a, b := make([]float32, n+3), make([]float32, n)
		for i := range a {
			a[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(40)-20))
		}
		for i := range b {
			b[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(40)-20))
		}
		got := DotF32(a, b)
		var want float32
		withGeneric(func() { want = DotF32(a, b) })
		if !sameBits(got, want) {
			t.Fatalf("DotF32 n=%d: %g (%#x), generic %g (%#x)", n, got, math.Float32bits(got), want, math.Float32bits(want))
		}
		if n > 0 { // products of -0 only: the sum is +0 either way
			z, one := make([]float32, n), make([]float32, n)
			for i := range z {
				z[i], one[i] = float32(math.Copysign(0, -1)), 1
			}
			got, want := DotF32(z, one), float32(0)
			withGeneric(func() { want = DotF32(z, one) })
			if math.Float32bits(got) != math.Float32bits(want) || math.Float32bits(got) != 0 {
				t.Fatalf("DotF32 n=%d of -0 products: %#x, generic %#x, want +0", n, math.Float32bits(got), math.Float32bits(want))
			}
		}
		if n > 5 {
			a[n/2] = float32(math.Inf(1))
			got = DotF32(a, b)
			withGeneric(func() { want = DotF32(a, b) })
			if !sameBits(got, want) {
				t.Fatalf("DotF32 n=%d with +Inf: %g, generic %g", n, got, want)
			}
		}
	}
}

// TestMatMulMatchesGeneric compares MatMul with SIMD on and off for every
// weight type, activation row counts around the 4-row kernel (1..5, 8, 9)
// and more weight rows than one tile, on 1 and 2 goroutines.
func TestMatMulMatchesGeneric(t *testing.T) { eachSIMDPath(t, testMatMulMatchesGeneric) }

func testMatMulMatchesGeneric(t *testing.T) {
	const rows, cols = rowTile*2 + 3, 2 * QK_K
	for _, typ := range weightTypes {
		wq := quantRow(t, typ, randomRows(21, rows*cols))
		for _, m := range []int{1, 2, 3, 4, 5, 8, 9} {
			x := randomRows(uint64(22+m), m*cols)
			want := make([]float32, m*rows)
			withGeneric(func() {
				if err := MatMul(typ, wq, rows, cols, x, m, want, 1); err != nil {
					t.Fatal(err)
				}
			})
			for _, th := range []int{1, 2} {
				got := make([]float32, m*rows)
				if err := MatMul(typ, wq, rows, cols, x, m, got, th); err != nil {
					t.Fatal(err)
				}
				for i := range got {
					if !sameBits(got[i], want[i]) {
						t.Fatalf("%s m=%d threads=%d y[%d] = %g, generic %g", typ, m, th, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// TestVecDot4RowsMatchesGeneric holds vecDot4Rows (where this build has
// it) to the generic vecDot of every (weight row, activation row) pair:
// row counts 0, 1, 2, odd and longer, packed weight and activation rows or
// both with an odd padded stride (unaligned rows, garbage in the padding),
// real quantized rows or random code bytes with finite scales, and a y
// stride wider than rows whose gaps must stay untouched.
func TestVecDot4RowsMatchesGeneric(t *testing.T) { eachSIMDPath(t, testVecDot4RowsMatchesGeneric) }

func testVecDot4RowsMatchesGeneric(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, typ := range weightTypes {
		for _, nb := range []int{1, 3} {
			n := nb * QK_K
			rb0, _ := typ.RowBytes(n)
			ab0, _ := ActivationBytes(typ, n)
			for _, pad := range []int{0, 13} {
				rb, ab := rb0+pad, ab0+pad/4 // ab: the stride of the activation rows
				for _, c := range []struct {
					rows   int
					random bool
				}{{0, false}, {1, false}, {2, true}, {7, false}, {7, true}, {65, false}} {
					rows := c.rows
					w := make([]byte, rows*rb)
					randomCodes(r, w)
					a := make([]byte, 4*ab)
					randomCodes(r, a)
					if c.random && typ.BlockSize() > 1 { // every code byte, -128 included; finite scales
						wb, qb := typ.BlockBytes(), ab0/(n/typ.BlockSize())
						for i := range rows {
							for j := range 4 {
								saneScales(r, w[i*rb:], a[j*ab:], wb, qb, n/typ.BlockSize())
							}
						}
						if qb == 292 {
							for j := range 4 {
								setQ8KBsums(a[j*ab:], nb)
							}
						}
					} else {
						for i := range rows {
							copy(w[i*rb:], quantRow(t, typ, randomRows(r.Uint64(), n)))
						}
						for j := range 4 {
							copy(a[j*ab:], convertRow(t, typ, randomRows(r.Uint64(), n)))
						}
					}
					ys := rows + 3
					y := make([]float32, 4*ys)
					for i := range y {
						y[i] = -7
					}
					if !vecDot4Rows(typ, w, rb, a, ab, n, y, ys, rows) {
						if has4(typ, n) && rows > 0 {
							t.Fatalf("%s nb=%d rows=%d: has4 but vecDot4Rows declined", typ, nb, rows)
						}
						continue
					}
					for j := range 4 {
						for i := range ys {
							got := y[j*ys+i]
							if i >= rows {
								if got != -7 {
									t.Fatalf("%s rows=%d: y gap [%d][%d] written: %g", typ, rows, j, i, got)
								}
								continue
							}
							var want float32
							withGeneric(func() { want = vecDot(typ, w[i*rb:i*rb+rb0], a[j*ab:j*ab+ab0], n) })
							if !sameBits(got, want) {
								t.Fatalf("%s nb=%d pad=%d rows=%d: y[%d][%d] = %g, generic %g", typ, nb, pad, rows, j, i, got, want)
							}
						}
					}
				}
			}
		}
	}
}

// setQ8KBsums rewrites the bsums of nb block_q8_K in a to match their codes
// (what ConvertActivation produces; the Q4_K/Q5_K kernels and the Q6_K
// multi-row kernels read them).
func setQ8KBsums(a []byte, nb int) {
	for b := range nb {
		y := a[292*b:]
		for g := range 16 {
			var s int16
			for _, c := range y[4+16*g : 4+16*g+16] {
				s += int16(int8(c))
			}
			binary.LittleEndian.PutUint16(y[4+QK_K+2*g:], uint16(s))
		}
	}
}

// TestDotF32Rows holds DotF32Rows to one DotF32 per row (SIMD and
// generic) for row lengths around the 32-lane blocks, 1, 2 or 7 rows,
// packed, padded, overlapping (stride < len(x)) and repeated (stride 0)
// rows, with m cut to exactly the floats needed; and checks its errors.
func TestDotF32Rows(t *testing.T) { eachSIMDPath(t, testDotF32Rows) }

func testDotF32Rows(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	for _, n := range []int{0, 1, 5, 31, 32, 33, 64, 100, 128, 1000} {
		for _, rows := range []int{1, 2, 7} {
			for _, stride := range []int{n, n + 3, n + 33, n / 2, 0} {
				x := make([]float32, n)
				for i := range x {
					x[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(30)-15))
				}
				m := make([]float32, (rows-1)*stride+n)
				for i := range m {
					m[i] = float32(math.Ldexp(r.NormFloat64(), r.IntN(30)-15))
				}
				out := make([]float32, rows)
				if err := DotF32Rows(x, m, stride, out); err != nil {
					t.Fatalf("n=%d rows=%d stride=%d: %v", n, rows, stride, err)
				}
				for j := range rows {
					want := DotF32(x, m[j*stride:j*stride+n])
					var gen float32
					withGeneric(func() { gen = DotF32(x, m[j*stride:j*stride+n]) })
					if !sameBits(out[j], want) || !sameBits(out[j], gen) {
						t.Fatalf("n=%d rows=%d stride=%d row %d: %g, DotF32 %g, generic %g", n, rows, stride, j, out[j], want, gen)
					}
				}
				if rows > 1 && stride > 0 {
					if err := DotF32Rows(x, m[:len(m)-1], stride, out); !errors.Is(err, ErrSize) {
						t.Fatalf("n=%d rows=%d stride=%d: m one short: %v", n, rows, stride, err)
					}
				}
			}
		}
	}
	if err := DotF32Rows(nil, nil, -1, make([]float32, 1)); !errors.Is(err, ErrSize) {
		t.Errorf("negative stride: %v", err)
	}
	if err := DotF32Rows(make([]float32, 4), make([]float32, 3), 0, make([]float32, 1)); !errors.Is(err, ErrSize) {
		t.Errorf("m shorter than x: %v", err)
	}
	if err := DotF32Rows(nil, nil, 5, nil); err != nil {
		t.Errorf("no rows: %v", err)
	}
	if err := DotF32Rows(make([]float32, 2), make([]float32, 4), math.MaxInt, make([]float32, 3)); !errors.Is(err, ErrSize) {
		t.Errorf("huge stride: %v", err)
	}
}

// TestQ4KAnyBytes holds the Q4_K row kernels to the generic code on random
// bytes everywhere, activation bsums included (which the kernels read
// instead of summing codes: any int16 values must give the generic
// integer), finite scales: MatMulConverted for 1..9 activation rows and
// weight row counts around the 4-row groups, and vecDotRows.
func TestQ4KAnyBytes(t *testing.T) { eachSIMDPath(t, testQ4KAnyBytes) }

func testQ4KAnyBytes(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for _, nb := range []int{1, 3, 8} {
		n := nb * QK_K
		rb, _ := Q4_K.RowBytes(n)
		ab, _ := ActivationBytes(Q4_K, n)
		for _, rows := range []int{1, 3, 4, 5, 8, 13} {
			for _, m := range []int{1, 3, 4, 5, 9} {
				w, a := make([]byte, rows*rb), make([]byte, m*ab)
				randomCodes(r, w)
				randomCodes(r, a)
				for i := range rows {
					for j := range m {
						saneScales(r, w[i*rb:], a[j*ab:], 144, 292, nb)
					}
				}
				y := make([]float32, m*rows)
				if err := MatMulConverted(Q4_K, w, rows, n, a, m, y, 1); err != nil {
					t.Fatal(err)
				}
				for j := range m {
					got := make([]float32, rows)
					vecDotRows(Q4_K, w, rb, a[j*ab:(j+1)*ab], n, got)
					for i := range rows {
						var want float32
						withGeneric(func() { want = vecDot(Q4_K, w[i*rb:(i+1)*rb], a[j*ab:(j+1)*ab], n) })
						if !sameBits(y[j*rows+i], want) || !sameBits(got[i], want) {
							t.Fatalf("nb=%d rows=%d m=%d: y[%d][%d] = %g, vecDotRows %g, generic %g", nb, rows, m, j, i, y[j*rows+i], got[i], want)
						}
					}
				}
			}
		}
	}
}
