package model

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
)

// ErrNoMTP: the model has no multi-token-prediction head that this engine
// can run (no nextn_predict_layers block, or one missing tensors); the
// error says which.
var ErrNoMTP = errors.New("model: no multi-token-prediction head")

// MTPHead is a qwen35moe multi-token-prediction (NextN) block: the
// nextn_predict_layers block stored after the main ones (blk.L, L =
// Params.Layers), run as llama.cpp's LLM_GRAPH_TYPE_DECODER_MTP graph
// (src/models/qwen35moe.cpp graph_mtp; llama.cpp speculative type
// draft-mtp). For a token t at position k and a hidden state h (Embd
// floats) it computes
//
//	x  = eh_proj . [enorm(embed(t)) ; hnorm(h)]           (concat, 2*Embd)
//	x' = Block(x)  at position k, with its own KV memory   (gated attention, MoE + shared expert)
//	h' = rmsnorm(x') * HeadNorm;  logits = Head . h'
//
// where h is the main model's output-normed hidden state at position k-1
// (the vector its output head reads: llama.cpp's t_h_nextn, zeros before
// position 0), so that the logits predict the token at k+1; chained, h is
// the head's own h' of the step before. MTPDrafter runs it.
type MTPHead struct {
	// Block is blk.L's transformer block: attn_norm, a gated Attention
	// (MemoryKV), post_attention_norm and an MoE (FFNMoE, SoftmaxTopKNorm,
	// sigmoid-gated shared expert), as a qwen35moe full-attention layer.
	// Its routed experts are expert layer L of the model's Computer.
	Block
	EHProj Weight    // nextn.eh_proj Embd x 2*Embd (ggml ne [2*Embd, Embd])
	ENorm  []float32 // nextn.enorm [Embd]: the token embedding's norm
	HNorm  []float32 // nextn.hnorm [Embd]: the hidden state's norm
	// HeadNorm is nextn.shared_head_norm [Embd], or output_norm when the
	// file has none.
	HeadNorm []float32
	// Embed is nextn.embed_tokens (Vocab x Embd), or token_embd when the
	// file has none.
	Embed Weight
	// Head is nextn.shared_head_head (Vocab x Embd), or the model's output
	// head when the file has none.
	Head Weight
}

// loadMTP loads block il (= p.Layers) as the model's MTP head with a
// loader of its own: a missing or misshapen tensor leaves m.MTP nil and
// the reason in m.mtpErr (the main model loads and runs without it, as
// before the head was run).
func (m *Model) loadMTP(a *arch, f *loader, p *Params, experts *expert.Layer) {
	if p.NextN == 0 {
		m.mtpErr = fmt.Errorf("%w: %s has no nextn_predict_layers block", ErrNoMTP, a.name)
		return
	}
	if a.mtp == nil {
		m.mtpErr = fmt.Errorf("%w: running %s's MTP block is not implemented", ErrNoMTP, a.name)
		return
	}
	if p.NextN != 1 {
		// llama.cpp's graph_mtp asserts n_layer_nextn == 1 too.
		m.mtpErr = fmt.Errorf("%w: nextn_predict_layers %d, only 1 is supported", ErrNoMTP, p.NextN)
		return
	}
	il := p.Layers
	l := &loader{f: f.f, prefix: f.prefix}
	h := &MTPHead{}
	h.Memory, h.FFN = MemoryKV, FFNMoE
	a.mtp(l, p, il, &h.Block)
	n := func(s string) string { return blk(il, "nextn."+s+".weight") }
	h.EHProj = l.matrix(n("eh_proj"), p.Embd, 2*p.Embd)
	h.ENorm = l.vector(n("enorm"), p.Embd)
	h.HNorm = l.vector(n("hnorm"), p.Embd)
	h.HeadNorm = m.OutputNorm
	if l.has(n("shared_head_norm")) {
		h.HeadNorm = l.vector(n("shared_head_norm"), p.Embd)
	}
	h.Embed = m.TokenEmbd
	if l.has(n("embed_tokens")) {
		h.Embed = l.matrix(n("embed_tokens"), p.Vocab, p.Embd)
	}
	h.Head = m.Output
	if l.has(n("shared_head_head")) {
		h.Head = l.matrix(n("shared_head_head"), p.Vocab, p.Embd)
	}
	if l.err == nil {
		l.err = h.check(a.name, il)
	}
	if l.err == nil && (h.Attn == nil || !h.Attn.Gated) {
		l.err = fmt.Errorf("%w: blk.%d: the MTP block's attention is not gated", ErrTensor, il)
	}
	if l.err != nil {
		m.mtpErr = fmt.Errorf("%w: MTP block blk.%d: %w", ErrNoMTP, il, l.err)
		return
	}
	h.MoE.Experts = experts
	m.MTP = h
}

// MTPErr returns nil when the model has an MTP head (Model.MTP), else why
// not (wrapping ErrNoMTP).
func (m *Model) MTPErr() error {
	if m.MTP != nil {
		return nil
	}
	if m.mtpErr == nil {
		return ErrNoMTP
	}
	return m.mtpErr
}

// Hidden writes the output-normed hidden states (rmsnorm(x) * output_norm,
// the vectors the output head reads: llama.cpp's t_h_nextn) of every row
// of the last successful Forward into dst (rows x Embd, in row order). It
// must be called before any other Forward or MTP draft on m (they reuse
// the buffers); otherwise, or after a failed Forward, it fails with
// ErrBatch.
func (m *Model) Hidden(dst []float32) error {
	ws, d := &m.ws, m.p.Embd
	n := ws.lastRows
	if n == 0 {
		return fmt.Errorf("%w: no Forward's hidden states to read", ErrBatch)
	}
	if len(dst) != n*d {
		return fmt.Errorf("%w: hidden buffer holds %d floats, want %d x %d", ErrBatch, len(dst), n, d)
	}
	for i := range n {
		rmsNorm(dst[i*d:(i+1)*d], ws.x[i*d:(i+1)*d], m.OutputNorm, m.p.NormEps)
	}
	return nil
}

// MTPDrafter drafts tokens for one main Sequence with the model's MTP head
// (MTPHead), as llama.cpp's draft-mtp speculative decoding does: the
// head's own KV memory holds, at each position k below its length, the
// block's keys and values of the row (t_k, h_{k-1}) — the main sequence's
// token at k and the main model's hidden state at k-1 — and the drafter
// keeps the main rows it was shown (Observe) until the head has run them.
// Draft first catches the head up on those rows, one batch ending with
// the row of the next token (whose logits give the first draft), then
// chains one row per further draft on its own hidden state; the chained
// rows are dropped again (Truncate of its memory), since the main model's
// hidden states replace them once the drafts are verified.
//
// Drafts are greedy (the argmax of the head's logits); they change no
// output, which the main model's verification decides. A drafter is not
// safe for concurrent use, nor with a Forward of the same Model.
type MTPDrafter struct {
	m    *Model
	seq  *Sequence // the MTP block's memory (layer Params.Layers only)
	base int       // main position of toks[0]
	toks []int32   // main tokens at positions base.. (Observe)
	hs   []float32 // their hidden states, len(toks) x Embd

	rows           []Row
	hin, hout, cat []float32
	logits         []float32
	zero           []float32
	elapsed        time.Duration
}

// NewMTPDrafter returns a drafter for a new main sequence (position 0 on),
// or MTPErr's error when the model has no MTP head.
func (m *Model) NewMTPDrafter() (*MTPDrafter, error) {
	if err := m.MTPErr(); err != nil {
		return nil, err
	}
	seq := &Sequence{m: m, mem: make([]layerMemory, m.p.Layers+1), mtp: true}
	return &MTPDrafter{m: m, seq: seq, zero: make([]float32, m.p.Embd), logits: make([]float32, m.p.Vocab)}, nil
}

// Len returns the main sequence's length as the drafter knows it: the
// positions it was shown by Observe (less what Truncate dropped).
func (d *MTPDrafter) Len() int { return d.base + len(d.toks) }

// Observe records the main model's rows at positions pos, pos+1, ...:
// their tokens and hidden (len(tokens) x Embd floats, Model.Hidden of the
// Forward that ran them). pos must be Len(). Errors wrap ErrBatch.
func (d *MTPDrafter) Observe(pos int, tokens []int32, hidden []float32) error {
	e := d.m.p.Embd
	if pos != d.Len() {
		return fmt.Errorf("%w: MTP drafter: rows at position %d, want %d", ErrBatch, pos, d.Len())
	}
	if len(hidden) != len(tokens)*e {
		return fmt.Errorf("%w: MTP drafter: %d hidden floats for %d rows of %d", ErrBatch, len(hidden), len(tokens), e)
	}
	d.toks = append(d.toks, tokens...)
	d.hs = append(d.hs, hidden...)
	return nil
}

// Truncate drops the main positions n and later (the main sequence was
// truncated to n, e.g. to the verified drafts); n beyond Len is an
// ErrBatch error.
func (d *MTPDrafter) Truncate(n int) error {
	if n < 0 || n > d.Len() {
		return fmt.Errorf("%w: MTP drafter: truncate to %d of %d positions", ErrBatch, n, d.Len())
	}
	if n < d.base {
		d.base, d.toks, d.hs = n, d.toks[:0], d.hs[:0]
	} else {
		d.toks, d.hs = d.toks[:n-d.base], d.hs[:(n-d.base)*d.m.p.Embd]
	}
	if d.seq.Len() > n {
		return d.seq.Truncate(n)
	}
	return nil
}

// Draft returns dst with up to k greedy drafts appended for the tokens
// after next, the token the main model will run at position Len(): the
// head's argmax for position Len()+1, then, chained on its own hidden
// state, for Len()+2, ... (k <= 0: none). Position Len()+k-1 must be
// inside the context. Errors wrap ErrBatch (history the head has not run
// was dropped: see Truncate) or ErrContext, or come from the experts or
// ctx.
func (d *MTPDrafter) Draft(ctx context.Context, dst []int32, next int32, k int) ([]int32, error) {
	if k <= 0 {
		return dst, nil
	}
	t0 := time.Now()
	defer func() { d.elapsed += time.Since(t0) }()
	m, e := d.m, d.m.p.Embd
	n, first := d.Len(), d.seq.Len()
	if first > n { // drafted before at n, with maybe another next: redo row n
		if err := d.seq.Truncate(n); err != nil {
			return dst, err
		}
		first = n
	}
	if first > 0 && first-1 < d.base {
		return dst, fmt.Errorf("%w: MTP drafter: the hidden state at position %d was dropped", ErrBatch, first-1)
	}
	// Catch-up rows first..n: (t_k, h_{k-1}); the last is next's.
	cnt := n + 1 - first
	d.rows = d.rows[:0]
	d.hin = grow(d.hin, cnt*e)
	for pos := first; pos <= n; pos++ {
		t := next
		if pos < n {
			t = d.toks[pos-d.base]
		}
		h := d.zero
		if pos > 0 {
			h = d.hs[(pos-1-d.base)*e : (pos-d.base)*e]
		}
		copy(d.hin[(pos-first)*e:], h)
		d.rows = append(d.rows, Row{Seq: d.seq, Token: t, Pos: pos, Logits: pos == n})
	}
	d.hout = grow(d.hout, cnt*e)
	d.cat = grow(d.cat, 2*cnt*e)
	if err := m.mtpForward(ctx, d.rows, d.hin[:cnt*e], d.cat, d.logits, d.hout[:cnt*e]); err != nil {
		return dst, err
	}
	// Keep the main rows from position n-1 on: the next catch-up starts
	// at n+1 (with h_n, observed next) or redoes row n (with h_{n-1}).
	if drop := n - 1 - d.base; drop > 0 {
		d.toks = append(d.toks[:0], d.toks[drop:]...)
		d.hs = append(d.hs[:0], d.hs[drop*e:]...)
		d.base = n - 1
	}
	tok := argmax(d.logits)
	dst = append(dst, tok)
	copy(d.hin[:e], d.hout[(cnt-1)*e:cnt*e])
	for j := 1; j < k; j++ {
		d.rows = append(d.rows[:0], Row{Seq: d.seq, Token: tok, Pos: n + j, Logits: true})
		if err := m.mtpForward(ctx, d.rows, d.hin[:e], d.cat, d.logits, d.hout[:e]); err != nil {
			_ = d.seq.Truncate(n + 1) // a KV memory: always possible
			return dst, err
		}
		tok = argmax(d.logits)
		dst = append(dst, tok)
		copy(d.hin[:e], d.hout[:e])
	}
	return dst, d.seq.Truncate(n + 1)
}

// Logits returns the head's logits of the last draft (Vocab floats, valid
// until the next Draft).
func (d *MTPDrafter) Logits() []float32 { return d.logits }

// Elapsed returns the time spent in Draft so far.
func (d *MTPDrafter) Elapsed() time.Duration { return d.elapsed }

// argmax returns the index of the largest value (the first of equal ones).
func argmax(v []float32) int32 {
	best := 0
	for i, x := range v {
		if x > v[best] {
			best = i
		}
	}
	return int32(best)
}

// grow returns b with at least n elements.
func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// mtpForward runs rows (of one MTP sequence, in position order) through
// the MTP head: hin holds each row's input hidden state (rows x Embd),
// cat is scratch of at least rows x 2*Embd, hout receives each row's
// head-normed output hidden state h' (rows x Embd) and logits the Vocab
// logits of each row with Logits set, in order.
func (m *Model) mtpForward(ctx context.Context, rows []Row, hin, cat, logits, hout []float32) error {
	h, p, ws := m.MTP, m.p, &m.ws
	n, d := len(rows), p.Embd
	nl, err := m.prepare(rows, true)
	defer ws.dropGroups()
	if err != nil {
		return err
	}
	if len(logits) != nl*p.Vocab {
		return fmt.Errorf("%w: logits buffer holds %d floats, want %d x %d", ErrBatch, len(logits), nl, p.Vocab)
	}
	if err := m.embedWith(&h.Embed, rows); err != nil {
		return err
	}
	// ggml_concat(enorm(embd), hnorm(h), dim 0): each row [e | h].
	for i := range n {
		c := cat[2*i*d : 2*(i+1)*d]
		rmsNorm(c[:d], ws.x[i*d:(i+1)*d], h.ENorm, p.NormEps)
		rmsNorm(c[d:], hin[i*d:(i+1)*d], h.HNorm, p.NormEps)
	}
	if m.threads > 1 {
		m.team.start(m.threads)
		defer m.team.stop()
	}
	if err := m.project(cat[:2*n*d], n, &h.EHProj, ws.x[:n*d]); err != nil {
		return err
	}
	if err := m.layer(ctx, p.Layers, rows); err != nil {
		return err
	}
	j := 0
	for i := range rows {
		rmsNorm(hout[i*d:(i+1)*d], ws.x[i*d:(i+1)*d], h.HeadNorm, p.NormEps)
		if rows[i].Logits {
			copy(ws.sel[j*d:(j+1)*d], hout[i*d:(i+1)*d])
			j++
		}
	}
	if nl > 0 {
		if err := m.project(ws.sel[:nl*d], nl, &h.Head, logits); err != nil {
			return err
		}
	}
	for i := range rows {
		rows[i].Seq.n = rows[i].Seq.pending
	}
	return nil
}
