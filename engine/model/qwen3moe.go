package model

// qwen3moe: Qwen3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B), llama.cpp
// src/models/qwen3moe.cpp at commit 3f545bec. Every layer is softmax
// attention (GQA, per-head q/k RMSNorm, NEOX RoPE) followed by a routed
// MoE without a shared expert:
//
//	h  = x + attn_output(attention(rope(q_norm(attn_q n)), rope(k_norm(attn_k n)), attn_v n)),  n = rmsnorm(x) * attn_norm
//	x' = h + moe(rmsnorm(h) * ffn_norm)
func init() {
	register(&arch{
		name: "qwen3moe",
		// attn_norm, attn_q/k/v/output, attn_q_norm/k_norm, ffn_norm,
		// ffn_gate_inp, ffn_gate_up_exps (or gate + up), ffn_down_exps.
		tensorsPerLayer: 11,
		block:           qwen3moeBlock,
	})
}

// qwen3moeBlock loads layer il (load_arch_tensors in qwen3moe.cpp).
func qwen3moeBlock(l *loader, p *Params, il int, b *Block) {
	n := func(s string) string { return blk(il, s+".weight") }
	b.AttnNorm = l.vector(n("attn_norm"), p.Embd)
	b.Attn = &Attention{
		Q:      l.matrix(n("attn_q"), p.Heads*p.HeadDim, p.Embd),
		K:      l.matrix(n("attn_k"), p.HeadsKV*p.HeadDim, p.Embd),
		V:      l.matrix(n("attn_v"), p.HeadsKV*p.HeadDimV, p.Embd),
		Output: l.matrix(n("attn_output"), p.Embd, p.Heads*p.HeadDimV),
		QNorm:  l.vector(n("attn_q_norm"), p.HeadDim),
		KNorm:  l.vector(n("attn_k_norm"), p.HeadDim),
	}
	b.FFNNorm = l.vector(n("ffn_norm"), p.Embd)
	b.MoE.GateInp = l.matrix(n("ffn_gate_inp"), p.Experts, p.Embd)
}
