package model

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Sequence is one token sequence's state: its F32 KV cache (llama.cpp
// type_k = type_v = F32) and the number of positions filled. Create one with
// Model.NewSequence; several sequences may be decoded in one Forward call.
// A Sequence belongs to the Model that created it.
type Sequence struct {
	m       *Model
	n       int // positions filled: 0..n-1
	pending int // scratch for Forward's validation
	capPos  int
	// k[l]: layer l's keys, capPos x HeadsKV*HeadDim float32, position-major.
	// v[l]: layer l's values transposed, HeadsKV*HeadDimV x capPos (channel-
	// major, as llama.cpp stores V without flash attention), so each output
	// element of softmax(.) V is one contiguous dot product over positions.
	k, v [][]float32
}

// NewSequence returns an empty sequence. Its cache grows on demand (doubling,
// at most Params.Context positions: 2 x Layers x HeadsKV x HeadDim x 4 bytes
// per position).
func (m *Model) NewSequence() *Sequence {
	return &Sequence{m: m, k: make([][]float32, m.p.Layers), v: make([][]float32, m.p.Layers)}
}

// Len returns the number of positions filled; the next token goes at Len().
func (s *Sequence) Len() int { return s.n }

// Truncate drops positions n and later (to rewind or reuse the sequence).
// It fails with ErrBatch if n is negative or beyond Len.
func (s *Sequence) Truncate(n int) error {
	if n < 0 || n > s.n {
		return fmt.Errorf("%w: truncate to %d of %d positions", ErrBatch, n, s.n)
	}
	s.n = n
	return nil
}

func (s *Sequence) reserve(need int) {
	if need <= s.capPos {
		return
	}
	p := s.m.p
	c := min(p.Context, max(need, 2*s.capPos, 64))
	kd, vd := p.HeadsKV*p.HeadDim, p.HeadsKV*p.HeadDimV
	for l := range s.k {
		k := make([]float32, c*kd)
		copy(k, s.k[l][:s.n*kd])
		s.k[l] = k
		v := make([]float32, c*vd)
		for ch := range vd {
			copy(v[ch*c:ch*c+s.n], s.v[l][ch*s.capPos:ch*s.capPos+s.n])
		}
		s.v[l] = v
	}
	s.capPos = c
}

// Row is one token of a Forward batch: Token goes into Seq at position Pos,
// which must be Seq.Len() plus the number of earlier rows of the same
// sequence in the batch (rows of one sequence appear in position order).
// Logits asks for this row's logits.
type Row struct {
	Seq    *Sequence
	Token  int32
	Pos    int
	Logits bool
}

// workspace holds Forward's buffers, grown on demand and reused.
type workspace struct {
	rows                     int
	x, xn, q, k, v, att, tmp []float32
	cos, sin                 []float32 // rows x RopeDim/2
	router, probs, wts, eo   []float32
	ids                      []int32
	sel                      []float32
	conv                     [3][]byte
	convType                 [3]quant.Type
	convN                    int
	scores                   [][]float32 // per worker
	chunks                   []chunk     // projectAll's work list
	ptmp                     []float32   // projectAll's per-chunk outputs when n > 1
	mu                       sync.Mutex  // guards err
	err                      error       // first error of a parallel region
}

func (ws *workspace) ensure(p Params, n int) {
	if n <= ws.rows {
		return
	}
	n = max(n, 2*ws.rows) // growing batches reallocate O(log n) times
	qd, kd, vd := p.Heads*p.HeadDim, p.HeadsKV*p.HeadDim, p.HeadsKV*p.HeadDimV
	ws.rows = n
	ws.x = make([]float32, n*p.Embd)
	ws.xn = make([]float32, n*p.Embd)
	ws.tmp = make([]float32, n*p.Embd)
	ws.q = make([]float32, n*qd)
	ws.k = make([]float32, n*kd)
	ws.v = make([]float32, n*vd)
	ws.att = make([]float32, n*p.Heads*p.HeadDimV)
	ws.cos = make([]float32, n*p.RopeDim/2)
	ws.sin = make([]float32, n*p.RopeDim/2)
	ws.router = make([]float32, n*p.Experts)
	ws.probs = make([]float32, p.Experts)
	ws.wts = make([]float32, n*p.ExpertsUsed)
	ws.ids = make([]int32, n*p.ExpertsUsed)
	ws.eo = make([]float32, n*p.ExpertsUsed*p.Embd)
	ws.sel = make([]float32, n*p.Embd)
}

// Forward runs rows through the model: each row's token is embedded at its
// position, its K and V are appended to its sequence's cache, and for the
// rows with Logits set (in row order) logits receives Vocab float32 logits,
// so len(logits) = (rows with Logits) x Vocab. Rows of different sequences
// share each layer's expert call. On success every sequence's Len advances
// by its number of rows; on error Len is unchanged.
//
// Errors wrap ErrBatch, ErrContext or ErrNonFinite (a NaN or ±Inf router
// logit), or come from the expert Computer or ctx.
func (m *Model) Forward(ctx context.Context, rows []Row, logits []float32) error {
	p := m.p
	n := len(rows)
	if n == 0 {
		if len(logits) != 0 {
			return fmt.Errorf("%w: logits buffer for an empty batch", ErrBatch)
		}
		return nil
	}
	for i := range rows {
		r := &rows[i]
		if r.Seq == nil || r.Seq.m != m {
			return fmt.Errorf("%w: row %d: sequence of another model", ErrBatch, i)
		}
		r.Seq.pending = r.Seq.n
	}
	nl := 0
	for i := range rows {
		r := &rows[i]
		switch {
		case r.Token < 0 || int(r.Token) >= p.Vocab:
			return fmt.Errorf("%w: row %d: token %d outside the vocabulary of %d", ErrBatch, i, r.Token, p.Vocab)
		case r.Pos != r.Seq.pending:
			return fmt.Errorf("%w: row %d: position %d, want %d", ErrBatch, i, r.Pos, r.Seq.pending)
		case r.Pos >= p.Context:
			return fmt.Errorf("%w: row %d: position %d >= %d", ErrContext, i, r.Pos, p.Context)
		}
		r.Seq.pending++
		if r.Logits {
			nl++
		}
	}
	if len(logits) != nl*p.Vocab {
		return fmt.Errorf("%w: logits buffer holds %d floats, want %d x %d", ErrBatch, len(logits), nl, p.Vocab)
	}
	maxPos := 0
	for i := range rows {
		rows[i].Seq.reserve(rows[i].Seq.pending)
		maxPos = max(maxPos, rows[i].Pos)
	}
	ws := &m.ws
	ws.ensure(p, n)
	for len(ws.scores) < m.threads {
		ws.scores = append(ws.scores, nil)
	}
	for w := range ws.scores {
		if len(ws.scores[w]) < maxPos+1 {
			ws.scores[w] = make([]float32, max(maxPos+1, 2*len(ws.scores[w])))
		}
	}

	d := p.Embd
	erb, err := m.TokenEmbd.Type.RowBytes(d)
	if err != nil {
		return err
	}
	half := p.RopeDim / 2
	for i := range rows {
		t := int(rows[i].Token)
		if err := quant.Dequantize(m.TokenEmbd.Type, m.TokenEmbd.Data[t*erb:(t+1)*erb], ws.x[i*d:(i+1)*d]); err != nil {
			return err
		}
		ropeTable(p, rows[i].Pos, ws.cos[i*half:(i+1)*half], ws.sin[i*half:(i+1)*half])
	}

	if m.threads > 1 {
		m.team.start(m.threads)
		defer m.team.stop()
	}
	for il := range m.Blocks {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := m.layer(ctx, il, rows); err != nil {
			return err
		}
	}

	if nl > 0 {
		j := 0
		for i := range rows {
			if rows[i].Logits {
				rmsNorm(ws.sel[j*d:(j+1)*d], ws.x[i*d:(i+1)*d], m.OutputNorm, p.NormEps)
				j++
			}
		}
		if err := m.project(ws.sel[:nl*d], nl, &m.Output, logits); err != nil {
			return err
		}
	}
	for i := range rows {
		rows[i].Seq.n = rows[i].Seq.pending
	}
	return nil
}

// layer runs block il on the rows held in ws.x (llama.cpp
// src/models/qwen3moe.cpp).
func (m *Model) layer(ctx context.Context, il int, rows []Row) error {
	p, ws, b := m.p, &m.ws, &m.Blocks[il]
	n, d := len(rows), p.Embd
	qd, kd, vd := p.Heads*p.HeadDim, p.HeadsKV*p.HeadDim, p.HeadsKV*p.HeadDimV
	hd, half := p.HeadDim, p.RopeDim/2

	for i := range n {
		rmsNorm(ws.xn[i*d:(i+1)*d], ws.x[i*d:(i+1)*d], b.AttnNorm, p.NormEps)
	}
	if err := m.projectAll(ws.xn[:n*d], n, proj{w: &b.AttnQ, y: ws.q[:n*qd]},
		proj{w: &b.AttnK, y: ws.k[:n*kd]}, proj{w: &b.AttnV, y: ws.v[:n*vd]}); err != nil {
		return err
	}
	for i := range rows {
		c, s := ws.cos[i*half:(i+1)*half], ws.sin[i*half:(i+1)*half]
		for h := range p.Heads {
			x := ws.q[i*qd+h*hd : i*qd+(h+1)*hd]
			rmsNorm(x, x, b.AttnQNorm, p.NormEps)
			ropeNeox(x, c, s)
		}
		seq, pos := rows[i].Seq, rows[i].Pos
		kc := seq.k[il][pos*kd : (pos+1)*kd]
		for h := range p.HeadsKV {
			x := ws.k[i*kd+h*hd : i*kd+(h+1)*hd]
			rmsNorm(kc[h*hd:(h+1)*hd], x, b.AttnKNorm, p.NormEps)
			ropeNeox(kc[h*hd:(h+1)*hd], c, s)
		}
		vt, cp := seq.v[il], seq.capPos
		for ch, x := range ws.v[i*vd : (i+1)*vd] {
			vt[ch*cp+pos] = x
		}
	}
	m.attention(il, rows)

	if err := m.project(ws.att[:n*p.Heads*p.HeadDimV], n, &b.AttnOutput, ws.tmp[:n*d]); err != nil {
		return err
	}
	for i, v := range ws.tmp[:n*d] {
		ws.x[i] += v // ffn_inp = cur + inpSA
	}
	for i := range n {
		rmsNorm(ws.xn[i*d:(i+1)*d], ws.x[i*d:(i+1)*d], b.FFNNorm, p.NormEps)
	}
	ne, k := p.Experts, p.ExpertsUsed
	if err := m.project(ws.xn[:n*d], n, &b.FFNGateInp, ws.router[:n*ne]); err != nil {
		return err
	}
	for i := range n {
		if err := route(ws.router[i*ne:(i+1)*ne], ws.probs, ws.ids[i*k:(i+1)*k], ws.wts[i*k:(i+1)*k]); err != nil {
			return fmt.Errorf("model: layer %d row %d: %w", il, i, err)
		}
	}
	eo := ws.eo[:n*k*d]
	var err error
	if m.experts == expert.Computer(m.local) {
		// The model's own experts run on its helper goroutines.
		run := expert.Runner(serial)
		if m.team.helpers > 0 {
			run = m.team.run
		}
		err = m.local.ComputeExpertsWith(ctx, run, m.team.helpers+1, il, ws.xn[:n*d], ws.ids[:n*k], n, k, eo)
	} else {
		err = m.experts.ComputeExperts(ctx, il, ws.xn[:n*d], ws.ids[:n*k], n, k, eo)
	}
	if err != nil {
		return fmt.Errorf("model: layer %d experts: %w", il, err)
	}
	// experts = ggml_mul(experts, weights); moe_out = sum over slots in slot
	// order with ggml_add; cur = moe_out + ffn_inp (llama-graph.cpp
	// build_moe_ffn). float32() on each product keeps the rounding of
	// separate multiplies and adds on every architecture (no FMA fusion).
	for i := range n {
		x := ws.x[i*d : (i+1)*d]
		w := ws.wts[i*k : (i+1)*k]
		o := eo[i*k*d : (i+1)*k*d]
		for j := range x {
			acc := float32(w[0] * o[j])
			for s := 1; s < k; s++ {
				acc += float32(w[s] * o[s*d+j])
			}
			x[j] += acc
		}
	}
	return nil
}

// proj is one matrix product of a parallel region: y [n x w.Rows] = x .
// w^T, x already converted to w's vec_dot_type (conv).
type proj struct {
	w    *Weight
	conv []byte
	y    []float32
}

// Parallel grain of projectAll, in multiply-adds (rows x cols x n): a
// region smaller than minParallelMACs (tens of microseconds) runs on the
// caller, since waking a helper costs microseconds and, on a loaded
// machine, a helper descheduled inside a region delays the whole step;
// chunks are at least minChunkMACs.
const (
	minParallelMACs = 1 << 19
	minChunkMACs    = 1 << 16
)

// chunk is rows [lo, hi) of region job j.
type chunk struct{ j, lo, hi int32 }

// project computes y [n x w.Rows] = x [n x w.Cols] . w^T (see projectAll).
func (m *Model) project(x []float32, n int, w *Weight, y []float32) error {
	return m.projectAll(x, n, proj{w: w, y: y})
}

// projectAll computes y = x [n x Cols] . w^T for every job (all over the same
// x) in one parallel region: x is converted once per vec_dot_type
// (quant.ConvertActivation), then each weight's output rows are cut into
// chunks that m.threads goroutines take in order from a shared counter (a
// descheduled thread on a loaded machine delays only its current chunk).
// Every output element is one quant.MatMulConverted dot product whatever the
// chunking, so results do not depend on the thread count.
func (m *Model) projectAll(x []float32, n int, jobs ...proj) error {
	ws := &m.ws
	ws.convN = 0
	work := 0
	for i := range jobs {
		c, err := m.convert(x, jobs[i].w)
		if err != nil {
			return err
		}
		jobs[i].conv = c
		work += jobs[i].w.Rows * jobs[i].w.Cols * n
	}
	threads := m.threads
	if threads <= 1 || work < minParallelMACs {
		for _, jb := range jobs {
			w := jb.w
			if err := quant.MatMulConverted(w.Type, w.Data, w.Rows, w.Cols, jb.conv, n, jb.y, 1); err != nil {
				return fmt.Errorf("model: %s: %w", w.Name, err)
			}
		}
		return nil
	}
	// About 8 chunks per thread over the region, each at least
	// minChunkMACs multiply-adds.
	total := 0
	for _, jb := range jobs {
		total += jb.w.Rows
	}
	step := max((total+8*threads-1)/(8*threads), minChunkMACs/(n*jobs[0].w.Cols))
	ws.chunks = ws.chunks[:0]
	tmp := 0
	for j, jb := range jobs {
		for lo := 0; lo < jb.w.Rows; lo += step {
			ws.chunks = append(ws.chunks, chunk{int32(j), int32(lo), int32(min(jb.w.Rows, lo+step))})
		}
		if n > 1 {
			tmp += n * jb.w.Rows
		}
	}
	if len(ws.ptmp) < tmp {
		ws.ptmp = make([]float32, max(tmp, 2*len(ws.ptmp)))
	}
	ws.err = nil
	m.team.run(len(ws.chunks), func(_, u int) {
		c := ws.chunks[u]
		jb := &jobs[c.j]
		w := jb.w
		rb, err := w.Type.RowBytes(w.Cols)
		if err != nil {
			ws.fail(err)
			return
		}
		lo, hi := int(c.lo), int(c.hi)
		rows := hi - lo
		if n == 1 {
			err = quant.MatMulConverted(w.Type, w.Data[lo*rb:hi*rb], rows, w.Cols, jb.conv, 1, jb.y[lo:hi], 1)
		} else {
			// n x rows into a private region, then scattered.
			off := 0
			for _, o := range jobs[:c.j] {
				off += n * o.w.Rows
			}
			t := ws.ptmp[off+n*lo : off+n*hi]
			err = quant.MatMulConverted(w.Type, w.Data[lo*rb:hi*rb], rows, w.Cols, jb.conv, n, t, 1)
			for i := range n {
				copy(jb.y[i*w.Rows+lo:i*w.Rows+hi], t[i*rows:(i+1)*rows])
			}
		}
		if err != nil {
			ws.fail(fmt.Errorf("model: %s: %w", w.Name, err))
		}
	})
	return ws.err
}

// fail records the first error of a parallel region in ws.err.
func (ws *workspace) fail(err error) {
	ws.mu.Lock()
	if ws.err == nil {
		ws.err = err
	}
	ws.mu.Unlock()
}

// convert returns x converted to w's vec_dot_type, converting once per type
// until ws.convN is reset (projectAll resets it: its x changes per call).
func (m *Model) convert(x []float32, w *Weight) ([]byte, error) {
	ws := &m.ws
	vt := w.Type.VecDotType()
	for j := range ws.convN {
		if ws.convType[j] == vt {
			return ws.conv[j], nil
		}
	}
	if ws.convN == len(ws.conv) {
		return nil, fmt.Errorf("%w: %s: more than %d activation types in one region", ErrTensor, w.Name, len(ws.conv))
	}
	slot := ws.convN
	ab, err := quant.ActivationBytes(w.Type, len(x))
	if err != nil {
		return nil, fmt.Errorf("model: %s: %w", w.Name, err)
	}
	if cap(ws.conv[slot]) < ab {
		ws.conv[slot] = make([]byte, ab)
	}
	ws.conv[slot] = ws.conv[slot][:ab]
	if err := quant.ConvertActivation(w.Type, x, ws.conv[slot]); err != nil {
		return nil, fmt.Errorf("model: %s: %w", w.Name, err)
	}
	ws.convType[slot] = vt
	ws.convN++
	return ws.conv[slot], nil
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
		kc, vc := seq.k[il], seq.v[il]
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

// rmsNorm sets dst = src / sqrt(mean(src^2) + eps) * w as
// ggml_compute_forward_rms_norm_f32 (float64 sum of float32 squares, float32
// scale) followed by ggml_mul with the norm weight. dst may alias src.
func rmsNorm(dst, src, w []float32, eps float32) {
	var sum float64
	for _, v := range src {
		sum += float64(v * v)
	}
	mean := float32(sum / float64(len(src)))
	scale := 1 / float32(math.Sqrt(float64(mean+eps)))
	w = w[:len(src)]
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = float32(v*scale) * w[i]
	}
}

// ropeTable fills the cos/sin of position pos for the RopeDim/2 rotated
// pairs as ggml_rope_cache_init does (ggml-cpu/ops.cpp): theta starts at
// pos and is multiplied in float32 by base^(-2/RopeDim) per pair; with no
// YaRN, theta is scaled by RopeScale (freq_scale) and mscale is 1.
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
// pair (i, i+half)), as ggml's rope with GGML_ROPE_TYPE_NEOX.
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

// softmax sets dst = softmax(src) as ggml_soft_max (max subtracted, float64
// sum of the float32 exponentials, multiplied by float32(1/sum)). dst may
// alias src.
func softmax(dst, src []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range src {
		mx = max(mx, v)
	}
	var sum float64
	for i, v := range src {
		e := float32(math.Exp(float64(v - mx)))
		dst[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range src {
		dst[i] *= inv
	}
}

// minWeightSum is the clamp on the sum of the selected router probabilities
// (llama-graph.cpp build_moe_ffn: ggml_clamp(weights_sum, 6.103515625e-5, INF)).
const minWeightSum = 6.103515625e-5

// ErrNonFinite is returned (wrapped) by Model.Forward when a layer's router
// logits hold a NaN or ±Inf (NaN weights in the GGUF, or a non-finite hidden
// state): no expert can be chosen, so the batch fails instead of routing to
// an arbitrary expert.
var ErrNonFinite = errors.New("model: non-finite router logits")

// route turns one row's router logits into the top-k experts (by softmax
// probability, descending; ties: lower id) and their probabilities divided
// by their float64-accumulated sum (clamped at minWeightSum). probs is
// scratch of len(logits); len(ids) = len(w) <= len(logits).
//
// Errors: ErrNonFinite (wrapped) when a logit is NaN or ±Inf (a float32 whose
// 8 exponent bits are all ones, IEEE 754-2008 §3.4); ids and w are then
// unspecified. Finite logits give finite probabilities in [0, 1] (softmax
// subtracts the maximum), so every slot then finds an expert.
func route(logits, probs []float32, ids []int32, w []float32) error {
	for e, v := range logits {
		if math.Float32bits(v)&0x7f800000 == 0x7f800000 {
			return fmt.Errorf("%w: expert %d logit %v", ErrNonFinite, e, v)
		}
	}
	if len(ids) > len(logits) || len(w) != len(ids) {
		return fmt.Errorf("%w: %d slots for %d experts", ErrBatch, len(ids), len(logits))
	}
	softmax(probs, logits)
	for s := range ids {
		best := -1
		for e, v := range probs {
			if v >= 0 && (best < 0 || v > probs[best]) {
				best = e
			}
		}
		if best < 0 { // unreachable for finite logits; never index with -1
			return fmt.Errorf("%w: no expert left for slot %d", ErrNonFinite, s)
		}
		ids[s] = int32(best)
		w[s] = probs[best]
		probs[best] = -1 // taken
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

// serial calls fn(0, u) for u in [0, n) in order (team.run's signature).
func serial(n int, fn func(worker, unit int)) {
	for u := range n {
		fn(0, u)
	}
}
