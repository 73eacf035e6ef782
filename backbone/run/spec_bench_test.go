package run

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/spec"
)

// rttExperts computes experts locally after sleeping rtt per call: one
// injected round trip per MoE layer and forward, as a swarm pays when
// every layer's experts are remote (the protocol's own costs are
// BenchmarkDispatchRTT13ms's in backbone/dispatch).
type rttExperts struct {
	inner expert.Computer
	rtt   time.Duration
}

func (e rttExperts) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	time.Sleep(e.rtt)
	return e.inner.ComputeExperts(ctx, layer, hidden, ids, n, k, out)
}

// BenchmarkDraftRepetitive: single-stream decode of 128 tokens after a
// ~1,000-token prompt that asks for a block of code to be repeated with
// one edit, on the embedded tiny qwen35moe with its head made a copying
// bigram table (copyHead: random weights do not copy their prompt), plain
// versus n-gram drafts (draft-max 8), with experts local ("local") and
// behind an injected 13 ms round trip per MoE layer ("rtt13ms", 4 layers:
// 52 ms of round trips per forward). Tokens must be identical; it reports
// tok/s, forwards, and the drafts' acceptance.
func BenchmarkDraftRepetitive(b *testing.B) {
	m, err := Load("")
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	prompt := repetitivePrompt(38)
	ids := m.Tokenizer().Tokenize(prompt, true, false)
	hit := copyHead(b, m, ids)
	b.Logf("prompt %d tokens; the edited head reproduces %.0f%% of its bigrams", len(ids), 100*hit)
	var ref []int32
	for _, lat := range []time.Duration{0, 13 * time.Millisecond} {
		name := "local"
		if lat > 0 {
			name = fmt.Sprintf("rtt%dms", lat.Milliseconds())
			m.Engine().SetExperts(rttExperts{inner: m.Engine().LocalExperts(), rtt: lat})
		}
		for _, mode := range []spec.Mode{spec.ModeNone, spec.ModeNGram} {
			b.Run(name+"/"+string(mode), func(b *testing.B) {
				var res *Result
				for range b.N {
					if res, err = Decode(context.Background(), m, DecodeOptions{Prompt: prompt, MaxTokens: 128, Draft: mode, DraftMax: 8}, nil); err != nil {
						b.Fatal(err)
					}
				}
				if ref == nil {
					ref = res.Tokens
				} else if !slices.Equal(res.Tokens, ref) {
					b.Fatalf("tokens differ from plain decoding")
				}
				b.ReportMetric(res.DecodeTokS, "tok/s")
				b.ReportMetric(float64(res.Forwards), "forwards")
				b.ReportMetric(100*res.AcceptRate(), "accept%")
				b.ReportMetric(float64(len(res.Tokens)), "tokens")
			})
		}
		m.Engine().SetExperts(nil)
	}
}
