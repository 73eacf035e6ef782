// Package moeshape reads the Mixture-of-Experts shape of a GGUF model from
// its metadata: the architecture, the layer count, the experts per layer
// and per token, the widths an expert's weights have, and the extra
// multi-token-prediction layers. It is the one reader of these keys outside
// engine/model (whose forward passes read their own hyperparameters): the
// slicer, the backbone-only files, the slice command and the test swarms use
// it.
//
// The keys are llama.cpp's (src/llama-arch.cpp LLM_KV_*), each prefixed by
// the value of general.architecture:
//
//	<arch>.block_count                 Layers
//	<arch>.expert_count                Experts
//	<arch>.expert_used_count           ExpertsUsed
//	<arch>.embedding_length            DModel
//	<arch>.expert_feed_forward_length  DFF
//	<arch>.nextn_predict_layers        NextN
package moeshape

import "github.com/kvasir-ai/kvasir/engine/gguf"

// The metadata keys of a Shape, without the "<arch>." prefix.
const (
	KeyBlockCount  = "block_count"
	KeyExpertCount = "expert_count"
	KeyExpertUsed  = "expert_used_count"
	KeyEmbedding   = "embedding_length"
	KeyExpertFFN   = "expert_feed_forward_length"
	KeyNextNLayers = "nextn_predict_layers"
)

// Shape is the Mixture-of-Experts shape of a model as its metadata states
// it. A key that is absent, or not a non-negative integer, reads as 0; the
// caller bounds what it needs (slice.MaxLayers, slice.MaxExperts, ...).
type Shape struct {
	Arch        string // general.architecture ("" when absent)
	Layers      uint64 // block_count: every block, nextn layers included
	Experts     uint64 // expert_count: routed experts per layer
	ExpertsUsed uint64 // expert_used_count: experts per token (k)
	DModel      uint64 // embedding_length: an expert's input and output width
	DFF         uint64 // expert_feed_forward_length: an expert's hidden width
	NextN       uint64 // nextn_predict_layers: trailing multi-token-prediction blocks
}

// Read reads f's shape. The error is that of reading <arch>.block_count
// (wrapping gguf.ErrMissingKey or gguf.ErrKeyType; a file without
// general.architecture has no such key either), the one key every model
// has; the other keys are optional and read as 0 when absent. The Shape is
// filled as far as it could be read either way.
func Read(f *gguf.File) (Shape, error) {
	s := Shape{Arch: f.Architecture()}
	get := func(key string) uint64 {
		v, _ := f.Uint(s.Arch + "." + key)
		return v
	}
	var err error
	s.Layers, err = f.Uint(s.Arch + "." + KeyBlockCount)
	s.Experts = get(KeyExpertCount)
	s.ExpertsUsed = get(KeyExpertUsed)
	s.DModel = get(KeyEmbedding)
	s.DFF = get(KeyExpertFFN)
	s.NextN = get(KeyNextNLayers)
	return s, err
}

// Int returns v as an int when it is at most 1<<31, else 0: a count or
// width read from untrusted metadata, bounded before any use as a size.
func Int(v uint64) int {
	if v > 1<<31 {
		return 0
	}
	return int(v)
}
