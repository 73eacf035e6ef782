package train

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// ErrWeights reports trained weights that do not fit their hyperparameters
// or the GGUF layout: a missing, unused or misshapen tensor, or a
// non-finite value.
var ErrWeights = errors.New("train: bad weights")

// HParams is the model shape the training script writes to FileHParams
// (qwen35moe only; sizes are element counts).
type HParams struct {
	Name             string  `json:"name"`               // general.name
	Embd             int     `json:"embd"`               // embedding_length
	Layers           int     `json:"layers"`             // block_count
	Heads            int     `json:"heads"`              // attention.head_count
	HeadsKV          int     `json:"heads_kv"`           // attention.head_count_kv
	HeadDim          int     `json:"head_dim"`           // attention.key_length = value_length
	RopeDim          int     `json:"rope_dim"`           // rope.dimension_count
	RopeSections     [4]int  `json:"rope_sections"`      // rope.dimension_sections
	RopeBase         float32 `json:"rope_base"`          // rope.freq_base
	NormEps          float32 `json:"norm_eps"`           // attention.layer_norm_rms_epsilon
	Experts          int     `json:"experts"`            // expert_count
	ExpertsUsed      int     `json:"experts_used"`       // expert_used_count
	ExpertFF         int     `json:"expert_ff"`          // expert_feed_forward_length
	SharedFF         int     `json:"shared_ff"`          // expert_shared_feed_forward_length
	FullAttnInterval int     `json:"full_attn_interval"` // full_attention_interval
	SSMConv          int     `json:"ssm_conv"`           // ssm.conv_kernel
	SSMState         int     `json:"ssm_state"`          // ssm.state_size
	SSMGroups        int     `json:"ssm_groups"`         // ssm.group_count
	SSMDtRank        int     `json:"ssm_dt_rank"`        // ssm.time_step_rank
	Context          int     `json:"context"`            // the training window, in tokens
	Vocab            int     `json:"vocab"`              // tokens, specials included
}

// Spec returns the modelgen.Spec of h with every weight matrix of type t
// and context_length context (the positions the engine accepts; the
// training window h.Context is not a limit of the architecture).
func (h HParams) Spec(t quant.Type, context int) modelgen.Spec {
	return modelgen.Spec{Name: h.Name, Arch: modelgen.ArchQwen35MoE, Layers: h.Layers, Embd: h.Embd,
		Heads: h.Heads, HeadsKV: h.HeadsKV, HeadDim: h.HeadDim, Experts: h.Experts, ExpertsUsed: h.ExpertsUsed,
		ExpertFF: h.ExpertFF, Context: context, RopeBase: h.RopeBase, NormEps: h.NormEps, Vocab: h.Vocab,
		FullAttnInterval: h.FullAttnInterval, SSMConv: h.SSMConv, SSMState: h.SSMState, SSMGroups: h.SSMGroups,
		SSMDtRank: h.SSMDtRank, SSMInner: h.SSMState * h.SSMDtRank, RopeDim: h.RopeDim,
		RopeSections: h.RopeSections, SharedFF: h.SharedFF, Type: t}
}

// Entry is one tensor of FileIndex: its byte offset in FileWeights and its
// PyTorch shape (the GGUF ne reversed: [out, in] for a matrix).
type Entry struct {
	Offset int64 `json:"offset"`
	Shape  []int `json:"shape"`
}

// ReadHParams reads dir's FileHParams. Errors: the file system's and
// encoding/json's.
func ReadHParams(dir string) (HParams, error) {
	var h HParams
	b, err := os.ReadFile(filepath.Join(dir, FileHParams))
	if err != nil {
		return h, err
	}
	if err := json.Unmarshal(b, &h); err != nil {
		return h, fmt.Errorf("train: %s: %w", FileHParams, err)
	}
	return h, nil
}

// Export writes the trained model in dir (FileTokenizer, FileHParams,
// FileWeights, FileIndex) as a GGUF of llama.cpp's qwen35moe: the
// metadata, tensor names, shapes and order of modelgen.BuildFrom (those of
// the generated models and the fixtures), every weight matrix quantized to
// t (norms, routers and the DeltaNet's conv, dt and A stay F32), and
// context_length context. It then loads the result with engine/model as a
// check and returns the file's bytes. Errors: ErrWeights (a tensor
// missing from the index, one the GGUF has no place for, a shape that is
// not the GGUF ne reversed, a value out of the file or not finite), the
// files' and modelgen's (ErrSpec), or model.Load's.
func Export(dir string, t quant.Type, context int) ([]byte, error) {
	tc, err := ReadTokenizer(dir)
	if err != nil {
		return nil, err
	}
	h, err := ReadHParams(dir)
	if err != nil {
		return nil, err
	}
	raw, err := os.ReadFile(filepath.Join(dir, FileWeights))
	if err != nil {
		return nil, err
	}
	ib, err := os.ReadFile(filepath.Join(dir, FileIndex))
	if err != nil {
		return nil, err
	}
	var index map[string]Entry
	if err := json.Unmarshal(ib, &index); err != nil {
		return nil, fmt.Errorf("train: %s: %w", FileIndex, err)
	}
	used := make(chan string, len(index)+1)
	weights := func(name string, dims []uint64) ([]float32, error) {
		e, ok := index[name]
		if !ok {
			return nil, fmt.Errorf("%w: %s is not in %s", ErrWeights, name, FileIndex)
		}
		used <- name
		return readTensor(raw, name, e, dims)
	}
	w, err := modelgen.BuildFrom(h.Spec(t, context), tc, weights)
	if err != nil {
		return nil, err
	}
	close(used)
	seen := map[string]bool{}
	for n := range used {
		seen[n] = true
	}
	var extra []string
	for n := range index {
		if !seen[n] {
			extra = append(extra, n)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return nil, fmt.Errorf("%w: the GGUF has no place for %v", ErrWeights, extra)
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		return nil, err
	}
	f, err := gguf.Parse(b.Bytes())
	if err != nil {
		return nil, err
	}
	if _, err := model.Load(f); err != nil {
		return nil, fmt.Errorf("train: the exported file does not load: %w", err)
	}
	return b.Bytes(), nil
}

// readTensor returns tensor name of the index entry e from raw (float32
// little-endian), checking that its shape is dims reversed and its values
// are finite.
func readTensor(raw []byte, name string, e Entry, dims []uint64) ([]float32, error) {
	want := make([]int, len(dims))
	n := 1
	for i, d := range dims {
		want[len(dims)-1-i] = int(d)
		n *= int(d)
	}
	if !slices.Equal(e.Shape, want) {
		return nil, fmt.Errorf("%w: %s has shape %v, want %v (ggml ne %v reversed)", ErrWeights, name, e.Shape, want, dims)
	}
	if e.Offset < 0 || e.Offset%4 != 0 || e.Offset+int64(4*n) > int64(len(raw)) {
		return nil, fmt.Errorf("%w: %s at byte %d (%d values) is outside the %d bytes of %s", ErrWeights, name,
			e.Offset, n, len(raw), FileWeights)
	}
	x := make([]float32, n)
	for i := range x {
		v := math.Float32frombits(binary.LittleEndian.Uint32(raw[int(e.Offset)+4*i:]))
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			return nil, fmt.Errorf("%w: %s[%d] = %v", ErrWeights, name, i, v)
		}
		x[i] = v
	}
	return x, nil
}

// Dequantize writes every tensor of f, dequantized to float32, to dir's
// FileWeights and FileIndex in the training script's format (PyTorch
// shapes), so that the script's --eval runs its own forward pass on the
// exact values engine/model computes with. Errors: quant.Dequantize's and
// the file system's.
func Dequantize(f *gguf.File, dir string) error {
	var raw bytes.Buffer
	index := map[string]Entry{}
	var b4 [4]byte
	for _, ti := range f.Tensors {
		t, err := f.Tensor(ti.Name)
		if err != nil {
			return err
		}
		n := 1
		shape := make([]int, len(ti.Dims))
		for i, d := range ti.Dims {
			n *= int(d)
			shape[len(ti.Dims)-1-i] = int(d)
		}
		x := make([]float32, n)
		if err := quant.Dequantize(ti.Type, t.Data, x); err != nil {
			return fmt.Errorf("train: %s: %w", ti.Name, err)
		}
		index[ti.Name] = Entry{Offset: int64(raw.Len()), Shape: shape}
		for _, v := range x {
			binary.LittleEndian.PutUint32(b4[:], math.Float32bits(v))
			raw.Write(b4[:])
		}
	}
	js, err := json.MarshalIndent(index, "", " ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, FileIndex), js, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, FileWeights), raw.Bytes(), 0o644)
}
