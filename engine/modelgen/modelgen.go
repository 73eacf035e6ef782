// Package modelgen writes qwen3moe GGUF models with deterministic random
// weights: the embedded tiny default model and benchmark models with real
// Qwen3-30B-A3B layer shapes. The files carry the metadata keys llama.cpp
// reads for qwen3moe (the same keys as the fixtures, see
// fixtures/README.md) and a small byte-level BPE vocabulary from
// tokenizer.DefaultConfig.
package modelgen

import (
	"bytes"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// ErrSpec reports an invalid Spec or unknown preset.
var ErrSpec = errors.New("modelgen: invalid spec")

// Spec describes a model to generate. Sizes are element counts.
type Spec struct {
	Name        string  // general.name
	Layers      int     // block_count
	Embd        int     // embedding_length (d_model)
	Heads       int     // attention.head_count
	HeadsKV     int     // attention.head_count_kv
	HeadDim     int     // attention.key_length = value_length
	Experts     int     // expert_count
	ExpertsUsed int     // expert_used_count
	ExpertFF    int     // expert_feed_forward_length
	Context     int     // context_length
	RopeBase    float32 // rope.freq_base
	NormEps     float32 // attention.layer_norm_rms_epsilon
	Vocab       int     // tokenizer vocabulary size passed to tokenizer.DefaultConfig
	// Type is the type of every weight matrix (norms and the router stay
	// F32). Mix selects a llama.cpp Q4_K_M-like mix instead: Q4_K, with
	// Q6_K for token_embd and, in the second half of the layers, attn_v and
	// ffn_down_exps (as in the fixture model C).
	Type quant.Type
	Mix  bool
	Seed uint64
}

// Presets names the specs Preset knows.
var Presets = []string{"tiny", "qwen3-30b-a3b"}

// Preset returns a named spec: "tiny" (d 256, 4 layers, 4 q / 2 kv heads of
// 64, 8 experts top-2 of FFN 256, vocabulary 512, Q8_0: generates in well
// under a second) or "qwen3-30b-a3b" (Qwen3-30B-A3B layer shapes: d 2048,
// 32 q / 4 kv heads of 128, 128 experts top-8 of FFN 768, 48 layers, context
// 40960, Q4_K; vocabulary 1024 instead of 151936). Errors wrap ErrSpec.
func Preset(name string) (Spec, error) {
	switch name {
	case "tiny":
		return Spec{Name: "kvasir-tiny-qwen3moe", Layers: 4, Embd: 256, Heads: 4, HeadsKV: 2, HeadDim: 64,
			Experts: 8, ExpertsUsed: 2, ExpertFF: 256, Context: 4096, RopeBase: 1e6, NormEps: 1e-6,
			Vocab: 512, Type: quant.Q8_0, Seed: 1}, nil
	case "qwen3-30b-a3b":
		return Spec{Name: "kvasir-qwen3-30b-a3b-shape", Layers: 48, Embd: 2048, Heads: 32, HeadsKV: 4, HeadDim: 128,
			Experts: 128, ExpertsUsed: 8, ExpertFF: 768, Context: 40960, RopeBase: 1e6, NormEps: 1e-6,
			Vocab: 1024, Type: quant.Q4_K, Seed: 1}, nil
	}
	return Spec{}, fmt.Errorf("%w: unknown preset %q (have %s)", ErrSpec, name, strings.Join(Presets, ", "))
}

// ParseType parses a --type value: a ggml type name (Q4_K, Q8_0, F16, ...)
// or "Q4_K_M" for the mix. It returns the type and whether the mix was asked.
func ParseType(s string) (quant.Type, bool, error) {
	if strings.EqualFold(s, "Q4_K_M") {
		return quant.Q4_K, true, nil
	}
	t, err := quant.ParseType(s)
	if err != nil {
		return 0, false, fmt.Errorf("%w: %v", ErrSpec, err)
	}
	return t, false, nil
}

// MaxLayers bounds Spec.Layers: llama.cpp's LLAMA_MAX_LAYERS (src/llama-hparams.h).
const MaxLayers = 512

func (s Spec) check() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrSpec}, a...)...) }
	switch {
	case s.Layers > MaxLayers:
		return bad("%d layers: at most %d (llama.cpp's LLAMA_MAX_LAYERS)", s.Layers, MaxLayers)
	case s.Layers <= 0 || s.Embd <= 0 || s.Heads <= 0 || s.HeadsKV <= 0 || s.HeadDim <= 0:
		return bad("layers %d, embd %d, heads %d/%d, head dim %d", s.Layers, s.Embd, s.Heads, s.HeadsKV, s.HeadDim)
	case s.Heads%s.HeadsKV != 0 || s.HeadDim%2 != 0:
		return bad("heads %d / kv heads %d, head dim %d", s.Heads, s.HeadsKV, s.HeadDim)
	case s.Experts <= 0 || s.ExpertsUsed <= 0 || s.ExpertsUsed > s.Experts || s.ExpertFF <= 0:
		return bad("experts %d, used %d, ffn %d", s.Experts, s.ExpertsUsed, s.ExpertFF)
	case s.Context <= 0 || s.Vocab <= 0:
		return bad("context %d, vocab %d", s.Context, s.Vocab)
	case !s.Type.Supported():
		return bad("type %v cannot be computed with", s.Type)
	}
	for _, cols := range []int{s.Embd, s.ExpertFF, s.Heads * s.HeadDim} {
		for _, t := range []quant.Type{s.Type, quant.Q6_K} {
			if t == quant.Q6_K && !s.Mix {
				continue
			}
			if _, err := t.RowBytes(cols); err != nil {
				return bad("row length %d: %v", cols, err)
			}
		}
	}
	return nil
}

// tensorSpec is one tensor to generate: rows x cols (x n stacked), drawn
// from N(mean, std^2) and stored as typ.
type tensorSpec struct {
	name       string
	typ        quant.Type
	dims       []uint64
	rows, cols int // rows counts every stacked row
	mean, std  float32
	data       []byte
}

// Build generates the model described by s into a GGUF writer. Generation
// is deterministic in s (each tensor has its own PCG stream derived from
// the seed and its name) and runs on all CPUs. Tensors of more than 2^22
// elements are assembled from a pool of 256 independently drawn quantized
// rows (picked at random per row), so a 30B-shaped layer takes seconds; all
// smaller tensors are drawn element by element. Errors wrap ErrSpec.
func Build(s Spec) (*gguf.Writer, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	tc := tokenizer.DefaultConfig(s.Vocab)
	vocab := len(tc.Tokens)
	if vocab == 0 {
		return nil, fmt.Errorf("%w: empty tokenizer vocabulary", ErrSpec)
	}
	d, qd, kd := s.Embd, s.Heads*s.HeadDim, s.HeadsKV*s.HeadDim
	typ := func(big bool) quant.Type {
		if s.Mix && big {
			return quant.Q6_K
		}
		return s.Type
	}
	isd := func(n int) float32 { return float32(1 / math.Sqrt(float64(n))) }
	var ts []*tensorSpec
	add := func(name string, t quant.Type, mean, std float32, dims ...int) {
		ud := make([]uint64, len(dims))
		rows := 1
		for i, v := range dims {
			ud[i] = uint64(v)
			if i > 0 {
				rows *= v
			}
		}
		ts = append(ts, &tensorSpec{name: name, typ: t, dims: ud, rows: rows, cols: dims[0], mean: mean, std: std})
	}
	// Scales: the tied output head gives logits of std ~ 0.6*sqrt(d) ~ 10 for
	// d = 256 (the fixtures' logit std is ~9.7), so greedy steps are decided
	// by clear margins; the router's logits have std ~1.5 so expert choices
	// are far from uniform. attn_output and ffn_down_exps are 4x the
	// variance-preserving scale and the q/k norm weights ~2.5 (sharper
	// attention) so that the blocks, not the token's own embedding, decide
	// the next token: greedy text then varies instead of repeating one token.
	add("token_embd.weight", typ(true), 0, 0.6, d, vocab)
	add("output_norm.weight", quant.F32, 1, 0.1, d)
	for l := range s.Layers {
		b := func(n string) string { return fmt.Sprintf("blk.%d.%s.weight", l, n) }
		late := l >= s.Layers/2
		add(b("attn_norm"), quant.F32, 1, 0.1, d)
		add(b("attn_q"), typ(false), 0, isd(d), d, qd)
		add(b("attn_k"), typ(false), 0, isd(d), d, kd)
		add(b("attn_v"), typ(late), 0, isd(d), d, kd)
		add(b("attn_output"), typ(false), 0, 4*isd(qd), qd, d)
		add(b("attn_q_norm"), quant.F32, 2.5, 0.5, s.HeadDim)
		add(b("attn_k_norm"), quant.F32, 2.5, 0.5, s.HeadDim)
		add(b("ffn_norm"), quant.F32, 1, 0.1, d)
		add(b("ffn_gate_inp"), quant.F32, 0, 1.5*isd(d), d, s.Experts)
		add(b("ffn_gate_exps"), typ(false), 0, isd(d), d, s.ExpertFF, s.Experts)
		add(b("ffn_up_exps"), typ(false), 0, isd(d), d, s.ExpertFF, s.Experts)
		add(b("ffn_down_exps"), typ(late), 0, 4*isd(s.ExpertFF), s.ExpertFF, d, s.Experts)
	}

	var wg sync.WaitGroup
	errs := make([]error, len(ts))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, t := range ts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = t.generate(s.Seed)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	w := gguf.NewWriter()
	a := "qwen3moe."
	w.SetString("general.architecture", "qwen3moe")
	w.SetString("general.name", s.Name)
	w.SetUint32("general.file_type", fileType(s))
	w.SetUint32("general.quantization_version", 2)
	w.SetUint32(a+"context_length", uint32(s.Context))
	w.SetUint32(a+"embedding_length", uint32(d))
	w.SetUint32(a+"block_count", uint32(s.Layers))
	w.SetUint32(a+"attention.head_count", uint32(s.Heads))
	w.SetUint32(a+"attention.head_count_kv", uint32(s.HeadsKV))
	w.SetUint32(a+"attention.key_length", uint32(s.HeadDim))
	w.SetUint32(a+"attention.value_length", uint32(s.HeadDim))
	w.SetFloat32(a+"rope.freq_base", s.RopeBase)
	w.SetFloat32(a+"attention.layer_norm_rms_epsilon", s.NormEps)
	w.SetUint32(a+"expert_count", uint32(s.Experts))
	w.SetUint32(a+"expert_used_count", uint32(s.ExpertsUsed))
	w.SetUint32(a+"expert_feed_forward_length", uint32(s.ExpertFF))
	w.SetString("tokenizer.ggml.model", "gpt2")
	w.SetString("tokenizer.ggml.pre", tc.Pre)
	w.SetStrings("tokenizer.ggml.tokens", tc.Tokens)
	types := tc.Types
	if len(types) == 0 {
		types = make([]int32, vocab)
		for i := range types {
			types[i] = tokenizer.TypeNormal
		}
	}
	w.SetInt32s("tokenizer.ggml.token_type", types)
	w.SetStrings("tokenizer.ggml.merges", tc.Merges)
	if tc.BOS >= 0 {
		w.SetUint32("tokenizer.ggml.bos_token_id", uint32(tc.BOS))
	}
	if tc.EOS >= 0 {
		w.SetUint32("tokenizer.ggml.eos_token_id", uint32(tc.EOS))
	}
	w.SetBool("tokenizer.ggml.add_bos_token", tc.AddBOS)
	w.SetBool("tokenizer.ggml.add_eos_token", tc.AddEOS)
	for _, t := range ts {
		if err := w.AddTensor(t.name, t.typ, t.dims, t.data); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// fileType returns general.file_type (enum llama_ftype in include/llama.h).
func fileType(s Spec) uint32 {
	if s.Mix {
		return 15 // LLAMA_FTYPE_MOSTLY_Q4_K_M
	}
	ft := map[quant.Type]uint32{quant.F32: 0, quant.F16: 1, quant.Q4_0: 2, quant.Q4_1: 3, quant.Q8_0: 7,
		quant.Q5_0: 8, quant.Q5_1: 9, quant.Q4_K: 14, quant.Q5_K: 16, quant.Q6_K: 18, quant.BF16: 32}
	return ft[s.Type] // Q4_K: 14 = Q4_K_S (all Q4_K), Q5_K: 16 = Q5_K_S
}

// poolRows is the number of distinct rows a large tensor is assembled from.
const poolRows = 256

// bigTensor is the element count above which a tensor is pooled.
const bigTensor = 1 << 22

func (t *tensorSpec) generate(seed uint64) error {
	h := fnv.New64a()
	h.Write([]byte(t.name))
	rng := rand.New(rand.NewPCG(seed, h.Sum64()))
	rb, err := t.typ.RowBytes(t.cols)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrSpec, t.name, err)
	}
	draw := func(n int) ([]byte, error) {
		x := make([]float32, n*t.cols)
		for i := range x {
			x[i] = t.mean + t.std*float32(rng.NormFloat64())
		}
		out := make([]byte, n*rb)
		if err := quant.Quantize(t.typ, x, out); err != nil {
			return nil, fmt.Errorf("modelgen: %s: %w", t.name, err)
		}
		return out, nil
	}
	if t.rows*t.cols <= bigTensor {
		t.data, err = draw(t.rows)
		return err
	}
	pool, err := draw(poolRows)
	if err != nil {
		return err
	}
	t.data = make([]byte, t.rows*rb)
	for r := range t.rows {
		p := rng.IntN(poolRows)
		copy(t.data[r*rb:(r+1)*rb], pool[p*rb:(p+1)*rb])
	}
	return nil
}

var tiny struct {
	once sync.Once
	data []byte
	err  error
}

// Tiny returns the bytes of the GGUF file of Preset("tiny"), generated on
// first use and cached in memory (callers must not modify them). Parse them
// with gguf.Parse to run commands without a model file.
func Tiny() ([]byte, error) {
	tiny.once.Do(func() {
		s, err := Preset("tiny")
		if err != nil {
			tiny.err = err
			return
		}
		tiny.data, tiny.err = Bytes(s)
	})
	return tiny.data, tiny.err
}

// Bytes generates the model described by s (Build) and returns its whole
// GGUF file in memory, ready for gguf.Parse. Errors wrap ErrSpec or come from
// the writer.
func Bytes(s Spec) ([]byte, error) {
	w, err := Build(s)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// Describe returns a one-line human summary of s.
func Describe(s Spec) string {
	t := s.Type.String()
	if s.Mix {
		t = "Q4_K_M mix"
	}
	names := []string{fmt.Sprintf("%d layers", s.Layers), fmt.Sprintf("d %d", s.Embd),
		fmt.Sprintf("heads %d/%d x %d", s.Heads, s.HeadsKV, s.HeadDim),
		fmt.Sprintf("experts %d top-%d ffn %d", s.Experts, s.ExpertsUsed, s.ExpertFF), t}
	return s.Name + ": " + strings.Join(names, ", ")
}
