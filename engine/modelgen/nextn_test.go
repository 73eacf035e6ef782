package modelgen

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// TestNextN: Spec.NextN 1 writes block_count = Layers + 1,
// nextn_predict_layers 1 and an attention MTP block with its nextn
// tensors; NextN is refused above 1 and on qwen3moe.
func TestNextN(t *testing.T) {
	s, err := Preset("tiny-qwen35moe")
	if err != nil {
		t.Fatal(err)
	}
	s.NextN = 1
	data, err := Bytes(s)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := f.Uint("qwen35moe.block_count"); err != nil || n != uint64(s.Layers+1) {
		t.Errorf("block_count %d %v", n, err)
	}
	if n, err := f.Uint("qwen35moe.nextn_predict_layers"); err != nil || n != 1 {
		t.Errorf("nextn_predict_layers %d %v", n, err)
	}
	d, il := uint64(s.Embd), s.Layers
	for name, dims := range map[string][]uint64{
		blk(il, "nextn.eh_proj"): {2 * d, d}, blk(il, "nextn.enorm"): {d}, blk(il, "nextn.hnorm"): {d},
		blk(il, "nextn.shared_head_norm"): {d}, blk(il, "attn_q"): {d, uint64(2 * s.Heads * s.HeadDim)},
		blk(il, "ffn_gate_inp"): {d, uint64(s.Experts)},
	} {
		if ti, err := f.TensorInfo(name); err != nil || !slices.Equal(ti.Dims, dims) {
			t.Errorf("%s: %v %v, want %v", name, ti.Dims, err, dims)
		}
	}
	if _, err := f.TensorInfo(blk(il, "attn_qkv")); err == nil || s.Recurrent(il) {
		t.Error("the MTP block is a recurrent layer")
	}
	for _, bad := range []Spec{func() Spec { c := s; c.NextN = 2; return c }(), func() Spec { c, _ := Preset("tiny"); c.NextN = 1; return c }()} {
		if _, err := Build(bad); !errors.Is(err, ErrSpec) {
			t.Errorf("%s NextN %d: %v", bad.arch(), bad.NextN, err)
		}
	}
}
