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
// ffn_{gate,up,down}_exps); nil when expert e is not held.
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
	split := func(name string, p *Proj, t quant.Type, rows, cols int, data []byte) error {
		*p = Proj{Type: t, Rows: rows, Cols: cols}
		rb, err := p.rowBytes()
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrShape, name, err)
		}
		per := rb * rows
		if len(data) != per*nExpert {
			return fmt.Errorf("%w: %s holds %d bytes, want %d x %d", ErrShape, name, len(data), nExpert, per)
		}
		p.Expert = make([][]byte, nExpert)
		for e := range nExpert {
			p.Expert[e] = data[e*per : (e+1)*per : (e+1)*per]
		}
		return nil
	}
	if err := split("gate", &l.Gate, gateT, dFF, dModel, gate); err != nil {
		return nil, err
	}
	if err := split("up", &l.Up, upT, dFF, dModel, up); err != nil {
		return nil, err
	}
	if err := split("down", &l.Down, downT, dModel, dFF, down); err != nil {
		return nil, err
	}
	return l, nil
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

// FromGGUF returns layer blk's experts as views into f (tensors
// blk.N.ffn_{gate,up,down}_exps.weight), with shapes taken from the tensors:
// gate and up ne = [DModel, DFF, NExpert], down ne = [DFF, DModel, NExpert].
// f must stay open while the Layer is used. Errors wrap gguf.ErrNoTensor,
// ErrShape or ErrType.
func FromGGUF(f *gguf.File, blk int) (*Layer, error) {
	var ts [3]gguf.Tensor
	for i, n := range []string{"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"} {
		t, err := f.Tensor(fmt.Sprintf("blk.%d.%s.weight", blk, n))
		if err != nil {
			return nil, err
		}
		if len(t.Dims) != 3 || t.Dims[0] > 1<<30 || t.Dims[1] > 1<<30 || t.Dims[2] > 1<<20 {
			return nil, fmt.Errorf("%w: %s has ne %v, want 3 dimensions", ErrShape, t.Name, t.Dims)
		}
		ts[i] = t
	}
	d, dff, ne := ts[0].Dims[0], ts[0].Dims[1], ts[0].Dims[2]
	if ts[1].Dims[0] != d || ts[1].Dims[1] != dff || ts[1].Dims[2] != ne ||
		ts[2].Dims[0] != dff || ts[2].Dims[1] != d || ts[2].Dims[2] != ne {
		return nil, fmt.Errorf("%w: blk.%d expert tensors ne %v, %v, %v disagree", ErrShape, blk, ts[0].Dims, ts[1].Dims, ts[2].Dims)
	}
	return StackedLayer(int(ne), int(d), int(dff), ts[0].Type, ts[0].Data, ts[1].Type, ts[1].Data, ts[2].Type, ts[2].Data)
}
