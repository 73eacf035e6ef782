package model

import (
	"math"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

func TestRMSNorm(t *testing.T) {
	// [3, 4]: mean square 12.5, so y = x / sqrt(12.5) * w.
	dst := make([]float32, 2)
	rmsNorm(dst, []float32{3, 4}, []float32{1, 2}, 0)
	want := []float64{3 / math.Sqrt(12.5), 2 * 4 / math.Sqrt(12.5)}
	for i := range want {
		if math.Abs(float64(dst[i])-want[i]) > 1e-6 {
			t.Errorf("rmsNorm[%d] = %v, want %v", i, dst[i], want[i])
		}
	}
	// eps dominates a zero vector: no NaN.
	z := []float32{0, 0}
	rmsNorm(z, z, []float32{1, 1}, 1e-6)
	if z[0] != 0 || z[1] != 0 {
		t.Errorf("rmsNorm of zeros = %v", z)
	}
}

func TestRope(t *testing.T) {
	p := Params{RopeDim: 4, RopeBase: 10000, RopeScale: 1}
	c, s := make([]float32, 2), make([]float32, 2)
	ropeTable(p, 0, c, s)
	x := []float32{1, 2, 3, 4, 5}
	ropeNeox(x, c, s)
	if x[0] != 1 || x[1] != 2 || x[2] != 3 || x[3] != 4 || x[4] != 5 {
		t.Errorf("position 0 must be the identity, got %v", x)
	}
	// Position 3: pair i rotates (x[i], x[i+2]) by 3 * 10000^(-2i/4):
	// i=0 by 3 rad, i=1 by 3/100 rad; x[4] is beyond RopeDim and stays.
	ropeTable(p, 3, c, s)
	x = []float32{1, 2, 3, 4, 5}
	ropeNeox(x, c, s)
	rot := func(a, b, th float64) (float64, float64) {
		return a*math.Cos(th) - b*math.Sin(th), a*math.Sin(th) + b*math.Cos(th)
	}
	a0, b0 := rot(1, 3, 3)
	a1, b1 := rot(2, 4, 0.03)
	want := []float64{a0, a1, b0, b1, 5}
	for i := range want {
		if math.Abs(float64(x[i])-want[i]) > 1e-5 {
			t.Errorf("rope pos 3 [%d] = %v, want %v", i, x[i], want[i])
		}
	}
}

func TestRoute(t *testing.T) {
	// Probabilities proportional to 1, 2, 3, 4: top-2 = experts 3, 2 with
	// weights 4/7, 3/7.
	logits := []float32{0, float32(math.Log(2)), float32(math.Log(3)), float32(math.Log(4))}
	ids, w := make([]int32, 2), make([]float32, 2)
	SoftmaxTopKNorm(logits, make([]float32, 4), ids, w)
	if ids[0] != 3 || ids[1] != 2 {
		t.Fatalf("ids %v, want [3 2]", ids)
	}
	if math.Abs(float64(w[0])-4.0/7) > 1e-6 || math.Abs(float64(w[1])-3.0/7) > 1e-6 {
		t.Errorf("weights %v, want [4/7 3/7]", w)
	}
	// Ties go to the lower id, in slot order.
	SoftmaxTopKNorm([]float32{1, 5, 5, 5}, make([]float32, 4), ids, w)
	if ids[0] != 1 || ids[1] != 2 || w[0] != 0.5 || w[1] != 0.5 {
		t.Errorf("tie: ids %v weights %v, want [1 2] [0.5 0.5]", ids, w)
	}
	// The sum of the selected probabilities is clamped at 6.103515625e-5:
	// 20000 equal experts, k = 1, p = 5e-5 -> weight 5e-5 / 6.103515625e-5.
	flat := make([]float32, 20000)
	SoftmaxTopKNorm(flat, make([]float32, len(flat)), ids[:1], w[:1])
	if want := 5e-5 / 6.103515625e-5; ids[0] != 0 || math.Abs(float64(w[0])-want) > 1e-5 {
		t.Errorf("clamp: id %d weight %v, want 0, %v", ids[0], w[0], want)
	}
}

func TestSoftmax(t *testing.T) {
	dst := make([]float32, 3)
	softmax(dst, []float32{10, 10 + float32(math.Log(3)), -1e30})
	if math.Abs(float64(dst[0])-0.25) > 1e-6 || math.Abs(float64(dst[1])-0.75) > 1e-6 || dst[2] != 0 {
		t.Errorf("softmax = %v, want [0.25 0.75 0]", dst)
	}
}

func TestGreedy(t *testing.T) {
	nan := float32(math.NaN())
	for _, tc := range []struct {
		in   []float32
		want int32
	}{
		{[]float32{1, 3, 2}, 1},
		{[]float32{5, 1, 5}, 0},
		{[]float32{nan, 1, 2}, 2},
		{[]float32{-1, nan, -2}, 0},
		{[]float32{-3, -1, -2, -1}, 1},
		{[]float32{nan, nan}, 0},
		{[]float32{nan, float32(math.Inf(-1)), float32(math.Inf(-1))}, 1},
		{[]float32{0, float32(math.Inf(1)), nan, float32(math.Inf(1))}, 1},
		{nil, -1},
	} {
		if got := Greedy(tc.in); got != tc.want {
			t.Errorf("Greedy(%v) = %d, want %d", tc.in, got, tc.want)
		}
	}
}

func TestSampler(t *testing.T) {
	// Probabilities 0.5, 0.3, 0.15, 0.05 at temperature 1.
	probs := []float64{0.5, 0.3, 0.15, 0.05}
	logits := make([]float32, len(probs))
	for i, p := range probs {
		logits[i] = float32(math.Log(p))
	}
	const n = 40000
	count := func(o SamplerOptions) []float64 {
		s := NewSampler(o)
		c := make([]float64, len(probs))
		for range n {
			c[s.Sample(logits)]++
		}
		for i := range c {
			c[i] /= n
		}
		return c
	}
	near := func(name string, got, want []float64) {
		t.Helper()
		for i := range want {
			if math.Abs(got[i]-want[i]) > 0.015 {
				t.Errorf("%s: frequencies %v, want %v", name, got, want)
				return
			}
		}
	}
	near("T=1", count(SamplerOptions{Temperature: 1, Seed: 1}), probs)
	// top-k 2 renormalises over {0, 1}: 0.625, 0.375.
	near("top-k 2", count(SamplerOptions{Temperature: 1, TopK: 2, Seed: 2}), []float64{0.625, 0.375, 0, 0})
	// top-p 0.7: smallest prefix reaching 0.7 is {0, 1} (0.8).
	near("top-p 0.7", count(SamplerOptions{Temperature: 1, TopP: 0.7, Seed: 3}), []float64{0.625, 0.375, 0, 0})
	// top-k 3 then top-p 0.9 over the renormalised {0.526, 0.316, 0.158}:
	// prefix {0,1,2} reaches 1.0 > 0.9 only with all three.
	near("top-k 3 + top-p 0.9", count(SamplerOptions{Temperature: 1, TopK: 3, TopP: 0.9, Seed: 4}), []float64{0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0})
	// T=0.5 squares the probabilities: 0.25, 0.09, 0.0225, 0.0025 (/0.365).
	near("T=0.5", count(SamplerOptions{Temperature: 0.5, Seed: 5}), []float64{0.25 / 0.365, 0.09 / 0.365, 0.0225 / 0.365, 0.0025 / 0.365})
	// Temperature 0 is greedy; the same seed gives the same draws.
	if got := NewSampler(SamplerOptions{Seed: 9}).Sample(logits); got != 0 {
		t.Errorf("temperature 0 sampled %d", got)
	}
	a, b := NewSampler(SamplerOptions{Temperature: 1, Seed: 7}), NewSampler(SamplerOptions{Temperature: 1, Seed: 7})
	for i := range 100 {
		if x, y := a.Sample(logits), b.Sample(logits); x != y {
			t.Fatalf("draw %d: same seed gave %d and %d", i, x, y)
		}
	}
}

// TestPlanChunks checks projectAll's plan on regions of mixed weight types:
// every row of every job in exactly one chunk, in order, no chunk across
// two jobs, and a balanced region. The balance is checked by list
// scheduling the chunks in order on threads workers (each takes the next
// chunk when free, as team.run hands them out) with each chunk taking its
// cost: the last worker must finish within minChunkCost and one row of
// the ideal total/threads. The first case is a qwen35moe router region
// (the F32 router and the shared expert's Q4_K gate and up of the 35B-A3B
// shape), where chunks sized in rows gave one worker the whole router:
// 2.62 of 4.10 MB-equivalents against the ideal 2.05.
func TestPlanChunks(t *testing.T) {
	mat := func(typ quant.Type, rows, cols int) *Weight {
		rb, err := typ.RowBytes(cols)
		if err != nil {
			t.Fatal(err)
		}
		return &Weight{Type: typ, Rows: rows, Cols: cols, Data: make([]byte, rows*rb)}
	}
	for _, tc := range []struct {
		name       string
		ws         []*Weight
		n, threads int
	}{
		{"router region 35B", []*Weight{mat(quant.F32, 256, 2048), mat(quant.Q4_K, 512, 2048), mat(quant.Q4_K, 512, 2048)}, 1, 2},
		{"router region 35B, 3 threads", []*Weight{mat(quant.F32, 256, 2048), mat(quant.Q4_K, 512, 2048), mat(quant.Q4_K, 512, 2048)}, 1, 3},
		{"deltanet in_proj", []*Weight{mat(quant.Q4_K, 8192, 2048), mat(quant.Q4_K, 4096, 2048), mat(quant.F32, 32, 2048), mat(quant.F32, 32, 2048)}, 1, 2},
		{"prompt rows, mixed", []*Weight{mat(quant.Q8_0, 100, 512), mat(quant.Q6_K, 3000, 1024), mat(quant.F16, 7, 4096)}, 64, 4},
		{"one small job", []*Weight{mat(quant.Q4_K, 3, 256)}, 1, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			jobs := make([]proj, len(tc.ws))
			total, maxRow := 0, 0
			for i, w := range tc.ws {
				jobs[i] = proj{w: w}
				total += rowCost(w, tc.n) * w.Rows
				maxRow = max(maxRow, rowCost(w, tc.n))
			}
			var ws workspace
			ws.planChunks(jobs, tc.n, total, tc.threads)
			j, next := 0, 0
			free := make([]int, tc.threads) // when each worker is free
			for _, c := range ws.chunks {
				if int(c.j) != j || int(c.lo) != next {
					if int(c.j) != j+1 || c.lo != 0 || next != tc.ws[j].Rows {
						t.Fatalf("chunk %+v: want job %d from row %d (or the next job from 0)", c, j, next)
					}
					j, next = j+1, 0
				}
				if c.hi <= c.lo || int(c.hi) > tc.ws[j].Rows {
					t.Fatalf("chunk %+v: rows outside job %d's %d", c, j, tc.ws[j].Rows)
				}
				next = int(c.hi)
				w := 0
				for i := range free {
					if free[i] < free[w] {
						w = i
					}
				}
				free[w] += rowCost(tc.ws[j], tc.n) * int(c.hi-c.lo)
			}
			if j != len(jobs)-1 || next != tc.ws[j].Rows {
				t.Fatalf("chunks end at job %d row %d: not every row planned", j, next)
			}
			end := 0
			for _, f := range free {
				end = max(end, f)
			}
			if limit := total/tc.threads + minChunkCost + maxRow; end > limit {
				t.Errorf("last worker done at %d, want <= %d (ideal %d): %d chunks %v", end, limit, total/tc.threads, len(ws.chunks), ws.chunks)
			}
		})
	}
}

// TestHeadState checks the recurrent state's head order: every value head
// gets its own S x S slot of the layer's state (a permutation), and the
// heads of one key head (kh, kh+K, ...: one deltaNetHeads unit) lie side
// by side in the order the unit runs them.
func TestHeadState(t *testing.T) {
	for _, sh := range [][2]int{{16, 32}, {16, 64}, {2, 2}, {1, 4}, {4, 12}} {
		p := Params{SSMGroups: sh[0], SSMHeads: sh[1], SSMState: 4}
		H, K, S := p.SSMHeads, p.SSMGroups, p.SSMState
		ssm := make([]float32, H*S*S)
		seen := make([]bool, H)
		for kh := range K {
			prev := -1
			for h := kh; h < H; h += K {
				st := headState(p, ssm, h)
				if len(st) != S*S {
					t.Fatalf("K %d H %d: head %d has %d floats, want %d", K, H, h, len(st), S*S)
				}
				slot := (cap(ssm) - cap(st)) / (S * S)
				if seen[slot] {
					t.Fatalf("K %d H %d: head %d shares slot %d", K, H, h, slot)
				}
				seen[slot] = true
				if prev >= 0 && slot != prev+1 {
					t.Errorf("K %d H %d: head %d at slot %d, want %d (after head %d)", K, H, h, slot, prev+1, h-K)
				}
				prev = slot
			}
		}
	}
}
