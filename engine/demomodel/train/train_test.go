package train

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// sample is what `bible -l100000` prints for Genesis 1:1-3, Ruth 1:1-2 and
// 1 Samuel 1:1 (the KJV, public domain).
const sample = `
Genesis 1

  1 In the beginning God created the heaven and the earth.
  2 And the earth was without form, and void; and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters.
  3 And God said, Let there be light: and there was light.

Ruth 1

  1 Now it came to pass in the days when the judges ruled, that there was a famine in the land. And a certain man of Bethlehemjudah went to sojourn in the country of Moab, he, and his wife, and his two sons.
  2 And the name of the man was Elimelech, and the name of his wife Naomi, and the name of his two sons Mahlon and Chilion, Ephrathites of Bethlehemjudah. And they came into the country of Moab, and continued there.

1 Samuel 1

  1 Now there was a certain man of Ramathaimzophim, of mount Ephraim, and his name was Elkanah, the son of Jeroham, the son of Elihu, the son of Tohu, the son of Zuph, an Ephrathite:
`

func TestParseKJV(t *testing.T) {
	chs, err := ParseKJV(strings.NewReader(sample), 6)
	if err != nil {
		t.Fatal(err)
	}
	if len(chs) != 3 {
		t.Fatalf("%d chapters, want 3", len(chs))
	}
	for i, want := range []struct {
		book   string
		n, vs  int
		prefix string
	}{{"Genesis", 1, 3, "In the beginning God created"}, {"Ruth", 1, 2, "Now it came to pass"},
		{"1 Samuel", 1, 1, "Now there was a certain man of Ramathaimzophim"}} {
		c := chs[i]
		if c.Book != want.book || c.Number != want.n || len(c.Verses) != want.vs || !strings.HasPrefix(c.Verses[0], want.prefix) {
			t.Errorf("chapter %d: %q %d with %d verses starting %.30q, want %q %d with %d starting %q", i, c.Book,
				c.Number, len(c.Verses), c.Verses[0], want.book, want.n, want.vs, want.prefix)
		}
	}
	if got := chs[0].Text(); !strings.HasPrefix(got, "In the beginning God created the heaven and the earth. And the earth") ||
		!strings.HasSuffix(got, "and there was light.") {
		t.Errorf("Genesis 1 text %q: want the verses joined by single spaces", got)
	}

	tr, ho, err := Split(chs, HeldOutBook)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(tr, "Elimelech") || !strings.Contains(ho, "Elimelech") || strings.Count(tr, "\n") != 2 ||
		strings.Count(ho, "\n") != 1 || !strings.HasSuffix(tr, "an Ephrathite:\n") {
		t.Errorf("Split: train %q, held out %q", tr, ho)
	}
	if _, _, err := Split(chs, "Esther"); !errors.Is(err, ErrCorpus) {
		t.Errorf("Split without the held-out book: %v, want ErrCorpus", err)
	}
}

func TestParseKJVErrors(t *testing.T) {
	for _, c := range []struct{ name, text string }{
		{"verse out of order", "Genesis 1\n\n  1 a\n  3 c\n"},
		{"verse before a heading", "  1 a\n"},
		{"stray line", "Genesis 1\n\n  1 a\nThe end.\n"},
		{"empty chapter", "Genesis 1\n\nGenesis 2\n\n  1 a\n"},
		{"empty", "\n\n"},
		{"wrong count", "Genesis 1\n\n  1 a\n"},
	} {
		want := 0
		if c.name == "wrong count" {
			want = 2
		}
		if _, err := ParseKJV(strings.NewReader(c.text), want); !errors.Is(err, ErrCorpus) {
			t.Errorf("%s: %v, want ErrCorpus", c.name, err)
		}
	}
}

// TestPrepare trains a vocabulary on the tokenizer's own corpus and checks
// what Prepare wrote: the vocabulary's size and the id files, which decode
// back to the texts.
func TestPrepare(t *testing.T) {
	dir := t.TempDir()
	tr, ho := tokenizer.Corpus(), "And the name of the man was Elimelech."
	st, err := Prepare(tr, ho, 600, dir)
	if err != nil {
		t.Fatal(err)
	}
	c, err := ReadTokenizer(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st.Vocab != 600 || len(c.Tokens) != 600 || c.Tokens[599] != "<|im_end|>" {
		t.Fatalf("vocabulary %d / %d tokens, last %q: want 600 ending in <|im_end|>", st.Vocab, len(c.Tokens),
			c.Tokens[len(c.Tokens)-1])
	}
	tok, err := tokenizer.New(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []struct {
		file, text string
		n          int
	}{{FileTrainIDs, tr, st.TrainTokens}, {FileHeldOutIDs, ho, st.HeldOutToks}} {
		b, err := os.ReadFile(filepath.Join(dir, f.file))
		if err != nil {
			t.Fatal(err)
		}
		ids := make([]int32, len(b)/2)
		for i := range ids {
			ids[i] = int32(binary.LittleEndian.Uint16(b[2*i:]))
		}
		if len(ids) != f.n || len(ids) >= len(f.text) {
			t.Errorf("%s: %d ids (Stats %d) for %d bytes", f.file, len(ids), f.n, len(f.text))
		}
		if got := tok.Detokenize(ids, false, false); got != f.text {
			t.Errorf("%s decodes to %.60q..., want the text", f.file, got)
		}
	}
	if _, err := Prepare(tr, ho, 100, dir); err == nil {
		t.Error("a vocabulary of 100 tokens was accepted")
	}
}

// exportFolder writes a training folder holding the F32 values of a
// generated model (modelgen, a small qwen35moe) in the training script's
// format, and returns it with the generated file's bytes.
func exportFolder(t *testing.T) (string, []byte, modelgen.Spec) {
	t.Helper()
	s, err := modelgen.Preset("tiny-qwen35moe")
	if err != nil {
		t.Fatal(err)
	}
	s.Embd, s.SharedFF, s.Experts, s.Type = 64, 64, 4, quant.F32
	data, err := modelgen.Bytes(s)
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := Dequantize(f, dir); err != nil {
		t.Fatal(err)
	}
	tc := tokenizer.DefaultConfig(s.Vocab)
	js, _ := json.Marshal(tc)
	h := HParams{Name: s.Name, Embd: s.Embd, Layers: s.Layers, Heads: s.Heads, HeadsKV: s.HeadsKV,
		HeadDim: s.HeadDim, RopeDim: s.RopeDim, RopeSections: s.RopeSections, RopeBase: s.RopeBase,
		NormEps: s.NormEps, Experts: s.Experts, ExpertsUsed: s.ExpertsUsed, ExpertFF: s.ExpertFF,
		SharedFF: s.SharedFF, FullAttnInterval: s.FullAttnInterval, SSMConv: s.SSMConv, SSMState: s.SSMState,
		SSMGroups: s.SSMGroups, SSMDtRank: s.SSMDtRank, Context: 128, Vocab: len(tc.Tokens)}
	hj, _ := json.Marshal(h)
	for name, b := range map[string][]byte{FileTokenizer: js, FileHParams: hj} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, data, s
}

// TestExportRoundTrip: a generated model's values, exported at F32 with
// its context, give back the generated file byte for byte (so names,
// shapes, metadata and order are the generator's), and at Q8_0 a file
// that engine/model loads (Export checks) with every value within the
// Q8_0 step of the original.
func TestExportRoundTrip(t *testing.T) {
	dir, want, s := exportFolder(t)
	got, err := Export(dir, quant.F32, s.Context)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("F32 export: %d bytes differ from the generated %d", len(got), len(want))
	}
	q, err := Export(dir, quant.Q8_0, s.Context)
	if err != nil {
		t.Fatal(err)
	}
	fq, err := gguf.Parse(q)
	if err != nil {
		t.Fatal(err)
	}
	f32, _ := gguf.Parse(want)
	for _, ti := range f32.Tensors {
		a, _ := f32.Tensor(ti.Name)
		b, err := fq.Tensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		x, y := make([]float32, len(a.Data)/4), make([]float32, len(a.Data)/4)
		_ = quant.Dequantize(a.Type, a.Data, x)
		if err := quant.Dequantize(b.Type, b.Data, y); err != nil {
			t.Fatal(err)
		}
		for blk := 0; blk < len(x); blk += 32 {
			end := min(blk+32, len(x))
			var amax float64
			for _, v := range x[blk:end] {
				amax = max(amax, math.Abs(float64(v)))
			}
			for i := blk; i < end; i++ {
				if d := math.Abs(float64(x[i] - y[i])); d > amax/127*0.51+1e-3*amax {
					t.Fatalf("%s (%v)[%d]: %v vs %v, more than half a Q8_0 step (%g)", ti.Name, b.Type, i, y[i], x[i],
						amax/127)
				}
			}
		}
	}
}

func TestExportErrors(t *testing.T) {
	dir, _, s := exportFolder(t)
	ib, err := os.ReadFile(filepath.Join(dir, FileIndex))
	if err != nil {
		t.Fatal(err)
	}
	orig := map[string]Entry{}
	if err := json.Unmarshal(ib, &orig); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, FileWeights))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		edit func(ix map[string]Entry, raw []byte)
	}{
		{"missing tensor", func(ix map[string]Entry, _ []byte) { delete(ix, "blk.1.ssm_alpha.weight") }},
		{"extra tensor", func(ix map[string]Entry, _ []byte) { ix["blk.9.bogus.weight"] = ix["output_norm.weight"] }},
		{"transposed", func(ix map[string]Entry, _ []byte) {
			e := ix["blk.0.attn_qkv.weight"]
			e.Shape = []int{e.Shape[1], e.Shape[0]}
			ix["blk.0.attn_qkv.weight"] = e
		}},
		{"past the end", func(ix map[string]Entry, raw []byte) {
			e := ix["output_norm.weight"]
			e.Offset = int64(len(raw)) - 8
			ix["output_norm.weight"] = e
		}},
		{"NaN", func(ix map[string]Entry, raw []byte) {
			binary.LittleEndian.PutUint32(raw[ix["blk.3.attn_k_norm.weight"].Offset:], math.Float32bits(float32(math.NaN())))
		}},
	} {
		ix := map[string]Entry{}
		for k, v := range orig {
			ix[k] = v
		}
		r := bytes.Clone(raw)
		c.edit(ix, r)
		js, _ := json.Marshal(ix)
		if err := os.WriteFile(filepath.Join(dir, FileIndex), js, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, FileWeights), r, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Export(dir, quant.Q8_0, s.Context); !errors.Is(err, ErrWeights) {
			t.Errorf("%s: %v, want ErrWeights", c.name, err)
		}
	}
}
