package model

import (
	"math"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// GatedDeltaNet is a linear-attention layer with a recurrent state (Gated
// DeltaNet, Yang, Kautz & Hatamizadeh, "Gated Delta Networks", ICLR 2025;
// llama.cpp src/models/qwen35moe.cpp build_layer_attn_linear and
// src/models/delta-net-base.cpp, ggml-cpu ops.cpp ssm_conv, l2_norm and
// gated_delta_net at commit 3f545bec), fields named after its GGUF tensors.
// With K = SSMGroups key heads, H = SSMHeads value heads, S = SSMState:
//
//	mixed = attn_qkv x                       (2*K*S + H*S: q | k | v)
//	z = attn_gate x                          (H*S)
//	beta = sigmoid(ssm_beta x)               (H)
//	g = softplus(ssm_alpha x + ssm_dt.bias) * ssm_a   (H, negative: ssm_a = -exp(A_log))
//	c = silu(causal depthwise conv of mixed over the last SSMConv positions, ssm_conv1d)
//	q, k = l2norm per head of c's q and k parts (eps = NormEps); v = c's v part
//	per value head h (key head h mod K), state S_h (S x S, zero at start):
//	    S_h = exp(g_h) S_h;  S_h += k (beta_h (v_h - S_h^T k))^T;  o_h = S_h^T q / sqrt(S)
//	out = ssm_out concat_h( rmsnorm(o_h) * ssm_norm * silu(z_h) )
//
// llama.cpp's CPU backend runs prompt batches and single tokens through the
// same per-token recurrence (ggml_compute_forward_gated_delta_net), and so
// does this engine: a prompt's rows give the same bits in one batch or one
// at a time.
type GatedDeltaNet struct {
	QKV    Weight    // attn_qkv   (2*K*S + H*S) x Embd
	Gate   Weight    // attn_gate  H*S x Embd (z)
	Conv1D []float32 // ssm_conv1d (2*K*S + H*S) x SSMConv, channel-major (ne [SSMConv, channels])
	DTBias []float32 // ssm_dt.bias [H]
	A      []float32 // ssm_a [H] (-exp(A_log))
	Beta   Weight    // ssm_beta  H x Embd
	Alpha  Weight    // ssm_alpha H x Embd
	Norm   []float32 // ssm_norm [S]
	Out    Weight    // ssm_out   Embd x H*S

	// convT is Conv1D tap-major (convT[j*channels+c] = Conv1D[c*SSMConv+j]),
	// so that a tap's weights for a run of channels are contiguous.
	convT []float32
}

// gatedDeltaNet loads layer il's Gated DeltaNet (load_arch_tensors in
// llama.cpp src/models/qwen35moe.cpp), shapes from p's SSM sizes.
func (l *loader) gatedDeltaNet(p *Params, il int) *GatedDeltaNet {
	n := func(s string) string { return blk(il, s+".weight") }
	d := p.Embd
	keyDim, valDim := p.SSMState*p.SSMGroups, p.SSMInner
	conv := 2*keyDim + valDim
	g := &GatedDeltaNet{
		QKV:    l.matrix(n("attn_qkv"), conv, d),
		Gate:   l.matrix(n("attn_gate"), valDim, d),
		Conv1D: l.vector(n("ssm_conv1d"), conv*p.SSMConv, uint64(p.SSMConv), uint64(conv)),
		DTBias: l.vector(blk(il, "ssm_dt.bias"), p.SSMHeads),
		A:      l.vector(blk(il, "ssm_a"), p.SSMHeads),
		Beta:   l.matrix(n("ssm_beta"), p.SSMHeads, d),
		Alpha:  l.matrix(n("ssm_alpha"), p.SSMHeads, d),
		Norm:   l.vector(n("ssm_norm"), p.SSMState),
		Out:    l.matrix(n("ssm_out"), d, valDim),
	}
	if len(g.Conv1D) == conv*p.SSMConv { // else the loader has recorded an error
		g.convT = make([]float32, len(g.Conv1D))
		for c := range conv {
			for j := range p.SSMConv {
				g.convT[j*conv+c] = g.Conv1D[c*p.SSMConv+j]
			}
		}
	}
	return g
}

// deltaNetHeads runs the recurrence of layer il for one sequence's rows
// (gr) and one key head kh, in time order: the causal depthwise
// convolution, SiLU and L2 norm of q and k head kh and of the value heads
// that read it (h = kh, kh+K, ...: llama.cpp repeats the key heads for
// the value heads), moving those channels' convolution state on by the
// rows; then per such value head the delta rule over the rows (deltaStep)
// and the gated RMSNorm of its output. Every channel and head is computed
// by the same operations in the same order as convRow and deltaStep do for
// a whole row, so the split changes no bit. ws.mixed, ws.beta, ws.gdt and
// ws.z hold the rows' inputs; it writes ws.cv (the convolution outputs of
// its channels) and ws.o.
func (m *Model) deltaNetHeads(il int, g *GatedDeltaNet, gr *seqGroup, kh int, scale float32) {
	p, ws := m.p, &m.ws
	H, K, S := p.SSMHeads, p.SSMGroups, p.SSMState
	conv, vd := 2*K*S+H*S, H*S
	mem := &gr.seq.mem[il]
	convHead(p, g, mem.conv, ws.mixed, ws.cv, gr.rows, kh*S, S)     // q
	convHead(p, g, mem.conv, ws.mixed, ws.cv, gr.rows, (K+kh)*S, S) // k
	for _, r := range gr.rows {
		row := ws.cv[int(r)*conv : (int(r)+1)*conv]
		l2Norm(row[kh*S:(kh+1)*S], p.NormEps)
		l2Norm(row[(K+kh)*S:(K+kh+1)*S], p.NormEps)
	}
	for h := kh; h < H; h += K {
		convHead(p, g, mem.conv, ws.mixed, ws.cv, gr.rows, 2*K*S+h*S, S) // v
		st := headState(p, mem.ssm, h)                                   // st[j*S+i] = S_h[i][j]
		for _, r := range gr.rows {
			row := ws.cv[int(r)*conv : (int(r)+1)*conv]
			q, k, v := row[kh*S:(kh+1)*S], row[(K+kh)*S:(K+kh+1)*S], row[2*K*S+h*S:2*K*S+(h+1)*S]
			o := ws.o[int(r)*vd+h*S : int(r)*vd+(h+1)*S]
			deltaStep(st, q, k, v, o, ws.beta[int(r)*H+h], ws.gdt[int(r)*H+h], scale)
			// Gated RMSNorm: rmsnorm(o_h) * ssm_norm * silu(z_h).
			rmsNorm(o, o, g.Norm, p.NormEps)
			expert.SwiGLU(o, ws.z[int(r)*vd+h*S:int(r)*vd+(h+1)*S], o)
		}
	}
}

// convHead computes the convolution outputs of channels [c0, c0+width)
// for rows (one sequence's, in time order) into cv (rows of the
// convolution's channels, as mixed), each channel's taps summed in order
// as convRow does, then SiLU; and moves those channels of the sequence's
// convolution state (state: (SSMConv-1) x channels, oldest first) on by
// the rows' inputs in mixed.
func convHead(p Params, g *GatedDeltaNet, state, mixed, cv []float32, rows []int32, c0, width int) {
	kc := p.SSMConv
	conv := len(state) / (kc - 1)
	// in returns channels [c0, c0+width) of the input at window position
	// tau: the state's rows first, then the rows' inputs.
	in := func(tau int) []float32 {
		if tau < kc-1 {
			return state[tau*conv+c0 : tau*conv+c0+width]
		}
		r := int(rows[tau-(kc-1)])
		return mixed[r*conv+c0 : r*conv+c0+width]
	}
	for t, r := range rows {
		out := cv[int(r)*conv+c0 : int(r)*conv+c0+width]
		clear(out)
		for j := range kc {
			// ggml_compute_forward_ssm_conv_f32: a float32 sum in tap
			// order, from 0, per channel.
			// out[c] += float32(x[c] * w[c]), element by element.
			quant.MulAddF32(out, in(t+j), g.convT[j*conv+c0:j*conv+c0+len(out)])
		}
		expert.SiLU(out, out)
	}
	for tau := range kc - 1 { // reads ahead of what it overwrites
		copy(state[tau*conv+c0:tau*conv+c0+width], in(tau+len(rows)))
	}
}

// convRow computes one row's convolution output out (channels = 2*K*S +
// H*S) from w0, the row's window of SSMConv inputs (SSMConv x channels,
// oldest first, channel-minor): the causal depthwise convolution, SiLU and
// the q/k L2 norms (ggml_compute_forward_ssm_conv_f32, ggml_silu,
// ggml_l2_norm). Forward and Sequence.Truncate's replay share it, so both
// compute the same bits.
func convRow(p Params, g *GatedDeltaNet, w0, out []float32) {
	K, S, kc := p.SSMGroups, p.SSMState, p.SSMConv
	conv := len(out)
	for c := range out {
		// ggml_compute_forward_ssm_conv_f32: a float32 sum in tap order.
		w := g.Conv1D[c*kc : (c+1)*kc]
		var sum float32
		for j, wj := range w {
			sum += float32(w0[j*conv+c] * wj)
		}
		out[c] = sum
	}
	expert.SiLU(out, out)
	for h := range 2 * K { // q heads then k heads
		l2Norm(out[h*S:(h+1)*S], p.NormEps)
	}
}

// headState returns value head h's state (S x S floats) in ssm, a layer's
// recurrent state. The heads that share a key head lie side by side (head
// h at slot (h mod K) * H/K + h/K): deltaNetHeads' unit for key head kh
// runs heads kh, kh+K, ... one after another, and the delta rule's
// prefetch past a head's end (quant.DeltaRule) then lands in the next
// head the same unit reads instead of in another unit's, perhaps taken by
// the other thread. Nothing outside a Sequence sees the order (a
// checkpoint copies the whole slice).
func headState(p Params, ssm []float32, h int) []float32 {
	K, S := p.SSMGroups, p.SSMState
	slot := h%K*(p.SSMHeads/K) + h/K
	return ssm[slot*S*S : (slot+1)*S*S]
}

// deltaStep advances one value head's state st (S x S, st[j*S+i] =
// S_h[i][j]) by one token: decay by exp(g), the delta-rule update with k,
// v and beta, and o = S_h^T q * scale. Forward and Sequence.Truncate's
// replay share it, so both compute the same bits.
func deltaStep(st, q, k, v, o []float32, beta, g, scale float32) {
	// ggml runs four passes over the state (scale, S^T k, the rank-1
	// update, S^T q); each touches row j of st only with row j's own
	// values, so one pass per row, while it is in L1, computes the same
	// bits: quant.DeltaRule (a SIMD kernel holding DotF32's order, no
	// fused multiply-adds). The lengths are the layer's own.
	if err := quant.DeltaRule(st, q, k, v, o, beta, float32(math.Exp(float64(g))), scale); err != nil {
		panic(err)
	}
}

// seqGroup is one sequence's rows of a Forward batch, in position order.
type seqGroup struct {
	seq  *Sequence
	rows []int32
}

// deltaNetLayer runs layer il's Gated DeltaNet on ws.xn into ws.tmp (n x
// Embd), advancing the rows' recurrent states.
func (m *Model) deltaNetLayer(il int, g *GatedDeltaNet, rows []Row) error {
	p, ws := m.p, &m.ws
	n, d := len(rows), p.Embd
	H, K, S := p.SSMHeads, p.SSMGroups, p.SSMState
	conv, vd := 2*K*S+H*S, H*S
	if err := m.projectAll(ws.xn[:n*d], n, proj{w: &g.QKV, y: ws.mixed[:n*conv]}, proj{w: &g.Gate, y: ws.z[:n*vd]},
		proj{w: &g.Beta, y: ws.beta[:n*H]}, proj{w: &g.Alpha, y: ws.gdt[:n*H]}); err != nil {
		return err
	}
	for i := range n * H {
		ws.beta[i] = sigmoid(ws.beta[i])
		h := i % H
		ws.gdt[i] = softplus(ws.gdt[i]+g.DTBias[h]) * g.A[h]
	}
	for _, gr := range ws.groups {
		if cp := gr.seq.cp; cp != nil {
			cp.logRows(il, gr.rows, conv, H, ws)
		}
	}
	// Convolution, delta rule and gated norm in one region, one unit per
	// (sequence, key head) with the value heads that read it.
	scale := 1 / float32(math.Sqrt(float64(S)))
	run := m.team.run
	if n*H*S*S < 1<<15 {
		run = serial
	}
	run(len(ws.groups)*K, func(_, u int) {
		m.deltaNetHeads(il, g, &ws.groups[u/K], u%K, scale)
	})
	return m.project(ws.o[:n*vd], n, &g.Out, ws.tmp[:n*d])
}

// l2Norm scales x to unit L2 norm as ggml_compute_forward_l2_norm_f32:
// float64 sum of the float32 squares, scale = 1/max(sqrtf(sum), eps) in
// float32.
func l2Norm(x []float32, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(v * v)
	}
	scale := 1 / max(float32(math.Sqrt(float64(float32(sum)))), eps)
	for i := range x {
		x[i] *= scale
	}
}

// sigmoid is 1/(1+e^-x) in float32 (ggml op_sigmoid, ggml-cpu/unary-ops.cpp).
func sigmoid(x float32) float32 { return 1 / (1 + float32(math.Exp(float64(-x)))) }

// softplus is log(1+e^x), x itself above 20 (ggml op_softplus,
// ggml-cpu/unary-ops.cpp).
func softplus(x float32) float32 {
	if x > 20 {
		return x
	}
	return float32(math.Log(float64(1 + float32(math.Exp(float64(x))))))
}
