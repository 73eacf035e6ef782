// Package tokenizer implements the byte-level BPE tokenizer that llama.cpp
// uses for GGUF models with tokenizer.ggml.model = "gpt2" (GPT-2, Qwen2/3 and
// most other BPE vocabularies), token for token:
//
//  1. special tokens (control, user-defined, unknown) are split out of the
//     text first (llama_vocab::impl::tokenizer_st_partition);
//  2. each remaining fragment is cut into words by the pre-tokenizer regex
//     named by tokenizer.ggml.pre ("gpt-2", "qwen2" or "qwen35", see
//     pretokenize.go);
//  3. each word's bytes are mapped to the GPT-2 byte alphabet and merged by
//     rank with the vocabulary's merge list (llm_tokenizer_bpe_session).
//
// Decoding maps token text back to bytes; Decoder streams it as complete
// UTF-8. Train builds a small vocabulary for generated models.
//
// Source: llama.cpp src/llama-vocab.cpp and src/unicode.cpp at commit
// 3f545beccee69d9975f466ec7e45fd9aacd8ba90; the byte alphabet is OpenAI
// GPT-2's bytes_to_unicode (encoder.py).
package tokenizer

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// Sentinel errors; errors returned by New and FromGGUF wrap one of them.
var (
	// ErrConfig: a Config field is out of range or inconsistent (no tokens,
	// duplicate token texts, fewer token types than tokens, BOS/EOS id out
	// of range).
	ErrConfig = errors.New("tokenizer: invalid config")
	// ErrPreTokenizer: tokenizer.ggml.pre names a pre-tokenizer this package
	// does not implement.
	ErrPreTokenizer = errors.New("tokenizer: unsupported pre-tokenizer")
	// ErrMerge: a merge is not of the form "LEFT RIGHT" or names a token that
	// is not in the vocabulary.
	ErrMerge = errors.New("tokenizer: invalid merge")
	// ErrModel: tokenizer.ggml.model is not "gpt2" (byte-level BPE).
	ErrModel = errors.New("tokenizer: unsupported tokenizer model")
)

// Token types as stored in tokenizer.ggml.token_type (enum llama_token_type
// in llama.cpp include/llama.h).
const (
	TypeUndefined   int32 = 0
	TypeNormal      int32 = 1
	TypeUnknown     int32 = 2
	TypeControl     int32 = 3
	TypeUserDefined int32 = 4
	TypeUnused      int32 = 5
	TypeByte        int32 = 6
)

// Pre-tokenizer names accepted in Config.Pre (tokenizer.ggml.pre), as
// llama.cpp's llama_vocab::impl::load (src/llama-vocab.cpp) maps them to
// LLAMA_VOCAB_PRE_TYPE_*; the regexes are in pretokenize.go.
const (
	// PreGPT2 selects LLAMA_VOCAB_PRE_TYPE_GPT2 (clean_spaces on).
	PreGPT2 = "gpt-2"
	// PreQwen2 selects LLAMA_VOCAB_PRE_TYPE_QWEN2 (clean_spaces off).
	PreQwen2 = "qwen2"
	// PreQwen35 selects LLAMA_VOCAB_PRE_TYPE_QWEN35 (Qwen3.5; clean_spaces
	// off): the qwen2 regex with combining marks \p{M} added to the letter
	// runs, "[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+", and taken out of the
	// punctuation runs, " ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*" (llama.cpp
	// src/llama-vocab.cpp; unicode_regex_split_custom_qwen35 in
	// src/unicode.cpp).
	PreQwen35 = "qwen35"
)

// SupportedPre lists the accepted Config.Pre values, in the order error
// messages give them (llama.cpp src/llama-vocab.cpp names them in
// tokenizer.ggml.pre).
var SupportedPre = []string{PreGPT2, PreQwen2, PreQwen35}

// MaxVocab bounds the vocabulary size (token ids are int32).
const MaxVocab = math.MaxInt32

// Config describes a byte-level BPE vocabulary, as stored in a GGUF file's
// tokenizer.ggml.* metadata.
type Config struct {
	// Tokens holds the text of each token id, in the GPT-2 byte alphabet for
	// normal tokens (e.g. "Ġthe" for " the") and verbatim for special ones.
	// Texts must be distinct; an empty text becomes "[EMPTY_<id>]".
	Tokens []string
	// Types holds the token type of each id (TypeNormal, TypeControl, ...).
	// Empty means every token is TypeNormal (llama.cpp's default when
	// tokenizer.ggml.token_type is absent); otherwise len(Types) >= len(Tokens)
	// and extra entries are ignored. Tokens named like end-of-turn markers
	// (<|im_end|>, <|endoftext|>, ...) become TypeControl, as in llama.cpp.
	Types []int32
	// Merges lists "LEFT RIGHT" pairs, highest priority (rank 0) first. LEFT
	// and RIGHT must be tokens; the first occurrence of a pair sets its rank.
	Merges []string
	// Pre names the pre-tokenizer: PreGPT2, PreQwen2 or PreQwen35.
	Pre string
	// BOS and EOS are token ids, or -1 for none.
	BOS, EOS int32
	// AddBOS and AddEOS: Tokenize with addSpecial prepends BOS / appends EOS.
	AddBOS, AddEOS bool
}

// Tokenizer encodes text to token ids and back. It is safe for concurrent
// use by multiple goroutines.
type Tokenizer struct {
	tokens []string
	// maxTokBytes is the longest token text in bytes (MaxTokenBytes).
	maxTokBytes int
	types       []int32
	textToID    map[string]int32
	// merges maps a pair of token ids (left<<32 | right) to its rank and the
	// id of the concatenated text (-1 if that text is not a token).
	merges      map[uint64]merge
	pre         preKind
	preName     string
	cleanSpaces bool
	// specials: control, user-defined and unknown tokens, longest text first
	// (llama.cpp cache_special_tokens).
	specials []int32
	byteTok  [256]int32 // token id of each byte's one-char text, or -1
	bos, eos int32
	addBOS   bool
	addEOS   bool
	eog      map[int32]bool
	// pieceOff/pieceData: bytes of each token as token_to_piece renders it
	// (decoded bytes for normal tokens, verbatim text for special ones).
	pieceOff  []uint32
	pieceData []byte

	cacheMu sync.Mutex
	cache   map[string][]int32
}

type merge struct {
	rank   int32
	result int32
}

// wordCacheCap bounds the number of words whose BPE result is cached (the
// cache is emptied when it is full), and wordCacheMaxLen the length in bytes
// of a cached word, so the cache stays below about 20 MB.
const (
	wordCacheCap    = 1 << 16
	wordCacheMaxLen = 256
)

// New validates c and builds a Tokenizer. Errors wrap ErrConfig,
// ErrPreTokenizer or ErrMerge. The Config's slices are not retained.
func New(c Config) (*Tokenizer, error) {
	n := len(c.Tokens)
	if n == 0 {
		return nil, fmt.Errorf("%w: no tokens", ErrConfig)
	}
	if int64(n) > MaxVocab {
		return nil, fmt.Errorf("%w: %d tokens (max %d)", ErrConfig, n, int64(MaxVocab))
	}
	if len(c.Types) != 0 && len(c.Types) < n {
		return nil, fmt.Errorf("%w: %d token types for %d tokens", ErrConfig, len(c.Types), n)
	}
	t := &Tokenizer{
		tokens:   append([]string(nil), c.Tokens...),
		types:    make([]int32, n),
		textToID: make(map[string]int32, n),
		bos:      c.BOS,
		eos:      c.EOS,
		addBOS:   c.AddBOS,
		addEOS:   c.AddEOS,
		cache:    make(map[string][]int32),
		preName:  c.Pre,
	}
	switch c.Pre {
	case PreGPT2:
		t.pre, t.cleanSpaces = preGPT2, true
	case PreQwen2:
		t.pre, t.cleanSpaces = preQwen2, false
	case PreQwen35:
		t.pre, t.cleanSpaces = preQwen35, false
	default:
		return nil, fmt.Errorf("%w: %q (supported: %s)", ErrPreTokenizer, c.Pre, strings.Join(SupportedPre, ", "))
	}
	for _, id := range []int32{c.BOS, c.EOS} {
		if id < -1 || int64(id) >= int64(n) {
			return nil, fmt.Errorf("%w: BOS/EOS id %d outside [-1, %d)", ErrConfig, id, n)
		}
	}
	for i := range n {
		if len(c.Types) != 0 {
			t.types[i] = c.Types[i]
		} else {
			t.types[i] = TypeNormal
		}
		if t.tokens[i] == "" {
			// llama.cpp renames empty tokens so that they stay distinct.
			t.tokens[i] = "[EMPTY_" + strconv.Itoa(i) + "]"
		}
		if j, dup := t.textToID[t.tokens[i]]; dup {
			return nil, fmt.Errorf("%w: duplicate token %q has ids %d and %d", ErrConfig, t.tokens[i], j, i)
		}
		t.textToID[t.tokens[i]] = int32(i)
		t.maxTokBytes = max(t.maxTokBytes, len(t.tokens[i]))
	}
	// Tokens that look like end-of-turn / fill-in-the-middle markers are
	// control tokens whatever their stored type (llama_vocab::impl::load,
	// "auto-detect special tokens by text").
	for _, s := range forcedControlTexts {
		if id, ok := t.textToID[s]; ok && t.types[id] != TypeControl {
			t.types[id] = TypeControl
		}
	}
	for b := range 256 {
		t.byteTok[b] = -1
		if id, ok := t.textToID[string(byteToRune[b])]; ok {
			t.byteTok[b] = id
		}
	}
	t.merges = make(map[uint64]merge, len(c.Merges))
	for rank, m := range c.Merges {
		// llama.cpp: word.find(' ', 1): the separator is the first space
		// after the first byte.
		k := -1
		if len(m) > 1 {
			if j := strings.IndexByte(m[1:], ' '); j >= 0 {
				k = j + 1
			}
		}
		if k < 0 {
			return nil, fmt.Errorf("%w: merge %d %q has no separating space", ErrMerge, rank, m)
		}
		left, right := m[:k], m[k+1:]
		l, okL := t.textToID[left]
		r, okR := t.textToID[right]
		if !okL || !okR {
			return nil, fmt.Errorf("%w: merge %d %q names a token not in the vocabulary", ErrMerge, rank, m)
		}
		key := pairKey(l, r)
		if _, dup := t.merges[key]; dup {
			continue // std::map::emplace keeps the first rank
		}
		res, ok := t.textToID[left+right]
		if !ok {
			res = -1
		}
		t.merges[key] = merge{rank: int32(min(rank, math.MaxInt32)), result: res}
	}
	for i, ty := range t.types {
		if (ty == TypeControl || ty == TypeUserDefined || ty == TypeUnknown) && t.tokens[i] != "" {
			t.specials = append(t.specials, int32(i))
		}
	}
	sort.SliceStable(t.specials, func(a, b int) bool {
		return len(t.tokens[t.specials[a]]) > len(t.tokens[t.specials[b]])
	})
	t.buildPieces()
	t.buildEOG()
	return t, nil
}

func pairKey(l, r int32) uint64 { return uint64(uint32(l))<<32 | uint64(uint32(r)) }

// eogTexts are the token texts that end generation (the special_eog_ids
// list of llama_vocab::impl::load; Qwen's fill-in-the-middle pad, repo and
// file-separator tokens are end-of-generation there too).
var eogTexts = []string{
	"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
	"<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>",
	"<|fim_pad|>", "<|fim_repo|>", "<|repo_name|>", "<|file_sep|>",
}

// forcedControlTexts: eogTexts plus Qwen's fill-in-the-middle markers, which
// llama.cpp turns into control tokens when the file marks them otherwise.
var forcedControlTexts = append([]string{"<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"}, eogTexts...)

func (t *Tokenizer) buildEOG() {
	t.eog = make(map[int32]bool)
	if t.eos >= 0 {
		t.eog[t.eos] = true
	}
	for _, s := range eogTexts {
		if id, ok := t.textToID[s]; ok {
			t.eog[id] = true
		}
	}
}

// VocabSize returns the number of tokens; valid ids are [0, VocabSize()).
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// MaxTokenBytes returns the length in bytes of the vocabulary's longest
// token text (stored form: at least the bytes it decodes to, since every
// GPT-2 alphabet character stands for one byte). Every token Tokenize
// emits covers at least one and at most MaxTokenBytes bytes of the
// (UTF-8-normalised, never shorter) input, so a text of b bytes encodes to
// at least ceil(b / MaxTokenBytes) tokens: a bound that lets a server
// refuse an over-long prompt without tokenizing it.
func (t *Tokenizer) MaxTokenBytes() int { return t.maxTokBytes }

// Pre returns the pre-tokenizer name (PreGPT2 or PreQwen2).
func (t *Tokenizer) Pre() string { return t.preName }

// BOS returns the beginning-of-sequence id, or -1 if there is none.
func (t *Tokenizer) BOS() int32 { return t.bos }

// EOS returns the end-of-sequence id, or -1 if there is none.
func (t *Tokenizer) EOS() int32 { return t.eos }

// Token returns the stored text of id (GPT-2 byte alphabet for normal
// tokens), or "" if id is out of range.
func (t *Tokenizer) Token(id int32) string {
	if !t.valid(id) {
		return ""
	}
	return t.tokens[id]
}

// TokenID returns the id whose stored text is s.
func (t *Tokenizer) TokenID(s string) (int32, bool) {
	id, ok := t.textToID[s]
	return id, ok
}

// Type returns the token type of id (TypeNormal, TypeControl, ...), or
// TypeUndefined if id is out of range.
func (t *Tokenizer) Type(id int32) int32 {
	if !t.valid(id) {
		return TypeUndefined
	}
	return t.types[id]
}

// IsControl reports whether id is a control token (type 3), e.g.
// <|endoftext|> or <|im_end|>.
func (t *Tokenizer) IsControl(id int32) bool { return t.Type(id) == TypeControl }

// IsEOG reports whether id ends generation: EOS, or a control token whose
// text is one of llama.cpp's end-of-generation names (<|im_end|>,
// <|endoftext|>, <|eot_id|>, ...).
func (t *Tokenizer) IsEOG(id int32) bool { return t.eog[id] }

func (t *Tokenizer) valid(id int32) bool { return id >= 0 && int(id) < len(t.tokens) }

// Encode tokenizes text without adding BOS/EOS. With parseSpecial, the text
// of control tokens (e.g. "<|im_start|>") is matched as that token;
// user-defined tokens are always matched (llama_tokenize with
// add_special=false). Invalid UTF-8 is encoded as U+FFFD, as llama.cpp's
// unicode_cpts_from_utf8 does. Never panics.
func (t *Tokenizer) Encode(text string, parseSpecial bool) []int32 {
	return t.Tokenize(text, false, parseSpecial)
}

// Tokenize is llama_tokenize: Encode, plus BOS first when addSpecial and
// Config.AddBOS, and EOS last when addSpecial and Config.AddEOS.
func (t *Tokenizer) Tokenize(text string, addSpecial, parseSpecial bool) []int32 {
	out := make([]int32, 0, len(text)/4+2)
	if addSpecial && t.addBOS && t.bos >= 0 {
		out = append(out, t.bos)
	}
	for _, f := range t.partition(text, parseSpecial) {
		if f.id >= 0 {
			out = append(out, f.id)
			continue
		}
		out = t.encodeFragment(out, text[f.start:f.end])
	}
	if addSpecial && t.addEOS && t.eos >= 0 {
		out = append(out, t.eos)
	}
	return out
}

type fragment struct {
	start, end int
	id         int32 // special token id, or -1 for raw text
}

// partition splits text into raw fragments and special tokens, taking the
// specials longest first and, within a fragment, left to right (llama.cpp
// tokenizer_st_partition). Without parseSpecial only user-defined tokens
// are split out.
func (t *Tokenizer) partition(text string, parseSpecial bool) []fragment {
	frags := []fragment{{0, len(text), -1}}
	for _, id := range t.specials {
		ty := t.types[id]
		if !parseSpecial && ty != TypeUserDefined {
			continue
		}
		tok := t.tokens[id]
		if !strings.Contains(text, tok) {
			continue
		}
		next := make([]fragment, 0, len(frags)+2)
		for _, f := range frags {
			if f.id >= 0 {
				next = append(next, f)
				continue
			}
			s := f.start
			for s < f.end {
				k := strings.Index(text[s:f.end], tok)
				if k < 0 {
					break
				}
				if k > 0 {
					next = append(next, fragment{s, s + k, -1})
				}
				next = append(next, fragment{s + k, s + k + len(tok), id})
				s += k + len(tok)
			}
			if s < f.end {
				next = append(next, fragment{s, f.end, -1})
			}
		}
		frags = next
	}
	return frags
}

// encodeFragment appends the tokens of raw text (no specials) to out.
func (t *Tokenizer) encodeFragment(out []int32, text string) []int32 {
	text = normalizeUTF8(text)
	var wb wordBuf
	var sc bpeScratch
	t.pre.split(text, &wb, func(word string) {
		out = t.encodeWord(out, word, &sc)
	})
	return out
}

// encodeWord appends the BPE tokens of one pre-token, using the word cache.
func (t *Tokenizer) encodeWord(out []int32, word string, sc *bpeScratch) []int32 {
	if len(word) == 1 && t.byteTok[word[0]] >= 0 {
		return append(out, t.byteTok[word[0]])
	}
	if len(word) > wordCacheMaxLen {
		return t.bpe(out, word, sc)
	}
	t.cacheMu.Lock()
	ids, ok := t.cache[word]
	t.cacheMu.Unlock()
	if ok {
		return append(out, ids...)
	}
	start := len(out)
	out = t.bpe(out, word, sc)
	ids = append([]int32(nil), out[start:]...)
	t.cacheMu.Lock()
	if len(t.cache) >= wordCacheCap {
		clear(t.cache)
	}
	t.cache[strings.Clone(word)] = ids
	t.cacheMu.Unlock()
	return out
}
