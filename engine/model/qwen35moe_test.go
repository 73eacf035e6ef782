package model

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// openFixture parses fixture name (skipping without ../shared).
func openFixture(t *testing.T, name string) *gguf.File {
	t.Helper()
	skipNoFixtures(t)
	f, err := gguf.Open(filepath.Join(fixtureDir(name), name+".gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// fuseGateUp rewrites f with every layer's ffn_gate_exps and ffn_up_exps
// as one ffn_gate_up_exps (per expert: gate rows, then up rows; llama.cpp
// create_tensor_gate_up_exps), everything else unchanged.
func fuseGateUp(t *testing.T, f *gguf.File) *gguf.File {
	t.Helper()
	fused := 0
	w := copyWriter(t, f, func(ti *gguf.TensorInfo, data *[]byte) bool {
		if strings.HasSuffix(ti.Name, ".ffn_up_exps.weight") {
			return false
		}
		if !strings.HasSuffix(ti.Name, ".ffn_gate_exps.weight") {
			return true
		}
		up, err := f.Tensor(strings.Replace(ti.Name, "gate_exps", "up_exps", 1))
		if err != nil || up.Type != ti.Type || !slices.Equal(up.Dims, ti.Dims) {
			t.Fatalf("%s: up %v", ti.Name, err)
		}
		per := len(*data) / int(ti.Dims[2])
		out := make([]byte, 0, 2*len(*data))
		for e := range int(ti.Dims[2]) {
			out = append(out, (*data)[e*per:(e+1)*per]...)
			out = append(out, up.Data[e*per:(e+1)*per]...)
		}
		*data = out
		ti.Name = strings.Replace(ti.Name, "gate_exps", "gate_up_exps", 1)
		ti.Dims = []uint64{ti.Dims[0], 2 * ti.Dims[1], ti.Dims[2]}
		fused++
		return true
	})
	if fused == 0 {
		t.Fatal("no expert tensors fused")
	}
	return reparse(t, w)
}

// TestFusedGateUpExps: a file whose experts are stored as llama.cpp's fused
// ffn_gate_up_exps decodes bit-identically to the same weights stored
// separately, for both architectures.
func TestFusedGateUpExps(t *testing.T) {
	check := func(t *testing.T, f *gguf.File) {
		m1, err := Load(f)
		if err != nil {
			t.Fatal(err)
		}
		m2, err := Load(fuseGateUp(t, f))
		if err != nil {
			t.Fatal(err)
		}
		if m1.BytesPerToken() != m2.BytesPerToken() {
			t.Errorf("bytes per token %d vs %d", m1.BytesPerToken(), m2.BytesPerToken())
		}
		toks := testTokens[:6]
		sameBits(t, "fused vs separate", run(t, m2, toks, 3), run(t, m1, toks, 3))
	}
	t.Run("qwen3moe", func(t *testing.T) { f, _ := parseBytes(t, modelgen.Tiny); check(t, f) })
	t.Run("qwen35moe-fixture", func(t *testing.T) { check(t, openFixture(t, "tiny-qwen35moe-F16")) })
	t.Run("qwen35moe-generated", func(t *testing.T) { f, _ := parseBytes(t, modelgen.TinyQwen35MoE); check(t, f) })
}

// TestQwen35BatchInvariance: prompt rows in one batch, in uneven batches,
// one at a time and on 1 thread give bit-identical logits (the recurrent
// layers run the same per-token delta rule for prompt and generation rows,
// as llama.cpp's CPU gated_delta_net does), and two interleaved sequences
// equal each decoded alone.
func TestQwen35BatchInvariance(t *testing.T) {
	m := tinyQwen35(t)
	toks := []int32{464, 313, 286, 481, 318, 2, 500, 7, 123}
	ref := run(t, m, toks, 1)
	sameBits(t, "one batch", run(t, m, toks, len(toks)), ref)
	sameBits(t, "batches of 4", run(t, m, toks, 4), ref)
	m.SetThreads(1)
	sameBits(t, "1 thread", run(t, m, toks, len(toks)), ref)
	m.SetThreads(0)

	v := m.Params().Vocab
	other := []int32{9, 8, 7, 6, 5}
	refOther := run(t, m, other, 1)
	a, b := m.NewSequence(), m.NewSequence()
	var rows []Row
	for i := range other {
		rows = append(rows, Row{Seq: a, Token: toks[i], Pos: i, Logits: true}, Row{Seq: b, Token: other[i], Pos: i, Logits: true})
	}
	lg := make([]float32, len(rows)*v)
	if err := m.Forward(context.Background(), rows, lg); err != nil {
		t.Fatal(err)
	}
	for i := range other {
		sameBits(t, "interleaved a", lg[2*i*v:(2*i+1)*v], ref[i*v:(i+1)*v])
		sameBits(t, "interleaved b", lg[(2*i+1)*v:(2*i+2)*v], refOther[i*v:(i+1)*v])
	}
}

// tinyQwen35 loads the embedded default model (a generated tiny qwen35moe,
// no fixtures needed).
func tinyQwen35(t *testing.T) *Model {
	t.Helper()
	_, m := parseBytes(t, modelgen.TinyQwen35MoE)
	if m.Params().Arch != "qwen35moe" {
		t.Fatalf("architecture %q", m.Params().Arch)
	}
	return m
}

// failAt fails the expert call of one layer.
type failAt struct {
	m     *Model
	layer int
}

var errInjected = errors.New("injected expert failure")

func (c failAt) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	if layer == c.layer {
		return errInjected
	}
	return c.m.LocalExperts().ComputeExperts(ctx, layer, hidden, ids, n, k, out)
}

// TestRecurrentSequence: a recurrent sequence resets with Truncate(0) to a
// state equal to a new one, refuses to rewind to a non-zero earlier length,
// and after a Forward that failed midway refuses to continue until reset.
func TestRecurrentSequence(t *testing.T) {
	m := tinyQwen35(t)
	toks := []int32{464, 313, 286, 481}
	ref := run(t, m, toks, 2)
	v := m.Params().Vocab
	seq := m.NewSequence()
	if !seq.Recurrent() {
		t.Fatal("qwen35moe sequence not recurrent")
	}
	feed := func(s *Sequence, from int, tk []int32) ([]float32, error) {
		rows := make([]Row, len(tk))
		for i := range tk {
			rows[i] = Row{Seq: s, Token: tk[i], Pos: from + i, Logits: true}
		}
		lg := make([]float32, len(tk)*v)
		return lg, m.Forward(context.Background(), rows, lg)
	}
	if _, err := feed(seq, 0, []int32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := seq.Truncate(1); !errors.Is(err, ErrRewind) {
		t.Errorf("Truncate(1) of 3: %v, want ErrRewind", err)
	}
	if err := seq.Truncate(3); err != nil {
		t.Errorf("Truncate(Len): %v", err)
	}
	if err := seq.Truncate(0); err != nil {
		t.Fatal(err)
	}
	lg, err := feed(seq, 0, toks)
	if err != nil {
		t.Fatal(err)
	}
	sameBits(t, "after Truncate(0)", lg, ref)

	// Layer 1's experts fail: layer 0 (recurrent) has already advanced.
	seq = m.NewSequence()
	m.SetExperts(failAt{m, 1})
	if _, err := feed(seq, 0, toks[:2]); !errors.Is(err, errInjected) {
		t.Fatalf("failing experts: %v", err)
	}
	m.SetExperts(nil)
	if seq.Len() != 0 {
		t.Errorf("Len %d after a failed Forward", seq.Len())
	}
	if _, err := feed(seq, 0, toks[:2]); !errors.Is(err, ErrRewind) {
		t.Errorf("Forward on a lost sequence: %v, want ErrRewind", err)
	}
	if err := seq.Truncate(0); err != nil {
		t.Fatal(err)
	}
	if lg, err = feed(seq, 0, toks); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "after a failure and Truncate(0)", lg, ref)
}

// TestQwen35LoadErrors: bad qwen35moe files are refused with an error
// naming the problem.
func TestQwen35LoadErrors(t *testing.T) {
	f, _ := parseBytes(t, modelgen.TinyQwen35MoE)
	cases := []struct {
		name  string
		edit  func(w *gguf.Writer)
		drop  string
		want  error
		words string
	}{
		{name: "missing ssm_a", drop: "blk.1.ssm_a", want: ErrTensor, words: "blk.1.ssm_a"},
		{name: "missing attn_gate", drop: "blk.0.attn_gate.weight", want: ErrTensor, words: "attn_gate"},
		{name: "missing shared expert", drop: "blk.3.ffn_down_shexp.weight", want: ErrTensor, words: "ffn_down_shexp"},
		{name: "recurrent layer count", edit: func(w *gguf.Writer) {
			w.Set("qwen35moe.attention.recurrent_layers", gguf.Array([]bool{true, true, true}))
		}, want: ErrMetadata, words: "recurrent_layers"},
		{name: "recurrent flags disagree with tensors", edit: func(w *gguf.Writer) {
			w.Set("qwen35moe.attention.recurrent_layers", gguf.Array([]bool{true, true, true, true}))
		}, want: ErrTensor, words: "blk.3.attn_qkv"},
		{name: "inner size", edit: func(w *gguf.Writer) { w.SetUint32("qwen35moe.ssm.inner_size", 128) }, want: ErrMetadata, words: "inner_size"},
		{name: "no rope sections", edit: func(w *gguf.Writer) { w.Set("qwen35moe.rope.dimension_sections", gguf.String("x")) }, want: ErrMetadata, words: "dimension_sections"},
		{name: "MTP blocks >= block_count", edit: func(w *gguf.Writer) { w.SetUint32("qwen35moe.nextn_predict_layers", 4) }, want: ErrMetadata, words: "nextn_predict_layers"},
		{name: "unknown architecture", edit: func(w *gguf.Writer) { w.SetString("general.architecture", "qwen4moe") }, want: ErrArchitecture, words: "qwen35moe"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := copyWriter(t, f, func(ti *gguf.TensorInfo, _ *[]byte) bool { return ti.Name != c.drop })
			if c.edit != nil {
				c.edit(w)
			}
			_, err := Load(reparse(t, w))
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.words) {
				t.Errorf("error %v, want %v naming %q", err, c.want, c.words)
			}
		})
	}
	// The recurrent_layers array that matches the interval loads.
	w := copyWriter(t, f, nil)
	w.Set("qwen35moe.attention.recurrent_layers", gguf.Array([]bool{true, true, true, false}))
	m, err := Load(reparse(t, w))
	if err != nil {
		t.Fatal(err)
	}
	if p := m.Params(); p.RecurrentCount != 3 || m.Blocks[3].Attn == nil || m.Blocks[2].Linear == nil {
		t.Errorf("recurrent count %d, block 3 attention %v", p.RecurrentCount, m.Blocks[3].Attn != nil)
	}
}

// TestQwen35MTPBlock: a file with a multi-token-prediction block after the
// main ones (block_count 5, nextn_predict_layers 1, as llama.cpp converts
// Qwen3.5 with its MTP head) runs the 4 main layers exactly as the file
// without it, and still holds the MTP block's routed experts.
func TestQwen35MTPBlock(t *testing.T) {
	f, base := parseBytes(t, modelgen.TinyQwen35MoE)
	w := copyWriter(t, f, nil)
	for _, ti := range f.Tensors { // blk.4 = a copy of attention block 3, plus an MTP-only tensor
		if rest, ok := strings.CutPrefix(ti.Name, "blk.3."); ok {
			tn, _ := f.Tensor(ti.Name)
			if err := w.AddTensor("blk.4."+rest, ti.Type, ti.Dims, tn.Data); err != nil {
				t.Fatal(err)
			}
		}
	}
	d := uint64(base.Params().Embd)
	if err := w.AddTensor("blk.4.nextn.eh_proj.weight", quant.F32, []uint64{2 * d, d}, make([]byte, 4*2*d*d)); err != nil {
		t.Fatal(err)
	}
	w.SetUint32("qwen35moe.block_count", 5)
	w.SetUint32("qwen35moe.nextn_predict_layers", 1)
	m, err := Load(reparse(t, w))
	if err != nil {
		t.Fatal(err)
	}
	if p := m.Params(); p.Layers != 4 || p.ExpertLayers != 5 || p.NextN != 1 || len(m.Blocks) != 4 || m.LocalExperts().NumLayers() != 5 {
		t.Fatalf("layers %d, expert layers %d, nextn %d, blocks %d, local expert layers %d",
			p.Layers, p.ExpertLayers, p.NextN, len(m.Blocks), m.LocalExperts().NumLayers())
	}
	toks := []int32{3, 1, 4, 1, 5}
	sameBits(t, "with an MTP block", run(t, m, toks, 5), run(t, base, toks, 5))
}

// TestMemoryBytesPerToken: the traffic of a tiny qwen35moe's sequence
// memory, worked by hand from its hyperparameters (3 Gated DeltaNet layers
// of 4 value heads, state 64, 2 key heads, conv 4; one attention layer of 2
// KV heads of 64), and equal to what NewSequence allocates for the
// recurrent layers.
func TestMemoryBytesPerToken(t *testing.T) {
	m := tinyQwen35(t)
	// Per recurrent layer: (4*64*64 + 3*(2*2+4)*64) floats, read and written.
	const rec = 2 * 4 * (4*64*64 + 3*(2*2+4)*64) // 143,360 bytes
	for _, c := range []struct{ pos, want int64 }{
		{0, 3*rec + 1*2*(64+64)*4},  // one position of K and V
		{9, 3*rec + 10*2*(64+64)*4}, // ten
		{-5, 3*rec + 1*2*(64+64)*4}, // clamped to 0
	} {
		if got := m.MemoryBytesPerToken(int(c.pos)); got != c.want {
			t.Errorf("pos %d: %d bytes, want %d", c.pos, got, c.want)
		}
	}
	s := m.NewSequence()
	var alloc int64
	for _, mem := range s.mem {
		alloc += 4 * int64(len(mem.conv)+len(mem.ssm))
	}
	if alloc != 3*rec/2 {
		t.Errorf("NewSequence holds %d bytes of recurrent state; MemoryBytesPerToken moves %d (want twice)", alloc, 3*rec)
	}
}
