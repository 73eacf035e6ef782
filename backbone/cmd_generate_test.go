package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
)

func runJSON(t *testing.T, args ...string) generateResult {
	t.Helper()
	var out, errb bytes.Buffer
	if code := generateMain(append(args, "--json"), &out, &errb); code != 0 {
		t.Fatalf("generate %v: exit %d: %s", args, code, errb.String())
	}
	var res generateResult
	if err := json.Unmarshal(out.Bytes(), &res); err != nil {
		t.Fatalf("output %q: %v", out.String(), err)
	}
	return res
}

// TestGenerateJSON checks the JSON contract against the engine driven
// directly: the prompt's token ids, greedy tokens (argmax after prefill,
// then each token fed back) and the decoded text.
func TestGenerateJSON(t *testing.T) {
	const prompt = "The capital of France is"
	res := runJSON(t, "--prompt", prompt, "--max-tokens", "6", "--temperature", "0")

	m, tok := tinyLocal(t) // cmd_serve_test.go
	ids := tok.Tokenize(prompt, true, false)
	if !slices.Equal(res.PromptTokens, ids) {
		t.Fatalf("prompt_tokens %v, want %v", res.PromptTokens, ids)
	}
	seq := m.NewSequence()
	logits := make([]float32, m.Params().Vocab)
	var want []int32
	for i, id := range ids {
		if err := m.Forward(context.Background(), []model.Row{{Seq: seq, Token: id, Pos: i, Logits: true}}, logits); err != nil {
			t.Fatal(err)
		}
	}
	for len(want) < 6 {
		next := model.Greedy(logits)
		want = append(want, next)
		if err := m.Forward(context.Background(), []model.Row{{Seq: seq, Token: next, Pos: seq.Len(), Logits: true}}, logits); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(res.Tokens, want) {
		t.Errorf("tokens %v, want %v", res.Tokens, want)
	}
	// JSON carries each invalid UTF-8 byte of the decoded text as U+FFFD.
	var wantText string
	enc, _ := json.Marshal(tok.Decode(want))
	if err := json.Unmarshal(enc, &wantText); err != nil {
		t.Fatal(err)
	}
	if res.Text != wantText {
		t.Errorf("text %q, want %q", res.Text, wantText)
	}
	if res.PrefillTokS <= 0 || res.DecodeTokS <= 0 {
		t.Errorf("tok/s %v %v", res.PrefillTokS, res.DecodeTokS)
	}
}

func TestGenerateSamplingAndStreaming(t *testing.T) {
	args := []string{"--max-tokens", "12", "--temperature", "0.9", "--top-k", "50", "--top-p", "0.95", "--seed", "42", "--threads", "1"}
	a, b := runJSON(t, args...), runJSON(t, args...)
	if !slices.Equal(a.Tokens, b.Tokens) || len(a.Tokens) == 0 {
		t.Errorf("same seed, different tokens: %v vs %v", a.Tokens, b.Tokens)
	}
	var out, errb bytes.Buffer
	if code := generateMain(args, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if !strings.HasPrefix(out.String(), a.Text) || !strings.Contains(out.String(), "tok/s") {
		t.Errorf("streamed output %q does not start with %q and report tok/s", out.String(), a.Text)
	}
	for _, bad := range [][]string{{"--max-tokens", "-1"}, {"--nope"}, {"extra"}, {"--temperature", "-1"},
		{"--temperature", "NaN"}, {"--top-p", "0"}, {"--top-p", "2"}, {"--top-k", "-1"}, {"--threads", "-1"}, {"--resident", "bogus"}} {
		errb.Reset()
		if code := generateMain(bad, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2", bad, code)
		}
		if len(bad) == 2 && !strings.Contains(errb.String(), bad[0]) {
			t.Errorf("%v: message %q does not name the flag", bad, errb.String())
		}
	}
	if code := generateMain([]string{"--model", filepath.Join(t.TempDir(), "missing.gguf")}, &out, &errb); code != 1 {
		t.Errorf("missing model: exit %d, want 1", code)
	}
	// serve and the read commands name an unexpected argument as such.
	for _, c := range []struct {
		main func([]string) int
		args []string
		want string
	}{
		{func(a []string) int { return serveMain(context.Background(), a, &errb, nil) }, []string{"extra-arg"}, `serve: unexpected arguments ["extra-arg"]`},
		{func(a []string) int { return ledgerMain(a, &out, &errb) }, []string{"--db", "l.db", "extra"}, `ledger: unexpected arguments ["extra"]`},
		{func(a []string) int { return walletsMain(a, &out, &errb) }, []string{"--db", "w.db", "extra"}, `wallets: unexpected arguments ["extra"]`},
	} {
		errb.Reset()
		if code := c.main(c.args); code != 2 || !strings.Contains(errb.String(), c.want) || strings.Contains(errb.String(), "required") {
			t.Errorf("%v: exit %d: %s", c.args, code, errb.String())
		}
	}
	// serve refuses the same --resident before binding or loading anything.
	errb.Reset()
	if code := serveMain(context.Background(), []string{"--resident", "bogus", "--http", "127.0.0.1:0"}, &errb, nil); code != 2 || !strings.Contains(errb.String(), `--resident "bogus"`) {
		t.Errorf("serve --resident bogus: exit %d: %s", code, errb.String())
	}
}

// TestGenmodelCommand: the tiny preset written to a file decodes exactly as
// the embedded default (same preset and seed).
func TestGenmodelCommand(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	var out, errb bytes.Buffer
	if code := genmodelMain([]string{"--preset", "tiny-qwen35moe", "--seed", "1", "--out", path}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	data, _ := modelgen.TinyQwen35MoE()
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(file, data) {
		t.Error("genmodel --preset tiny-qwen35moe --seed 1 differs from modelgen.TinyQwen35MoE")
	}
	if code := genmodelMain([]string{"--preset", "tiny", "--layers", "1", "--type", "Q4_K_M", "--seed", "3", "--out", path}, &out, &errb); code != 0 {
		t.Fatalf("Q4_K_M: exit %d: %s", code, errb.String())
	}
	if r := runJSON(t, "--model", path, "--max-tokens", "3"); len(r.Tokens) != 3 {
		t.Errorf("generated Q4_K_M model: %d tokens", len(r.Tokens))
	}
	for _, bad := range [][]string{{"--preset", "tiny"}, {"--preset", "gpt5", "--out", path}, {"--type", "Q9", "--out", path}} {
		if code := genmodelMain(bad, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2", bad, code)
		}
	}
}

// TestGenerateDraft: --draft ngram gives the same tokens and logits hash
// as --draft none and reports its drafts and forwards; a bad --draft or
// --draft-max is a usage error.
func TestGenerateDraft(t *testing.T) {
	prompt := strings.Repeat("x = a + b\ny = a + b\n", 6)
	plain := runJSON(t, "--prompt", prompt, "--max-tokens", "24")
	got := runJSON(t, "--prompt", prompt, "--max-tokens", "24", "--draft", "ngram", "--draft-max", "4")
	if !slices.Equal(got.Tokens, plain.Tokens) || got.LogitsSHA256 != plain.LogitsSHA256 {
		t.Errorf("tokens %v, want %v", got.Tokens, plain.Tokens)
	}
	if plain.Draft != "none" || got.Draft != "ngram" || got.Drafted == 0 || got.Forwards+got.Accepted < len(got.Tokens)-1 {
		t.Errorf("draft %q/%q, drafted %d, accepted %d, forwards %d", plain.Draft, got.Draft, got.Drafted, got.Accepted, got.Forwards)
	}
	for _, args := range [][]string{{"--draft", "eagle"}, {"--draft", "ngram", "--draft-max", "0"}, {"--draft", "ngram", "--draft-max", "65"}} {
		var out, errb bytes.Buffer
		if code := generateMain(args, &out, &errb); code != 2 || !strings.Contains(errb.String(), "--draft") {
			t.Errorf("%v: exit %d, %q", args, code, errb.String())
		}
	}
	// Flags that do nothing are named, not ignored.
	var out, errb bytes.Buffer
	if code := generateMain([]string{"--prompt", prompt, "--max-tokens", "1", "--draft-max", "4", "--verify", "quorum"}, &out, &errb); code != 0 ||
		!strings.Contains(errb.String(), "--draft-max has no effect") || !strings.Contains(errb.String(), "--verify has no effect") {
		t.Errorf("ineffective flags: exit %d, %q", code, errb.String())
	}
}
