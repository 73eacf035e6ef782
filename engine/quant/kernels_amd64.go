//go:build !noasm

package quant

import (
	"golang.org/x/sys/cpu"
)

// useSIMD selects the AVX2 kernels of kernels_amd64.s (AVX2 for the
// integer sums, F16C for half conversion; FMA is deliberately not used so
// that the float lanes round exactly like the pure-Go fallback). Tests flip
// it to compare the two paths.
var useSIMD = cpu.X86.HasAVX2 && cpu.X86.HasF16C && cpu.X86.HasAVX

// simdName reports the kernels in use (for benchmarks and logs).
func simdName() string {
	if useSIMD {
		return "avx2"
	}
	return "none"
}

//go:noescape
func dotF32LanesAVX2(a, b *float32, n int, acc *[32]float32)

//go:noescape
func dotF16LanesAVX2(w, a *byte, n int, acc *[32]float32)

//go:noescape
func q8_0SumsAVX2(w, a *byte, nb int, out *int32)

//go:noescape
func q4KSumsAVX2(w, a *byte, nb int, out *int32)

//go:noescape
func q6KSumsAVX2(w, a *byte, nb int, out *int32)

// dotF32Lanes adds a[i]*b[i] into acc[i%32]; len(a) == len(b), a multiple
// of 32.
func dotF32Lanes(a, b []float32, acc *[32]float32) {
	if useSIMD && len(a) >= 32 && len(b) >= len(a) {
		dotF32LanesAVX2(&a[0], &b[0], len(a)&^31, acc)
		return
	}
	genericDotF32Lanes(a, b, acc)
}

// dotF16Lanes is dotF32Lanes for two fp16 rows (len(w) == len(a) bytes, a
// multiple of 64).
func dotF16Lanes(w, a []byte, acc *[32]float32) {
	if useSIMD && len(w) >= 64 && len(a) >= len(w) {
		dotF16LanesAVX2(&w[0], &a[0], len(w)/2&^31, acc)
		return
	}
	genericDotF16Lanes(w, a, acc)
}

// q8_0Sums writes, per block, the int32 sum of the 32 code products of a
// block_q8_0 row w and block_q8_0 row a.
func q8_0Sums(w, a []byte, out []int32) {
	if useSIMD && len(out) > 0 && len(w) >= 34*len(out) && len(a) >= 34*len(out) {
		q8_0SumsAVX2(&w[0], &a[0], len(out), &out[0])
		return
	}
	genericQ8_0Sums(w, a, out)
}

// q4KSums writes, per block, sum_j scale_j * sum(q4*q8) over the 8
// sub-blocks of a block_q4_K row w and block_q8_K row a (mins excluded).
func q4KSums(w, a []byte, out []int32) {
	if useSIMD && len(out) > 0 && len(w) >= 144*len(out) && len(a) >= 292*len(out) {
		q4KSumsAVX2(&w[0], &a[0], len(out), &out[0])
		return
	}
	genericQ4KSums(w, a, out)
}

// q6KSums writes, per block, sum_j scale_j * sum((q6-32)*q8) over the 16
// groups of a block_q6_K row w and block_q8_K row a.
func q6KSums(w, a []byte, out []int32) {
	if useSIMD && len(out) > 0 && len(w) >= 210*len(out) && len(a) >= 292*len(out) {
		q6KSumsAVX2(&w[0], &a[0], len(out), &out[0])
		return
	}
	genericQ6KSums(w, a, out)
}
