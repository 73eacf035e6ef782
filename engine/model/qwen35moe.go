package model

import (
	"fmt"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// qwen35moe: Qwen3.5 / Qwen3.6 MoE (Qwen3.5-35B-A3B, -122B-A10B,
// -397B-A17B), llama.cpp src/models/qwen35moe.cpp and
// src/models/delta-net-base.cpp at commit 3f545bec (spelled out in
// fixtures/qwen35moe/README.md). Layer il is a Gated DeltaNet (linear
// attention with a recurrent state) unless (il+1) % full_attention_interval
// == 0 (or as attention.recurrent_layers says), in which case it is gated
// softmax attention (q and a per-head output gate from one attn_q, q/k
// RMSNorm, IMROPE); every layer ends in a routed MoE (FFNMoE,
// SoftmaxTopKNorm) plus a sigmoid-gated shared expert (SharedSigmoid):
//
//	h  = x + mixer(rmsnorm(x) * attn_norm)
//	x' = h + moe(n) + sigmoid(ffn_gate_inp_shexp . n) * shexp(n),  n = rmsnorm(h) * post_attention_norm
//
// Multi-token-prediction blocks (nextn_predict_layers > 0, the last ones of
// block_count, as llama.cpp's converter writes Qwen3.5's MTP head) are not
// run by llama.cpp's main graph, nor here: Forward runs the first
// block_count - nextn_predict_layers layers. The MTP block's routed
// experts belong to the file's expert set; the block itself (one, as
// llama.cpp supports) is loaded as Model.MTP when all its tensors are
// there and run by MTPDrafter (mtp.go, llama.cpp's graph_mtp).
//
// Its generator (the writer of such files) is engine/modelgen/qwen35moe.go.
func init() {
	register(&arch{
		name: "qwen35moe",
		// attention layer: attn_norm, post_attention_norm, attn_q/k/v/output,
		// attn_q_norm/k_norm, ffn_gate_inp, ffn_gate_up_exps, ffn_down_exps,
		// ffn_gate_inp_shexp, ffn_gate/up/down_shexp; recurrent layers have
		// more.
		tensorsPerLayer: 15,
		params:          qwen35moeParams,
		memory:          qwen35moeMemory,
		ffn:             moeEveryLayer,
		block:           qwen35moeBlock,
		// The MTP block is a full-attention block (llama.cpp's
		// load_block_mtp), as qwen35moeBlock loads it with MemoryKV.
		mtp: qwen35moeBlock,
	})
}

// qwen35moeParams reads load_arch_hparams's keys.
func qwen35moeParams(l *loader, p *Params) {
	l.uint("expert_shared_feed_forward_length", &p.SharedFF, 0, false)
	l.uint("ssm.conv_kernel", &p.SSMConv, 0, true)
	l.uint("ssm.inner_size", &p.SSMInner, 0, true)
	l.uint("ssm.state_size", &p.SSMState, 0, true)
	l.uint("ssm.time_step_rank", &p.SSMHeads, 0, true)
	l.uint("ssm.group_count", &p.SSMGroups, 0, true)
	l.uint("full_attention_interval", &p.AttnInterval, 4, false)
	l.uint("nextn_predict_layers", &p.NextN, 0, false)
	if sec, ok := l.ints("rope.dimension_sections", true); ok {
		if len(sec) > 4 || len(sec) == 0 {
			l.fail(fmt.Errorf("%w: %s has %d entries, want up to 4", ErrMetadata, l.key("rope.dimension_sections"), len(sec)))
		}
		for i, v := range sec {
			if v < 0 || v > 1<<20 {
				l.fail(fmt.Errorf("%w: %s[%d] = %d", ErrMetadata, l.key("rope.dimension_sections"), i, v))
				break
			}
			if i < 4 {
				p.RopeSections[i] = int(v)
			}
		}
	}
	if l.err != nil {
		return
	}
	bad := func(format string, a ...any) {
		l.fail(fmt.Errorf("%w: "+format, append([]any{ErrMetadata}, a...)...))
	}
	switch {
	case p.NextN < 0 || p.NextN >= p.Layers:
		bad("%s = %d with block_count %d: want fewer than the blocks", l.key("nextn_predict_layers"), p.NextN, p.Layers)
	case p.SSMConv < 1 || p.SSMConv > 64:
		bad("ssm.conv_kernel %d (1..64)", p.SSMConv)
	case p.SSMState <= 0 || p.SSMGroups <= 0 || p.SSMHeads <= 0 || p.SSMHeads%p.SSMGroups != 0:
		bad("ssm.state_size %d, ssm.group_count %d, ssm.time_step_rank %d (value heads must be a multiple of key heads)",
			p.SSMState, p.SSMGroups, p.SSMHeads)
	case p.SSMInner != p.SSMHeads*p.SSMState:
		bad("ssm.inner_size %d, want ssm.time_step_rank x ssm.state_size = %d", p.SSMInner, p.SSMHeads*p.SSMState)
	case p.HeadDim != p.HeadDimV:
		bad("key_length %d != value_length %d", p.HeadDim, p.HeadDimV)
	case p.AttnInterval <= 0:
		bad("full_attention_interval %d", p.AttnInterval)
	}
	if l.err != nil {
		return
	}
	p.Layers -= p.NextN // the main graph's layers (hparams.n_layer())
	// Which layers are recurrent: attention.recurrent_layers (one flag per
	// layer) overrides the interval.
	if v, ok := l.f.Value(l.key("attention.recurrent_layers")); ok {
		qwen35moeRecurrentLayers(l, p, v)
		return
	}
	for il := range p.Layers {
		if (il+1)%p.AttnInterval != 0 {
			p.RecurrentCount++
		}
	}
}

// qwen35moeRecurrentLayers reads attention.recurrent_layers, v: one bool
// (or integer) per block of the file, into l.recurrent for the main
// graph's layers, counts them in p.RecurrentCount and clears
// p.AttnInterval. Errors (ErrMetadata) fail l.
func qwen35moeRecurrentLayers(l *loader, p *Params, v gguf.Value) {
	k := l.key("attention.recurrent_layers")
	elems, ok := v.Values()
	if !ok || len(elems) != p.ExpertLayers {
		l.fail(fmt.Errorf("%w: %s is %s of %d entries, want an array of %d bools (one per block)",
			ErrMetadata, k, v.TypeName(), v.Len(), p.ExpertLayers))
		return
	}
	elems = elems[:p.Layers] // MTP blocks are attention blocks, not run
	l.recurrent = make([]bool, p.Layers)
	for il, e := range elems {
		if f, ok := e.Bool(); ok {
			l.recurrent[il] = f
		} else if i, ok := e.Int(); ok {
			l.recurrent[il] = i != 0
		} else {
			l.fail(fmt.Errorf("%w: %s[%d] is %s, want a bool", ErrMetadata, k, il, e.TypeName()))
			return
		}
		if l.recurrent[il] {
			p.RecurrentCount++
		}
	}
	p.AttnInterval = 0
}

// isRecurrent reports whether layer il of p is a Gated DeltaNet layer
// (hparams.is_recr).
func (l *loader) isRecurrent(p *Params, il int) bool {
	if l.recurrent != nil {
		return l.recurrent[il]
	}
	return (il+1)%p.AttnInterval != 0
}

// qwen35moeMemory is hparams.is_recr: a Gated DeltaNet layer
// (MemoryRecurrent) as attention.recurrent_layers says, else unless
// (il+1) % full_attention_interval == 0.
func qwen35moeMemory(l *loader, p *Params, il int) MemoryKind {
	if l.isRecurrent(p, il) {
		return MemoryRecurrent
	}
	return MemoryKV
}

// qwen35moeBlock loads layer il (load_arch_tensors in qwen35moe.cpp).
func qwen35moeBlock(l *loader, p *Params, il int, b *Block) {
	n := func(s string) string { return blk(il, s+".weight") }
	b.AttnNorm = l.vector(n("attn_norm"), p.Embd)
	if b.Memory == MemoryRecurrent {
		b.Linear = l.gatedDeltaNet(p, il)
	} else {
		b.Attn = l.attention(p, il, true)
	}
	b.FFNNorm = l.vector(n("post_attention_norm"), p.Embd)
	b.MoE = l.moe(p, il, SoftmaxTopKNorm)
	if p.SharedFF > 0 || l.has(n("ffn_up_shexp")) {
		if p.SharedFF == 0 { // llama.cpp: n_ff_shexp defaults to n_ff (feed_forward_length)
			l.uint("feed_forward_length", &p.SharedFF, 0, true)
		}
		b.MoE.Shared = l.sharedExpert(p, il, p.SharedFF, SharedSigmoid)
	}
}
