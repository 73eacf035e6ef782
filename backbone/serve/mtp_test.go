package serve

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/spec"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// loadMTPModel loads the tiny qwen35moe preset with a multi-token-
// prediction block (modelgen Spec.NextN 1), as a fresh instance.
func loadMTPModel(tb testing.TB) (*model.Model, *tokenizer.Tokenizer) {
	tb.Helper()
	m, tok := loadSpec(tb, func(s *modelgen.Spec) {
		p, err := modelgen.Preset("tiny-qwen35moe")
		if err != nil {
			tb.Fatal(err)
		}
		*s = p
		s.NextN = 1
	})
	if err := m.MTPErr(); err != nil {
		tb.Fatal(err)
	}
	return m, tok
}

// serveAll submits jobs to a server over cfg, starts it and returns each
// request's tokens, with the draft tokens the server verified.
func serveAll(t *testing.T, cfg Config, jobs []Job) ([][]int32, float64) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	streams := make([]*Stream, len(jobs))
	for i, j := range jobs {
		if streams[i], err = s.Submit(context.Background(), j); err != nil {
			t.Fatal(err)
		}
	}
	s.Start()
	out := make([][]int32, len(jobs))
	for i, st := range streams {
		toks, _, d := collect(t, st)
		if d.Finish == FinishError {
			t.Fatalf("request %d: %v", i, d.Err)
		}
		out[i] = toks
	}
	return out, gatherValue(t, cfg.Registry.(prometheus.Gatherer), "kvasir_serve_draft_tokens_total")
}

// TestServeMTPDrafts: requests drafting with the model's MTP head (Job.Draft
// mtp) give exactly the tokens of the same requests without drafts —
// greedy and seeded sampling, prompts of different lengths decoded
// together, with one lane and with two lanes whose expert calls take a
// millisecond (the baton passes during the head's own expert calls) — and
// drafts were really verified.
func TestServeMTPDrafts(t *testing.T) {
	const n = 6
	m0, tok := loadMTPModel(t)
	prompts := randomPrompts(n, m0.Params().Vocab, 23)
	jobs := func(d spec.Mode) []Job {
		js := make([]Job, n)
		for i, p := range prompts {
			js[i] = Job{Prompt: p, MaxTokens: 10 + i, Draft: d, DraftMax: 3}
			if i%2 == 1 {
				js[i].Sampler = model.SamplerOptions{Temperature: 0.9, TopK: 20, Seed: uint64(i)}
			}
		}
		return js
	}
	want, plain := serveAll(t, Config{Model: m0, Tokenizer: tok, Registry: prometheus.NewRegistry(), Logger: quiet}, jobs(spec.ModeNone))
	if plain != 0 {
		t.Fatalf("%v draft tokens without drafts", plain)
	}
	for _, lanes := range []int{1, 2} {
		m, _ := loadMTPModel(t)
		cfg := Config{Model: m, Tokenizer: tok, Registry: prometheus.NewRegistry(), Logger: quiet}
		if lanes == 2 {
			l, _ := loadMTPModel(t)
			cfg.Lanes = []*model.Model{l}
			cfg.Experts = &slowExperts{inner: m.LocalExperts(), delay: time.Millisecond}
		}
		got, drafted := serveAll(t, cfg, jobs(spec.ModeMTP))
		for i := range want {
			if !slices.Equal(got[i], want[i]) {
				t.Errorf("lanes %d request %d: drafted %v, plain %v", lanes, i, got[i], want[i])
			}
		}
		if drafted == 0 {
			t.Errorf("lanes %d: no MTP draft was verified", lanes)
		}
		t.Logf("lanes %d: %v draft tokens verified", lanes, drafted)
	}
}

// TestServeMTPRefused: a model without an MTP head refuses draft mtp with
// ErrParams naming why, before anything is queued.
func TestServeMTPRefused(t *testing.T) {
	m, tok := loadTiny(t)
	s, err := New(Config{Model: m, Tokenizer: tok, Registry: prometheus.NewRegistry(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Submit(context.Background(), Job{Prompt: []int32{3, 4}, MaxTokens: 2, Draft: spec.ModeMTP})
	if !errors.Is(err, ErrParams) || !errors.Is(err, model.ErrNoMTP) {
		t.Fatalf("draft mtp on a model without a head: %v, want ErrParams wrapping model.ErrNoMTP", err)
	}
	t.Log(err)
}
