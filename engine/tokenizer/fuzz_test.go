package tokenizer

import (
	"errors"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

var (
	fuzzOnce sync.Once
	fuzzToks []*Tokenizer
)

// fuzzTokenizers: a trained vocabulary under each pre-tokenizer of
// SupportedPre (gpt-2, qwen2, qwen35).
func fuzzTokenizers(t testing.TB) []*Tokenizer {
	fuzzOnce.Do(func() {
		for _, pre := range SupportedPre {
			c := DefaultConfig(1024)
			c.Pre = pre
			tok, err := New(c)
			if err != nil {
				panic(err)
			}
			fuzzToks = append(fuzzToks, tok)
		}
	})
	return fuzzToks
}

// FuzzEncode: Encode never panics, yields ids in range, and decodes back
// to the input as llama.cpp reads it (invalid bytes as U+FFFD), under every
// pre-tokenizer; the qwen35 words also pass checkQwen35Split (equal to
// qwen2's without marks, marks never split from a preceding letter run).
func FuzzEncode(f *testing.F) {
	for _, s := range []string{
		"", "a", "Hello, world!", "  leading\tand\nnew\r\nlines  ", "it's I'M we'll",
		"naïve café — 東京 🙂 123456789", "<|im_start|>user\nhi<|im_end|>", "<|endoftext|",
		"\xff\xfe", "a\xe6\x9d", "\xc0\xaf", "\xed\xa0\x80", "\xf7\xbf\xbf\xbf", "\xf0\x9f\x98",
		strings.Repeat("ab ", 200), strings.Repeat(" ", 100) + "x", strings.Repeat("9", 50),
		"e\u0301t\u00e9", "नमस्ते हिंदी", "สวัสดี ที่", "שָׁלוֹם", "\u1112\u1161\u11ab\u302e",
		"Cafe\u0301's !!\u0301 '\u0301s", "\u0301\n\u20dd", "#\ufe0f\u20e3", "a \u0301b\xcc",
	} {
		f.Add(s, false)
		f.Add(s, true)
	}
	f.Fuzz(func(t *testing.T, s string, special bool) {
		checkQwen35Split(t, s)
		for _, tok := range fuzzTokenizers(t) {
			ids := tok.Encode(s, special)
			for _, id := range ids {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("id %d out of range", id)
				}
			}
			got := concatPieces(tok, ids, true)
			if want := normalizeUTF8(s); got != want {
				t.Fatalf("pieces of Encode(%q) = %q, want %q", s, got, want)
			}
			if utf8.ValidString(s) && got != s {
				t.Fatalf("valid input %q changed", s)
			}
		}
	})
}

// FuzzDecoder: any id sequence (bytes taken in pairs as little-endian ids,
// some out of range) streams to valid UTF-8 equal to ToValidUTF8 of the
// concatenated pieces.
func FuzzDecoder(f *testing.F) {
	f.Add([]byte{})
	f.Add([]byte{0xe6, 0, 0x9d, 0, 0xb1, 0})
	f.Add([]byte{0xf0, 0, 0x9f, 0, 0x98, 0})
	f.Add([]byte{0xff, 0xff, 0x01, 0x04, 0x41, 0})
	f.Add([]byte{0x00, 0x04, 0x01, 0x04, 0x02, 0x04}) // ids 1024.. (out of range / specials)
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, tok := range fuzzTokenizers(t) {
			for _, special := range []bool{false, true} {
				d := tok.NewDecoder(special)
				var out strings.Builder
				var raw []byte
				for i := 0; i+1 < len(data); i += 2 {
					id := int32(data[i]) | int32(data[i+1])<<8
					id -= 64 // some negative ids too
					raw = tok.AppendPiece(raw, id, special)
					s := d.Add(id)
					if !utf8.ValidString(s) {
						t.Fatalf("Add emitted invalid UTF-8 %q", s)
					}
					out.WriteString(s)
				}
				s := d.Flush()
				if !utf8.ValidString(s) {
					t.Fatalf("Flush emitted invalid UTF-8 %q", s)
				}
				out.WriteString(s)
				if want := ToValidUTF8(raw); out.String() != want {
					t.Fatalf("stream %q != ToValidUTF8(pieces) %q", out.String(), want)
				}
			}
		}
	})
}

// FuzzNew: arbitrary vocabularies and merge lists (newline-separated) are
// accepted or rejected with a sentinel error, never a panic; accepted ones
// encode their own token texts.
func FuzzNew(f *testing.F) {
	f.Add("a\nb\nab\nĠ", "a b", "gpt-2", int32(-1))
	f.Add("a\nb", "a  b\n b", "qwen2", int32(0))
	f.Add("a\na", "", "qwen2", int32(5))
	f.Add("e\n\u0301\ne\u0301", "e \u0301", "qwen35", int32(2))
	f.Add("a", "", "qwen3.5", int32(-1))
	f.Add("x\n\n<|endoftext|>", "x x", "llama3", int32(2))
	f.Fuzz(func(t *testing.T, tokens, merges, pre string, bos int32) {
		c := Config{Tokens: strings.Split(tokens, "\n"), Pre: pre, BOS: bos, EOS: -1}
		if merges != "" {
			c.Merges = strings.Split(merges, "\n")
		}
		c.Types = make([]int32, len(c.Tokens))
		for i := range c.Types {
			c.Types[i] = int32(i % 7)
		}
		tok, err := New(c)
		if err != nil {
			if !errors.Is(err, ErrConfig) && !errors.Is(err, ErrMerge) && !errors.Is(err, ErrPreTokenizer) {
				t.Fatalf("unwrapped error %v", err)
			}
			return
		}
		for i := range c.Tokens {
			for _, id := range tok.Encode(c.Tokens[i], true) {
				if id < 0 || int(id) >= tok.VocabSize() {
					t.Fatalf("id %d out of range", id)
				}
			}
		}
		_ = tok.Decode([]int32{0, 1, 2, -1, 1 << 30})
	})
}

// BenchmarkEncode measures encoding speed (bytes/s) on the embedded corpus
// (28 KB, every word new: pure BPE) and repeated to 1 MiB, with the fixture
// GPT-2 vocabulary when present (else a trained one): "cold" empties the
// word cache first, "warm" reuses it.
func BenchmarkEncode(b *testing.B) {
	var tok *Tokenizer
	if fixtureAvailable() {
		tok = fixtureTokenizer(b, PreGPT2)
	} else {
		tok, _ = New(DefaultConfig(2048))
	}
	big := strings.Repeat(Corpus(), 1<<20/len(Corpus())+1)[:1<<20]
	for _, bc := range []struct {
		name string
		text string
		cold bool
	}{{"corpus-cold", Corpus(), true}, {"1MiB-cold", big, true}, {"1MiB-warm", big, false}} {
		text, cold := bc.text, bc.cold
		b.Run(bc.name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			for b.Loop() {
				if cold {
					tok.cacheMu.Lock()
					clear(tok.cache)
					tok.cacheMu.Unlock()
				}
				tok.Encode(text, false)
			}
		})
	}
}

// BenchmarkDecoder measures streaming decoding of the corpus's ids.
func BenchmarkDecoder(b *testing.B) {
	tok, _ := New(DefaultConfig(2048))
	ids := tok.Encode(Corpus(), false)
	b.SetBytes(int64(len(Corpus())))
	for b.Loop() {
		d := tok.NewDecoder(false)
		for _, id := range ids {
			d.Add(id)
		}
		d.Flush()
	}
}
