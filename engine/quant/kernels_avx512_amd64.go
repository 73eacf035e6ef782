//go:build !noasm

package quant

import (
	"sync"
	"unsafe"
)

// AVX-512 (F, BW, VL, VNNI) kernels of kernels_avx512_amd64.s, used where
// useSIMD && useAVX512. They read block_q4_K weights (ggml-common.h
// @3f545beccee69d9975f466ec7e45fd9aacd8ba90) as stored, and block_q8_K
// activations as q8KPermAVX512 reorders them (the codes of each
// 128-element half as 0..31, 64..95, 32..63, 96..127; d and bsums in
// place), so that one 64-byte load of weight nibbles meets one 64-byte
// load of codes, with the bsums and d beside them: q8KPBytes per
// block (the layout is described in kernels_avx512_amd64.s). Each result
// is genericQ4KDot's, bit for bit.

// q8KPBytes is the size of a reordered activation block.
const q8KPBytes = 448

// align64 returns b from its first 64-byte aligned byte (b must have 63
// bytes to spare).
func align64(b []byte) []byte {
	return b[(64-uintptr(unsafe.Pointer(&b[0]))%64)%64:]
}

//go:noescape
func q8KPermAVX512(src, dst *byte, nb int)

//go:noescape
func q4KRowsAVX512(w, a *byte, nb, rows, rb int, out *float32)

//go:noescape
func q4KRows4AVX512(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)

//go:noescape
func q4KRows8AVX512(w, a *byte, pb, nb, rows, rb int, y *float32, ys int)

//go:noescape
func dotF32AVX512(a, b *float32, n int) float32

//go:noescape
func dotF32RowsAVX512(x, m *float32, n, rows, stride int, out *float32)

//go:noescape
func f32RowsAVX512(w, x *float32, n, rows, stride int, out *float32)

// permPool holds the reordered activations of q4KMatMul512 (*[]byte).
var permPool sync.Pool

// q4KRows512 sets out[r] = genericQ4KDot(w[r*rb:], a, nb) for r <
// len(out) >= 1 through a stack copy of a reordered; false (nothing
// written) when nb is 0 or above the largest copy (64 blocks, 16384
// columns). Lengths are the caller's.
func q4KRows512(w []byte, rb int, a []byte, nb int, out []float32) bool {
	switch {
	case nb <= 0 || len(out) == 0:
		return false
	case nb <= 4:
		q4KRows512s4(w, rb, a, nb, out)
	case nb <= 16:
		q4KRows512s16(w, rb, a, nb, out)
	case nb <= 64:
		q4KRows512s64(w, rb, a, nb, out)
	default:
		return false
	}
	return true
}

//go:noinline
func q4KRows512s4(w []byte, rb int, a []byte, nb int, out []float32) {
	var buf [4*q8KPBytes + 64]byte
	p := align64(buf[:])
	q8KPermAVX512(&a[0], &p[0], nb)
	q4KRowsAVX512(&w[0], &p[0], nb, len(out), rb, &out[0])
}

//go:noinline
func q4KRows512s16(w []byte, rb int, a []byte, nb int, out []float32) {
	var buf [16*q8KPBytes + 64]byte
	p := align64(buf[:])
	q8KPermAVX512(&a[0], &p[0], nb)
	q4KRowsAVX512(&w[0], &p[0], nb, len(out), rb, &out[0])
}

//go:noinline
func q4KRows512s64(w []byte, rb int, a []byte, nb int, out []float32) {
	var buf [64*q8KPBytes + 64]byte
	p := align64(buf[:])
	q8KPermAVX512(&a[0], &p[0], nb)
	q4KRowsAVX512(&w[0], &p[0], nb, len(out), rb, &out[0])
}

// q4KRows4512 is vecDot4Rows for Q4_K on the AVX-512 path (lengths
// checked by it): the 4 activation rows reordered into a pooled buffer.
func q4KRows4512(w []byte, rb int, a []byte, ab, nb int, y []float32, ys, rows int) {
	pb := nb * q8KPBytes
	bp := permBuf(4 * pb)
	xp := align64(*bp)
	for j := range 4 {
		q8KPermAVX512(&a[j*ab], &xp[j*pb], nb)
	}
	q4KRows4AVX512(&w[0], &xp[0], &xp[pb], &xp[2*pb], &xp[3*pb], nb, rows, rb, &y[0], ys)
	permPool.Put(bp)
}

// permBuf returns a pooled buffer of n bytes and 64 to spare for
// alignment (put it back in permPool).
func permBuf(n int) *[]byte {
	n += 64
	bp, _ := permPool.Get().(*[]byte)
	if bp == nil || cap(*bp) < n {
		b := make([]byte, n)
		bp = &b
	}
	*bp = (*bp)[:n]
	return bp
}

// matMulRowsArch is matMulRows for Q4_K weights on the AVX-512 path: the
// m activation rows are reordered once, then each tile of weight rows
// goes through the 8-row kernel for groups of 8 activation rows, the
// 4-row one for a group of 4 and the 1-row one for the rest. It reports false (nothing done) for other
// types or paths.
func matMulRowsArch(weight Type, w []byte, rb, cols int, xc []byte, ab, m int, y []float32, rows, lo, hi int) bool {
	if weight != Q4_K || !useSIMD || !useAVX512 || lo >= hi {
		return false
	}
	nb := cols / QK_K
	if nb < 1 || ab < 292*nb || rb < 144*nb {
		return false
	}
	pb := nb * q8KPBytes
	bp := permBuf(m * pb)
	xp := align64(*bp)
	for i := range m {
		q8KPermAVX512(&xc[i*ab], &xp[i*pb], nb)
	}
	m8, m4 := m&^7, m&^3
	tile := rowTile
	if m < 4 {
		tile = hi - lo
	}
	for r0 := lo; r0 < hi; r0 += tile {
		r1 := min(r0+tile, hi)
		wt := w[r0*rb:]
		for i := 0; i < m8; i += 8 {
			q4KRows8AVX512(&wt[0], &xp[i*pb], pb, nb, r1-r0, rb, &y[i*rows+r0], rows)
		}
		for i := m8; i < m4; i += 4 {
			q4KRows4AVX512(&wt[0], &xp[i*pb], &xp[(i+1)*pb], &xp[(i+2)*pb], &xp[(i+3)*pb], nb, r1-r0, rb, &y[i*rows+r0], rows)
		}
		for i := m4; i < m; i++ {
			q4KRowsAVX512(&wt[0], &xp[i*pb], nb, r1-r0, rb, &y[i*rows+r0])
		}
	}
	permPool.Put(bp)
	return true
}

//go:noescape
func deltaRuleAVX512(st, q, k, v, o *float32, n, rows int, beta, decay, scale float32)

//go:noescape
func q8KQuantAVX512(x *float32, dst *byte, nb int) int

//go:noescape
func mulAddF32AVX512(dst, x, w *float32, n int)

//go:noescape
func scaleF32AVX512(dst, x *float32, a float32, n int)

//go:noescape
func scaleAddF32AVX512(dst, x *float32, a float32, n int)
