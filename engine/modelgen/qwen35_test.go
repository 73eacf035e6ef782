package modelgen

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// qwen35Fixtures returns fixtures/qwen35moe: $KVASIR_FIXTURES/qwen35moe,
// or ../shared/fixtures/qwen35moe next to the repository root (the folder
// with go.mod). It skips the test when the folder is absent.
func qwen35Fixtures(t *testing.T) string {
	t.Helper()
	fx := os.Getenv("KVASIR_FIXTURES")
	if fx == "" {
		dir, err := os.Getwd()
		if err != nil {
			t.Fatal(err)
		}
		for {
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				break
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				t.Skip("fixtures absent: no go.mod above the test directory; set KVASIR_FIXTURES")
			}
			dir = parent
		}
		fx = filepath.Join(dir, "..", "shared", "fixtures")
	}
	fx = filepath.Join(fx, "qwen35moe")
	if _, err := os.Stat(filepath.Join(fx, "tiny-qwen35moe-F16.gguf")); err != nil {
		t.Skipf("qwen35moe fixtures absent (%s): set KVASIR_FIXTURES to the folder holding qwen35moe/", fx)
	}
	return fx
}

func parse(t *testing.T, data []byte) *gguf.File {
	t.Helper()
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// TestTinyQwen35MoE checks the embedded qwen35moe model: fast to make, its
// metadata (fixtures/qwen35moe/README.md), the layer pattern and a
// tokenizer that loads.
func TestTinyQwen35MoE(t *testing.T) {
	start := time.Now()
	data, err := TinyQwen35MoE()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("tiny qwen35moe model: %d bytes in %v", len(data), time.Since(start))
	if again, _ := TinyQwen35MoE(); &again[0] != &data[0] {
		t.Error("TinyQwen35MoE is not cached")
	}
	f := parse(t, data)
	if a := f.Architecture(); a != ArchQwen35MoE {
		t.Fatalf("architecture %q", a)
	}
	for key, want := range map[string]uint64{
		"context_length": 4096, "embedding_length": 256, "block_count": 4, "attention.head_count": 4,
		"attention.head_count_kv": 2, "attention.key_length": 64, "attention.value_length": 64,
		"rope.dimension_count": 16, "expert_count": 16, "expert_used_count": 4, "expert_feed_forward_length": 128,
		"expert_shared_feed_forward_length": 256, "full_attention_interval": 4, "ssm.conv_kernel": 4,
		"ssm.state_size": 64, "ssm.group_count": 2, "ssm.time_step_rank": 4, "ssm.inner_size": 256,
	} {
		if got, err := f.Uint("qwen35moe." + key); err != nil || got != want {
			t.Errorf("%s = %d (%v), want %d", key, got, err, want)
		}
	}
	if sec, err := f.Ints("qwen35moe.rope.dimension_sections"); err != nil || !slices.Equal(sec, []int64{3, 3, 2, 0}) {
		t.Errorf("rope.dimension_sections %v %v", sec, err)
	}
	if v, ok := f.Value("qwen35moe.rope.dimension_sections"); !ok || v.ElemType() != gguf.TypeInt32 {
		t.Errorf("rope.dimension_sections is not an int32 array (llama.cpp's get_key_or_arr reads int32)")
	}
	for key, want := range map[string]float32{"rope.freq_base": 1e7, "attention.layer_norm_rms_epsilon": 1e-6} {
		if got, err := f.Float("qwen35moe." + key); err != nil || float32(got) != want {
			t.Errorf("%s = %g (%v), want %g", key, got, err, want)
		}
	}
	if ft, _ := f.Uint("general.file_type"); ft != 7 {
		t.Errorf("file_type %d, want 7 (Q8_0)", ft)
	}
	for l, want := range []string{"attn_qkv", "attn_qkv", "attn_qkv", "attn_q"} {
		if _, err := f.TensorInfo(fmt.Sprintf("blk.%d.%s.weight", l, want)); err != nil {
			t.Errorf("layer %d: no %s: %v", l, want, err)
		}
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	if text := "hello world"; tok.Decode(tok.Encode(text, false)) != text {
		t.Errorf("tokenizer does not round-trip %q", text)
	}
	if _, err := f.TensorInfo("output.weight"); err == nil {
		t.Error("output.weight present; the head should be tied")
	}
	// ssm_a holds -exp(A_log): negative, in [-e, -1/e).
	for l := range 3 {
		ts, err := f.Tensor(fmt.Sprintf("blk.%d.ssm_a", l))
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, 4)
		if err := quant.Dequantize(ts.Type, ts.Data, x); err != nil {
			t.Fatal(err)
		}
		for _, v := range x {
			if !(v >= -2.7182818 && v < -0.36787944) {
				t.Errorf("blk.%d.ssm_a has %g, want in [-e, -1/e)", l, v)
			}
		}
	}
}

// layerless returns a tensor's name with the layer number replaced by N.
func layerless(name string) string {
	if rest, ok := strings.CutPrefix(name, "blk."); ok {
		if i := strings.IndexByte(rest, '.'); i > 0 {
			return "blk.N" + rest[i:]
		}
	}
	return name
}

// TestQwen35MoEMatchesFixture compares a generated tiny-qwen35moe with the
// real llama.cpp-loadable fixture: the same metadata keys with the same
// value types (and values, but for the name and the vocabulary), and the
// same tensors in the same order with the same shapes and types, per layer
// type; in the Q4_K_M mix the same types as llama-quantize chose (but for
// token_embd, which the fixture overrides to Q4_K).
func TestQwen35MoEMatchesFixture(t *testing.T) {
	fx := qwen35Fixtures(t)
	s, _ := Preset("tiny-qwen35moe")
	s.Type = quant.F16
	ours := parse(t, build(t, s))
	ref, err := gguf.Open(filepath.Join(fx, "tiny-qwen35moe-F16.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()

	refKeys := map[string]gguf.Value{}
	for _, kv := range ref.KVs {
		refKeys[kv.Key] = kv.Value
	}
	ourKeys := map[string]bool{}
	for _, kv := range ours.KVs {
		ourKeys[kv.Key] = true
		rv, ok := refKeys[kv.Key]
		if !ok {
			t.Errorf("key %s is not in the fixture", kv.Key)
			continue
		}
		if kv.Value.TypeName() != rv.TypeName() {
			t.Errorf("%s: %s, fixture %s", kv.Key, kv.Value.TypeName(), rv.TypeName())
		}
		if strings.HasPrefix(kv.Key, "qwen35moe.") || kv.Key == "general.architecture" || kv.Key == "general.file_type" {
			if got, want := fmt.Sprint(kv.Value.Any()), fmt.Sprint(rv.Any()); got != want {
				t.Errorf("%s = %s, fixture %s", kv.Key, got, want)
			}
		}
	}
	for k := range refKeys {
		if !ourKeys[k] {
			t.Errorf("fixture key %s missing", k)
		}
	}

	if len(ours.Tensors) != len(ref.Tensors) {
		t.Errorf("%d tensors, fixture %d", len(ours.Tensors), len(ref.Tensors))
	}
	kinds := map[bool][]string{} // recurrent -> layerless names of layer 0 / 3
	for i, rt := range ref.Tensors {
		if i >= len(ours.Tensors) {
			break
		}
		ot := ours.Tensors[i]
		wantDims := rt.Dims
		if rt.Name == "token_embd.weight" {
			wantDims = []uint64{rt.Dims[0], uint64(s.Vocab)}
		}
		if ot.Name != rt.Name || !slices.Equal(ot.Dims, wantDims) || ot.Type != rt.Type {
			t.Errorf("tensor %d: %s %v %v, fixture %s %v %v", i, ot.Name, ot.Dims, ot.Type, rt.Name, wantDims, rt.Type)
		}
		if strings.HasPrefix(ot.Name, "blk.0.") || strings.HasPrefix(ot.Name, "blk.3.") {
			rec := strings.HasPrefix(ot.Name, "blk.0.")
			kinds[rec] = append(kinds[rec], layerless(ot.Name))
		}
	}
	t.Logf("recurrent layer: %v", kinds[true])
	t.Logf("attention layer: %v", kinds[false])

	// The Q4_K_M mix against llama-quantize's choices.
	s.Type, s.Mix = quant.Q4_K, true
	mix := parse(t, build(t, s))
	qref, err := gguf.Open(filepath.Join(fx, "tiny-qwen35moe-Q4_K_M.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer qref.Close()
	if ft, _ := mix.Uint("general.file_type"); ft != 15 {
		t.Errorf("mix file_type %d, want 15", ft)
	}
	for _, rt := range qref.Tensors {
		ot, err := mix.TensorInfo(rt.Name)
		if err != nil {
			t.Errorf("mix: %v", err)
			continue
		}
		want := rt.Type
		if rt.Name == "token_embd.weight" {
			want = quant.Q6_K // llama-quantize's Q4_K_M default; the fixture overrode it
		}
		if ot.Type != want {
			t.Errorf("mix %s: %v, llama-quantize %v", rt.Name, ot.Type, want)
		}
	}
}

// expertBytes returns the bytes of expert e of a stacked tensor.
func expertBytes(ti gguf.Tensor, e int) []byte {
	n := len(ti.Data) / int(ti.Dims[2])
	return ti.Data[e*n : (e+1)*n]
}

// TestFusedGateUp: ffn_gate_up_exps holds, per expert, exactly the bytes of
// the separate layout's gate rows then up rows; every other tensor is the
// same, for both architectures and for plain and pooled tensors.
func TestFusedGateUp(t *testing.T) {
	pooled, _ := Preset("qwen3-30b-a3b")
	pooled.Layers, pooled.Experts = 1, 8
	for _, name := range []string{"tiny", "tiny-qwen35moe", "pooled"} {
		s := pooled
		if name != "pooled" {
			s, _ = Preset(name)
		}
		sep := parse(t, build(t, s))
		s.FusedGateUp = true
		fused := parse(t, build(t, s))
		if len(fused.Tensors) != len(sep.Tensors)-s.Layers {
			t.Errorf("%s: %d fused tensors, %d separate", name, len(fused.Tensors), len(sep.Tensors))
		}
		for _, ft := range fused.Tensors {
			if !strings.HasSuffix(ft.Name, "ffn_gate_up_exps.weight") {
				a, err1 := fused.Tensor(ft.Name)
				b, err2 := sep.Tensor(ft.Name)
				if err1 != nil || err2 != nil || !bytes.Equal(a.Data, b.Data) || a.Type != b.Type {
					t.Errorf("%s: %s differs between layouts (%v %v)", name, ft.Name, err1, err2)
				}
				continue
			}
			l := strings.TrimSuffix(strings.TrimPrefix(ft.Name, "blk."), ".ffn_gate_up_exps.weight")
			fu, _ := fused.Tensor(ft.Name)
			g, err1 := sep.Tensor("blk." + l + ".ffn_gate_exps.weight")
			u, err2 := sep.Tensor("blk." + l + ".ffn_up_exps.weight")
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: %v %v", name, err1, err2)
			}
			if want := []uint64{uint64(s.Embd), uint64(2 * s.ExpertFF), uint64(s.Experts)}; !slices.Equal(fu.Dims, want) || fu.Type != g.Type {
				t.Errorf("%s: %s %v %v, want %v %v", name, ft.Name, fu.Dims, fu.Type, want, g.Type)
			}
			for e := range s.Experts {
				want := append(slices.Clone(expertBytes(g, e)), expertBytes(u, e)...)
				if !bytes.Equal(expertBytes(fu, e), want) {
					t.Errorf("%s: %s expert %d is not gate rows then up rows of the separate layout", name, ft.Name, e)
				}
			}
		}
	}
}

// TestQwen35MoEErrors: invalid qwen35moe specs fail in check with ErrSpec.
func TestQwen35MoEErrors(t *testing.T) {
	tiny, _ := Preset("tiny-qwen35moe")
	for name, edit := range map[string]func(*Spec){
		"interval 0":           func(s *Spec) { s.FullAttnInterval = 0 },
		"conv 0":               func(s *Spec) { s.SSMConv = 0 },
		"v heads 3 of k 2":     func(s *Spec) { s.SSMDtRank, s.SSMInner = 3, 192 },
		"inner size":           func(s *Spec) { s.SSMInner = 128 },
		"odd rope dims":        func(s *Spec) { s.RopeDim = 15 },
		"rope above head dim":  func(s *Spec) { s.RopeDim = 128 },
		"negative section":     func(s *Spec) { s.RopeSections = [4]int{4, 4, 1, -1} },
		"zero sections":        func(s *Spec) { s.RopeSections = [4]int{} },
		"no shared expert":     func(s *Spec) { s.SharedFF = 0 },
		"Q4_K rows of 128":     func(s *Spec) { s.Type = quant.Q4_K },
		"Q8_0 ssm_out row 144": func(s *Spec) { s.SSMState, s.SSMInner = 36, 144 },
	} {
		s := tiny
		edit(&s)
		if _, err := Build(s); !errors.Is(err, ErrSpec) {
			t.Errorf("%s: %v, want ErrSpec", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
	// The mix falls back where llama-quantize does; qwen3moe too.
	for _, name := range []string{"tiny", "tiny-qwen35moe"} {
		s, _ := Preset(name)
		s.ExpertFF, s.Type, s.Mix = 128, quant.Q4_K, true
		f := parse(t, build(t, s))
		for l, want := range map[int]quant.Type{0: quant.Q5_0, 3: quant.Q8_0} {
			if ti, err := f.TensorInfo(fmt.Sprintf("blk.%d.ffn_down_exps.weight", l)); err != nil || ti.Type != want {
				t.Errorf("%s mix, rows of 128: blk.%d.ffn_down_exps %v %v, want %v", name, l, ti.Type, err, want)
			}
		}
	}
	if got := (Spec{Arch: ArchQwen35MoE, Embd: 80, Type: quant.Q4_K, Mix: true}).mixType(80, false); got != quant.F16 {
		t.Errorf("mix rows of 80: %v, want F16 (llama-quantize's last fallback)", got)
	}
}

// TestRealShapePresets checks the Qwen3.5 presets' shapes (the values of
// the Hugging Face configs) and builds them with few layers and experts.
func TestRealShapePresets(t *testing.T) {
	for _, c := range []struct {
		name                                                  string
		layers, d, heads, kv, hd, experts, ff, shared, vheads int
	}{
		{"qwen3.5-35b-a3b", 40, 2048, 16, 2, 256, 256, 512, 512, 32},
		{"qwen3.5-122b-a10b", 48, 3072, 32, 2, 256, 256, 1024, 1024, 64},
	} {
		s, err := Preset(c.name)
		if err != nil {
			t.Fatal(err)
		}
		if s.Arch != ArchQwen35MoE || s.Layers != c.layers || s.Embd != c.d || s.Heads != c.heads || s.HeadsKV != c.kv ||
			s.HeadDim != c.hd || s.Experts != c.experts || s.ExpertsUsed != 8 || s.ExpertFF != c.ff || s.SharedFF != c.shared ||
			s.SSMDtRank != c.vheads || s.SSMGroups != 16 || s.SSMState != 128 || s.SSMInner != 128*c.vheads ||
			s.RopeDim != 64 || s.RopeSections != [4]int{11, 11, 10, 0} || s.FullAttnInterval != 4 || s.Vocab != 1024 {
			t.Errorf("%s: %+v", c.name, s)
		}
		if err := s.check(); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		if c.name == "qwen3.5-122b-a10b" {
			// 5.3 MB per expert in Q4_K (gate, up and down).
			rb := func(n int) int { b, _ := quant.Q4_K.RowBytes(n); return b }
			if size := 2*c.ff*rb(c.d) + c.d*rb(c.ff); size != 5308416 {
				t.Errorf("expert size %d bytes", size)
			}
		}
		if testing.Short() {
			continue
		}
		// Two layers (one of each kind) of 4 experts in Q8_0, to stay fast.
		s.Layers, s.FullAttnInterval, s.Experts, s.ExpertsUsed, s.Type = 2, 2, 4, 2, quant.Q8_0
		f := parse(t, build(t, s))
		if !strings.Contains(Describe(s), "untied output") {
			t.Errorf("Describe: %s", Describe(s))
		}
		want := map[string][]uint64{
			"output.weight":              {uint64(c.d), 1024},
			"blk.0.attn_qkv.weight":      {uint64(c.d), uint64(2*16*128 + 128*c.vheads)},
			"blk.0.ssm_conv1d.weight":    {4, uint64(2*16*128 + 128*c.vheads)},
			"blk.0.ssm_out.weight":       {uint64(128 * c.vheads), uint64(c.d)},
			"blk.0.ssm_alpha.weight":     {uint64(c.d), uint64(c.vheads)},
			"blk.1.attn_q.weight":        {uint64(c.d), uint64(2 * c.heads * c.hd)},
			"blk.1.attn_k.weight":        {uint64(c.d), uint64(c.kv * c.hd)},
			"blk.1.attn_output.weight":   {uint64(c.heads * c.hd), uint64(c.d)},
			"blk.1.ffn_down_exps.weight": {uint64(c.ff), uint64(c.d), 4},
			"blk.1.ffn_up_shexp.weight":  {uint64(c.d), uint64(c.shared)},
		}
		for name, dims := range want {
			if ti, err := f.TensorInfo(name); err != nil || !slices.Equal(ti.Dims, dims) {
				t.Errorf("%s: %s %v %v, want %v", c.name, name, ti.Dims, err, dims)
			}
		}
	}
}

// TestRecurrentPattern: llama.cpp's is_recr for a few intervals.
func TestRecurrentPattern(t *testing.T) {
	s := Spec{Arch: ArchQwen35MoE, FullAttnInterval: 4}
	var got []bool
	for il := range 8 {
		got = append(got, s.Recurrent(il))
	}
	if want := []bool{true, true, true, false, true, true, true, false}; !slices.Equal(got, want) {
		t.Errorf("interval 4: %v", got)
	}
	s.FullAttnInterval = 1
	if s.Recurrent(0) || s.Recurrent(5) {
		t.Error("interval 1: recurrent layers")
	}
	if (Spec{FullAttnInterval: 4}).Recurrent(0) {
		t.Error("qwen3moe has recurrent layers")
	}
}
