package expert

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

const fixtures = "../../../shared/fixtures"

// randF16 returns n random F16 values of std sd, as bytes and as float64.
func randF16(rng *rand.Rand, n int, sd float64) ([]byte, []float64) {
	b := make([]byte, 2*n)
	f := make([]float64, n)
	for i := range n {
		h := quant.FP32ToFP16(float32(rng.NormFloat64() * sd))
		binary.LittleEndian.PutUint16(b[2*i:], h)
		f[i] = float64(quant.FP16ToFP32(h))
	}
	return b, f
}

// randQ8_0 returns n (a multiple of 32) random Q8_0 values (ggml-common.h
// block_q8_0: fp16 d, 32 x int8), as bytes.
func randQ8_0(rng *rand.Rand, n int) []byte {
	b := make([]byte, n/32*34)
	for blk := range n / 32 {
		o := blk * 34
		binary.LittleEndian.PutUint16(b[o:], quant.FP32ToFP16(0.002+0.004*rng.Float32()))
		for i := range 32 {
			b[o+2+i] = byte(int8(rng.IntN(255) - 127))
		}
	}
	return b
}

// randQuant returns n random normal values of std sd quantized to typ.
func randQuant(t testing.TB, rng *rand.Rand, typ quant.Type, n int, sd float64) []byte {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * sd)
	}
	rb, err := typ.RowBytes(n)
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, rb)
	if err := quant.Quantize(typ, x, b); err != nil {
		t.Fatal(err)
	}
	return b
}

type synth struct {
	l               *Layer
	gate, up, down  []float64 // F16 values (only for the F16 layer)
	nExpert, d, dff int
}

func synthLayer(t testing.TB, typ quant.Type, nExpert, d, dff int, seed uint64) synth {
	rng := rand.New(rand.NewPCG(seed, 1))
	s := synth{nExpert: nExpert, d: d, dff: dff}
	var g, u, dn []byte
	switch typ {
	case quant.F16:
		g, s.gate = randF16(rng, nExpert*dff*d, 1/math.Sqrt(float64(d)))
		u, s.up = randF16(rng, nExpert*dff*d, 1/math.Sqrt(float64(d)))
		dn, s.down = randF16(rng, nExpert*d*dff, 1/math.Sqrt(float64(dff)))
	case quant.Q8_0:
		g, u, dn = randQ8_0(rng, nExpert*dff*d), randQ8_0(rng, nExpert*dff*d), randQ8_0(rng, nExpert*d*dff)
	case quant.Q4_K:
		sd := 1 / math.Sqrt(float64(d))
		g, u = randQuant(t, rng, typ, nExpert*dff*d, sd), randQuant(t, rng, typ, nExpert*dff*d, sd)
		dn = randQuant(t, rng, typ, nExpert*d*dff, 1/math.Sqrt(float64(dff)))
	default:
		t.Fatalf("no synthetic %v", typ)
	}
	l, err := StackedLayer(nExpert, d, dff, typ, g, typ, u, typ, dn)
	if err != nil {
		t.Fatal(err)
	}
	s.l = l
	return s
}

func randRows(rng *rand.Rand, n, d, k, nExpert int) ([]float32, []int32) {
	x := make([]float32, n*d)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	ids := make([]int32, n*k)
	for r := range n {
		perm := rng.Perm(nExpert)
		for s := range k {
			ids[r*k+s] = int32(perm[s])
		}
	}
	return x, ids
}

// TestLocalF16MatchesFloat64 checks Local on an F16 layer against a float64
// evaluation of down(silu(gate x) * up x) that rounds each matrix product's
// input to F16 as ggml-cpu does (ACTIVATIONS.md). The remaining error is
// float32 accumulation: bound 1e-5 of the row's largest output.
func TestLocalF16MatchesFloat64(t *testing.T) {
	const n, k = 6, 3
	s := synthLayer(t, quant.F16, 8, 64, 96, 7)
	c, err := NewLocal([]*Layer{s.l}, 2)
	if err != nil {
		t.Fatal(err)
	}
	x, ids := randRows(rand.New(rand.NewPCG(3, 3)), n, s.d, k, s.nExpert)
	out := make([]float32, n*k*s.d)
	if err := c.ComputeExperts(context.Background(), 0, x, ids, n, k, out); err != nil {
		t.Fatal(err)
	}
	r16 := func(v float64) float64 { return float64(quant.FP16ToFP32(quant.FP32ToFP16(float32(v)))) }
	for r := range n {
		for sl := range k {
			e := int(ids[r*k+sl])
			h := make([]float64, s.dff)
			for j := range s.dff {
				var g, u float64
				for i := range s.d {
					xi := r16(float64(x[r*s.d+i]))
					g += s.gate[(e*s.dff+j)*s.d+i] * xi
					u += s.up[(e*s.dff+j)*s.d+i] * xi
				}
				h[j] = r16(g / (1 + math.Exp(-g)) * u)
			}
			var worst, scale float64
			for i := range s.d {
				var y float64
				for j := range s.dff {
					y += s.down[(e*s.d+i)*s.dff+j] * h[j]
				}
				scale = max(scale, math.Abs(y))
				worst = max(worst, math.Abs(y-float64(out[(r*k+sl)*s.d+i])))
			}
			if worst > 1e-5*scale {
				t.Errorf("row %d slot %d (expert %d): max |diff| %.3g, scale %.3g", r, sl, e, worst, scale)
			}
		}
	}
}

// TestLocalBatchAndThreadInvariance: a row's outputs are bit-identical alone,
// among 512 rows, and on 1, 2 or 5 goroutines (Q4_K: d 256, FFN 768, so
// that units are cut inside an expert's FFN rows on whole Q8_K blocks).
func TestLocalBatchAndThreadInvariance(t *testing.T) {
	for _, typ := range []quant.Type{quant.Q8_0, quant.F16, quant.Q4_K} {
		t.Run(typ.String(), func(t *testing.T) {
			d, dff := 64, 64
			if typ == quant.Q4_K {
				d, dff = 256, 768
			}
			s := synthLayer(t, typ, 16, d, dff, 11)
			const n, k = 512, 4
			x, ids := randRows(rand.New(rand.NewPCG(5, 5)), n, s.d, k, s.nExpert)
			ref := make([]float32, n*k*s.d)
			c1, _ := NewLocal([]*Layer{s.l}, 1)
			if err := c1.ComputeExperts(context.Background(), 0, x, ids, n, k, ref); err != nil {
				t.Fatal(err)
			}
			for _, th := range []int{2, 5} {
				c, _ := NewLocal([]*Layer{s.l}, th)
				got := make([]float32, n*k*s.d)
				if err := c.ComputeExperts(context.Background(), 0, x, ids, n, k, got); err != nil {
					t.Fatal(err)
				}
				assertBits(t, got, ref, "512 rows, threads %d", th)
				for _, r := range []int{0, 1, 255, 511} {
					one := make([]float32, k*s.d)
					if err := c.ComputeExperts(context.Background(), 0, x[r*s.d:(r+1)*s.d], ids[r*k:(r+1)*k], 1, k, one); err != nil {
						t.Fatal(err)
					}
					assertBits(t, one, ref[r*k*s.d:(r+1)*k*s.d], "row %d alone, threads %d", r, th)
				}
			}
		})
	}
}

func assertBits(t *testing.T, got, want []float32, format string, args ...any) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d: %v != %v", fmtArgs(format, args...), i, got[i], want[i])
		}
	}
}

func fmtArgs(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func TestLocalErrors(t *testing.T) {
	s := synthLayer(t, quant.Q8_0, 4, 32, 32, 1)
	held := *s.l
	held.Gate.Expert = append([][]byte(nil), s.l.Gate.Expert...)
	held.Gate.Expert[2] = nil // a slice without expert 2
	c, err := NewLocal([]*Layer{nil, s.l, &held}, 2)
	if err != nil {
		t.Fatal(err)
	}
	x := make([]float32, 32)
	out := make([]float32, 2*32)
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		layer int
		ids   []int32
		out   []float32
		want  error
	}{
		{"layer not held", 0, []int32{0, 1}, out, ErrUnknownLayer},
		{"layer out of range", 7, []int32{0, 1}, out, ErrUnknownLayer},
		{"expert out of range", 1, []int32{0, 4}, out, ErrUnknownExpert},
		{"negative expert", 1, []int32{-1, 0}, out, ErrUnknownExpert},
		{"expert not held", 2, []int32{2, 0}, out, ErrUnknownExpert},
		{"short out", 1, []int32{0, 1}, out[:10], ErrShape},
	} {
		if err := c.ComputeExperts(ctx, tc.layer, x, tc.ids, 1, 2, tc.out); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
		}
	}
	if err := c.ComputeExperts(ctx, 2, x, []int32{1, 3}, 1, 2, out); err != nil {
		t.Errorf("held experts of a partial layer: %v", err)
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.ComputeExperts(cctx, 1, x, []int32{0, 1}, 1, 2, out); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled context: %v", err)
	}
	if _, err := StackedLayer(4, 32, 32, quant.Q8_0, nil, quant.Q8_0, nil, quant.Q8_0, nil); !errors.Is(err, ErrShape) {
		t.Errorf("StackedLayer with no data: %v", err)
	}
	if _, err := StackedLayer(1, 32, 32, quant.Q8_K, make([]byte, 32*292/256), quant.Q8_0, nil, quant.Q8_0, nil); err == nil {
		t.Error("StackedLayer accepted Q8_K weights")
	}
}

func readRaw[T int32 | float32 | float64](t *testing.T, path string) []T {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var z T
	size := binary.Size(z)
	out := make([]T, len(b)/size)
	if err := binary.Read(bytes.NewReader(b), binary.LittleEndian, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLocalFixtures compares Local with the float64 expert outputs of
// fixtures/experts for models A (F16), B (Q8_0), C (Q4_K_M), layers 0 and 3.
// Against *_ggml.f64 (float64 with ggml's activation conversion) the error is
// float32 accumulation, plus, rarely, a converted activation landing on the
// other side of a rounding boundary: bound 2e-6 of the row-slot's largest
// output for Q8_0 / Q4_K_M (measured <= 5e-7) and 5e-5 for F16 (measured
// 2.6e-5 at A layer 0: one SwiGLU activation rounds to the neighbouring F16,
// a 2^-11 relative step of that input). Against the plain f64 refs (no conversion) the
// README's measured activation-quantisation error is the bound: 1e-3 (A),
// 4e-2 (B), 6e-2 (C) relative (twice the stated 4e-4, 1.7e-2, 2.9e-2).
func TestLocalFixtures(t *testing.T) {
	if _, err := os.Stat(fixtures); err != nil {
		t.Skipf("fixtures not found at %s: expert fixture checks skipped", fixtures)
	}
	models := map[string]string{"A": "tiny-qwen3moe-F16.gguf", "B": "tiny-qwen3moe-Q8_0.gguf", "C": "tiny-qwen3moe-Q4_K_M.gguf"}
	plainTol := map[string]float64{"A": 1e-3, "B": 4e-2, "C": 6e-2}
	for _, tag := range []string{"A", "B", "C"} {
		f, err := gguf.Open(filepath.Join(fixtures, models[tag]))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		for _, layer := range []int{0, 3} {
			l := fixtureLayer(t, f, layer)
			layers := make([]*Layer, layer+1)
			layers[layer] = l
			c, err := NewLocal(layers, 2)
			if err != nil {
				t.Fatal(err)
			}
			p := filepath.Join(fixtures, "experts", tag+".L"+string(rune('0'+layer))+".")
			x := readRaw[float32](t, p+"x.f32")
			ids := readRaw[int32](t, p+"expert_ids.i32")
			ggml := readRaw[float64](t, p+"expert_out_ggml.f64")
			plain := readRaw[float64](t, p+"expert_out.f64")
			const n, k, d = 8, 4, 256
			out := make([]float32, n*k*d)
			if err := c.ComputeExperts(context.Background(), layer, x, ids, n, k, out); err != nil {
				t.Fatal(err)
			}
			eg, ep := relErr(out, ggml, d), relErr(out, plain, d)
			t.Logf("%s layer %d: max rel err vs ggml-f64 %.2e, vs plain f64 %.2e", tag, layer, eg, ep)
			tol := 2e-6
			if tag == "A" {
				tol = 5e-5
			}
			if eg > tol {
				t.Errorf("%s layer %d: error vs expert_out_ggml %.3g > %g", tag, layer, eg, tol)
			}
			if ep > plainTol[tag] {
				t.Errorf("%s layer %d: error vs expert_out %.3g > %g", tag, layer, ep, plainTol[tag])
			}
		}
	}
}

// relErr returns the largest max|got-want| / max|want| over consecutive
// groups of d elements.
func relErr(got []float32, want []float64, d int) float64 {
	var worst float64
	for o := 0; o < len(want); o += d {
		var diff, scale float64
		for i := o; i < o+d; i++ {
			diff = max(diff, math.Abs(float64(got[i])-want[i]))
			scale = max(scale, math.Abs(want[i]))
		}
		worst = max(worst, diff/scale)
	}
	return worst
}

func fixtureLayer(t *testing.T, f *gguf.File, layer int) *Layer {
	t.Helper()
	l, err := FromGGUF(f, layer)
	if err != nil {
		t.Fatal(err)
	}
	if l.NExpert != 16 || l.DModel != 256 || l.DFF != 256 {
		t.Fatalf("fixture layer %d: %d experts, d %d, ffn %d", layer, l.NExpert, l.DModel, l.DFF)
	}
	return l
}

// TestComputeExpertsWith: a caller's Runner that runs units in reverse
// order, each on its own goroutine, gives the bits of ComputeExperts on one
// goroutine, at a batch large enough that every phase goes to the Runner.
func TestComputeExpertsWith(t *testing.T) {
	s := synthLayer(t, quant.Q8_0, 16, 64, 64, 13)
	const n, k = 64, 4
	x, ids := randRows(rand.New(rand.NewPCG(9, 9)), n, s.d, k, s.nExpert)
	c, _ := NewLocal([]*Layer{s.l}, 1)
	ref := make([]float32, n*k*s.d)
	if err := c.ComputeExperts(context.Background(), 0, x, ids, n, k, ref); err != nil {
		t.Fatal(err)
	}
	calls := 0
	reverse := func(n int, fn func(worker, unit int)) {
		calls++
		var wg sync.WaitGroup
		for u := n - 1; u >= 0; u-- {
			wg.Add(1)
			go func() { defer wg.Done(); fn(u%3, u) }()
		}
		wg.Wait()
	}
	got := make([]float32, n*k*s.d)
	if err := c.ComputeExpertsWith(context.Background(), reverse, 3, 0, x, ids, n, k, got); err != nil {
		t.Fatal(err)
	}
	if calls != 3 {
		t.Errorf("runner called for %d phases, want 3 (input conversion, grouping, gate/up with SwiGLU and down)", calls)
	}
	assertBits(t, got, ref, "reverse-order runner")
	if err := c.ComputeExpertsWith(context.Background(), reverse, 3, 0, x[:s.d], ids[:k], 1, k, got[:k*s.d]); err != nil {
		t.Fatal(err)
	}
	assertBits(t, got[:k*s.d], ref[:k*s.d], "one row")
}

// TestSwiGLUKernel holds SwiGLU (the AVX-512 kernel where the CPU has it)
// to the plain Go loop, bit for bit, on every kernel path: values over the
// whole float32 range and around the kernel's |x| < 700 limit, zeros,
// infinities, NaN, at lengths around the 8-lane groups, aliased or not.
func TestSwiGLUKernel(t *testing.T) {
	ref := func(dst, gate, up []float32) {
		for i, x := range gate {
			e := float32(math.Exp(float64(-x)))
			dst[i] = x / (1 + e) * up[i]
		}
	}
	rng := rand.New(rand.NewPCG(21, 22))
	eachSIMDPath(t, func(t *testing.T, path string) {
		for _, n := range []int{1, 7, 8, 9, 16, 33, 1000} {
			for trial := range 20 {
				gate, up := make([]float32, n), make([]float32, n)
				for i := range gate {
					switch rng.IntN(10) {
					case 0:
						gate[i] = float32(rng.NormFloat64() * 800)
					case 1:
						gate[i] = []float32{0, float32(math.Copysign(0, -1)), 699.99, -699.99, 700, -700, 88.7, -103.9,
							float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-40}[rng.IntN(12)]
					case 2:
						gate[i] = float32(math.Ldexp(rng.Float64()-0.5, rng.IntN(60)-30))
					default:
						gate[i] = float32(rng.NormFloat64() * 4)
					}
					up[i] = float32(rng.NormFloat64())
				}
				want := make([]float32, n)
				ref(want, gate, up)
				got := make([]float32, n)
				SwiGLU(got, gate, up)
				alias := append([]float32(nil), gate...)
				SwiGLU(alias, alias, up)
				for i := range want {
					w := math.Float32bits(want[i])
					if math.Float32bits(got[i]) != w && !(want[i] != want[i] && got[i] != got[i]) ||
						math.Float32bits(alias[i]) != w && !(want[i] != want[i] && alias[i] != alias[i]) {
						t.Fatalf("%s n=%d trial %d: SwiGLU(%g, %g) = %g (aliased %g), Go %g", path, n, trial, gate[i], up[i], got[i], alias[i], want[i])
					}
				}
			}
		}
	})
}

// TestSiLUKernel holds SiLU (the AVX-512 kernel where the CPU has it) to
// the plain Go loop of ggml_silu_f32 with a float64 exponential, bit for
// bit, and to SwiGLU with up = 1, on every kernel path: values over the
// whole float32 range and around the kernel's |x| < 700 limit, zeros,
// infinities, NaN, at lengths around the 8-lane groups, aliased or not.
func TestSiLUKernel(t *testing.T) {
	same := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b }
	rng := rand.New(rand.NewPCG(23, 24))
	eachSIMDPath(t, func(t *testing.T, path string) {
		for _, n := range []int{1, 7, 8, 9, 16, 33, 1000} {
			for trial := range 20 {
				x := make([]float32, n)
				for i := range x {
					switch rng.IntN(10) {
					case 0:
						x[i] = float32(rng.NormFloat64() * 800)
					case 1:
						x[i] = []float32{0, float32(math.Copysign(0, -1)), 699.99, -699.99, 700, -700, 88.7, -103.9,
							float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-40}[rng.IntN(12)]
					case 2:
						x[i] = float32(math.Ldexp(rng.Float64()-0.5, rng.IntN(60)-30))
					default:
						x[i] = float32(rng.NormFloat64() * 4)
					}
				}
				ones := make([]float32, n)
				for i := range ones {
					ones[i] = 1
				}
				viaSwiGLU := make([]float32, n)
				SwiGLU(viaSwiGLU, x, ones)
				got := make([]float32, n)
				SiLU(got, x)
				alias := append([]float32(nil), x...)
				SiLU(alias, alias)
				for i, v := range x {
					want := v / (1 + float32(math.Exp(float64(-v))))
					if !same(got[i], want) || !same(alias[i], want) || !same(viaSwiGLU[i], want) {
						t.Fatalf("%s n=%d trial %d: SiLU(%g) = %g (aliased %g, SwiGLU with 1: %g), Go %g", path, n, trial, v, got[i], alias[i], viaSwiGLU[i], want)
					}
				}
			}
		}
	})
}

// TestGateSigmoidKernel holds GateSigmoid on every SIMD path to the Go
// expression it stands for (the model's sigmoid, then the product),
// bit for bit, over gates in and out of the kernel's range (|x| >= 700,
// infinities, NaN: the Go code's groups), lengths around the 8-lane
// groups, and products with zeros, infinities and NaN in dst.
func TestGateSigmoidKernel(t *testing.T) {
	same := func(a, b float32) bool { return math.Float32bits(a) == math.Float32bits(b) || a != a && b != b }
	rng := rand.New(rand.NewPCG(31, 32))
	special := []float32{0, float32(math.Copysign(0, -1)), 699.99, -699.99, 700, -700, 88.7, -103.9,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-40}
	eachSIMDPath(t, func(t *testing.T, path string) {
		for _, n := range []int{1, 7, 8, 9, 16, 33, 1000} {
			for trial := range 20 {
				g, d0 := make([]float32, n), make([]float32, n+1)
				for i := range g {
					switch rng.IntN(10) {
					case 0:
						g[i] = float32(rng.NormFloat64() * 800)
					case 1:
						g[i] = special[rng.IntN(len(special))]
					default:
						g[i] = float32(rng.NormFloat64() * 4)
					}
					d0[i] = float32(rng.NormFloat64() * 3)
					if rng.IntN(10) == 0 {
						d0[i] = special[rng.IntN(len(special))]
					}
				}
				d0[n] = 42 // past the end: untouched
				got := append([]float32(nil), d0...)
				GateSigmoid(got[:n], g)
				for i, v := range g {
					want := d0[i] * (1 / (1 + float32(math.Exp(float64(-v)))))
					if !same(got[i], want) {
						t.Fatalf("%s n=%d trial %d: %g x sigmoid(%g) = %g, Go %g", path, n, trial, d0[i], v, got[i], want)
					}
				}
				if got[n] != 42 {
					t.Fatalf("%s n=%d: wrote past len(gate)", path, n)
				}
			}
		}
	})
}

// TestExpShifted holds ExpShifted on each SIMD path to the Go expression
// it stands for, float32(math.Exp(float64(src[i] - m))), bit for bit (NaNs
// included), over lengths around the 8-lane groups, shifts m that are
// finite, zero, a maximum of src or infinite, values near the kernel's
// ±700 limit, infinities, NaNs and subnormals, with dst separate from src
// and aliasing it; and checks that it writes nothing past len(src).
func TestExpShifted(t *testing.T) {
	rng := rand.New(rand.NewPCG(33, 34))
	special := []float32{0, float32(math.Copysign(0, -1)), 699.99, -699.99, 700, -700, 88.7, -103.9, -87.3,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN()), 1e-40, -1e-40}
	eachSIMDPath(t, func(t *testing.T, path string) {
		for _, n := range []int{1, 7, 8, 9, 16, 33, 256, 1000} {
			for trial := range 40 {
				src := make([]float32, n)
				for i := range src {
					switch rng.IntN(10) {
					case 0:
						src[i] = float32(rng.NormFloat64() * 800)
					case 1:
						src[i] = special[rng.IntN(len(special))]
					default:
						src[i] = float32(rng.NormFloat64() * 4)
					}
				}
				var m float32
				switch trial % 4 {
				case 0:
					m = float32(math.Inf(-1))
					for _, v := range src {
						m = max(m, v)
					}
				case 1:
					m = float32(rng.NormFloat64() * 10)
				case 2:
					m = special[rng.IntN(len(special))]
				}
				for _, alias := range []bool{false, true} {
					got := make([]float32, n+1)
					got[n] = 42 // past the end: untouched
					if alias {
						copy(got, src)
						ExpShifted(got[:n], got[:n], m)
					} else {
						ExpShifted(got[:n], src, m)
					}
					for i, v := range src {
						want := float32(math.Exp(float64(v - m)))
						if math.Float32bits(got[i]) != math.Float32bits(want) {
							t.Fatalf("%s n=%d trial %d alias %v: exp(%g - %g) = %g (%#x), Go %g (%#x)", path, n, trial, alias, v, m,
								got[i], math.Float32bits(got[i]), want, math.Float32bits(want))
						}
					}
					if got[n] != 42 {
						t.Fatalf("%s n=%d: wrote past len(src)", path, n)
					}
				}
			}
		}
	})
}

// BenchmarkExpShifted is ExpShifted over 256 router logits (a qwen35moe
// routing softmax's exponentials) on each SIMD path.
func BenchmarkExpShifted(b *testing.B) {
	rng := rand.New(rand.NewPCG(35, 36))
	src, dst := make([]float32, 256), make([]float32, 256)
	for i := range src {
		src[i] = float32(rng.NormFloat64() * 2)
	}
	for _, path := range quant.SIMDPaths() {
		b.Run(path, func(b *testing.B) {
			old, err := quant.SetSIMDPath(path)
			if err != nil {
				b.Fatal(err)
			}
			defer quant.SetSIMDPath(old)
			for b.Loop() {
				ExpShifted(dst, src, 3)
			}
		})
	}
}

// eachSIMDPath runs test on every kernel path quant offers (quant.SIMDPaths),
// each as a subtest named for it, and restores the path in use after.
func eachSIMDPath(t *testing.T, test func(t *testing.T, path string)) {
	for _, path := range quant.SIMDPaths() {
		t.Run(path, func(t *testing.T) {
			old, err := quant.SetSIMDPath(path)
			if err != nil {
				t.Fatal(err)
			}
			defer quant.SetSIMDPath(old)
			test(t, path)
		})
	}
}
