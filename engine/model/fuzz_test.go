package model

import (
	"bytes"
	"context"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// fuzzSpec is a small qwen3moe model (about 60 KB) for the fuzz corpus.
func fuzzSpec() modelgen.Spec {
	return modelgen.Spec{Name: "fuzz", Layers: 1, Embd: 64, Heads: 2, HeadsKV: 1, HeadDim: 32, Experts: 4,
		ExpertsUsed: 2, ExpertFF: 32, Context: 16, RopeBase: 1e4, NormEps: 1e-6, Vocab: 300, Type: quant.Q8_0, Seed: 1}
}

// fuzzSpec35 is a small qwen35moe model: layer 0 Gated DeltaNet, layer 1
// gated attention, routed and shared experts.
func fuzzSpec35() modelgen.Spec {
	return modelgen.Spec{Name: "fuzz35", Arch: modelgen.ArchQwen35MoE, Layers: 2, Embd: 64, Heads: 2, HeadsKV: 1,
		HeadDim: 32, Experts: 4, ExpertsUsed: 2, ExpertFF: 32, Context: 16, RopeBase: 1e4, NormEps: 1e-6, Vocab: 300,
		FullAttnInterval: 2, SSMConv: 4, SSMState: 16, SSMGroups: 1, SSMDtRank: 2, SSMInner: 32, RopeDim: 8,
		RopeSections: [4]int{2, 1, 1, 0}, SharedFF: 32, Type: quant.Q8_0, Seed: 1}
}

// FuzzLoad: Load never panics on a parseable GGUF, and a model it accepts
// runs a two-token Forward without panicking (errors are fine).
func FuzzLoad(f *testing.F) {
	w, err := modelgen.Build(fuzzSpec())
	if err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		f.Fatal(err)
	}
	valid := buf.Bytes()
	f.Add(valid)
	f.Add(valid[:len(valid)/2])
	f.Add(valid[:64])
	// Oversized counts: the tensor count field (bytes 8..16) set huge.
	big := bytes.Clone(valid)
	for i := 8; i < 16; i++ {
		big[i] = 0xff
	}
	f.Add(big)
	// A wrong-typed hyperparameter: rename a key so block_count is missing.
	f.Add(bytes.Replace(valid, []byte("qwen3moe.block_count"), []byte("qwen3moe.block_cnunt"), 1))
	// qwen35moe: valid, truncated, and with recurrent hyperparameters or
	// tensors renamed away.
	w35, err := modelgen.Build(fuzzSpec35())
	if err != nil {
		f.Fatal(err)
	}
	buf.Reset()
	if _, err := w35.WriteTo(&buf); err != nil {
		f.Fatal(err)
	}
	v35 := bytes.Clone(buf.Bytes())
	f.Add(v35)
	f.Add(v35[:len(v35)*2/3])
	for _, pair := range [][2]string{{"qwen35moe.ssm.inner_size", "qwen35moe.ssm.inner_sizz"},
		{"qwen35moe.full_attention_interval", "qwen35moe.full_attention_intervak"},
		{"blk.0.ssm_a", "blk.0.ssm_b"}, {"blk.1.attn_q.weight", "blk.1.attn_x.weight"}} {
		f.Add(bytes.Replace(v35, []byte(pair[0]), []byte(pair[1]), 1))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := gguf.Parse(data)
		if err != nil {
			return
		}
		m, err := Load(g)
		if err != nil {
			return
		}
		seq := m.NewSequence()
		lg := make([]float32, m.Params().Vocab)
		_ = m.Forward(context.Background(), []Row{{Seq: seq, Token: 0}, {Seq: seq, Token: 1 % int32(m.Params().Vocab), Pos: 1, Logits: true}}, lg)
	})
}
