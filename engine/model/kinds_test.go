package model

import (
	"context"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// TestSoftmaxTopK: without normalisation the weights are the chosen
// experts' softmax probabilities; SoftmaxTopKNorm picks the same experts.
func TestSoftmaxTopK(t *testing.T) {
	// Probabilities proportional to 1, 2, 3, 4: top-2 = experts 3, 2 with
	// weights 4/10, 3/10.
	logits := []float32{0, float32(math.Log(2)), float32(math.Log(3)), float32(math.Log(4))}
	ids, w := make([]int32, 2), make([]float32, 2)
	if err := SoftmaxTopK(logits, make([]float32, 4), ids, w); err != nil {
		t.Fatal(err)
	}
	if ids[0] != 3 || ids[1] != 2 || math.Abs(float64(w[0])-0.4) > 1e-6 || math.Abs(float64(w[1])-0.3) > 1e-6 {
		t.Errorf("ids %v weights %v, want [3 2] [0.4 0.3]", ids, w)
	}
	nids, nw := make([]int32, 2), make([]float32, 2)
	if err := SoftmaxTopKNorm(logits, make([]float32, 4), nids, nw); err != nil || nids[0] != 3 || nids[1] != 2 {
		t.Errorf("SoftmaxTopKNorm: %v %v", nids, err)
	}
	if err := SoftmaxTopK(logits, make([]float32, 4), ids, w[:1]); err == nil {
		t.Error("SoftmaxTopK with 2 ids and 1 weight: no error")
	}
}

// TestLoadKinds: the architectures' per-layer choices as Load stores them.
func TestLoadKinds(t *testing.T) {
	_, m := parseBytes(t, modelgen.Tiny)
	for il, b := range m.Blocks {
		if b.Memory != MemoryKV || b.FFN != FFNMoE || b.MoE == nil || b.MoE.Shared != nil || b.Dense != nil {
			t.Errorf("qwen3moe blk.%d: memory %v ffn %v shared %v", il, b.Memory, b.FFN, b.MoE.Shared != nil)
		}
	}
	m = tinyQwen35(t)
	for il, b := range m.Blocks {
		want := MemoryRecurrent
		if il == 3 {
			want = MemoryKV
		}
		if b.Memory != want || b.FFN != FFNMoE || b.MoE.Shared == nil || b.MoE.Shared.Gating != SharedSigmoid {
			t.Errorf("qwen35moe blk.%d: memory %v (want %v) ffn %v", il, b.Memory, want, b.FFN)
		}
	}
	seq := m.NewSequence()
	if !seq.Recurrent() || seq.mem[0].ssm == nil || seq.mem[3].ssm != nil {
		t.Errorf("sequence memory: recurrent %v, layer 0 state %v, layer 3 state %v",
			seq.Recurrent(), seq.mem[0].ssm != nil, seq.mem[3].ssm != nil)
	}
	if MemoryRecurrent.String() != "recurrent" || FFNDense.String() != "dense" || FFNKind(9).String() != "FFNKind(9)" {
		t.Error("kind names")
	}
}

// TestBlockCheck: a loader that fills in other blocks than its kinds say
// is refused.
func TestBlockCheck(t *testing.T) {
	m := tinyQwen35(t)
	good := m.Blocks[3]
	for name, edit := range map[string]func(b *Block){
		"memory":    func(b *Block) { b.Memory = MemoryRecurrent },
		"both":      func(b *Block) { b.Linear = m.Blocks[0].Linear },
		"ffn":       func(b *Block) { b.FFN = FFNDense },
		"no router": func(b *Block) { b.MoE = &MoE{} },
	} {
		b := good
		edit(&b)
		if err := b.check("test", 3); err == nil || !strings.Contains(err.Error(), "blk.3") {
			t.Errorf("%s: %v", name, err)
		}
	}
	if err := good.check("test", 3); err != nil {
		t.Error(err)
	}
}

// TestDenseFFN holds a dense layer's FFN to a reference computed with
// quant.MatMul and expert.SwiGLU, and an ungated shared expert to the
// sigmoid-gated one divided by its gate.
func TestDenseFFN(t *testing.T) {
	m := tinyQwen35(t)
	p, d := m.p, m.p.Embd
	sh := m.Blocks[0].MoE.Shared
	f := &sh.FeedForward
	ff := f.Gate.Rows
	const n = 3
	m.ws.ensure(p, m.ffnFF, m.gated, n)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range n * d {
		m.ws.xn[i], m.ws.x[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
	}
	x0 := append([]float32(nil), m.ws.x[:n*d]...)
	g, u, want := make([]float32, n*ff), make([]float32, n*ff), make([]float32, n*d)
	for _, mm := range []struct {
		w   *Weight
		x   []float32
		out []float32
	}{{&f.Gate, m.ws.xn[:n*d], g}, {&f.Up, m.ws.xn[:n*d], u}} {
		if err := quant.MatMul(mm.w.Type, mm.w.Data, mm.w.Rows, mm.w.Cols, mm.x, n, mm.out, 1); err != nil {
			t.Fatal(err)
		}
	}
	expert.SwiGLU(g, g, u)
	if err := quant.MatMul(f.Down.Type, f.Down.Data, d, ff, g, n, want, 1); err != nil {
		t.Fatal(err)
	}
	if err := m.dense(f, n); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if got := m.ws.x[i]; got != x0[i]+want[i] {
			t.Fatalf("dense[%d] = %v, want %v", i, got, x0[i]+want[i])
		}
	}
	if err := m.shared(&SharedExpert{FeedForward: *f, Gating: SharedUngated}, n); err != nil {
		t.Fatal(err)
	}
	ungated := append([]float32(nil), m.ws.ffOut[:n*d]...)
	if err := m.shared(sh, n); err != nil {
		t.Fatal(err)
	}
	for i := range ungated {
		gate := sigmoid(quant.DotF32(sh.GateInp, m.ws.xn[i/d*d:(i/d+1)*d]))
		if ungated[i] != want[i] || m.ws.ffOut[i] != ungated[i]*gate {
			t.Fatalf("shared[%d]: ungated %v (want %v), gated %v", i, ungated[i], want[i], m.ws.ffOut[i])
		}
	}
}

// TestForwardDenseLayer runs a model whose last layer is made dense (its
// shared expert's weights as the FFN): Forward takes the FFNDense path,
// gives finite logits, and BytesPerToken drops that layer's experts.
func TestForwardDenseLayer(t *testing.T) {
	m := tinyQwen35(t)
	before := m.BytesPerToken()
	b := &m.Blocks[3]
	routed := m.p.ExpertsUsed*b.MoE.Experts.ExpertBytes() + b.MoE.GateInp.Bytes()
	b.FFN, b.Dense, b.MoE = FFNDense, &b.MoE.Shared.FeedForward, nil
	if err := b.check("test", 3); err != nil {
		t.Fatal(err)
	}
	if got := m.BytesPerToken(); got != before-int64(routed) {
		t.Errorf("BytesPerToken %d, want %d - %d", got, before, routed)
	}
	seq := m.NewSequence()
	v := m.p.Vocab
	logits := make([]float32, 2*v)
	rows := []Row{{Seq: seq, Token: 1, Pos: 0, Logits: true}, {Seq: seq, Token: 2, Pos: 1, Logits: true}}
	if err := m.Forward(context.Background(), rows, logits); err != nil {
		t.Fatal(err)
	}
	for i, x := range logits {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatalf("logit %d = %v", i, x)
		}
	}
}

// TestArchitecturesHaveGenerators: every architecture this package loads
// has a generator in engine/modelgen (registered by its file there), and
// the reverse, so each one's loader is tested on generated files.
func TestArchitecturesHaveGenerators(t *testing.T) {
	if got, want := strings.Join(modelgen.Architectures(), ","), strings.Join(Architectures(), ","); got != want {
		t.Errorf("modelgen writes %s, model loads %s", got, want)
	}
}

// TestSoftmaxTopKOrder: SoftmaxTopK's slots are those of the definition
// (slot s takes the untaken expert of the highest probability, the lowest
// id among equals), here computed by k passes of argmax over the
// probabilities, on random logits with many ties, for every k.
func TestSoftmaxTopKOrder(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	for trial := range 300 {
		ne := 1 + r.IntN(40)
		logits := make([]float32, ne)
		for e := range logits {
			logits[e] = float32(r.IntN(6)) * 0.5 // few distinct values: ties
			if trial%3 == 0 {
				logits[e] = float32(r.NormFloat64())
			}
		}
		k := 1 + r.IntN(ne)
		ids, w := make([]int32, k), make([]float32, k)
		if err := SoftmaxTopK(logits, make([]float32, ne), ids, w); err != nil {
			t.Fatal(err)
		}
		p := make([]float32, ne)
		softmax(p, logits)
		taken := make([]bool, ne)
		for s := range k {
			best := -1
			for e, v := range p {
				if !taken[e] && (best < 0 || v > p[best]) {
					best = e
				}
			}
			taken[best] = true
			if ids[s] != int32(best) || math.Float32bits(w[s]) != math.Float32bits(p[best]) {
				t.Fatalf("trial %d (k %d of %d, logits %v): slot %d = expert %d (%v), want %d (%v)", trial, k, ne, logits, s, ids[s], w[s], best, p[best])
			}
		}
	}
}
