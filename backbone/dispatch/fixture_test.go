package dispatch_test

import (
	"context"
	"fmt"
	"math"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

const fixtures = "../../../shared/fixtures"

func loadFixture(t testing.TB, name string) *model.Model {
	t.Helper()
	f, err := gguf.Open(filepath.Join(fixtures, name))
	if err != nil {
		t.Skipf("fixture %s: %v", name, err)
	}
	t.Cleanup(func() { f.Close() })
	m, err := model.Load(f)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return m
}

// decode runs a greedy decode of prompt + steps tokens on m and returns the
// logits of every step, concatenated.
func decode(t testing.TB, m *model.Model, prompt []int32, steps int) ([]float32, []int32) {
	t.Helper()
	ctx := context.Background()
	seq := m.NewSequence()
	vocab := m.Params().Vocab
	rows := make([]model.Row, len(prompt))
	for i, tok := range prompt {
		rows[i] = model.Row{Seq: seq, Token: tok, Pos: i, Logits: i == len(prompt)-1}
	}
	var all []float32
	var toks []int32
	logits := make([]float32, vocab)
	for s := 0; s < steps; s++ {
		if err := m.Forward(ctx, rows, logits); err != nil {
			t.Fatal(err)
		}
		all = append(all, logits...)
		tok := model.Greedy(logits)
		toks = append(toks, tok)
		rows = []model.Row{{Seq: seq, Token: tok, Pos: seq.Len(), Logits: true}}
	}
	return all, toks
}

// fixturePrompt is the prompt of every fixture decode here.
var fixturePrompt = []int32{9707, 11, 1879, 0, 576, 3974, 13876, 38835}

// localDecode is the reference of a swarm decode: fixture name decoded
// greedily on its own (fixturePrompt, then steps tokens), its parameters,
// the logits of every step and the tokens.
func localDecode(t testing.TB, name string, steps int) (model.Params, []float32, []int32) {
	t.Helper()
	ref := loadFixture(t, name)
	logits, toks := decode(t, ref, fixturePrompt, steps)
	return ref.Params(), logits, toks
}

// fixtureBackbone loads the backbone's copy of fixture name and returns
// it, its dispatch.Model (ID name) and the Config settings under which the
// dispatcher computes locally with that copy's experts (Fallback) and
// accepts a worker's holdings only with their hashes (ExpertHash).
func fixtureBackbone(t testing.TB, name string) (*model.Model, dispatch.Model, func(*dispatch.Config)) {
	t.Helper()
	bb := loadFixture(t, name)
	p := bb.Params()
	local := bb.LocalExperts()
	md := dispatch.Model{ID: name, D: p.Embd, K: p.ExpertsUsed, NLayer: p.Layers, NExpert: p.Experts}
	return bb, md, func(c *dispatch.Config) {
		c.Fallback = local
		c.ExpertHash = func(l, e int) ([32]byte, bool) { return worker.ExpertSHA256(local.Layer(l), e) }
	}
}

// swarmDecode decodes bb greedily (fixturePrompt, then len(want) tokens)
// with its experts computed by s's dispatcher, fails the test unless the
// tokens are want, and returns the logits of every step and the tokens.
func (s *stack) swarmDecode(t *testing.T, bb *model.Model, want []int32) ([]float32, []int32) {
	t.Helper()
	bb.SetExperts(s.disp)
	logits, toks := decode(t, bb, fixturePrompt, len(want))
	for i := range want {
		if toks[i] != want[i] {
			t.Fatalf("token %d: swarm %d, local %d (tokens %v, want %v)", i, toks[i], want[i], toks, want)
		}
	}
	return logits, toks
}

// sameLogits fails the test unless got and want are bit-identical.
func sameLogits(t *testing.T, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("logit %d: swarm %v, local %v", i, got[i], want[i])
		}
	}
}

// TestFixtureDecodeBitIdentical: the fixture models decoded with every MoE
// layer served by two workers (layers 0,2 and 1,3) through gateway and hub
// give the same greedy tokens and bit-identical logits as a local decode,
// with no expert computed locally: with row sums (the model asks the
// dispatcher for each row's weighted sum and every row goes as a
// DISPATCH_SUM to the worker holding its layer) and without (NoRowSums:
// every expert output travels and the dispatcher sums).
func TestFixtureDecodeBitIdentical(t *testing.T) {
	names := []string{"tiny-qwen3moe-Q8_0.gguf"}
	if !testing.Short() {
		names = append(names, "tiny-qwen3moe-F16.gguf", "tiny-qwen3moe-Q4_K_M.gguf")
	}
	for _, name := range names {
		for _, off := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/nosums=%v", name, off), func(t *testing.T) {
				p, wantLogits, wantToks := localDecode(t, name, 6)
				bb, md, own := fixtureBackbone(t, name)
				s := newStack(t, md, 0, func(c *dispatch.Config) {
					own(c)
					c.NoRowSums = off
					// Every output must come from the workers: a loaded
					// test machine must not turn a slow answer into a
					// local recomputation (the deadlines are tested
					// elsewhere).
					c.MinDeadline = 2 * time.Second
				})
				wl := loadFixture(t, name).LocalExperts() // the workers' own copy
				s.startWorkerWith(t, wl, worker.HoldingsOf(wl, []int{0, 2}))
				s.startWorkerWith(t, wl, worker.HoldingsOf(wl, []int{1, 3}))
				s.waitWorkers(t, 2)
				gotLogits, gotToks := s.swarmDecode(t, bb, wantToks)
				sameLogits(t, gotLogits, wantLogits)
				st := s.disp.Stats()
				rows := uint64((len(fixturePrompt) + 5) * p.Layers)
				want := rows * uint64(p.ExpertsUsed)
				if st.ExpertsLocal != 0 || st.ExpertsRemote != want {
					t.Fatalf("experts local %d remote %d, want 0 and %d (failed requests %d)", st.ExpertsLocal, st.ExpertsRemote, want, st.Fallbacks)
				}
				if off && st.SumRows != 0 || !off && st.SumRows != rows {
					t.Fatalf("sums off %v: %d rows summed by workers of %d", off, st.SumRows, rows)
				}
				for _, w := range st.Workers {
					if w.Holdings != 2*p.Experts {
						t.Fatalf("worker %s: %d holdings accepted, want %d (hash check)", w.ID[:8], w.Holdings, 2*p.Experts)
					}
				}
				t.Logf("%s: tokens %v identical, %d expert outputs remote, %d rows summed remotely", name, gotToks, st.ExpertsRemote, st.SumRows)
			})
		}
	}
}
