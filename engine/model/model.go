// Package model runs the qwen3moe forward pass on the CPU as llama.cpp's CPU
// backend computes it (src/models/qwen3moe.cpp and src/llama-graph.cpp
// build_attn / build_moe_ffn, ggml/src/ggml-cpu/ops.cpp, at llama.cpp commit
// 3f545beccee69d9975f466ec7e45fd9aacd8ba90): token embedding; per layer
// RMSNorm -> attention (GQA, per-head RMSNorm of q and k, NEOX RoPE, causal
// softmax) with an F32 KV cache -> RMSNorm -> router (softmax, top-k,
// renormalised weights) -> SwiGLU experts through an expert.Computer ->
// weighted sum in the router's slot order; final RMSNorm and output head.
//
// Every weight matrix product goes through quant.MatMul, which converts the
// activation to the weight type's vec_dot_type exactly as ggml-cpu does
// (see fixtures/ACTIVATIONS.md); the router and attention stay F32.
package model

import (
	"fmt"
	"runtime"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Weight is a Rows x Cols matrix of type Type as stored in GGUF (ggml ne =
// [Cols, Rows]): row r at byte offset r*Type.RowBytes(Cols) of Data.
type Weight struct {
	Name       string
	Type       quant.Type
	Rows, Cols int
	Data       []byte
}

// Bytes returns the size of the weight in bytes.
func (w *Weight) Bytes() int { return len(w.Data) }

// Block is one transformer layer, fields named after its GGUF tensors
// (blk.N.<name>.weight). Norm weights are dequantized to float32.
type Block struct {
	AttnNorm   []float32 // attn_norm [Embd]
	AttnQ      Weight    // attn_q      Heads*HeadDim x Embd
	AttnK      Weight    // attn_k      HeadsKV*HeadDim x Embd
	AttnV      Weight    // attn_v      HeadsKV*HeadDimV x Embd
	AttnOutput Weight    // attn_output Embd x Heads*HeadDimV
	AttnQNorm  []float32 // attn_q_norm [HeadDim]
	AttnKNorm  []float32 // attn_k_norm [HeadDim]
	FFNNorm    []float32 // ffn_norm [Embd]
	FFNGateInp Weight    // ffn_gate_inp (router) Experts x Embd, F32 in llama.cpp's quantisations
	// Experts holds ffn_gate_exps, ffn_up_exps and ffn_down_exps.
	Experts *expert.Layer
}

// Model is a loaded qwen3moe model. Its weights are views into the gguf.File
// it was loaded from, which must stay open while the Model is used.
//
// Forward may not be called concurrently on one Model (it reuses internal
// buffers); all other methods are read-only.
type Model struct {
	p          Params
	TokenEmbd  Weight    // token_embd Vocab x Embd
	OutputNorm []float32 // output_norm [Embd]
	Output     Weight    // output Vocab x Embd; token_embd when the file has no output.weight
	Blocks     []Block   // blk.0 .. blk.(Layers-1)

	local   *expert.Local
	experts expert.Computer
	threads int
	ws      workspace
	team    team // Forward's helper goroutines
}

// Params returns the model's hyperparameters.
func (m *Model) Params() Params { return m.p }

// Load builds a Model over f. The architecture must be qwen3moe; every tensor
// must be present with a supported type and the shape the hyperparameters
// imply. Errors wrap ErrArchitecture, ErrMetadata or ErrTensor.
func Load(f *gguf.File) (*Model, error) {
	p, err := readParams(f)
	if err != nil {
		return nil, err
	}
	m := &Model{p: p, threads: runtime.GOMAXPROCS(0)}
	qd, kvd, vd := p.Heads*p.HeadDim, p.HeadsKV*p.HeadDim, p.HeadsKV*p.HeadDimV
	if m.TokenEmbd, err = matrix(f, "token_embd.weight", p.Vocab, p.Embd); err != nil {
		return nil, err
	}
	if m.OutputNorm, err = vector(f, "output_norm.weight", p.Embd); err != nil {
		return nil, err
	}
	if _, e := f.TensorInfo("output.weight"); e == nil {
		if m.Output, err = matrix(f, "output.weight", p.Vocab, p.Embd); err != nil {
			return nil, err
		}
	} else {
		m.Output = m.TokenEmbd
	}
	m.Blocks = make([]Block, p.Layers)
	layers := make([]*expert.Layer, p.Layers)
	for i := range m.Blocks {
		b := &m.Blocks[i]
		n := func(s string) string { return fmt.Sprintf("blk.%d.%s.weight", i, s) }
		for _, v := range []struct {
			dst  *[]float32
			name string
			n    int
		}{{&b.AttnNorm, "attn_norm", p.Embd}, {&b.AttnQNorm, "attn_q_norm", p.HeadDim},
			{&b.AttnKNorm, "attn_k_norm", p.HeadDim}, {&b.FFNNorm, "ffn_norm", p.Embd}} {
			if *v.dst, err = vector(f, n(v.name), v.n); err != nil {
				return nil, err
			}
		}
		for _, w := range []struct {
			dst        *Weight
			name       string
			rows, cols int
		}{{&b.AttnQ, "attn_q", qd, p.Embd}, {&b.AttnK, "attn_k", kvd, p.Embd}, {&b.AttnV, "attn_v", vd, p.Embd},
			{&b.AttnOutput, "attn_output", p.Embd, p.Heads * p.HeadDimV}, {&b.FFNGateInp, "ffn_gate_inp", p.Experts, p.Embd}} {
			if *w.dst, err = matrix(f, n(w.name), w.rows, w.cols); err != nil {
				return nil, err
			}
		}
		for _, s := range []struct {
			name       string
			cols, rows int
		}{{"ffn_gate_exps", p.Embd, p.ExpertFF}, {"ffn_up_exps", p.Embd, p.ExpertFF}, {"ffn_down_exps", p.ExpertFF, p.Embd}} {
			if _, err = tensor(f, n(s.name), uint64(s.cols), uint64(s.rows), uint64(p.Experts)); err != nil {
				return nil, err
			}
		}
		if b.Experts, err = expert.FromGGUF(f, i); err != nil {
			return nil, fmt.Errorf("%w: blk.%d experts: %v", ErrTensor, i, err)
		}
		layers[i] = b.Experts
	}
	if m.local, err = expert.NewLocal(layers, 0); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTensor, err)
	}
	m.experts = m.local
	return m, nil
}

// tensor looks up name and checks its type is supported and its ggml ne.
func tensor(f *gguf.File, name string, dims ...uint64) (gguf.Tensor, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return t, fmt.Errorf("%w: %v", ErrTensor, err)
	}
	if !t.Type.Supported() {
		return t, fmt.Errorf("%w: %s has unsupported type %v", ErrTensor, name, t.Type)
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

func matrix(f *gguf.File, name string, rows, cols int) (Weight, error) {
	t, err := tensor(f, name, uint64(cols), uint64(rows))
	if err != nil {
		return Weight{}, err
	}
	return Weight{Name: name, Type: t.Type, Rows: rows, Cols: cols, Data: t.Data}, nil
}

func vector(f *gguf.File, name string, n int) ([]float32, error) {
	t, err := tensor(f, name, uint64(n))
	if err != nil {
		return nil, err
	}
	v := make([]float32, n)
	if err := quant.Dequantize(t.Type, t.Data, v); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrTensor, name, err)
	}
	return v, nil
}

// SetExperts routes every layer's expert computation through c (for example
// the swarm's dispatcher); nil restores the model's own local experts. The
// result is bit-identical as long as c computes as expert.Local does.
func (m *Model) SetExperts(c expert.Computer) {
	if c == nil {
		c = m.local
	}
	m.experts = c
}

// LocalExperts returns the Computer over the model's own expert tensors.
func (m *Model) LocalExperts() *expert.Local { return m.local }

// SetThreads sets the goroutines used by matrix products, attention and
// the model's own local experts (n <= 0: runtime.GOMAXPROCS(0)); Forward
// starts n-1 helper goroutines per call and stops them before it returns.
// Results do not depend on n. A Computer set with SetExperts uses its own.
func (m *Model) SetThreads(n int) {
	if n <= 0 {
		n = runtime.GOMAXPROCS(0)
	}
	m.threads = n
}

// BytesPerToken returns the bytes of weights one decoded token reads: every
// attention and router matrix, ExpertsUsed experts per layer, the output
// head and one embedding row. Memory bandwidth / BytesPerToken bounds decode
// tokens/s.
func (m *Model) BytesPerToken() int64 {
	var n int64
	for i := range m.Blocks {
		b := &m.Blocks[i]
		n += int64(b.AttnQ.Bytes() + b.AttnK.Bytes() + b.AttnV.Bytes() + b.AttnOutput.Bytes() + b.FFNGateInp.Bytes())
		n += int64(m.p.ExpertsUsed * b.Experts.ExpertBytes())
	}
	n += int64(m.Output.Bytes())
	if rb, err := m.TokenEmbd.Type.RowBytes(m.p.Embd); err == nil {
		n += int64(rb)
	}
	return n
}
