package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type goldenCase struct {
	Pre          string   `json:"pre"`
	ParseSpecial bool     `json:"parse_special"`
	Text         string   `json:"text"`
	Words        []string `json:"words"`
	IDs          []int32  `json:"ids"`
}

// loadGolden reads testdata/golden.json, made by testdata/gen_golden.py from
// the Python `regex` module and GPT-2's encoder.py merge loop (independent
// of this package).
func loadGolden(t *testing.T) []goldenCase {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("testdata", "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cs []goldenCase
	if err := json.Unmarshal(raw, &cs); err != nil {
		t.Fatal(err)
	}
	if len(cs) < 100 {
		t.Fatalf("only %d golden cases", len(cs))
	}
	return cs
}

// TestGoldenPreTokenize: the hand-written matchers split 1500 random
// strings of tricky characters (apostrophes, Unicode letters/digits/
// whitespace, emoji, combining marks, CR/LF runs) exactly as the regexes do,
// under gpt-2, qwen2 and qwen35. Needs no fixtures.
func TestGoldenPreTokenize(t *testing.T) {
	kinds := map[string]preKind{PreGPT2: preGPT2, PreQwen2: preQwen2, PreQwen35: preQwen35}
	special := "<|endoftext|>"
	for i, c := range loadGolden(t) {
		k, ok := kinds[c.Pre]
		if !ok {
			t.Fatalf("case %d: pre %q", i, c.Pre)
		}
		parts := []string{c.Text}
		if c.ParseSpecial {
			parts = strings.Split(c.Text, special)
		}
		var got []string
		var wb wordBuf
		for _, p := range parts {
			k.split(p, &wb, func(w string) { got = append(got, w) })
		}
		if !slices.Equal(got, c.Words) && !(len(got) == 0 && len(c.Words) == 0) {
			t.Errorf("case %d %s %q:\n got %q\nwant %q", i, c.Pre, c.Text, got, c.Words)
		}
	}
}

// TestGoldenEncode: token ids of the same strings over the fixture GPT-2
// vocabulary, all three pre-tokenizers, with and without special parsing.
func TestGoldenEncode(t *testing.T) {
	toks := map[string]*Tokenizer{PreGPT2: fixtureTokenizer(t, PreGPT2), PreQwen2: fixtureTokenizer(t, PreQwen2),
		PreQwen35: fixtureTokenizer(t, PreQwen35)}
	for i, c := range loadGolden(t) {
		got := toks[c.Pre].Encode(c.Text, c.ParseSpecial)
		if !slices.Equal(got, c.IDs) && !(len(got) == 0 && len(c.IDs) == 0) {
			t.Errorf("case %d %s special=%v %q:\n got %v\nwant %v", i, c.Pre, c.ParseSpecial, c.Text, got, c.IDs)
		}
	}
}
