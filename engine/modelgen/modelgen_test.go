package modelgen

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

func build(t *testing.T, s Spec) []byte {
	t.Helper()
	w, err := Build(s)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestDeterministic(t *testing.T) {
	for _, name := range []string{"tiny", "tiny-qwen35moe"} {
		s, _ := Preset(name)
		s.Layers = 1
		a, b := build(t, s), build(t, s)
		if !bytes.Equal(a, b) {
			t.Fatalf("%s: same spec and seed gave different files", name)
		}
		s.Seed++
		if bytes.Equal(a, build(t, s)) {
			t.Fatalf("%s: a different seed gave the same file", name)
		}
	}
}

// TestTiny checks the embedded default: fast to make, the metadata keys
// llama.cpp reads for qwen3moe (fixtures README), and a tokenizer that loads.
func TestTiny(t *testing.T) {
	start := time.Now()
	data, err := Tiny()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tiny model: %d bytes in %v", len(data), time.Since(start))
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := Preset("tiny")
	for key, want := range map[string]uint64{
		"qwen3moe.context_length": uint64(s.Context), "qwen3moe.embedding_length": uint64(s.Embd),
		"qwen3moe.block_count": uint64(s.Layers), "qwen3moe.attention.head_count": uint64(s.Heads),
		"qwen3moe.attention.head_count_kv": uint64(s.HeadsKV), "qwen3moe.attention.key_length": uint64(s.HeadDim),
		"qwen3moe.attention.value_length": uint64(s.HeadDim), "qwen3moe.expert_count": uint64(s.Experts),
		"qwen3moe.expert_used_count": uint64(s.ExpertsUsed), "qwen3moe.expert_feed_forward_length": uint64(s.ExpertFF),
		"general.file_type": 7, "general.quantization_version": 2,
	} {
		if got, err := f.Uint(key); err != nil || got != want {
			t.Errorf("%s = %d (%v), want %d", key, got, err, want)
		}
	}
	for key, want := range map[string]float64{"qwen3moe.rope.freq_base": 1e6, "qwen3moe.attention.layer_norm_rms_epsilon": 1e-6} {
		if got, err := f.Float(key); err != nil || float32(got) != float32(want) {
			t.Errorf("%s = %g (%v), want %g", key, got, err, want)
		}
	}
	if a := f.Architecture(); a != "qwen3moe" {
		t.Errorf("architecture %q", a)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	if text := "hello world"; tok.Decode(tok.Encode(text, false)) != text {
		t.Errorf("tokenizer does not round-trip %q", text)
	}
	emb, err := f.Tensor("token_embd.weight")
	if err != nil {
		t.Fatal(err)
	}
	if emb.Type != quant.Q8_0 || emb.Dims[0] != 256 || int(emb.Dims[1]) != tok.VocabSize() {
		t.Errorf("token_embd %v %v, vocabulary %d", emb.Type, emb.Dims, tok.VocabSize())
	}
	for _, n := range []string{"blk.0.ffn_gate_inp.weight", "blk.3.attn_norm.weight", "output_norm.weight"} {
		if ti, err := f.TensorInfo(n); err != nil || ti.Type != quant.F32 {
			t.Errorf("%s: %v %v, want F32", n, ti.Type, err)
		}
	}
	if _, err := f.TensorInfo("output.weight"); err == nil {
		t.Error("output.weight present; the output head should be tied to token_embd")
	}
}

func TestPresetsAndErrors(t *testing.T) {
	s, err := Preset("qwen3-30b-a3b")
	if err != nil {
		t.Fatal(err)
	}
	if s.Embd != 2048 || s.Heads != 32 || s.HeadsKV != 4 || s.HeadDim != 128 || s.Experts != 128 || s.ExpertsUsed != 8 || s.ExpertFF != 768 {
		t.Errorf("qwen3-30b-a3b shapes %+v", s)
	}
	if _, err := Preset("llama-7b"); !errors.Is(err, ErrSpec) {
		t.Errorf("unknown preset: %v", err)
	}
	if typ, mix, err := ParseType("q4_k_m"); err != nil || !mix || typ != quant.Q4_K {
		t.Errorf("ParseType(q4_k_m) = %v %v %v", typ, mix, err)
	}
	if _, _, err := ParseType("Q9_9"); !errors.Is(err, ErrSpec) {
		t.Errorf("ParseType(Q9_9): %v", err)
	}
	for _, name := range Presets {
		s, err := Preset(name)
		if err != nil || s.check() != nil || !strings.HasPrefix(Describe(s), s.Name+": ") {
			t.Errorf("preset %s: %v %v %q", name, err, s.check(), Describe(s))
		}
	}
	tiny, _ := Preset("tiny")
	{
		s := tiny
		s.ExpertFF, s.Type = 128, quant.Q4_K
		_, err := Build(s)
		if err == nil || !strings.Contains(err.Error(), "blk.0.ffn_down_exps.weight: rows of 128 elements cannot be stored as Q4_K") {
			t.Errorf("Q4_K with ffn 128: %v, want a message naming blk.0.ffn_down_exps.weight", err)
		}
	}
	for name, edit := range map[string]func(*Spec){
		"zero layers":         func(s *Spec) { s.Layers = 0 },
		"too many layers":     func(s *Spec) { s.Layers = MaxLayers + 1 },
		"kv heads":            func(s *Spec) { s.HeadsKV = 3 },
		"top-k above experts": func(s *Spec) { s.ExpertsUsed = 9 },
		"unsupported type":    func(s *Spec) { s.Type = quant.Q8_K },
		"K-quant row of 128":  func(s *Spec) { s.Embd, s.Type = 128, quant.Q4_K },
		"Q4_K with ffn 128":   func(s *Spec) { s.ExpertFF, s.Type = 128, quant.Q4_K },
		"Q8_0 row of 48":      func(s *Spec) { s.HeadDim, s.Heads, s.HeadsKV = 12, 4, 2 },
		"unknown arch":        func(s *Spec) { s.Arch = "llama" },
	} {
		s := tiny
		edit(&s)
		if _, err := Build(s); !errors.Is(err, ErrSpec) {
			t.Errorf("%s: %v, want ErrSpec", name, err)
		}
	}
}

// TestPooledTensors: tensors above bigTensor elements are assembled from
// poolRows distinct rows; they must still be valid and vary from row to row.
func TestPooledTensors(t *testing.T) {
	ts := &tensorSpec{name: "x", typ: quant.Q8_0, dims: []uint64{1024, 8192}, rows: 8192, cols: 1024, std: 1}
	if err := ts.generate(1); err != nil {
		t.Fatal(err)
	}
	rb, _ := quant.Q8_0.RowBytes(1024)
	distinct := map[string]bool{}
	for r := range ts.rows {
		distinct[string(ts.data[r*rb:(r+1)*rb])] = true
	}
	if len(distinct) < poolRows/2 || len(distinct) > poolRows {
		t.Errorf("%d distinct rows, want about %d", len(distinct), poolRows)
	}
}

// TestLazy holds NewLazy to Build: its layout equals gguf.Parse of Build's
// file (metadata, tensor infos and offsets, data offset), Size is the
// file's size, and Tensor draws every tensor's bytes as they are in the
// file. The specs cover both architectures, the fused gate_up layout, an
// MTP block and tensors above bigTensor (drawn from a pool of rows).
func TestLazy(t *testing.T) {
	tiny, _ := Preset("tiny")
	q35, _ := Preset("tiny-qwen35moe")
	fused := q35
	fused.FusedGateUp, fused.NextN, fused.Layers = true, 1, 2
	pooled := q35 // 128 experts of 256 x 256: expert tensors of 8.4M elements
	pooled.Layers, pooled.Experts, pooled.ExpertFF, pooled.UntiedOutput = 1, 128, 256, true
	for _, s := range []Spec{tiny, q35, fused, pooled} {
		data := build(t, s)
		want, err := gguf.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		l, err := NewLazy(s)
		if err != nil {
			t.Fatal(err)
		}
		got := l.File
		if l.Size != int64(len(data)) || got.DataOffset != want.DataOffset || got.Alignment != want.Alignment ||
			!reflect.DeepEqual(got.KVs, want.KVs) || !reflect.DeepEqual(got.Tensors, want.Tensors) {
			t.Fatalf("%s: layout (size %d, data at %d, %d keys, %d tensors) differs from the file's (%d, %d, %d, %d)",
				Describe(s), l.Size, got.DataOffset, len(got.KVs), len(got.Tensors), len(data), want.DataOffset,
				len(want.KVs), len(want.Tensors))
		}
		pools := 0
		for _, ti := range want.Tensors {
			wt, _ := want.Tensor(ti.Name)
			b, err := l.Tensor(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(b, wt.Data) {
				t.Errorf("%s: tensor %s differs from the file's", Describe(s), ti.Name)
			}
			if ti.Elements() > bigTensor {
				pools++
			}
		}
		if s.Experts == 128 && pools == 0 {
			t.Errorf("%s: no tensor drawn from a pool", Describe(s))
		}
	}
	l, err := NewLazy(q35)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Tensor("blk.9.attn_q.weight"); !errors.Is(err, gguf.ErrNoTensor) {
		t.Errorf("unknown tensor: %v, want gguf.ErrNoTensor", err)
	}
	if _, err := NewLazy(Spec{}); !errors.Is(err, ErrSpec) {
		t.Errorf("empty spec: %v, want ErrSpec", err)
	}
}
