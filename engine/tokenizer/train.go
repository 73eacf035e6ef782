package tokenizer

import (
	_ "embed"
	"slices"
	"sort"
	"sync"
)

// corpus is a small English text (about 28 KB, written for this project and
// dedicated to the public domain) that DefaultConfig trains on.
//
//go:embed corpus.txt
var corpus string

// Corpus returns the embedded training text used by DefaultConfig.
func Corpus() string { return corpus }

// Train builds a byte-level BPE vocabulary from corpus, deterministically:
//
//   - ids 0..255 are the 256 bytes, in byte order, as GPT-2 alphabet
//     characters (so every input can be encoded);
//   - the corpus is cut into words by the "qwen2" pre-tokenizer, and merges
//     are learnt one at a time: the adjacent pair of tokens with the highest
//     count over all words (weighted by word frequency) is merged everywhere,
//     ties going to the lowest (left id, right id); a merge whose text is
//     already a token adds no new token;
//   - training stops when 256 + merges' new tokens + len(specials) reaches
//     vocabSize, or when no pair is left;
//   - specials follow as control tokens (TypeControl), in the given order,
//     skipping duplicates and empty strings.
//
// BOS and EOS are "<|endoftext|>" when it is among specials, else the first
// special, else -1; AddBOS and AddEOS are false; Pre is "qwen2". The result
// is accepted by New. vocabSize below 256+len(specials) yields just the
// bytes and the specials.
func Train(corpus string, vocabSize int, specials []string) Config {
	c := Config{Pre: PreQwen2, BOS: -1, EOS: -1}
	for b := range 256 {
		c.Tokens = append(c.Tokens, string(byteToRune[b]))
		c.Types = append(c.Types, TypeNormal)
	}
	var sp []string
	for _, s := range specials {
		if s != "" && !slices.Contains(sp, s) {
			sp = append(sp, s)
		}
	}
	textToID := make(map[string]int32, vocabSize)
	for i, s := range c.Tokens {
		textToID[s] = int32(i)
	}

	// Unique words with their frequencies, in sorted order.
	freq := map[string]int64{}
	var wb wordBuf
	preQwen2.split(normalizeUTF8(corpus), &wb, func(w string) { freq[w]++ })
	keys := make([]string, 0, len(freq))
	for w := range freq {
		keys = append(keys, w)
	}
	sort.Strings(keys)
	type word struct {
		syms []int32
		freq int64
	}
	words := make([]word, len(keys))
	counts := map[uint64]int64{}
	where := map[uint64][]int32{}
	for i, w := range keys {
		syms := make([]int32, len(w))
		for k := range len(w) {
			syms[k] = int32(w[k])
		}
		words[i] = word{syms, freq[w]}
		for k := 1; k < len(syms); k++ {
			key := pairKey(syms[k-1], syms[k])
			counts[key] += freq[w]
			where[key] = append(where[key], int32(i))
		}
	}
	h := pairHeap{}
	for key, n := range counts {
		h.push(pairEntry{n, key})
	}
	stamp := make([]int, len(words))
	for iter := 1; len(c.Tokens)+len(sp) < vocabSize && len(h) > 0; iter++ {
		top := h.pop()
		if counts[top.key] != top.count || top.count <= 0 {
			continue // stale entry
		}
		l, r := int32(top.key>>32), int32(uint32(top.key))
		text := c.Tokens[l] + c.Tokens[r]
		id, ok := textToID[text]
		if !ok {
			id = int32(len(c.Tokens))
			c.Tokens = append(c.Tokens, text)
			c.Types = append(c.Types, TypeNormal)
			textToID[text] = id
		}
		c.Merges = append(c.Merges, c.Tokens[l]+" "+c.Tokens[r])
		changed := map[uint64]bool{}
		for _, wi := range where[top.key] {
			if stamp[wi] == iter {
				continue
			}
			stamp[wi] = iter
			w := &words[wi]
			if !hasPair(w.syms, l, r) {
				continue
			}
			for k := 1; k < len(w.syms); k++ {
				key := pairKey(w.syms[k-1], w.syms[k])
				counts[key] -= w.freq
				changed[key] = true
			}
			out := w.syms[:0]
			for k := 0; k < len(w.syms); k++ {
				if k+1 < len(w.syms) && w.syms[k] == l && w.syms[k+1] == r {
					out = append(out, id)
					k++
					continue
				}
				out = append(out, w.syms[k])
			}
			w.syms = out
			for k := 1; k < len(w.syms); k++ {
				key := pairKey(w.syms[k-1], w.syms[k])
				counts[key] += w.freq
				changed[key] = true
				if ws := where[key]; len(ws) == 0 || ws[len(ws)-1] != wi {
					where[key] = append(ws, wi)
				}
			}
		}
		for key := range changed {
			if counts[key] > 0 {
				h.push(pairEntry{counts[key], key})
			} else {
				delete(counts, key)
			}
		}
	}
	for _, s := range sp {
		if _, dup := textToID[s]; dup {
			continue
		}
		textToID[s] = int32(len(c.Tokens))
		c.Tokens = append(c.Tokens, s)
		c.Types = append(c.Types, TypeControl)
	}
	if len(sp) > 0 {
		first := sp[0]
		if slices.Contains(sp, "<|endoftext|>") {
			first = "<|endoftext|>"
		}
		if id, ok := textToID[first]; ok && c.Types[id] == TypeControl {
			c.BOS, c.EOS = id, id
		}
	}
	return c
}

func hasPair(s []int32, l, r int32) bool {
	for k := 1; k < len(s); k++ {
		if s[k-1] == l && s[k] == r {
			return true
		}
	}
	return false
}

type pairEntry struct {
	count int64
	key   uint64 // left<<32 | right
}

// pairHeap is a max-heap on count, ties to the smallest key (left id, then
// right id).
type pairHeap []pairEntry

func (h pairHeap) less(i, j int) bool {
	return h[i].count > h[j].count || (h[i].count == h[j].count && h[i].key < h[j].key)
}

func (h *pairHeap) push(e pairEntry) {
	*h = append(*h, e)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *pairHeap) pop() pairEntry {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && s.less(l, m) {
			m = l
		}
		if r < n && s.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// DefaultSpecials are the control tokens of DefaultConfig (Qwen's chat
// markers): BOS = EOS = <|endoftext|>.
var DefaultSpecials = []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>"}

var (
	defaultMu    sync.Mutex
	defaultCache = map[int]Config{}
)

// DefaultConfig returns Train(Corpus(), vocabSize, DefaultSpecials), cached
// per vocabSize; each call returns fresh slices the caller may modify.
func DefaultConfig(vocabSize int) Config {
	defaultMu.Lock()
	c, ok := defaultCache[vocabSize]
	if !ok {
		c = Train(corpus, vocabSize, DefaultSpecials)
		defaultCache[vocabSize] = c
	}
	defaultMu.Unlock()
	c.Tokens = slices.Clone(c.Tokens)
	c.Types = slices.Clone(c.Types)
	c.Merges = slices.Clone(c.Merges)
	return c
}
