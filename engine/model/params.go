package model

import (
	"errors"
	"fmt"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// Architecture is the only GGUF general.architecture this package loads.
const Architecture = "qwen3moe"

// Sentinel errors; returned errors wrap one of them.
var (
	// ErrArchitecture: the file's general.architecture is not qwen3moe.
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
)

// Params are the hyperparameters of a qwen3moe model, read once from GGUF
// metadata with llama.cpp's defaults (src/llama-model.cpp, load_hparams, and
// src/llama-hparams.h at commit 3f545bec). Sizes are element counts.
type Params struct {
	Layers      int     // block_count
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
}

func readParams(f *gguf.File) (Params, error) {
	if a := f.Architecture(); a != Architecture {
		return Params{}, fmt.Errorf("%w: %q (want %q)", ErrArchitecture, a, Architecture)
	}
	var p Params
	key := func(k string) string { return Architecture + "." + k }
	var err error
	geti := func(k string, dst *int, def int, required bool) {
		if err != nil {
			return
		}
		v, e := f.Uint(key(k))
		switch {
		case e == nil:
			if v > 1<<30 {
				err = fmt.Errorf("%w: %s = %d", ErrMetadata, key(k), v)
				return
			}
			*dst = int(v)
		case errors.Is(e, gguf.ErrMissingKey) && !required:
			*dst = def
		default:
			err = fmt.Errorf("%w: %v", ErrMetadata, e)
		}
	}
	getf := func(k string, dst *float32, def float32, required bool) {
		if err != nil {
			return
		}
		v, e := f.Float(key(k))
		switch {
		case e == nil:
			*dst = float32(v)
		case errors.Is(e, gguf.ErrMissingKey) && !required:
			*dst = def
		default:
			err = fmt.Errorf("%w: %v", ErrMetadata, e)
		}
	}
	geti("block_count", &p.Layers, 0, true)
	geti("embedding_length", &p.Embd, 0, true)
	geti("context_length", &p.Context, 0, true)
	geti("attention.head_count", &p.Heads, 0, true)
	geti("attention.head_count_kv", &p.HeadsKV, p.Heads, false)
	if err == nil && p.Heads <= 0 {
		return p, fmt.Errorf("%w: head_count %d", ErrMetadata, p.Heads)
	}
	if err == nil {
		geti("attention.key_length", &p.HeadDim, p.Embd/p.Heads, false)
	}
	geti("attention.value_length", &p.HeadDimV, p.HeadDim, false)
	geti("rope.dimension_count", &p.RopeDim, p.HeadDim, false)
	geti("expert_count", &p.Experts, 0, true)
	geti("expert_used_count", &p.ExpertsUsed, 0, true)
	geti("expert_feed_forward_length", &p.ExpertFF, 0, false)
	getf("rope.freq_base", &p.RopeBase, 10000, false)
	getf("attention.layer_norm_rms_epsilon", &p.NormEps, 0, true)
	var factor float32
	getf("rope.scaling.factor", &factor, 0, false)
	if err != nil {
		return p, err
	}
	p.RopeScale = 1
	if st, e := f.String(key("rope.scaling.type")); e == nil && st != "none" && st != "linear" {
		return p, fmt.Errorf("%w: rope scaling %q is not supported", ErrMetadata, st)
	}
	if factor != 0 {
		p.RopeScale = 1 / factor
	}
	if p.ExpertFF == 0 {
		if ti, e := f.TensorInfo("blk.0.ffn_gate_exps.weight"); e == nil && len(ti.Dims) == 3 {
			p.ExpertFF = int(ti.Dims[1])
		}
	}
	// Each layer has 12 tensors: bound the layer count by the file before
	// anything is allocated per layer.
	if p.Layers > len(f.Tensors)/12 {
		return p, fmt.Errorf("%w: block_count %d but the file holds %d tensors", ErrMetadata, p.Layers, len(f.Tensors))
	}
	if ti, e := f.TensorInfo("token_embd.weight"); e == nil && len(ti.Dims) == 2 && ti.Dims[1] < 1<<31 {
		p.Vocab = int(ti.Dims[1])
	}
	return p, p.check()
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
