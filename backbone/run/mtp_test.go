package run

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/spec"
)

// loadTinyMTP loads tiny-qwen35moe generated with an MTP block
// (modelgen Spec.NextN 1).
func loadTinyMTP(t testing.TB) *Model {
	t.Helper()
	s, err := modelgen.Preset("tiny-qwen35moe")
	if err != nil {
		t.Fatal(err)
	}
	s.NextN = 1
	data, err := modelgen.Bytes(s)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "tiny-qwen35moe-mtp.gguf")
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	m, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.Engine().SetThreads(1)
	return m
}

// TestDecodeDraftsMTP: on a generated qwen35moe with an MTP block,
// decoding with the MTP head's drafts gives the same tokens and logits
// hash as plain decoding, greedy and sampled, for several draft lengths
// (random weights: the head's drafts are rarely accepted; what must hold
// is exactness and the bookkeeping: forwards + accepted = tokens).
func TestDecodeDraftsMTP(t *testing.T) {
	m := loadTinyMTP(t)
	for _, smp := range []model.SamplerOptions{{}, {Temperature: 0.9, TopK: 40, Seed: 7}} {
		o := DecodeOptions{Prompt: "The swarm decodes", MaxTokens: 24, Sampler: smp}
		plain, err := Decode(context.Background(), m, o, nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, k := range []int{1, 3} {
			o.Draft, o.DraftMax = spec.ModeMTP, k
			got, err := Decode(context.Background(), m, o, nil)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Tokens, plain.Tokens) || got.LogitsSHA256 != plain.LogitsSHA256 || got.Text != plain.Text {
				t.Fatalf("temperature %v, draft-max %d: tokens %v, want %v (logits %s, want %s)",
					smp.Temperature, k, got.Tokens, plain.Tokens, got.LogitsSHA256, plain.LogitsSHA256)
			}
			if d := len(got.Tokens) - got.Forwards - got.Accepted; d != 1 && d != 0 || got.Accepted > got.Drafted || got.Drafted == 0 {
				t.Errorf("draft-max %d: %d forwards + %d accepted for %d tokens (%d drafted)", k, got.Forwards, got.Accepted, len(got.Tokens), got.Drafted)
			}
			t.Logf("temperature %v draft-max %d: %d tokens, %d forwards, drafted %d, accepted %d (%.0f%%), %.1f tok/s (plain %.1f)",
				smp.Temperature, k, len(got.Tokens), got.Forwards, got.Drafted, got.Accepted, 100*got.AcceptRate(), got.DecodeTokS, plain.DecodeTokS)
		}
	}
}

// TestDecodeMTPWithoutHead: --draft mtp on a model without an MTP block
// fails before decoding, saying so.
func TestDecodeMTPWithoutHead(t *testing.T) {
	m := loadTiny(t)
	_, err := Decode(context.Background(), m, DecodeOptions{Prompt: "x", MaxTokens: 4, Draft: spec.ModeMTP}, nil)
	if !errors.Is(err, model.ErrNoMTP) || !strings.Contains(err.Error(), "nextn_predict_layers") {
		t.Fatalf("got %v, want an ErrNoMTP error naming nextn_predict_layers", err)
	}
}

// TestDecodeDraftsMTPAccepted: with the output norms zeroed (every logit
// 0, so the main model and the MTP head both choose token 0 greedily)
// every MTP draft is accepted: the drafter's catch-up over several
// verified rows per step and its rewinds run, and the output is still
// plain decoding's.
func TestDecodeDraftsMTPAccepted(t *testing.T) {
	m := loadTinyMTP(t)
	eng := m.Engine()
	clear(eng.OutputNorm)
	clear(eng.MTP.HeadNorm)
	o := DecodeOptions{Prompt: "The swarm decodes", MaxTokens: 20}
	plain, err := Decode(context.Background(), m, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Draft, o.DraftMax = spec.ModeMTP, 4
	got, err := Decode(context.Background(), m, o, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got.Tokens, plain.Tokens) || got.LogitsSHA256 != plain.LogitsSHA256 {
		t.Fatalf("tokens %v, want %v", got.Tokens, plain.Tokens)
	}
	if got.Accepted != got.Drafted || got.Forwards >= plain.Forwards/3 {
		t.Errorf("%d forwards (plain %d), drafted %d, accepted %d", got.Forwards, plain.Forwards, got.Drafted, got.Accepted)
	}
}

// BenchmarkDraftMTP decodes 64 tokens of the generated tiny qwen35moe
// with an MTP block, plain and with MTP drafts (random weights: few are
// accepted), reporting decode tok/s, forwards and the acceptance rate
// (docs/BENCHMARKS-by-hand.md).
func BenchmarkDraftMTP(b *testing.B) {
	m := loadTinyMTP(b)
	for _, k := range []int{0, 1, 3} {
		o := DecodeOptions{Prompt: "The swarm decodes", MaxTokens: 64}
		name := "none"
		if k > 0 {
			o.Draft, o.DraftMax, name = spec.ModeMTP, k, "mtp-"+string(rune('0'+k))
		}
		b.Run(name, func(b *testing.B) {
			var r *Result
			for b.Loop() {
				var err error
				if r, err = Decode(context.Background(), m, o, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(r.DecodeTokS, "tok/s")
			b.ReportMetric(float64(r.Forwards), "forwards")
			b.ReportMetric(100*r.AcceptRate(), "accept%")
		})
	}
}
