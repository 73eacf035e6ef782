package model

import (
	"bytes"
	"context"
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// genModel builds s and loads it from memory.
func genModel(t testing.TB, s modelgen.Spec) (*gguf.File, *Model) {
	t.Helper()
	w, err := modelgen.Build(s)
	if err != nil {
		t.Fatal(err)
	}
	f, m := parseModel(t, w)
	return f, m
}

func parseModel(t testing.TB, w *gguf.Writer) (*gguf.File, *Model) {
	t.Helper()
	f := reparse(t, w)
	m, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return f, m
}

// reparse writes w and parses it back.
func reparse(t testing.TB, w *gguf.Writer) *gguf.File {
	t.Helper()
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

func tinyModel(t testing.TB) *Model {
	t.Helper()
	_, m := parseBytes(t, modelgen.Tiny)
	return m
}

// parseBytes parses the model file gen returns (modelgen.Tiny,
// modelgen.TinyQwen35MoE) and loads it.
func parseBytes(t testing.TB, gen func() ([]byte, error)) (*gguf.File, *Model) {
	t.Helper()
	data, err := gen()
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return f, m
}

// run feeds tokens to a fresh sequence in batches of the given size and
// returns the logits of every row.
func run(t *testing.T, m *Model, tokens []int32, batch int) []float32 {
	t.Helper()
	v := m.Params().Vocab
	out := make([]float32, len(tokens)*v)
	seq := m.NewSequence()
	for lo := 0; lo < len(tokens); lo += batch {
		hi := min(len(tokens), lo+batch)
		rows := make([]Row, 0, hi-lo)
		for i := lo; i < hi; i++ {
			rows = append(rows, Row{Seq: seq, Token: tokens[i], Pos: i, Logits: true})
		}
		if err := m.Forward(context.Background(), rows, out[lo*v:hi*v]); err != nil {
			t.Fatal(err)
		}
	}
	if seq.Len() != len(tokens) {
		t.Fatalf("sequence length %d, want %d", seq.Len(), len(tokens))
	}
	return out
}

func sameBits(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d: %v != %v", what, i, got[i], want[i])
		}
	}
}

var testTokens = []int32{5, 17, 200, 3, 99, 42, 7, 300, 11, 64, 128, 255}

// TestBatchInvariance: a row's logits are bit-identical whether the prompt
// is prefilled in one batch, in uneven batches, or decoded token by token,
// and on 1 or 2 threads (each output element is one fixed-order dot product
// and attention reads only the row's own sequence).
func TestBatchInvariance(t *testing.T) {
	m := tinyModel(t)
	ref := run(t, m, testTokens, 1)
	sameBits(t, "one batch", run(t, m, testTokens, len(testTokens)), ref)
	sameBits(t, "batches of 5", run(t, m, testTokens, 5), ref)
	m.SetThreads(1)
	sameBits(t, "1 thread", run(t, m, testTokens, len(testTokens)), ref)
	m.SetThreads(0)
}

// TestMultiSequence: two sequences interleaved in one batch give the same
// logits as each decoded alone.
func TestMultiSequence(t *testing.T) {
	m := tinyModel(t)
	a, b := testTokens[:7], testTokens[3:]
	v := m.Params().Vocab
	ra, rb := run(t, m, a, 1), run(t, m, b, len(b))
	sa, sb := m.NewSequence(), m.NewSequence()
	var rows []Row
	for i := range max(len(a), len(b)) {
		if i < len(a) {
			rows = append(rows, Row{Seq: sa, Token: a[i], Pos: i, Logits: true})
		}
		if i < len(b) {
			rows = append(rows, Row{Seq: sb, Token: b[i], Pos: i, Logits: true})
		}
	}
	out := make([]float32, len(rows)*v)
	if err := m.Forward(context.Background(), rows, out); err != nil {
		t.Fatal(err)
	}
	ia, ib := 0, 0
	for j, r := range rows {
		got := out[j*v : (j+1)*v]
		if r.Seq == sa {
			sameBits(t, "sequence a", got, ra[ia*v:(ia+1)*v])
			ia++
		} else {
			sameBits(t, "sequence b", got, rb[ib*v:(ib+1)*v])
			ib++
		}
	}
}

// recorder is an expert.Computer that counts calls and delegates, or fails.
type recorder struct {
	inner expert.Computer
	calls int
	rows  int
	fail  error
}

func (r *recorder) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	r.calls++
	r.rows += n
	if r.fail != nil {
		return r.fail
	}
	return r.inner.ComputeExperts(ctx, layer, hidden, ids, n, k, out)
}

func TestSetExperts(t *testing.T) {
	m := tinyModel(t)
	ref := run(t, m, testTokens, len(testTokens))
	rec := &recorder{inner: m.LocalExperts()}
	m.SetExperts(rec)
	sameBits(t, "through a delegating Computer", run(t, m, testTokens, len(testTokens)), ref)
	if want := m.Params().Layers; rec.calls != want || rec.rows != want*len(testTokens) {
		t.Errorf("%d calls over %d rows, want one call per layer (%d) with all %d rows", rec.calls, rec.rows, want, len(testTokens))
	}
	boom := errors.New("worker went away")
	m.SetExperts(&recorder{fail: boom})
	seq := m.NewSequence()
	err := m.Forward(context.Background(), []Row{{Seq: seq, Token: 1, Logits: true}}, make([]float32, m.Params().Vocab))
	if !errors.Is(err, boom) || seq.Len() != 0 {
		t.Errorf("failing Computer: err %v, len %d; want the Computer's error and no progress", err, seq.Len())
	}
	m.SetExperts(nil)
	sameBits(t, "local again", run(t, m, testTokens, 4), ref)
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Forward(cctx, []Row{{Seq: seq, Token: 1}}, nil); !errors.Is(err, context.Canceled) || seq.Len() != 0 {
		t.Errorf("cancelled context: err %v, len %d", err, seq.Len())
	}
}

func TestForwardErrors(t *testing.T) {
	s, _ := modelgen.Preset("tiny")
	s.Context = 4
	_, m := genModel(t, s)
	other := tinyModel(t)
	v := m.Params().Vocab
	ctx := context.Background()
	seq := m.NewSequence()
	lg := make([]float32, v)
	for _, tc := range []struct {
		name string
		rows []Row
		lg   []float32
		want error
	}{
		{"token out of range", []Row{{Seq: seq, Token: int32(v), Logits: true}}, lg, ErrBatch},
		{"negative token", []Row{{Seq: seq, Token: -1}}, nil, ErrBatch},
		{"position gap", []Row{{Seq: seq, Token: 1, Pos: 1}}, nil, ErrBatch},
		{"positions out of order", []Row{{Seq: seq, Token: 1, Pos: 1}, {Seq: seq, Token: 1, Pos: 0}}, nil, ErrBatch},
		{"nil sequence", []Row{{Token: 1}}, nil, ErrBatch},
		{"other model's sequence", []Row{{Seq: other.NewSequence(), Token: 1}}, nil, ErrBatch},
		{"logits length", []Row{{Seq: seq, Token: 1, Logits: true}}, lg[:v-1], ErrBatch},
		{"beyond context", []Row{{Seq: seq, Token: 1}, {Seq: seq, Token: 1, Pos: 1}, {Seq: seq, Token: 1, Pos: 2},
			{Seq: seq, Token: 1, Pos: 3}, {Seq: seq, Token: 1, Pos: 4}}, nil, ErrContext},
	} {
		if err := m.Forward(ctx, tc.rows, tc.lg); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if seq.Len() != 0 {
			t.Fatalf("%s: a failed Forward advanced the sequence to %d", tc.name, seq.Len())
		}
	}
	if err := seq.Truncate(1); !errors.Is(err, ErrBatch) {
		t.Errorf("Truncate beyond Len: %v", err)
	}
}

// TestGeneratedTypes loads generated models of several weight types, checks
// their logits are finite and far from uniform (std > 3, as the fixtures'
// ~9.7), and that the Q4_K_M-like mix uses Q6_K where llama.cpp does.
func TestGeneratedTypes(t *testing.T) {
	types := []string{"Q8_0", "Q4_K", "Q4_K_M", "F16", "Q5_K", "Q6_K", "Q4_0", "Q5_1", "BF16"}
	if testing.Short() {
		types = []string{"Q8_0", "Q4_K_M"}
	}
	for _, typ := range types {
		t.Run(typ, func(t *testing.T) {
			s, _ := modelgen.Preset("tiny")
			s.Layers = 2
			var err error
			if s.Type, s.Mix, err = modelgen.ParseType(typ); err != nil {
				t.Fatal(err)
			}
			_, m := genModel(t, s)
			lg := run(t, m, testTokens[:3], 3)
			var sum, sq float64
			last := lg[2*m.Params().Vocab:]
			for _, x := range last {
				if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
					t.Fatalf("non-finite logit %v", x)
				}
				sum += float64(x)
				sq += float64(x) * float64(x)
			}
			n := float64(len(last))
			if std := math.Sqrt(sq/n - (sum/n)*(sum/n)); std < 3 {
				t.Errorf("logit std %.2f: too close to uniform", std)
			}
			if s.Mix {
				if m.TokenEmbd.Type != quant.Q6_K || m.Blocks[1].Attn.V.Type != quant.Q6_K || m.Blocks[0].Attn.V.Type != quant.Q4_K ||
					m.Blocks[1].MoE.Experts.Down.Type != quant.Q6_K || m.Blocks[0].MoE.Experts.Gate.Type != quant.Q4_K {
					t.Errorf("Q4_K_M mix types: embd %v, v0 %v, v1 %v", m.TokenEmbd.Type, m.Blocks[0].Attn.V.Type, m.Blocks[1].Attn.V.Type)
				}
			}
		})
	}
}

// copyWriter copies f's metadata and tensors into a writer, applying edit
// to each tensor (return false to drop it).
func copyWriter(t *testing.T, f *gguf.File, edit func(ti *gguf.TensorInfo, data *[]byte) bool) *gguf.Writer {
	t.Helper()
	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		w.Set(kv.Key, kv.Value)
	}
	for _, ti := range f.Tensors {
		tn, err := f.Tensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		info, data := ti, tn.Data
		if edit != nil && !edit(&info, &data) {
			continue
		}
		if err := w.AddTensor(info.Name, info.Type, info.Dims, data); err != nil {
			t.Fatal(err)
		}
	}
	return w
}

func TestLoadErrors(t *testing.T) {
	s, _ := modelgen.Preset("tiny")
	s.Layers = 1
	f, _ := genModel(t, s)
	load := func(w *gguf.Writer) error {
		_, err := Load(reparse(t, w))
		return err
	}
	w := copyWriter(t, f, nil)
	w.SetString("general.architecture", "llama")
	if err := load(w); !errors.Is(err, ErrArchitecture) {
		t.Errorf("llama architecture: %v", err)
	}
	w = copyWriter(t, f, func(ti *gguf.TensorInfo, _ *[]byte) bool { return ti.Name != "blk.0.attn_k.weight" })
	if err := load(w); !errors.Is(err, ErrTensor) {
		t.Errorf("missing attn_k: %v", err)
	}
	w = copyWriter(t, f, func(ti *gguf.TensorInfo, data *[]byte) bool {
		if ti.Name == "blk.0.attn_q_norm.weight" {
			ti.Dims = []uint64{32}
			*data = (*data)[:32*4]
		}
		return true
	})
	if err := load(w); !errors.Is(err, ErrTensor) {
		t.Errorf("attn_q_norm of 32: %v", err)
	}
	w = copyWriter(t, f, nil)
	w.SetUint32("qwen3moe.expert_used_count", 99)
	if err := load(w); !errors.Is(err, ErrMetadata) {
		t.Errorf("expert_used_count 99: %v", err)
	}
	w = copyWriter(t, f, nil)
	w.SetString("qwen3moe.attention.layer_norm_rms_epsilon", "tiny")
	if err := load(w); !errors.Is(err, ErrMetadata) {
		t.Errorf("string eps: %v", err)
	}
	// A tokenizer with one token fewer than token_embd's rows: ids no
	// text has (llama.cpp refuses the shape).
	toks, err := f.Strings("tokenizer.ggml.tokens")
	if err != nil {
		t.Fatal(err)
	}
	w = copyWriter(t, f, nil)
	w.Set("tokenizer.ggml.tokens", gguf.Array(toks[:len(toks)-1]))
	if err := load(w); !errors.Is(err, ErrMetadata) || !strings.Contains(err.Error(), "tokenizer.ggml.tokens") {
		t.Errorf("%d tokens for %d rows: %v", len(toks)-1, len(toks), err)
	}
	// block_count 0 layers short of the file's: blk.0 is beyond it.
	s2, _ := modelgen.Preset("tiny")
	s2.Layers = 2
	f2, _ := genModel(t, s2)
	w = copyWriter(t, f2, nil)
	w.SetUint32("qwen3moe.block_count", 1)
	if err := load(w); !errors.Is(err, ErrMetadata) || !strings.Contains(err.Error(), "blk.1.") {
		t.Errorf("block_count 1 of 2 blocks: %v", err)
	}
}
