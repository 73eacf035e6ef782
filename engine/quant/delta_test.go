package quant

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestDeltaRule holds DeltaRule on each kernel path to the scalar loop it
// replaces (model.deltaStep before the kernels: genericDeltaRule with the
// pure-Go dot products), bit for bit, on random states and vectors of
// lengths around the 32-lane steps (odd ones included), and checks that
// it writes nothing past the rows it owns.
func TestDeltaRule(t *testing.T) { eachSIMDPath(t, testDeltaRule) }

func testDeltaRule(t *testing.T) {
	r := rand.New(rand.NewPCG(24, 1))
	rnd := func(n int, s float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = (r.Float32()*2 - 1) * s
		}
		return x
	}
	for _, n := range []int{1, 3, 7, 16, 31, 32, 33, 47, 64, 65, 100, 128, 129, 256} {
		for _, rows := range []int{1, 2, 5, n} {
			st0 := rnd(rows*n+8, 4)
			q, k, v := rnd(n, 1), rnd(n, 1), rnd(rows, 2)
			beta, decay, scale := r.Float32(), float32(math.Exp(-r.Float64()*3)), 1/float32(math.Sqrt(float64(n)))
			got, want := append([]float32(nil), st0...), append([]float32(nil), st0...)
			og, ow := make([]float32, rows), make([]float32, rows)
			// Two steps, so the second starts from the first's state.
			for range 2 {
				if err := DeltaRule(got[:rows*n], q, k, v, og, beta, decay, scale); err != nil {
					t.Fatal(err)
				}
				withGeneric(func() { genericDeltaRule(want[:rows*n], q, k, v, ow, beta, decay, scale) })
			}
			for i := range want {
				if !sameBits(got[i], want[i]) {
					t.Fatalf("n=%d rows=%d: st[%d] = %v, want %v", n, rows, i, got[i], want[i])
				}
			}
			for j := range ow {
				if !sameBits(og[j], ow[j]) {
					t.Fatalf("n=%d rows=%d: o[%d] = %v, want %v", n, rows, j, og[j], ow[j])
				}
			}
		}
	}
	if err := DeltaRule(make([]float32, 3), make([]float32, 2), make([]float32, 2), make([]float32, 2), make([]float32, 2), 1, 1, 1); !errors.Is(err, ErrSize) {
		t.Errorf("short state: err = %v, want ErrSize", err)
	}
}

// BenchmarkDeltaRule runs one head of 128 x 128 (Qwen3.5) per op on each
// kernel path.
func BenchmarkDeltaRule(b *testing.B) {
	const n = 128
	st, q, k, v, o := make([]float32, n*n), make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range q {
		q[i], k[i], v[i] = 0.01*float32(i%7), 0.02*float32(i%5), float32(i%3)
	}
	for _, p := range simdPaths() {
		b.Run(p, func(b *testing.B) {
			old, _ := SetSIMDPath(p)
			defer SetSIMDPath(old)
			for b.Loop() {
				DeltaRule(st, q, k, v, o, 0.5, 0.99, 0.088)
			}
		})
	}
}

// BenchmarkDeltaRuleCold is BenchmarkDeltaRule over 1024 heads' states of
// 128 x 128 (64 MiB, on the Go heap as a Sequence's state is), one head
// per call, 17 heads on from the last (not the neighbour a prefetch past
// the end would have warmed), so that every call finds its state in
// memory, not in the caches, as a decode step does (the weights streamed
// between two tokens evict it). MB/s counts the state's bytes read (and
// written).
func BenchmarkDeltaRuleCold(b *testing.B) {
	const n, heads = 128, 1024
	st, q, k, v, o := make([]float32, heads*n*n), make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range q {
		q[i], k[i], v[i] = 0.01*float32(i%7), 0.02*float32(i%5), float32(i%3)
	}
	for _, p := range simdPaths() {
		b.Run(p, func(b *testing.B) {
			old, _ := SetSIMDPath(p)
			defer SetSIMDPath(old)
			for i := range st {
				st[i] = 1e-3 // faulted in before the clock starts
			}
			b.SetBytes(4 * n * n)
			h := 0
			for b.Loop() {
				DeltaRule(st[h*n*n:(h+1)*n*n], q, k, v, o, 0.5, 0.99, 0.088)
				h = (h + 17) % heads
			}
		})
	}
}

// TestMulAddF32 holds MulAddF32 on each SIMD path to the Go loop it
// stands for, bit for bit, over lengths around the 16-lane steps and
// values that include zeros of both signs, infinities and subnormals,
// and checks that it writes nothing past len(dst).
func TestMulAddF32(t *testing.T) { eachSIMDPath(t, testMulAddF32) }

func testMulAddF32(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 2))
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), 1e-42, -3e-39, 3e38}
	val := func() float32 {
		if r.IntN(8) == 0 {
			return special[r.IntN(len(special))]
		}
		return float32(r.NormFloat64() * math.Pow(10, r.Float64()*8-4))
	}
	for _, n := range []int{1, 2, 15, 16, 17, 31, 32, 33, 100, 128, 129} {
		for range 20 {
			x, w, d0 := make([]float32, n+3), make([]float32, n+3), make([]float32, n+3)
			for i := range x {
				x[i], w[i], d0[i] = val(), val(), val()
			}
			got, want := append([]float32(nil), d0...), append([]float32(nil), d0...)
			MulAddF32(got[:n], x, w)
			genericMulAddF32(want[:n], x[:n], w[:n])
			for i := range want {
				if !sameBits(got[i], want[i]) {
					t.Fatalf("n=%d: dst[%d] = %v, want %v (x %v, w %v, dst %v)", n, i, got[i], want[i], x[i], w[i], d0[i])
				}
			}
		}
	}
	MulAddF32(nil, nil, nil) // nothing to do
}

// TestScaleF32 holds ScaleF32 and ScaleAddF32 on each SIMD path to the Go
// loops they stand for, bit for bit, over lengths around the 16-lane
// steps and values (scales included) that include zeros of both signs,
// infinities and subnormals, and checks that they write nothing past
// len(dst).
func TestScaleF32(t *testing.T) { eachSIMDPath(t, testScaleF32) }

func testScaleF32(t *testing.T) {
	r := rand.New(rand.NewPCG(26, 3))
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.Inf(1)), float32(math.Inf(-1)), 1e-42, -3e-39, 3e38}
	val := func() float32 {
		if r.IntN(8) == 0 {
			return special[r.IntN(len(special))]
		}
		return float32(r.NormFloat64() * math.Pow(10, r.Float64()*8-4))
	}
	for _, n := range []int{1, 2, 15, 16, 17, 31, 32, 33, 100, 128, 129, 2048} {
		for range 20 {
			x, d0 := make([]float32, n+3), make([]float32, n+3)
			for i := range x {
				x[i], d0[i] = val(), val()
			}
			a := val()
			for _, add := range []bool{false, true} {
				got, want := append([]float32(nil), d0...), append([]float32(nil), d0...)
				if add {
					ScaleAddF32(got[:n], x, a)
					for i := range n { // the loop ScaleAddF32 stands for
						want[i] += float32(a * x[i])
					}
				} else {
					ScaleF32(got[:n], x, a)
					for i := range n {
						want[i] = a * x[i]
					}
				}
				for i := range want {
					if !sameBits(got[i], want[i]) {
						t.Fatalf("n=%d add=%v: dst[%d] = %v, want %v (a %v, x %v, dst %v)", n, add, i, got[i], want[i], a, x[i], d0[i])
					}
				}
			}
		}
	}
	ScaleF32(nil, nil, 1) // nothing to do
	ScaleAddF32(nil, nil, 1)
}
