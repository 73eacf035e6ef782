package quant

import "fmt"

// DeltaRule advances one head of a Gated DeltaNet recurrent state by one
// token (llama.cpp ggml_compute_forward_gated_delta_net, one value head):
// st holds len(o) rows of n = len(q) floats (row j is column j of the
// head's state matrix), and for each row j, in order,
//
//	st_j *= decay                      (float32 multiply per element)
//	d    = (v[j] - DotF32(st_j, k)) * beta
//	st_j += k * d                      (float32 multiply, then add)
//	o[j] = DotF32(st_j, q) * scale
//
// with DotF32's summation order and every multiply and add rounded on its
// own (no fused multiply-add), so the SIMD kernels give the bits of the
// pure-Go loop. Errors: ErrSize when k or v is shorter than needed or st
// holds fewer than len(o)*len(q) floats.
func DeltaRule(st, q, k, v, o []float32, beta, decay, scale float32) error {
	n, rows := len(q), len(o)
	if len(k) < n || len(v) < rows || len(st) < rows*n {
		return fmt.Errorf("%w: delta rule of %d rows of %d: st %d, k %d, v %d", ErrSize, rows, n, len(st), len(k), len(v))
	}
	if n == 0 || rows == 0 {
		for j := range o {
			o[j] = 0
		}
		return nil
	}
	deltaRule(st[:rows*n], q, k[:n], v[:rows], o, beta, decay, scale)
	return nil
}

// genericDeltaRule is DeltaRule after its length checks, in Go.
func genericDeltaRule(st, q, k, v, o []float32, beta, decay, scale float32) {
	n := len(q)
	for j := range o {
		mj := st[j*n : (j+1)*n]
		for i := range mj {
			mj[i] *= decay
		}
		dj := (v[j] - dotF32(mj, k, n)) * beta
		for i, ki := range k {
			mj[i] += float32(ki * dj)
		}
		o[j] = dotF32(mj, q, n) * scale
	}
}
