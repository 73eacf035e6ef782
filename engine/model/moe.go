package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// MoE is a layer's mixture-of-experts block (llama.cpp src/llama-graph.cpp
// build_moe_ffn at commit 3f545bec), its router function chosen by the
// architecture (Router):
//
//	ids, w = Route(ffn_gate_inp x)     e.g. SoftmaxTopKNorm
//	out = sum_s w_s expert_{ids_s}(x)  (in the router's slot order)
//	      + shexp(x)                   when Shared is set (SharedExpert)
//
// The routed experts are computed by the Model's expert.Computer (locally or
// by the swarm; a Computer that implements expert.SumComputer returns the
// weighted sum itself); the shared expert always on the backbone, while the
// routed experts are away when the Computer is remote.
type MoE struct {
	GateInp Weight        // ffn_gate_inp (router) Experts x Embd, F32 in llama.cpp's quantisations
	Route   Router        // the router function: logits to experts and weights
	Experts *expert.Layer // ffn_gate_exps + ffn_up_exps (or ffn_gate_up_exps) and ffn_down_exps
	Shared  *SharedExpert // nil when the architecture has none
}

// SharedExpert is the always-on SwiGLU expert of an MoE block (qwen35moe:
// build_layer_ffn in src/models/qwen35moe.cpp, build_ffn with LLM_FFN_SILU,
// LLM_FFN_PAR), scaled as Gating says:
//
//	shexp(x) = g(x) * Down( silu(Gate x) * (Up x) )
//	g(x) = sigmoid(GateInp . x)   SharedSigmoid (GateInp: a 1-row F32 projection)
//	g(x) = 1                      SharedUngated
type SharedExpert struct {
	FeedForward              // ffn_gate_shexp, ffn_up_shexp (SharedFF x Embd), ffn_down_shexp (Embd x SharedFF)
	Gating      SharedGating // how the output is scaled
	GateInp     []float32    // ffn_gate_inp_shexp [Embd]; nil unless Gating is SharedSigmoid
}

// SharedGating is how a shared expert's output is scaled before it is added
// to the routed experts' sum.
type SharedGating uint8

const (
	// SharedUngated: added as is (llama.cpp's deepseek2 ffn_shexp).
	SharedUngated SharedGating = iota
	// SharedSigmoid: multiplied by sigmoid(ffn_gate_inp_shexp . x) per row
	// (qwen2moe, qwen35moe: ggml_sigmoid of build_lora_mm(ffn_gate_inp_shexp)).
	SharedSigmoid
)

// moe loads layer il's router (ffn_gate_inp, Experts x Embd) into an MoE
// block routed by route; the routed experts are set by Load, the shared
// expert by the architecture (sharedExpert).
func (l *loader) moe(p *Params, il int, route Router) *MoE {
	return &MoE{GateInp: l.matrix(blk(il, "ffn_gate_inp.weight"), p.Experts, p.Embd), Route: route}
}

// sharedExpert loads layer il's shared expert of ff rows gated by g:
// ffn_gate_inp_shexp ([Embd], SharedSigmoid only), then ffn_gate_shexp,
// ffn_up_shexp and ffn_down_shexp.
func (l *loader) sharedExpert(p *Params, il int, ff int, g SharedGating) *SharedExpert {
	s := &SharedExpert{Gating: g}
	if g == SharedSigmoid {
		s.GateInp = l.vector(blk(il, "ffn_gate_inp_shexp.weight"), p.Embd)
	}
	s.FeedForward = l.feedForward(p, il, "_shexp", ff)
	return s
}

// moe runs layer il's MoE block on ws.xn and adds its output to ws.x (the
// residual).
func (m *Model) moe(ctx context.Context, il int, b *MoE, rows []Row) error {
	p, ws := m.p, &m.ws
	n, d := len(rows), p.Embd
	ne, k := p.Experts, p.ExpertsUsed
	// With the model's own experts, the shared expert rides along in the
	// regions the routed ones need anyway: its gate and up projections in
	// the router's region, its down projection in the routed experts'
	// region (sharedLocal). Each output element is the same dot product
	// wherever it is computed.
	own := m.experts == expert.Computer(m.local)
	var dg expert.Delegator
	if !own && m.local != nil {
		dg, _ = m.experts.(expert.Delegator)
	}
	// A layer the Computer will hand back to the model's own experts (a
	// dispatcher with no worker holding any of them) is planned as own.
	planOwn := own
	if ld, ok := dg.(expert.LayerDelegator); ok {
		planOwn = ld.DelegatesLayer(il, m.local)
	}
	fused := b.Shared != nil && m.local != nil && planOwn
	if fused {
		sh, ff := b.Shared, b.Shared.Gate.Rows
		if err := m.projectAll(ws.xn[:n*d], n, proj{w: &b.GateInp, y: ws.router[:n*ne]},
			proj{w: &sh.Gate, y: ws.ffGate[:n*ff]}, proj{w: &sh.Up, y: ws.ffUp[:n*ff]}); err != nil {
			return err
		}
	} else if err := m.project(ws.xn[:n*d], n, &b.GateInp, ws.router[:n*ne]); err != nil {
		return err
	}
	for i := range n {
		if err := b.Route(ws.router[i*ne:(i+1)*ne], ws.probs, ws.ids[i*k:(i+1)*k], ws.wts[i*k:(i+1)*k]); err != nil {
			return fmt.Errorf("model: layer %d row %d: %w", il, i, err)
		}
	}
	eo, es := ws.eo[:n*k*d], ws.esum[:n*d]
	hidden, ids, wts := ws.xn[:n*d], ws.ids[:n*k], ws.wts[:n*k]
	var err error
	if dg != nil {
		// A layer no worker holds: the dispatcher would hand every pair
		// to these very experts, one goroutine per call; the helpers
		// are faster and give the same bits.
		own = dg.Delegate(il, ids, m.local)
	}
	// A Computer that sums (the swarm's workers then send one row of d
	// floats instead of k) computes es itself, with expert.WeightedSum:
	// the same bits as summing eo below.
	_, sums := m.experts.(expert.SumComputer)
	sums = sums && !own
	switch {
	case own:
		// The model's own experts run on its helper goroutines.
		run := expert.Runner(serial)
		if m.team.helpers > 0 {
			run = m.team.run
		}
		if fused {
			err = m.sharedLocal(ctx, il, b.Shared, run, n)
			break
		}
		t0 := time.Now()
		err = m.local.ComputeExpertsWith(ctx, run, m.team.helpers+1, il, hidden, ids, n, k, eo)
		m.localExpertTime += time.Since(t0)
		if err == nil && b.Shared != nil {
			err = m.shared(b.Shared, n)
		}
	case b.Shared != nil:
		// Remote experts: compute the shared expert while they are away.
		if ws.remote == nil {
			ws.remote = make(chan error, 1)
		}
		done := ws.remote // received from below before the next layer sends: reused
		go func() { done <- m.routed(ctx, il, n, sums) }()
		var serr error
		if fused {
			// Planned as own, then sent (a worker came): the gate and
			// up projections are done.
			serr = m.sharedFrom(b.Shared, n)
		} else {
			serr = m.shared(b.Shared, n)
		}
		err = errors.Join(<-done, serr)
	default:
		err = m.routed(ctx, il, n, sums)
	}
	if err != nil {
		return fmt.Errorf("model: layer %d experts: %w", il, err)
	}
	// experts = ggml_mul(experts, weights); moe_out = sum over slots in slot
	// order with ggml_add (expert.WeightedSum); (qwen35moe: cur = moe_out +
	// ffn_shexp;) cur = cur + ffn_inp (llama-graph.cpp build_moe_ffn).
	if !sums {
		expert.WeightedSum(es, eo, wts, k, d)
	}
	for i := range n {
		x := ws.x[i*d : (i+1)*d]
		e := es[i*d : (i+1)*d]
		var sh []float32
		if b.Shared != nil {
			sh = ws.ffOut[i*d : (i+1)*d]
		}
		for j := range x {
			acc := e[j]
			if sh != nil {
				acc += sh[j]
			}
			x[j] += acc
		}
	}
	return nil
}

// routed computes layer il's routed experts of the n rows of ws.xn with
// m.experts: their outputs into ws.eo (n x k x Embd), or with sums (the
// Computer is an expert.SumComputer) each row's weighted sum into ws.esum
// (n x Embd).
func (m *Model) routed(ctx context.Context, il, n int, sums bool) error {
	ws, d, k := &m.ws, m.p.Embd, m.p.ExpertsUsed
	if sums {
		return m.experts.(expert.SumComputer).ComputeExpertsSum(ctx, il, ws.xn[:n*d], ws.ids[:n*k], ws.wts[:n*k], n, k, ws.esum[:n*d])
	}
	return m.experts.ComputeExperts(ctx, il, ws.xn[:n*d], ws.ids[:n*k], n, k, ws.eo[:n*k*d])
}

// shared computes the shared expert of the n rows of ws.xn into ws.ffOut
// (n x Embd), gating included.
func (m *Model) shared(s *SharedExpert, n int) error {
	if err := m.feedForward(&s.FeedForward, n); err != nil {
		return err
	}
	m.gateShared(s, n)
	return nil
}

// sharedFrom is shared with the gate and up projections already in
// ws.ffGate and ws.ffUp: silu(gate) * up, the down projection into
// ws.ffOut, the gating. Same bits as shared.
func (m *Model) sharedFrom(s *SharedExpert, n int) error {
	if err := m.ffDown(&s.FeedForward, n); err != nil {
		return err
	}
	m.gateShared(s, n)
	return nil
}

// sharedLocal computes layer il's routed experts (the model's own, into
// ws.eo) and its shared expert s (into ws.ffOut, gating included) for the
// n rows of ws.xn, the shared expert's gate and up projections already in
// ws.ffGate and ws.ffUp: silu(gate) * up, then its down projection planned
// (planProjection) and run as extra units of the routed experts' region
// (rider), so that the layer pays one region and one barrier for both.
// The shared expert's outputs are the dot products feedForward computes,
// bit for bit.
func (m *Model) sharedLocal(ctx context.Context, il int, s *SharedExpert, run expert.Runner, n int) error {
	ws, d, k, ff := &m.ws, m.p.Embd, m.p.ExpertsUsed, s.Gate.Rows
	h := ws.ffGate[:n*ff]
	expert.SwiGLU(h, h, ws.ffUp[:n*ff])
	units, unit, err := m.planProjection(h, n, []proj{{w: &s.Down, y: ws.ffOut[:n*d]}})
	if err != nil {
		return err
	}
	ws.err = nil
	r := rider{run: run, units: units, unit: unit}
	t0 := time.Now()
	err = m.local.ComputeExpertsWith(ctx, r.Run, m.team.helpers+1, il, ws.xn[:n*d], ws.ids[:n*k], n, k, ws.eo[:n*k*d])
	r.flush()
	m.localExpertTime += time.Since(t0)
	if err = errors.Join(err, ws.err); err != nil {
		return err
	}
	m.gateShared(s, n)
	return nil
}

// rider is a Runner (Run) that adds units extra units, unit(worker, u) for
// u in [0, units), to the first region it is given, after that region's
// own units; flush runs them if no region came. The extra units must not
// depend on the region's work nor it on theirs.
type rider struct {
	run   expert.Runner
	units int
	unit  func(worker, u int)
}

// Run runs fn over [0, n) with r.run, plus r's units the first time.
func (r *rider) Run(n int, fn func(worker, unit int)) {
	if r.units == 0 {
		r.run(n, fn)
		return
	}
	extra, unit := r.units, r.unit
	r.units = 0
	r.run(n+extra, func(w, u int) {
		if u < n {
			fn(w, u)
		} else {
			unit(w, u-n)
		}
	})
}

// flush runs r's units if no region has run them.
func (r *rider) flush() {
	if r.units > 0 {
		r.Run(0, nil)
	}
}

// gateShared scales the shared expert's outputs in ws.ffOut (n x Embd) by
// its gate, sigmoid(GateInp . x) per row of ws.xn (SharedSigmoid; nothing
// for SharedUngated).
func (m *Model) gateShared(s *SharedExpert, n int) {
	if s.Gating != SharedSigmoid {
		return
	}
	ws, d := &m.ws, m.p.Embd
	x := ws.xn[:n*d]
	for i := range n {
		g := sigmoid(quant.DotF32(s.GateInp, x[i*d:(i+1)*d]))
		o := ws.ffOut[i*d : (i+1)*d]
		quant.ScaleF32(o, o, g) // o[j] = g * o[j]: ggml_mul's product, either order
	}
}

// minWeightSum is the clamp on the sum of the selected router probabilities
// (llama-graph.cpp build_moe_ffn: ggml_clamp(weights_sum, 6.103515625e-5, INF)).
const minWeightSum = 6.103515625e-5

// ErrNonFinite is returned (wrapped) by Model.Forward when a layer's router
// logits, or the final hidden state that the output head reads, hold a NaN
// or ±Inf (NaN weights in the GGUF, or a non-finite hidden state): no
// expert can be chosen, and no token sampled, so the batch fails instead
// of routing to an arbitrary expert or answering token 0.
var ErrNonFinite = errors.New("model: non-finite values")

// Router turns one row's router logits (len = Experts) into the row's
// experts ids and their weights w (len(ids) = len(w) = ExpertsUsed, slot
// order), using probs (len = Experts) as scratch. An architecture picks one
// per MoE block at load (MoE.Route); Forward calls it once per row and
// layer. Errors: ErrNonFinite (wrapped) when a logit is NaN or ±Inf,
// ErrBatch when the lengths disagree; ids and w are then unspecified.
type Router func(logits, probs []float32, ids []int32, w []float32) error

var (
	_ Router = SoftmaxTopK
	_ Router = SoftmaxTopKNorm
)

// SoftmaxTopK is the router of llama.cpp's build_moe_ffn with
// LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX and norm_w = false: p =
// softmax(logits); the top-k experts by p (descending; ties: lower id) with
// w_s = p_{ids_s}. See Router for the arguments and errors; probs holds p
// on return.
//
// Finite logits give finite probabilities in [0, 1] (softmax subtracts the
// maximum), so every slot then finds an expert. A logit is non-finite when
// its 8 exponent bits are all ones (IEEE 754-2008 §3.4).
func SoftmaxTopK(logits, probs []float32, ids []int32, w []float32) error {
	for e, v := range logits {
		if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
			return fmt.Errorf("%w: router logits: expert %d logit %v", ErrNonFinite, e, v)
		}
	}
	if len(ids) > len(logits) || len(w) != len(ids) {
		return fmt.Errorf("%w: %d slots for %d experts", ErrBatch, len(ids), len(logits))
	}
	softmax(probs, logits)
	// One pass keeps the best so far in ids and w, sorted as the slots
	// are (probability descending, then id ascending): an expert goes
	// below those of equal probability, whose ids are lower.
	k, cnt := len(ids), 0
	if k == 0 {
		return nil
	}
	for e, v := range probs {
		if !(v >= 0) || cnt == k && !(v > w[k-1]) { // v >= 0: unreachable otherwise for finite logits
			continue
		}
		j := cnt
		if cnt < k {
			cnt++
		} else {
			j = k - 1 // the last one drops out
		}
		for ; j > 0 && w[j-1] < v; j-- {
			ids[j], w[j] = ids[j-1], w[j-1]
		}
		ids[j], w[j] = int32(e), v
	}
	if cnt < k { // unreachable for finite logits
		return fmt.Errorf("%w: router logits: no expert left for slot %d", ErrNonFinite, cnt)
	}
	return nil
}

// SoftmaxTopKNorm is the router of llama.cpp's build_moe_ffn with
// LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX and norm_w = true (qwen3moe,
// qwen35moe): SoftmaxTopK's experts, their probabilities divided by their
// float64-accumulated sum clamped at minWeightSum (ggml_sum_rows,
// ggml_clamp, ggml_div). See Router for the arguments and errors.
func SoftmaxTopKNorm(logits, probs []float32, ids []int32, w []float32) error {
	if err := SoftmaxTopK(logits, probs, ids, w); err != nil {
		return err
	}
	var sum float64
	for _, v := range w {
		sum += float64(v)
	}
	ws := max(float32(sum), minWeightSum)
	for s := range w {
		w[s] /= ws
	}
	return nil
}
