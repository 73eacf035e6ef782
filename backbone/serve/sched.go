package serve

import (
	"context"
	"fmt"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/spec"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// seqState is the scheduler's view of one admitted request.
type seqState struct {
	st       *Stream
	seq      *model.Sequence
	fed      int   // prompt tokens already in the KV cache
	chunk    int   // prompt tokens fed in the current step
	decoding bool  // the prompt is in; next is the token to feed
	next     int32 // the last sampled token, fed in the next step
	sampler  *model.Sampler
	dec      *tokenizer.Decoder
	stop     stopMatcher
	gen      int       // tokens sampled
	inStep   bool      // has rows in the current step
	raw      []float32 // the logits row before logit_bias, when logprobs are asked

	// Speculative drafts (Job.Draft): hist is the prompt and the sampled
	// tokens; drafts this step's drafts after next (rows 1..len(drafts)
	// of its rows), base the sequence's Len before the step, row the index
	// of the row deliver samples next, kept the drafts accepted.
	hist      []int32
	drafts    []int32
	base, row int
	kept      int
	// mtp drafts with the model's multi-token-prediction head (Job.Draft
	// spec.ModeMTP; nil otherwise, or after a draft failed): it is shown
	// every row of the sequence the model ran (observe) and truncated with
	// the sequence after a verification. first is the index in
	// scheduler.rows of the sequence's first row in the current step.
	mtp   *model.MTPDrafter
	first int
}

// poolMaxPositions: sequences that used at most this many positions are
// cleared and reused by later requests (their KV cache stays allocated).
const poolMaxPositions = 256

// baton serializes the lanes' computation: a one-token semaphore.
type baton struct{ ch chan struct{} }

func (b *baton) acquire(ctx context.Context) error {
	select {
	case b.ch <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (b *baton) release() { <-b.ch }

// batonExperts hands the baton to another lane for the duration of an
// expert call (a swarm round trip) and takes it back before the layer goes
// on. It is called only from its lane's goroutine, inside Forward.
type batonExperts struct {
	inner expert.Computer
	l     *lane
}

func (e *batonExperts) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	if e.l.holdsCPU {
		e.l.baton.release()
		e.l.holdsCPU = false
	}
	err := e.inner.ComputeExperts(ctx, layer, hidden, ids, n, k, out)
	if aerr := e.l.baton.acquire(ctx); aerr != nil {
		return aerr
	}
	e.l.holdsCPU = true
	return err
}

// newBatonExperts wraps inner for lane l: a *batonSumExperts when inner
// implements expert.SumComputer (so the model keeps asking it for row
// sums), else a *batonExperts.
func newBatonExperts(inner expert.Computer, l *lane) expert.Computer {
	e := &batonExperts{inner: inner, l: l}
	if sc, ok := inner.(expert.SumComputer); ok {
		return &batonSumExperts{batonExperts: e, sum: sc}
	}
	return e
}

// batonSumExperts is batonExperts over a Computer that also sums rows
// (expert.SumComputer): its sums travel with the baton handed on, too.
type batonSumExperts struct {
	*batonExperts
	sum expert.SumComputer
}

// ComputeExpertsSum implements expert.SumComputer for the inner Computer,
// handing the baton to another lane meanwhile as ComputeExperts does.
func (e *batonSumExperts) ComputeExpertsSum(ctx context.Context, layer int, hidden []float32, ids []int32, weights []float32, n, k int, out []float32) error {
	if e.l.holdsCPU {
		e.l.baton.release()
		e.l.holdsCPU = false
	}
	err := e.sum.ComputeExpertsSum(ctx, layer, hidden, ids, weights, n, k, out)
	if aerr := e.l.baton.acquire(ctx); aerr != nil {
		return aerr
	}
	e.l.holdsCPU = true
	return err
}

// Delegate implements expert.Delegator for the inner Computer when it does:
// a layer the lane computes with its own experts keeps the baton, as a
// local step would.
func (e *batonExperts) Delegate(layer int, ids []int32, own expert.Computer) bool {
	dg, ok := e.inner.(expert.Delegator)
	return ok && dg.Delegate(layer, ids, own)
}

// DelegatesLayer implements expert.LayerDelegator for the inner Computer
// when it does.
func (e *batonExperts) DelegatesLayer(layer int, own expert.Computer) bool {
	ld, ok := e.inner.(expert.LayerDelegator)
	return ok && ld.DelegatesLayer(layer, own)
}

// scheduler is one lane's continuous batching and its state; its
// goroutine (loop) is the only one that touches the lane's model. A step
// is a phase per method: admit, dropCancelled, build, forward, then
// deliver (or fail).
type scheduler struct {
	s   *Server
	l   *lane
	ctx context.Context // ends when the server stops

	active  []*seqState
	free    []*model.Sequence // cleared sequences kept for reuse (their caches stay allocated)
	rows    []model.Row
	owners  []*seqState // the sequence of each logits row, in row order
	logits  []float32
	seqs    int       // sequences with rows in the current step
	prefill int       // prompt rows in the current step
	hidden  []float32 // the step's output-normed hidden states, for MTP drafters (rows x Embd)
	toks    []int32   // scratch: one sequence's tokens of the step
}

// loop is one lane's scheduler: the only goroutine that touches its model.
func (s *Server) loop(l *lane) {
	defer s.running.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	(&scheduler{s: s, l: l, ctx: ctx}).run()
}

// run steps until the server stops; then it ends the active requests with
// ErrClosed.
func (sc *scheduler) run() {
	s := sc.s
	for {
		sc.admit()
		sc.dropCancelled()
		if len(sc.active) == 0 {
			select {
			case <-s.stop:
				return
			case <-sc.l.wake:
				continue
			}
		}
		select {
		case <-s.stop:
			for _, a := range sc.active {
				sc.end(a, "", FinishError, ErrClosed)
			}
			sc.compact()
			return
		default:
		}
		sc.build()
		start := time.Now()
		if err := sc.forward(); err != nil {
			sc.fail(err)
		} else {
			sc.observe()
			sc.deliver(start)
		}
		sc.forget()
	}
}

// forget drops the step's references to its sequences and requests
// (rows and owners keep their capacity for the next step): a sequence
// released during the step, a long one whose KV cache is left to the
// garbage collector (release), must not stay reachable from the reused
// slices while the server idles or runs smaller steps.
func (sc *scheduler) forget() {
	clear(sc.rows)
	clear(sc.owners)
	sc.rows, sc.owners = sc.rows[:0], sc.owners[:0]
}

// release gives up a's sequence. Short sequences are kept for reuse; a
// long one's cache (it grows by doubling) is left to the garbage collector
// so a burst of long requests does not pin its memory.
func (sc *scheduler) release(a *seqState) {
	if a.seq.Len() <= poolMaxPositions && len(sc.free) < sc.s.cfg.MaxSeqs && a.seq.Truncate(0) == nil {
		sc.free = append(sc.free, a.seq)
	}
	a.seq = nil
}

// compact drops the released states and publishes the active count.
func (sc *scheduler) compact() {
	s, l := sc.s, sc.l
	kept := sc.active[:0]
	for _, a := range sc.active {
		if a.seq != nil {
			kept = append(kept, a)
		}
	}
	clear(sc.active[len(kept):])
	sc.active = kept
	s.mu.Lock()
	s.active += len(sc.active) - l.active
	l.active = len(sc.active)
	s.met.active.Set(float64(s.active))
	s.mu.Unlock()
}

// end finishes a's request and releases its sequence.
func (sc *scheduler) end(a *seqState, text, reason string, err error) {
	a.st.finishText(text, reason, err)
	sc.s.met.finished.WithLabelValues(reason).Inc()
	sc.release(a)
}

// admit moves queued requests into free slots, at most this lane's even
// share of all the work.
func (sc *scheduler) admit() {
	s, l := sc.s, sc.l
	s.mu.Lock()
	gone := s.pruneQueueLocked()
	share := (len(s.queue) + s.active + len(s.lanes) - 1) / len(s.lanes)
	n := max(0, min(len(s.queue), l.maxSeqs-len(sc.active), share-len(sc.active)))
	admitted := s.queue[:n]
	s.queue = append([]*Stream(nil), s.queue[n:]...)
	s.active += n
	l.active = len(sc.active) + n
	s.met.queueDepth.Set(float64(len(s.queue)))
	s.mu.Unlock()
	finishGone(s, gone)
	for _, st := range admitted {
		st.stopUnqueue()
		var seq *model.Sequence
		if k := len(sc.free); k > 0 {
			// The slot is cleared: a sequence taken from the pool that then
			// grows past poolMaxPositions is not pooled again, and the
			// pool's backing array must not keep its cache reachable.
			seq = sc.free[k-1]
			sc.free[k-1] = nil
			sc.free = sc.free[:k-1]
		} else {
			seq = l.m.NewSequence()
		}
		var stops []string
		for _, x := range st.job.Stop {
			if x != "" {
				stops = append(stops, x)
			}
		}
		a := &seqState{st: st, seq: seq, sampler: model.NewSampler(st.job.Sampler),
			dec: s.tok.NewDecoder(false), stop: stopMatcher{stops: stops}}
		switch st.job.Draft {
		case spec.ModeNGram:
			a.hist = append(make([]int32, 0, len(st.job.Prompt)+64), st.job.Prompt...)
		case spec.ModeMTP:
			if d, err := l.m.NewMTPDrafter(); err == nil { // checked by Submit
				a.mtp = d
			}
		}
		sc.active = append(sc.active, a)
	}
}

// dropCancelled ends the cancelled requests.
func (sc *scheduler) dropCancelled() {
	for _, a := range sc.active {
		if err := a.st.isCancelled(); err != nil {
			sc.end(a, "", FinishCancelled, err)
		}
	}
	sc.compact()
}

// build lays out the step: one decode row per generating sequence, then
// prompt chunks in admission order. MaxSeqs <= MaxBatchRows, so a
// prefilling sequence always gets at least one row.
func (sc *scheduler) build() {
	sc.rows, sc.owners = sc.rows[:0], sc.owners[:0]
	budget := sc.s.cfg.MaxBatchRows
	sc.seqs = 0
	for i, a := range sc.active {
		a.inStep, a.chunk = false, 0
		a.drafts, a.row, a.kept = a.drafts[:0], 0, 0
		if a.decoding && budget > 0 {
			a.base, a.first = a.seq.Len(), len(sc.rows)
			sc.rows = append(sc.rows, model.Row{Seq: a.seq, Token: a.next, Pos: a.base, Logits: true})
			sc.owners = append(sc.owners, a)
			a.inStep = true
			budget--
			sc.seqs++
			sc.draft(a, budget-(len(sc.active)-1-i))
			for k, d := range a.drafts {
				sc.rows = append(sc.rows, model.Row{Seq: a.seq, Token: d, Pos: a.base + 1 + k, Logits: true})
				sc.owners = append(sc.owners, a)
			}
			budget -= len(a.drafts)
		}
	}
	sc.prefill = 0
	for _, a := range sc.active {
		if a.decoding || budget == 0 {
			continue
		}
		p := a.st.job.Prompt
		c := min(budget, len(p)-a.fed)
		a.first = len(sc.rows)
		for i := range c {
			pos := a.fed + i
			last := pos == len(p)-1
			sc.rows = append(sc.rows, model.Row{Seq: a.seq, Token: p[pos], Pos: pos, Logits: last})
			if last {
				sc.owners = append(sc.owners, a)
			}
		}
		a.chunk, a.inStep = c, true
		budget -= c
		sc.prefill += c
		sc.seqs++
	}
	if need := len(sc.owners) * sc.s.p.Vocab; cap(sc.logits) < need {
		sc.logits = make([]float32, need)
	}
}

// draft sets a.drafts to at most spare drafts after a.next (n-gram
// prompt lookup over a.hist, or the model's MTP head, within DraftMax,
// MaxTokens and the context) and checkpoints a's sequence before they are
// verified.
func (sc *scheduler) draft(a *seqState, spare int) {
	j := &a.st.job
	if j.Draft != spec.ModeNGram && a.mtp == nil {
		return
	}
	k := j.DraftMax
	if k <= 0 {
		k = spec.DefaultMax
	}
	k = min(k, spare, j.MaxTokens-a.gen, sc.s.p.Context-1-a.base)
	if k <= 0 {
		return
	}
	if a.mtp != nil {
		sc.mtpDraft(a, k)
	} else {
		a.drafts = spec.NGram(a.drafts, a.hist, k)
	}
	if len(a.drafts) > 0 && a.seq.Checkpoint() != nil {
		a.drafts = a.drafts[:0]
	}
}

// mtpDraft sets a.drafts to k drafts of a's MTP head, holding the lanes'
// baton (with lanes) while the head computes, as forward does. A failed
// draft (an expert call that failed, the server stopping) leaves the step
// without drafts and the request without its drafter: drafts never
// change the output, so the request goes on undrafted.
func (sc *scheduler) mtpDraft(a *seqState, k int) {
	l := sc.l
	if l.baton != nil && !l.holdsCPU {
		if l.baton.acquire(sc.ctx) != nil {
			return
		}
		l.holdsCPU = true
	}
	d, err := a.mtp.Draft(sc.ctx, a.drafts, a.next, k)
	if l.holdsCPU {
		l.baton.release()
		l.holdsCPU = false
	}
	if err != nil {
		if sc.ctx.Err() == nil {
			sc.s.log.Warn("serve: MTP draft failed; the request goes on without drafts", "err", err)
		}
		a.drafts, a.mtp = a.drafts[:0], nil
		return
	}
	a.drafts = d
}

// observe shows each MTP drafter of the step its sequence's rows: their
// tokens and output-normed hidden states (model.Model.Hidden), read once
// for the whole step before anything else runs on the model. A drafter
// that cannot take them is dropped (the request goes on undrafted).
func (sc *scheduler) observe() {
	e := sc.s.p.Embd
	var need bool
	for _, a := range sc.active {
		need = need || a.inStep && a.mtp != nil
	}
	if !need {
		return
	}
	if n := len(sc.rows) * e; cap(sc.hidden) < n {
		sc.hidden = make([]float32, n)
	}
	hidden := sc.hidden[:len(sc.rows)*e]
	if err := sc.l.m.Hidden(hidden); err != nil {
		sc.s.log.Warn("serve: hidden states for MTP drafts", "err", err)
		for _, a := range sc.active {
			a.mtp = nil
		}
		return
	}
	for _, a := range sc.active {
		if !a.inStep || a.mtp == nil {
			continue
		}
		n, pos := a.chunk, a.fed
		if a.decoding {
			n, pos = 1+len(a.drafts), a.base
		}
		sc.toks = sc.toks[:0]
		for _, r := range sc.rows[a.first : a.first+n] {
			sc.toks = append(sc.toks, r.Token)
		}
		if err := a.mtp.Observe(pos, sc.toks, hidden[a.first*e:(a.first+n)*e]); err != nil {
			sc.s.log.Warn("serve: MTP drafter", "err", err)
			a.mtp = nil
		}
	}
}

// forward runs the step through the model, holding the lanes' baton
// (with lanes) except while an expert call is out.
func (sc *scheduler) forward() error {
	l := sc.l
	if l.baton != nil {
		if l.baton.acquire(sc.ctx) == nil {
			l.holdsCPU = true
		}
	}
	err := l.m.Forward(sc.ctx, sc.rows, sc.logits[:len(sc.owners)*sc.s.p.Vocab])
	if l.holdsCPU {
		l.baton.release()
		l.holdsCPU = false
	}
	return err
}

// fail ends the requests of a step whose forward failed with err
// (ErrClosed when the server is stopping).
func (sc *scheduler) fail(err error) {
	if sc.ctx.Err() != nil {
		err = ErrClosed
	} else {
		sc.s.log.Error("serve: forward step failed", "rows", len(sc.rows), "err", err)
		err = fmt.Errorf("forward: %w", err)
	}
	for _, a := range sc.active {
		if a.inStep {
			sc.end(a, "", FinishError, err)
		}
	}
	sc.compact()
}

// deliver advances the prompts fed, counts the step (begun at start) and
// samples and delivers each logits row's token.
func (sc *scheduler) deliver(start time.Time) {
	s := sc.s
	for _, a := range sc.active {
		a.fed += a.chunk
		if a.fed == len(a.st.job.Prompt) {
			a.decoding = true
		}
		if a.inStep {
			// Verified by this step's forward (a failed one verifies
			// nothing).
			s.met.draftTokens.Add(float64(len(a.drafts)))
		}
	}
	// Counted before the tokens are delivered, so a client that has
	// read its last token sees it in the metrics.
	s.met.steps.Inc()
	s.met.stepSeconds.Observe(time.Since(start).Seconds())
	s.met.batchRows.Observe(float64(len(sc.rows)))
	s.met.batchSeqs.Observe(float64(sc.seqs))
	s.met.promptTokens.Add(float64(sc.prefill))
	vocab := s.p.Vocab
	for i, a := range sc.owners {
		// A request's rows after a rejected draft, or after it ended, are
		// dropped unsampled.
		if a.seq == nil || a.row < 0 {
			continue
		}
		// Each token is counted before sample delivers it, as the step
		// is above.
		s.met.generatedTokens.Inc()
		if !a.decoding || a.row == 0 && len(a.drafts) == 0 {
			sc.sample(a, sc.logits[i*vocab:(i+1)*vocab], a.seq.Len(), -1)
			continue
		}
		k := a.row
		drafted := k < len(a.drafts)
		var want int32
		if drafted {
			want = a.drafts[k]
		}
		if !drafted {
			want = -1
		}
		// sample counts an accepted draft before it delivers the token,
		// also when this token ends the request.
		t := sc.sample(a, sc.logits[i*vocab:(i+1)*vocab], a.base+1+k, want)
		accepted := drafted && t == want
		if a.seq == nil {
			continue // ended: its sequence is released
		}
		if accepted {
			a.kept++
			a.row++
		} else {
			a.row = -1
		}
		if a.row < 0 {
			if err := a.seq.Truncate(a.base + 1 + a.kept); err != nil {
				sc.end(a, "", FinishError, fmt.Errorf("rewind after drafts: %w", err))
			} else if a.mtp != nil && a.mtp.Truncate(a.base+1+a.kept) != nil {
				a.mtp = nil // the drafter goes; the request goes on
			}
			a.row = -1
		}
	}
	sc.compact()
}

// sample draws a's next token from its logits row, whose token goes at
// position pos, and delivers its text, ending the request on an
// end-of-generation token, a stop string, its MaxTokens or a full context;
// it returns the token. A token equal to draft (a draft token, -1: none)
// is counted as an accepted draft before it is delivered.
func (sc *scheduler) sample(a *seqState, logits []float32, pos int, draft int32) int32 {
	s := sc.s
	j := &a.st.job
	raw := logits // the model's row, for the log-probabilities
	if j.Logprobs {
		a.raw = append(a.raw[:0], logits...)
		raw = a.raw
	}
	applyBias(logits, j.LogitBias)
	t := a.sampler.Sample(logits)
	if draft >= 0 && t == draft {
		// Counted before the token is delivered, as the step's metrics
		// are: a client that has read its last token sees it counted.
		s.met.draftAccepted.Inc()
	}
	var lp *TokenLogprob
	if j.Logprobs && !s.tok.IsEOG(t) {
		v := logprobsOf(raw, t, j.TopLogprobs)
		lp = &v
	}
	a.gen++
	var out string
	reason := ""
	if s.tok.IsEOG(t) {
		reason = FinishStop
		o, stopped := a.stop.feed(a.dec.Flush())
		out = o
		if !stopped {
			out += a.stop.flush()
		}
	} else {
		o, stopped := a.stop.feed(a.dec.Add(t))
		out = o
		switch {
		case stopped:
			reason = FinishStop
		case a.gen >= a.st.job.MaxTokens || pos >= s.p.Context:
			reason = FinishLength
			o, stopped := a.stop.feed(a.dec.Flush())
			out += o
			if stopped {
				reason = FinishStop
			} else {
				out += a.stop.flush()
			}
		}
	}
	a.st.emit(out, t, lp)
	if reason != "" {
		sc.end(a, "", reason, nil)
		return t
	}
	a.next = t
	if j.Draft == spec.ModeNGram {
		a.hist = append(a.hist, t)
	}
	return t
}
