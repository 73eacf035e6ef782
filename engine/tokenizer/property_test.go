package tokenizer

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// pieces of random test strings: ASCII words, digits, whitespace runs,
// contractions, punctuation, Latin-1, CJK, emoji with modifiers, combining
// marks, and special-token text.
var randPieces = []string{
	"the", " cat", "Sat", "ON", "x", "'s", "'RE", "'ll", "'", " '", "0", "42", " 1999", "٣", "²",
	" ", "  ", "\t", "\n", "\r\n", "\n\n", " \n ", "\u00a0", "\u3000", "\u2028", "\u0085", "\v",
	".", ",", "!", "?", " ?", " ,", "--", "(", ")", "#", "\"", "<", "|", ">", "—", "…", "$",
	"é", "ñ", "ü", "ß", "naïve", "Жд", "東京", "日本語", "α", "ǅ", "ا",
	"🙂", "👍🏽", "❤️", "🦙", "e\u0301", "\u200d", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "\x00", "\x7f",
}

func randString(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(20) + 1 {
		if r.IntN(8) == 0 {
			// any code point (valid, non-surrogate)
			for {
				c := rune(r.IntN(0x110000))
				if utf8.ValidRune(c) {
					b.WriteRune(c)
					break
				}
			}
			continue
		}
		b.WriteString(randPieces[r.IntN(len(randPieces))])
	}
	return b.String()
}

// concatPieces is Detokenize without llama.cpp's space clean-up.
func concatPieces(t *Tokenizer, ids []int32, special bool) string {
	var b []byte
	for _, id := range ids {
		b = t.AppendPiece(b, id, special)
	}
	return string(b)
}

// hasCleanup reports whether llama.cpp's gpt-2 clean-up would change s.
func hasCleanup(s string) bool {
	for _, p := range []string{" ?", " !", " .", " ,", " '"} {
		if strings.Contains(s, p) {
			return true
		}
	}
	return false
}

// TestRoundTrip: Decode(Encode(s)) == s for random valid UTF-8, with the
// fixture GPT-2 vocabulary (both pre-tokenizers; for gpt-2 the clean-up is
// excluded by comparing concatenated pieces) and trained vocabularies.
func TestRoundTrip(t *testing.T) {
	type vocab struct {
		name string
		tok  *Tokenizer
	}
	var vocabs []vocab
	for _, n := range []int{300, 2048} {
		tok, err := New(DefaultConfig(n))
		if err != nil {
			t.Fatal(err)
		}
		vocabs = append(vocabs, vocab{fmt.Sprintf("trained-%d", n), tok})
	}
	if fixtureAvailable() {
		vocabs = append(vocabs, vocab{"fixture-gpt2", fixtureTokenizer(t, PreGPT2)}, vocab{"fixture-qwen2", fixtureTokenizer(t, PreQwen2)})
	} else {
		t.Log("fixtures absent: round trip on trained vocabularies only")
	}
	r := rand.New(rand.NewPCG(1, 2))
	n := 3000
	if testing.Short() {
		n = 300
	}
	for range n {
		s := randString(r)
		for _, v := range vocabs {
			for _, special := range []bool{false, true} {
				ids := v.tok.Encode(s, special)
				for _, id := range ids {
					if id < 0 || int(id) >= v.tok.VocabSize() {
						t.Fatalf("%s: id %d out of range for %q", v.name, id, s)
					}
				}
				if got := concatPieces(v.tok, ids, true); got != s {
					t.Fatalf("%s special=%v: pieces of %q give %q (ids %v)", v.name, special, s, got, ids)
				}
				if got := v.tok.Detokenize(ids, false, true); got != s && (v.tok.Pre() != PreGPT2 || !hasCleanup(s)) {
					t.Fatalf("%s special=%v: Detokenize(Encode(%q)) = %q", v.name, special, s, got)
				}
				// Streaming the ids gives the same text.
				d := v.tok.NewDecoder(true)
				var b strings.Builder
				for _, id := range ids {
					b.WriteString(d.Add(id))
				}
				b.WriteString(d.Flush())
				if b.String() != s {
					t.Fatalf("%s: Decoder gives %q for %q", v.name, b.String(), s)
				}
			}
		}
	}
}

func fixtureAvailable() bool {
	_, reason := findFixtures()
	return reason == ""
}

// TestGGUFRoundTrip: WriteGGUF then FromGGUF gives the same tokenizer.
func TestGGUFRoundTrip(t *testing.T) {
	c := DefaultConfig(700)
	c.AddBOS = true
	w := gguf.NewWriter()
	w.SetString("general.architecture", "qwen3moe")
	c.WriteGGUF(w)
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	got, err := ConfigFromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	if !slicesEqual(got.Tokens, c.Tokens) || !slicesEqual(got.Merges, c.Merges) || got.Pre != c.Pre ||
		got.BOS != c.BOS || got.EOS != c.EOS || got.AddBOS != true || got.AddEOS != false {
		t.Fatal("config changed through GGUF")
	}
	for i := range c.Types {
		if got.Types[i] != c.Types[i] {
			t.Fatalf("type %d: %d vs %d", i, got.Types[i], c.Types[i])
		}
	}
	if _, err := FromGGUF(f); err != nil {
		t.Fatal(err)
	}
}

func slicesEqual(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestFromGGUFErrorsAndDefaults(t *testing.T) {
	c := byteConfig()
	build := func(f func(w *gguf.Writer)) *gguf.File {
		t.Helper()
		w := gguf.NewWriter()
		f(w)
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		file, err := gguf.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return file
	}
	minimal := func(w *gguf.Writer) {
		w.SetString(KeyModel, ModelGPT2)
		w.SetString(KeyPre, PreQwen2)
		w.SetStrings(KeyTokens, c.Tokens)
		w.SetStrings(KeyMerges, nil)
	}
	// Defaults: all normal, BOS = EOS = 11 (llama.cpp's BPE default), no add.
	got, err := ConfigFromGGUF(build(minimal))
	if err != nil {
		t.Fatal(err)
	}
	if got.BOS != 11 || got.EOS != 11 || got.AddBOS || got.AddEOS || got.Types != nil {
		t.Fatalf("defaults: %+v", got.BOS)
	}
	// An out-of-range stored id keeps the default.
	got, _ = ConfigFromGGUF(build(func(w *gguf.Writer) { minimal(w); w.SetUint32(KeyEOS, 999) }))
	if got.EOS != 11 {
		t.Fatalf("out-of-range eos -> %d", got.EOS)
	}
	errCases := []struct {
		name string
		f    func(w *gguf.Writer)
		want error
	}{
		{"model", func(w *gguf.Writer) { minimal(w); w.SetString(KeyModel, "llama") }, ErrModel},
		{"nomodel", func(w *gguf.Writer) { w.SetString(KeyPre, PreGPT2) }, gguf.ErrMissingKey},
		{"nopre", func(w *gguf.Writer) { w.SetString(KeyModel, ModelGPT2) }, gguf.ErrMissingKey},
		{"pre", func(w *gguf.Writer) { minimal(w); w.SetString(KeyPre, "llama3") }, ErrPreTokenizer},
		{"tokentype", func(w *gguf.Writer) { minimal(w); w.SetString(KeyTypes, "x") }, gguf.ErrKeyType},
		{"bostype", func(w *gguf.Writer) { minimal(w); w.SetString(KeyBOS, "x") }, gguf.ErrKeyType},
		{"merge", func(w *gguf.Writer) { minimal(w); w.SetStrings(KeyMerges, []string{"a zz"}) }, ErrMerge},
	}
	for _, ec := range errCases {
		if _, err := FromGGUF(build(ec.f)); !errors.Is(err, ec.want) {
			t.Errorf("%s: err = %v, want %v", ec.name, err, ec.want)
		}
	}
}
