package tokenizer

import (
	"math/rand/v2"
	"testing"
)

// TestMaxTokenBytesBound: every text encodes to at least
// ceil(len(text) / MaxTokenBytes) tokens (the bound serve uses to refuse a
// prompt longer than the context without tokenizing it), on random bytes,
// valid and invalid UTF-8, long runs that merge into the longest tokens,
// and special-token text.
func TestMaxTokenBytesBound(t *testing.T) {
	for _, vocab := range []int{300, 512, 1024} {
		tok, err := New(DefaultConfig(vocab))
		if err != nil {
			t.Fatal(err)
		}
		mb := tok.MaxTokenBytes()
		if mb < 1 {
			t.Fatalf("vocab %d: MaxTokenBytes %d", vocab, mb)
		}
		longest := ""
		for id := range int32(tok.VocabSize()) {
			if s := tok.Decode([]int32{id}); len(s) > len(longest) {
				longest = s
			}
		}
		if len(longest) > mb {
			t.Fatalf("vocab %d: token %q decodes to %d bytes > MaxTokenBytes %d", vocab, longest, len(longest), mb)
		}
		rng := rand.New(rand.NewPCG(uint64(vocab), 1))
		alphabet := []byte("the quick brown fox  \n\n\t  eee    ----====0123456789\xff\xc3\xa9")
		for range 300 {
			n := rng.IntN(400)
			b := make([]byte, n)
			for i := range b {
				if rng.IntN(8) == 0 {
					b[i] = byte(rng.IntN(256))
				} else {
					b[i] = alphabet[rng.IntN(len(alphabet))]
				}
			}
			for _, text := range []string{string(b), longest + string(b) + longest} {
				ids := tok.Tokenize(text, false, true)
				if want := (len(text) + mb - 1) / mb; len(ids) < want {
					t.Fatalf("vocab %d: %q has %d tokens < ceil(%d / %d)", vocab, text, len(ids), len(text), mb)
				}
			}
		}
	}
}
