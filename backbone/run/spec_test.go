package run

import (
	"context"
	"encoding/binary"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/spec"
)

// specModels are the models the draft tests decode: the embedded tiny
// qwen35moe, a generated tiny qwen3moe and, when ../shared/fixtures is
// there, llama.cpp's fixture files of both architectures.
func specModels(t *testing.T) map[string]*Model {
	t.Helper()
	ms := map[string]*Model{"qwen35moe-embedded": loadTiny(t)}
	data, err := modelgen.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "tiny-qwen3moe.gguf")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	paths := map[string]string{"qwen3moe-generated": p,
		"qwen3moe-fixture-Q8_0": "../../../shared/fixtures/tiny-qwen3moe-Q8_0.gguf",
		"qwen35moe-fixture-F16": "../../../shared/fixtures/qwen35moe/tiny-qwen35moe-F16.gguf"}
	for name, p := range paths {
		if _, err := os.Stat(p); err != nil {
			t.Logf("%s: %v (skipped)", name, err)
			continue
		}
		m, err := Load(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { m.Close() })
		m.Engine().SetThreads(1)
		ms[name] = m
	}
	return ms
}

// repetitivePrompt asks for a block of code to be repeated with one edit:
// the output's n-grams recur in the prompt.
func repetitivePrompt(lines int) string {
	var b strings.Builder
	b.WriteString("Repeat this code, renaming total to sum:\n")
	for i := range lines {
		b.WriteString("total += values[i] * weight\n")
		if i%4 == 3 {
			b.WriteString("if total > limit { break }\n")
		}
	}
	b.WriteString("\nHere it is again:\n")
	return b.String()
}

// TestDecodeDrafts: on both architectures (generated models and the
// llama.cpp fixtures), decoding with n-gram drafts gives the same tokens
// and the same logits hash as plain decoding, greedy and sampled (the same
// seed draws the same tokens), for several draft lengths. Random weights
// rarely repeat themselves, so few drafts are accepted here;
// TestDecodeDraftsCopying checks a model that does.
func TestDecodeDrafts(t *testing.T) {
	for name, m := range specModels(t) {
		t.Run(name, func(t *testing.T) {
			for _, prompt := range []string{"The swarm decodes", repetitivePrompt(12)} {
				for _, smp := range []model.SamplerOptions{{}, {Temperature: 0.9, TopK: 40, Seed: 7}} {
					o := DecodeOptions{Prompt: prompt, MaxTokens: 40, Sampler: smp}
					plain, err := Decode(context.Background(), m, o, nil)
					if err != nil {
						t.Fatal(err)
					}
					if plain.Forwards != len(plain.Tokens)-1 || plain.Drafted != 0 {
						t.Errorf("plain decode: %d forwards for %d tokens, %d drafted", plain.Forwards, len(plain.Tokens), plain.Drafted)
					}
					for _, k := range []int{1, 3, 8} {
						o.Draft, o.DraftMax = spec.ModeNGram, k
						var streamed []int32
						o.OnToken = func(i int, tok int32) { streamed = append(streamed, tok) }
						got, err := Decode(context.Background(), m, o, nil)
						if err != nil {
							t.Fatal(err)
						}
						if !slices.Equal(got.Tokens, plain.Tokens) || !slices.Equal(streamed, plain.Tokens) || got.LogitsSHA256 != plain.LogitsSHA256 || got.Text != plain.Text {
							t.Fatalf("temperature %v, draft-max %d: tokens %v, want %v (logits %s, want %s)",
								smp.Temperature, k, got.Tokens, plain.Tokens, got.LogitsSHA256, plain.LogitsSHA256)
						}
						// Each forward gives its accepted drafts and one token more,
						// except a last one that stops at an accepted draft.
						if d := len(got.Tokens) - got.Forwards - got.Accepted; d != 1 && d != 0 || got.Accepted > got.Drafted {
							t.Errorf("draft-max %d: %d forwards + %d accepted for %d tokens (%d drafted)", k, got.Forwards, got.Accepted, len(got.Tokens), got.Drafted)
						}
						if smp.Temperature == 0 && k == 8 {
							t.Logf("%q...: %d tokens, %d forwards, drafted %d, accepted %d (%.0f%%)",
								prompt[:12], len(got.Tokens), got.Forwards, got.Drafted, got.Accepted, 100*got.AcceptRate())
						}
					}
				}
			}
		})
	}
}

// copyHead replaces m's output head by a bigram table over text: the row
// of token v is the sum of the embeddings of the tokens whose first
// occurrence in text is followed by v, scaled, so that greedy decoding
// mostly picks, after token t, the token that followed t in text. Random
// weights do not copy their prompt as a trained model copies code it is
// asked to repeat; this stand-in does (every layer still runs: only the
// head's weights differ, and the layers are quietened), so that drafts have something to predict. It
// returns the fraction of text's bigrams the edited model reproduces
// greedily when fed text one batch.
func copyHead(t testing.TB, m *Model, text []int32) float64 {
	t.Helper()
	eng := m.Engine()
	p := eng.Params()
	d := p.Embd
	emb := make([]float32, d)
	head := make([]float32, p.Vocab*d)
	seen := map[int32]bool{}
	rb, err := eng.TokenEmbd.Type.RowBytes(d)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(text); i++ {
		cur, nx := text[i], text[i+1]
		if seen[cur] {
			continue
		}
		seen[cur] = true
		if err := quant.Dequantize(eng.TokenEmbd.Type, eng.TokenEmbd.Data[int(cur)*rb:int(cur+1)*rb], emb); err != nil {
			t.Fatal(err)
		}
		for j, v := range emb {
			head[int(nx)*d+j] += v * eng.OutputNorm[j]
		}
	}
	// Quieten the layers (their input norms scaled down: every matrix
	// product and expert still runs, on smaller activations) so that the
	// last hidden state stays close to the token's embedding.
	for i := range eng.Blocks {
		b := &eng.Blocks[i]
		b.AttnNorm, b.FFNNorm = scaleVec(b.AttnNorm, 1.0/32), scaleVec(b.FFNNorm, 1.0/32)
	}
	raw := make([]byte, 4*len(head))
	for i, v := range head {
		binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
	}
	eng.Output = model.Weight{Name: "output.weight (bigram stand-in)", Type: quant.F32, Rows: p.Vocab, Cols: d, Data: raw}
	seq := eng.NewSequence()
	rows := make([]model.Row, len(text))
	for i, tk := range text {
		rows[i] = model.Row{Seq: seq, Token: tk, Pos: i, Logits: true}
	}
	lg := make([]float32, len(text)*p.Vocab)
	if err := eng.Forward(context.Background(), rows, lg); err != nil {
		t.Fatal(err)
	}
	hit := 0
	for i := 0; i+1 < len(text); i++ {
		if model.Greedy(lg[i*p.Vocab:(i+1)*p.Vocab]) == text[i+1] {
			hit++
		}
	}
	return float64(hit) / float64(len(text)-1)
}

// scaleVec returns a copy of w times f.
func scaleVec(w []float32, f float32) []float32 {
	out := make([]float32, len(w))
	for i, v := range w {
		out[i] = v * f
	}
	return out
}

// TestDecodeDraftsCopying: on a model that copies (copyHead) and a
// repetitive prompt, greedy n-gram drafts are mostly accepted, need fewer
// forwards, and give the same tokens and logits as plain decoding, on both
// architectures.
func TestDecodeDraftsCopying(t *testing.T) {
	for name, m := range specModels(t) {
		if strings.Contains(name, "fixture") {
			continue // same mechanics, bigger vocabulary: the generated ones suffice
		}
		t.Run(name, func(t *testing.T) {
			prompt := repetitivePrompt(12)
			hit := copyHead(t, m, m.Tokenizer().Tokenize(prompt, true, false))
			o := DecodeOptions{Prompt: prompt, MaxTokens: 64}
			plain, err := Decode(context.Background(), m, o, nil)
			if err != nil {
				t.Fatal(err)
			}
			o.Draft, o.DraftMax = spec.ModeNGram, 8
			got, err := Decode(context.Background(), m, o, nil)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("bigrams reproduced %.0f%%; %d tokens: %d forwards plain, %d with drafts; drafted %d, accepted %d (%.0f%%)",
				100*hit, len(got.Tokens), plain.Forwards, got.Forwards, got.Drafted, got.Accepted, 100*got.AcceptRate())
			if !slices.Equal(got.Tokens, plain.Tokens) || got.LogitsSHA256 != plain.LogitsSHA256 {
				t.Fatalf("tokens %v, want %v", got.Tokens, plain.Tokens)
			}
			if got.AcceptRate() < 0.5 || 2*got.Forwards > plain.Forwards {
				t.Errorf("acceptance %.2f, %d forwards for plain's %d: want >= 50%% and half the forwards", got.AcceptRate(), got.Forwards, plain.Forwards)
			}
		})
	}
}
