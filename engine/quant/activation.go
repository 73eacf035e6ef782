package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// ActivationBytes returns the bytes that n activations take once converted
// to weight.VecDotType() (ConvertActivation's output size). Errors:
// ErrUnknownType, ErrUnsupported (weight type without a dot product here),
// ErrSize (n not a multiple of the vec-dot type's block size).
func ActivationBytes(weight Type, n int) (int, error) {
	if !weight.Known() {
		return 0, fmt.Errorf("%w: id %d", ErrUnknownType, uint32(weight))
	}
	if !weight.Supported() {
		return 0, fmt.Errorf("%w: no dot product for %s weights", ErrUnsupported, weight)
	}
	return weight.VecDotType().RowBytes(n)
}

// ConvertActivation converts the float32 activations x (one or more rows
// concatenated, len(x) a multiple of the block size) to weight.VecDotType(),
// writing exactly ActivationBytes(weight, len(x)) bytes to dst, bit for bit
// as llama.cpp's CPU backend does on an AVX2/F16C host at @3f545bec
// (see fixtures/ACTIVATIONS.md):
//
//   - F32: little-endian copy.
//   - F16: FP32ToFP16 (round to nearest even, _mm256_cvtps_ph).
//   - BF16: FP32ToBF16 (ggml_compute_fp32_to_bf16).
//   - Q8_0 (quantize_row_q8_0, AVX2 branch of ggml-cpu/arch/x86/quants.c):
//     per 32 values amax = max|x|, d = fp16(amax/127), q = roundeven(x*(127/amax)).
//   - Q8_1 (quantize_row_q8_1, same file): as Q8_0 plus s = fp16(d*sum(q))
//     with the float32 d.
//   - Q8_K (quantize_row_q8_K_ref, ggml-quants.c): per 256 values m = the
//     first element of largest |x|, s = -127/m, q = min(127, nearest_int(s*x)),
//     d = 1/s stored as float32, bsums = sums of 16 codes.
//
// Finite inputs give ggml's bits; for NaN inputs the Q8 scales may differ
// (ggml's vector max is lane-order dependent), never the error behaviour.
// Errors: as ActivationBytes, and ErrSize when len(dst) is wrong.
func ConvertActivation(weight Type, x []float32, dst []byte) error {
	want, err := ActivationBytes(weight, len(x))
	if err != nil {
		return err
	}
	if len(dst) != want {
		return fmt.Errorf("%w: destination has %d bytes, %d activations as %s need %d", ErrSize, len(dst), len(x), weight.VecDotType(), want)
	}
	switch weight.VecDotType() {
	case F32:
		for i, v := range x {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(v))
		}
	case F16:
		for i, v := range x {
			binary.LittleEndian.PutUint16(dst[2*i:], FP32ToFP16(v))
		}
	case BF16:
		for i, v := range x {
			binary.LittleEndian.PutUint16(dst[2*i:], FP32ToBF16(v))
		}
	case Q8_0:
		for i := 0; i < len(x)/32; i++ {
			quantizeQ8Block(x[32*i:32*i+32], dst[34*i:34*i+34], false)
		}
	case Q8_1:
		for i := 0; i < len(x)/32; i++ {
			quantizeQ8Block(x[32*i:32*i+32], dst[36*i:36*i+36], true)
		}
	case Q8_K:
		nb := len(x) / QK_K
		for i := 0; i < nb; i++ {
			// The kernel converts what it can (bit for bit); a block it
			// stops at (a NaN) goes through the Go code.
			if i += quantizeQ8KFast(x[QK_K*i:], dst[292*i:]); i < nb {
				quantizeQ8KBlock(x[QK_K*i:QK_K*(i+1)], dst[292*i:292*(i+1)])
			}
		}
	default:
		return fmt.Errorf("%w: activation type %s", ErrUnsupported, weight.VecDotType())
	}
	return nil
}

// cvtRoundEven mirrors _mm256_round_ps(_MM_ROUND_NEAREST) followed by
// _mm256_cvtps_epi32 and the saturating packs to int8 (_mm256_packs_epi32,
// _mm256_packs_epi16): NaN and out-of-range values become the x86 "integer
// indefinite" 0x80000000, which saturates to -128.
func cvtRoundEven(v float32) int8 {
	r := math.RoundToEven(float64(v))
	if r != r || r >= 2147483648 || r < -2147483648 {
		return -128
	}
	switch {
	case r > 127:
		return 127
	case r < -128:
		return -128
	}
	return int8(r)
}

// quantizeQ8Block converts 32 floats to a block_q8_0 (withSum false, 34
// bytes) or block_q8_1 (withSum true, 36 bytes) as the AVX2 branches of
// quantize_row_q8_0 / quantize_row_q8_1 (ggml-cpu/arch/x86/quants.c).
func quantizeQ8Block(x []float32, dst []byte, withSum bool) {
	var amax float32
	for _, v := range x {
		// A NaN is skipped here; ggml's _mm256_max_ps tree gives a
		// lane-order-dependent amax instead (NaN inputs are not mirrored).
		a := float32(math.Abs(float64(v)))
		if a > amax {
			amax = a
		}
	}
	d := amax / 127
	var id float32
	if amax != 0 {
		id = 127 / amax
	}
	binary.LittleEndian.PutUint16(dst, FP32ToFP16(d))
	off := 2
	if withSum {
		off = 4
	}
	var sum int32
	for j, v := range x {
		q := cvtRoundEven(v * id)
		dst[off+j] = byte(q)
		sum += int32(q)
	}
	if withSum {
		binary.LittleEndian.PutUint16(dst[2:], FP32ToFP16(d*float32(sum)))
	}
}

// nearestInt is ggml's nearest_int (ggml-quants.c): add 1.5*2^23 in float32
// and take the low mantissa bits; round half to even for |v| < 2^22. The
// explicit float32(v) keeps the compiler from fusing a caller's v = a*b
// into the add (FMA on arm64), which would change the result.
func nearestInt(v float32) int32 {
	val := float32(v) + 12582912
	i := int32(math.Float32bits(val))
	return (i & 0x007fffff) - 0x00400000
}

// quantizeQ8KBlock converts 256 floats to a block_q8_K (292 bytes) as
// quantize_row_q8_K_ref (ggml-quants.c @3f545bec).
func quantizeQ8KBlock(x []float32, dst []byte) {
	var amax, max float32
	for _, v := range x {
		a := float32(math.Abs(float64(v)))
		if a > amax {
			amax, max = a, v
		}
	}
	if amax == 0 {
		clear(dst)
		return
	}
	iscale := -127 / max
	qs := dst[4 : 4+QK_K]
	for j, v := range x {
		q := nearestInt(iscale * v)
		if q > 127 {
			q = 127
		}
		qs[j] = byte(int8(q))
	}
	for j := 0; j < QK_K/16; j++ {
		var s int16
		for _, q := range qs[16*j : 16*j+16] {
			s += int16(int8(q))
		}
		binary.LittleEndian.PutUint16(dst[4+QK_K+2*j:], uint16(s))
	}
	binary.LittleEndian.PutUint32(dst, math.Float32bits(1/iscale))
}
