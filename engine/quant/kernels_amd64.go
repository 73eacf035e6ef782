//go:build !noasm

package quant

import "golang.org/x/sys/cpu"

// useSIMD selects the AVX2 kernels of kernels_amd64.s (AVX2 integer
// arithmetic, F16C half conversion; FMA is deliberately not used so that
// every float operation rounds exactly like the pure-Go code). Tests flip
// it to compare the two paths.
var useSIMD = hasAVX2

// useAVX512 additionally selects the AVX-512 kernels of
// kernels_avx512_amd64.s (F, BW, VL, VNNI) where they exist (Q4_K so far);
// it only matters while useSIMD is set.
var useAVX512 = hasAVX512

var (
	hasAVX2   = cpu.X86.HasAVX2 && cpu.X86.HasF16C && cpu.X86.HasAVX
	hasAVX512 = hasAVX2 && cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VNNI
)

// simdName reports the kernels in use (for benchmarks and logs).
func simdName() string {
	switch {
	case useSIMD && useAVX512:
		return "avx512"
	case useSIMD:
		return "avx2"
	}
	return "none"
}

// simdPaths lists the kernel paths this CPU can run, best first.
func simdPaths() []string {
	var p []string
	if hasAVX512 {
		p = append(p, "avx512")
	}
	if hasAVX2 {
		p = append(p, "avx2")
	}
	return append(p, "none")
}

// setSIMDPath selects path (one of simdPaths).
func setSIMDPath(path string) {
	useSIMD = path != "none"
	useAVX512 = path == "avx512"
}

// The assembly kernels take raw pointers; the Go wrappers below check the
// lengths first. Each mirrors the pure-Go function named in its comment
// operation for operation (integer sums are exact; float operations are
// the same scalar SSE operations in the same order).

//go:noescape
func dotF32LanesAVX2(a, b *float32, n int, acc *[32]float32)

//go:noescape
func dotF16LanesAVX2(w, a *byte, n int, acc *[32]float32)

//go:noescape
func dotBF16LanesAVX2(w, a *byte, n int, acc *[32]float32)

//go:noescape
func q8_0DotAVX2(w, a *byte, nb int) float32

//go:noescape
func q4KDotAVX2(w, a *byte, nb int) float32

//go:noescape
func q5KDotAVX2(w, a *byte, nb int) float32

//go:noescape
func q6KDotAVX2(w, a *byte, nb int) float32

// dotF32Lanes adds a[i]*b[i] into acc[i%32] (genericDotF32Lanes); len(a) ==
// len(b), a multiple of 32.
func dotF32Lanes(a, b []float32, acc *[32]float32) {
	if useSIMD && len(a) >= 32 && len(b) >= len(a) {
		dotF32LanesAVX2(&a[0], &b[0], len(a)&^31, acc)
		return
	}
	genericDotF32Lanes(a, b, acc)
}

// dotF16Lanes is genericDotF16Lanes: two fp16 rows of len(w)/2 elements
// (len(w) == len(a), a multiple of 64 bytes).
func dotF16Lanes(w, a []byte, acc *[32]float32) {
	if useSIMD && len(w) >= 64 && len(a) >= len(w) {
		dotF16LanesAVX2(&w[0], &a[0], len(w)/2&^31, acc)
		return
	}
	genericDotF16Lanes(w, a, acc)
}

// dotBF16Lanes is genericDotBF16Lanes for two bf16 rows.
func dotBF16Lanes(w, a []byte, acc *[32]float32) {
	if useSIMD && len(w) >= 64 && len(a) >= len(w) {
		dotBF16LanesAVX2(&w[0], &a[0], len(w)/2&^31, acc)
		return
	}
	genericDotBF16Lanes(w, a, acc)
}

// q8_0Dot is genericQ8_0Dot: nb block_q8_0 of w and a.
func q8_0Dot(w, a []byte, nb int) float32 {
	if useSIMD && nb > 0 && len(w) >= 34*nb && len(a) >= 34*nb {
		return q8_0DotAVX2(&w[0], &a[0], nb)
	}
	return genericQ8_0Dot(w, a, nb)
}

// q4KDot is genericQ4KDot: nb block_q4_K of w, block_q8_K of a.
func q4KDot(w, a []byte, nb int) float32 {
	if useSIMD && nb > 0 && len(w) >= 144*nb && len(a) >= 292*nb {
		var out [1]float32
		if useAVX512 && q4KRows512(w, 144*nb, a, nb, out[:]) {
			return out[0]
		}
		return q4KDotAVX2(&w[0], &a[0], nb)
	}
	return genericQ4KDot(w, a, nb)
}

// q5KDot is genericQ5KDot: nb block_q5_K of w, block_q8_K of a.
func q5KDot(w, a []byte, nb int) float32 {
	if useSIMD && nb > 0 && len(w) >= 176*nb && len(a) >= 292*nb {
		return q5KDotAVX2(&w[0], &a[0], nb)
	}
	return genericQ5KDot(w, a, nb)
}

// q6KDot is genericQ6KDot: nb block_q6_K of w, block_q8_K of a.
func q6KDot(w, a []byte, nb int) float32 {
	if useSIMD && nb > 0 && len(w) >= 210*nb && len(a) >= 292*nb {
		return q6KDotAVX2(&w[0], &a[0], nb)
	}
	return genericQ6KDot(w, a, nb)
}

//go:noescape
func q4KDot4AVX2(w, a0, a1, a2, a3 *byte, nb int, out *[4]float32)

//go:noescape
func q6KDot4AVX2(w, a0, a1, a2, a3 *byte, nb int, out *[4]float32)

// has4 reports whether vecDot4Rows has a kernel for weight rows of n
// elements (vecDot4 covers Q4_K and Q6_K only; matMulRows falls back to
// vecDot where it declines).
func has4(weight Type, n int) bool {
	switch weight {
	case Q4_K, Q6_K:
		return useSIMD && n >= QK_K
	case Q8_0:
		return useSIMD && n >= 32
	}
	return false
}

// vecDot4 computes out[j] = vecDot(weight, w, a[j*ab:(j+1)*ab], n) for
// j < 4 with one pass over the weight row, bit-identical to four vecDot
// calls; it reports false when weight has no 4-row kernel here.
func vecDot4(weight Type, w, a []byte, ab, n int, out *[4]float32) bool {
	nb := n / QK_K
	if !useSIMD || nb < 1 || len(a) < 4*ab || ab < 292*nb {
		return false
	}
	switch weight {
	case Q4_K:
		if len(w) < 144*nb {
			return false
		}
		q4KDot4AVX2(&w[0], &a[0], &a[ab], &a[2*ab], &a[3*ab], nb, out)
	case Q6_K:
		if len(w) < 210*nb {
			return false
		}
		q6KDot4AVX2(&w[0], &a[0], &a[ab], &a[2*ab], &a[3*ab], nb, out)
	default:
		return false
	}
	return true
}

//go:noescape
func q4KRows4AVX2(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)

//go:noescape
func q6KRows4AVX2(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)

//go:noescape
func q8_0Rows4AVX2(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)

// vecDot4Rows sets y[j*ys+r] = vecDot(weight, w[r*rb:(r+1)*rb],
// a[j*ab:(j+1)*ab], n) for r < rows and j < 4 (the 4-row kernels looped
// over weight rows in assembly, bit-identical to vecDot4 per row); it
// reports false, writing nothing, when weight has no such kernel here or
// a length is short.
func vecDot4Rows(weight Type, w []byte, rb int, a []byte, ab, n int, y []float32, ys, rows int) bool {
	if !useSIMD || rows <= 0 || rb <= 0 || len(w) < rows*rb || len(a) < 4*ab || ys < rows || len(y) < 3*ys+rows {
		return false
	}
	switch weight {
	case Q4_K, Q6_K:
		nb := n / QK_K
		if nb < 1 || ab < 292*nb || rb < weight.BlockBytes()*nb {
			return false
		}
		if weight == Q4_K && useAVX512 {
			q4KRows4512(w, rb, a, ab, nb, y, ys, rows)
		} else if weight == Q4_K {
			q4KRows4AVX2(&w[0], &a[0], &a[ab], &a[2*ab], &a[3*ab], nb, rows, rb, &y[0], ys)
		} else {
			q6KRows4AVX2(&w[0], &a[0], &a[ab], &a[2*ab], &a[3*ab], nb, rows, rb, &y[0], ys)
		}
	case Q8_0:
		nb := n / 32
		if nb < 1 || ab < 34*nb || rb < 34*nb {
			return false
		}
		q8_0Rows4AVX2(&w[0], &a[0], &a[ab], &a[2*ab], &a[3*ab], nb, rows, rb, &y[0], ys)
	default:
		return false
	}
	return true
}

//go:noescape
func dotF32AVX2(a, b *float32, n int) float32

//go:noescape
func dotF32RowsAVX2(x, m *float32, n, rows, stride int, out *float32)

// dotF32Rows is genericDotF32Rows (lengths checked by DotF32Rows).
func dotF32Rows(x, m []float32, stride int, out []float32) {
	if useSIMD && useAVX512 && len(out) > 0 && len(m) > 0 && len(x) > 0 {
		dotF32RowsAVX512(&x[0], &m[0], len(x), len(out), stride, &out[0])
		return
	}
	if useSIMD && len(out) > 0 && len(m) > 0 && len(x) > 0 {
		dotF32RowsAVX2(&x[0], &m[0], len(x), len(out), stride, &out[0])
		return
	}
	genericDotF32Rows(x, m, stride, out)
}

// dotF32 is genericDotF32 (DotF32 on n <= len(a), len(b) elements).
func dotF32(a, b []float32, n int) float32 {
	if useSIMD && useAVX512 && n > 0 && len(a) >= n && len(b) >= n {
		return dotF32AVX512(&a[0], &b[0], n)
	}
	if useSIMD && n > 0 && len(a) >= n && len(b) >= n {
		return dotF32AVX2(&a[0], &b[0], n)
	}
	return genericDotF32(a, b, n)
}

//go:noescape
func f16RowsAVX2(w, a *byte, n, rows, rb int, out *float32, buf *float32)

// f16Rows runs f16RowsAVX2 with a stack buffer for the n converted
// activations, sized to n (zeroing it costs about what converting does);
// false when n > 16384.
func f16Rows(w, a []byte, n, rows, rb int, out []float32) bool {
	switch {
	case n <= 256:
		f16Rows256(w, a, n, rows, rb, out)
	case n <= 1024:
		f16Rows1K(w, a, n, rows, rb, out)
	case n <= 4096:
		f16Rows4K(w, a, n, rows, rb, out)
	case n <= 16384:
		f16Rows16K(w, a, n, rows, rb, out)
	default:
		return false
	}
	return true
}

//go:noinline
func f16Rows256(w, a []byte, n, rows, rb int, out []float32) {
	var buf [256]float32
	f16RowsAVX2(&w[0], &a[0], n, rows, rb, &out[0], &buf[0])
}

//go:noinline
func f16Rows1K(w, a []byte, n, rows, rb int, out []float32) {
	var buf [1024]float32
	f16RowsAVX2(&w[0], &a[0], n, rows, rb, &out[0], &buf[0])
}

//go:noinline
func f16Rows4K(w, a []byte, n, rows, rb int, out []float32) {
	var buf [4096]float32
	f16RowsAVX2(&w[0], &a[0], n, rows, rb, &out[0], &buf[0])
}

//go:noinline
func f16Rows16K(w, a []byte, n, rows, rb int, out []float32) {
	var buf [16384]float32
	f16RowsAVX2(&w[0], &a[0], n, rows, rb, &out[0], &buf[0])
}

//go:noescape
func q8_0RowsAVX2(w, a *byte, nb, rows, rb int, out *float32)

//go:noescape
func q4KRowsAVX2(w, a *byte, nb, rows, rb int, out *float32)

//go:noescape
func q6KRowsAVX2(w, a *byte, nb, rows, rb int, out *float32)

// vecDotRows sets out[r] = vecDot(weight, w[r*rb:(r+1)*rb], a, n) for
// r < len(out) (genericVecDotRows), validated once for all rows: the
// AVX2 kernels loop over the rows themselves (the Q6_K one takes the -32
// offset from the Q8_K bsums: a converted activation is required). Lengths
// are the caller's (checked) shapes; anything short falls back to the
// per-row path.
func vecDotRows(weight Type, w []byte, rb int, a []byte, n int, out []float32) {
	rows := len(out)
	if !useSIMD || rows == 0 || rb <= 0 || len(w) < rows*rb {
		genericVecDotRows(weight, w, rb, a, n, out)
		return
	}
	switch weight {
	case F32: // a router (ffn_gate_inp): rows read once, from memory
		if useAVX512 && n > 0 && rb%4 == 0 && rb >= 4*n && len(a) >= 4*n {
			if wf, af := f32View(w), f32View(a); wf != nil && af != nil {
				f32RowsAVX512(&wf[0], &af[0], n, rows, rb/4, &out[0])
				return
			}
		}
	case Q6_K:
		if nb := n / QK_K; nb > 0 && rb >= 210*nb && len(a) >= 292*nb {
			q6KRowsAVX2(&w[0], &a[0], nb, rows, rb, &out[0])
			return
		}
	case Q4_K:
		if nb := n / QK_K; nb > 0 && rb >= 144*nb && len(a) >= 292*nb {
			if useAVX512 && q4KRows512(w, rb, a, nb, out) {
				return
			}
			q4KRowsAVX2(&w[0], &a[0], nb, rows, rb, &out[0])
			return
		}
	case Q8_0:
		if nb := n / 32; nb > 0 && rb >= 34*nb && len(a) >= 34*nb {
			q8_0RowsAVX2(&w[0], &a[0], nb, rows, rb, &out[0])
			return
		}
	case F16:
		if n >= 32 && n%32 == 0 && rb >= 2*n && len(a) >= 2*n && f16Rows(w, a, n, rows, rb, out) {
			return
		}
	}
	genericVecDotRows(weight, w, rb, a, n, out)
}

//go:noescape
func qx0DotAVX2(w, a *byte, nb int, kind int) float32

// Kinds of qx0DotAVX2 / qx1DotAVX2 (block bytes of w).
const (
	kindQ4 = 0 // Q4_0 (18 B) / Q4_1 (20 B)
	kindQ5 = 1 // Q5_0 (22 B) / Q5_1 (24 B)
)

//go:noescape
func qx1DotAVX2(w, a *byte, nb int, kind int) float32

// q4_0Dot is genericQ4_0Dot: nb block_q4_0 of w, block_q8_0 of a.
func q4_0Dot(w, a []byte, nb int) float32 {
	if useSIMD && nb > 0 && len(w) >= 18*nb && len(a) >= 34*nb {
		return qx0DotAVX2(&w[0], &a[0], nb, kindQ4)
	}
	return genericQ4_0Dot(w, a, nb)
}

// q5_0Dot is genericQ5_0Dot: nb block_q5_0 of w, block_q8_0 of a.
func q5_0Dot(w, a []byte, nb int) float32 {
	if useSIMD && nb > 0 && len(w) >= 22*nb && len(a) >= 34*nb {
		return qx0DotAVX2(&w[0], &a[0], nb, kindQ5)
	}
	return genericQ5_0Dot(w, a, nb)
}

// q4_1Dot is genericQ4_1Dot: nb block_q4_1 of w, block_q8_1 of a.
func q4_1Dot(w, a []byte, nb int) float32 {
	if useSIMD && nb > 0 && len(w) >= 20*nb && len(a) >= 36*nb {
		return qx1DotAVX2(&w[0], &a[0], nb, kindQ4)
	}
	return genericQ4_1Dot(w, a, nb)
}

// q5_1Dot is genericQ5_1Dot: nb block_q5_1 of w, block_q8_1 of a.
func q5_1Dot(w, a []byte, nb int) float32 {
	if useSIMD && nb > 0 && len(w) >= 24*nb && len(a) >= 36*nb {
		return qx1DotAVX2(&w[0], &a[0], nb, kindQ5)
	}
	return genericQ5_1Dot(w, a, nb)
}

// q8_0Sums has no separate AVX2 kernel on amd64 (q8_0DotAVX2 fuses it).
func q8_0Sums(w, a []byte, out []int32) { genericQ8_0Sums(w, a, out) }

// Integer-sum kernels of the K-quants: the Go ones here (the AVX2 path
// fuses them into q4KDotAVX2 etc.).
func q4KSums(w, a []byte, out []int32) { genericQ4KSums(w, a, out) }
func q5KSums(w, a []byte, out []int32) { genericQ5KSums(w, a, out) }
func q6KSums(w, a []byte, out []int32) { genericQ6KSums(w, a, out) }

//go:noescape
func deltaRuleAVX2(st, q, k, v, o *float32, n, rows int, beta, decay, scale float32)

// deltaRule is genericDeltaRule (lengths checked by DeltaRule: n =
// len(q) >= 1, len(o) >= 1 rows) in one kernel call for all rows.
func deltaRule(st, q, k, v, o []float32, beta, decay, scale float32) {
	switch {
	case useSIMD && useAVX512:
		deltaRuleAVX512(&st[0], &q[0], &k[0], &v[0], &o[0], len(q), len(o), beta, decay, scale)
	case useSIMD:
		deltaRuleAVX2(&st[0], &q[0], &k[0], &v[0], &o[0], len(q), len(o), beta, decay, scale)
	default:
		genericDeltaRule(st, q, k, v, o, beta, decay, scale)
	}
}

// quantizeQ8KFast converts the leading blocks of x (len(x)/QK_K blocks
// of QK_K floats) into block_q8_K at dst (292 bytes each) with the
// AVX-512 kernel, as quantizeQ8KBlock does bit for bit, and returns how
// many it converted: it stops before a block holding a NaN, and does
// nothing (0) off the AVX-512 path.
func quantizeQ8KFast(x []float32, dst []byte) int {
	nb := len(x) / QK_K
	if !useSIMD || !useAVX512 || nb == 0 || len(dst) < 292*nb {
		return 0
	}
	return q8KQuantAVX512(&x[0], &dst[0], nb)
}

// scaleF32Fast runs ScaleAddF32 (add) or ScaleF32 (equal lengths >= 1)
// with the AVX-512 kernel and reports whether it did (false off the
// AVX-512 path).
func scaleF32Fast(dst, x []float32, a float32, add bool) bool {
	if !useSIMD || !useAVX512 {
		return false
	}
	if add {
		scaleAddF32AVX512(&dst[0], &x[0], a, len(dst))
	} else {
		scaleF32AVX512(&dst[0], &x[0], a, len(dst))
	}
	return true
}

// mulAddF32Fast runs MulAddF32 (equal lengths >= 1) with the AVX-512
// kernel and reports whether it did (false off the AVX-512 path).
func mulAddF32Fast(dst, x, w []float32) bool {
	if !useSIMD || !useAVX512 {
		return false
	}
	mulAddF32AVX512(&dst[0], &x[0], &w[0], len(dst))
	return true
}
