package model

import (
	"context"
	"fmt"
	"math"
	"sync"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Sequence is one token sequence's state: per layer the memory of the
// layer's Block.Memory kind (layerMemory), plus the number of positions
// filled. Create one with Model.NewSequence; several sequences may be
// decoded in one Forward call. A Sequence belongs to the Model that created
// it.
type Sequence struct {
	m       *Model
	n       int // positions filled: 0..n-1
	pending int // scratch for Forward's validation
	capPos  int // positions the KV layers' memory holds
	mem     []layerMemory
	// recurrent: some layer is MemoryRecurrent.
	recurrent bool
	// lost: a Forward failed after changing the recurrent state, so it no
	// longer matches n; only Truncate(0), or Truncate to a length an open
	// checkpoint covers, makes the sequence usable again.
	lost bool
	// cp is the open checkpoint (Checkpoint), nil if none; spare an ended
	// one whose buffers the next Checkpoint reuses.
	cp, spare *checkpoint
	// mtp: the memory of the MTP head (MTPDrafter): only layer
	// Params.Layers (the MTP block) is used.
	mtp bool
}

// layerMemory is one layer's memory in a Sequence, of the kind its
// Block.Memory says; the other kind's fields are nil.
type layerMemory struct {
	// MemoryKV: an F32 KV cache (llama.cpp type_k = type_v = F32). k is
	// capPos x HeadsKV*HeadDim, position-major; v the values transposed,
	// HeadsKV*HeadDimV x capPos (channel-major, as llama.cpp stores V
	// without flash attention), so each output element of softmax(.) V is
	// one contiguous dot product over positions.
	k, v []float32
	// MemoryRecurrent: llama.cpp's llama_memory_recurrent r and s. conv
	// holds the last SSMConv-1 inputs to the convolution, (SSMConv-1) x
	// channels, oldest first; ssm the delta rule state, SSMHeads x SSMState
	// x SSMState with ssm[(h*S+j)*S+i] = S_h[i][j] (ggml's transposed
	// layout).
	conv, ssm []float32
}

// NewSequence returns an empty sequence. Its KV layers' memory grows on
// demand (doubling, at most Params.Context positions: 2 x attention layers
// x HeadsKV x HeadDim x 4 bytes per position); its recurrent layers' state
// is allocated at once (per recurrent layer ((SSMConv-1) x
// (2*SSMGroups+SSMHeads) x SSMState + SSMHeads x SSMState^2) x 4 bytes,
// whatever the length).
func (m *Model) NewSequence() *Sequence {
	p := m.p
	s := &Sequence{m: m, mem: make([]layerMemory, p.Layers)}
	ch := (2*p.SSMGroups + p.SSMHeads) * p.SSMState
	for l := range m.Blocks {
		if m.Blocks[l].Memory == MemoryRecurrent {
			s.mem[l].conv = make([]float32, (p.SSMConv-1)*ch)
			s.mem[l].ssm = make([]float32, p.SSMHeads*p.SSMState*p.SSMState)
			s.recurrent = true
		}
	}
	return s
}

// StateBytes returns the bytes of recurrent state every Sequence of m holds
// whatever its length (per Gated DeltaNet layer, ((SSMConv-1) x
// (2*SSMGroups+SSMHeads) x SSMState + SSMHeads x SSMState^2) x 4 bytes;
// e.g. 63 MiB for Qwen3.5-35B-A3B's 30 recurrent layers), 0 for models
// without recurrent layers. A server bounds its concurrent sequences by it.
func (m *Model) StateBytes() int64 {
	p := m.p
	if p.RecurrentCount == 0 {
		return 0
	}
	ch := (2*p.SSMGroups + p.SSMHeads) * p.SSMState
	per := int64(p.SSMConv-1)*int64(ch) + int64(p.SSMHeads)*int64(p.SSMState)*int64(p.SSMState)
	return 4 * per * int64(p.RecurrentCount)
}

// Len returns the number of positions filled; the next token goes at Len().
func (s *Sequence) Len() int { return s.n }

// Recurrent reports whether the sequence has recurrent layers
// (MemoryRecurrent), whose state Truncate can only reset, or rewind into
// an open checkpoint (Checkpoint).
func (s *Sequence) Recurrent() bool { return s.recurrent }

// Truncate drops positions n and later (to rewind or reuse the sequence)
// and ends an open checkpoint (Checkpoint). It fails with ErrBatch if n is
// negative or beyond Len. With recurrent layers (Recurrent) the lengths it
// can go to are 0 (which zeroes the recurrent state), Len() and, while a
// checkpoint is open, any length from the checkpoint's to Len(): the
// state is restored from the checkpoint and the kept rows replayed, bit
// for bit (also after a failed Forward that lost the state); other
// lengths fail with ErrRewind (as llama.cpp's llama_memory_recurrent
// refuses a partial seq_rm).
func (s *Sequence) Truncate(n int) error {
	if n < 0 || n > s.n {
		return fmt.Errorf("%w: truncate to %d of %d positions", ErrBatch, n, s.n)
	}
	if s.Recurrent() {
		cp := s.cp
		switch {
		case n == 0:
			for l := range s.mem {
				clear(s.mem[l].conv)
				clear(s.mem[l].ssm)
			}
			s.lost = false
		case cp != nil && n >= cp.n && n-cp.n <= cp.logged && (n != s.n || s.lost):
			s.restore(n - cp.n)
			s.lost = false
		case s.lost:
			return fmt.Errorf("%w: the recurrent state was lost by a failed Forward; Truncate(0) resets it", ErrRewind)
		case n != s.n:
			return fmt.Errorf("%w: truncate to %d of %d positions", ErrRewind, n, s.n)
		}
	}
	s.n = n
	s.endCheckpoint()
	return nil
}

// reserve grows the KV layers' memory to hold need positions.
func (s *Sequence) reserve(need int) {
	if need <= s.capPos {
		return
	}
	p := s.m.p
	c := min(p.Context, max(need, 2*s.capPos, 64))
	kd, vd := p.HeadsKV*p.HeadDim, p.HeadsKV*p.HeadDimV
	for l := range s.mem {
		if (l == len(s.m.Blocks)) != s.mtp || s.m.blockAt(l).Memory != MemoryKV {
			continue
		}
		lm := &s.mem[l]
		k := make([]float32, c*kd)
		copy(k, lm.k[:s.n*kd])
		lm.k = k
		v := make([]float32, c*vd)
		for ch := range vd {
			copy(v[ch*c:ch*c+s.n], lm.v[ch*s.capPos:ch*s.capPos+s.n])
		}
		lm.v = v
	}
	s.capPos = c
}

// Row is one token of a Forward batch: Token goes into Seq at position Pos,
// which must be Seq.Len() plus the number of earlier rows of the same
// sequence in the batch (rows of one sequence appear in position order).
// Logits asks for this row's logits.
type Row struct {
	Seq    *Sequence // the sequence the token extends
	Token  int32     // token id in [0, Vocab)
	Pos    int       // position: Seq.Len() plus the batch's earlier rows of Seq
	Logits bool      // whether Forward writes this row's Vocab logits
}

// workspace holds Forward's buffers, grown on demand and reused.
type workspace struct {
	rows                     int
	lastRows                 int // rows of the last successful Forward (Hidden)
	x, xn, q, k, v, att, tmp []float32
	qg, gate                 []float32 // gated attention: attn_q's output, the gate half
	cos, sin                 []float32 // rows x RopeDim/2
	router, probs, wts, eo   []float32
	esum                     []float32 // MoE: each row's weighted sum of its routed experts (rows x Embd)
	ids                      []int32
	sel                      []float32
	ffGate, ffUp, ffOut      []float32  // shared expert or dense FFN
	mixed, z, beta, gdt, cv  []float32  // Gated DeltaNet: attn_qkv, attn_gate, beta, g, conv output
	o                        []float32  // Gated DeltaNet: delta-rule output
	groups                   []seqGroup // the batch's rows by sequence
	touched                  bool       // a recurrent layer ran in this Forward
	conv                     [3][]byte
	convType                 [3]quant.Type
	convN                    int
	scores                   [][]float32         // per worker
	chunks                   []chunk             // projectAll's work list
	pjobs                    []proj              // the planned projections (planProjection)
	pn                       int                 // their rows
	chunkUnit                func(worker, u int) // projectChunk of the plan's chunk u
	ptmp                     []float32           // projectAll's per-chunk outputs when n > 1
	remote                   chan error          // moe's remote expert call's result (capacity 1, one call at a time)
	mu                       sync.Mutex          // guards err
	err                      error               // first error of a parallel region
}

// ensure sizes the buffers for batches of n rows; ff is the largest
// shared-expert or dense FFN length, gated whether any attention layer is
// gated.
func (ws *workspace) ensure(p Params, ff int, gated bool, n int) {
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
	ws.esum = make([]float32, n*p.Embd)
	ws.sel = make([]float32, n*p.Embd)
	if gated {
		ws.qg = make([]float32, 2*n*qd)
		ws.gate = make([]float32, n*qd)
	}
	if ff > 0 {
		ws.ffGate = make([]float32, n*ff)
		ws.ffUp = make([]float32, n*ff)
		ws.ffOut = make([]float32, n*p.Embd)
	}
	if p.RecurrentCount > 0 {
		ch, vd := (2*p.SSMGroups+p.SSMHeads)*p.SSMState, p.SSMInner
		ws.mixed = make([]float32, n*ch)
		ws.cv = make([]float32, n*ch)
		ws.z = make([]float32, n*vd)
		ws.o = make([]float32, n*vd)
		ws.beta = make([]float32, n*p.SSMHeads)
		ws.gdt = make([]float32, n*p.SSMHeads)
	}
}

// Forward runs rows through the model: each row's token is embedded at its
// position, its K and V are appended to its sequence's cache, and for the
// rows with Logits set (in row order) logits receives Vocab float32 logits,
// so len(logits) = (rows with Logits) x Vocab. Rows of different sequences
// share each layer's expert call. On success every sequence's Len advances
// by its number of rows; on error Len is unchanged, and a sequence with
// recurrent layers whose state had already changed is marked lost (its
// next Forward fails with ErrRewind until Truncate(0), or Truncate to a
// length its open checkpoint covers).
//
// Errors wrap ErrBatch, ErrContext, ErrRewind or ErrNonFinite (a NaN or
// ±Inf router logit or final hidden state), or come from the expert
// Computer or ctx.
func (m *Model) Forward(ctx context.Context, rows []Row, logits []float32) (err error) {
	p := m.p
	n := len(rows)
	if n == 0 {
		if len(logits) != 0 {
			return fmt.Errorf("%w: logits buffer for an empty batch", ErrBatch)
		}
		return nil
	}
	nl, err := m.prepare(rows, false)
	if err != nil {
		return err
	}
	if len(logits) != nl*p.Vocab {
		return fmt.Errorf("%w: logits buffer holds %d floats, want %d x %d", ErrBatch, len(logits), nl, p.Vocab)
	}
	ws := &m.ws
	defer ws.dropGroups()
	defer func() {
		if ws.touched && err != nil {
			for i := range rows {
				rows[i].Seq.lost = true
			}
		}
	}()

	if err := m.embed(rows); err != nil {
		return err
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
		if err := m.head(rows, nl, logits); err != nil {
			return err
		}
	}
	for i := range rows {
		s := rows[i].Seq
		s.n = s.pending
		if s.cp != nil {
			s.cp.logged = s.n - s.cp.n
		}
	}
	ws.lastRows = n
	return nil
}

// prepare validates a non-empty batch (checkRows; every row's sequence
// an MTP head's when mtp is set, none otherwise), grows its sequences'
// memory and the workspace for it, and returns the rows asking for
// logits. It clears ws.lastRows (Hidden) and ws.touched.
func (m *Model) prepare(rows []Row, mtp bool) (nl int, err error) {
	p, ws := m.p, &m.ws
	ws.lastRows = 0
	nl, err = m.checkRows(rows)
	if err != nil {
		return 0, err
	}
	for i := range rows {
		if rows[i].Seq.mtp != mtp {
			return 0, fmt.Errorf("%w: row %d: an MTP head's sequence in a model Forward, or the reverse", ErrBatch, i)
		}
	}
	maxPos := 0
	for i := range rows {
		rows[i].Seq.reserve(rows[i].Seq.pending)
		maxPos = max(maxPos, rows[i].Pos)
	}
	ws.ensure(p, m.ffnFF, m.gated, len(rows))
	for len(ws.scores) < m.threads {
		ws.scores = append(ws.scores, nil)
	}
	ws.groups = ws.groups[:0]
	if p.RecurrentCount > 0 {
		ws.groupRows(rows)
	}
	ws.touched = false
	for w := range ws.scores {
		if len(ws.scores[w]) < maxPos+1 {
			ws.scores[w] = make([]float32, max(maxPos+1, 2*len(ws.scores[w])))
		}
	}
	return nl, nil
}

// blockAt returns layer il's block: Blocks[il], or the MTP head's block
// for il == Params.Layers.
func (m *Model) blockAt(il int) *Block {
	if il == len(m.Blocks) && m.MTP != nil {
		return &m.MTP.Block
	}
	return &m.Blocks[il]
}

// embed sets ws.x to the rows' token embeddings (token_embd rows,
// dequantized) and ws.cos, ws.sin to their positions' rotary tables.
func (m *Model) embed(rows []Row) error { return m.embedWith(&m.TokenEmbd, rows) }

// embedWith is embed with the embedding matrix e (Vocab x Embd).
func (m *Model) embedWith(e *Weight, rows []Row) error {
	p, ws := m.p, &m.ws
	d := p.Embd
	erb, err := e.Type.RowBytes(d)
	if err != nil {
		return err
	}
	half := p.RopeDim / 2
	for i := range rows {
		t := int(rows[i].Token)
		if err := quant.Dequantize(e.Type, e.Data[t*erb:(t+1)*erb], ws.x[i*d:(i+1)*d]); err != nil {
			return err
		}
		ropeTable(p, rows[i].Pos, ws.cos[i*half:(i+1)*half], ws.sin[i*half:(i+1)*half])
	}
	return nil
}

// head computes the logits of the nl rows with Logits set: the output norm
// of their hidden states in ws.x, then the output head, into logits (nl x
// Vocab, in row order).
func (m *Model) head(rows []Row, nl int, logits []float32) error {
	p, ws := m.p, &m.ws
	d := p.Embd
	j := 0
	for i := range rows {
		if rows[i].Logits {
			rmsNorm(ws.sel[j*d:(j+1)*d], ws.x[i*d:(i+1)*d], m.OutputNorm, p.NormEps)
			j++
		}
	}
	if k := expert.FirstNonFinite(ws.sel[:nl*d]); k >= 0 { // every logit of the row would be NaN
		return fmt.Errorf("%w: the output norm of logits row %d holds %v (final hidden state; output_norm.weight?)", ErrNonFinite, k/d, ws.sel[k])
	}
	return m.project(ws.sel[:nl*d], nl, &m.Output, logits)
}

// checkRows validates a non-empty batch (each row's sequence is m's and
// usable, its token in the vocabulary, its position the sequence's next one
// and inside the context), leaving each sequence's Len after the batch in
// its pending field, and returns the number of rows asking for logits.
// Errors wrap ErrBatch, ErrRewind or ErrContext.
func (m *Model) checkRows(rows []Row) (nl int, err error) {
	p := m.p
	for i := range rows {
		r := &rows[i]
		if r.Seq == nil || r.Seq.m != m {
			return 0, fmt.Errorf("%w: row %d: sequence of another model", ErrBatch, i)
		}
		if r.Seq.lost {
			return 0, fmt.Errorf("row %d: %w: the sequence's state was lost by a failed Forward; Truncate(0) resets it", i, ErrRewind)
		}
		r.Seq.pending = r.Seq.n
	}
	for i := range rows {
		r := &rows[i]
		switch {
		case r.Token < 0 || int(r.Token) >= p.Vocab:
			return 0, fmt.Errorf("%w: row %d: token %d outside the vocabulary of %d", ErrBatch, i, r.Token, p.Vocab)
		case r.Pos != r.Seq.pending:
			return 0, fmt.Errorf("%w: row %d: position %d, want %d", ErrBatch, i, r.Pos, r.Seq.pending)
		case r.Pos >= p.Context:
			return 0, fmt.Errorf("%w: row %d: position %d >= %d", ErrContext, i, r.Pos, p.Context)
		}
		r.Seq.pending++
		if r.Logits {
			nl++
		}
	}
	return nl, nil
}

// dropGroups forgets the batch's sequences when a Forward returns, so
// that the workspace, kept for the model's life, does not keep a finished
// sequence (and its KV cache) reachable; the groups' row slices are kept
// for reuse.
func (ws *workspace) dropGroups() {
	for i := range ws.groups {
		ws.groups[i].seq = nil
	}
	ws.groups = ws.groups[:0]
}

// groupRows sets ws.groups to the batch's rows by sequence, sequences in
// order of first appearance, rows in batch (= position) order.
func (ws *workspace) groupRows(rows []Row) {
	for i := range rows {
		seq := rows[i].Seq
		g := -1
		for j := range ws.groups {
			if ws.groups[j].seq == seq {
				g = j
				break
			}
		}
		if g < 0 { // a new group, reusing an earlier call's rows slice
			g = len(ws.groups)
			if g < cap(ws.groups) {
				ws.groups = ws.groups[:g+1]
				ws.groups[g].seq, ws.groups[g].rows = seq, ws.groups[g].rows[:0]
			} else {
				ws.groups = append(ws.groups, seqGroup{seq: seq})
			}
		}
		ws.groups[g].rows = append(ws.groups[g].rows, int32(i))
	}
}

// layer runs block il on the rows held in ws.x: the mixer its Memory kind
// names (attention or Gated DeltaNet) on the attn_norm'd rows, its
// residual, then the feed-forward block its FFN kind names (MoE or dense)
// on the FFNNorm'd rows and its residual (src/models/<arch>.cpp).
func (m *Model) layer(ctx context.Context, il int, rows []Row) error {
	p, ws, b := m.p, &m.ws, m.blockAt(il)
	n, d := len(rows), p.Embd
	for i := range n {
		rmsNorm(ws.xn[i*d:(i+1)*d], ws.x[i*d:(i+1)*d], b.AttnNorm, p.NormEps)
	}
	var err error
	switch b.Memory {
	case MemoryKV:
		err = m.attnLayer(il, b.Attn, rows)
	case MemoryRecurrent:
		ws.touched = true // recurrent states change from here on
		err = m.deltaNetLayer(il, b.Linear, rows)
	}
	if err != nil {
		return err
	}
	for i, v := range ws.tmp[:n*d] {
		ws.x[i] += v // ffn_inp = cur + inpSA
	}
	for i := range n {
		rmsNorm(ws.xn[i*d:(i+1)*d], ws.x[i*d:(i+1)*d], b.FFNNorm, p.NormEps)
	}
	if b.FFN == FFNDense {
		return m.dense(b.Dense, n)
	}
	return m.moe(ctx, il, b.MoE, rows)
}

// proj is one matrix product of a parallel region: y [n x w.Rows] = x .
// w^T, x already converted to w's vec_dot_type (conv).
type proj struct {
	w    *Weight
	conv []byte
	y    []float32
}

// Parallel grain of projectAll, in weight bytes times (1 + n/4) (a
// 1-row product streams its weights; more rows add compute per byte): a
// region below minParallelCost (a few microseconds) runs on the caller;
// chunks shrink from a 1/(2*threads) share of what is left down to
// minChunkCost, so that both threads run out of work at about the same
// time (the last chunk is short) while the first ones are long.
const (
	minParallelCost = 96 << 10
	minChunkCost    = 24 << 10
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
	units, unit, err := m.planProjection(x, n, jobs)
	if err != nil || units == 0 {
		return err
	}
	ws := &m.ws
	ws.err = nil
	m.team.run(units, unit)
	return ws.err
}

// planProjection prepares projectAll's region without running it: it
// converts x for the jobs and, when the work is worth sharing, plans the
// chunks (ws.chunks) and returns their number and the function that
// computes chunk u, which reports its error with ws.fail (the caller
// clears ws.err first). Work too small to share it computes at once on the
// caller and returns units = 0. The plan lives in the workspace until the
// next projectAll or planProjection.
func (m *Model) planProjection(x []float32, n int, jobs []proj) (units int, unit func(worker, u int), err error) {
	ws := &m.ws
	ws.convN = 0
	cost, total := 0, 0
	for i := range jobs {
		c, err := m.convert(x, jobs[i].w)
		if err != nil {
			return 0, nil, err
		}
		jobs[i].conv = c
		cost += rowCost(jobs[i].w, n) * jobs[i].w.Rows
		total += jobs[i].w.Rows
	}
	threads := m.threads
	if threads <= 1 || cost < minParallelCost || total < 2 {
		for _, jb := range jobs {
			w := jb.w
			if err := quant.MatMulConverted(w.Type, w.Data, w.Rows, w.Cols, jb.conv, n, jb.y, 1); err != nil {
				return 0, nil, fmt.Errorf("model: %s: %w", w.Name, err)
			}
		}
		return 0, nil, nil
	}
	ws.planChunks(jobs, n, cost, threads)
	tmp := 0
	if n > 1 {
		tmp = n * total
	}
	if len(ws.ptmp) < tmp {
		ws.ptmp = make([]float32, max(tmp, 2*len(ws.ptmp)))
	}
	// The plan's jobs and rows live in the workspace, and the unit
	// function is made once per workspace: a decode step plans ~5
	// projections per layer, and a closure over jobs (and jobs itself)
	// would be a heap allocation each.
	ws.pjobs, ws.pn = append(ws.pjobs[:0], jobs...), n
	if ws.chunkUnit == nil {
		ws.chunkUnit = func(_, u int) { ws.projectChunk(ws.pjobs, ws.pn, u) }
	}
	return len(ws.chunks), ws.chunkUnit, nil
}

// projectChunk computes chunk u of ws.chunks, planned by planProjection
// for jobs over n rows, reporting an error with ws.fail.
func (ws *workspace) projectChunk(jobs []proj, n, u int) {
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
}

// planChunks sets ws.chunks to guided chunks over the jobs' rows taken in
// order as one range, sized by cost (rowCost: weight bytes times (1 +
// n/4); cost is the jobs' total, as planProjection sums it): each chunk a 1/(2*threads) share of the
// cost left, at least minChunkCost, cut where a job ends (the rest of its
// share goes on into the next job as a chunk of its own). Sized in rows
// instead, a region over weights of different types was unbalanced: in
// the router region of a qwen35moe layer (the F32 router, 256 rows of 8
// KiB, then the shared expert's Q4_K gate and up, 1,024 rows of 1,152
// bytes) the first chunk took the whole 2 MiB router on one thread while
// the other ran out of work after 1.2 MB.
func (ws *workspace) planChunks(jobs []proj, n, cost, threads int) {
	ws.chunks = ws.chunks[:0]
	left := cost
	budget := 0 // cost left of the current share
	for j, jb := range jobs {
		rc := rowCost(jb.w, n)
		for lo := 0; lo < jb.w.Rows; {
			if budget <= 0 {
				budget = max(minChunkCost, left/(2*threads))
			}
			rows := min(jb.w.Rows-lo, max(1, (budget+rc-1)/rc))
			ws.chunks = append(ws.chunks, chunk{int32(j), int32(lo), int32(lo + rows)})
			lo += rows
			budget -= rows * rc
			left -= rows * rc
		}
	}
}

// rowCost is one output row's share of a region's cost over n activation
// rows: the weight row's bytes times (1 + n/4) (see minParallelCost).
func rowCost(w *Weight, n int) int {
	rb := w.Bytes() / max(1, w.Rows)
	return max(1, rb+rb/4*n)
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
	if err := m.convertRows(w, x, ws.conv[slot]); err != nil {
		return nil, fmt.Errorf("model: %s: %w", w.Name, err)
	}
	ws.convType[slot] = vt
	ws.convN++
	return ws.conv[slot], nil
}

// minParallelConvert is the batch (rows) from which convertRows splits
// the conversion over the team: a prompt's rows take milliseconds to
// quantize, a decode step's one row microseconds.
const minParallelConvert = 32

// convertRows is quant.ConvertActivation(w.Type, x, dst) for x holding
// rows of w.Cols activations, converted row range by row range on the
// team when there are many (rows convert independently: same bytes).
func (m *Model) convertRows(w *Weight, x []float32, dst []byte) error {
	rows := 0
	if w.Cols > 0 && len(x)%w.Cols == 0 {
		rows = len(x) / w.Cols
	}
	if m.team.helpers == 0 || rows < minParallelConvert || len(dst)%rows != 0 {
		return quant.ConvertActivation(w.Type, x, dst)
	}
	rb, c := len(dst)/rows, w.Cols
	units := min(rows, 4*(m.team.helpers+1))
	ws := &m.ws
	ws.err = nil
	m.team.run(units, func(_, u int) {
		lo, hi := rows*u/units, rows*(u+1)/units
		if err := quant.ConvertActivation(w.Type, x[lo*c:hi*c], dst[lo*rb:hi*rb]); err != nil {
			ws.fail(err)
		}
	})
	return ws.err
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

// softmax sets dst = softmax(src) as ggml_soft_max (max subtracted, float64
// sum of the float32 exponentials, multiplied by float32(1/sum)). dst may
// alias src. The exponentials, float32(math.Exp(float64(src[i] - max))),
// come from expert.ExpShifted (8 at a time on the AVX-512 path, same bits).
func softmax(dst, src []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range src {
		mx = max(mx, v)
	}
	dst = dst[:len(src)]
	expert.ExpShifted(dst, src, mx)
	var sum float64
	for _, e := range dst {
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range src {
		dst[i] *= inv
	}
}

// serial calls fn(0, u) for u in [0, n) in order (team.run's signature).
func serial(n int, fn func(worker, unit int)) {
	for u := range n {
		fn(0, u)
	}
}
