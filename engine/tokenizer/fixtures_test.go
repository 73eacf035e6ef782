package tokenizer

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// findFixtures locates the shared fixtures folder: $KVASIR_FIXTURES, or
// ../shared/fixtures next to the repository root (the folder with go.mod).
// reason is non-empty when it is absent.
func findFixtures() (dir, reason string) {
	if d := os.Getenv("KVASIR_FIXTURES"); d != "" {
		return d, ""
	}
	dir, err := os.Getwd()
	if err != nil {
		return "", err.Error()
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", "fixtures absent: no go.mod above the test directory; set KVASIR_FIXTURES"
		}
		dir = parent
	}
	fx := filepath.Join(dir, "..", "shared", "fixtures")
	if _, err := os.Stat(filepath.Join(fx, "tokenizer", "cases.json")); err != nil {
		return "", "fixtures absent (" + fx + "): set KVASIR_FIXTURES to the folder holding tiny-qwen3moe-*.gguf"
	}
	return fx, ""
}

// fixtureDir returns the fixtures folder or skips the test.
func fixtureDir(t testing.TB) string {
	t.Helper()
	dir, reason := findFixtures()
	if reason != "" {
		t.Skip(reason)
	}
	return dir
}

var (
	fixtureOnce sync.Once
	fixtureCfg  Config
	fixtureErr  error
)

// fixtureConfig reads the GPT-2 vocabulary of the Q4_K_M fixture once.
func fixtureConfig(t testing.TB) Config {
	t.Helper()
	dir := fixtureDir(t)
	fixtureOnce.Do(func() {
		f, err := gguf.Open(filepath.Join(dir, "tiny-qwen3moe-Q4_K_M.gguf"))
		if err != nil {
			fixtureErr = err
			return
		}
		defer f.Close()
		c, err := ConfigFromGGUF(f)
		if err != nil {
			fixtureErr = err
			return
		}
		// gguf copies strings out of the mapping, so c outlives f; the
		// slices are shared with f, so clone them before tests modify c.
		c.Tokens = slices.Clone(c.Tokens)
		c.Merges = slices.Clone(c.Merges)
		fixtureCfg = c
	})
	if fixtureErr != nil {
		t.Fatal(fixtureErr)
	}
	return fixtureCfg
}

// fixtureTokenizer returns the fixture vocabulary with pre-tokenizer pre.
func fixtureTokenizer(t testing.TB, pre string) *Tokenizer {
	t.Helper()
	c := fixtureConfig(t)
	c.Pre = pre
	tok, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestFixtureMetadata(t *testing.T) {
	c := fixtureConfig(t)
	// Values stated in fixtures/README.md.
	if len(c.Tokens) != 50257 || len(c.Merges) != 50000 || c.Pre != PreGPT2 {
		t.Fatalf("tokens %d merges %d pre %q; want 50257, 50000, gpt-2", len(c.Tokens), len(c.Merges), c.Pre)
	}
	if c.BOS != 50256 || c.EOS != 50256 || c.AddBOS || c.AddEOS {
		t.Fatalf("bos %d eos %d add %v %v", c.BOS, c.EOS, c.AddBOS, c.AddEOS)
	}
	tok := fixtureTokenizer(t, PreGPT2)
	if tok.VocabSize() != 50257 || !tok.IsControl(50256) || tok.IsControl(50255) || !tok.IsEOG(50256) {
		t.Fatal("vocabulary accessors disagree with the README")
	}
	if got := tok.Token(50256); got != "<|endoftext|>" {
		t.Fatalf("token 50256 = %q", got)
	}
}

type tokCase struct {
	Name         string  `json:"name"`
	TextHex      string  `json:"text_hex"`
	Pre          string  `json:"pre"`
	ParseSpecial bool    `json:"parse_special"`
	IDs          []int32 `json:"ids"`
	DetokHex     string  `json:"detok_hex"`
}

// TestFixtureCases: llama.cpp's ids for tricky strings, both pre-tokenizers
// (fixtures/tokenizer/README.md), and its detokenization
// (remove_special=false, unparse_special=true).
func TestFixtureCases(t *testing.T) {
	dir := fixtureDir(t)
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []tokCase
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases) == 0 {
		t.Fatal("no cases")
	}
	toks := map[string]*Tokenizer{PreGPT2: fixtureTokenizer(t, PreGPT2), PreQwen2: fixtureTokenizer(t, PreQwen2)}
	for _, c := range cases {
		t.Run(c.Pre+"/"+c.Name, func(t *testing.T) {
			text, err := hex.DecodeString(c.TextHex)
			if err != nil {
				t.Fatal(err)
			}
			tok := toks[c.Pre]
			if tok == nil {
				t.Fatalf("unknown pre %q", c.Pre)
			}
			got := tok.Encode(string(text), c.ParseSpecial)
			if !slices.Equal(got, c.IDs) {
				t.Fatalf("Encode(%q, %v)\n got %v\nwant %v", text, c.ParseSpecial, got, c.IDs)
			}
			want, _ := hex.DecodeString(c.DetokHex)
			if d := tok.Detokenize(c.IDs, false, true); d != string(want) {
				t.Fatalf("Detokenize = %q, want %q", d, want)
			}
		})
	}
}

type refFile struct {
	Prompts []struct {
		Prompt       string   `json:"prompt"`
		PromptHex    string   `json:"prompt_hex"`
		PromptTokens []int32  `json:"prompt_tokens"`
		GenTokens    []int32  `json:"gen_tokens"`
		GenText      string   `json:"gen_text"`
		GenTextHex   string   `json:"gen_text_hex"`
		GenPiecesHex []string `json:"gen_pieces_hex"`
	} `json:"prompts"`
}

// TestFixturePrompts: the prompt ids of every reference (llama_tokenize with
// add_special=true, parse_special=false) and the pieces and detokenized
// text of every greedy continuation.
func TestFixturePrompts(t *testing.T) {
	dir := fixtureDir(t)
	tok := fixtureTokenizer(t, PreGPT2)
	for _, model := range []string{"F16", "Q8_0", "Q4_K_M"} {
		raw, err := os.ReadFile(filepath.Join(dir, "refs", "tiny-qwen3moe-"+model+".ref.json"))
		if err != nil {
			t.Fatal(err)
		}
		var ref refFile
		if err := json.Unmarshal(raw, &ref); err != nil {
			t.Fatal(err)
		}
		if len(ref.Prompts) != 4 {
			t.Fatalf("%s: %d prompts", model, len(ref.Prompts))
		}
		for i, p := range ref.Prompts {
			prompt, _ := hex.DecodeString(p.PromptHex)
			if got := tok.Tokenize(string(prompt), true, false); !slices.Equal(got, p.PromptTokens) {
				t.Errorf("%s prompt %d %q: got %v want %v", model, i, prompt, got, p.PromptTokens)
			}
			if len(p.GenPiecesHex) != len(p.GenTokens) {
				t.Fatalf("%s prompt %d: %d pieces for %d tokens", model, i, len(p.GenPiecesHex), len(p.GenTokens))
			}
			for k, id := range p.GenTokens {
				want, _ := hex.DecodeString(p.GenPiecesHex[k])
				if got := tok.Piece(id); !bytes.Equal(got, want) {
					t.Errorf("%s prompt %d: Piece(%d) = %x, want %x", model, i, id, got, want)
				}
			}
			wantText, _ := hex.DecodeString(p.GenTextHex)
			if got := tok.Decode(p.GenTokens); got != string(wantText) {
				t.Errorf("%s prompt %d: Decode = %q, want %q", model, i, got, wantText)
			}
			// The streaming decoder gives the same text, as valid UTF-8 (the
			// continuations hold no cleanable " ," patterns: Decode equals the
			// concatenated pieces, which the loop above checked).
			d := tok.NewDecoder(false)
			var s string
			for _, id := range p.GenTokens {
				s += d.Add(id)
			}
			s += d.Flush()
			if s != p.GenText {
				t.Errorf("%s prompt %d: Decoder = %q, want %q", model, i, s, p.GenText)
			}
		}
	}
}

// The README's prompt ids, checked by hand against fixtures/README.md.
func TestFixtureReadmePrompts(t *testing.T) {
	tok := fixtureTokenizer(t, PreGPT2)
	cases := []struct {
		text string
		ids  []int32
	}{
		{"The capital of France is", []int32{464, 3139, 286, 4881, 318}},
		{"Hello, world! Hello, world!", []int32{15496, 11, 995, 0, 18435, 11, 995, 0}},
		{"  leading spaces and tabs\tand\nnewlines", []int32{220, 3756, 9029, 290, 22524, 197, 392, 198, 3605, 6615}},
		{"naïve café — 東京 🙂 123456789", []int32{2616, 38776, 40304, 851, 10545, 251, 109, 12859, 105, 32485, 17031, 2231, 3134, 4531}},
	}
	for _, c := range cases {
		if got := tok.Encode(c.text, false); !slices.Equal(got, c.ids) {
			t.Errorf("%q: got %v want %v", c.text, got, c.ids)
		}
		if got := tok.Decode(c.ids); got != c.text {
			t.Errorf("Decode(%v) = %q, want %q", c.ids, got, c.text)
		}
	}
}
