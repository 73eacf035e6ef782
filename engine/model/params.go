package model

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// Architecture is the first architecture this package loaded; Load accepts
// every name Architectures returns.
const Architecture = "qwen3moe"

// Sentinel errors; returned errors wrap one of them.
var (
	// ErrArchitecture: the file's general.architecture is not one
	// Architectures lists.
	ErrArchitecture = errors.New("model: unsupported architecture")
	// ErrMetadata: a hyperparameter key is missing, of the wrong type or
	// out of range.
	ErrMetadata = errors.New("model: bad hyperparameters")
	// ErrTensor: a tensor is missing or has the wrong type or shape.
	ErrTensor = errors.New("model: bad tensor")
	// ErrBatch: Forward rows are invalid (token out of range, position not
	// the sequence's next one, sequence of another model, logits buffer of
	// the wrong length).
	ErrBatch = errors.New("model: invalid batch")
	// ErrContext: a position at or beyond the context length.
	ErrContext = errors.New("model: context length exceeded")
	// ErrRewind: a Sequence with recurrent layers cannot go back to an
	// earlier non-zero length (its state holds no history), or its state was
	// lost by a failed Forward; Truncate(0) resets it.
	ErrRewind = errors.New("model: recurrent state cannot be rewound")
)

// Params are a model's hyperparameters, read once from GGUF metadata under
// the file's "<architecture>." key prefix with llama.cpp's defaults
// (src/llama-model.cpp load_hparams, src/models/<arch>.cpp
// load_arch_hparams and src/llama-hparams.h at commit 3f545bec). Sizes are
// element counts. Fields an architecture does not use are zero.
type Params struct {
	Arch        string  // general.architecture ("qwen3moe", "qwen35moe")
	Layers      int     // layers Forward runs: block_count - NextN
	Embd        int     // embedding_length (d_model)
	Heads       int     // attention.head_count
	HeadsKV     int     // attention.head_count_kv (default Heads)
	HeadDim     int     // attention.key_length (default Embd/Heads)
	HeadDimV    int     // attention.value_length (default HeadDim)
	Experts     int     // expert_count
	ExpertsUsed int     // expert_used_count (top-k)
	ExpertFF    int     // expert_feed_forward_length (default from ffn_gate_exps)
	Vocab       int     // rows of token_embd
	Context     int     // context_length: the largest position + 1 a sequence may use
	RopeDim     int     // rope.dimension_count (default HeadDim); leading dims of a head rotated
	RopeBase    float32 // rope.freq_base (default 10000)
	RopeScale   float32 // 1 / rope.scaling.factor for linear scaling (default 1)
	NormEps     float32 // attention.layer_norm_rms_epsilon (required, as in llama.cpp)

	// NextN is nextn_predict_layers: multi-token-prediction blocks stored
	// after the main ones (qwen35moe files converted with their MTP head).
	// llama.cpp's main graph does not run them, nor does Forward; their
	// routed experts are still part of the file's expert set.
	NextN int
	// ExpertLayers is block_count: the layers whose routed experts the file
	// holds (Layers + NextN), the layer range of the swarm's expert ids.
	ExpertLayers int

	// qwen35moe (Gated DeltaNet + gated attention + shared expert).
	RopeSections   [4]int // rope.dimension_sections (IMROPE; text uses one position for all)
	SharedFF       int    // expert_shared_feed_forward_length (0: no shared expert)
	AttnInterval   int    // full_attention_interval: layer il is recurrent unless (il+1)%AttnInterval == 0
	RecurrentCount int    // layers that are Gated DeltaNet (linear attention)
	SSMConv        int    // ssm.conv_kernel: causal depthwise convolution width
	SSMState       int    // ssm.state_size: head_k_dim = head_v_dim
	SSMGroups      int    // ssm.group_count: key/query heads
	SSMHeads       int    // ssm.time_step_rank: value heads
	SSMInner       int    // ssm.inner_size: SSMHeads * SSMState
}

// readParams reads the hyperparameters common to every registered
// architecture, then the architecture's own.
func readParams(f *gguf.File) (Params, *arch, *loader, error) {
	name := f.Architecture()
	a := archs[name]
	if a == nil {
		return Params{}, nil, nil, fmt.Errorf("%w: %q (this engine loads %s)", ErrArchitecture, name, strings.Join(Architectures(), ", "))
	}
	p := Params{Arch: name}
	l := &loader{f: f, prefix: name + "."}
	l.uint("block_count", &p.Layers, 0, true)
	l.uint("embedding_length", &p.Embd, 0, true)
	l.uint("context_length", &p.Context, 0, true)
	l.uint("attention.head_count", &p.Heads, 0, true)
	l.uint("attention.head_count_kv", &p.HeadsKV, p.Heads, false)
	if l.err == nil && p.Heads <= 0 {
		return p, a, l, fmt.Errorf("%w: %s = %d", ErrMetadata, l.key("attention.head_count"), p.Heads)
	}
	if l.err == nil {
		l.uint("attention.key_length", &p.HeadDim, p.Embd/p.Heads, false)
	}
	l.uint("attention.value_length", &p.HeadDimV, p.HeadDim, false)
	l.uint("rope.dimension_count", &p.RopeDim, p.HeadDim, false)
	l.uint("expert_count", &p.Experts, 0, true)
	l.uint("expert_used_count", &p.ExpertsUsed, 0, true)
	l.uint("expert_feed_forward_length", &p.ExpertFF, 0, false)
	l.float("rope.freq_base", &p.RopeBase, 10000, false)
	l.float("attention.layer_norm_rms_epsilon", &p.NormEps, 0, true)
	var factor float32
	l.float("rope.scaling.factor", &factor, 0, false)
	if l.err != nil {
		return p, a, l, l.err
	}
	p.RopeScale = 1
	if st, e := f.String(l.key("rope.scaling.type")); e == nil && st != "none" && st != "linear" {
		return p, a, l, fmt.Errorf("%w: rope scaling %q is not supported", ErrMetadata, st)
	}
	if factor != 0 {
		p.RopeScale = 1 / factor
	}
	if p.ExpertFF == 0 {
		if ti, e := f.TensorInfo("blk.0.ffn_down_exps.weight"); e == nil && len(ti.Dims) == 3 && ti.Dims[0] < 1<<30 {
			p.ExpertFF = int(ti.Dims[0])
		}
	}
	// Bound the layer count by the file before anything is allocated per
	// layer.
	if p.Layers > len(f.Tensors)/a.tensorsPerLayer {
		return p, a, l, fmt.Errorf("%w: block_count %d but the file holds %d tensors", ErrMetadata, p.Layers, len(f.Tensors))
	}
	if ti, e := f.TensorInfo("token_embd.weight"); e == nil && len(ti.Dims) == 2 && ti.Dims[1] < 1<<31 {
		p.Vocab = int(ti.Dims[1])
		// The tokenizer's vocabulary is token_embd's rows (llama.cpp's
		// llama_model::load_tensors creates token_embd as {n_embd,
		// n_vocab} with n_vocab from the tokenizer, and refuses another
		// shape): rows past it are ids no text has, rows short of it
		// fail at the first such token.
		if v, ok := f.Value("tokenizer.ggml.tokens"); ok && v.Len() != p.Vocab {
			return p, a, l, fmt.Errorf("%w: token_embd.weight has %d rows but tokenizer.ggml.tokens holds %d tokens", ErrMetadata, p.Vocab, v.Len())
		}
	}
	// Every blk.N tensor must belong to a layer: a block_count smaller
	// than the file's blocks would drop its last layers without a word
	// (llama.cpp: "wrong number of tensors"). Multi-token-prediction
	// blocks are counted in block_count.
	for _, ti := range f.Tensors {
		var n int
		if _, e := fmt.Sscanf(ti.Name, "blk.%d.", &n); e == nil && n >= p.Layers {
			return p, a, l, fmt.Errorf("%w: tensor %s is beyond block_count %d", ErrMetadata, ti.Name, p.Layers)
		}
	}
	p.ExpertLayers = p.Layers
	a.params(l, &p)
	if l.err != nil {
		return p, a, l, l.err
	}
	return p, a, l, p.check()
}

func (p Params) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrMetadata}, a...)...)
	}
	switch {
	case p.Layers <= 0 || p.Embd <= 0 || p.Context <= 0:
		return bad("block_count %d, embedding_length %d, context_length %d", p.Layers, p.Embd, p.Context)
	case p.HeadsKV <= 0 || p.Heads%p.HeadsKV != 0:
		return bad("head_count %d not a multiple of head_count_kv %d", p.Heads, p.HeadsKV)
	case p.HeadDim <= 0 || p.HeadDimV <= 0:
		return bad("key_length %d, value_length %d", p.HeadDim, p.HeadDimV)
	case p.RopeDim <= 0 || p.RopeDim > p.HeadDim || p.RopeDim%2 != 0:
		return bad("rope.dimension_count %d with key_length %d", p.RopeDim, p.HeadDim)
	case p.Experts <= 0 || p.ExpertsUsed <= 0 || p.ExpertsUsed > p.Experts:
		return bad("expert_count %d, expert_used_count %d", p.Experts, p.ExpertsUsed)
	case p.ExpertFF <= 0:
		return bad("expert_feed_forward_length %d", p.ExpertFF)
	case p.Vocab <= 0:
		return bad("vocabulary size %d (token_embd)", p.Vocab)
	case !(p.NormEps >= 0) || !(p.RopeBase > 0) || !(p.RopeScale > 0):
		return bad("eps %g, rope base %g, rope scale %g", p.NormEps, p.RopeBase, p.RopeScale)
	}
	return nil
}
