//go:build noasm || !(amd64 || arm64)

package quant

// Pure-Go kernels (build tag noasm, or a GOARCH without assembly here).

// useSIMD is false: there are no SIMD kernels in this build.
var useSIMD = false

func simdName() string { return "none" }

// simdPaths: only the pure-Go code in this build.
func simdPaths() []string { return []string{"none"} }

// setSIMDPath has nothing to switch in this build.
func setSIMDPath(string) {}

func dotF32Lanes(a, b []float32, acc *[32]float32) { genericDotF32Lanes(a, b, acc) }
func dotF16Lanes(w, a []byte, acc *[32]float32)    { genericDotF16Lanes(w, a, acc) }
func dotBF16Lanes(w, a []byte, acc *[32]float32)   { genericDotBF16Lanes(w, a, acc) }
func q8_0Dot(w, a []byte, nb int) float32          { return genericQ8_0Dot(w, a, nb) }
func q4KDot(w, a []byte, nb int) float32           { return genericQ4KDot(w, a, nb) }
func q5KDot(w, a []byte, nb int) float32           { return genericQ5KDot(w, a, nb) }
func q6KDot(w, a []byte, nb int) float32           { return genericQ6KDot(w, a, nb) }

// Integer-sum kernels, named for the SIMD comparison tests.
func q8_0Sums(w, a []byte, out []int32) { genericQ8_0Sums(w, a, out) }

func q4_0Dot(w, a []byte, nb int) float32 { return genericQ4_0Dot(w, a, nb) }
func q4_1Dot(w, a []byte, nb int) float32 { return genericQ4_1Dot(w, a, nb) }
func q5_0Dot(w, a []byte, nb int) float32 { return genericQ5_0Dot(w, a, nb) }
func q5_1Dot(w, a []byte, nb int) float32 { return genericQ5_1Dot(w, a, nb) }

// Integer-sum kernels of the K-quants: the Go ones here (the AVX2 path
// fuses them into q4KDotAVX2 etc.).
func q4KSums(w, a []byte, out []int32) { genericQ4KSums(w, a, out) }
func q5KSums(w, a []byte, out []int32) { genericQ5KSums(w, a, out) }
func q6KSums(w, a []byte, out []int32) { genericQ6KSums(w, a, out) }

// vecDot4 has no multi-row kernel in this build (see kernels_amd64.go).
func vecDot4(weight Type, w, a []byte, ab, n int, out *[4]float32) bool { return false }

// vecDot4Rows has no kernel in this build either.
func vecDot4Rows(weight Type, w []byte, rb int, a []byte, ab, n int, y []float32, ys, rows int) bool {
	return false
}

// has4 is false: no vecDot4Rows kernels in this build.
func has4(weight Type, n int) bool { return false }

// dotF32 is genericDotF32 (DotF32 over n elements) in this build.
func dotF32(a, b []float32, n int) float32 { return genericDotF32(a, b, n) }

// dotF32Rows is genericDotF32Rows in this build.
func dotF32Rows(x, m []float32, stride int, out []float32) { genericDotF32Rows(x, m, stride, out) }

// vecDotRows is the per-row loop (genericVecDotRows) in this build.
func vecDotRows(weight Type, w []byte, rb int, a []byte, n int, out []float32) {
	genericVecDotRows(weight, w, rb, a, n, out)
}

// matMulRowsArch has no special case in this build.
func matMulRowsArch(Type, []byte, int, int, []byte, int, int, []float32, int, int, int) bool {
	return false
}

// deltaRule is genericDeltaRule in this build.
func deltaRule(st, q, k, v, o []float32, beta, decay, scale float32) {
	genericDeltaRule(st, q, k, v, o, beta, decay, scale)
}

// quantizeQ8KFast has no pure-Go fast path: it converts nothing (see the
// amd64 version).
func quantizeQ8KFast(x []float32, dst []byte) int { return 0 }

// mulAddF32Fast has no kernel in this build (MulAddF32 runs its Go loop).
func mulAddF32Fast(dst, x, w []float32) bool { return false }

// scaleF32Fast has no kernel in this build (ScaleF32 and ScaleAddF32 run their Go
// loops).
func scaleF32Fast(dst, x []float32, a float32, add bool) bool { return false }
