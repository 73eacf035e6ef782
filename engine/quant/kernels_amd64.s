//go:build !noasm

// AVX2 kernels for package quant (hand-written Go assembly). See
// kernels_amd64.go for the contracts; vecdot.go for the numerics they must
// reproduce bit for bit.

#include "textflag.h"

// func dotF32LanesAVX2(a, b *float32, n int, acc *[32]float32)
// acc[l] += a[i]*b[i] for i%32 == l; n a multiple of 32. VMULPS then VADDPS
// (no FMA) so each product is rounded like the Go code.
TEXT ·dotF32LanesAVX2(SB), NOSPLIT, $0-32
	MOVQ a+0(FP), SI
	MOVQ b+8(FP), DI
	MOVQ n+16(FP), CX
	MOVQ acc+24(FP), DX
	VMOVUPS 0(DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS 64(DX), Y2
	VMOVUPS 96(DX), Y3
	SHRQ $5, CX
	JZ   f32done

f32loop:
	VMOVUPS 0(SI), Y4
	VMOVUPS 32(SI), Y5
	VMOVUPS 64(SI), Y6
	VMOVUPS 96(SI), Y7
	VMULPS  0(DI), Y4, Y4
	VMULPS  32(DI), Y5, Y5
	VMULPS  64(DI), Y6, Y6
	VMULPS  96(DI), Y7, Y7
	VADDPS  Y4, Y0, Y0
	VADDPS  Y5, Y1, Y1
	VADDPS  Y6, Y2, Y2
	VADDPS  Y7, Y3, Y3
	ADDQ    $128, SI
	ADDQ    $128, DI
	DECQ    CX
	JNZ     f32loop

f32done:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VZEROUPPER
	RET

// func dotF16LanesAVX2(w, a *byte, n int, acc *[32]float32)
// As dotF32LanesAVX2 on two fp16 rows of n elements (VCVTPH2PS, exact).
TEXT ·dotF16LanesAVX2(SB), NOSPLIT, $0-32
	MOVQ w+0(FP), SI
	MOVQ a+8(FP), DI
	MOVQ n+16(FP), CX
	MOVQ acc+24(FP), DX
	VMOVUPS 0(DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS 64(DX), Y2
	VMOVUPS 96(DX), Y3
	SHRQ $5, CX
	JZ   f16done

f16loop:
	VCVTPH2PS 0(SI), Y4
	VCVTPH2PS 16(SI), Y5
	VCVTPH2PS 32(SI), Y6
	VCVTPH2PS 48(SI), Y7
	VCVTPH2PS 0(DI), Y8
	VCVTPH2PS 16(DI), Y9
	VCVTPH2PS 32(DI), Y10
	VCVTPH2PS 48(DI), Y11
	VMULPS    Y8, Y4, Y4
	VMULPS    Y9, Y5, Y5
	VMULPS    Y10, Y6, Y6
	VMULPS    Y11, Y7, Y7
	VADDPS    Y4, Y0, Y0
	VADDPS    Y5, Y1, Y1
	VADDPS    Y6, Y2, Y2
	VADDPS    Y7, Y3, Y3
	ADDQ      $64, SI
	ADDQ      $64, DI
	DECQ      CX
	JNZ       f16loop

f16done:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VZEROUPPER
	RET

// HSUM_Y0 leaves the sum of the 8 int32 lanes of Y0 in X0's low dword.
#define HSUM_Y0 \
	VEXTRACTI128 $1, Y0, X1 \
	VPADDD       X1, X0, X0 \
	VPSHUFD      $0x4e, X0, X1 \
	VPADDD       X1, X0, X0 \
	VPSHUFD      $0xb1, X0, X1 \
	VPADDD       X1, X0, X0

// func q8_0SumsAVX2(w, a *byte, nb int, out *int32)
// out[b] = sum_j int8(w.qs[j]) * int8(a.qs[j]) for nb blocks of 34 bytes.
// Sign-extended 16-bit products (VPMADDWD) are exact for every code, -128
// included.
TEXT ·q8_0SumsAVX2(SB), NOSPLIT, $0-32
	MOVQ w+0(FP), SI
	MOVQ a+8(FP), DI
	MOVQ nb+16(FP), CX
	MOVQ out+24(FP), DX
	TESTQ CX, CX
	JZ    q8done

q8loop:
	VPMOVSXBW 2(SI), Y0
	VPMOVSXBW 18(SI), Y1
	VPMOVSXBW 2(DI), Y2
	VPMOVSXBW 18(DI), Y3
	VPMADDWD  Y2, Y0, Y0
	VPMADDWD  Y3, Y1, Y1
	VPADDD    Y1, Y0, Y0
	HSUM_Y0
	VMOVD     X0, 0(DX)
	ADDQ      $34, SI
	ADDQ      $34, DI
	ADDQ      $4, DX
	DECQ      CX
	JNZ       q8loop

q8done:
	VZEROUPPER
	RET

// Q4K_PAIR handles sub-blocks 2k and 2k+1 (64 elements): qs bytes at
// 16+32k of the block, q8 codes at 4+64k of the block_q8_K, scales at
// 4k(SP) and 4k+2(SP). VPMADDUBSW (u4 x s8, pairs) cannot saturate:
// 2*15*128 < 32767.
#define Q4K_PAIR(qoff, aoff, soff) \
	VMOVDQU      qoff(SI), Y1 \
	VPSRLW       $4, Y1, Y2 \
	VPAND        Y14, Y1, Y1 \
	VPAND        Y14, Y2, Y2 \
	VPMADDUBSW   aoff(DI), Y1, Y1 \
	VPMADDUBSW   (aoff+32)(DI), Y2, Y2 \
	VPBROADCASTW soff(SP), Y3 \
	VPBROADCASTW (soff+2)(SP), Y4 \
	VPMADDWD     Y3, Y1, Y1 \
	VPMADDWD     Y4, Y2, Y2 \
	VPADDD       Y1, Y0, Y0 \
	VPADDD       Y2, Y0, Y0

// func q4KSumsAVX2(w, a *byte, nb int, out *int32)
// out[b] = sum_j sc_j * sum_l q4 * q8 for nb block_q4_K (144 B) x
// block_q8_K (292 B). The 6-bit scales are unpacked as get_scale_min_k4
// does (kmask trick of ggml_vec_dot_q4_K_q8_K) into 8 words on the stack.
TEXT ·q4KSumsAVX2(SB), NOSPLIT, $16-32
	MOVQ w+0(FP), SI
	MOVQ a+8(FP), DI
	MOVQ nb+16(FP), CX
	MOVQ out+24(FP), DX
	TESTQ CX, CX
	JZ    q4kdone
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14

q4kloop:
	MOVL  4(SI), AX                // utmp[0]
	MOVL  12(SI), R8               // utmp[2]
	MOVL  AX, R9
	ANDL  $0x3f3f3f3f, R9          // sc0..3
	MOVL  R8, R10
	ANDL  $0x0f0f0f0f, R10
	SHRL  $6, AX
	ANDL  $0x03030303, AX
	SHLL  $4, AX
	ORL   AX, R10                  // sc4..7
	SHLQ  $32, R10
	ORQ   R10, R9
	MOVQ  R9, X5
	VPMOVZXBW X5, X5
	VMOVDQU   X5, 0(SP)
	VPXOR     Y0, Y0, Y0
	Q4K_PAIR(16, 4, 0)
	Q4K_PAIR(48, 68, 4)
	Q4K_PAIR(80, 132, 8)
	Q4K_PAIR(112, 196, 12)
	HSUM_Y0
	VMOVD X0, 0(DX)
	ADDQ  $144, SI
	ADDQ  $292, DI
	ADDQ  $4, DX
	DECQ  CX
	JNZ   q4kloop

q4kdone:
	VZEROUPPER
	RET

// Q6K_QUARTER multiplies the 32 6-bit codes in register Q (unsigned 0..63)
// with the 32 q8 codes at aoff(DI), subtracts 32*q8 (the -32 offset),
// scales the low 16 with word soff(SP) and the high 16 with soff+2(SP) and
// adds into Y0. |pair sums| <= 8192, times |scale| <= 128: no overflow.
#define Q6K_QUARTER(Q, X, aoff, soff) \
	VMOVDQU      aoff(DI), Y9 \
	VPMADDUBSW   Y9, Q, Q \
	VPMADDUBSW   Y9, Y13, Y10 \
	VPSUBW       Y10, Q, Q \
	VPBROADCASTW soff(SP), Y10 \
	VPBROADCASTW (soff+2)(SP), Y11 \
	VINSERTI128  $1, X11, Y10, Y10 \
	VPMADDWD     Y10, Q, Q \
	VPADDD       Q, Y0, Y0

// Q6K_HALF decodes 128 elements (ql at qloff, qh at hoff) as
// dequantize_row_q6_K does and accumulates the four quarters.
#define Q6K_HALF(qloff, hoff, aoff, soff) \
	VMOVDQU hoff(SI), Y5 \
	VMOVDQU qloff(SI), Y6 \
	VMOVDQU (qloff+32)(SI), Y7 \
	VPAND   Y14, Y6, Y1 \
	VPSLLW  $4, Y5, Y2 \
	VPAND   Y12, Y2, Y2 \
	VPOR    Y2, Y1, Y1 \
	VPAND   Y14, Y7, Y2 \
	VPSLLW  $2, Y5, Y3 \
	VPAND   Y12, Y3, Y3 \
	VPOR    Y3, Y2, Y2 \
	VPSRLW  $4, Y6, Y3 \
	VPAND   Y14, Y3, Y3 \
	VPAND   Y12, Y5, Y4 \
	VPOR    Y4, Y3, Y3 \
	VPSRLW  $4, Y7, Y4 \
	VPAND   Y14, Y4, Y4 \
	VPSRLW  $2, Y5, Y8 \
	VPAND   Y12, Y8, Y8 \
	VPOR    Y8, Y4, Y4 \
	Q6K_QUARTER(Y1, X1, aoff, soff) \
	Q6K_QUARTER(Y2, X2, (aoff+32), (soff+4)) \
	Q6K_QUARTER(Y3, X3, (aoff+64), (soff+8)) \
	Q6K_QUARTER(Y4, X4, (aoff+96), (soff+12))

// func q6KSumsAVX2(w, a *byte, nb int, out *int32)
// out[b] = sum_g sc_g * sum (q6-32)*q8 for nb block_q6_K (210 B) x
// block_q8_K (292 B).
TEXT ·q6KSumsAVX2(SB), NOSPLIT, $32-32
	MOVQ w+0(FP), SI
	MOVQ a+8(FP), DI
	MOVQ nb+16(FP), CX
	MOVQ out+24(FP), DX
	TESTQ CX, CX
	JZ    q6kdone
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x30303030, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12
	MOVL         $0x20202020, AX
	VMOVD        AX, X13
	VPBROADCASTD X13, Y13

q6kloop:
	VPMOVSXBW 192(SI), Y15
	VMOVDQU   Y15, 0(SP)
	VPXOR     Y0, Y0, Y0
	Q6K_HALF(0, 128, 4, 0)
	Q6K_HALF(64, 160, 132, 16)
	HSUM_Y0
	VMOVD X0, 0(DX)
	ADDQ  $210, SI
	ADDQ  $292, DI
	ADDQ  $4, DX
	DECQ  CX
	JNZ   q6kloop

q6kdone:
	VZEROUPPER
	RET
