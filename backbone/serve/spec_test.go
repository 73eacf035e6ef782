package serve

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/spec"
)

// repeatedPrompts returns n prompts that each repeat a random pattern of
// 2..6 tokens a few times (n-gram drafts find continuations in them).
func repeatedPrompts(n, vocab int, seed uint64) [][]int32 {
	rng := rand.New(rand.NewPCG(seed, 9))
	out := make([][]int32, n)
	for i := range out {
		pat := make([]int32, 2+rng.IntN(5))
		for j := range pat {
			pat[j] = int32(rng.IntN(vocab))
		}
		for range 3 + rng.IntN(4) {
			out[i] = append(out[i], pat...)
		}
	}
	return out
}

// TestDraftRequests: requests with n-gram drafts, batched with requests
// without, get the tokens of plain decoding: greedy ones those of a
// direct decode, seeded sampled ones those of the same request without
// drafts; drafts are verified and some accepted (the metrics count them),
// with a row budget that drafts must share.
func TestDraftRequests(t *testing.T) {
	const n, maxTok = 8, 24
	s, reg := newSched(t, func(c *Config) { c.MaxBatchRows = 24 })
	prompts := append(repeatedPrompts(n, s.p.Vocab, 3), randomPrompts(2, s.p.Vocab, 5)...)
	type pair struct{ draft, plain *Stream }
	var greedy, sampled []pair
	submit := func(j Job) *Stream {
		st, err := s.Submit(context.Background(), j)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	for i, p := range prompts {
		j := Job{Prompt: p, MaxTokens: maxTok, Draft: spec.ModeNGram, DraftMax: 1 + i%6}
		greedy = append(greedy, pair{draft: submit(j)})
		js := j
		js.Sampler = model.SamplerOptions{Temperature: 0.8, TopK: 20, Seed: uint64(i)}
		ps := js
		ps.Draft = spec.ModeNone
		sampled = append(sampled, pair{draft: submit(js), plain: submit(ps)})
	}
	s.Start()
	for i, pr := range greedy {
		got, _, d := collect(t, pr.draft)
		if want := directGreedy(t, prompts[i], maxTok); !slices.Equal(got, want) || d.CompletionTokens != len(want) {
			t.Errorf("greedy request %d with drafts: %v, want %v", i, got, want)
		}
	}
	for i, pr := range sampled {
		got, text, _ := collect(t, pr.draft)
		want, wantText, _ := collect(t, pr.plain)
		if !slices.Equal(got, want) || text != wantText {
			t.Errorf("sampled request %d with drafts: %v, without %v", i, got, want)
		}
	}
	drafted := gatherValue(t, reg, "kvasir_serve_draft_tokens_total")
	accepted := gatherValue(t, reg, "kvasir_serve_draft_accepted_tokens_total")
	t.Logf("drafted %v, accepted %v", drafted, accepted)
	if drafted == 0 || accepted == 0 || accepted > drafted {
		t.Errorf("drafted %v, accepted %v", drafted, accepted)
	}
	if _, err := s.Submit(context.Background(), Job{Prompt: prompts[0], MaxTokens: 1, Draft: spec.ModeMTP}); err == nil {
		t.Error("an mtp draft request was accepted")
	}
}

// TestDraftMetrics: the draft counters of a greedy request equal a replay
// of its tokens through spec.NGram, with drafts of at most DraftMax and the
// tokens left: the first token comes from the prompt, then each step drafts
// from the history, and each sampled token that equals its row's draft is
// accepted, the one that ends the request (MaxTokens) included. MaxTokens
// sweeps over a text the tiny model mostly refuses the drafts of, and over
// one whose every token a logit bias fixes (every draft accepted), so that
// requests end inside accepted runs.
func TestDraftMetrics(t *testing.T) {
	s, reg := newSched(t, nil)
	s.Start()
	_, tok := loadTiny(t)
	prompt := tok.Encode(strings.Repeat("the cat sat on the mat. ", 4)+"the cat", false)
	const draftMax = 5
	var prevDrafted, prevAccepted float64
	endedInRun := 0
	for _, bias := range []map[int32]float32{nil, {prompt[1]: 100}} {
		for maxTok := 24; maxTok <= 35; maxTok++ {
			st, err := s.Submit(context.Background(), Job{Prompt: prompt, MaxTokens: maxTok, LogitBias: bias, Draft: spec.ModeNGram, DraftMax: draftMax})
			if err != nil {
				t.Fatal(err)
			}
			got, _, _ := collect(t, st)
			hist := append(slices.Clone(prompt), got[0])
			var drafted, accepted int
			for gen := 1; gen < len(got); {
				drafts := spec.NGram(nil, hist, min(draftMax, maxTok-gen))
				drafted += len(drafts)
				for j := 0; gen < len(got); j++ {
					tk := got[gen]
					gen++
					hist = append(hist, tk)
					if j >= len(drafts) || tk != drafts[j] {
						break
					}
					accepted++
					if gen == len(got) {
						endedInRun++
					}
				}
			}
			d := gatherValue(t, reg, "kvasir_serve_draft_tokens_total")
			a := gatherValue(t, reg, "kvasir_serve_draft_accepted_tokens_total")
			if d-prevDrafted != float64(drafted) || a-prevAccepted != float64(accepted) {
				t.Errorf("bias %v, max_tokens %d: counters drafted %v accepted %v, replay %d and %d", bias, maxTok, d-prevDrafted, a-prevAccepted, drafted, accepted)
			}
			prevDrafted, prevAccepted = d, a
		}
	}
	if endedInRun == 0 {
		t.Error("no request ended on an accepted draft: the sweep does not test that case")
	}
}

// TestDraftAPI: the draft and draft_max extension fields give the same
// completion as without them; bad values are 400s naming the field.
func TestDraftAPI(t *testing.T) {
	srv := newTestServer(t, nil)
	prompt := strings.Repeat("x = a + b\ny = a + b\n", 5)
	texts := greedyTexts(t, srv, prompt, 24, []map[string]any{{}, {"draft": "ngram", "draft_max": 4}, {"draft": "none"}})
	if texts[1] != texts[0] || texts[2] != texts[0] {
		t.Errorf("texts %q", texts)
	}
	for _, bad := range []map[string]any{{"draft": "eagle"}, {"draft": "mtp"}, {"draft": "ngram", "draft_max": 0}} {
		req := map[string]any{"prompt": prompt, "max_tokens": 4}
		for k, v := range bad {
			req[k] = v
		}
		resp, body := srv.post(t, "/v1/completions", jsonBody(t, req))
		if resp.StatusCode != 400 || !strings.Contains(string(body), "draft") {
			t.Errorf("%v: status %d: %s", bad, resp.StatusCode, body)
		}
	}
}

// greedyTexts posts one greedy completion of prompt (maxTokens) per entry
// of extras, each adding its fields to the request, and returns their
// texts; a status other than 200 fails the test.
func greedyTexts(t *testing.T, srv *testServer, prompt string, maxTokens int, extras []map[string]any) []string {
	t.Helper()
	var texts []string
	for _, extra := range extras {
		req := map[string]any{"prompt": prompt, "max_tokens": maxTokens, "temperature": 0}
		for k, v := range extra {
			req[k] = v
		}
		resp, body := srv.post(t, "/v1/completions", jsonBody(t, req))
		if resp.StatusCode != 200 {
			t.Fatalf("%v: status %d: %s", extra, resp.StatusCode, body)
		}
		var r completionResponse
		if err := json.Unmarshal(body, &r); err != nil {
			t.Fatal(err)
		}
		texts = append(texts, *r.Choices[0].Text)
	}
	return texts
}

// TestDraftAPIMTP: on a model with a multi-token-prediction head, the
// completions API takes draft "mtp" (and "none", "ngram") and returns the
// same greedy text for each.
func TestDraftAPIMTP(t *testing.T) {
	m, tok := loadMTPModel(t)
	m.SetThreads(1)
	srv := newTestServer(t, func(c *Config) { c.Model, c.Tokenizer = m, tok })
	prompt := strings.Repeat("the cat sat on the mat ", 4)
	texts := greedyTexts(t, srv, prompt, 16, []map[string]any{{}, {"draft": "mtp"}, {"draft": "mtp", "draft_max": 3}, {"draft": "ngram"}})
	for i, x := range texts[1:] {
		if x != texts[0] {
			t.Errorf("request %d: text %q, without drafts %q", i+1, x, texts[0])
		}
	}
	if drafted := gatherValue(t, srv.reg, "kvasir_serve_draft_tokens_total"); drafted == 0 {
		t.Error("no draft tokens were verified")
	}
}
