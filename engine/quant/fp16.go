package quant

import "math"

// fp16Table maps every IEEE 754 binary16 bit pattern to its float32 value
// (as ggml's table_f32_f16 in ggml-cpu/ggml-cpu.c does). Filled in init.
var fp16Table [1 << 16]float32

func init() {
	for i := range fp16Table {
		fp16Table[i] = fp16ToFP32Slow(uint16(i))
	}
}

// FP16ToFP32 converts an IEEE 754 binary16 value (bit pattern h) to float32.
// The conversion is exact for every finite value, including subnormals; a
// NaN keeps its sign and payload and is made quiet, as x86 VCVTPH2PS (F16C)
// does.
func FP16ToFP32(h uint16) float32 { return fp16Table[h] }

func fp16ToFP32Slow(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		if mant != 0 {
			return math.Float32frombits(sign | 0x7fc00000 | mant<<13)
		}
		return math.Float32frombits(sign | 0x7f800000)
	case exp == 0:
		if mant == 0 {
			return math.Float32frombits(sign)
		}
		// Subnormal: mant * 2^-24, exact in float32.
		v := float32(mant) * (1.0 / (1 << 24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}

// roundShiftRNE returns m >> shift rounded to nearest, ties to even
// (1 <= shift <= 31).
func roundShiftRNE(m uint32, shift uint) uint32 {
	r := m >> shift
	rem := m & (1<<shift - 1)
	half := uint32(1) << (shift - 1)
	if rem > half || (rem == half && r&1 == 1) {
		r++
	}
	return r
}

// FP32ToFP16 converts f to IEEE 754 binary16 with round to nearest, ties to
// even, as x86 VCVTPS2PH with imm8 0 (_mm256_cvtps_ph, used by ggml-cpu's
// ggml_cpu_fp32_to_fp16 on F16C hosts) does: values from 65520 up become
// infinity, tiny values round to subnormals or zero, and a NaN keeps its
// sign and top 10 payload bits and is made quiet.
func FP32ToFP16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int(b>>23) & 0xff
	mant := b & 0x7fffff
	if exp == 0xff {
		if mant != 0 {
			return sign | 0x7e00 | uint16(mant>>13)
		}
		return sign | 0x7c00
	}
	e := exp - 127 + 15
	if e >= 0x1f {
		return sign | 0x7c00
	}
	if e <= 0 {
		// Result is subnormal (or zero) in units of 2^-24:
		// value = m24 * 2^(exp-150) = m24 * 2^(exp-126) units.
		if exp == 0 {
			return sign // float32 subnormals are far below 2^-25
		}
		shift := uint(126 - exp)
		if shift > 24 {
			return sign
		}
		return sign | uint16(roundShiftRNE(mant|0x800000, shift))
	}
	// Normal: a carry out of the mantissa correctly bumps the exponent
	// (and turns 65520.. into infinity 0x7c00).
	return sign | uint16(roundShiftRNE(uint32(e)<<23|mant, 13))
}

// BF16ToFP32 converts a bfloat16 bit pattern to float32 (exact: the bf16
// bits are the high half of the float32).
func BF16ToFP32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// FP32ToBF16 converts f to bfloat16 as ggml_compute_fp32_to_bf16
// (ggml/src/ggml-impl.h @3f545bec): a NaN keeps its high 16 bits with the
// quiet bit (64) forced; everything else rounds to nearest, ties to even, on
// the high 16 bits (subnormals are kept, large finite values may round to
// infinity).
func FP32ToBF16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 64
	}
	return uint16((u + (0x7fff + (u>>16)&1)) >> 16)
}
