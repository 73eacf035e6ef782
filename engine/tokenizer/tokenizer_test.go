package tokenizer

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// byteConfig is a vocabulary of the 256 byte tokens only (no merges).
func byteConfig() Config {
	c := Config{Pre: PreQwen2, BOS: -1, EOS: -1}
	for b := range 256 {
		c.Tokens = append(c.Tokens, string(byteToRune[b]))
	}
	return c
}

func TestByteAlphabet(t *testing.T) {
	// GPT-2's bytes_to_unicode: ' ' -> 'Ġ' (U+0120), '\n' -> 'Ċ' (U+010A),
	// 'A' stays, 0xAD (soft hyphen) -> U+0143, 0x00 -> U+0100.
	for b, r := range map[byte]rune{' ': 'Ġ', '\n': 'Ċ', 'A': 'A', 0xAD: 'Ń', 0x00: 'Ā', 0xFF: 'ÿ'} {
		if byteToRune[b] != r {
			t.Errorf("byte %#x -> %q, want %q", b, byteToRune[b], r)
		}
	}
	if len(runeToByte) != 256 {
		t.Fatalf("alphabet not a bijection: %d runes", len(runeToByte))
	}
}

func TestNewErrors(t *testing.T) {
	base := byteConfig()
	mod := func(f func(*Config)) Config {
		c := base
		c.Tokens = slices.Clone(base.Tokens)
		f(&c)
		return c
	}
	cases := []struct {
		name string
		c    Config
		want error
		msg  string
	}{
		{"empty", Config{Pre: PreGPT2}, ErrConfig, "no tokens"},
		{"pre", mod(func(c *Config) { c.Pre = "llama3" }), ErrPreTokenizer, `"llama3" (supported: gpt-2, qwen2, qwen35)`},
		{"types", mod(func(c *Config) { c.Types = []int32{1, 1} }), ErrConfig, "token types"},
		{"bos", mod(func(c *Config) { c.BOS = 256 }), ErrConfig, "BOS/EOS"},
		{"eos", mod(func(c *Config) { c.EOS = -2 }), ErrConfig, "BOS/EOS"},
		{"dup", mod(func(c *Config) { c.Tokens = append(c.Tokens, "a") }), ErrConfig, "duplicate"},
		{"nospace", mod(func(c *Config) { c.Merges = []string{"ab"} }), ErrMerge, "separating space"},
		{"leadspace", mod(func(c *Config) { c.Merges = []string{" a"} }), ErrMerge, "separating space"},
		{"unknown", mod(func(c *Config) { c.Merges = []string{"a bc"} }), ErrMerge, "not in the vocabulary"},
	}
	for _, tc := range cases {
		_, err := New(tc.c)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: err = %v, want %v containing %q", tc.name, err, tc.want, tc.msg)
		}
	}
	if _, err := New(base); err != nil {
		t.Fatal(err)
	}
}

func TestNewQuirks(t *testing.T) {
	c := byteConfig()
	c.Tokens = append(c.Tokens, "", "ab", "<|im_end|>")
	c.Merges = []string{"a b", "a b"} // duplicate pair: first rank kept
	tok, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	if tok.Token(256) != "[EMPTY_256]" {
		t.Errorf("empty token renamed to %q", tok.Token(256))
	}
	// Stored as normal, but llama.cpp forces end-of-turn markers to control.
	if !tok.IsControl(258) || !tok.IsEOG(258) {
		t.Error("<|im_end|> should be a control, end-of-generation token")
	}
	if got := tok.Encode("ab<|im_end|>", true); !slices.Equal(got, []int32{257, 258}) {
		t.Errorf("Encode = %v", got)
	}
	if tok.Piece(258) != nil || string(tok.AppendPiece(nil, 258, true)) != "<|im_end|>" {
		t.Error("control piece rendering")
	}
	if tok.Piece(-1) != nil || tok.Piece(1000) != nil || tok.Type(1000) != TypeUndefined || tok.Token(-5) != "" {
		t.Error("out-of-range ids must render as nothing")
	}
}

func split(p preKind, s string) []string {
	var out []string
	var wb wordBuf
	p.split(normalizeUTF8(s), &wb, func(w string) { out = append(out, w) })
	return out
}

// Hand-worked pre-tokenizations (see the regexes in pretokenize.go).
func TestPreTokenizeHand(t *testing.T) {
	cases := []struct {
		p    preKind
		in   string
		want []string
	}{
		{preGPT2, "Hello  world", []string{"Hello", " ", " world"}},
		{preGPT2, "it's 2024!", []string{"it", "'s", " 2024", "!"}},
		{preGPT2, "IT'S", []string{"IT", "'", "S"}},
		{preGPT2, "a\n\n  b", []string{"a", "\n\n ", " b"}},
		{preGPT2, "x   ", []string{"x", "   "}},
		{preGPT2, " ?!x", []string{" ?!", "x"}},
		{preQwen2, "it's 2024!", []string{"it", "'s", " ", "2", "0", "2", "4", "!"}},
		{preQwen2, "IT'S", []string{"IT", "'S"}},
		{preQwen2, "a\n\n  b", []string{"a", "\n\n", " ", " b"}},
		{preQwen2, "x.\n\ny", []string{"x", ".\n\n", "y"}},
		{preQwen2, "(hello)", []string{"(hello", ")"}},
		{preQwen2, " \n \n  z", []string{" \n \n", " ", " z"}},
		{preQwen2, "\tword", []string{"\tword"}},
	}
	for _, c := range cases {
		if got := split(c.p, c.in); !slices.Equal(got, c.want) {
			t.Errorf("%d %q: got %q want %q", c.p, c.in, got, c.want)
		}
	}
}

// Invalid UTF-8 is seen as llama.cpp's unicode_cpts_from_utf8 sees it.
func TestEncodeInvalidUTF8(t *testing.T) {
	tok, err := New(DefaultConfig(512))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct{ in, same string }{
		{"\xff", "\ufffd"},
		{"a\xe6\x9d", "a\ufffd\ufffd"}, // truncated: each byte is one U+FFFD
		{"\xc0\xaf", "/"},              // overlong '/' decodes to '/'
		{"x\x80y", "x\ufffdy"},
	}
	for _, c := range cases {
		if a, b := tok.Encode(c.in, false), tok.Encode(c.same, false); !slices.Equal(a, b) {
			t.Errorf("Encode(%q) = %v, want Encode(%q) = %v", c.in, a, c.same, b)
		}
	}
	// A surrogate (not valid UTF-8 for Go) keeps its 3 bytes, as in llama.cpp.
	if got := tok.Decode(tok.Encode("\xed\xa0\x80", false)); got != "\xed\xa0\x80" {
		t.Errorf("surrogate round trip = %q", got)
	}
}

// Maximal-subpart replacement; expected values from Python's
// bytes.decode("utf-8", "replace").
func TestToValidUTF8(t *testing.T) {
	cases := []struct{ in, want string }{
		{"\xe6\x9d", "\ufffd"},
		{"\xe6\x9dA", "\ufffdA"},
		{"\xff\xfe", "\ufffd\ufffd"},
		{"\xed\xa0\x80", "\ufffd\ufffd\ufffd"},
		{"\xf0\x9f\x98", "\ufffd"},
		{"\xc0\xaf", "\ufffd\ufffd"},
		{"\xf4\x90\x80\x80", "\ufffd\ufffd\ufffd\ufffd"},
		{"a\xf0\x9f\x98\x80b", "a😀b"},
		{"\xe0\x80\x80", "\ufffd\ufffd\ufffd"},
		{"\xf0\x9f\x98\xe6\x9d\xb1", "\ufffd東"},
		{"\x80", "\ufffd"},
	}
	for _, c := range cases {
		if got := ToValidUTF8([]byte(c.in)); got != c.want {
			t.Errorf("ToValidUTF8(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestDecoderStreaming(t *testing.T) {
	tok, err := New(byteConfig())
	if err != nil {
		t.Fatal(err)
	}
	d := tok.NewDecoder(false)
	// 東 = e6 9d b1, one byte token each.
	if a, b, c := d.Add(0xe6), d.Add(0x9d), d.Add(0xb1); a != "" || b != "" || c != "東" {
		t.Fatalf("got %q %q %q", a, b, c)
	}
	// A broken sequence: e6 9d then 'A' -> U+FFFD then A.
	if a, b, c := d.Add(0xe6), d.Add(0x9d), d.Add('A'); a != "" || b != "" || c != "\ufffdA" {
		t.Fatalf("got %q %q %q", a, b, c)
	}
	// An incomplete tail at Flush -> one U+FFFD.
	if a, b := d.Add(0xf0), d.Flush(); a != "" || b != "\ufffd" {
		t.Fatalf("got %q %q", a, b)
	}
	if d.Flush() != "" {
		t.Fatal("Flush must reset")
	}
}

// llama.cpp's clean_spaces passes, worked by hand.
func TestCleanSpaces(t *testing.T) {
	cases := []struct{ in, want string }{
		{"Hello , world .", "Hello, world."},
		{"what ? no !", "what? no!"},
		{"a ' b", "a'b"},
		{"x ' ' y", "x'' y"}, // the consumed space is NUL for the next check
		{"it 's I 'm we 're you 've I 'll he 'd can 't", "it's I'm we're you've I 'll he 'd can 't"},
		{" ,", ","},
		{"", ""},
	}
	for _, c := range cases {
		if got := string(cleanSpaces([]byte(c.in))); got != c.want {
			t.Errorf("cleanSpaces(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestDetokenizeCleanSpacesGPT2(t *testing.T) {
	tok := fixtureTokenizer(t, PreGPT2)
	ids := tok.Encode("Hello , world . It 's", false)
	if got := tok.Decode(ids); got != "Hello, world. It's" {
		t.Fatalf("gpt-2 Decode = %q", got)
	}
	q := fixtureTokenizer(t, PreQwen2)
	ids = q.Encode("Hello , world .", false)
	if got := q.Decode(ids); got != "Hello , world ." {
		t.Fatalf("qwen2 Decode = %q (no clean-up expected)", got)
	}
}

func TestTokenizeAddSpecial(t *testing.T) {
	c := DefaultConfig(400)
	c.AddBOS, c.AddEOS = true, true
	tok, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	ids := tok.Tokenize("hi", true, false)
	if len(ids) < 3 || ids[0] != tok.BOS() || ids[len(ids)-1] != tok.EOS() {
		t.Fatalf("Tokenize = %v (bos %d eos %d)", ids, tok.BOS(), tok.EOS())
	}
	if got := tok.Detokenize(ids, true, true); got != "hi" {
		t.Fatalf("Detokenize(remove special) = %q", got)
	}
	if got := tok.Detokenize(ids, false, true); got != "<|endoftext|>hi<|endoftext|>" {
		t.Fatalf("Detokenize = %q", got)
	}
}

// TestConcurrentEncode: one Tokenizer used from several goroutines (shared
// word cache) gives the sequential results. Run with -race.
func TestConcurrentEncode(t *testing.T) {
	tok, err := New(DefaultConfig(1024))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(Corpus(), "\n")
	want := make([][]int32, len(lines))
	for i, l := range lines {
		want[i] = tok.Encode(l, true)
	}
	tok.cacheMu.Lock()
	clear(tok.cache)
	tok.cacheMu.Unlock()
	errc := make(chan string, 4)
	for g := range 4 {
		go func() {
			for i := g; i < len(lines); i += 2 {
				if got := tok.Encode(lines[i], true); !slices.Equal(got, want[i]) {
					errc <- lines[i]
					return
				}
			}
			errc <- ""
		}()
	}
	for range 4 {
		if l := <-errc; l != "" {
			t.Fatalf("concurrent Encode differs for %q", l)
		}
	}
}

// Words longer than wordCacheMaxLen bypass the cache and still round-trip.
func TestLongWords(t *testing.T) {
	tok, err := New(DefaultConfig(2048))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{strings.Repeat("the", 400), strings.Repeat("9", 1000), strings.Repeat(" ", 3000) + "x", strings.Repeat("東", 500)} {
		a := tok.Encode(s, false)
		if tok.Decode(a) != s {
			t.Fatalf("round trip of a %d-byte word", len(s))
		}
		if b := tok.Encode(s, false); !slices.Equal(a, b) {
			t.Fatal("second Encode differs")
		}
	}
}
