package modelgen

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// TestBuildFromRoundTrip feeds BuildFrom the values of a Build file (F32,
// so reading them back is exact; fused and separate gate/up) and expects
// the same bytes: same metadata, names, shapes, order and types. Then the
// same values quantized to Q8_0 by BuildFrom equal Build's own Q8_0 file,
// whose weights are drawn at F32 and quantized by the same quantizer.
func TestBuildFromRoundTrip(t *testing.T) {
	for _, fused := range []bool{false, true} {
		s, err := Preset("tiny-qwen35moe")
		if err != nil {
			t.Fatal(err)
		}
		s.Layers, s.Embd, s.SharedFF, s.Experts, s.FusedGateUp = 4, 64, 64, 4, fused
		s.Type = quant.F32
		want, err := Bytes(s)
		if err != nil {
			t.Fatal(err)
		}
		f := parse(t, want)
		values := func(name string, dims []uint64) ([]float32, error) {
			ti, err := f.Tensor(name)
			if err != nil { // a fused gate_up: split it back per expert
				return splitGateUp(t, f, name, dims)
			}
			x := make([]float32, len(ti.Data)/4)
			return x, quant.Dequantize(ti.Type, ti.Data, x)
		}
		w, err := BuildFrom(s, tokenizer.DefaultConfig(s.Vocab), values)
		if err != nil {
			t.Fatal(err)
		}
		var got bytes.Buffer
		if _, err := w.WriteTo(&got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), want) {
			t.Errorf("fused %v: BuildFrom of Build's F32 values differs from Build (%d vs %d bytes)", fused,
				got.Len(), len(want))
		}

		s.Type = quant.Q8_0
		wantQ, err := Bytes(s)
		if err != nil {
			t.Fatal(err)
		}
		wq, err := BuildFrom(s, tokenizer.DefaultConfig(s.Vocab), values)
		if err != nil {
			t.Fatal(err)
		}
		got.Reset()
		if _, err := wq.WriteTo(&got); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got.Bytes(), wantQ) {
			t.Errorf("fused %v: BuildFrom Q8_0 differs from Build Q8_0", fused)
		}
	}
}

// splitGateUp returns, for BuildFrom asking for name (blk.N.ffn_gate_exps
// or blk.N.ffn_up_exps, ne dims [d, ff, experts]), that half of layer N's
// F32 ffn_gate_up_exps in f: per expert ff gate rows, then ff up rows.
func splitGateUp(t *testing.T, f *gguf.File, name string, dims []uint64) ([]float32, error) {
	t.Helper()
	up := strings.HasSuffix(name, "ffn_up_exps.weight")
	fused := strings.Replace(strings.Replace(name, "ffn_up_exps", "ffn_gate_up_exps", 1), "ffn_gate_exps",
		"ffn_gate_up_exps", 1)
	ti, err := f.Tensor(fused)
	if err != nil {
		return nil, fmt.Errorf("neither %s nor %s: %w", name, fused, err)
	}
	all := make([]float32, len(ti.Data)/4)
	if err := quant.Dequantize(ti.Type, ti.Data, all); err != nil {
		return nil, err
	}
	d, ff, ne := int(dims[0]), int(dims[1]), int(dims[2])
	var x []float32
	for e := range ne {
		off := e * 2 * ff * d
		if up {
			off += ff * d
		}
		x = append(x, all[off:off+ff*d]...)
	}
	return x, nil
}

// TestBuildFromErrors: a wrong vocabulary, a wrong count of values and the
// supplier's own error are reported, wrapping ErrSpec where they are the
// input's fault.
func TestBuildFromErrors(t *testing.T) {
	s, err := Preset("tiny-qwen35moe")
	if err != nil {
		t.Fatal(err)
	}
	s.Layers, s.Embd, s.SharedFF = 4, 64, 64
	tc := tokenizer.DefaultConfig(s.Vocab)
	zeros := func(name string, dims []uint64) ([]float32, error) {
		n := 1
		for _, v := range dims {
			n *= int(v)
		}
		return make([]float32, n), nil
	}
	if _, err := BuildFrom(s, tc, zeros); err != nil {
		t.Fatalf("all-zero weights: %v", err)
	}
	bad := s
	bad.Vocab++
	if _, err := BuildFrom(bad, tc, zeros); !errors.Is(err, ErrSpec) {
		t.Errorf("vocab %d with a tokenizer of %d tokens: %v, want ErrSpec", bad.Vocab, len(tc.Tokens), err)
	}
	short := func(name string, dims []uint64) ([]float32, error) {
		x, _ := zeros(name, dims)
		if name == "blk.2.ssm_out.weight" {
			x = x[1:]
		}
		return x, nil
	}
	if _, err := BuildFrom(s, tc, short); !errors.Is(err, ErrSpec) || !strings.Contains(err.Error(), "blk.2.ssm_out") {
		t.Errorf("one value short: %v, want ErrSpec naming blk.2.ssm_out", err)
	}
	boom := errors.New("boom")
	if _, err := BuildFrom(s, tc, func(string, []uint64) ([]float32, error) { return nil, boom }); !errors.Is(err, boom) {
		t.Errorf("supplier error: %v", err)
	}
	if _, err := BuildFrom(s, tc, nil); !errors.Is(err, ErrSpec) {
		t.Errorf("nil weights: %v", err)
	}
}
