//go:build !noasm

package quant

// useSIMD selects the NEON kernels of kernels_arm64.s (Advanced SIMD is
// part of every arm64 CPU). Tests flip it to compare with the pure-Go code.
var useSIMD = true

// simdName reports the kernels in use (for benchmarks and logs).
func simdName() string {
	if useSIMD {
		return "neon"
	}
	return "none"
}

// simdPaths lists the kernel paths of this build, best first.
func simdPaths() []string { return []string{"neon", "none"} }

// setSIMDPath selects path (one of simdPaths).
func setSIMDPath(path string) { useSIMD = path != "none" }

//go:noescape
func dotF32LanesNEON(a, b *float32, n int, acc *[32]float32)

//go:noescape
func q8_0SumsNEON(w, a *byte, nb int, out *int32)

//go:noescape
func q4KSumsNEON(w, a *byte, nb int, out *int32)

//go:noescape
func q6KSumsNEON(w, a *byte, nb int, out *int32)

// q4KSums writes per block sum_j sc_j * sum(q4*q8) of block_q4_K rows w
// and block_q8_K rows a (genericQ4KSums).
func q4KSums(w, a []byte, out []int32) {
	if useSIMD && len(out) > 0 && len(w) >= 144*len(out) && len(a) >= 292*len(out) {
		q4KSumsNEON(&w[0], &a[0], len(out), &out[0])
		return
	}
	genericQ4KSums(w, a, out)
}

// q6KSums writes per block sum_g sc_g * sum((q6-32)*q8) of block_q6_K rows
// w and block_q8_K rows a (genericQ6KSums).
func q6KSums(w, a []byte, out []int32) {
	if useSIMD && len(out) > 0 && len(w) >= 210*len(out) && len(a) >= 292*len(out) {
		q6KSumsNEON(&w[0], &a[0], len(out), &out[0])
		return
	}
	genericQ6KSums(w, a, out)
}

func q5KSums(w, a []byte, out []int32) { genericQ5KSums(w, a, out) }

// dotF32Lanes adds a[i]*b[i] into acc[i%32] (genericDotF32Lanes); len(a) ==
// len(b), a multiple of 32.
func dotF32Lanes(a, b []float32, acc *[32]float32) {
	if useSIMD && len(a) >= 32 && len(b) >= len(a) {
		dotF32LanesNEON(&a[0], &b[0], len(a)&^31, acc)
		return
	}
	genericDotF32Lanes(a, b, acc)
}

// q8_0Sums writes, per block, the exact int32 sum of the 32 code products
// of block_q8_0 rows w and a (genericQ8_0Sums).
func q8_0Sums(w, a []byte, out []int32) {
	if useSIMD && len(out) > 0 && len(w) >= 34*len(out) && len(a) >= 34*len(out) {
		q8_0SumsNEON(&w[0], &a[0], len(out), &out[0])
		return
	}
	genericQ8_0Sums(w, a, out)
}

func q8_0Dot(w, a []byte, nb int) float32        { return q8_0DotSums(w, a, nb) }
func dotF16Lanes(w, a []byte, acc *[32]float32)  { genericDotF16Lanes(w, a, acc) }
func dotBF16Lanes(w, a []byte, acc *[32]float32) { genericDotBF16Lanes(w, a, acc) }
func q4KDot(w, a []byte, nb int) float32         { return genericQ4KDot(w, a, nb) }
func q5KDot(w, a []byte, nb int) float32         { return genericQ5KDot(w, a, nb) }
func q6KDot(w, a []byte, nb int) float32         { return genericQ6KDot(w, a, nb) }

func q4_0Dot(w, a []byte, nb int) float32 { return genericQ4_0Dot(w, a, nb) }
func q4_1Dot(w, a []byte, nb int) float32 { return genericQ4_1Dot(w, a, nb) }
func q5_0Dot(w, a []byte, nb int) float32 { return genericQ5_0Dot(w, a, nb) }
func q5_1Dot(w, a []byte, nb int) float32 { return genericQ5_1Dot(w, a, nb) }

// vecDot4 has no multi-row kernel in this build (see kernels_amd64.go).
func vecDot4(weight Type, w, a []byte, ab, n int, out *[4]float32) bool { return false }

// vecDot4Rows has no kernel in this build either.
func vecDot4Rows(weight Type, w []byte, rb int, a []byte, ab, n int, y []float32, ys, rows int) bool {
	return false
}

// has4 is false: no vecDot4Rows kernels on arm64 yet.
func has4(weight Type, n int) bool { return false }

// dotF32 is genericDotF32 (DotF32 over n elements) in this build.
func dotF32(a, b []float32, n int) float32 { return genericDotF32(a, b, n) }

// dotF32Rows is genericDotF32Rows in this build.
func dotF32Rows(x, m []float32, stride int, out []float32) { genericDotF32Rows(x, m, stride, out) }

// vecDotRows is the per-row loop on arm64 (the NEON kernels are integer
// sums inside each row's dot).
func vecDotRows(weight Type, w []byte, rb int, a []byte, n int, out []float32) {
	genericVecDotRows(weight, w, rb, a, n, out)
}

// matMulRowsArch has no special case on arm64 (matMulRows' loops).
func matMulRowsArch(Type, []byte, int, int, []byte, int, int, []float32, int, int, int) bool {
	return false
}

// deltaRule is genericDeltaRule on arm64 (its dot products run through
// dotF32Lanes' NEON kernel).
func deltaRule(st, q, k, v, o []float32, beta, decay, scale float32) {
	genericDeltaRule(st, q, k, v, o, beta, decay, scale)
}
