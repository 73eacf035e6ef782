//go:build !noasm

package quant

// useSIMD is false: there are no SIMD kernels in this build.
var useSIMD = false

func simdName() string { return "none" }

func dotF32Lanes(a, b []float32, acc *[32]float32) { genericDotF32Lanes(a, b, acc) }
func dotF16Lanes(w, a []byte, acc *[32]float32)    { genericDotF16Lanes(w, a, acc) }
func q8_0Sums(w, a []byte, out []int32)            { genericQ8_0Sums(w, a, out) }
func q4KSums(w, a []byte, out []int32)             { genericQ4KSums(w, a, out) }
func q6KSums(w, a []byte, out []int32)             { genericQ6KSums(w, a, out) }
