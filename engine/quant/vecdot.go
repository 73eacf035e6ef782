package quant

import (
	"encoding/binary"
	"fmt"
	"math"
	"unsafe"
)

// Numerics of the dot products (all GOARCHes, SIMD or not, give the same
// bits; the SIMD kernels compute only exact integer sums or lane partials
// whose order the pure-Go code reproduces):
//
//   - Quantized types (ggml-cpu/quants.c generic ggml_vec_dot_*): per block an
//     exact int32 sum of code products (K-quants: sub-block sums times the
//     6-bit / int8 sub-block scales); then the block's float32 scale product
//     d = d_w*d_a times float32(isum), rounded, added to a single float32
//     accumulator in block order. Q4_1/Q5_1 add m_w*s_a per block; Q4_K/Q5_K
//     subtract dmin_w*d_a*sum_j(min_j*(bsums[2j]+bsums[2j+1])), the bsums term
//     of ggml_vec_dot_q4_K_q8_K. Products are never fused with the adds.
//   - F32, F16, BF16: 32 float32 lane accumulators, element i going to lane
//     i%32 (acc += float32(w*a), unfused), then a fixed pairwise tree over the
//     lanes (16, 8, 4, 2, 1). This mirrors four 8-lane AVX2 (or eight 4-lane
//     NEON) accumulators.

// VecDot returns the dot product of one weight row (n elements of type
// weight, weight.RowBytes(n) bytes) with n activations already converted by
// ConvertActivation (ActivationBytes(weight, n) bytes). It returns NaN when
// the type or the lengths are invalid; CheckedVecDot reports why.
func VecDot(weight Type, w []byte, a []byte, n int) float32 {
	v, err := CheckedVecDot(weight, w, a, n)
	if err != nil {
		return float32(math.NaN())
	}
	return v
}

// CheckedVecDot is VecDot with the validation errors returned:
// ErrUnknownType, ErrUnsupported, ErrSize.
func CheckedVecDot(weight Type, w []byte, a []byte, n int) (float32, error) {
	if err := checkVecDot(weight, len(w), len(a), n, 1); err != nil {
		return 0, err
	}
	return vecDot(weight, w, a, n), nil
}

// checkVecDot validates rows weight rows of n elements (len w) against m
// converted activation rows (len a), m given as mRows.
func checkVecDot(weight Type, lw, la, n, mRows int) error {
	ab, err := ActivationBytes(weight, n)
	if err != nil {
		return err
	}
	rb, _ := weight.RowBytes(n)
	if lw != rb {
		return fmt.Errorf("%w: weight row has %d bytes, %d %s elements need %d", ErrSize, lw, n, weight, rb)
	}
	if mRows > 0 && ab > math.MaxInt/mRows {
		return fmt.Errorf("%w: %d activation rows overflow", ErrSize, mRows)
	}
	if la != ab*mRows {
		return fmt.Errorf("%w: activations have %d bytes, %d x %d as %s need %d", ErrSize, la, mRows, n, weight.VecDotType(), ab*mRows)
	}
	return nil
}

// vecDot is VecDot without validation (lengths already checked).
func vecDot(weight Type, w, a []byte, n int) float32 {
	switch weight {
	case F32:
		return vecDotF32Bytes(w, a, n)
	case F16:
		return vecDotF16(w, a, n)
	case BF16:
		return vecDotBF16(w, a, n)
	case Q8_0:
		return vecDotQ8_0(w, a, n/32)
	case Q4_0:
		return vecDotQ4_0(w, a, n/32)
	case Q5_0:
		return vecDotQ5_0(w, a, n/32)
	case Q4_1:
		return vecDotQ4_1(w, a, n/32)
	case Q5_1:
		return vecDotQ5_1(w, a, n/32)
	case Q4_K:
		return vecDotQ4K(w, a, n/QK_K)
	case Q5_K:
		return vecDotQ5K(w, a, n/QK_K)
	case Q6_K:
		return vecDotQ6K(w, a, n/QK_K)
	}
	return float32(math.NaN())
}

func le16(b []byte) uint16 { return binary.LittleEndian.Uint16(b) }

// reduceLanes sums the 32 lane accumulators in the fixed tree order
// documented above (acc[i] += acc[i+w] for w = 16, 8, 4, 2, 1), unrolled
// into locals; acc is left unchanged.
func reduceLanes(acc *[32]float32) float32 {
	a0, a1, a2, a3 := acc[0]+acc[16], acc[1]+acc[17], acc[2]+acc[18], acc[3]+acc[19]
	a4, a5, a6, a7 := acc[4]+acc[20], acc[5]+acc[21], acc[6]+acc[22], acc[7]+acc[23]
	a8, a9, a10, a11 := acc[8]+acc[24], acc[9]+acc[25], acc[10]+acc[26], acc[11]+acc[27]
	a12, a13, a14, a15 := acc[12]+acc[28], acc[13]+acc[29], acc[14]+acc[30], acc[15]+acc[31]
	a0, a1, a2, a3 = a0+a8, a1+a9, a2+a10, a3+a11
	a4, a5, a6, a7 = a4+a12, a5+a13, a6+a14, a7+a15
	a0, a1, a2, a3 = a0+a4, a1+a5, a2+a6, a3+a7
	a0, a1 = a0+a2, a1+a3
	return a0 + a1
}

// DotF32 returns sum a[i]*b[i] over min(len(a), len(b)) elements with the
// fixed 32-lane order documented above (SIMD where available; the result
// does not depend on the CPU or GOARCH).
func DotF32(a, b []float32) float32 {
	return dotF32(a, b, min(len(a), len(b)))
}

// DotF32Rows sets out[j] = DotF32(x, m[j*stride:j*stride+len(x)]) for
// j < len(out), bit-identical to those calls but in one kernel call (for
// attention: scores of one query against strided cached keys, or one
// output element per V row). m is row-major with a row every stride
// floats (stride >= 0; rows may overlap). Errors: ErrSize when stride < 0
// or m is shorter than (len(out)-1)*stride + len(x) floats.
func DotF32Rows(x, m []float32, stride int, out []float32) error {
	if len(out) == 0 {
		return nil
	}
	if stride < 0 {
		return fmt.Errorf("%w: negative stride %d", ErrSize, stride)
	}
	if len(m) < len(x) || stride > 0 && len(out)-1 > (len(m)-len(x))/stride {
		return fmt.Errorf("%w: m has %d floats, %d rows of %d at stride %d need more", ErrSize, len(m), len(out), len(x), stride)
	}
	dotF32Rows(x, m, stride, out)
	return nil
}

// genericDotF32Rows is DotF32Rows after its length checks.
func genericDotF32Rows(x, m []float32, stride int, out []float32) {
	for j := range out {
		out[j] = DotF32(x, m[j*stride:j*stride+len(x)])
	}
}

// genericDotF32 is DotF32 over the first n elements (n <= len(a), len(b))
// with the lanes of dotF32Lanes and a Go tail and reduction.
func genericDotF32(a, b []float32, n int) float32 {
	var acc [32]float32
	n32 := n &^ 31
	if n32 > 0 {
		dotF32Lanes(a[:n32], b[:n32], &acc)
	}
	for i := n32; i < n; i++ {
		acc[i&31] += float32(a[i] * b[i])
	}
	return reduceLanes(&acc)
}

// genericVecDotRows sets out[r] = vecDot(weight, w[r*rb:(r+1)*rb], a, n)
// for r < len(out): the reference for vecDotRows.
func genericVecDotRows(weight Type, w []byte, rb int, a []byte, n int, out []float32) {
	for r := range out {
		out[r] = vecDot(weight, w[r*rb:(r+1)*rb], a, n)
	}
}

func genericDotF32Lanes(a, b []float32, acc *[32]float32) {
	for i := 0; i+32 <= len(a); i += 32 {
		x, y := a[i:i+32:i+32], b[i:i+32:i+32]
		for l := range 32 {
			acc[l] += float32(x[l] * y[l])
		}
	}
}

// f32View returns b as float32s when it is suitably aligned (GGUF tensor
// data and Go allocations are), else nil.
func f32View(b []byte) []float32 {
	if len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}

func vecDotF32Bytes(w, a []byte, n int) float32 {
	wf, af := f32View(w), f32View(a)
	if wf == nil || af == nil {
		wf, af = make([]float32, n), make([]float32, n)
		for i := range n {
			wf[i] = math.Float32frombits(binary.LittleEndian.Uint32(w[4*i:]))
			af[i] = math.Float32frombits(binary.LittleEndian.Uint32(a[4*i:]))
		}
	}
	return DotF32(wf, af)
}

func vecDotF16(w, a []byte, n int) float32 {
	var acc [32]float32
	n32 := n &^ 31
	if n32 > 0 {
		dotF16Lanes(w[:2*n32], a[:2*n32], &acc)
	}
	for i := n32; i < n; i++ {
		acc[i&31] += float32(fp16Table[le16(w[2*i:])] * fp16Table[le16(a[2*i:])])
	}
	return reduceLanes(&acc)
}

func genericDotF16Lanes(w, a []byte, acc *[32]float32) {
	for i := 0; i+64 <= len(w); i += 64 {
		x, y := w[i:i+64:i+64], a[i:i+64:i+64]
		for l := range 32 {
			acc[l] += float32(fp16Table[le16(x[2*l:])] * fp16Table[le16(y[2*l:])])
		}
	}
}

func vecDotBF16(w, a []byte, n int) float32 {
	var acc [32]float32
	n32 := n &^ 31
	if n32 > 0 {
		dotBF16Lanes(w[:2*n32], a[:2*n32], &acc)
	}
	for i := n32; i < n; i++ {
		acc[i&31] += float32(BF16ToFP32(le16(w[2*i:])) * BF16ToFP32(le16(a[2*i:])))
	}
	return reduceLanes(&acc)
}

func genericDotBF16Lanes(w, a []byte, acc *[32]float32) {
	for i := 0; i+64 <= len(w); i += 64 {
		x, y := w[i:i+64:i+64], a[i:i+64:i+64]
		for l := range 32 {
			acc[l] += float32(BF16ToFP32(le16(x[2*l:])) * BF16ToFP32(le16(y[2*l:])))
		}
	}
}

const sumChunk = 64 // blocks per integer-sum kernel call

func vecDotQ8_0(w, a []byte, nb int) float32 { return q8_0Dot(w, a, nb) }

// q8_0DotSums is the Q8_0 x Q8_0 float part of the pure-Go path (the SIMD
// kernels repeat it operation for operation); the exact per-block integer
// sums come from q8_0Sums.
// (Static calls only: a buffer passed to a func value would escape.)
func q8_0DotSums(w, a []byte, nb int) float32 {
	var buf [sumChunk]int32
	var sumf float32
	for b0 := 0; b0 < nb; b0 += sumChunk {
		k := min(sumChunk, nb-b0)
		q8_0Sums(w[34*b0:34*(b0+k)], a[34*b0:34*(b0+k)], buf[:k])
		for j := range k {
			i := 34 * (b0 + j)
			d := fp16Table[le16(w[i:])] * fp16Table[le16(a[i:])]
			sumf += float32(d * float32(buf[j]))
		}
	}
	return sumf
}

func genericQ8_0Dot(w, a []byte, nb int) float32 { return q8_0DotSums(w, a, nb) }

func genericQ8_0Sums(w, a []byte, out []int32) {
	for b := range out {
		x, y := w[34*b+2:34*b+34], a[34*b+2:34*b+34]
		var s int32
		for j := range 32 {
			s += int32(int8(x[j])) * int32(int8(y[j]))
		}
		out[b] = s
	}
}

func vecDotQ4_0(w, a []byte, nb int) float32 { return q4_0Dot(w, a, nb) }

func genericQ4_0Dot(w, a []byte, nb int) float32 {
	var sumf float32
	for b := range nb {
		x, y := w[18*b:18*b+18], a[34*b:34*b+34]
		var s int32
		for j := range 16 {
			s += (int32(x[2+j]&15) - 8) * int32(int8(y[2+j]))
			s += (int32(x[2+j]>>4) - 8) * int32(int8(y[18+j]))
		}
		d := fp16Table[le16(x)] * fp16Table[le16(y)]
		sumf += float32(d * float32(s))
	}
	return sumf
}

func vecDotQ5_0(w, a []byte, nb int) float32 { return q5_0Dot(w, a, nb) }

func genericQ5_0Dot(w, a []byte, nb int) float32 {
	var sumf float32
	for b := range nb {
		x, y := w[22*b:22*b+22], a[34*b:34*b+34]
		qh := binary.LittleEndian.Uint32(x[2:])
		var s int32
		for j := range 16 {
			h0 := byte((qh>>j)<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			s += (int32(x[6+j]&15|h0) - 16) * int32(int8(y[2+j]))
			s += (int32(x[6+j]>>4|h1) - 16) * int32(int8(y[18+j]))
		}
		d := fp16Table[le16(x)] * fp16Table[le16(y)]
		sumf += float32(d * float32(s))
	}
	return sumf
}

func vecDotQ4_1(w, a []byte, nb int) float32 { return q4_1Dot(w, a, nb) }

func genericQ4_1Dot(w, a []byte, nb int) float32 {
	var sumf float32
	for b := range nb {
		x, y := w[20*b:20*b+20], a[36*b:36*b+36]
		var s int32
		for j := range 16 {
			s += int32(x[4+j]&15) * int32(int8(y[4+j]))
			s += int32(x[4+j]>>4) * int32(int8(y[20+j]))
		}
		d := fp16Table[le16(x)] * fp16Table[le16(y)]
		m := float32(fp16Table[le16(x[2:])] * fp16Table[le16(y[2:])])
		sumf += float32(d*float32(s)) + m
	}
	return sumf
}

func vecDotQ5_1(w, a []byte, nb int) float32 { return q5_1Dot(w, a, nb) }

func genericQ5_1Dot(w, a []byte, nb int) float32 {
	var sumf float32
	for b := range nb {
		x, y := w[24*b:24*b+24], a[36*b:36*b+36]
		qh := binary.LittleEndian.Uint32(x[4:])
		var s int32
		for j := range 16 {
			h0 := byte((qh>>j)<<4) & 0x10
			h1 := byte(qh>>(j+12)) & 0x10
			s += int32(x[8+j]&15|h0) * int32(int8(y[4+j]))
			s += int32(x[8+j]>>4|h1) * int32(int8(y[20+j]))
		}
		d := fp16Table[le16(x)] * fp16Table[le16(y)]
		m := float32(fp16Table[le16(x[2:])] * fp16Table[le16(y[2:])])
		sumf += float32(d*float32(s)) + m
	}
	return sumf
}

// q8KD returns a block_q8_K's float32 scale.
func q8KD(y []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(y)) }

// kMinsTerm returns sum_j min_j*(bsums[2j]+bsums[2j+1]) for a Q4_K/Q5_K
// scales[12] array and a block_q8_K y (the mins term of
// ggml_vec_dot_q4_K_q8_K / _q5_K_q8_K).
func kMinsTerm(scales, y []byte) int32 {
	var s int32
	for j := range 8 {
		_, m := scaleMinK4(j, scales)
		b0 := int32(int16(le16(y[4+QK_K+4*j:])))
		b1 := int32(int16(le16(y[4+QK_K+4*j+2:])))
		s += int32(m) * (b0 + b1)
	}
	return s
}

func vecDotQ4K(w, a []byte, nb int) float32 { return q4KDot(w, a, nb) }
func vecDotQ5K(w, a []byte, nb int) float32 { return q5KDot(w, a, nb) }

// kDotSums is the Q4_K/Q5_K x Q8_K float part of the pure-Go path (block
// size bb: 144 or 176): per block sumf += d*isum, then sumf -= dmin*mins
// term, with d = fp16 d_w * d_a and dmin = fp16 dmin_w * d_a
// (ggml_vec_dot_q4_K_q8_K / _q5_K_q8_K). q4KSums / q5KSums supply the exact
// scaled integer sums (the SIMD kernels fuse both parts, same operations).
func kDotSums(bb int, w, a []byte, nb int) float32 {
	var buf [sumChunk]int32
	var sumf float32
	for b0 := 0; b0 < nb; b0 += sumChunk {
		k := min(sumChunk, nb-b0)
		if bb == 144 {
			q4KSums(w[bb*b0:bb*(b0+k)], a[292*b0:292*(b0+k)], buf[:k])
		} else {
			q5KSums(w[bb*b0:bb*(b0+k)], a[292*b0:292*(b0+k)], buf[:k])
		}
		for j := range k {
			x, y := w[bb*(b0+j):], a[292*(b0+j):]
			dy := q8KD(y)
			d := fp16Table[le16(x)] * dy
			dmin := fp16Table[le16(x[2:])] * dy
			sumf += float32(d * float32(buf[j]))
			sumf -= float32(dmin * float32(kMinsTerm(x[4:16], y)))
		}
	}
	return sumf
}

func genericQ4KDot(w, a []byte, nb int) float32 { return kDotSums(144, w, a, nb) }
func genericQ5KDot(w, a []byte, nb int) float32 { return kDotSums(176, w, a, nb) }

func genericQ4KSums(w, a []byte, out []int32) {
	for b := range out {
		x, y := w[144*b:144*b+144], a[292*b+4:292*b+4+QK_K]
		q := x[16:144]
		var s int32
		for k := range 4 {
			sc0, _ := scaleMinK4(2*k, x[4:16])
			sc1, _ := scaleMinK4(2*k+1, x[4:16])
			var s0, s1 int32
			for l := range 32 {
				s0 += int32(q[32*k+l]&15) * int32(int8(y[64*k+l]))
				s1 += int32(q[32*k+l]>>4) * int32(int8(y[64*k+32+l]))
			}
			s += int32(sc0)*s0 + int32(sc1)*s1
		}
		out[b] = s
	}
}

func genericQ5KSums(w, a []byte, out []int32) {
	for b := range out {
		x, q8 := w[176*b:176*b+176], a[292*b+4:292*b+4+QK_K]
		qh, ql := x[16:48], x[48:176]
		var s int32
		for k := range 4 {
			sc0, _ := scaleMinK4(2*k, x[4:16])
			sc1, _ := scaleMinK4(2*k+1, x[4:16])
			var s0, s1 int32
			for l := range 32 {
				h0 := int32(qh[l]>>(2*k)&1) << 4
				h1 := int32(qh[l]>>(2*k+1)&1) << 4
				s0 += (int32(ql[32*k+l]&15) | h0) * int32(int8(q8[64*k+l]))
				s1 += (int32(ql[32*k+l]>>4) | h1) * int32(int8(q8[64*k+32+l]))
			}
			s += int32(sc0)*s0 + int32(sc1)*s1
		}
		out[b] = s
	}
}

func vecDotQ6K(w, a []byte, nb int) float32 { return q6KDot(w, a, nb) }

// q6KDotSums is the Q6_K x Q8_K float part of the pure-Go path: per block
// sumf += (fp16 d_w * d_a) * isum (ggml_vec_dot_q6_K_q8_K), isum from
// q6KSums (the SIMD kernels fuse both parts, same operations).
func q6KDotSums(w, a []byte, nb int) float32 {
	var buf [sumChunk]int32
	var sumf float32
	for b0 := 0; b0 < nb; b0 += sumChunk {
		k := min(sumChunk, nb-b0)
		q6KSums(w[210*b0:210*(b0+k)], a[292*b0:292*(b0+k)], buf[:k])
		for j := range k {
			d := fp16Table[le16(w[210*(b0+j)+208:])] * q8KD(a[292*(b0+j):])
			sumf += float32(d * float32(buf[j]))
		}
	}
	return sumf
}

func genericQ6KDot(w, a []byte, nb int) float32 { return q6KDotSums(w, a, nb) }

func genericQ6KSums(w, a []byte, out []int32) {
	for b := range out {
		x, q8 := w[210*b:210*b+210], a[292*b+4:292*b+4+QK_K]
		var s int32
		for n := range 2 {
			ql, qh, sc := x[64*n:64*n+64], x[128+32*n:128+32*n+32], x[192+8*n:192+8*n+8]
			y := q8[128*n : 128*n+128]
			var g [8]int32 // sums per 16-element group, scale index order
			for l := range 32 {
				is := l / 16
				q1 := int32(ql[l]&15|(qh[l]&3)<<4) - 32
				q2 := int32(ql[l+32]&15|((qh[l]>>2)&3)<<4) - 32
				q3 := int32(ql[l]>>4|((qh[l]>>4)&3)<<4) - 32
				q4 := int32(ql[l+32]>>4|((qh[l]>>6)&3)<<4) - 32
				g[is] += q1 * int32(int8(y[l]))
				g[is+2] += q2 * int32(int8(y[l+32]))
				g[is+4] += q3 * int32(int8(y[l+64]))
				g[is+6] += q4 * int32(int8(y[l+96]))
			}
			for i := range 8 {
				s += int32(int8(sc[i])) * g[i]
			}
		}
		out[b] = s
	}
}

// MulAddF32 sets dst[i] += x[i]*w[i] for i < len(dst), each product
// rounded to float32 before the add (no fused multiply-add), element by
// element: the bits of the Go loop `dst[i] += float32(x[i] * w[i])` on
// every path (ggml_compute_forward_ssm_conv_f32's per-tap step). x and w
// must hold at least len(dst) floats (else it panics, as the loop would).
func MulAddF32(dst, x, w []float32) {
	n := len(dst)
	if n == 0 {
		return
	}
	x, w = x[:n], w[:n]
	if mulAddF32Fast(dst, x, w) {
		return
	}
	genericMulAddF32(dst, x, w)
}

// ScaleF32 sets dst[i] = a*x[i] for i < len(dst), and ScaleAddF32 sets
// dst[i] += a*x[i], the product rounded to float32 before the add (no
// fused multiply-add): the bits of the Go loops `dst[i] = a * x[i]` and
// `dst[i] += float32(a * x[i])` on every path (expert.WeightedSum's
// steps, ggml_mul by a row's router weight then ggml_add). x must hold at
// least len(dst) floats (else they panic, as the loops would).
func ScaleF32(dst, x []float32, a float32) {
	n := len(dst)
	if n == 0 {
		return
	}
	x = x[:n]
	if scaleF32Fast(dst, x, a, false) {
		return
	}
	genericScaleF32(dst, x, a)
}

// ScaleAddF32: see ScaleF32.
func ScaleAddF32(dst, x []float32, a float32) {
	n := len(dst)
	if n == 0 {
		return
	}
	x = x[:n]
	if scaleF32Fast(dst, x, a, true) {
		return
	}
	genericScaleAddF32(dst, x, a)
}

// genericScaleF32 is ScaleF32 in Go (equal lengths).
func genericScaleF32(dst, x []float32, a float32) {
	for i, xi := range x {
		dst[i] = a * xi
	}
}

// genericScaleAddF32 is ScaleAddF32 in Go (equal lengths).
func genericScaleAddF32(dst, x []float32, a float32) {
	for i, xi := range x {
		dst[i] += float32(a * xi)
	}
}

// genericMulAddF32 is MulAddF32 in Go (equal lengths).
func genericMulAddF32(dst, x, w []float32) {
	for i, xi := range x {
		dst[i] += float32(xi * w[i])
	}
}
