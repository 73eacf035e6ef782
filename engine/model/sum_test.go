package model

import (
	"context"
	"slices"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
)

// summer is an expert.SumComputer over inner that sums each row's k
// outputs itself, in the router's slot order with every product rounded
// to float32 before its add (llama.cpp build_moe_ffn: ggml_mul by the
// weights, then ggml_add over the slots in order), written out here rather
// than through expert.WeightedSum. ComputeExperts must not be called.
type summer struct {
	inner      expert.Computer
	sums, rows int
	t          *testing.T
}

func (s *summer) ComputeExperts(context.Context, int, []float32, []int32, int, int, []float32) error {
	s.t.Error("ComputeExperts called on a SumComputer")
	return nil
}

func (s *summer) ComputeExpertsSum(ctx context.Context, layer int, hidden []float32, ids []int32, w []float32, n, k int, out []float32) error {
	s.sums++
	s.rows += n
	d := len(out) / n
	eo := make([]float32, n*k*d)
	if err := s.inner.ComputeExperts(ctx, layer, hidden, ids, n, k, eo); err != nil {
		return err
	}
	for r := range n {
		for j := range d {
			acc := float32(w[r*k] * eo[r*k*d+j])
			for sl := 1; sl < k; sl++ {
				acc += float32(w[r*k+sl] * eo[(r*k+sl)*d+j])
			}
			out[r*d+j] = acc
		}
	}
	return nil
}

// TestSumComputer: a model whose Computer returns row sums
// (expert.SumComputer) gives the local decode's logits bit for bit, with
// and without a shared expert (qwen3moe, qwen35moe: added to the sum, then
// the residual, as llama.cpp does), asking for one sum per MoE layer with
// all the batch's rows.
func TestSumComputer(t *testing.T) {
	for name, gen := range map[string]func() ([]byte, error){"qwen3moe": modelgen.Tiny, "qwen35moe": modelgen.TinyQwen35MoE} {
		t.Run(name, func(t *testing.T) {
			_, m := parseBytes(t, gen)
			ref := run(t, m, testTokens, len(testTokens))
			s := &summer{inner: m.LocalExperts(), t: t}
			m.SetExperts(s)
			sameBits(t, "through a SumComputer", run(t, m, testTokens, len(testTokens)), ref)
			if s.sums == 0 || s.rows != s.sums*len(testTokens) {
				t.Errorf("%d sums over %d rows, want each with all %d rows", s.sums, s.rows, len(testTokens))
			}
			m.SetExperts(nil)
		})
	}
}

// planner is an expert.LayerDelegator over the model's own experts with a
// fixed answer per layer: plan[l] is what DelegatesLayer says, take[l]
// what Delegate then decides (a worker that joins between the two makes
// them differ); calls not taken go to ComputeExperts, which counts them.
type planner struct {
	own        expert.Computer
	plan, take []bool
	calls      int
}

func (p *planner) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	p.calls++
	return p.own.ComputeExperts(ctx, layer, hidden, ids, n, k, out)
}

func (p *planner) Delegate(layer int, _ []int32, own expert.Computer) bool {
	return own == p.own && p.take[layer]
}

func (p *planner) DelegatesLayer(layer int, own expert.Computer) bool {
	return own == p.own && p.plan[layer]
}

// TestLayerDelegator: whatever a LayerDelegator plans and its Delegate then
// decides per layer (planned and taken: the shared expert shares the own
// experts' regions; planned and not taken: its gate and up projections are
// done before the call; neither; taken unplanned), the logits are the
// local decode's bits, with and without a shared expert.
func TestLayerDelegator(t *testing.T) {
	for name, gen := range map[string]func() ([]byte, error){"qwen3moe": modelgen.Tiny, "qwen35moe": modelgen.TinyQwen35MoE} {
		t.Run(name, func(t *testing.T) {
			_, m := parseBytes(t, gen)
			ref := run(t, m, testTokens, len(testTokens))
			nl := m.Params().Layers
			for _, c := range []struct{ name, plan, take string }{
				{"planned and taken", "1111", "1111"},
				{"planned, not taken", "1111", "0000"},
				{"mixed", "1100", "1010"},
				{"none", "0000", "0000"},
			} {
				p := &planner{own: m.LocalExperts(), plan: make([]bool, nl), take: make([]bool, nl)}
				for l := range nl {
					p.plan[l] = c.plan[l%len(c.plan)] == '1'
					p.take[l] = c.take[l%len(c.take)] == '1'
				}
				m.SetExperts(p)
				sameBits(t, c.name, run(t, m, testTokens, len(testTokens)), ref)
				m.SetExperts(nil)
				sent := slices.Contains(p.take, false)
				if (p.calls > 0) != sent {
					t.Errorf("%s: %d calls through ComputeExperts (layers not taken: %v)", c.name, p.calls, sent)
				}
			}
		})
	}
}
