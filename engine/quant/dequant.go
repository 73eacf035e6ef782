package quant

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Block layouts (ggml/src/ggml-common.h @3f545bec; all multi-byte fields
// little-endian, fp16 = IEEE binary16):
//
//	block_q4_0 (18 B / 32):  d fp16 | qs[16]        x[j]=d*((qs[j]&15)-8), x[j+16]=d*((qs[j]>>4)-8)
//	block_q4_1 (20 B / 32):  d, m fp16 | qs[16]     x = d*q + m
//	block_q5_0 (22 B / 32):  d fp16 | qh u32 | qs[16]  5th bit of x[j] = qh bit j
//	block_q5_1 (24 B / 32):  d, m fp16 | qh u32 | qs[16]
//	block_q8_0 (34 B / 32):  d fp16 | qs[32] int8
//	block_q8_1 (36 B / 32):  d, s fp16 | qs[32] int8  (s = d * sum qs)
//	block_q4_K (144 B / 256): d, dmin fp16 | scales[12] (8 x 6-bit scale, 8 x 6-bit min) | qs[128]
//	block_q5_K (176 B / 256): d, dmin fp16 | scales[12] | qh[32] | qs[128]
//	block_q6_K (210 B / 256): ql[128] | qh[64] | scales[16] int8 | d fp16
//	block_q8_K (292 B / 256): d f32 | qs[256] int8 | bsums[16] int16 (sums of 16 qs)

func f16At(b []byte, off int) float32 { return fp16Table[binary.LittleEndian.Uint16(b[off:])] }

// scaleMinK4 decodes sub-block j's 6-bit scale and min from a Q4_K/Q5_K
// scales[12] array (get_scale_min_k4 in ggml-quants.c @3f545bec).
func scaleMinK4(j int, q []byte) (sc, m uint8) {
	if j < 4 {
		return q[j] & 63, q[j+4] & 63
	}
	return q[j+4]&0xF | (q[j-4]>>6)<<4, q[j+4]>>4 | (q[j]>>6)<<4
}

// checkLen validates that n elements of t occupy exactly len(src) bytes.
func checkLen(t Type, n int, have int, what string) error {
	want, err := t.RowBytes(n)
	if err != nil {
		return err
	}
	if have != want {
		return fmt.Errorf("%w: %s has %d bytes, %d %s elements need %d", ErrSize, what, have, n, t, want)
	}
	return nil
}

// Dequantize decodes len(dst) elements of type t from src into dst. src must
// hold exactly t.RowBytes(len(dst)) bytes (several rows may be concatenated).
// The arithmetic mirrors ggml's dequantize_row_* (ggml-quants.c @3f545bec) in
// float32 (products rounded before adds, never fused, so every GOARCH gives
// the same bits). Errors: ErrUnknownType,
// ErrUnsupported (Q2_K, Q3_K), ErrSize.
func Dequantize(t Type, src []byte, dst []float32) error {
	if !t.Known() {
		return fmt.Errorf("%w: id %d", ErrUnknownType, uint32(t))
	}
	if err := checkLen(t, len(dst), len(src), "source"); err != nil {
		return err
	}
	bs, bb := t.BlockSize(), t.BlockBytes()
	nb := len(dst) / bs
	switch t {
	case F32:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	case F16:
		for i := range dst {
			dst[i] = fp16Table[binary.LittleEndian.Uint16(src[2*i:])]
		}
	case BF16:
		for i := range dst {
			dst[i] = BF16ToFP32(binary.LittleEndian.Uint16(src[2*i:]))
		}
	case Q4_0:
		for i := 0; i < nb; i++ {
			b, y := src[i*bb:(i+1)*bb], dst[i*32:(i+1)*32]
			d := f16At(b, 0)
			for j := 0; j < 16; j++ {
				y[j] = float32(int(b[2+j]&15)-8) * d
				y[j+16] = float32(int(b[2+j]>>4)-8) * d
			}
		}
	case Q4_1:
		for i := 0; i < nb; i++ {
			b, y := src[i*bb:(i+1)*bb], dst[i*32:(i+1)*32]
			d, m := f16At(b, 0), f16At(b, 2)
			for j := 0; j < 16; j++ {
				y[j] = float32(float32(b[4+j]&15)*d) + m
				y[j+16] = float32(float32(b[4+j]>>4)*d) + m
			}
		}
	case Q5_0:
		for i := 0; i < nb; i++ {
			b, y := src[i*bb:(i+1)*bb], dst[i*32:(i+1)*32]
			d := f16At(b, 0)
			qh := binary.LittleEndian.Uint32(b[2:])
			for j := 0; j < 16; j++ {
				h0 := byte((qh>>j)<<4) & 0x10
				h1 := byte(qh>>(j+12)) & 0x10
				y[j] = float32(int(b[6+j]&15|h0)-16) * d
				y[j+16] = float32(int(b[6+j]>>4|h1)-16) * d
			}
		}
	case Q5_1:
		for i := 0; i < nb; i++ {
			b, y := src[i*bb:(i+1)*bb], dst[i*32:(i+1)*32]
			d, m := f16At(b, 0), f16At(b, 2)
			qh := binary.LittleEndian.Uint32(b[4:])
			for j := 0; j < 16; j++ {
				h0 := byte((qh>>j)<<4) & 0x10
				h1 := byte(qh>>(j+12)) & 0x10
				y[j] = float32(float32(b[8+j]&15|h0)*d) + m
				y[j+16] = float32(float32(b[8+j]>>4|h1)*d) + m
			}
		}
	case Q8_0, Q8_1:
		off := 2
		if t == Q8_1 {
			off = 4
		}
		for i := 0; i < nb; i++ {
			b, y := src[i*bb:(i+1)*bb], dst[i*32:(i+1)*32]
			d := f16At(b, 0)
			for j := 0; j < 32; j++ {
				y[j] = float32(int8(b[off+j])) * d
			}
		}
	case Q4_K:
		for i := 0; i < nb; i++ {
			b, y := src[i*bb:(i+1)*bb], dst[i*QK_K:(i+1)*QK_K]
			d, dmin := f16At(b, 0), f16At(b, 2)
			scales, q := b[4:16], b[16:144]
			for j, is := 0, 0; j < QK_K; j, is = j+64, is+2 {
				sc, m := scaleMinK4(is, scales)
				d1, m1 := d*float32(sc), float32(dmin*float32(m)) // rounded: no FMA into "- m1"
				sc, m = scaleMinK4(is+1, scales)
				d2, m2 := d*float32(sc), float32(dmin*float32(m))
				qq := q[j/2 : j/2+32]
				for l := 0; l < 32; l++ {
					y[j+l] = float32(d1*float32(qq[l]&15)) - m1
					y[j+32+l] = float32(d2*float32(qq[l]>>4)) - m2
				}
			}
		}
	case Q5_K:
		for i := 0; i < nb; i++ {
			b, y := src[i*bb:(i+1)*bb], dst[i*QK_K:(i+1)*QK_K]
			d, dmin := f16At(b, 0), f16At(b, 2)
			scales, qh, ql := b[4:16], b[16:48], b[48:176]
			u1, u2 := byte(1), byte(2)
			for j, is := 0, 0; j < QK_K; j, is = j+64, is+2 {
				sc, m := scaleMinK4(is, scales)
				d1, m1 := d*float32(sc), float32(dmin*float32(m)) // rounded: no FMA into "- m1"
				sc, m = scaleMinK4(is+1, scales)
				d2, m2 := d*float32(sc), float32(dmin*float32(m))
				qq := ql[j/2 : j/2+32]
				for l := 0; l < 32; l++ {
					h1, h2 := byte(0), byte(0)
					if qh[l]&u1 != 0 {
						h1 = 16
					}
					if qh[l]&u2 != 0 {
						h2 = 16
					}
					y[j+l] = float32(d1*float32(qq[l]&15+h1)) - m1
					y[j+32+l] = float32(d2*float32(qq[l]>>4+h2)) - m2
				}
				u1 <<= 2
				u2 <<= 2
			}
		}
	case Q6_K:
		for i := 0; i < nb; i++ {
			b, y := src[i*bb:(i+1)*bb], dst[i*QK_K:(i+1)*QK_K]
			d := f16At(b, 208)
			for n := 0; n < 2; n++ {
				ql, qh, sc := b[64*n:64*n+64], b[128+32*n:128+32*n+32], b[192+8*n:192+8*n+8]
				yy := y[128*n : 128*n+128]
				for l := 0; l < 32; l++ {
					is := l / 16
					q1 := int(ql[l]&15|(qh[l]&3)<<4) - 32
					q2 := int(ql[l+32]&15|((qh[l]>>2)&3)<<4) - 32
					q3 := int(ql[l]>>4|((qh[l]>>4)&3)<<4) - 32
					q4 := int(ql[l+32]>>4|((qh[l]>>6)&3)<<4) - 32
					yy[l] = d * float32(int8(sc[is])) * float32(q1)
					yy[l+32] = d * float32(int8(sc[is+2])) * float32(q2)
					yy[l+64] = d * float32(int8(sc[is+4])) * float32(q3)
					yy[l+96] = d * float32(int8(sc[is+6])) * float32(q4)
				}
			}
		}
	case Q8_K:
		for i := 0; i < nb; i++ {
			b, y := src[i*bb:(i+1)*bb], dst[i*QK_K:(i+1)*QK_K]
			d := math.Float32frombits(binary.LittleEndian.Uint32(b))
			for j := 0; j < QK_K; j++ {
				y[j] = float32(int8(b[4+j])) * d
			}
		}
	default:
		return fmt.Errorf("%w: cannot dequantize %s", ErrUnsupported, t)
	}
	return nil
}
