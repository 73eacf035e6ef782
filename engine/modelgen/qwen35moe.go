package modelgen

import (
	"fmt"
	"math"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// ArchQwen35MoE is llama.cpp's qwen35moe (Qwen3.5 MoE): Gated DeltaNet
// ("recurrent") layers with one gated full-attention layer every
// Spec.FullAttnInterval layers, and a routed MoE FFN plus a gated shared
// expert in every layer. Loaded by engine/model/qwen35moe.go.
const ArchQwen35MoE = "qwen35moe"

func init() {
	register(&generator{
		arch:      ArchQwen35MoE,
		check:     qwen35moeCheck,
		recurrent: qwen35moeRecurrent,
		metadata:  qwen35moeMetadata,
		layer:     qwen35moeLayer,
		describe:  qwen35moeDescribe,
	})
}

// qwen35moeRecurrent is llama.cpp's is_recr for the interval layout:
// layer il is Gated DeltaNet unless (il+1) % FullAttnInterval == 0; an
// MTP block (il >= Layers with NextN > 0) never is.
func qwen35moeRecurrent(s Spec, il int) bool {
	return (s.NextN == 0 || il < s.Layers) && s.FullAttnInterval > 0 && (il+1)%s.FullAttnInterval != 0
}

// qwen35moeCheck validates the qwen35moe fields of s; errors wrap ErrSpec.
func qwen35moeCheck(s Spec) error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrSpec}, a...)...) }
	rd := s.ropeDim()
	switch {
	case s.FullAttnInterval <= 0:
		return bad("full_attention_interval %d: want at least 1", s.FullAttnInterval)
	case s.SSMConv <= 0 || s.SSMState <= 0 || s.SSMGroups <= 0 || s.SSMDtRank <= 0:
		return bad("ssm conv_kernel %d, state_size %d, group_count %d, time_step_rank %d: want all positive",
			s.SSMConv, s.SSMState, s.SSMGroups, s.SSMDtRank)
	case s.SSMDtRank%s.SSMGroups != 0:
		return bad("ssm time_step_rank (V heads) %d is not a multiple of group_count (K heads) %d", s.SSMDtRank, s.SSMGroups)
	case s.SSMInner != s.SSMState*s.SSMDtRank:
		return bad("ssm inner_size %d: want state_size %d * time_step_rank %d = %d", s.SSMInner, s.SSMState, s.SSMDtRank,
			s.SSMState*s.SSMDtRank)
	case rd <= 0 || rd%2 != 0 || rd > s.HeadDim:
		return bad("rope dimension_count %d: want an even count of at most the head dim %d", rd, s.HeadDim)
	case s.SharedFF <= 0:
		return bad("shared expert ffn %d: want positive", s.SharedFF)
	}
	sum := 0
	for _, v := range s.RopeSections {
		if v < 0 {
			return bad("rope dimension_sections %v: negative section", s.RopeSections)
		}
		sum += v
	}
	if sum == 0 {
		return bad("rope dimension_sections %v: all zero", s.RopeSections)
	}
	return nil
}

// qwen35moeMetadata writes the keys llama.cpp's qwen35moe load_hparams and
// load_arch_hparams read, in the order of fixtures/qwen35moe.
func qwen35moeMetadata(s Spec, w *gguf.Writer, a string) {
	attentionKeys(s, w, a)
	w.SetUint32(a+"rope.dimension_count", uint32(s.ropeDim()))
	sec := make([]int32, len(s.RopeSections))
	for i, v := range s.RopeSections {
		sec[i] = int32(v)
	}
	w.SetInt32s(a+"rope.dimension_sections", sec)
	ropeNormKeys(s, w, a)
	expertKeys(s, w, a)
	w.SetUint32(a+"expert_shared_feed_forward_length", uint32(s.SharedFF))
	w.SetUint32(a+"full_attention_interval", uint32(s.FullAttnInterval))
	w.SetUint32(a+"ssm.conv_kernel", uint32(s.SSMConv))
	w.SetUint32(a+"ssm.state_size", uint32(s.SSMState))
	w.SetUint32(a+"ssm.group_count", uint32(s.SSMGroups))
	w.SetUint32(a+"ssm.time_step_rank", uint32(s.SSMDtRank))
	w.SetUint32(a+"ssm.inner_size", uint32(s.SSMInner))
	if s.NextN > 0 {
		w.SetUint32(a+"nextn_predict_layers", uint32(s.NextN))
	}
}

// qwen35moeLayer adds layer il's tensors in the order of fixtures/qwen35moe
// (gguf-py's writer), shapes of llama.cpp's
// llama_model_qwen35moe::load_arch_tensors; the Q4_K_M mix gives Q6_K
// where llama-quantize's use_more_bits holds.
func qwen35moeLayer(s Spec, p *planner, il int) {
	d := s.Embd
	b := func(n string) string { return blk(il, n) }
	more := useMoreBits(il, s.Layers)
	p.add(b("attn_norm"), quant.F32, 1, 0.1, d)
	if s.Recurrent(il) {
		qwen35moeDeltaNet(s, p, il, more)
	} else {
		qd, kd := s.Heads*s.HeadDim, s.HeadsKV*s.HeadDim
		// attn_q: per head HeadDim query rows then HeadDim gate rows.
		p.add(b("attn_q"), s.mixType(d, false), 0, isd(d), d, 2*qd)
		p.add(b("attn_k"), s.mixType(d, false), 0, isd(d), d, kd)
		p.add(b("attn_v"), s.mixType(d, more), 0, isd(d), d, kd)
		p.add(b("attn_output"), s.mixType(qd, false), 0, 4*isd(qd), qd, d)
		p.add(b("attn_q_norm"), quant.F32, 2.5, 0.5, s.HeadDim)
		p.add(b("attn_k_norm"), quant.F32, 2.5, 0.5, s.HeadDim)
	}
	p.add(b("post_attention_norm"), quant.F32, 1, 0.1, d)
	p.add(b("ffn_gate_inp"), quant.F32, 0, 1.5*isd(d), d, s.Experts)
	p.gateUp(s, il, s.mixType(d, false))
	p.add(b("ffn_down_exps"), s.mixType(s.ExpertFF, more), 0, 4*isd(s.ExpertFF), s.ExpertFF, d, s.Experts)
	p.add(b("ffn_gate_inp_shexp"), quant.F32, 0, isd(d), d)
	p.add(b("ffn_gate_shexp"), s.mixType(d, false), 0, isd(d), d, s.SharedFF)
	p.add(b("ffn_up_shexp"), s.mixType(d, false), 0, isd(d), d, s.SharedFF)
	p.add(b("ffn_down_shexp"), s.mixType(s.SharedFF, more), 0, 2*isd(s.SharedFF), s.SharedFF, d)
	if il >= s.Layers { // an MTP block (Spec.NextN): its nextn tensors
		p.add(b("nextn.eh_proj"), s.mixType(2*d, false), 0, isd(2*d), 2*d, d)
		p.add(b("nextn.enorm"), quant.F32, 1, 0.1, d)
		p.add(b("nextn.hnorm"), quant.F32, 1, 0.1, d)
		p.add(b("nextn.shared_head_norm"), quant.F32, 1, 0.1, d)
	}
}

// qwen35moeDeltaNet adds recurrent layer il's Gated DeltaNet tensors.
func qwen35moeDeltaNet(s Spec, p *planner, il int, more bool) {
	d := s.Embd
	b := func(n string) string { return blk(il, n) }
	keyDim, valDim := s.SSMState*s.SSMGroups, s.SSMState*s.SSMDtRank
	convDim := 2*keyDim + valDim
	p.add(b("attn_qkv"), s.mixType(d, more), 0, isd(d), d, convDim)
	p.add(b("attn_gate"), s.mixType(d, false), 0, isd(d), d, valDim)
	p.add(b("ssm_conv1d"), quant.F32, 0, 0.3, s.SSMConv, convDim)
	p.add(fmt.Sprintf("blk.%d.ssm_dt.bias", il), quant.F32, 0, 0.1, s.SSMDtRank)
	// ssm_a holds A = -exp(A_log) (negative): uniform in [-e, -1/e), i.e.
	// A_log uniform-ish in (-1, 1].
	a := p.add(fmt.Sprintf("blk.%d.ssm_a", il), quant.F32, 0, 0, s.SSMDtRank)
	a.uniform, a.lo, a.hi = true, -math.E, -1/math.E
	p.add(b("ssm_beta"), s.mixType(d, false), 0, isd(d), d, s.SSMDtRank)
	p.add(b("ssm_alpha"), s.mixType(d, false), 0, isd(d), d, s.SSMDtRank)
	p.add(b("ssm_norm"), quant.F32, 1, 0.1, s.SSMState)
	p.add(b("ssm_out"), s.mixType(valDim, false), 0, 4*isd(valDim), valDim, d)
}

// qwen35moeDescribe returns Describe's phrases.
func qwen35moeDescribe(s Spec) []string {
	d := []string{ArchQwen35MoE,
		fmt.Sprintf("%d layers (full attention every %d)", s.Layers, s.FullAttnInterval), fmt.Sprintf("d %d", s.Embd),
		fmt.Sprintf("heads %d/%d x %d rope %d", s.Heads, s.HeadsKV, s.HeadDim, s.ropeDim()),
		fmt.Sprintf("deltanet conv %d heads %d/%d x %d", s.SSMConv, s.SSMGroups, s.SSMDtRank, s.SSMState),
		fmt.Sprintf("experts %d top-%d ffn %d + shared %d", s.Experts, s.ExpertsUsed, s.ExpertFF, s.SharedFF)}
	if s.NextN > 0 {
		d = append(d, fmt.Sprintf("%d MTP block", s.NextN))
	}
	return d
}
