// Package modelgen writes GGUF models of llama.cpp's qwen3moe and qwen35moe
// (Qwen3.5 MoE: Gated DeltaNet and gated full attention) architectures with
// deterministic random weights: the embedded tiny default model and
// benchmark models with real Qwen3-30B-A3B, Qwen3.5-35B-A3B and
// Qwen3.5-122B-A10B layer shapes. The files carry the metadata keys
// llama.cpp reads for the architecture (the same keys as the fixtures, see
// fixtures/README.md and fixtures/qwen35moe/README.md) and a small
// byte-level BPE vocabulary from tokenizer.DefaultConfig. BuildFrom writes
// the same layout with given (trained) weights and tokenizer: the embedded
// demo model (engine/demomodel) is made that way.
//
// Each architecture is one file (qwen3moe.go, qwen35moe.go) that registers
// its generator: the Spec fields it checks, the metadata keys and per-layer
// tensors it writes; the embedding, output head, tokenizer keys and the
// drawing of weights are shared. engine/model's file of the same name loads
// what it writes.
//
// The bytes depend only on the Spec: not on GOARCH, GOAMD64, the number of
// CPUs or the Go version's math/rand/v2 (see stream), as long as the quant
// package's quantizers are themselves free of fused multiply-adds.
package modelgen

import (
	"bytes"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// ErrSpec reports an invalid Spec or unknown preset.
var ErrSpec = errors.New("modelgen: invalid spec")

// Spec describes a model to generate. Sizes are element counts. The fields
// marked with an architecture are read by that architecture's generator
// only (its file: qwen3moe.go, qwen35moe.go).
type Spec struct {
	Name        string  // general.name
	Arch        string  // general.architecture: one of Architectures (ArchQwen3MoE when empty)
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

	// FullAttnInterval (qwen35moe: full_attention_interval): layer il has
	// full attention when (il+1) % FullAttnInterval == 0, Gated DeltaNet
	// otherwise (llama.cpp's is_recr).
	FullAttnInterval int
	SSMConv          int    // qwen35moe ssm.conv_kernel: taps of the causal depthwise conv
	SSMState         int    // qwen35moe ssm.state_size: head_k_dim = head_v_dim of the DeltaNet heads
	SSMGroups        int    // qwen35moe ssm.group_count: DeltaNet K (and Q) heads
	SSMDtRank        int    // qwen35moe ssm.time_step_rank: DeltaNet V heads (a multiple of SSMGroups)
	SSMInner         int    // qwen35moe ssm.inner_size: SSMState * SSMDtRank
	RopeDim          int    // qwen35moe rope.dimension_count: rotated dims per head (0: HeadDim)
	RopeSections     [4]int // qwen35moe rope.dimension_sections (IMROPE sections, in rotated pairs)
	SharedFF         int    // qwen35moe expert_shared_feed_forward_length
	// NextN (qwen35moe nextn_predict_layers, 0 or 1): multi-token-prediction
	// blocks written after the Layers main ones (block_count = Layers +
	// NextN), as llama.cpp's converter writes Qwen3.5's MTP head: a gated
	// full-attention block with the MoE and shared expert of a main layer,
	// plus nextn.eh_proj (ne [2*Embd, Embd]), nextn.enorm, nextn.hnorm and
	// nextn.shared_head_norm ([Embd]); the head's embedding and output
	// fall back to token_embd and the model's output (llama.cpp
	// src/models/qwen35moe.cpp load_block_mtp). Loaded and run by
	// engine/model's MTP draft head (engine/model/mtp.go).
	NextN int

	// UntiedOutput writes an output.weight LM head of its own; by default
	// the head is tied to token_embd (no output.weight, as in the fixtures).
	UntiedOutput bool
	// FusedGateUp writes each layer's routed experts' gate and up matrices
	// as one ffn_gate_up_exps tensor, ne [Embd, 2*ExpertFF, Experts] (per
	// expert its ExpertFF gate rows, then its ExpertFF up rows), instead of
	// ffn_gate_exps and ffn_up_exps. The weights are the same bytes as in
	// the separate layout.
	FusedGateUp bool

	// Type is the type of every weight matrix (norms, the routers and the
	// DeltaNet's conv, dt and A stay F32). Mix selects a llama.cpp
	// Q4_K_M-like mix instead: Type (Q4_K) with Q6_K for token_embd and the
	// output head and, in some layers, attn_v and ffn_down_exps (qwen3moe:
	// the second half of the layers, as in the fixture model C; qwen35moe:
	// attn_v/attn_qkv, ffn_down_exps and ffn_down_shexp where llama-quantize's
	// use_more_bits holds, as in fixtures/qwen35moe). Mixed matrices whose
	// rows are not a multiple of 256 fall back as llama-quantize does:
	// Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0, then F16.
	Type quant.Type
	Mix  bool   // the Q4_K_M-like mix (see Type)
	Seed uint64 // seed of every tensor's random stream
}

// Presets names the specs Preset knows.
var Presets = []string{"tiny", "qwen3-30b-a3b", "tiny-qwen35moe", "qwen3.5-35b-a3b", "qwen3.5-122b-a10b"}

// Preset returns a named spec. Errors wrap ErrSpec.
//
//   - "tiny": qwen3moe, d 256, 4 layers, 4 q / 2 kv heads of 64, 8 experts
//     top-2 of FFN 256, vocabulary 512, Q8_0: generates in well under a
//     second. Tiny returns its bytes.
//   - "qwen3-30b-a3b": Qwen3-30B-A3B layer shapes: d 2048, 32 q / 4 kv heads
//     of 128, 128 experts top-8 of FFN 768, 48 layers, context 40960, Q4_K;
//     vocabulary 1024 instead of 151936.
//   - "tiny-qwen35moe": qwen35moe with the hyperparameters of
//     fixtures/qwen35moe/tiny-qwen35moe-F16.gguf except the vocabulary (512)
//     and the type (Q8_0): d 256, 4 layers (0-2 Gated DeltaNet, 3 full
//     attention), 4 q / 2 kv heads of 64 with 16 rotated dims in sections
//     [3,3,2,0], DeltaNet conv 4, state 64, 2 K / 4 V heads, 16 experts top-4
//     of FFN 128 and a shared expert of FFN 256. Every matrix row is a
//     multiple of 32 elements (Q8_0, Q4_0, ... and F16 work; K-quants need
//     the Q4_K_M mix's fallbacks). TinyQwen35MoE returns its bytes.
//   - "qwen3.5-35b-a3b": Qwen/Qwen3.5-35B-A3B's text model
//     (https://huggingface.co/Qwen/Qwen3.5-35B-A3B/blob/main/config.json,
//     text_config): 40 layers, full_attention_interval 4, d 2048, 16 q / 2
//     kv heads of 256, partial_rotary_factor 0.25 (64 rotated dims),
//     mrope_section [11,11,10], rope_theta 1e7, linear_conv_kernel_dim 4,
//     16 key / 32 value heads of 128, 256 experts top-8 of FFN 512, shared
//     expert FFN 512, context 262144, untied LM head; Q4_K, vocabulary 1024
//     instead of 248320.
//   - "qwen3.5-122b-a10b": Qwen/Qwen3.5-122B-A10B's text model
//     (https://huggingface.co/Qwen/Qwen3.5-122B-A10B/blob/main/config.json):
//     48 layers, interval 4, d 3072, 32 q / 2 kv heads of 256 (64 rotated
//     dims, sections [11,11,10], theta 1e7), conv 4, 16 key / 64 value heads
//     of 128, 256 experts top-8 of FFN 1024 (5.3 MB per expert in Q4_K),
//     shared expert FFN 1024, context 262144, untied LM head; Q4_K,
//     vocabulary 1024. Layer counts 40 and 48 are also llama.cpp's
//     LLM_TYPE_35B_A3B and LLM_TYPE_122B_A10B (qwen35moe load_arch_hparams).
//
// The two Qwen3.5 shapes were taken from the configs as mirrored in public
// repositories (slime's scripts/models/qwen3.5-35B-A3B.sh and
// qwen3.5-122B-A10B.sh, and model tables quoting the config.json values),
// not from the Hugging Face pages themselves. A full 35B-A3B file is about
// 18 GB and a 122B-A10B one about 65 GB: use Spec.Layers (genmodel
// --layers) for smaller ones.
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
	case "tiny-qwen35moe":
		return Spec{Name: "kvasir-tiny-qwen35moe", Arch: ArchQwen35MoE, Layers: 4, Embd: 256,
			Heads: 4, HeadsKV: 2, HeadDim: 64, Experts: 16, ExpertsUsed: 4, ExpertFF: 128, Context: 4096,
			RopeBase: 1e7, NormEps: 1e-6, Vocab: 512,
			FullAttnInterval: 4, SSMConv: 4, SSMState: 64, SSMGroups: 2, SSMDtRank: 4, SSMInner: 256,
			RopeDim: 16, RopeSections: [4]int{3, 3, 2, 0}, SharedFF: 256,
			Type: quant.Q8_0, Seed: 1}, nil
	case "qwen3.5-35b-a3b":
		return Spec{Name: "kvasir-qwen3.5-35b-a3b-shape", Arch: ArchQwen35MoE, Layers: 40, Embd: 2048,
			Heads: 16, HeadsKV: 2, HeadDim: 256, Experts: 256, ExpertsUsed: 8, ExpertFF: 512, Context: 262144,
			RopeBase: 1e7, NormEps: 1e-6, Vocab: 1024,
			FullAttnInterval: 4, SSMConv: 4, SSMState: 128, SSMGroups: 16, SSMDtRank: 32, SSMInner: 4096,
			RopeDim: 64, RopeSections: [4]int{11, 11, 10, 0}, SharedFF: 512, UntiedOutput: true,
			Type: quant.Q4_K, Seed: 1}, nil
	case "qwen3.5-122b-a10b":
		return Spec{Name: "kvasir-qwen3.5-122b-a10b-shape", Arch: ArchQwen35MoE, Layers: 48, Embd: 3072,
			Heads: 32, HeadsKV: 2, HeadDim: 256, Experts: 256, ExpertsUsed: 8, ExpertFF: 1024, Context: 262144,
			RopeBase: 1e7, NormEps: 1e-6, Vocab: 1024,
			FullAttnInterval: 4, SSMConv: 4, SSMState: 128, SSMGroups: 16, SSMDtRank: 64, SSMInner: 8192,
			RopeDim: 64, RopeSections: [4]int{11, 11, 10, 0}, SharedFF: 1024, UntiedOutput: true,
			Type: quant.Q4_K, Seed: 1}, nil
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

// arch returns the architecture, ArchQwen3MoE when Arch is empty.
func (s Spec) arch() string {
	if s.Arch == "" {
		return ArchQwen3MoE
	}
	return s.Arch
}

// ropeDim returns rope.dimension_count: RopeDim, or HeadDim when 0.
func (s Spec) ropeDim() int {
	if s.RopeDim == 0 {
		return s.HeadDim
	}
	return s.RopeDim
}

// Recurrent reports whether layer il is a recurrent ("recurrent", llama.cpp's
// is_recr) layer, as the architecture's generator says: for qwen35moe a
// Gated DeltaNet layer, when (il+1) % FullAttnInterval != 0; never for
// qwen3moe or an unknown architecture.
func (s Spec) Recurrent(il int) bool {
	g := generators[s.arch()]
	return g != nil && g.recurrent != nil && g.recurrent(s, il)
}

// check validates s: the architecture is registered, the common sizes,
// the architecture's own fields (generator.check), and that every matrix's
// rows can be stored in its type. Errors wrap ErrSpec.
func (s Spec) check() error {
	bad := func(f string, a ...any) error { return fmt.Errorf("%w: "+f, append([]any{ErrSpec}, a...)...) }
	g := generators[s.arch()]
	switch {
	case g == nil:
		return bad("architecture %q: want one of %s", s.Arch, strings.Join(Architectures(), ", "))
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
	case s.NextN < 0 || s.NextN > 1 || (s.NextN > 0 && s.arch() != ArchQwen35MoE):
		return bad("nextn_predict_layers %d: want 0, or 1 on %s", s.NextN, ArchQwen35MoE)
	case !s.Type.Supported():
		return bad("type %v: the engine does not compute it (Q2_K, Q3_K and IQ types are refused; use Q4_K or above)", s.Type)
	}
	if g.check != nil {
		if err := g.check(s); err != nil {
			return err
		}
	}
	ts, _ := s.plan(1)
	for _, t := range ts {
		if _, err := t.typ.RowBytes(t.cols); err != nil {
			return bad("%s: rows of %d elements cannot be stored as %s (block size %d); choose another type",
				t.name, t.cols, t.typ, t.typ.BlockSize())
		}
	}
	return nil
}

// mixType returns the type of a weight matrix with rows of cols elements:
// Type, or for the mix Type (Q6_K when more bits are asked) with
// llama-quantize's fallbacks when cols is not a multiple of the block size
// (llama_tensor_get_type, convert_incompatible_tensor).
func (s Spec) mixType(cols int, more bool) quant.Type {
	if !s.Mix {
		return s.Type
	}
	t := s.Type
	if more {
		t = quant.Q6_K
	}
	if cols%t.BlockSize() == 0 {
		return t
	}
	switch t {
	case quant.Q4_K:
		t = quant.Q5_0
	case quant.Q5_K:
		t = quant.Q5_1
	case quant.Q6_K:
		t = quant.Q8_0
	}
	if cols%t.BlockSize() != 0 {
		t = quant.F16
	}
	return t
}

// useMoreBits is llama-quantize's use_more_bits (src/llama-quant.cpp): the
// layers of n that the Q4_K_M mix gives Q6_K attn_v and ffn_down.
func useMoreBits(i, n int) bool {
	return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2
}

// tensorSpec is one tensor to draw: rows x cols (rows counts every stacked
// row), each element from N(mean, std^2), or uniform in [lo, hi) when
// uniform is set, stored as typ. Its random stream is named after name.
type tensorSpec struct {
	name       string
	typ        quant.Type
	dims       []uint64
	rows, cols int
	mean, std  float32
	uniform    bool
	lo, hi     float32
	data       []byte
}

// outTensor is one tensor of the file: a drawn tensorSpec, or the fused
// ffn_gate_up_exps made of two (gate, up) with experts stacked matrices.
type outTensor struct {
	name    string
	typ     quant.Type
	dims    []uint64
	parts   []*tensorSpec
	experts int
}

// plan lists the tensors of s (with a vocabulary of vocab tokens) in file
// order: the drawn ones and the file's ones; the architecture's generator
// adds each layer's. It assumes the sizes checked by check, except the row
// lengths, which check validates on its result.
func (s Spec) plan(vocab int) ([]*tensorSpec, []outTensor) {
	var p planner
	d := s.Embd
	// Scales: the tied output head gives logits of std ~ 0.6*sqrt(d) ~ 10 for
	// d = 256 (the fixtures' logit std is ~9.7), so greedy steps are decided
	// by clear margins; the router's logits have std ~1.5 so expert choices
	// are far from uniform. attn_output, ssm_out and ffn_down_exps are 4x
	// the variance-preserving scale and the q/k norm weights ~2.5 (sharper
	// attention) so that the blocks, not the token's own embedding, decide
	// the next token: greedy text then varies instead of repeating one token.
	p.add("token_embd.weight", s.mixType(d, true), 0, 0.6, d, vocab)
	p.add("output_norm.weight", quant.F32, 1, 0.1, d)
	if s.UntiedOutput {
		p.add("output.weight", s.mixType(d, true), 0, 0.6, d, vocab)
	}
	g := generators[s.arch()]
	for il := range s.Layers + s.NextN {
		g.layer(s, &p, il)
	}
	return p.ts, p.out
}

// Build generates the model described by s into a GGUF writer. Generation
// is deterministic in s (each tensor has its own random stream derived from
// the seed and its name, and the values are the same on every
// architecture) and runs on all CPUs. Tensors of more than 2^22 elements
// are assembled from a pool of 256 independently drawn quantized rows
// (picked at random per row), so a 30B-shaped layer takes seconds; all
// smaller tensors are drawn element by element. Errors wrap ErrSpec.
func Build(s Spec) (*gguf.Writer, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	return buildWith(s, tokenizer.DefaultConfig(s.Vocab), func(t *tensorSpec) error { return t.generate(s.Seed) })
}

// Weights supplies BuildFrom with one tensor's values: name is its GGUF
// name and dims its ggml ne (dims[0] the row length); it returns the
// product of dims float32 values, rows in order (for a stack of expert
// matrices ne [cols, rows, experts]: expert 0's rows first, as PyTorch's
// row-major [experts, rows, cols]). A layer's fused ffn_gate_up_exps
// (Spec.FusedGateUp) is asked for as its ffn_gate_exps and ffn_up_exps.
type Weights func(name string, dims []uint64) ([]float32, error)

// BuildFrom writes the model described by s with the tokenizer tc and the
// values weights gives (a trained model) instead of random ones: the same
// metadata keys, tensor names, shapes, order and types as Build, each
// tensor quantized from its float32 values to its type. s.Vocab must be
// len(tc.Tokens), and s.Seed is not used. Errors wrap ErrSpec for an
// invalid spec, vocabulary or wrong count of values, or are weights'.
func BuildFrom(s Spec, tc tokenizer.Config, weights Weights) (*gguf.Writer, error) {
	if weights == nil {
		return nil, fmt.Errorf("%w: no weights", ErrSpec)
	}
	if s.Vocab != len(tc.Tokens) {
		return nil, fmt.Errorf("%w: vocab %d, but the tokenizer has %d tokens", ErrSpec, s.Vocab, len(tc.Tokens))
	}
	if err := s.check(); err != nil {
		return nil, err
	}
	return buildWith(s, tc, func(t *tensorSpec) error {
		x, err := weights(t.name, t.dims)
		if err != nil {
			return err
		}
		if len(x) != t.rows*t.cols {
			return fmt.Errorf("%w: %s: %d values, want %d (ne %v)", ErrSpec, t.name, len(x), t.rows*t.cols, t.dims)
		}
		rb, err := t.typ.RowBytes(t.cols)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrSpec, t.name, err)
		}
		t.data = make([]byte, t.rows*rb)
		if err := quant.Quantize(t.typ, x, t.data); err != nil {
			return fmt.Errorf("modelgen: %s: %w", t.name, err)
		}
		return nil
	})
}

// buildWith writes the model s (checked) with the tokenizer tc, filling each
// planned tensor's data with fill (on all CPUs).
func buildWith(s Spec, tc tokenizer.Config, fill func(t *tensorSpec) error) (*gguf.Writer, error) {
	vocab := len(tc.Tokens)
	if vocab == 0 {
		return nil, fmt.Errorf("%w: empty tokenizer vocabulary", ErrSpec)
	}
	ts, outs := s.plan(vocab)

	var wg sync.WaitGroup
	errs := make([]error, len(ts))
	sem := make(chan struct{}, runtime.GOMAXPROCS(0))
	for i, t := range ts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			errs[i] = fill(t)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	w := metadata(s, tc)
	for _, o := range outs {
		if err := w.AddTensor(o.name, o.typ, o.dims, o.assemble()); err != nil {
			return nil, err
		}
	}
	return w, nil
}

// metadata returns a Writer holding the metadata of the model s (checked)
// with the tokenizer tc (non-empty), in file order, and no tensors.
func metadata(s Spec, tc tokenizer.Config) *gguf.Writer {
	vocab := len(tc.Tokens)
	w := gguf.NewWriter()
	a := s.arch() + "."
	w.SetString("general.architecture", s.arch())
	w.SetString("general.name", s.Name)
	w.SetUint32("general.file_type", fileType(s))
	w.SetUint32("general.quantization_version", 2)
	generators[s.arch()].metadata(s, w, a)
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
	return w
}

// Lazy is the model of a Spec as Build writes it, with each tensor drawn
// when asked instead of all held in memory: the file's layout at once, a
// tensor's bytes on demand. It lets a caller derive a file from a model
// that fits neither in memory nor on disk (a full Qwen3.5-122B-A10B shape
// is ~65 GB): `backbone genmodel --backbone-only` writes the backbone-only
// file (engine/slice.WriteBackboneOnlyFrom) of a preset directly.
type Lazy struct {
	// File is the layout of the file Build(s) writes (gguf.Writer.Layout):
	// its metadata, tensor infos and offsets and DataOffset, equal to what
	// gguf.Parse reads from that file; it holds no tensor data (its Tensor
	// method fails with gguf.ErrNoData: use Lazy.Tensor).
	File *gguf.File
	// Size is the size in bytes of the file Build(s) writes.
	Size int64

	seed uint64
	outs map[string]outTensor
}

// NewLazy plans the model described by s without drawing any weight.
// Errors wrap ErrSpec or come from the gguf writer.
func NewLazy(s Spec) (*Lazy, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	tc := tokenizer.DefaultConfig(s.Vocab)
	if len(tc.Tokens) == 0 {
		return nil, fmt.Errorf("%w: empty tokenizer vocabulary", ErrSpec)
	}
	_, outs := s.plan(len(tc.Tokens))
	w := metadata(s, tc)
	l := &Lazy{seed: s.Seed, outs: make(map[string]outTensor, len(outs))}
	for _, o := range outs {
		if err := w.AddTensorInfo(o.name, o.typ, o.dims); err != nil {
			return nil, err
		}
		l.outs[o.name] = o
	}
	f, err := w.Layout()
	if err != nil {
		return nil, err
	}
	l.File, l.Size = f, int64(f.DataOffset+w.DataSize())
	return l, nil
}

// Tensor draws the named tensor of the model: the same bytes as in the
// file Build writes (each tensor's random stream depends only on the seed
// and its name). Every call draws anew on the calling goroutine (callers
// keep what they need) and is safe for concurrent use. Errors wrap
// gguf.ErrNoTensor for a name the model does not have, or ErrSpec.
func (l *Lazy) Tensor(name string) ([]byte, error) {
	o, ok := l.outs[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q", gguf.ErrNoTensor, name)
	}
	parts := make([]*tensorSpec, len(o.parts))
	for i, p := range o.parts {
		c := *p // o.parts are shared: draw into a copy
		c.data = nil
		if err := c.generate(l.seed); err != nil {
			return nil, err
		}
		parts[i] = &c
	}
	o.parts = parts
	return o.assemble(), nil
}

// assemble returns the tensor's bytes: its one part's, or the fused
// gate_up's, built per expert from the gate's then the up's rows (the
// parts' own buffers are released).
func (o outTensor) assemble() []byte {
	if len(o.parts) == 1 {
		return o.parts[0].data
	}
	g, u := o.parts[0], o.parts[1]
	gb, ub := len(g.data)/o.experts, len(u.data)/o.experts
	data := make([]byte, 0, len(g.data)+len(u.data))
	for e := range o.experts {
		data = append(data, g.data[e*gb:(e+1)*gb]...)
		data = append(data, u.data[e*ub:(e+1)*ub]...)
	}
	g.data, u.data = nil, nil
	return data
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

// value returns the next element of t from r. The float32 conversions
// round each product on its own, so that no compiler fuses a
// multiply-add (the values are the same bits on every GOARCH).
func (t *tensorSpec) value(r stream) float32 {
	if t.uniform {
		return t.lo + float32((t.hi-t.lo)*r.uniform())
	}
	return float32(t.std*float32(r.normal())) + t.mean
}

func (t *tensorSpec) generate(seed uint64) error {
	r := newStream(seed, t.name)
	rb, err := t.typ.RowBytes(t.cols)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrSpec, t.name, err)
	}
	draw := func(n int) ([]byte, error) {
		x := make([]float32, n*t.cols)
		for i := range x {
			x[i] = t.value(r)
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
	for row := range t.rows {
		p := r.intN(poolRows)
		copy(t.data[row*rb:(row+1)*rb], pool[p*rb:(p+1)*rb])
	}
	return nil
}

// cachedModel holds a preset's bytes generated once.
type cachedModel struct {
	once sync.Once
	data []byte
	err  error
}

func (c *cachedModel) get(preset string) ([]byte, error) {
	c.once.Do(func() {
		s, err := Preset(preset)
		if err != nil {
			c.err = err
			return
		}
		c.data, c.err = Bytes(s)
	})
	return c.data, c.err
}

var tiny, tinyQwen35 cachedModel

// Tiny returns the bytes of the GGUF file of Preset("tiny") (qwen3moe),
// generated on first use and cached in memory (callers must not modify
// them). Parse them with gguf.Parse to run commands without a model file.
func Tiny() ([]byte, error) { return tiny.get("tiny") }

// TinyQwen35MoE returns the bytes of the GGUF file of
// Preset("tiny-qwen35moe"), generated on first use and cached in memory
// like Tiny (callers must not modify them).
func TinyQwen35MoE() ([]byte, error) { return tinyQwen35.get("tiny-qwen35moe") }

// DefaultPreset is `backbone genmodel`'s default preset: a tiny model of
// the seed deployment's family (qwen35moe) with random weights. (The
// commands' default model is no longer generated: it is the trained
// engine/demomodel.)
const DefaultPreset = "tiny-qwen35moe"

// Bytes generates the model described by s (Build) and returns its whole
// GGUF file in memory, ready for gguf.Parse. Errors wrap ErrSpec or come from
// the writer.
func Bytes(s Spec) ([]byte, error) {
	w, err := Build(s)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	b.Grow(int(w.DataSize()) + 4<<20) // the data plus room for the header and metadata: one allocation, no regrowth
	if _, err := w.WriteTo(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// PresetFile generates preset name with its first layers layers and every
// weight matrix of type t (the benchmark models: e.g. 4 Q4_K layers of
// qwen3-30b-a3b), in memory, and parses it. Errors wrap ErrSpec or come
// from the writer or gguf.Parse.
func PresetFile(name string, layers int, t quant.Type) (*gguf.File, error) {
	s, err := Preset(name)
	if err != nil {
		return nil, err
	}
	s.Layers, s.Type = layers, t
	data, err := Bytes(s)
	if err != nil {
		return nil, err
	}
	return gguf.Parse(data)
}

// Describe returns a one-line human summary of s.
func Describe(s Spec) string {
	t := s.Type.String()
	if s.Mix {
		t = "Q4_K_M mix"
	}
	var names []string
	if g := generators[s.arch()]; g != nil {
		names = g.describe(s)
	} else {
		names = []string{fmt.Sprintf("unknown architecture %q", s.arch())}
	}
	names = append(names, t)
	if s.FusedGateUp {
		names = append(names, "fused gate_up")
	}
	if s.UntiedOutput {
		names = append(names, "untied output")
	}
	return s.Name + ": " + strings.Join(names, ", ")
}
