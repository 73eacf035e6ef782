package modelgen

import (
	"fmt"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// ArchQwen3MoE is llama.cpp's qwen3moe: every layer has GQA attention
// with q/k norms and a routed MoE FFN. The default (empty Spec.Arch).
// Loaded by engine/model/qwen3moe.go.
const ArchQwen3MoE = "qwen3moe"

func init() {
	register(&generator{
		arch:     ArchQwen3MoE,
		metadata: qwen3moeMetadata,
		layer:    qwen3moeLayer,
		describe: qwen3moeDescribe,
	})
}

// qwen3moeMetadata writes the keys llama.cpp's qwen3moe load_hparams reads,
// in the order of the fixtures (fixtures/README.md).
func qwen3moeMetadata(s Spec, w *gguf.Writer, a string) {
	attentionKeys(s, w, a)
	ropeNormKeys(s, w, a)
	expertKeys(s, w, a)
}

// qwen3moeLayer adds layer il's tensors with the shapes of llama.cpp's
// src/models/qwen3moe.cpp load_arch_tensors; the Q4_K_M mix gives attn_v
// and ffn_down_exps Q6_K in the second half of the layers (as the fixture
// model C).
func qwen3moeLayer(s Spec, p *planner, il int) {
	d, qd, kd := s.Embd, s.Heads*s.HeadDim, s.HeadsKV*s.HeadDim
	b := func(n string) string { return blk(il, n) }
	late := il >= s.Layers/2
	p.add(b("attn_norm"), quant.F32, 1, 0.1, d)
	p.add(b("attn_q"), s.mixType(d, false), 0, isd(d), d, qd)
	p.add(b("attn_k"), s.mixType(d, false), 0, isd(d), d, kd)
	p.add(b("attn_v"), s.mixType(d, late), 0, isd(d), d, kd)
	p.add(b("attn_output"), s.mixType(qd, false), 0, 4*isd(qd), qd, d)
	p.add(b("attn_q_norm"), quant.F32, 2.5, 0.5, s.HeadDim)
	p.add(b("attn_k_norm"), quant.F32, 2.5, 0.5, s.HeadDim)
	p.add(b("ffn_norm"), quant.F32, 1, 0.1, d)
	p.add(b("ffn_gate_inp"), quant.F32, 0, 1.5*isd(d), d, s.Experts)
	p.gateUp(s, il, s.mixType(d, false))
	p.add(b("ffn_down_exps"), s.mixType(s.ExpertFF, late), 0, 4*isd(s.ExpertFF), s.ExpertFF, d, s.Experts)
}

// qwen3moeDescribe returns Describe's phrases.
func qwen3moeDescribe(s Spec) []string {
	return []string{fmt.Sprintf("%d layers", s.Layers), fmt.Sprintf("d %d", s.Embd),
		fmt.Sprintf("heads %d/%d x %d", s.Heads, s.HeadsKV, s.HeadDim),
		fmt.Sprintf("experts %d top-%d ffn %d", s.Experts, s.ExpertsUsed, s.ExpertFF)}
}
