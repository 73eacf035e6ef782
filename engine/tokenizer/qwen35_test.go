package tokenizer

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// qwen35Cases: hand-worked splits under the qwen2 and the qwen35 regexes
// (pretokenize.go). In qwen2 a combining mark (\p{M}) is "other": it joins
// punctuation runs, or is the optional first character of a letter run. In
// qwen35 it belongs to the letter runs [\p{L}\p{M}]+. Every row was also
// checked with the Python `regex` module running both patterns.
var qwen35Cases = []struct {
	name       string
	in         string
	qwen2, q35 []string
}{
	// é as e + U+0301, then a precomposed é (U+00E9, a letter).
	{"latin-nfd", "e\u0301t\u00e9", []string{"e", "\u0301té"}, []string{"e\u0301té"}},
	// न म स (Lo) ् (virama, Mn) त (Lo) े (vowel sign E, Mn).
	{"devanagari", "नमस्ते", []string{"नमस", "्त", "े"}, []string{"नमस्ते"}},
	// ह (Lo) ि (Mc) ं (Mn) द (Lo) ी (Mc): spacing marks are \p{M} too.
	{"devanagari-mc", "हिंदी", []string{"ह", "िं", "द", "ी"}, []string{"हिंदी"}},
	// ส ว (Lo) ั (Mn) ส ด (Lo) ี (Mn).
	{"thai", "สวัสดี", []string{"สว", "ัสด", "ี"}, []string{"สวัสดี"}},
	// ท (Lo) ี (Mn) ่ (tone mark, Mn): two marks make a qwen2 "other" run.
	{"thai-tone", "ที่", []string{"ท", "ี่"}, []string{"ที่"}},
	// All Lo (Thai vowels written before/after are letters): no difference.
	{"thai-letters", "ภาษาไทย", []string{"ภาษาไทย"}, []string{"ภาษาไทย"}},
	// ש (Lo) ָ ׁ (qamats, shin dot: Mn) ל ו (Lo) ֹ (holam, Mn) ם (Lo).
	{"hebrew-niqqud", "שָׁלוֹם", []string{"ש", "ָׁ", "לו", "ֹם"}, []string{"שָׁלוֹם"}},
	// Conjoining jamo U+1100..U+11FF are letters (Lo): no difference.
	{"korean-jamo", "\u1112\u1161\u11ab \u1100\u1173\u11af",
		[]string{"\u1112\u1161\u11ab", " \u1100\u1173\u11af"}, []string{"\u1112\u1161\u11ab", " \u1100\u1173\u11af"}},
	// U+302E HANGUL SINGLE DOT TONE MARK is Mc.
	{"korean-tone-mark", "\u1112\u1161\u11ab\u302e", []string{"\u1112\u1161\u11ab", "\u302e"}, []string{"\u1112\u1161\u11ab\u302e"}},
	// Decomposed Vietnamese: stacked marks inside words.
	{"vietnamese-nfd", "Tie\u0302\u0301ng Vie\u0323\u0302t",
		[]string{"Tie", "\u0302\u0301", "ng", " Vie", "\u0323\u0302", "t"}, []string{"Tie\u0302\u0301ng", " Vie\u0323\u0302t"}},
	// A mark before a contraction: qwen2 puts it in a run with the '.
	{"mark-contraction", "Cafe\u0301's", []string{"Cafe", "\u0301'", "s"}, []string{"Cafe\u0301", "'s"}},
	// U+20DD (Me, enclosing) ends the letter run in qwen2, not in qwen35.
	{"enclosing-mark", "x\u0301\u20dd!", []string{"x", "\u0301\u20dd!"}, []string{"x\u0301\u20dd", "!"}},
	// A space before a mark: qwen35's optional prefix takes the space.
	{"space-mark-letter", "a \u0301b", []string{"a", " \u0301", "b"}, []string{"a", " \u0301b"}},
	// Punctuation then a mark then a letter.
	{"punct-mark-letter", ".\u0301a", []string{".\u0301", "a"}, []string{".\u0301a"}},
	// qwen35 punctuation runs stop at a mark; a lone mark is a letter run.
	{"punct-run-mark", "!!\u0301", []string{"!!\u0301"}, []string{"!!", "\u0301"}},
	// qwen2's run ' ?[^\s\p{L}\p{N}]+[\r\n]*' takes the newline too.
	{"mark-newline", "\u0301\n", []string{"\u0301\n"}, []string{"\u0301", "\n"}},
	// ' not followed by a contraction letter: qwen35's prefix takes it.
	{"quote-mark-s", "'\u0301s", []string{"'\u0301", "s"}, []string{"'\u0301s"}},
	// Leading marks: an "other" run in qwen2, part of the word in qwen35.
	{"leading-marks", "\u0301\u0302x", []string{"\u0301\u0302", "x"}, []string{"\u0301\u0302x"}},
	// Same splits, different alternatives.
	{"space-mark", " \u0301", []string{" \u0301"}, []string{" \u0301"}},
	{"two-spaces-mark", "  \u0301", []string{" ", " \u0301"}, []string{" ", " \u0301"}},
	{"contraction-mark", "'s\u0301", []string{"'s", "\u0301"}, []string{"'s", "\u0301"}},
	{"digits-mark", "1\u0301a2", []string{"1", "\u0301a", "2"}, []string{"1", "\u0301a", "2"}},
	{"newline-mark", "\n\u0301", []string{"\n", "\u0301"}, []string{"\n", "\u0301"}},
	{"crlf-mark", "\r\n\u0301a", []string{"\r\n", "\u0301a"}, []string{"\r\n", "\u0301a"}},
	// Keycaps: U+FE0F (Mn) and U+20E3 (Me).
	{"keycap-hash", "#\ufe0f\u20e3", []string{"#\ufe0f\u20e3"}, []string{"#\ufe0f\u20e3"}},
	{"keycap-digit", "1\ufe0f\u20e3", []string{"1", "\ufe0f\u20e3"}, []string{"1", "\ufe0f\u20e3"}},
	// Without marks qwen35 is qwen2 (contractions in either case, single
	// digits, newline runs).
	{"no-marks", "IT'S 2024!\n\n  ok", []string{"IT", "'S", " ", "2", "0", "2", "4", "!\n\n", " ", " ok"},
		[]string{"IT", "'S", " ", "2", "0", "2", "4", "!\n\n", " ", " ok"}},
}

func TestPreTokenizeQwen35(t *testing.T) {
	for _, c := range qwen35Cases {
		if got := split(preQwen2, c.in); !slices.Equal(got, c.qwen2) {
			t.Errorf("%s: qwen2 %q: got %q want %q", c.name, c.in, got, c.qwen2)
		}
		if got := split(preQwen35, c.in); !slices.Equal(got, c.q35) {
			t.Errorf("%s: qwen35 %q: got %q want %q", c.name, c.in, got, c.q35)
		}
		if strings.Join(c.qwen2, "") != c.in || strings.Join(c.q35, "") != c.in {
			t.Errorf("%s: table rows do not concatenate to the input", c.name)
		}
	}
}

func hasMark(s string) bool {
	for _, r := range s {
		if unicode.IsMark(r) {
			return true
		}
	}
	return false
}

// checkQwen35Split: the split of s concatenates to s, equals qwen2's when s
// has no mark, and a word ending in a letter or mark is followed by a mark
// only when it is a contraction (every other alternative that can end in
// \p{L} or \p{M} is the greedy [\p{L}\p{M}]+).
func checkQwen35Split(t testing.TB, s string) {
	s = normalizeUTF8(s)
	words := split(preQwen35, s)
	if strings.Join(words, "") != s {
		t.Fatalf("qwen35 words %q do not concatenate to %q", words, s)
	}
	if !hasMark(s) {
		if q2 := split(preQwen2, s); !slices.Equal(words, q2) {
			t.Fatalf("mark-free %q: qwen35 %q != qwen2 %q", s, words, q2)
		}
	}
	for i := 0; i+1 < len(words); i++ {
		w, next := []rune(words[i]), []rune(words[i+1])
		last := w[len(w)-1]
		if !unicode.IsMark(next[0]) || !(unicode.IsLetter(last) || unicode.IsMark(last)) {
			continue
		}
		lw := strings.ToLower(words[i])
		if !slices.Contains([]string{"'s", "'t", "'m", "'d", "'re", "'ve", "'ll"}, lw) {
			t.Fatalf("%q: word %q is followed by the mark-initial word %q", s, words[i], words[i+1])
		}
	}
}

// Random strings of letters, marks (Mn, Mc, Me), digits, spaces and
// punctuation satisfy checkQwen35Split.
func TestQwen35Properties(t *testing.T) {
	r := rand.New(rand.NewPCG(35, 35))
	marks := []string{"\u0301", "\u0323", "\u094d", "\u093f", "\u0e31", "\u0e48", "\u05b8", "\u302e", "\u20dd", "\ufe0f", "\u20e3"}
	for range 3000 {
		s := randString(r)
		if r.IntN(2) == 0 {
			var b strings.Builder
			for _, p := range strings.SplitAfter(s, "") {
				b.WriteString(p)
				if r.IntN(3) == 0 {
					b.WriteString(marks[r.IntN(len(marks))])
				}
			}
			s = b.String()
		}
		checkQwen35Split(t, s)
	}
	for _, c := range qwen35Cases {
		checkQwen35Split(t, c.in)
	}
}

// "qwen35" is accepted by New and FromGGUF, keeps the text on decoding
// (clean_spaces off, as for qwen2), and unknown names stay an error that
// names them.
func TestNewQwen35(t *testing.T) {
	c := DefaultConfig(512)
	c.Pre = PreQwen35
	tok, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Pre() != "qwen35" {
		t.Fatalf("Pre() = %q", tok.Pre())
	}
	for _, s := range []string{"hello , world ?", "e\u0301t\u00e9 नमस्ते", "it 's"} {
		if got := tok.Decode(tok.Encode(s, false)); got != s {
			t.Errorf("Decode(Encode(%q)) = %q", s, got)
		}
	}
	if !slices.Contains(SupportedPre, PreQwen35) {
		t.Fatal("SupportedPre lacks qwen35")
	}

	for _, name := range []string{"qwen3.5", "Qwen35", "qwen35 ", "qwen3", ""} {
		c.Pre = name
		_, err := New(c)
		if !errors.Is(err, ErrPreTokenizer) || !strings.Contains(err.Error(), `"`+name+`"`) ||
			!strings.Contains(err.Error(), "supported: gpt-2, qwen2, qwen35") {
			t.Errorf("New(Pre=%q): err = %v", name, err)
		}
	}

	w := gguf.NewWriter()
	bc := byteConfig()
	w.SetString(KeyModel, ModelGPT2)
	w.SetString(KeyPre, PreQwen35)
	w.SetStrings(KeyTokens, bc.Tokens)
	w.SetStrings(KeyMerges, nil)
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	file, err := gguf.Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	gtok, err := FromGGUF(file)
	if err != nil {
		t.Fatal(err)
	}
	if gtok.Pre() != PreQwen35 {
		t.Fatalf("FromGGUF Pre() = %q", gtok.Pre())
	}
	// With single-byte tokens only, the ids are the bytes, so the words
	// are not visible; Encode must still cover the input.
	s := "Cafe\u0301's नमस्ते"
	if got := concatPieces(gtok, gtok.Encode(s, false), false); got != s {
		t.Fatalf("pieces = %q", got)
	}
}
