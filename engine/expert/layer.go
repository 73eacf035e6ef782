package expert

import (
	"errors"
	"fmt"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Sentinel errors of this package; returned errors wrap them.
var (
	// ErrShape reports mismatched dimensions or slice lengths.
	ErrShape = errors.New("expert: shape mismatch")
	// ErrType reports a weight type that cannot be computed with.
	ErrType = errors.New("expert: unsupported weight type")
	// ErrUnknownLayer reports a layer index that a Computer does not hold.
	ErrUnknownLayer = errors.New("expert: unknown layer")
	// ErrUnknownExpert reports an expert id out of range or not held.
	ErrUnknownExpert = errors.New("expert: unknown expert")
)

// Proj is one projection (gate, up or down) of the experts of a layer.
// Expert[e] is expert e's Rows x Cols matrix of type Type, row-major, row r at
// byte offset r*Type.RowBytes(Cols) (the ggml layout of one ne[2] slice of
// ffn_{gate,up,down}_exps, or for gate and up of a fused file the first or
// second DFF rows of one ne[2] slice of ffn_gate_up_exps; see FromGGUF); nil
// when expert e is not held.
type Proj struct {
	Type       quant.Type
	Rows, Cols int
	Expert     [][]byte
}

// rowBytes returns the bytes of one row, or an error for an unusable type.
func (p *Proj) rowBytes() (int, error) {
	if !p.Type.Supported() {
		return 0, fmt.Errorf("%w: %v", ErrType, p.Type)
	}
	return p.Type.RowBytes(p.Cols)
}

// Layer holds the SwiGLU experts of one MoE layer:
//
//	expert_e(x) = Down_e( silu(Gate_e x) * (Up_e x) )
//
// with Gate_e, Up_e: DFF x DModel and Down_e: DModel x DFF (llama.cpp
// build_moe_ffn in src/llama-graph.cpp, LLM_FFN_SILU with split gate/up).
// A Layer may hold only some of its NExpert experts (a worker's slice).
type Layer struct {
	NExpert, DModel, DFF int
	Gate, Up, Down       Proj
}

// StackedLayer wraps the three stacked expert tensors of a layer as stored in
// GGUF (ffn_gate_exps and ffn_up_exps: ne = [dModel, dFF, nExpert];
// ffn_down_exps: ne = [dFF, dModel, nExpert]) without copying. Each data slice
// must hold exactly nExpert matrices of its type. Errors wrap ErrShape or
// ErrType.
func StackedLayer(nExpert, dModel, dFF int, gateT quant.Type, gate []byte, upT quant.Type, up []byte, downT quant.Type, down []byte) (*Layer, error) {
	if nExpert <= 0 || dModel <= 0 || dFF <= 0 {
		return nil, fmt.Errorf("%w: n_expert %d, d_model %d, d_ff %d", ErrShape, nExpert, dModel, dFF)
	}
	l := &Layer{NExpert: nExpert, DModel: dModel, DFF: dFF}
	if err := splitStacked("gate", &l.Gate, gateT, dFF, dModel, nExpert, gate, 1, 0); err != nil {
		return nil, err
	}
	if err := splitStacked("up", &l.Up, upT, dFF, dModel, nExpert, up, 1, 0); err != nil {
		return nil, err
	}
	if err := splitStacked("down", &l.Down, downT, dModel, dFF, nExpert, down, 1, 0); err != nil {
		return nil, err
	}
	return l, nil
}

// StackedGateUpLayer is StackedLayer for the fused layout: gateUp is
// ffn_gate_up_exps, ne = [dModel, 2*dFF, nExpert] of type gateUpT, in which
// expert e's 2*dFF x dModel matrix holds its gate rows 0..dFF-1 followed by its
// up rows dFF..2*dFF-1 (llama.cpp build_moe_ffn in src/llama-graph.cpp views
// the fused product's first n_ff outputs as gate and the next n_ff as up).
// down is ffn_down_exps, ne = [dFF, dModel, nExpert]. Gate and Up get type
// gateUpT and zero-copy views of those row ranges, so each expert's gate and up
// bytes are exactly those of the equivalent separate ffn_gate_exps and
// ffn_up_exps. Errors wrap ErrShape or ErrType.
func StackedGateUpLayer(nExpert, dModel, dFF int, gateUpT quant.Type, gateUp []byte, downT quant.Type, down []byte) (*Layer, error) {
	if nExpert <= 0 || dModel <= 0 || dFF <= 0 {
		return nil, fmt.Errorf("%w: n_expert %d, d_model %d, d_ff %d", ErrShape, nExpert, dModel, dFF)
	}
	l := &Layer{NExpert: nExpert, DModel: dModel, DFF: dFF}
	if err := splitStacked("gate_up (gate rows)", &l.Gate, gateUpT, dFF, dModel, nExpert, gateUp, 2, 0); err != nil {
		return nil, err
	}
	if err := splitStacked("gate_up (up rows)", &l.Up, gateUpT, dFF, dModel, nExpert, gateUp, 2, 1); err != nil {
		return nil, err
	}
	if err := splitStacked("down", &l.Down, downT, dModel, dFF, nExpert, down, 1, 0); err != nil {
		return nil, err
	}
	return l, nil
}

// splitStacked sets *p to views of data, which holds nExpert matrices of
// parts*rows rows x cols elements of type t: expert e's matrix is rows
// [part*rows, (part+1)*rows) of the e-th matrix, capacity-limited to its own
// bytes. Errors wrap ErrShape.
func splitStacked(name string, p *Proj, t quant.Type, rows, cols, nExpert int, data []byte, parts, part int) error {
	*p = Proj{Type: t, Rows: rows, Cols: cols}
	rb, err := p.rowBytes()
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrShape, name, err)
	}
	per := rb * rows
	stride := per * parts
	if per/rows != rb || stride/parts != per || len(data)/nExpert != stride || len(data)%nExpert != 0 {
		return fmt.Errorf("%w: %s holds %d bytes, want %d x %d", ErrShape, name, len(data), nExpert, stride)
	}
	p.Expert = make([][]byte, nExpert)
	for e := range nExpert {
		lo := e*stride + part*per
		p.Expert[e] = data[lo : lo+per : lo+per]
	}
	return nil
}

// Validate checks the layer's dimensions, types and the length of every held
// expert matrix. Errors wrap ErrShape or ErrType.
func (l *Layer) Validate() error {
	if l == nil {
		return fmt.Errorf("%w: nil layer", ErrShape)
	}
	if l.NExpert <= 0 || l.DModel <= 0 || l.DFF <= 0 {
		return fmt.Errorf("%w: n_expert %d, d_model %d, d_ff %d", ErrShape, l.NExpert, l.DModel, l.DFF)
	}
	for _, c := range []struct {
		name       string
		p          *Proj
		rows, cols int
	}{{"gate", &l.Gate, l.DFF, l.DModel}, {"up", &l.Up, l.DFF, l.DModel}, {"down", &l.Down, l.DModel, l.DFF}} {
		if c.p.Rows != c.rows || c.p.Cols != c.cols {
			return fmt.Errorf("%w: %s is %d x %d, want %d x %d", ErrShape, c.name, c.p.Rows, c.p.Cols, c.rows, c.cols)
		}
		rb, err := c.p.rowBytes()
		if err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		if len(c.p.Expert) != l.NExpert {
			return fmt.Errorf("%w: %s has %d expert slots, want %d", ErrShape, c.name, len(c.p.Expert), l.NExpert)
		}
		for e, b := range c.p.Expert {
			if b != nil && len(b) != rb*c.rows {
				return fmt.Errorf("%w: %s expert %d holds %d bytes, want %d", ErrShape, c.name, e, len(b), rb*c.rows)
			}
		}
	}
	return nil
}

// Held reports whether expert e's three matrices are all present.
func (l *Layer) Held(e int) bool {
	return e >= 0 && e < l.NExpert && e < len(l.Gate.Expert) && e < len(l.Up.Expert) && e < len(l.Down.Expert) &&
		l.Gate.Expert[e] != nil && l.Up.Expert[e] != nil && l.Down.Expert[e] != nil
}

// ExpertBytes returns the bytes of weights one expert reads per row it
// computes (gate + up + down matrices), or 0 for an invalid layer.
func (l *Layer) ExpertBytes() int {
	g, err1 := l.Gate.Type.RowBytes(l.DModel)
	u, err2 := l.Up.Type.RowBytes(l.DModel)
	d, err3 := l.Down.Type.RowBytes(l.DFF)
	if err1 != nil || err2 != nil || err3 != nil {
		return 0
	}
	return (g+u)*l.DFF + d*l.DModel
}

// FromGGUF returns layer blk's experts as zero-copy views into f, with shapes
// taken from the tensors. It accepts both layouts llama.cpp loads for a MoE
// layer (llama_model_base::create_tensor_gate_up_exps in src/llama-model.cpp,
// used by qwen35moe among others):
//
//  1. separate blk.N.ffn_gate_exps.weight and blk.N.ffn_up_exps.weight, each
//     ne = [DModel, DFF, NExpert] (qwen3moe, and qwen35moe files written so);
//  2. fused blk.N.ffn_gate_up_exps.weight, ne = [DModel, 2*DFF, NExpert]: in
//     each expert's matrix the first DFF rows are gate, the next DFF rows up
//     (llama.cpp build_moe_ffn in src/llama-graph.cpp splits the fused
//     product with views at 0 and n_ff); see StackedGateUpLayer.
//
// and in both blk.N.ffn_down_exps.weight, ne = [DFF, DModel, NExpert]. Either
// way each expert's Gate, Up and Down bytes are the same, so the same weights
// give bit-identical results and identical slice files and hashes.
//
// f must stay open while the Layer is used. Errors wrap gguf.ErrNoTensor
// (ffn_down_exps missing, neither layout present, or only one of
// ffn_gate_exps and ffn_up_exps), ErrShape (both layouts present, a tensor
// not 3-dimensional, shapes that disagree, e.g. a fused row count other than
// twice ffn_down_exps' ne[0]) or ErrType, or are f's other tensor errors.
func FromGGUF(f *gguf.File, blk int) (*Layer, error) {
	return FromTensors(blk, f.Tensor)
}

// FromTensors is FromGGUF over a source of tensors other than an open
// file: tensor returns the named tensor (its info and bytes) or an error
// wrapping gguf.ErrNoTensor when there is none, as gguf.File.Tensor does.
// It is asked for each of blk's four possible expert tensors once; the
// Layer's matrices are views of the bytes it returns. Errors as FromGGUF's.
func FromTensors(blk int, tensor func(name string) (gguf.Tensor, error)) (*Layer, error) {
	get := func(n string) (gguf.Tensor, error) {
		t, err := tensor(fmt.Sprintf("blk.%d.%s.weight", blk, n))
		if err != nil {
			return t, err
		}
		if len(t.Dims) != 3 || t.Dims[0] > 1<<30 || t.Dims[1] > 1<<31 || t.Dims[2] > 1<<20 {
			return t, fmt.Errorf("%w: %s has ne %v, want 3 dimensions", ErrShape, t.Name, t.Dims)
		}
		return t, nil
	}
	// present returns whether the tensor exists, passing through any other
	// error.
	present := func(err error) (bool, error) {
		if errors.Is(err, gguf.ErrNoTensor) {
			return false, nil
		}
		return err == nil, err
	}
	down, err := get("ffn_down_exps")
	if err != nil {
		return nil, err
	}
	gateUp, errGU := get("ffn_gate_up_exps")
	gate, errG := get("ffn_gate_exps")
	up, errU := get("ffn_up_exps")
	var has [3]bool
	for i, e := range []error{errGU, errG, errU} {
		if has[i], err = present(e); err != nil {
			return nil, err
		}
	}
	dff, d, ne := down.Dims[0], down.Dims[1], down.Dims[2]
	switch {
	case has[0] && (has[1] || has[2]):
		return nil, fmt.Errorf("%w: blk.%d has both the fused ffn_gate_up_exps and separate ffn_gate_exps/ffn_up_exps", ErrShape, blk)
	case has[0]:
		if gateUp.Dims[0] != d || gateUp.Dims[1] != 2*dff || gateUp.Dims[2] != ne {
			return nil, fmt.Errorf("%w: blk.%d ffn_gate_up_exps ne %v, want [%d %d %d] (ffn_down_exps ne %v)",
				ErrShape, blk, gateUp.Dims, d, 2*dff, ne, down.Dims)
		}
		return StackedGateUpLayer(int(ne), int(d), int(dff), gateUp.Type, gateUp.Data, down.Type, down.Data)
	case !has[1] && !has[2]:
		return nil, fmt.Errorf("%w: blk.%d has neither ffn_gate_up_exps nor ffn_gate_exps and ffn_up_exps", gguf.ErrNoTensor, blk)
	case !has[1]:
		return nil, fmt.Errorf("blk.%d has ffn_up_exps without ffn_gate_exps: %w", blk, errG)
	case !has[2]:
		return nil, fmt.Errorf("blk.%d has ffn_gate_exps without ffn_up_exps: %w", blk, errU)
	}
	for _, t := range []gguf.Tensor{gate, up} {
		if t.Dims[0] != d || t.Dims[1] != dff || t.Dims[2] != ne {
			return nil, fmt.Errorf("%w: blk.%d expert tensors ne %v, %v, %v disagree", ErrShape, blk, gate.Dims, up.Dims, down.Dims)
		}
	}
	return StackedLayer(int(ne), int(d), int(dff), gate.Type, gate.Data, up.Type, up.Data, down.Type, down.Data)
}
