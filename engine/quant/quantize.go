package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Quantize encodes len(src) float32 values as type t into dst, which must
// hold exactly t.RowBytes(len(src)) bytes. The algorithms are the reference
// quantizers of ggml-quants.c @3f545bec (quantize_row_*_ref, without
// importance weights): Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 per-block min/max scaling,
// Q4_K/Q5_K via make_qkx2_quants, Q6_K via make_qx_quants; F16/BF16 round to
// nearest even; Q8_1 and Q8_K use the activation conversions of
// ConvertActivation. Results may differ from llama-quantize in rare ties
// (float summation order) but have the same quality. Non-finite inputs give
// unspecified (but in-range) codes. Errors: ErrUnknownType, ErrUnsupported
// (Q2_K, Q3_K), ErrSize.
func Quantize(t Type, src []float32, dst []byte) error {
	if !t.Known() {
		return fmt.Errorf("%w: id %d", ErrUnknownType, uint32(t))
	}
	if err := checkLen(t, len(src), len(dst), "destination"); err != nil {
		return err
	}
	bs, bb := t.BlockSize(), t.BlockBytes()
	nb := len(src) / bs
	blk := func(i int) ([]float32, []byte) { return src[i*bs : (i+1)*bs], dst[i*bb : (i+1)*bb] }
	switch t {
	case F32:
		for i, v := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], FP32ToFP16(v))
		}
	case BF16:
		for i, v := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], FP32ToBF16(v))
		}
	case Q8_1:
		for i := range nb {
			xb, yb := blk(i)
			quantizeQ8Block(xb, yb, true)
		}
	case Q8_K:
		for i := range nb {
			quantizeQ8KBlock(blk(i))
		}
	case Q8_0:
		for i := range nb {
			quantQ8_0Ref(blk(i))
		}
	case Q4_0:
		for i := range nb {
			quantQx0Ref(blk(i))
		}
	case Q5_0:
		for i := range nb {
			quantQx0Ref(blk(i))
		}
	case Q4_1:
		for i := range nb {
			quantQx1Ref(blk(i))
		}
	case Q5_1:
		for i := range nb {
			quantQx1Ref(blk(i))
		}
	case Q4_K, Q5_K:
		for i := range nb {
			quantQ45KRef(t, src[i*bs:(i+1)*bs], dst[i*bb:(i+1)*bb])
		}
	case Q6_K:
		for i := range nb {
			quantQ6KRef(blk(i))
		}
	default:
		return fmt.Errorf("%w: cannot quantize to %s", ErrUnsupported, t)
	}
	return nil
}

func abs32(v float32) float32 { return float32(math.Abs(float64(v))) }

func putF16(b []byte, v float32) { binary.LittleEndian.PutUint16(b, FP32ToFP16(v)) }

// clampInt converts a float32 to int like a C cast of an in-range value
// (truncation toward zero), clamping out-of-range values and NaN.
func clampInt(v float32, lo, hi int32) int32 {
	if !(v >= float32(lo)) {
		return lo
	}
	if v >= float32(hi) {
		return hi
	}
	return int32(v)
}

func clampI32(v, lo, hi int32) int32 { return max(lo, min(hi, v)) }

// quantQ8_0Ref is quantize_row_q8_0_ref: d = amax/127, q = roundf(x/d).
func quantQ8_0Ref(x []float32, y []byte) {
	var amax float32
	for _, v := range x {
		amax = max(amax, abs32(v))
	}
	d := amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16(y, d)
	for j, v := range x {
		r := math.Round(float64(v * id)) // roundf: half away from zero
		y[2+j] = byte(int8(clampI32(int32(max(-128, min(127, r))), -128, 127)))
	}
}

// quantQx0Ref is quantize_row_q4_0_ref (18-byte blocks) or
// quantize_row_q5_0_ref (22-byte blocks): d = max/-8 (or -16) where max is
// the signed value of largest magnitude.
func quantQx0Ref(x []float32, y []byte) {
	var amax, mx float32
	for _, v := range x {
		if amax < abs32(v) {
			amax, mx = abs32(v), v
		}
	}
	five := len(y) == 22
	var d float32
	if five {
		d = mx / -16
	} else {
		d = mx / -8
	}
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16(y, d)
	var qh uint32
	for j := range 16 {
		x0, x1 := float32(x[j]*id), float32(x[16+j]*id) // rounded: no FMA with the + below
		if five {
			q0 := min(31, clampInt(x0+16.5, -128, 127))
			q1 := min(31, clampInt(x1+16.5, -128, 127))
			y[6+j] = byte(q0&15) | byte(q1&15)<<4
			qh |= uint32(q0&0x10) >> 4 << j
			qh |= uint32(q1&0x10) >> 4 << (j + 16)
		} else {
			q0 := min(15, clampInt(x0+8.5, -128, 127))
			q1 := min(15, clampInt(x1+8.5, -128, 127))
			y[2+j] = byte(q0) | byte(q1)<<4
		}
	}
	if five {
		binary.LittleEndian.PutUint32(y[2:], qh)
	}
}

// quantQx1Ref is quantize_row_q4_1_ref (20-byte blocks) or
// quantize_row_q5_1_ref (24-byte blocks): d = (max-min)/15 (or 31), m = min.
func quantQx1Ref(x []float32, y []byte) {
	mn, mx := float32(math.MaxFloat32), float32(-math.MaxFloat32)
	for _, v := range x {
		mn, mx = min(mn, v), max(mx, v)
	}
	five := len(y) == 24
	nmax := float32(15)
	if five {
		nmax = 31
	}
	d := (mx - mn) / nmax
	var id float32
	if d != 0 {
		id = 1 / d
	}
	putF16(y, d)
	putF16(y[2:], mn)
	var qh uint32
	for j := range 16 {
		x0, x1 := float32((x[j]-mn)*id), float32((x[16+j]-mn)*id)
		q0 := min(int32(nmax), clampInt(x0+0.5, 0, 255))
		q1 := min(int32(nmax), clampInt(x1+0.5, 0, 255))
		if five {
			y[8+j] = byte(q0&15) | byte(q1&15)<<4
			qh |= uint32(q0&0x10) >> 4 << j
			qh |= uint32(q1&0x10) >> 4 << (j + 16)
		} else {
			y[4+j] = byte(q0) | byte(q1)<<4
		}
	}
	if five {
		binary.LittleEndian.PutUint32(y[4:], qh)
	}
}

// makeQKX2Quants is make_qkx2_quants (ggml-quants.c): an iterative weighted
// least-squares fit of x ~ scale*L - min with L in [0, nmax]. It returns the
// scale and the (positive) min; L receives the codes.
func makeQKX2Quants(nmax int32, x, weights []float32, L, Laux []uint8, rmin, rdelta float32, nstep int) (float32, float32) {
	n := len(x)
	mn, mx := x[0], x[0]
	sumW := weights[0]
	sumX := float32(sumW * x[0])
	for i := 1; i < n; i++ {
		mn, mx = min(mn, x[i]), max(mx, x[i])
		w := weights[i]
		sumW += w
		sumX += float32(w * x[i])
	}
	if mn > 0 {
		mn = 0
	}
	if mx == mn {
		clear(L[:n])
		return 0, -mn
	}
	iscale := float32(nmax) / (mx - mn)
	scale := 1 / iscale
	var bestErr float32
	for i := range n {
		l := clampI32(nearestInt(iscale*(x[i]-mn)), 0, nmax)
		L[i] = uint8(l)
		diff := float32(scale*float32(l)) + mn - x[i]
		bestErr += float32(weights[i] * float32(diff*diff))
	}
	if nstep < 1 {
		return scale, -mn
	}
	for is := 0; is <= nstep; is++ {
		iscale = (rmin + float32(rdelta*float32(is)) + float32(nmax)) / (mx - mn)
		var sumL, sumL2, sumXL float32
		for i := range n {
			l := clampI32(nearestInt(iscale*(x[i]-mn)), 0, nmax)
			Laux[i] = uint8(l)
			w := weights[i]
			fl := float32(l)
			sumL += float32(w * fl)
			sumL2 += float32(float32(w*fl) * fl)
			sumXL += float32(float32(w*fl) * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curErr float32
			for i := range n {
				diff := float32(thisScale*float32(Laux[i])) + thisMin - x[i]
				curErr += float32(weights[i] * float32(diff*diff))
			}
			if curErr < bestErr {
				copy(L[:n], Laux[:n])
				bestErr, scale, mn = curErr, thisScale, thisMin
			}
		}
	}
	return scale, -mn
}

// quantQ45KRef is quantize_row_q4_K_ref / quantize_row_q5_K_ref for one
// 256-element block.
func quantQ45KRef(t Type, x []float32, y []byte) {
	five := t == Q5_K
	nmax, rmin, nstep := int32(15), float32(-1), 20
	if five {
		nmax, rmin, nstep = 31, -0.5, 15
	}
	var L [QK_K]uint8
	var Laux [32]uint8
	var weights [32]float32
	var scales, mins [8]float32
	var maxScale, maxMin float32
	for j := range 8 {
		xs := x[32*j : 32*j+32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		avX := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			weights[l] = avX + abs32(v)
		}
		scales[j], mins[j] = makeQKX2Quants(nmax, xs, weights[:], L[32*j:32*j+32], Laux[:], rmin, 0.1, nstep)
		maxScale, maxMin = max(maxScale, scales[j]), max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	sc := y[4:16]
	clear(sc)
	for j := range 8 {
		ls := uint8(min(63, uint8(nearestInt(invScale*scales[j]))))
		lm := uint8(min(63, uint8(nearestInt(invMin*mins[j]))))
		if j < 4 {
			sc[j], sc[j+4] = ls, lm
		} else {
			sc[j+4] = ls&0xF | (lm&0xF)<<4
			sc[j-4] |= (ls >> 4) << 6
			sc[j] |= (lm >> 4) << 6
		}
	}
	putF16(y, maxScale/63)
	putF16(y[2:], maxMin/63)
	dAll, dminAll := f16At(y, 0), f16At(y, 2)
	for j := range 8 {
		s, m := scaleMinK4(j, sc)
		d := dAll * float32(s)
		if d == 0 {
			continue
		}
		dm := float32(dminAll * float32(m)) // rounded: no FMA into "x + dm" on arm64
		for ii := range 32 {
			l := nearestInt((x[32*j+ii] + dm) / d)
			L[32*j+ii] = uint8(clampI32(l, 0, nmax))
		}
	}
	if !five {
		q := y[16:144]
		for j := 0; j < QK_K; j += 64 {
			for l := range 32 {
				q[j/2+l] = L[j+l] | L[j+l+32]<<4
			}
		}
		return
	}
	qh, ql := y[16:48], y[48:176]
	clear(qh)
	m1, m2 := uint8(1), uint8(2)
	for n := 0; n < QK_K; n += 64 {
		for j := range 32 {
			l1, l2 := L[n+j], L[n+j+32]
			if l1 > 15 {
				l1 -= 16
				qh[j] |= m1
			}
			if l2 > 15 {
				l2 -= 16
				qh[j] |= m2
			}
			ql[n/2+j] = l1 | l2<<4
		}
		m1 <<= 2
		m2 <<= 2
	}
}

// groupMaxEps is GROUP_MAX_EPS of ggml-quants.c.
const groupMaxEps = 1e-15

// makeQXQuants is make_qx_quants with rmse_type 1 and no importance
// weights (weights x^2), as quantize_row_q6_K_ref calls it: a symmetric
// fit x ~ scale*(L-nmax) with L-nmax in [-nmax, nmax-1], trying 19 scales.
func makeQXQuants(nmax int32, x []float32, L []int8) float32 {
	var amax, mx float32
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, mx = a, v
		}
	}
	if amax < groupMaxEps {
		clear(L)
		return 0
	}
	fit := func(iscale float32) (sumLX, sumL2 float32) {
		for _, v := range x {
			l := float32(clampI32(nearestInt(iscale*v), -nmax, nmax-1))
			w := float32(v * v)
			sumLX += float32(float32(w*v) * l)
			sumL2 += float32(float32(w*l) * l)
		}
		return
	}
	set := func(iscale float32) {
		for i, v := range x {
			L[i] = int8(nmax + clampI32(nearestInt(iscale*v), -nmax, nmax-1))
		}
	}
	iscale := -float32(nmax) / mx
	set(iscale)
	sumLX, sumL2 := fit(iscale)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := float32(scale * sumLX)
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale = -(float32(nmax) + float32(0.1*float32(is))) / mx
		lx, l2 := fit(iscale)
		if l2 > 0 && float32(lx*lx) > float32(best*l2) {
			set(iscale)
			scale = lx / l2
			best = float32(scale * lx)
		}
	}
	return scale
}

// quantQ6KRef is quantize_row_q6_K_ref for one 256-element block.
func quantQ6KRef(x []float32, y []byte) {
	var L [QK_K]int8
	var scales [QK_K / 16]float32
	var maxScale, maxAbsScale float32
	for ib := range QK_K / 16 {
		s := makeQXQuants(32, x[16*ib:16*ib+16], L[16*ib:16*ib+16])
		scales[ib] = s
		if abs32(s) > maxAbsScale {
			maxAbsScale, maxScale = abs32(s), s
		}
	}
	if maxAbsScale < groupMaxEps {
		clear(y)
		return
	}
	iscale := -128 / maxScale
	putF16(y[208:], 1/iscale)
	for ib := range QK_K / 16 {
		y[192+ib] = byte(int8(min(127, nearestInt(iscale*scales[ib]))))
	}
	dAll := f16At(y, 208)
	for j := range QK_K / 16 {
		d := dAll * float32(int8(y[192+j]))
		if d == 0 {
			continue
		}
		for ii := range 16 {
			l := clampI32(nearestInt(x[16*j+ii]/d), -32, 31)
			L[16*j+ii] = int8(l + 32)
		}
	}
	ql, qh := y[0:128], y[128:192]
	for j := 0; j < QK_K; j += 128 {
		for l := range 32 {
			q1 := uint8(L[j+l]) & 0xF
			q2 := uint8(L[j+l+32]) & 0xF
			q3 := uint8(L[j+l+64]) & 0xF
			q4 := uint8(L[j+l+96]) & 0xF
			ql[j/2+l] = q1 | q3<<4
			ql[j/2+l+32] = q2 | q4<<4
			qh[j/4+l] = uint8(L[j+l])>>4 | (uint8(L[j+l+32])>>4)<<2 | (uint8(L[j+l+64])>>4)<<4 | (uint8(L[j+l+96])>>4)<<6
		}
	}
}
