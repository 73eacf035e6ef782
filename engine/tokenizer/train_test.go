package tokenizer

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestTrainHandWorked: a corpus whose merges can be worked out by hand.
// Words (qwen2 pre-tokenizer) of "ab ab ab abc": "ab" x1, " ab" x2, " abc" x1.
// Pair counts: (a,b) 4, (" ",a) 3, (b,c) 1. Merge 1: "a b" -> "ab" (256).
// Then (" ",ab) 3, (ab,c) 1: merge 2: "Ġ ab" -> "Ġab" (257).
// Then (Ġab,c) 1: merge 3: "Ġab c" -> "Ġabc" (258).
func TestTrainHandWorked(t *testing.T) {
	c := Train("ab ab ab abc", 256+3+1, []string{"<|endoftext|>"})
	wantMerges := []string{"a b", "Ġ ab", "Ġab c"}
	if !slices.Equal(c.Merges, wantMerges) {
		t.Fatalf("merges %q, want %q", c.Merges, wantMerges)
	}
	if got := c.Tokens[256:]; !slices.Equal(got, []string{"ab", "Ġab", "Ġabc", "<|endoftext|>"}) {
		t.Fatalf("new tokens %q", got)
	}
	if c.Types[259] != TypeControl || c.BOS != 259 || c.EOS != 259 || c.Pre != PreQwen2 {
		t.Fatalf("specials: type %d bos %d eos %d pre %q", c.Types[259], c.BOS, c.EOS, c.Pre)
	}
	tok, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	// "ab abc" -> "ab" + " abc"; " abd" -> " ab" + "d" (byte 'd' = id 100).
	if got := tok.Encode("ab abc abd<|endoftext|>", true); !slices.Equal(got, []int32{256, 258, 257, 100, 259}) {
		t.Fatalf("Encode = %v", got)
	}
}

// TestTrainTieBreak: equal pair counts go to the lowest (left, right) ids.
// "ba ab" has the words "ba" and " ab", so the pairs (b,a) = (98,97),
// (Ġ,a) = (32,97) and (a,b) = (97,98) all occur once; (32,97) is smallest.
func TestTrainTieBreak(t *testing.T) {
	c := Train("ba ab", 257, nil)
	if !slices.Equal(c.Merges, []string{"Ġ a"}) {
		t.Fatalf("merges %q, want [\"Ġ a\"]", c.Merges)
	}
	if c.BOS != -1 || c.EOS != -1 {
		t.Fatalf("bos/eos %d %d without specials", c.BOS, c.EOS)
	}
}

func TestTrainDeterministic(t *testing.T) {
	a := Train(Corpus(), 600, DefaultSpecials)
	b := Train(Corpus(), 600, DefaultSpecials)
	if !slices.Equal(a.Tokens, b.Tokens) || !slices.Equal(a.Merges, b.Merges) {
		t.Fatal("two trainings differ")
	}
	if len(a.Tokens) != 600 || len(a.Merges) < 600-256-3 {
		t.Fatalf("%d tokens, %d merges", len(a.Tokens), len(a.Merges))
	}
}

func TestDefaultConfig(t *testing.T) {
	start := time.Now()
	c := DefaultConfig(2048)
	el := time.Since(start)
	t.Logf("DefaultConfig(2048): %v, %d tokens, %d merges", el, len(c.Tokens), len(c.Merges))
	if el > 5*time.Second { // the target is < 1 s; loose bound for a loaded machine
		t.Errorf("training took %v", el)
	}
	if len(c.Tokens) != 2048 {
		t.Fatalf("%d tokens", len(c.Tokens))
	}
	for i, s := range DefaultSpecials {
		id := int32(2048 - len(DefaultSpecials) + i)
		if c.Tokens[id] != s || c.Types[id] != TypeControl {
			t.Fatalf("special %q at %d: %q type %d", s, id, c.Tokens[id], c.Types[id])
		}
	}
	c.Tokens[300] = "mutated"
	if DefaultConfig(2048).Tokens[300] == "mutated" {
		t.Fatal("DefaultConfig shares slices with its cache")
	}
	tok, err := New(DefaultConfig(2048))
	if err != nil {
		t.Fatal(err)
	}
	// The corpus compresses well with its own vocabulary.
	ids := tok.Encode(Corpus(), false)
	ratio := float64(len(Corpus())) / float64(len(ids))
	t.Logf("corpus: %d bytes -> %d tokens (%.2f bytes/token)", len(Corpus()), len(ids), ratio)
	if ratio < 3 {
		t.Errorf("only %.2f bytes/token on the training corpus", ratio)
	}
	if tok.Decode(ids) != Corpus() {
		t.Fatal("corpus does not round-trip")
	}
	chat := "<|im_start|>user\nHello<|im_end|>"
	got := tok.Encode(chat, true)
	if got[0] != tok.textToID["<|im_start|>"] || got[len(got)-1] != tok.textToID["<|im_end|>"] {
		t.Fatalf("chat markers not parsed: %v", got)
	}
	if !tok.IsEOG(got[len(got)-1]) || tok.IsEOG(got[0]) {
		t.Fatal("IsEOG: <|im_end|> ends generation, <|im_start|> does not")
	}
	if d := tok.Decode(got); d != "user\nHello" {
		t.Fatalf("Decode hides control tokens: %q", d)
	}
	if d := tok.Detokenize(got, false, true); d != chat {
		t.Fatalf("Detokenize(unparse) = %q", d)
	}
	if strings.Contains(tok.Decode(tok.Encode(chat, false)), "\ufffd") {
		t.Fatal("unexpected replacement character")
	}
}
