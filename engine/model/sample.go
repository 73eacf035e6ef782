package model

import (
	"math"
	"math/rand/v2"
)

// Greedy returns the id of the largest logit, the lowest such id on ties
// (llama.cpp's greedy sampler and the fixtures' argmax). It returns -1 for
// empty logits. NaN logits are never chosen over a number.
func Greedy(logits []float32) int32 {
	best, bv := -1, float32(0) // bv = logits[best], kept in a register
	for i, v := range logits {
		if v > bv || best < 0 && v == v { // a NaN v fails both
			best, bv = i, v
		}
	}
	if best < 0 && len(logits) > 0 {
		best = 0
	}
	return int32(best)
}

// SamplerOptions configures a Sampler. Temperature <= 0 means greedy (the
// other fields are then ignored). TopK <= 0 or >= vocabulary keeps every
// token; TopP <= 0 or >= 1 disables nucleus filtering.
type SamplerOptions struct {
	Temperature float32
	TopK        int
	TopP        float32
	Seed        uint64
}

// TopP32 converts a nucleus threshold p in (0, 1], as the commands and
// the API take it (float64), to SamplerOptions.TopP: a p so small that it
// rounds to 0 in float32 (1e-300) becomes the smallest positive float32,
// keeping only the most probable token as the user asked, where 0 would
// turn the filter off.
func TopP32(p float64) float32 {
	if f := float32(p); f > 0 || p <= 0 {
		return f
	}
	return math.SmallestNonzeroFloat32
}

// Sampler draws tokens from logits: keep the TopK largest logits (ties: lower
// id first), turn logits/Temperature into probabilities over them, keep the
// smallest prefix (by probability, descending) whose probabilities sum to at
// least TopP, and draw from it, renormalised, with a PCG generator seeded
// by Seed (the order of llama.cpp's top-k -> top-p -> dist chain, with the
// temperature applied before top-p). A Sampler is deterministic for a given
// seed and sequence of calls, and not safe for concurrent use.
type Sampler struct {
	o    SamplerOptions
	rng  *rand.Rand
	heap []int32
	cand []int32
	w    []float64
}

// NewSampler returns a Sampler for o.
func NewSampler(o SamplerOptions) *Sampler {
	return &Sampler{o: o, rng: rand.New(rand.NewPCG(o.Seed, 0x6b76617369720001))}
}

// Sample returns the id drawn from logits (len = vocabulary size), or -1 for
// empty logits.
func (s *Sampler) Sample(logits []float32) int32 {
	n := len(logits)
	if s.o.Temperature <= 0 || n == 0 {
		return Greedy(logits)
	}
	k := s.o.TopK
	if k <= 0 || k > n {
		k = n
	}
	topP := float64(s.o.TopP)
	if topP <= 0 || topP >= 1 {
		topP = 1
	}
	inv := 1 / float64(s.o.Temperature)
	mx := float64(logits[Greedy(logits)])
	weight := func(id int32) float64 {
		v := float64(logits[id])
		if v != v {
			return 0
		}
		return math.Exp((v - mx) * inv)
	}
	// Z over the whole vocabulary, used when only top-p filters.
	var zAll float64
	if k == n && topP < 1 {
		for i := range logits {
			zAll += weight(int32(i))
		}
	}
	// Pop candidates in descending logit order from a binary max-heap.
	h := s.heap[:0]
	for i := range n {
		h = append(h, int32(i))
	}
	less := func(a, b int32) bool { // a ranks above b
		la, lb := logits[a], logits[b]
		if la != lb {
			return la > lb || lb != lb
		}
		return a < b
	}
	down := func(i, m int) {
		for {
			c := 2*i + 1
			if c >= m {
				return
			}
			if c+1 < m && less(h[c+1], h[c]) {
				c++
			}
			if !less(h[c], h[i]) {
				return
			}
			h[i], h[c] = h[c], h[i]
			i = c
		}
	}
	for i := n/2 - 1; i >= 0; i-- {
		down(i, n)
	}
	cand, w := s.cand[:0], s.w[:0]
	var cum float64
	m := n
	for len(cand) < k && m > 0 {
		id := h[0]
		m--
		h[0] = h[m]
		down(0, m)
		cand = append(cand, id)
		w = append(w, weight(id))
		if k == n && topP < 1 {
			cum += w[len(w)-1] / zAll
			if cum >= topP {
				break
			}
		}
	}
	if k < n && topP < 1 {
		var z float64
		for _, v := range w {
			z += v
		}
		cum = 0
		for i, v := range w {
			cum += v / z
			if cum >= topP {
				cand, w = cand[:i+1], w[:i+1]
				break
			}
		}
	}
	s.heap, s.cand, s.w = h, cand, w
	var z float64
	for _, v := range w {
		z += v
	}
	r := s.rng.Float64() * z
	for i, v := range w {
		r -= v
		if r < 0 {
			return cand[i]
		}
	}
	return cand[len(cand)-1]
}
