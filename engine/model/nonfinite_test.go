package model

import (
	"context"
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// TestRouteNonFinite: NaN or ±Inf router logits are an error, never a panic
// (all-NaN logits used to leave best = -1 and index probs[-1]).
func TestRouteNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, logits := range [][]float32{
		{nan, nan, nan, nan},
		{0, 1, nan, 2},
		{0, inf, 1, 2},
		{float32(math.Inf(-1)), 0, 1, 2},
	} {
		ids, w := make([]int32, 2), make([]float32, 2)
		if err := SoftmaxTopKNorm(logits, make([]float32, 4), ids, w); !errors.Is(err, ErrNonFinite) {
			t.Errorf("SoftmaxTopKNorm(%v): %v, want ErrNonFinite", logits, err)
		}
	}
	// Extreme finite logits still route (the softmax subtracts the maximum).
	ids, w := make([]int32, 2), make([]float32, 2)
	if err := SoftmaxTopKNorm([]float32{-math.MaxFloat32, math.MaxFloat32, 0, math.MaxFloat32}, make([]float32, 4), ids, w); err != nil ||
		ids[0] != 1 || ids[1] != 3 || w[0] != 0.5 || w[1] != 0.5 {
		t.Errorf("extreme logits: ids %v w %v err %v, want [1 3] [0.5 0.5]", ids, w, err)
	}
}

// forwardEdited runs one Forward (token 5, logits) on the tiny preset of
// the given layers, its GGUF copied through edit; it returns
// the sequence's length after it and the error.
func forwardEdited(t *testing.T, layers int, edit func(ti *gguf.TensorInfo, data *[]byte) bool) (int, error) {
	t.Helper()
	s, _ := modelgen.Preset("tiny")
	s.Layers = layers
	f, _ := genModel(t, s)
	_, m := parseModel(t, copyWriter(t, f, edit))
	seq := m.NewSequence()
	err := m.Forward(context.Background(), []Row{{Seq: seq, Token: 5, Logits: true}}, make([]float32, m.Params().Vocab))
	return seq.Len(), err
}

// TestForwardNaNRouter: a GGUF whose layer-1 router weights are NaN makes
// Forward return ErrNonFinite (no panic) and leaves the sequence unchanged.
func TestForwardNaNRouter(t *testing.T) {
	n, err := forwardEdited(t, 2, func(ti *gguf.TensorInfo, data *[]byte) bool {
		if ti.Name == "blk.1.ffn_gate_inp.weight" {
			if ti.Type != quant.F32 {
				t.Fatalf("router weights are %v, want F32", ti.Type)
			}
			b := make([]byte, len(*data))
			for i := 0; i+4 <= len(b); i += 4 {
				binary.LittleEndian.PutUint32(b[i:], 0x7fc00000) // quiet NaN
			}
			*data = b
		}
		return true
	})
	if !errors.Is(err, ErrNonFinite) {
		t.Fatalf("Forward: %v, want ErrNonFinite", err)
	}
	t.Logf("Forward: %v", err)
	if n != 0 {
		t.Fatalf("a failed Forward advanced the sequence to %d", n)
	}
}

// TestForwardNaNOutputNorm: a NaN in output_norm.weight (after the last
// router, so no router check sees it) makes Forward return ErrNonFinite
// naming the output norm. Before, every logit was NaN and greedy decoding
// answered token 0 ("!!!!") with no error.
func TestForwardNaNOutputNorm(t *testing.T) {
	n, err := forwardEdited(t, 1, func(ti *gguf.TensorInfo, data *[]byte) bool {
		if ti.Name == "output_norm.weight" {
			b := append([]byte(nil), *data...)
			binary.LittleEndian.PutUint32(b, 0x7fc00000) // its first weight a quiet NaN (F32)
			*data = b
		}
		return true
	})
	if !errors.Is(err, ErrNonFinite) || !strings.Contains(err.Error(), "output norm") {
		t.Fatalf("Forward: %v, want ErrNonFinite naming the output norm", err)
	}
	if n != 0 {
		t.Fatalf("a failed Forward advanced the sequence to %d", n)
	}
}
