package demomodel

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// load returns the embedded model and its tokenizer.
func load(t *testing.T) (*gguf.File, *model.Model, *tokenizer.Tokenizer) {
	t.Helper()
	f, err := File()
	if err != nil {
		t.Fatal(err)
	}
	return loadFile(t, f)
}

func loadFile(t *testing.T, f *gguf.File) (*gguf.File, *model.Model, *tokenizer.Tokenizer) {
	t.Helper()
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	m.SetThreads(1)
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return f, m, tok
}

// TestEmbedded checks the embedded file against the constants (hashed
// here, independently of Bytes) and its shape: a qwen35moe of 3 Gated
// DeltaNet and 1 attention layers with routed and shared experts, small
// enough to embed.
func TestEmbedded(t *testing.T) {
	data, err := Bytes()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(embedded)
	if hex.EncodeToString(sum[:]) != SHA256 {
		t.Fatalf("SHA256 constant %s, file %x", SHA256, sum)
	}
	if len(data) > 8<<20 {
		t.Errorf("%d bytes: want under 8 MiB", len(data))
	}
	f, m, tok := load(t)
	if id, _ := slice.ModelID(f); id != ID {
		t.Errorf("model id %s, want %s", id, ID)
	}
	p := m.Params()
	if f.Architecture() != modelgen.ArchQwen35MoE || p.Layers != 4 || p.RecurrentCount != 3 || p.Experts != 8 ||
		p.ExpertsUsed != 2 || p.SharedFF == 0 || p.Embd != 128 || tok.VocabSize() != 2048 || p.Vocab != 2048 {
		t.Errorf("%s: %d layers (%d recurrent), %d experts top-%d, shared ffn %d, d %d, vocab %d/%d", f.Architecture(),
			p.Layers, p.RecurrentCount, p.Experts, p.ExpertsUsed, p.SharedFF, p.Embd, tok.VocabSize(), p.Vocab)
	}
}

func TestVerify(t *testing.T) {
	data := slices.Clone(embedded)
	if err := verify(data, SHA256); err != nil {
		t.Fatal(err)
	}
	data[len(data)/2] ^= 1
	if err := verify(data, SHA256); !errors.Is(err, ErrChecksum) || !strings.Contains(err.Error(), SHA256) {
		t.Errorf("one bit flipped: %v, want ErrChecksum naming the expected sum", err)
	}
}

// bitsPerByte returns the model's cross-entropy on text in bits per byte
// of text: the text's tokens cut into windows of win tokens (each a fresh
// sequence, as the model was trained), each token after a window's first
// predicted from the ones before it. Bits per byte do not depend on the
// tokenizer, so models with different vocabularies compare.
func bitsPerByte(t *testing.T, m *model.Model, tok *tokenizer.Tokenizer, text string, win int) (float64, int) {
	t.Helper()
	ids := tok.Encode(text, false)
	v := m.Params().Vocab
	var nats float64
	bytes, n := 0, 0
	for start := 0; start+1 < len(ids); start += win {
		w := ids[start:min(start+win, len(ids))]
		seq := m.NewSequence()
		rows := make([]model.Row, len(w))
		for i, id := range w {
			rows[i] = model.Row{Seq: seq, Token: id, Pos: i, Logits: true}
		}
		logits := make([]float32, len(w)*v)
		if err := m.Forward(context.Background(), rows, logits); err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(w); i++ {
			lg := logits[i*v : (i+1)*v]
			mx := float64(slices.Max(lg))
			var z float64
			for _, x := range lg {
				z += math.Exp(float64(x) - mx)
			}
			nats += mx + math.Log(z) - float64(lg[w[i+1]])
			bytes += len(tok.Piece(w[i+1]))
			n++
		}
	}
	return nats / math.Ln2 / float64(bytes), n
}

// heldOutBound is the largest cross-entropy on the held-out book (Ruth,
// never trained on) that the test accepts, in bits per byte. The trained
// model scores 1.437 (3.51 nats per token at Ruth's 3.52 bytes per token:
// per-token perplexity 33); a model guessing uniformly among its 2048
// tokens would score 11 bits per token, about 3.1 bits per byte, and the
// random-weight model scores about 20.8.
const heldOutBound = 1.6

// TestHeldOut: the trained model predicts the held-out book well below
// heldOutBound, and the random-weight model of the same architecture
// (modelgen's tiny-qwen35moe, the former default) is far above it: a
// property only training gives.
func TestHeldOut(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "ruth.txt"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	_, m, tok := load(t)
	bpb, n := bitsPerByte(t, m, tok, text, 128)
	t.Logf("trained: %.3f bits per byte over %d predicted tokens of Ruth", bpb, n)
	if bpb > heldOutBound {
		t.Errorf("trained model: %.3f bits per byte on the held-out book, want <= %g", bpb, heldOutBound)
	}
	t.Run("random weights fail", func(t *testing.T) {
		data, err := modelgen.TinyQwen35MoE()
		if err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		_, rm, rtok := loadFile(t, f)
		rbpb, rn := bitsPerByte(t, rm, rtok, text[:len(text)/4], 128)
		t.Logf("random: %.3f bits per byte over %d predicted tokens", rbpb, rn)
		if rbpb <= heldOutBound {
			t.Errorf("random model: %.3f bits per byte, want above the bound %g", rbpb, heldOutBound)
		}
	})
}

// greedy returns n greedy tokens after prompt and each step's top-1/top-2
// logit gap (the prompt in one batch, then one token per Forward, as
// llama.cpp and `backbone generate` decode).
func greedy(t *testing.T, m *model.Model, prompt []int32, n int) ([]int32, []float64) {
	t.Helper()
	v := m.Params().Vocab
	seq := m.NewSequence()
	rows := make([]model.Row, len(prompt))
	for i, id := range prompt {
		rows[i] = model.Row{Seq: seq, Token: id, Pos: i, Logits: i == len(prompt)-1}
	}
	logits := make([]float32, v)
	var out []int32
	var gaps []float64
	for step := range n {
		if err := m.Forward(context.Background(), rows, logits); err != nil {
			t.Fatal(err)
		}
		next := model.Greedy(logits)
		second := float32(math.Inf(-1))
		for i, x := range logits {
			if int32(i) != next {
				second = max(second, x)
			}
		}
		out = append(out, next)
		gaps = append(gaps, float64(logits[next]-second))
		rows = []model.Row{{Seq: seq, Token: next, Pos: len(prompt) + step, Logits: true}}
	}
	return out, gaps
}

// reference is one prompt of testdata/torch_ref.json (the training
// script's --eval on the file's dequantized weights) or
// testdata/llamacpp_ref.json (llama.cpp, testdata/README.md).
type reference struct {
	Prompt string         `json:"prompt"`
	Tokens []int32        `json:"tokens"`
	Greedy []int32        `json:"greedy"` // PyTorch: its greedy continuation
	Gaps   []float64      `json:"gaps"`   // PyTorch: each step's top-1/top-2 gap
	Top    [][][2]float64 `json:"top"`    // PyTorch: each step's top 8 [id, logit]
	Text   string         `json:"text"`   // llama.cpp: the continuation's text
}

func readRefs(t *testing.T, name string) []reference {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	var refs []reference
	if err := json.Unmarshal(b, &refs); err != nil {
		t.Fatal(err)
	}
	if len(refs) != len(Prompts) {
		t.Fatalf("%s: %d prompts, want the %d of Prompts", name, len(refs), len(Prompts))
	}
	for i, r := range refs {
		if r.Prompt != Prompts[i] {
			t.Fatalf("%s prompt %d is %q, want %q", name, i, r.Prompt, Prompts[i])
		}
	}
	return refs
}

// torchBound is, per prompt of Prompts, the largest |engine/model's logit
// - PyTorch's| over the top 8 tokens of every step accepted: the measured
// difference plus about 10% (0.504, 0.171, 0.087; logged). PyTorch
// computes in float32 on the dequantized weights; engine/model (like
// llama.cpp) also rounds each activation to Q8_0 before a Q8_0 product,
// which is most of the difference.
var torchBound = []float64{0.56, 0.19, 0.096}

// torchArgmax is the least number of the 96 steps (3 prompts x 32) at
// which engine/model's argmax, fed PyTorch's sequence, must be PyTorch's
// greedy token: measured 95 (logged; the other is the third prompt's step
// 16, where PyTorch's gap is 0.008), although 20 of the steps have a
// PyTorch gap at most that prompt's torchBound.
const torchArgmax = 95

// TestTorchReference: the training script's own forward on the exact
// weights of the file agrees with engine/model, as the fixture tests
// compare with llama.cpp. Fed PyTorch's sequence (the prompt, then its
// greedy tokens) in one batch, every step's top-8 logits are within
// torchBound, and the argmax is PyTorch's at least torchArgmax times
// (always where PyTorch's gap exceeds torchBound); decoding freely,
// engine/model's greedy tokens equal PyTorch's up to the first step whose
// gap is at most torchBound.
func TestTorchReference(t *testing.T) {
	_, m, tok := load(t)
	v := m.Params().Vocab
	argmax, steps := 0, 0
	for pi, r := range readRefs(t, "torch_ref.json") {
		if ids := tok.Encode(r.Prompt, false); !slices.Equal(ids, r.Tokens) {
			t.Errorf("%q: tokens %v, reference %v", r.Prompt, ids, r.Tokens)
			continue
		}
		n, bound := len(r.Greedy), torchBound[pi]
		if n != 32 || len(r.Gaps) != n || len(r.Top) != n {
			t.Fatalf("%q: %d tokens, %d gaps, %d top lists; want 32", r.Prompt, n, len(r.Gaps), len(r.Top))
		}
		// One batch of the whole sequence, logits at the prompt's last row
		// and every greedy token's but the last.
		all := append(slices.Clone(r.Tokens), r.Greedy[:n-1]...)
		seq := m.NewSequence()
		rows := make([]model.Row, len(all))
		for i, id := range all {
			rows[i] = model.Row{Seq: seq, Token: id, Pos: i, Logits: i >= len(r.Tokens)-1}
		}
		logits := make([]float32, n*v)
		if err := m.Forward(context.Background(), rows, logits); err != nil {
			t.Fatal(err)
		}
		var maxDiff float64
		for s := range n {
			lg := logits[s*v : (s+1)*v]
			for _, p := range r.Top[s] {
				maxDiff = max(maxDiff, math.Abs(float64(lg[int(p[0])])-p[1]))
			}
			steps++
			if got := model.Greedy(lg); got == r.Greedy[s] {
				argmax++
			} else if r.Gaps[s] > bound {
				t.Errorf("%q step %d: argmax %d, PyTorch %d (gap %.3f)", r.Prompt, s, got, r.Greedy[s], r.Gaps[s])
			}
		}
		if maxDiff > bound {
			t.Errorf("%q: top-8 logits differ from PyTorch's by up to %.4f, want <= %g", r.Prompt, maxDiff, bound)
		}
		got, _ := greedy(t, m, r.Tokens, n)
		robust := 0
		for s := range n {
			if got[s] != r.Greedy[s] {
				if r.Gaps[s] > bound {
					t.Errorf("%q step %d: greedy %d, PyTorch %d (gap %.3f)", r.Prompt, s, got[s], r.Greedy[s], r.Gaps[s])
				}
				break
			}
			robust++
			if r.Gaps[s] <= bound {
				break
			}
		}
		same := 0
		for same < n && got[same] == r.Greedy[same] {
			same++
		}
		t.Logf("%q: top-8 logits within %.4f of PyTorch's; greedy equal over the robust prefix (%d steps) and for %d of %d steps: %q",
			r.Prompt, maxDiff, robust, same, n, tok.Decode(got))
	}
	t.Logf("argmax equal to PyTorch's greedy token at %d of %d steps", argmax, steps)
	if argmax < torchArgmax {
		t.Errorf("argmax equal at %d of %d steps, want >= %d", argmax, steps, torchArgmax)
	}
}

// llamaBound is, per prompt of Prompts, the largest |engine/model's logit
// - llama.cpp's| over the top 8 tokens of every step accepted: the
// measured difference plus about 10% (0.028, 0.015, 0.016; logged). Both round
// activations to Q8_0 the same way (fixtures/ACTIVATIONS.md), so logits
// agree to float32 rounding until a rounding flips.
var llamaBound = []float64{0.031, 0.017, 0.0175}

// TestLlamaCppReference compares engine/model with llama.cpp on the
// embedded file (testdata/llamacpp_ref.json; testdata/README.md), as the
// fixture tests do: llama-tokenize's prompt tokens; fed llama.cpp's
// sequence the same way (the prompt in one batch, then one token per
// Forward), every step's top-8 logits within llamaBound; and greedy tokens
// equal to llama.cpp's up to the first step whose llama.cpp top-1/top-2 gap
// is at most llamaBound (the robust prefix), whose text is also what
// llama-simple printed.
func TestLlamaCppReference(t *testing.T) {
	_, m, tok := load(t)
	v := m.Params().Vocab
	for pi, r := range readRefs(t, "llamacpp_ref.json") {
		if ids := tok.Encode(r.Prompt, false); !slices.Equal(ids, r.Tokens) {
			t.Errorf("%q: tokens %v, llama.cpp %v", r.Prompt, ids, r.Tokens)
			continue
		}
		n := len(r.Greedy)
		if n != 32 || len(r.Gaps) != n || len(r.Top) != n {
			t.Fatalf("%q: %d tokens, %d gaps, %d top lists; want 32", r.Prompt, n, len(r.Gaps), len(r.Top))
		}
		var text []byte
		for _, id := range r.Greedy {
			text = tok.AppendPiece(text, id, true)
		}
		if string(text) != r.Text {
			t.Errorf("%q: llama.cpp's greedy tokens read %q, llama-simple printed %q", r.Prompt, text, r.Text)
		}
		seq := m.NewSequence()
		rows := make([]model.Row, len(r.Tokens))
		for i, id := range r.Tokens {
			rows[i] = model.Row{Seq: seq, Token: id, Pos: i, Logits: i == len(r.Tokens)-1}
		}
		logits := make([]float32, v)
		var maxDiff float64
		for s := range n {
			if err := m.Forward(context.Background(), rows, logits); err != nil {
				t.Fatal(err)
			}
			for _, p := range r.Top[s] {
				maxDiff = max(maxDiff, math.Abs(float64(logits[int(p[0])])-p[1]))
			}
			rows = []model.Row{{Seq: seq, Token: r.Greedy[s], Pos: len(r.Tokens) + s, Logits: true}}
		}
		if maxDiff > llamaBound[pi] {
			t.Errorf("%q: top-8 logits differ from llama.cpp's by up to %.3g, want <= %g", r.Prompt, maxDiff, llamaBound[pi])
		}
		got, _ := greedy(t, m, r.Tokens, n)
		robust := 0
		for s := range n {
			if got[s] != r.Greedy[s] {
				t.Errorf("%q step %d: greedy %d, llama.cpp %d (gap %.3g)", r.Prompt, s, got[s], r.Greedy[s], r.Gaps[s])
				break
			}
			robust++
			if r.Gaps[s] <= llamaBound[pi] {
				break
			}
		}
		t.Logf("%q: top-8 logits within %.3g of llama.cpp's; greedy equal for %d of %d steps (robust prefix): %q",
			r.Prompt, maxDiff, robust, n, tok.Decode(got[:robust]))
	}
}
