package serve

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// collect reads st to the end and returns its tokens and final Delta.
func collect(tb testing.TB, st *Stream) ([]int32, string, Delta) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var toks []int32
	var text string
	for {
		d, err := st.Next(ctx)
		if err != nil {
			tb.Fatalf("Next: %v", err)
		}
		toks = append(toks, d.Tokens...)
		text += d.Text
		if d.Done {
			return toks, text, d
		}
	}
}

func randomPrompts(n, vocab int, seed uint64) [][]int32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([][]int32, n)
	for i := range out {
		p := make([]int32, 1+rng.IntN(40))
		for j := range p {
			p[j] = int32(rng.IntN(vocab))
		}
		out[i] = p
	}
	return out
}

func newSched(tb testing.TB, mod func(*Config)) (*Server, *prometheus.Registry) {
	tb.Helper()
	m, tok := loadTiny(tb)
	m.SetThreads(1)
	reg := prometheus.NewRegistry()
	cfg := Config{Model: m, Tokenizer: tok, Registry: reg, Logger: quiet}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	return s, reg
}

// TestBatchInvariance: 32 requests submitted before the scheduler starts
// share every step (the batch_sequences histogram records a 32-sequence
// step); each request's greedy tokens equal its decode alone.
func TestBatchInvariance(t *testing.T) {
	const n, maxTok = 32, 12
	s, reg := newSched(t, nil)
	prompts := randomPrompts(n, s.p.Vocab, 1)
	want := make([][]int32, n)
	for i, p := range prompts {
		want[i] = directGreedy(t, p, maxTok)
	}
	streams := make([]*Stream, n)
	for i, p := range prompts {
		st, err := s.Submit(context.Background(), Job{Prompt: p, MaxTokens: maxTok})
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
	}
	s.Start()
	for i, st := range streams {
		got, text, d := collect(t, st)
		if !slices.Equal(got, want[i]) {
			t.Errorf("request %d among %d: tokens %v, alone %v", i, n, got, want[i])
		}
		if d.CompletionTokens != len(want[i]) || d.PromptTokens != len(prompts[i]) {
			t.Errorf("request %d: usage %d+%d, want %d+%d", i, d.PromptTokens, d.CompletionTokens, len(prompts[i]), len(want[i]))
		}
		var pieces []byte
		for _, tk := range want[i] {
			pieces = append(pieces, s.tok.Piece(tk)...)
		}
		if wantText := tokenizer.ToValidUTF8(pieces); text != wantText {
			t.Errorf("request %d: text %q, want %q", i, text, wantText)
		}
		wantFinish := FinishLength
		if s.tok.IsEOG(want[i][len(want[i])-1]) {
			wantFinish = FinishStop
		}
		if d.Finish != wantFinish {
			t.Errorf("request %d: finish %q, want %q", i, d.Finish, wantFinish)
		}
	}
	h := gatherFamily(t, reg, "kvasir_serve_batch_sequences").Metric[0].Histogram
	for _, b := range h.Bucket {
		if b.GetUpperBound() == 16 && b.GetCumulativeCount() == h.GetSampleCount() {
			t.Errorf("no step held more than 16 sequences (%d steps)", h.GetSampleCount())
		}
	}
	wantGen := 0
	for _, w := range want {
		wantGen += len(w)
	}
	if g := gatherValue(t, reg, "kvasir_serve_generated_tokens_total"); g != float64(wantGen) {
		t.Errorf("generated_tokens_total %v, want %d", g, wantGen)
	}
}

// TestJoinMidDecode: requests arrive while others decode, with a batch of
// 24 rows so that prompts are prefilled in chunks beside decode rows; every
// request still decodes exactly as alone.
func TestJoinMidDecode(t *testing.T) {
	const n, maxTok = 32, 10
	s, reg := newSched(t, func(c *Config) { c.MaxBatchRows = 24; c.MaxSeqs = 12 })
	prompts := randomPrompts(n, s.p.Vocab, 2)
	s.Start()
	streams := make([]*Stream, n)
	for i, p := range prompts {
		st, err := s.Submit(context.Background(), Job{Prompt: p, MaxTokens: maxTok})
		if err != nil {
			t.Fatal(err)
		}
		streams[i] = st
		if i%4 == 3 {
			time.Sleep(2 * time.Millisecond)
		}
	}
	for i, st := range streams {
		got, _, _ := collect(t, st)
		if want := directGreedy(t, prompts[i], maxTok); !slices.Equal(got, want) {
			t.Errorf("request %d: tokens %v, alone %v", i, got, want)
		}
	}
	h := gatherFamily(t, reg, "kvasir_serve_batch_rows").Metric[0].Histogram
	if h.GetSampleSum() > 24*float64(h.GetSampleCount()) {
		t.Errorf("a step exceeded 24 rows: %v rows in %d steps", h.GetSampleSum(), h.GetSampleCount())
	}
	wantPrompt := 0
	for _, p := range prompts {
		wantPrompt += len(p)
	}
	if g := gatherValue(t, reg, "kvasir_serve_prompt_tokens_total"); g != float64(wantPrompt) {
		t.Errorf("prompt_tokens_total %v, want %d", g, wantPrompt)
	}
	if st := s.Stats(); st.Active != 0 || st.Queued != 0 {
		t.Errorf("after all finished: %+v", st)
	}
}

// TestSampledDeterministic: with temperature > 0 and a seed, a request's
// tokens are the same alone and in a batch, and equal a Sampler driven over
// direct-decode logits.
func TestSampledDeterministic(t *testing.T) {
	s, _ := newSched(t, nil)
	s.Start()
	opt := model.SamplerOptions{Temperature: 0.9, TopP: 0.95, Seed: 42}
	prompt := randomPrompts(1, s.p.Vocab, 3)[0]
	alone, err := s.Submit(context.Background(), Job{Prompt: prompt, MaxTokens: 8, Sampler: opt})
	if err != nil {
		t.Fatal(err)
	}
	a, _, _ := collect(t, alone)
	var streams []*Stream
	for i, p := range append(randomPrompts(7, s.p.Vocab, 4), prompt) {
		o := opt
		o.Seed = uint64(i) + 100
		if i == 7 {
			o.Seed = 42
		}
		st, err := s.Submit(context.Background(), Job{Prompt: p, MaxTokens: 8, Sampler: o})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, st)
	}
	var b []int32
	for i, st := range streams {
		toks, _, _ := collect(t, st)
		if i == 7 {
			b = toks
		}
	}
	if !slices.Equal(a, b) {
		t.Errorf("seeded sampling alone %v, in a batch %v", a, b)
	}
}

// TestForwardErrorEndsBatch: an expert failure ends the requests of that
// step with FinishError; the server keeps serving.
func TestForwardErrorEndsBatch(t *testing.T) {
	fail := &failingExperts{}
	s, reg := newSched(t, nil)
	fail.inner = s.lanes[0].m.LocalExperts()
	s.lanes[0].m.SetExperts(fail)
	s.Start()
	fail.on.Store(true)
	st, err := s.Submit(context.Background(), Job{Prompt: []int32{1, 2, 3}, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	_, _, d := collect(t, st)
	if d.Finish != FinishError || !errors.Is(d.Err, errInjected) {
		t.Fatalf("finish %q err %v, want error wrapping the expert failure", d.Finish, d.Err)
	}
	fail.on.Store(false)
	st, err = s.Submit(context.Background(), Job{Prompt: []int32{1, 2, 3}, MaxTokens: 4})
	if err != nil {
		t.Fatal(err)
	}
	got, _, d := collect(t, st)
	if want := directGreedy(t, []int32{1, 2, 3}, 4); d.Finish == FinishError || !slices.Equal(got, want) {
		t.Fatalf("after the failure: %v %v, want %v", d.Finish, got, want)
	}
	if v := gatherValue(t, reg, "kvasir_serve_requests_finished_total", "reason", "error"); v != 1 {
		t.Errorf("finished{reason=error} = %v, want 1", v)
	}
}

func TestSubmitValidation(t *testing.T) {
	s, _ := newSched(t, func(c *Config) { c.QueueSize = -1; c.MaxSeqs = 1 })
	ctx := context.Background()
	for _, c := range []struct {
		j    Job
		want error
	}{
		{Job{MaxTokens: 1}, ErrPrompt},
		{Job{Prompt: make([]int32, s.p.Context+1), MaxTokens: 1}, ErrPrompt},
		{Job{Prompt: []int32{int32(s.p.Vocab)}, MaxTokens: 1}, ErrPrompt},
		{Job{Prompt: []int32{-1}, MaxTokens: 1}, ErrPrompt},
		{Job{Prompt: []int32{1}, MaxTokens: 0}, ErrParams},
		{Job{Prompt: []int32{1}, MaxTokens: 1, Sampler: model.SamplerOptions{Temperature: -1}}, ErrParams},
	} {
		if _, err := s.Submit(ctx, c.j); !errors.Is(err, c.want) {
			t.Errorf("Submit(%d tokens, max %d): %v, want %v", len(c.j.Prompt), c.j.MaxTokens, err, c.want)
		}
	}
	// Not started, MaxSeqs 1, no queue: the first request takes the free
	// slot, the second is refused.
	if _, err := s.Submit(ctx, Job{Prompt: []int32{1}, MaxTokens: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(ctx, Job{Prompt: []int32{1}, MaxTokens: 1}); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("second submit: %v, want ErrQueueFull", err)
	}
	s.Close()
	if _, err := s.Submit(ctx, Job{Prompt: []int32{1}, MaxTokens: 1}); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v, want ErrClosed", err)
	}
}

// TestContextLimit: on a model with a 64-position context, a prompt of 62
// tokens fills positions 0..61; two more tokens fit and the third sampled
// needs no position, so generation ends with "length" after 3 tokens.
func TestContextLimit(t *testing.T) {
	small := func() (*model.Model, *tokenizer.Tokenizer) {
		return loadSpec(t, func(sp *modelgen.Spec) { sp.Context = 64 })
	}
	m, tok := small()
	reg := prometheus.NewRegistry()
	s, err := New(Config{Model: m, Tokenizer: tok, Registry: reg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Start()
	prompt := make([]int32, 62)
	for i := range prompt {
		prompt[i] = int32(3 + i%200)
	}
	if _, err := s.Submit(context.Background(), Job{Prompt: make([]int32, 65), MaxTokens: 1}); !errors.Is(err, ErrPrompt) {
		t.Fatalf("65-token prompt on a 64 context: %v, want ErrPrompt", err)
	}
	st, err := s.Submit(context.Background(), Job{Prompt: prompt, MaxTokens: 100})
	if err != nil {
		t.Fatal(err)
	}
	toks, _, d := collect(t, st)
	// Reference: the same decode on another instance, by hand.
	rm, rtok := small()
	seq := rm.NewSequence()
	rows := make([]model.Row, len(prompt))
	for i, tk := range prompt {
		rows[i] = model.Row{Seq: seq, Token: tk, Pos: i, Logits: i == len(prompt)-1}
	}
	logits := make([]float32, rm.Params().Vocab)
	if err := rm.Forward(context.Background(), rows, logits); err != nil {
		t.Fatal(err)
	}
	var want []int32
	for {
		tk := model.Greedy(logits)
		want = append(want, tk)
		if rtok.IsEOG(tk) || seq.Len() == 64 {
			break
		}
		if err := rm.Forward(context.Background(), []model.Row{{Seq: seq, Token: tk, Pos: seq.Len(), Logits: true}}, logits); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(toks, want) {
		t.Fatalf("tokens %v, want %v", toks, want)
	}
	if !rtok.IsEOG(want[len(want)-1]) && (len(toks) != 3 || d.Finish != FinishLength) {
		t.Fatalf("%d tokens, finish %q; want 3 and length", len(toks), d.Finish)
	}
}

// TestLanes: with three lanes (three instances of the model) sharing one
// expert computer, 32 requests are spread over the lanes, decode at the
// same time, and each gives exactly the tokens of its decode alone.
func TestLanes(t *testing.T) {
	const n, maxTok = 32, 10
	m, tok := loadTiny(t)
	l1, _ := loadTiny(t)
	l2, _ := loadTiny(t)
	slow := &slowExperts{inner: m.LocalExperts(), delay: time.Millisecond}
	s, err := New(Config{Model: m, Lanes: []*model.Model{l1, l2}, Experts: slow, Tokenizer: tok,
		Registry: prometheus.NewRegistry(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	prompts := randomPrompts(n, s.p.Vocab, 5)
	streams := make([]*Stream, n)
	for i, p := range prompts {
		if streams[i], err = s.Submit(context.Background(), Job{Prompt: p, MaxTokens: maxTok}); err != nil {
			t.Fatal(err)
		}
	}
	busy := make([]bool, len(s.lanes))
	stop := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			s.mu.Lock()
			for i, l := range s.lanes {
				busy[i] = busy[i] || l.active > 0
			}
			s.mu.Unlock()
		}
	}()
	s.Start()
	for i, st := range streams {
		got, _, _ := collect(t, st)
		if want := directGreedy(t, prompts[i], maxTok); !slices.Equal(got, want) {
			t.Errorf("request %d: tokens %v, alone %v", i, got, want)
		}
	}
	close(stop)
	<-polled
	for i, b := range busy {
		if !b {
			t.Errorf("lane %d never decoded", i)
		}
	}
	if st := s.Stats(); st.Active != 0 || st.Queued != 0 {
		t.Errorf("after all finished: %+v", st)
	}
	if _, err := New(Config{Model: m, Lanes: []*model.Model{m}, Tokenizer: tok, Registry: prometheus.NewRegistry()}); err == nil {
		t.Error("the primary model as its own lane was accepted")
	}
}

// TestLanesLogits: the two-batch overlap changes no bit. The same 24
// requests (greedy, each token's log-probability and its 5 best
// alternatives asked) are served once by one lane, all sequences in one
// batch per step, and once by two lanes over an expert computer that
// takes a millisecond (so the lanes overlap); every token and every
// float64 log-probability, which is a function of the whole logits row,
// must be equal, not merely close.
func TestLanesLogits(t *testing.T) {
	const n, maxTok = 24, 8
	run := func(lanes int) [][]TokenLogprob {
		m, tok := loadTiny(t)
		cfg := Config{Model: m, Tokenizer: tok, Registry: prometheus.NewRegistry(), Logger: quiet}
		if lanes > 1 {
			cfg.Experts = &slowExperts{inner: m.LocalExperts(), delay: time.Millisecond}
			for range lanes - 1 {
				l, _ := loadTiny(t)
				cfg.Lanes = append(cfg.Lanes, l)
			}
		}
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		prompts := randomPrompts(n, s.p.Vocab, 11)
		streams := make([]*Stream, n)
		for i, p := range prompts {
			if streams[i], err = s.Submit(context.Background(), Job{Prompt: p, MaxTokens: maxTok, Logprobs: true, TopLogprobs: 5}); err != nil {
				t.Fatal(err)
			}
		}
		s.Start()
		out := make([][]TokenLogprob, n)
		for i, st := range streams {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			for {
				d, err := st.Next(ctx)
				if err != nil {
					t.Fatalf("lanes %d request %d: %v", lanes, i, err)
				}
				out[i] = append(out[i], d.Logprobs...)
				if d.Done {
					break
				}
			}
			cancel()
		}
		return out
	}
	one, two := run(1), run(2)
	for i := range one {
		if len(one[i]) == 0 || !slices.EqualFunc(one[i], two[i], func(a, b TokenLogprob) bool {
			return a.Token == b.Token && a.Logprob == b.Logprob && slices.Equal(a.Top, b.Top)
		}) {
			t.Errorf("request %d: one lane %v, two lanes %v", i, one[i], two[i])
		}
	}
}

// TestQueuedClientLeaves: a queued request whose context ends (its client
// left) gives its place in the queue back at once, and one cancelled with
// Stream.Cancel at the next Submit; both end as cancelled. Before, they
// held their places until a slot took them, and while long requests ran
// every new one was refused with ErrQueueFull (429).
func TestQueuedClientLeaves(t *testing.T) {
	s, reg := newSched(t, func(c *Config) { c.QueueSize = 1; c.MaxSeqs = 1 }) // not started: nothing is admitted
	job := Job{Prompt: []int32{1, 2}, MaxTokens: 2}
	a, err := s.Submit(context.Background(), job)
	if err != nil {
		t.Fatal(err)
	}
	ctx, leave := context.WithCancel(context.Background())
	b, err := s.Submit(ctx, job)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Submit(context.Background(), job); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("third submit: %v, want ErrQueueFull", err)
	}
	leave()
	for i := 0; s.Stats().Queued != 1; i++ {
		if i > 5000 {
			t.Fatalf("queued %d after the client left, want 1", s.Stats().Queued)
		}
		time.Sleep(time.Millisecond)
	}
	if v := gatherValue(t, reg, "kvasir_serve_queue_depth"); v != 1 {
		t.Errorf("queue depth %v, want 1", v)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if d, err := b.Next(dctx); err != nil || !d.Done || d.Finish != FinishCancelled {
		t.Fatalf("the request that left: %+v %v, want done, cancelled", d, err)
	}
	c, err := s.Submit(context.Background(), job)
	if err != nil {
		t.Fatalf("submit after the client left: %v", err)
	}
	a.Cancel()
	d, err := s.Submit(context.Background(), job)
	if err != nil {
		t.Fatalf("submit after a queued request was cancelled: %v", err)
	}
	if got, err := a.Next(dctx); err != nil || !got.Done || got.Finish != FinishCancelled {
		t.Fatalf("the cancelled request: %+v %v", got, err)
	}
	if v := gatherValue(t, reg, "kvasir_serve_requests_finished_total", "reason", FinishCancelled); v != 2 {
		t.Errorf("finished{reason=cancelled} = %v, want 2", v)
	}
	s.Start()
	want := directGreedy(t, job.Prompt, job.MaxTokens)
	for _, st := range []*Stream{c, d} {
		if got, _, dl := collect(t, st); dl.Finish == FinishError || !slices.Equal(got, want) {
			t.Fatalf("a request queued after them: %v %v, want %v", dl.Finish, got, want)
		}
	}
}

// TestQueuedClientLeavesDefaults is TestQueuedClientLeaves on the queue
// and slots users run (Config's defaults): with the queue full, one
// waiting client leaving lets the next request in.
func TestQueuedClientLeavesDefaults(t *testing.T) {
	s, _ := newSched(t, nil) // not started: nothing is admitted
	job := Job{Prompt: []int32{1, 2}, MaxTokens: 2}
	ctx, leave := context.WithCancel(context.Background())
	if _, err := s.Submit(ctx, job); err != nil {
		t.Fatal(err)
	}
	n := 1
	for ; ; n++ {
		if n > 1<<20 {
			t.Fatal("the queue never filled")
		}
		if _, err := s.Submit(context.Background(), job); errors.Is(err, ErrQueueFull) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
	}
	leave()
	for i := 0; s.Stats().Queued != n-1; i++ {
		if i > 5000 {
			t.Fatalf("queued %d after one of %d left", s.Stats().Queued, n)
		}
		time.Sleep(time.Millisecond)
	}
	if _, err := s.Submit(context.Background(), job); err != nil {
		t.Fatalf("submit after a client left a full queue of %d: %v", n, err)
	}
}
