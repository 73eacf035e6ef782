// Package model runs MoE transformer forward passes on the CPU as llama.cpp's
// CPU backend computes them (src/models/<arch>.cpp, src/llama-graph.cpp
// build_attn / build_moe_ffn, src/models/delta-net-base.cpp,
// ggml/src/ggml-cpu/ops.cpp, at llama.cpp commit
// 3f545beccee69d9975f466ec7e45fd9aacd8ba90).
//
// An architecture is one file (qwen3moe.go, qwen35moe.go) that registers
// how to read its hyperparameters and tensors and chooses, per layer, the
// kinds of the shared blocks it fills in (arch, Block): the memory kind,
// which is the token mixer's (MemoryKV: Attention, GQA softmax attention
// with an F32 KV cache, per-head q/k RMSNorm, NEOX or IMROPE rotary
// embedding, optionally gated; MemoryRecurrent: GatedDeltaNet, causal
// depthwise convolution and the gated delta rule over a recurrent state),
// and the feed-forward kind (FFNMoE: MoE, its Router such as
// SoftmaxTopKNorm, SwiGLU experts through an expert.Computer, weighted sum
// in the router's slot order, optional shared expert, ungated or
// sigmoid-gated; FFNDense: one SwiGLU FeedForward). Forward runs token
// embedding; per layer RMSNorm -> mixer -> residual -> RMSNorm ->
// feed-forward -> residual; final RMSNorm and output head. The writer of
// each architecture's files (test and benchmark models) is its file in
// engine/modelgen; docs/architecture.md lists what adding one takes.
//
// Every weight matrix product goes through quant.MatMul, which converts the
// activation to the weight type's vec_dot_type exactly as ggml-cpu does
// (see fixtures/ACTIVATIONS.md); the router and attention stay F32.
package model

import (
	"fmt"
	"runtime"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Weight is a Rows x Cols matrix of type Type as stored in GGUF (ggml ne =
// [Cols, Rows]): row r at byte offset r*Type.RowBytes(Cols) of Data.
type Weight struct {
	Name       string     // the GGUF tensor's name, for errors
	Type       quant.Type // the ggml type of Data
	Rows, Cols int        // elements: Rows rows of Cols each
	Data       []byte     // Rows x Type.RowBytes(Cols) bytes, a view into the file
}

// Bytes returns the size of the weight in bytes.
func (w *Weight) Bytes() int { return len(w.Data) }

// Block is one layer, fields named after its GGUF tensors
// (blk.N.<name>.weight). Its two kinds are chosen per layer by the
// architecture's loader and fixed at Load: Memory says which token mixer
// the layer runs and so which per-sequence memory it keeps (exactly one of
// Attn and Linear is set), FFN which feed-forward block follows it
// (exactly one of MoE and Dense is set). Norm weights are dequantized to
// float32.
type Block struct {
	AttnNorm []float32      // attn_norm [Embd]
	Attn     *Attention     // attention (qwen3moe; qwen35moe full-attention layers): Memory == MemoryKV
	Linear   *GatedDeltaNet // linear attention (qwen35moe recurrent layers): Memory == MemoryRecurrent
	// Memory is the kind of per-sequence memory the layer's mixer keeps.
	Memory MemoryKind
	// FFNNorm is ffn_norm (qwen3moe) or post_attention_norm (qwen35moe)
	// [Embd]: the norm before the feed-forward block.
	FFNNorm []float32
	// FFN is the kind of the layer's feed-forward block.
	FFN   FFNKind
	MoE   *MoE         // routed experts: FFN == FFNMoE
	Dense *FeedForward // ffn_gate, ffn_up, ffn_down: FFN == FFNDense
}

// MemoryKind is the per-sequence memory a layer keeps (llama.cpp
// src/llama-memory-hybrid.cpp at commit 3f545bec: llama_kv_cache for
// attention layers, llama_memory_recurrent for the others).
type MemoryKind uint8

const (
	// MemoryKV: a softmax attention layer (Block.Attn) keeping every
	// position's keys and values, F32, grown on demand; a Sequence can be
	// truncated to any earlier length.
	MemoryKV MemoryKind = iota
	// MemoryRecurrent: a Gated DeltaNet layer (Block.Linear) keeping a
	// fixed-size state (the last SSMConv-1 convolution inputs and the delta
	// rule matrices) that holds no history: a Sequence can only be reset,
	// or rewound into an open checkpoint (Sequence.Checkpoint).
	MemoryRecurrent
)

// String returns "kv" or "recurrent".
func (k MemoryKind) String() string {
	switch k {
	case MemoryKV:
		return "kv"
	case MemoryRecurrent:
		return "recurrent"
	}
	return fmt.Sprintf("MemoryKind(%d)", uint8(k))
}

// FFNKind is a layer's feed-forward block.
type FFNKind uint8

const (
	// FFNMoE: a mixture of experts (Block.MoE): router, routed experts
	// computed by the Model's expert.Computer, optional shared expert.
	FFNMoE FFNKind = iota
	// FFNDense: one SwiGLU feed-forward network on the backbone
	// (Block.Dense); the layer has no routed experts (its expert.Layer is
	// nil).
	FFNDense
)

// String returns "moe" or "dense".
func (k FFNKind) String() string {
	switch k {
	case FFNMoE:
		return "moe"
	case FFNDense:
		return "dense"
	}
	return fmt.Sprintf("FFNKind(%d)", uint8(k))
}

// Model is a loaded model of one of the registered architectures
// (Architectures). Its weights are views into the gguf.File it was loaded
// from, which must stay open while the Model is used.
//
// Forward may not be called concurrently on one Model (it reuses internal
// buffers); all other methods are read-only.
type Model struct {
	p          Params
	TokenEmbd  Weight    // token_embd Vocab x Embd
	OutputNorm []float32 // output_norm [Embd]
	Output     Weight    // output Vocab x Embd; token_embd when the file has no output.weight
	Blocks     []Block   // blk.0 .. blk.(Layers-1)
	// MTP is the multi-token-prediction head (blk.Layers, qwen35moe's
	// nextn_predict_layers block), nil when the file has none that this
	// engine runs (MTPErr says why).
	MTP *MTPHead

	mtpErr error // why MTP is nil

	local   *expert.Local
	experts expert.Computer
	ffnFF   int  // largest shared-expert or dense FFN length (0: none)
	gated   bool // some attention layer is Gated
	threads int
	ws      workspace
	team    team // Forward's helper goroutines
	// localExpertTime is the wall time spent computing routed experts on
	// the model's own threads (moe's local branch) since Load: what a
	// local decode step pays that a backbone with every expert remote
	// does not (BenchmarkBackboneStep). With a shared expert it includes
	// the shared expert's down projection, which runs in the routed
	// experts' region (sharedLocal).
	localExpertTime time.Duration
}

// Params returns the model's hyperparameters.
func (m *Model) Params() Params { return m.p }

// Load builds a Model over f. The file's general.architecture chooses the
// architecture (Architectures), which chooses each layer's kinds (Block);
// every tensor must be present with a supported type and the shape the
// hyperparameters imply. Errors wrap ErrArchitecture, ErrMetadata or
// ErrTensor and name the key or tensor.
func Load(f *gguf.File) (*Model, error) {
	p, a, l, err := readParams(f)
	if err != nil {
		return nil, err
	}
	m := &Model{threads: runtime.GOMAXPROCS(0)}
	m.TokenEmbd = l.matrix("token_embd.weight", p.Vocab, p.Embd)
	m.OutputNorm = l.vector("output_norm.weight", p.Embd)
	if l.has("output.weight") {
		m.Output = l.matrix("output.weight", p.Vocab, p.Embd)
	} else {
		m.Output = m.TokenEmbd
	}
	if l.err != nil {
		return nil, l.err
	}
	m.Blocks = make([]Block, p.Layers)
	layers := make([]*expert.Layer, p.ExpertLayers)
	for i := range layers {
		if layers[i], err = loadLayer(a, l, &p, i, m.Blocks); err != nil {
			return nil, err
		}
	}
	if m.local, err = expert.NewLocal(layers, 0); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrTensor, err)
	}
	m.p = p
	m.experts = m.local
	if p.NextN > 0 {
		m.loadMTP(a, l, &p, layers[p.Layers])
	} else {
		m.loadMTP(a, l, &p, nil)
	}
	blocks := m.Blocks
	if m.MTP != nil {
		blocks = append(blocks[:len(blocks):len(blocks)], m.MTP.Block)
	}
	for i := range blocks {
		b := &blocks[i]
		if b.Attn != nil && b.Attn.Gated {
			m.gated = true
		}
		if b.MoE != nil && b.MoE.Shared != nil {
			m.ffnFF = max(m.ffnFF, b.MoE.Shared.Gate.Rows)
		}
		if b.Dense != nil {
			m.ffnFF = max(m.ffnFF, b.Dense.Gate.Rows)
		}
	}
	return m, nil
}

// loadLayer loads layer il of architecture a: its routed experts when the
// architecture gives it an MoE block (nil for a dense one) and, unless it
// is an MTP block (il >= p.Layers, only its experts are loaded), its Block
// in blocks[il] with the kinds the architecture chose.
func loadLayer(a *arch, l *loader, p *Params, il int, blocks []Block) (*expert.Layer, error) {
	kind := a.ffn(p, il)
	var layer *expert.Layer
	if kind == FFNMoE {
		var err error
		if layer, err = loadExperts(l.f, p, il); err != nil {
			return nil, err
		}
	}
	if il >= p.Layers {
		return layer, nil
	}
	b := &blocks[il]
	b.Memory, b.FFN = a.memory(l, p, il), kind
	a.block(l, p, il, b)
	if l.err != nil {
		return nil, l.err
	}
	if err := b.check(a.name, il); err != nil {
		return nil, err
	}
	if b.MoE != nil {
		b.MoE.Experts = layer
	}
	return layer, nil
}

// check reports a block whose loader did not fill in what its kinds say
// (a bug in the architecture's file, not in the model file).
func (b *Block) check(arch string, il int) error {
	mixer := (b.Memory == MemoryKV && b.Attn != nil && b.Linear == nil) ||
		(b.Memory == MemoryRecurrent && b.Linear != nil && b.Attn == nil)
	ffn := (b.FFN == FFNMoE && b.MoE != nil && b.MoE.Route != nil && b.Dense == nil) ||
		(b.FFN == FFNDense && b.Dense != nil && b.MoE == nil)
	if !mixer || !ffn {
		return fmt.Errorf("model: %s loader: blk.%d does not match its kinds (memory %v, ffn %v)", arch, il, b.Memory, b.FFN)
	}
	return nil
}

// loadExperts checks layer il's routed expert tensors against p (either
// layout llama.cpp accepts: ffn_gate_exps + ffn_up_exps, ne [Embd,
// ExpertFF, Experts] each, or ffn_gate_up_exps, ne [Embd, 2*ExpertFF,
// Experts]; ffn_down_exps ne [ExpertFF, Embd, Experts]) and returns them
// as views (expert.FromGGUF). A backbone-only file (engine/slice
// WriteBackboneOnly, docs/slices.md) holds no routed expert tensors: its
// layers come from loadBackboneOnlyExperts.
func loadExperts(f *gguf.File, p *Params, il int) (*expert.Layer, error) {
	if _, ok := f.Value(keyBackboneOnly + "version"); ok {
		return loadBackboneOnlyExperts(f, p, il)
	}
	d, ff, ne := uint64(p.Embd), uint64(p.ExpertFF), uint64(p.Experts)
	type want struct {
		name string
		ne   []uint64
	}
	checks := []want{{"ffn_gate_exps", []uint64{d, ff, ne}}, {"ffn_up_exps", []uint64{d, ff, ne}}}
	if _, err := f.TensorInfo(blk(il, "ffn_gate_up_exps.weight")); err == nil {
		checks = []want{{"ffn_gate_up_exps", []uint64{d, 2 * ff, ne}}}
	}
	for _, c := range append(checks, want{"ffn_down_exps", []uint64{ff, d, ne}}) {
		if _, err := tensor(f, blk(il, c.name+".weight"), c.ne...); err != nil {
			return nil, err
		}
	}
	e, err := expert.FromGGUF(f, il)
	if err != nil {
		return nil, fmt.Errorf("%w: blk.%d experts: %v", ErrTensor, il, err)
	}
	return e, nil
}

// keyBackboneOnly prefixes the metadata keys of a backbone-only file that
// the loader reads (engine/slice's KeyBackboneOnly* constants; this package
// does not import engine/slice).
const keyBackboneOnly = "kvasir.backbone_only."

// loadBackboneOnlyExperts returns layer il's experts of a backbone-only
// file: the layer's shapes and types (kvasir.backbone_only.gate_type,
// up_type, down_type: one ggml type id per layer 0..ExpertLayers-1) with no
// expert held (expert.Proj.Expert[e] == nil) except the hot experts listed
// in kvasir.backbone_only.hot ((layer, expert) pairs, flattened), which are
// views of blk.N.ffn_{gate,up}_hot.E.weight (ne [Embd, ExpertFF]) and
// blk.N.ffn_down_hot.E.weight (ne [ExpertFF, Embd]). Errors wrap
// ErrMetadata (missing or short arrays, a hot pair out of range) or
// ErrTensor (an unsupported type, a missing or misshapen hot tensor).
func loadBackboneOnlyExperts(f *gguf.File, p *Params, il int) (*expert.Layer, error) {
	d, ff, ne := p.Embd, p.ExpertFF, p.Experts
	if d <= 0 || ff <= 0 || ne <= 0 {
		return nil, fmt.Errorf("%w: backbone-only file: embedding %d, expert_feed_forward_length %d, experts %d", ErrMetadata, d, ff, ne)
	}
	l := &expert.Layer{NExpert: ne, DModel: d, DFF: ff}
	for _, x := range []struct {
		name       string
		p          *expert.Proj
		rows, cols int
	}{{"gate", &l.Gate, ff, d}, {"up", &l.Up, ff, d}, {"down", &l.Down, d, ff}} {
		key := keyBackboneOnly + x.name + "_type"
		ts, err := f.Ints(key)
		if err != nil || len(ts) != p.ExpertLayers {
			return nil, fmt.Errorf("%w: %s: %d entries for %d layers (%v)", ErrMetadata, key, len(ts), p.ExpertLayers, err)
		}
		t := quant.Type(ts[il])
		if !t.Supported() {
			return nil, fmt.Errorf("%w: blk.%d routed %s experts have type %v, which this engine cannot compute with", ErrTensor, il, x.name, t)
		}
		*x.p = expert.Proj{Type: t, Rows: x.rows, Cols: x.cols, Expert: make([][]byte, ne)}
	}
	hot, err := f.Ints(keyBackboneOnly + "hot")
	if err != nil || len(hot)%2 != 0 {
		return nil, fmt.Errorf("%w: %shot: %d entries (%v)", ErrMetadata, keyBackboneOnly, len(hot), err)
	}
	for i := 0; i < len(hot); i += 2 {
		if hot[i] != int64(il) {
			continue
		}
		e := hot[i+1]
		if e < 0 || e >= int64(ne) {
			return nil, fmt.Errorf("%w: hot expert (%d, %d) out of range", ErrMetadata, il, e)
		}
		for _, x := range []struct {
			name string
			p    *expert.Proj
		}{{"gate", &l.Gate}, {"up", &l.Up}, {"down", &l.Down}} {
			t, err := tensor(f, fmt.Sprintf("blk.%d.ffn_%s_hot.%d.weight", il, x.name, e), uint64(x.p.Cols), uint64(x.p.Rows))
			if err != nil {
				return nil, err
			}
			if t.Type != x.p.Type {
				return nil, fmt.Errorf("%w: %s has type %v, the layer's %s experts %v", ErrTensor, t.Name, t.Type, x.name, x.p.Type)
			}
			x.p.Expert[e] = t.Data
		}
	}
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("%w: blk.%d experts: %v", ErrTensor, il, err)
	}
	return l, nil
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

// BytesPerToken returns the bytes of weights one decoded token reads:
// every attention, linear-attention, router, shared-expert and dense FFN
// matrix, ExpertsUsed routed experts per MoE layer, the output head and one
// embedding row. Memory bandwidth / BytesPerToken bounds decode tokens/s.
func (m *Model) BytesPerToken() int64 {
	var n int64
	for i := range m.Blocks {
		b := &m.Blocks[i]
		for _, w := range b.weights() {
			n += int64(w.Bytes())
		}
		if b.MoE != nil {
			n += int64(m.p.ExpertsUsed * b.MoE.Experts.ExpertBytes())
		}
	}
	n += int64(m.Output.Bytes())
	if rb, err := m.TokenEmbd.Type.RowBytes(m.p.Embd); err == nil {
		n += int64(rb)
	}
	return n
}

// MemoryBytesPerToken returns the bytes of a sequence's memory that one
// decoded token at position pos (0-based; pos tokens before it) moves to
// and from RAM, each byte counted once as a roofline does (caches
// ignored):
//
//	recurrent layers: 2 x StateBytes, the delta rule and convolution
//	    states read and written back
//	MemoryKV layer: (pos+1) x HeadsKV x (HeadDim+HeadDimV) x 4, the F32 K
//	    and V of every position read (the new one's written)
//
// Added to BytesPerToken it is the decode step's compulsory traffic: the
// delta rule state alone is 2 MB per layer of Qwen3.5-35B-A3B's shape,
// read and written at every token. Negative pos counts as 0.
func (m *Model) MemoryBytesPerToken(pos int) int64 {
	p := m.p
	pos = max(pos, 0)
	n := 2 * m.StateBytes() // read and written back
	for i := range m.Blocks {
		if m.Blocks[i].Memory == MemoryKV {
			n += 4 * int64(pos+1) * int64(p.HeadsKV) * int64(p.HeadDim+p.HeadDimV)
		}
	}
	return n
}

// weights returns the block's matrices that every token reads (all but the
// routed experts).
func (b *Block) weights() []*Weight {
	var ws []*Weight
	if a := b.Attn; a != nil {
		ws = append(ws, &a.Q, &a.K, &a.V, &a.Output)
	}
	if g := b.Linear; g != nil {
		ws = append(ws, &g.QKV, &g.Gate, &g.Beta, &g.Alpha, &g.Out)
	}
	if b.MoE != nil {
		ws = append(ws, &b.MoE.GateInp)
		if s := b.MoE.Shared; s != nil {
			ws = append(ws, &s.Gate, &s.Up, &s.Down)
		}
	}
	if f := b.Dense; f != nil {
		ws = append(ws, &f.Gate, &f.Up, &f.Down)
	}
	return ws
}
