package serve

import (
	"context"
	"fmt"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/model"
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

	var (
		active []*seqState
		free   []*model.Sequence // cleared sequences kept for reuse (their caches stay allocated)
		rows   []model.Row
		owners []*seqState // the sequence of each logits row, in row order
		logits []float32
	)
	vocab := s.p.Vocab
	release := func(a *seqState) {
		// Keep short sequences for reuse; a long one's cache (it grows by
		// doubling) is left to the garbage collector so a burst of long
		// requests does not pin its memory.
		if a.seq.Len() <= poolMaxPositions && len(free) < s.cfg.MaxSeqs && a.seq.Truncate(0) == nil {
			free = append(free, a.seq)
		}
		a.seq = nil
	}
	// compact drops the released states and publishes the active count.
	compact := func() {
		kept := active[:0]
		for _, a := range active {
			if a.seq != nil {
				kept = append(kept, a)
			}
		}
		clear(active[len(kept):])
		active = kept
		s.mu.Lock()
		s.active += len(active) - l.active
		l.active = len(active)
		s.met.active.Set(float64(s.active))
		s.mu.Unlock()
	}
	end := func(a *seqState, text, reason string, err error) {
		a.st.finishText(text, reason, err)
		s.met.finished.WithLabelValues(reason).Inc()
		release(a)
	}

	for {
		// Admit queued requests into free slots, at most this lane's even
		// share of all the work.
		s.mu.Lock()
		share := (len(s.queue) + s.active + len(s.lanes) - 1) / len(s.lanes)
		n := max(0, min(len(s.queue), l.maxSeqs-len(active), share-len(active)))
		admitted := s.queue[:n]
		s.queue = append([]*Stream(nil), s.queue[n:]...)
		s.active += n
		l.active = len(active) + n
		s.met.queueDepth.Set(float64(len(s.queue)))
		s.mu.Unlock()
		for _, st := range admitted {
			var seq *model.Sequence
			if k := len(free); k > 0 {
				seq, free = free[k-1], free[:k-1]
			} else {
				seq = l.m.NewSequence()
			}
			var stops []string
			for _, x := range st.job.Stop {
				if x != "" {
					stops = append(stops, x)
				}
			}
			active = append(active, &seqState{st: st, seq: seq, sampler: model.NewSampler(st.job.Sampler),
				dec: s.tok.NewDecoder(false), stop: stopMatcher{stops: stops}})
		}

		// Drop the cancelled.
		for _, a := range active {
			if err := a.st.isCancelled(); err != nil {
				end(a, "", FinishCancelled, err)
			}
		}
		compact()

		if len(active) == 0 {
			select {
			case <-s.stop:
				return
			case <-l.wake:
				continue
			}
		}
		select {
		case <-s.stop:
			for _, a := range active {
				end(a, "", FinishError, ErrClosed)
			}
			compact()
			return
		default:
		}

		// Build the step: one decode row per generating sequence, then
		// prompt chunks in admission order. MaxSeqs <= MaxBatchRows, so a
		// prefilling sequence always gets at least one row.
		rows, owners = rows[:0], owners[:0]
		budget := s.cfg.MaxBatchRows
		seqs := 0
		for _, a := range active {
			a.inStep, a.chunk = false, 0
			if a.decoding && budget > 0 {
				rows = append(rows, model.Row{Seq: a.seq, Token: a.next, Pos: a.seq.Len(), Logits: true})
				owners = append(owners, a)
				a.inStep = true
				budget--
				seqs++
			}
		}
		prefill := 0
		for _, a := range active {
			if a.decoding || budget == 0 {
				continue
			}
			p := a.st.job.Prompt
			c := min(budget, len(p)-a.fed)
			for i := range c {
				pos := a.fed + i
				last := pos == len(p)-1
				rows = append(rows, model.Row{Seq: a.seq, Token: p[pos], Pos: pos, Logits: last})
				if last {
					owners = append(owners, a)
				}
			}
			a.chunk, a.inStep = c, true
			budget -= c
			prefill += c
			seqs++
		}
		if need := len(owners) * vocab; cap(logits) < need {
			logits = make([]float32, need)
		}
		start := time.Now()
		if l.baton != nil {
			if l.baton.acquire(ctx) == nil {
				l.holdsCPU = true
			}
		}
		err := l.m.Forward(ctx, rows, logits[:len(owners)*vocab])
		if l.holdsCPU {
			l.baton.release()
			l.holdsCPU = false
		}
		if err != nil {
			if ctx.Err() != nil {
				err = ErrClosed
			} else {
				s.log.Error("serve: forward step failed", "rows", len(rows), "err", err)
				err = fmt.Errorf("forward: %w", err)
			}
			for _, a := range active {
				if a.inStep {
					end(a, "", FinishError, err)
				}
			}
			compact()
			continue
		}
		for _, a := range active {
			a.fed += a.chunk
			if a.fed == len(a.st.job.Prompt) {
				a.decoding = true
			}
		}
		// Counted before the tokens are delivered, so a client that has
		// read its last token sees it in the metrics.
		s.met.steps.Inc()
		s.met.stepSeconds.Observe(time.Since(start).Seconds())
		s.met.batchRows.Observe(float64(len(rows)))
		s.met.batchSeqs.Observe(float64(seqs))
		s.met.promptTokens.Add(float64(prefill))
		s.met.generatedTokens.Add(float64(len(owners)))
		for i, a := range owners {
			s.sample(a, logits[i*vocab:(i+1)*vocab], end)
		}
		compact()
	}
}

// sample draws a's next token from its logits row and delivers its text,
// ending the request on an end-of-generation token, a stop string, its
// MaxTokens or a full context.
func (s *Server) sample(a *seqState, logits []float32, end func(*seqState, string, string, error)) {
	j := &a.st.job
	raw := logits // the model's row, for the log-probabilities
	if j.Logprobs {
		a.raw = append(a.raw[:0], logits...)
		raw = a.raw
	}
	applyBias(logits, j.LogitBias)
	t := a.sampler.Sample(logits)
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
		case a.gen >= a.st.job.MaxTokens || a.seq.Len() >= s.p.Context:
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
		end(a, "", reason, nil)
		return
	}
	a.next = t
}
