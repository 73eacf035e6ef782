package modelgen

import (
	"fmt"
	"math"
	"sort"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// generator is one architecture's writer: the Spec fields it checks, the
// metadata keys and per-layer tensors it writes, in the order llama.cpp's
// converter (gguf-py) writes them. Each architecture lives in a file of its
// own (qwen3moe.go, qwen35moe.go) beside engine/model's loader of the same
// name and registers itself from init; Build, Spec.check, Spec.plan,
// Spec.Recurrent and Describe look it up by Spec.Arch and hold no
// architecture's name.
type generator struct {
	arch string // general.architecture
	// check validates the architecture's own Spec fields (the common ones
	// are checked already); errors wrap ErrSpec. Nil: nothing to check.
	check func(s Spec) error
	// recurrent reports whether layer il is a recurrent layer (llama.cpp's
	// is_recr); nil: none is.
	recurrent func(s Spec, il int) bool
	// metadata writes the "<arch>." hyperparameter keys (prefix a) in file
	// order.
	metadata func(s Spec, w *gguf.Writer, a string)
	// layer adds layer il's tensors (blk.<il>.*) in file order.
	layer func(s Spec, p *planner, il int)
	// describe returns Describe's phrases for the architecture (the type
	// and the layout flags are appended).
	describe func(s Spec) []string
}

var generators = map[string]*generator{}

// register adds g to the registry; called from each architecture file's
// init.
func register(g *generator) {
	if g.metadata == nil || g.layer == nil || g.describe == nil {
		panic("modelgen: architecture " + g.arch + " registered without its writer functions")
	}
	if _, dup := generators[g.arch]; dup {
		panic("modelgen: architecture " + g.arch + " registered twice")
	}
	generators[g.arch] = g
}

// Architectures returns the Spec.Arch values Build writes, sorted (the
// same list as engine/model.Architectures: every architecture has both a
// loader and a generator).
func Architectures() []string {
	names := make([]string, 0, len(generators))
	for n := range generators {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// planner collects a file's tensors in file order (Spec.plan): the drawn
// ones (ts) and the file's ones (out).
type planner struct {
	ts  []*tensorSpec
	out []outTensor
}

// draw adds a tensor to draw named name of type t, elements from N(mean,
// std^2), ggml ne dims (dims[0] the row length), without writing it.
func (p *planner) draw(name string, t quant.Type, mean, std float32, dims ...int) *tensorSpec {
	ud := make([]uint64, len(dims))
	rows := 1
	for i, v := range dims {
		ud[i] = uint64(v)
		if i > 0 {
			rows *= v
		}
	}
	x := &tensorSpec{name: name, typ: t, dims: ud, rows: rows, cols: dims[0], mean: mean, std: std}
	p.ts = append(p.ts, x)
	return x
}

// add draws a tensor (see draw) and writes it to the file as is.
func (p *planner) add(name string, t quant.Type, mean, std float32, dims ...int) *tensorSpec {
	x := p.draw(name, t, mean, std, dims...)
	p.out = append(p.out, outTensor{name: name, typ: t, dims: x.dims, parts: []*tensorSpec{x}})
	return x
}

// gateUp adds layer il's routed experts' gate and up matrices, of type t,
// as ffn_gate_exps and ffn_up_exps (ne [Embd, ExpertFF, Experts]) or, with
// s.FusedGateUp, as one ffn_gate_up_exps. Both are drawn under their
// separate names, so the bytes agree.
func (p *planner) gateUp(s Spec, il int, t quant.Type) {
	d := s.Embd
	gn, un := blk(il, "ffn_gate_exps"), blk(il, "ffn_up_exps")
	if !s.FusedGateUp {
		p.add(gn, t, 0, isd(d), d, s.ExpertFF, s.Experts)
		p.add(un, t, 0, isd(d), d, s.ExpertFF, s.Experts)
		return
	}
	g := p.draw(gn, t, 0, isd(d), d, s.ExpertFF, s.Experts)
	u := p.draw(un, t, 0, isd(d), d, s.ExpertFF, s.Experts)
	p.out = append(p.out, outTensor{name: blk(il, "ffn_gate_up_exps"), typ: t,
		dims: []uint64{uint64(d), uint64(2 * s.ExpertFF), uint64(s.Experts)}, parts: []*tensorSpec{g, u},
		experts: s.Experts})
}

// blk returns the name of layer il's weight s ("blk.<il>.<s>.weight").
func blk(il int, s string) string { return fmt.Sprintf("blk.%d.%s.weight", il, s) }

// isd is the variance-preserving standard deviation 1/sqrt(n) of a
// weight with rows of n elements.
func isd(n int) float32 { return float32(1 / math.Sqrt(float64(n))) }

// attentionKeys writes the shape keys every architecture has, in file
// order: context_length, embedding_length, block_count, attention
// head_count, head_count_kv, key_length and value_length (= HeadDim).
func attentionKeys(s Spec, w *gguf.Writer, a string) {
	w.SetUint32(a+"context_length", uint32(s.Context))
	w.SetUint32(a+"embedding_length", uint32(s.Embd))
	w.SetUint32(a+"block_count", uint32(s.Layers+s.NextN))
	w.SetUint32(a+"attention.head_count", uint32(s.Heads))
	w.SetUint32(a+"attention.head_count_kv", uint32(s.HeadsKV))
	w.SetUint32(a+"attention.key_length", uint32(s.HeadDim))
	w.SetUint32(a+"attention.value_length", uint32(s.HeadDim))
}

// ropeNormKeys writes rope.freq_base and
// attention.layer_norm_rms_epsilon.
func ropeNormKeys(s Spec, w *gguf.Writer, a string) {
	w.SetFloat32(a+"rope.freq_base", s.RopeBase)
	w.SetFloat32(a+"attention.layer_norm_rms_epsilon", s.NormEps)
}

// expertKeys writes expert_count, expert_used_count and
// expert_feed_forward_length.
func expertKeys(s Spec, w *gguf.Writer, a string) {
	w.SetUint32(a+"expert_count", uint32(s.Experts))
	w.SetUint32(a+"expert_used_count", uint32(s.ExpertsUsed))
	w.SetUint32(a+"expert_feed_forward_length", uint32(s.ExpertFF))
}
