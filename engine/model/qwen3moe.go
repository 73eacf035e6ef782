package model

// qwen3moe: Qwen3 MoE (Qwen3-30B-A3B, Qwen3-235B-A22B), llama.cpp
// src/models/qwen3moe.cpp at commit 3f545bec. Every layer is softmax
// attention (GQA, per-head q/k RMSNorm, NEOX RoPE; MemoryKV) followed by a
// routed MoE (FFNMoE; SoftmaxTopKNorm: norm_w = true) without a shared
// expert:
//
//	h  = x + attn_output(attention(rope(q_norm(attn_q n)), rope(k_norm(attn_k n)), attn_v n)),  n = rmsnorm(x) * attn_norm
//	x' = h + moe(rmsnorm(h) * ffn_norm)
//
// Its generator (the writer of such files) is engine/modelgen/qwen3moe.go.
func init() {
	register(&arch{
		name: "qwen3moe",
		// attn_norm, attn_q/k/v/output, attn_q_norm/k_norm, ffn_norm,
		// ffn_gate_inp, ffn_gate_up_exps (or gate + up), ffn_down_exps.
		tensorsPerLayer: 11,
		params:          noParams,
		memory:          kvEveryLayer,
		ffn:             moeEveryLayer,
		block:           qwen3moeBlock,
	})
}

// qwen3moeBlock loads layer il (load_arch_tensors in qwen3moe.cpp).
func qwen3moeBlock(l *loader, p *Params, il int, b *Block) {
	b.AttnNorm = l.vector(blk(il, "attn_norm.weight"), p.Embd)
	b.Attn = l.attention(p, il, false)
	b.FFNNorm = l.vector(blk(il, "ffn_norm.weight"), p.Embd)
	b.MoE = l.moe(p, il, SoftmaxTopKNorm)
}
