package model

import (
	"math"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Attention is a softmax attention layer with an F32 KV cache (llama.cpp
// src/llama-graph.cpp build_attn without flash attention), fields named
// after its GGUF tensors (blk.N.<name>.weight):
//
//	q_h = rope(rmsnorm(q_h) * attn_q_norm), k_h likewise with attn_k_norm, v_h as is
//	o_h = softmax(q_h . K^T / sqrt(HeadDim)) V   (causal, GQA: query head h reads KV head h/(Heads/HeadsKV))
//	out = attn_output (o * sigmoid(gate) when Gated, else o)
//
// Gated (qwen35moe, build_layer_attn in src/models/qwen35moe.cpp): attn_q
// has 2*Heads*HeadDim rows and each head's 2*HeadDim outputs are [q_h |
// gate_h] (interleaved per head, not two halves).
type Attention struct {
	Q      Weight    // attn_q      Heads*HeadDim (x2 when Gated) x Embd
	K      Weight    // attn_k      HeadsKV*HeadDim x Embd
	V      Weight    // attn_v      HeadsKV*HeadDimV x Embd
	Output Weight    // attn_output Embd x Heads*HeadDimV
	QNorm  []float32 // attn_q_norm [HeadDim]
	KNorm  []float32 // attn_k_norm [HeadDim]
	Gated  bool      // attn_q holds a per-head output gate (qwen35moe)
}

// attention loads layer il's softmax attention: attn_q (Heads*HeadDim
// rows, twice that when gated), attn_k, attn_v, attn_output, attn_q_norm
// and attn_k_norm, in that order (llama.cpp's load_arch_tensors).
func (l *loader) attention(p *Params, il int, gated bool) *Attention {
	n := func(s string) string { return blk(il, s+".weight") }
	qRows := p.Heads * p.HeadDim
	if gated {
		qRows *= 2
	}
	return &Attention{
		Q:      l.matrix(n("attn_q"), qRows, p.Embd),
		K:      l.matrix(n("attn_k"), p.HeadsKV*p.HeadDim, p.Embd),
		V:      l.matrix(n("attn_v"), p.HeadsKV*p.HeadDimV, p.Embd),
		Output: l.matrix(n("attn_output"), p.Embd, p.Heads*p.HeadDimV),
		QNorm:  l.vector(n("attn_q_norm"), p.HeadDim),
		KNorm:  l.vector(n("attn_k_norm"), p.HeadDim),
		Gated:  gated,
	}
}

// attnLayer runs layer il's attention on ws.xn (the normed input) into
// ws.tmp (n x Embd), appending the rows' K and V to their caches.
func (m *Model) attnLayer(il int, a *Attention, rows []Row) error {
	p, ws := m.p, &m.ws
	n, d := len(rows), p.Embd
	qd, kd, vd := p.Heads*p.HeadDim, p.HeadsKV*p.HeadDim, p.HeadsKV*p.HeadDimV
	hd, half := p.HeadDim, p.RopeDim/2

	qout := ws.q[:n*qd]
	if a.Gated {
		qout = ws.qg[:2*n*qd]
	}
	if err := m.projectAll(ws.xn[:n*d], n, proj{w: &a.Q, y: qout},
		proj{w: &a.K, y: ws.k[:n*kd]}, proj{w: &a.V, y: ws.v[:n*vd]}); err != nil {
		return err
	}
	if a.Gated { // split [q_h | gate_h] per head
		for i := range n {
			for h := range p.Heads {
				src := ws.qg[i*2*qd+2*h*hd:]
				copy(ws.q[i*qd+h*hd:i*qd+(h+1)*hd], src[:hd])
				copy(ws.gate[i*qd+h*hd:i*qd+(h+1)*hd], src[hd:2*hd])
			}
		}
	}
	for i := range rows {
		c, s := ws.cos[i*half:(i+1)*half], ws.sin[i*half:(i+1)*half]
		for h := range p.Heads {
			x := ws.q[i*qd+h*hd : i*qd+(h+1)*hd]
			rmsNorm(x, x, a.QNorm, p.NormEps)
			ropeNeox(x, c, s)
		}
		seq, pos := rows[i].Seq, rows[i].Pos
		kc := seq.mem[il].k[pos*kd : (pos+1)*kd]
		for h := range p.HeadsKV {
			x := ws.k[i*kd+h*hd : i*kd+(h+1)*hd]
			rmsNorm(kc[h*hd:(h+1)*hd], x, a.KNorm, p.NormEps)
			ropeNeox(kc[h*hd:(h+1)*hd], c, s)
		}
		vt, cp := seq.mem[il].v, seq.capPos
		for ch, x := range ws.v[i*vd : (i+1)*vd] {
			vt[ch*cp+pos] = x
		}
	}
	m.attention(il, rows)
	att := ws.att[:n*p.Heads*p.HeadDimV]
	if a.Gated { // ggml_mul(cur, ggml_sigmoid(gate)): att[i] *= sigmoid(gate[i])
		expert.GateSigmoid(att, ws.gate[:n*qd])
	}
	return m.project(att, n, &a.Output, ws.tmp[:n*d])
}

// attention computes ws.att (rows x Heads*HeadDimV) from ws.q and the
// sequences' caches for layer il: per head, scores q.k_t * 1/sqrt(HeadDim)
// over positions t <= pos (causal), softmax as ggml_soft_max_ext (max
// subtracted, float64 sum, scaled by float32(1/sum)), then each output
// element sum_t p_t v_t as one quant.DotF32 over positions (ggml_mul_mat of
// the transposed V cache with the probabilities); both dot loops run as one
// quant.DotF32Rows call each (bit-identical to per-row DotF32).
// Query head h reads KV head h / (Heads/HeadsKV) (GQA as ggml_mul_mat
// broadcasts).
func (m *Model) attention(il int, rows []Row) {
	p, ws := m.p, &m.ws
	hd, hdv := p.HeadDim, p.HeadDimV
	qd, ad := p.Heads*hd, p.Heads*hdv
	group := p.Heads / p.HeadsKV
	scale := 1 / float32(math.Sqrt(float64(hd)))
	units := len(rows) * p.Heads
	work := 0
	for i := range rows {
		work += (rows[i].Pos + 1) * p.Heads * (hd + hdv)
	}
	run := m.team.run
	if work < 1<<15 {
		run = serial
	}
	run(units, func(w, u int) {
		i, h := u/p.Heads, u%p.Heads
		kvh := h / group
		seq, pos := rows[i].Seq, rows[i].Pos
		kc, vc := seq.mem[il].k, seq.mem[il].v
		q := ws.q[i*qd+h*hd : i*qd+(h+1)*hd]
		sc := ws.scores[w][:pos+1]
		// Key t of KV head kvh starts at (t*HeadsKV+kvh)*hd; the slices
		// passed are exactly the rows' extent, so DotF32Rows cannot fail.
		kst := p.HeadsKV * hd
		_ = quant.DotF32Rows(q, kc[kvh*hd:pos*kst+(kvh+1)*hd], kst, sc)
		for t := range sc {
			sc[t] *= scale
		}
		softmax(sc, sc)
		out := ws.att[i*ad+h*hdv : i*ad+(h+1)*hdv]
		// Channel kvh*hdv+j of the transposed V cache starts at
		// (kvh*hdv+j)*capPos.
		cp := seq.capPos
		_ = quant.DotF32Rows(sc, vc[kvh*hdv*cp:(kvh*hdv+len(out)-1)*cp+len(sc)], cp, out)
	})
}

// ropeTable fills the cos/sin of position pos for the RopeDim/2 rotated
// pairs as ggml_rope_cache_init does (ggml-cpu/ops.cpp): theta starts at
// pos and is multiplied in float32 by base^(-2/RopeDim) per pair; with no
// YaRN, theta is scaled by RopeScale (freq_scale) and mscale is 1.
//
// IMROPE (qwen35moe, ggml_mrope_cache_init with is_imrope) picks per pair
// one of four position components by rope.dimension_sections; for text
// llama.cpp gives a token the same position in all four (llama-batch.cpp),
// so every pair's theta is this one and IMROPE equals NEOX rotate-half over
// the first RopeDim dims.
func ropeTable(p Params, pos int, cos, sin []float32) {
	thetaScale := float32(math.Pow(float64(p.RopeBase), float64(float32(-2)/float32(p.RopeDim))))
	theta := float32(pos)
	for i := range cos {
		t := p.RopeScale * theta
		cos[i] = float32(math.Cos(float64(t)))
		sin[i] = float32(math.Sin(float64(t)))
		theta *= thetaScale
	}
}

// ropeNeox rotates x's first 2*len(cos) dims in NEOX style (rotate-half:
// pair (i, i+half)), as ggml's rope with GGML_ROPE_TYPE_NEOX; later dims
// are left as they are.
func ropeNeox(x, cos, sin []float32) {
	half := len(cos)
	lo, hi := x[:half], x[half:2*half]
	for i := range half {
		x0, x1 := lo[i], hi[i]
		c, s := cos[i], sin[i]
		lo[i] = float32(x0*c) - float32(x1*s)
		hi[i] = float32(x0*s) + float32(x1*c)
	}
}
