package tokenizer

import "slices"

// BPE merging of one pre-token, as llama.cpp's llm_tokenizer_bpe_session::
// tokenize does it: start from one symbol per byte (its GPT-2 alphabet
// character), repeatedly merge the adjacent pair of lowest merge rank (ties:
// leftmost), and emit each final symbol's token. A final symbol whose text
// is not a token falls back to the tokens of its single bytes, where those
// exist.

type symbol struct {
	id         int32 // token id of the symbol's text, or -1
	start, n   int32 // byte span in the word; n == 0 once merged away
	prev, next int32 // neighbours, -1 at the ends
}

type bigram struct {
	rank        int32
	left, right int32 // symbol indices
	size        int32 // bytes of left+right when queued (staleness check)
	result      int32 // token id of the merged text, or -1
}

// bigramQueue is a binary min-heap on (rank, left), the order of
// llama.cpp's llm_bigram_bpe::comparator.
type bigramQueue []bigram

func (q bigramQueue) less(i, j int) bool {
	return q[i].rank < q[j].rank || (q[i].rank == q[j].rank && q[i].left < q[j].left)
}

func (q *bigramQueue) push(b bigram) {
	*q = append(*q, b)
	h := *q
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (q *bigramQueue) pop() bigram {
	h := *q
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h.less(l, m) {
			m = l
		}
		if r < len(h) && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*q = h
	return top
}

// bpeScratch holds buffers reused across the words of one Encode call.
type bpeScratch struct {
	syms []symbol
	q    bigramQueue
}

// bpe appends the tokens of word (raw bytes of one pre-token) to out.
func (t *Tokenizer) bpe(out []int32, word string, sc *bpeScratch) []int32 {
	n := len(word)
	if n == 0 {
		return out
	}
	syms := slices.Grow(sc.syms[:0], n)[:n]
	sc.syms = syms
	for i := range n {
		syms[i] = symbol{id: t.byteTok[word[i]], start: int32(i), n: 1, prev: int32(i - 1), next: int32(i + 1)}
	}
	syms[n-1].next = -1
	q := sc.q[:0]
	defer func() { sc.q = q[:0] }()
	add := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		a, b := syms[l].id, syms[r].id
		if a < 0 || b < 0 {
			return
		}
		m, ok := t.merges[pairKey(a, b)]
		if !ok {
			return
		}
		q.push(bigram{rank: m.rank, left: l, right: r, size: syms[l].n + syms[r].n, result: m.result})
	}
	for i := 1; i < n; i++ {
		add(int32(i-1), int32(i))
	}
	for len(q) > 0 {
		b := q.pop()
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue // outdated: one side merged since it was queued
		}
		l.n += r.n
		l.id = b.result
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		add(l.prev, b.left)
		add(b.left, l.next)
	}
	for i := int32(0); i != -1; i = syms[i].next {
		s := syms[i]
		if s.n == 0 {
			continue
		}
		if s.id >= 0 {
			out = append(out, s.id)
			continue
		}
		// Not a token: emit the token of each single byte of the symbol's
		// GPT-2 alphabet text that is one (llama.cpp's fallback).
		var text []byte
		for _, c := range []byte(word[s.start : s.start+s.n]) {
			text = appendRune(text, byteToRune[c])
		}
		for k := range text {
			if id, ok := t.textToID[string(text[k:k+1])]; ok {
				out = append(out, id)
			}
		}
	}
	return out
}
