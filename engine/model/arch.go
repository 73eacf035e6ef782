package model

import (
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// arch is one architecture's entry in the registry: how to read its
// hyperparameters and tensors from a GGUF file into a Model, and which
// kind each layer is. Each architecture lives in a file of its own
// (qwen3moe.go, qwen35moe.go) and registers itself from init; the forward
// pass is shared (forward.go) and runs whatever blocks the loader filled
// in, dispatching on the kinds Load stored in each Block. Every function
// must be set.
type arch struct {
	name string
	// tensorsPerLayer is the fewest tensors a layer of this architecture
	// has; it bounds block_count by the file before anything is allocated.
	tensorsPerLayer int
	// params reads the architecture's hyperparameters (Params.Arch and the
	// common ones are already read) and checks them, failing l with
	// ErrMetadata.
	params func(l *loader, p *Params)
	// memory returns layer il's memory kind, which is its token mixer's:
	// block must set Block.Attn for MemoryKV, Block.Linear for
	// MemoryRecurrent. Called for il < Params.Layers after params.
	memory func(l *loader, p *Params, il int) MemoryKind
	// ffn returns layer il's feed-forward kind: block must set Block.MoE
	// (with its Router) for FFNMoE, Block.Dense for FFNDense. Called for
	// every il < Params.ExpertLayers (MTP blocks included): an FFNMoE
	// layer's routed experts are loaded before block is called, and become
	// Block.MoE.Experts after it.
	ffn func(p *Params, il int) FFNKind
	// block loads layer il's tensors into b, whose Memory and FFN are
	// already set; it fails l (ErrTensor, ErrMetadata) rather than return.
	block func(l *loader, p *Params, il int, b *Block)
	// mtp, when set, loads the multi-token-prediction block il (=
	// Params.Layers, nextn_predict_layers 1) into b (Memory MemoryKV, FFN
	// FFNMoE already set) the way block loads a main layer; Load adds the
	// block's nextn tensors (MTPHead). Nil: the architecture's MTP blocks,
	// if any, are not run.
	mtp func(l *loader, p *Params, il int, b *Block)
}

// noParams is arch.params for an architecture with no hyperparameters of
// its own.
func noParams(*loader, *Params) {}

// kvEveryLayer is arch.memory for an architecture whose every layer is
// softmax attention with a KV cache.
func kvEveryLayer(*loader, *Params, int) MemoryKind { return MemoryKV }

// moeEveryLayer is arch.ffn for an architecture whose every layer ends in
// a mixture of experts.
func moeEveryLayer(*Params, int) FFNKind { return FFNMoE }

var archs = map[string]*arch{}

// register adds a to the registry; called from each architecture file's
// init.
func register(a *arch) {
	if a.params == nil || a.memory == nil || a.ffn == nil || a.block == nil || a.tensorsPerLayer <= 0 {
		panic("model: architecture " + a.name + " registered without its loader functions")
	}
	if _, dup := archs[a.name]; dup {
		panic("model: architecture " + a.name + " registered twice")
	}
	archs[a.name] = a
}

// Architectures returns the general.architecture values Load accepts,
// sorted.
func Architectures() []string {
	names := make([]string, 0, len(archs))
	for n := range archs {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// loader reads one GGUF file's hyperparameters (keys under the file's own
// "<architecture>." prefix) and tensors, keeping the first error so that a
// loader function can read many values and check once.
type loader struct {
	f      *gguf.File
	prefix string // "<general.architecture>."
	err    error
	// recurrent holds attention.recurrent_layers when the file has it
	// (qwen35moe): one flag per layer.
	recurrent []bool
}

func (l *loader) fail(err error) {
	if l.err == nil {
		l.err = err
	}
}

// key returns the full metadata key of an architecture hyperparameter.
func (l *loader) key(k string) string { return l.prefix + k }

// uint reads the unsigned hyperparameter k into dst; a missing key is an
// error when required, else dst = def. Values above 2^30 are refused.
func (l *loader) uint(k string, dst *int, def int, required bool) {
	if l.err != nil {
		return
	}
	v, e := l.f.Uint(l.key(k))
	switch {
	case e == nil:
		if v > 1<<30 {
			l.fail(fmt.Errorf("%w: %s = %d", ErrMetadata, l.key(k), v))
			return
		}
		*dst = int(v)
	case errors.Is(e, gguf.ErrMissingKey) && !required:
		*dst = def
	default:
		l.fail(fmt.Errorf("%w: %v", ErrMetadata, e))
	}
}

// float reads the float hyperparameter k into dst (see uint).
func (l *loader) float(k string, dst *float32, def float32, required bool) {
	if l.err != nil {
		return
	}
	v, e := l.f.Float(l.key(k))
	switch {
	case e == nil:
		*dst = float32(v)
	case errors.Is(e, gguf.ErrMissingKey) && !required:
		*dst = def
	default:
		l.fail(fmt.Errorf("%w: %v", ErrMetadata, e))
	}
}

// ints reads the integer array hyperparameter k; ok is false when it is
// missing (and not required).
func (l *loader) ints(k string, required bool) (v []int64, ok bool) {
	if l.err != nil {
		return nil, false
	}
	v, e := l.f.Ints(l.key(k))
	switch {
	case e == nil:
		return v, true
	case errors.Is(e, gguf.ErrMissingKey) && !required:
		return nil, false
	default:
		l.fail(fmt.Errorf("%w: %v", ErrMetadata, e))
		return nil, false
	}
}

// has reports whether the file holds tensor name.
func (l *loader) has(name string) bool {
	_, err := l.f.TensorInfo(name)
	return err == nil
}

// tensor looks up name and checks its type is supported and its ggml ne.
func (l *loader) tensor(name string, dims ...uint64) gguf.Tensor {
	if l.err != nil {
		return gguf.Tensor{}
	}
	t, err := tensor(l.f, name, dims...)
	if err != nil {
		l.fail(err)
	}
	return t
}

// matrix loads a rows x cols weight (ggml ne [cols, rows]).
func (l *loader) matrix(name string, rows, cols int) Weight {
	t := l.tensor(name, uint64(cols), uint64(rows))
	if l.err != nil {
		return Weight{}
	}
	return Weight{Name: name, Type: t.Type, Rows: rows, Cols: cols, Data: t.Data}
}

// vector loads an n-element tensor of any shape whose ne is dims (default
// [n]) and dequantizes it to float32.
func (l *loader) vector(name string, n int, dims ...uint64) []float32 {
	if len(dims) == 0 {
		dims = []uint64{uint64(n)}
	}
	t := l.tensor(name, dims...)
	if l.err != nil {
		return nil
	}
	v := make([]float32, n)
	if err := quant.Dequantize(t.Type, t.Data, v); err != nil {
		l.fail(fmt.Errorf("%w: %s: %v", ErrTensor, name, err))
		return nil
	}
	return v
}

// blk returns the name of layer il's tensor s ("blk.<il>.<s>").
func blk(il int, s string) string { return fmt.Sprintf("blk.%d.%s", il, s) }

// tensor looks up name and checks its type is supported and its ggml ne.
func tensor(f *gguf.File, name string, dims ...uint64) (gguf.Tensor, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return t, fmt.Errorf("%w: %v", ErrTensor, err)
	}
	if !t.Type.Supported() {
		return t, fmt.Errorf("%w: %s has type %v, which this engine cannot compute with (supported: %s)",
			ErrTensor, name, t.Type, strings.Join(supportedTypes(), ", "))
	}
	ok := len(t.Dims) == len(dims)
	for i := 0; ok && i < len(dims); i++ {
		ok = t.Dims[i] == dims[i]
	}
	if !ok {
		return t, fmt.Errorf("%w: %s has ne %v, want %v", ErrTensor, name, t.Dims, dims)
	}
	return t, nil
}

// supportedTypes lists the tensor types the engine computes with.
func supportedTypes() []string {
	var s []string
	for id := range quant.Type(64) {
		if id.Supported() {
			s = append(s, id.String())
		}
	}
	return s
}
