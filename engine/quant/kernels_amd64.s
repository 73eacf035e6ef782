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

// func dotBF16LanesAVX2(w, a *byte, n int, acc *[32]float32)
// As dotF32LanesAVX2 on two bf16 rows of n elements (bf16 -> f32 is a
// 16-bit shift, exact).
TEXT ·dotBF16LanesAVX2(SB), NOSPLIT, $0-32
	MOVQ w+0(FP), SI
	MOVQ a+8(FP), DI
	MOVQ n+16(FP), CX
	MOVQ acc+24(FP), DX
	VMOVUPS 0(DX), Y0
	VMOVUPS 32(DX), Y1
	VMOVUPS 64(DX), Y2
	VMOVUPS 96(DX), Y3
	SHRQ $5, CX
	JZ   bf16done

bf16loop:
	VPMOVZXWD 0(SI), Y4
	VPMOVZXWD 16(SI), Y5
	VPMOVZXWD 32(SI), Y6
	VPMOVZXWD 48(SI), Y7
	VPMOVZXWD 0(DI), Y8
	VPMOVZXWD 16(DI), Y9
	VPMOVZXWD 32(DI), Y10
	VPMOVZXWD 48(DI), Y11
	VPSLLD    $16, Y4, Y4
	VPSLLD    $16, Y5, Y5
	VPSLLD    $16, Y6, Y6
	VPSLLD    $16, Y7, Y7
	VPSLLD    $16, Y8, Y8
	VPSLLD    $16, Y9, Y9
	VPSLLD    $16, Y10, Y10
	VPSLLD    $16, Y11, Y11
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
	JNZ       bf16loop

bf16done:
	VMOVUPS Y0, 0(DX)
	VMOVUPS Y1, 32(DX)
	VMOVUPS Y2, 64(DX)
	VMOVUPS Y3, 96(DX)
	VZEROUPPER
	RET

// HSUM(Y, X, T) leaves the sum of the 8 int32 lanes of Y in the low dword
// of X (the xmm half of Y); T is a scratch xmm.
#define HSUM(Y, X, T) \
	VEXTRACTI128 $1, Y, T \
	VPADDD       T, X, X \
	VPSHUFD      $0x4e, X, T \
	VPADDD       T, X, X \
	VPSHUFD      $0xb1, X, T \
	VPADDD       T, X, X

// q6kevenodd gathers the even then the odd bytes of 16 (Q6K_SCALES);
// q6kscq+32q (q < 8) picks word q of each 128-bit lane into all 8 words of
// that lane (the scale pair of Q6_K quarter q).
DATA q6kevenodd<>+0(SB)/8, $0x0e0c0a0806040200
DATA q6kevenodd<>+8(SB)/8, $0x0f0d0b0907050301
GLOBL q6kevenodd<>(SB), RODATA|NOPTR, $16

DATA q6kscq<>+0(SB)/8, $0x0100010001000100
DATA q6kscq<>+8(SB)/8, $0x0100010001000100
DATA q6kscq<>+16(SB)/8, $0x0100010001000100
DATA q6kscq<>+24(SB)/8, $0x0100010001000100
DATA q6kscq<>+32(SB)/8, $0x0302030203020302
DATA q6kscq<>+40(SB)/8, $0x0302030203020302
DATA q6kscq<>+48(SB)/8, $0x0302030203020302
DATA q6kscq<>+56(SB)/8, $0x0302030203020302
DATA q6kscq<>+64(SB)/8, $0x0504050405040504
DATA q6kscq<>+72(SB)/8, $0x0504050405040504
DATA q6kscq<>+80(SB)/8, $0x0504050405040504
DATA q6kscq<>+88(SB)/8, $0x0504050405040504
DATA q6kscq<>+96(SB)/8, $0x0706070607060706
DATA q6kscq<>+104(SB)/8, $0x0706070607060706
DATA q6kscq<>+112(SB)/8, $0x0706070607060706
DATA q6kscq<>+120(SB)/8, $0x0706070607060706
DATA q6kscq<>+128(SB)/8, $0x0908090809080908
DATA q6kscq<>+136(SB)/8, $0x0908090809080908
DATA q6kscq<>+144(SB)/8, $0x0908090809080908
DATA q6kscq<>+152(SB)/8, $0x0908090809080908
DATA q6kscq<>+160(SB)/8, $0x0b0a0b0a0b0a0b0a
DATA q6kscq<>+168(SB)/8, $0x0b0a0b0a0b0a0b0a
DATA q6kscq<>+176(SB)/8, $0x0b0a0b0a0b0a0b0a
DATA q6kscq<>+184(SB)/8, $0x0b0a0b0a0b0a0b0a
DATA q6kscq<>+192(SB)/8, $0x0d0c0d0c0d0c0d0c
DATA q6kscq<>+200(SB)/8, $0x0d0c0d0c0d0c0d0c
DATA q6kscq<>+208(SB)/8, $0x0d0c0d0c0d0c0d0c
DATA q6kscq<>+216(SB)/8, $0x0d0c0d0c0d0c0d0c
DATA q6kscq<>+224(SB)/8, $0x0f0e0f0e0f0e0f0e
DATA q6kscq<>+232(SB)/8, $0x0f0e0f0e0f0e0f0e
DATA q6kscq<>+240(SB)/8, $0x0f0e0f0e0f0e0f0e
DATA q6kscq<>+248(SB)/8, $0x0f0e0f0e0f0e0f0e
GLOBL q6kscq<>(SB), RODATA|NOPTR, $256

// HSUM4(A, B, C, D, XA, XT) leaves in XA the 4 int32 lane sums
// [sum A, sum B, sum C, sum D] of the 8-lane registers A..D (exact;
// clobbers A, C and XT). The rows4 kernels then finish the 4 rows with
// packed float ops: each lane is the scalar operation of the single-row
// kernel on that row, in the same order, so the bits are the same.
#define HSUM4(A, B, C, D, XA, XT) \
	VPHADDD      B, A, A \
	VPHADDD      D, C, C \
	VPHADDD      C, A, A \
	VEXTRACTI128 $1, A, XT \
	VPADDD       XT, XA, XA

// GATHER4D(X) loads the float32 d of the 4 block_q8_K at DI, R11, R12,
// R13 into the lanes of X.
#define GATHER4D(X) \
	VMOVSS    0(DI), X \
	VINSERTPS $0x10, 0(R11), X, X \
	VINSERTPS $0x20, 0(R12), X, X \
	VINSERTPS $0x30, 0(R13), X, X

// STOREL4(X) stores the 4 float lanes of X at (BX), (BX+DX), (BX+2DX),
// (BX+3DX) (DX: the byte stride between y rows).
#define STOREL4(X) \
	VMOVSS     X, (BX) \
	ADDQ       DX, BX \
	VEXTRACTPS $1, X, (BX) \
	ADDQ       DX, BX \
	VEXTRACTPS $2, X, (BX) \
	ADDQ       DX, BX \
	VEXTRACTPS $3, X, (BX)

// F16SS(off, R, X): X[0] = float32 of the fp16 at off(R) (VCVTPH2PS is exact,
// like fp16Table). Clobbers AX.
#define F16SS(off, R, X) \
	MOVWLZX   off(R), AX \
	VMOVD     AX, X \
	VCVTPH2PS X, X

// func q8_0DotAVX2(w, a *byte, nb int) float32
// genericQ8_0Dot for nb >= 1 blocks of 34 bytes. Per block: exact int32 sum
// of 32 sign-extended 16-bit products (VPMADDWD, -128 included), then
// sumf += (d_w*d_a) * float32(isum) in scalar SSE, as the Go code.
TEXT ·q8_0DotAVX2(SB), NOSPLIT, $0-28
	MOVQ   w+0(FP), SI
	MOVQ   a+8(FP), DI
	MOVQ   nb+16(FP), CX
	VXORPS X9, X9, X9

q8loop:
	VPMOVSXBW 2(SI), Y0
	VPMOVSXBW 18(SI), Y1
	VPMOVSXBW 2(DI), Y2
	VPMOVSXBW 18(DI), Y3
	VPMADDWD  Y2, Y0, Y0
	VPMADDWD  Y3, Y1, Y1
	VPADDD    Y1, Y0, Y0
	HSUM(Y0, X0, X1)
	VCVTDQ2PS X0, X0
	F16SS(0, SI, X2)
	F16SS(0, DI, X3)
	VMULSS    X3, X2, X2
	VMULSS    X0, X2, X2
	VADDSS    X2, X9, X9
	ADDQ      $34, SI
	ADDQ      $34, DI
	DECQ      CX
	JNZ       q8loop
	VMOVSS    X9, ret+24(FP)
	VZEROUPPER
	RET

// KSCALES decodes the 12-byte scales of a Q4_K/Q5_K block at SI (as
// get_scale_min_k4, with the kmask trick of ggml_vec_dot_q4_K_q8_K): the 8
// 6-bit scales as words at 0(SP), and Y7 = 8 int32 lanes
// min_j*(bsums[2j]+bsums[2j+1]) of the block_q8_K at DI.
#define KSCALES \
	MOVL        4(SI), AX \
	MOVL        8(SI), BX \
	MOVL        12(SI), R8 \
	MOVL        AX, R9 \
	ANDL        $0x3f3f3f3f, R9 \
	MOVL        R8, R10 \
	ANDL        $0x0f0f0f0f, R10 \
	MOVL        AX, R11 \
	SHRL        $6, R11 \
	ANDL        $0x03030303, R11 \
	SHLL        $4, R11 \
	ORL         R11, R10 \
	SHLQ        $32, R10 \
	ORQ         R10, R9 \
	MOVL        BX, R12 \
	ANDL        $0x3f3f3f3f, R12 \
	MOVL        R8, R13 \
	SHRL        $4, R13 \
	ANDL        $0x0f0f0f0f, R13 \
	MOVL        BX, R11 \
	SHRL        $6, R11 \
	ANDL        $0x03030303, R11 \
	SHLL        $4, R11 \
	ORL         R11, R13 \
	SHLQ        $32, R13 \
	ORQ         R13, R12 \
	VMOVQ        R9, X5 \
	VPMOVZXBW   X5, X5 \
	VMOVDQU     X5, 0(SP) \
	VMOVQ        R12, X6 \
	VPMOVZXBW   X6, X6 \
	VPUNPCKLWD  X6, X6, X7 \
	VPUNPCKHWD  X6, X6, X8 \
	VINSERTI128 $1, X8, Y7, Y7 \
	VPMADDWD    260(DI), Y7, Y7

// KFLOAT finishes a Q4_K/Q5_K block: Y0 = scaled integer sums, Y7 = mins
// term; sumf (X9) += (d_w*d_a)*isum, then -= (dmin_w*d_a)*imin (kDotSums).
#define KFLOAT \
	HSUM(Y0, X0, X1) \
	HSUM(Y7, X7, X1) \
	VCVTDQ2PS X0, X0 \
	VCVTDQ2PS X7, X7 \
	F16SS(0, SI, X2) \
	F16SS(2, SI, X3) \
	VMOVSS    0(DI), X4 \
	VMULSS    X4, X2, X2 \
	VMULSS    X4, X3, X3 \
	VMULSS    X0, X2, X2 \
	VMULSS    X7, X3, X3 \
	VADDSS    X2, X9, X9 \
	VSUBSS    X3, X9, X9

// KPAIR multiplies the low (Y1) and high (Y2) code vectors of sub-blocks
// 2k, 2k+1 with the q8 codes at aoff(DI), aoff+32(DI), scales them by the
// words at soff(SP), soff+2(SP) and adds into Y0. VPMADDUBSW (unsigned code
// <= 31 times int8, pairs) cannot saturate: 2*31*128 < 32767.
#define KPAIR(aoff, soff) \
	VPMADDUBSW   aoff(DI), Y1, Y1 \
	VPMADDUBSW   (aoff+32)(DI), Y2, Y2 \
	VPBROADCASTW soff(SP), Y3 \
	VPBROADCASTW (soff+2)(SP), Y4 \
	VPMADDWD     Y3, Y1, Y1 \
	VPMADDWD     Y4, Y2, Y2 \
	VPADDD       Y1, Y0, Y0 \
	VPADDD       Y2, Y0, Y0

// Q4K_PAIR: sub-blocks 2k, 2k+1 of a Q4_K block (qs at 16+32k).
#define Q4K_PAIR(qoff, aoff, soff) \
	VMOVDQU qoff(SI), Y1 \
	VPSRLW  $4, Y1, Y2 \
	VPAND   Y14, Y1, Y1 \
	VPAND   Y14, Y2, Y2 \
	KPAIR(aoff, soff)

// func q4KDotAVX2(w, a *byte, nb int) float32
// genericQ4KDot for nb >= 1 block_q4_K (144 B) x block_q8_K (292 B).
TEXT ·q4KDotAVX2(SB), NOSPLIT, $16-28
	MOVQ         w+0(FP), SI
	MOVQ         a+8(FP), DI
	MOVQ         nb+16(FP), CX
	VXORPS       X9, X9, X9
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14

q4kloop:
	KSCALES
	VPXOR Y0, Y0, Y0
	Q4K_PAIR(16, 4, 0)
	Q4K_PAIR(48, 68, 4)
	Q4K_PAIR(80, 132, 8)
	Q4K_PAIR(112, 196, 12)
	KFLOAT
	ADDQ  $144, SI
	ADDQ  $292, DI
	DECQ  CX
	JNZ   q4kloop
	VMOVSS X9, ret+24(FP)
	VZEROUPPER
	RET

// Q5K_PAIR: sub-blocks 2k, 2k+1 of a Q5_K block (qs at 48+32k; the 5th
// bits are bits 2k and 2k+1 of the qh bytes held in Y8; Y13 = 0x01 bytes).
#define Q5K_PAIR(qoff, aoff, soff, s0, s1) \
	VMOVDQU qoff(SI), Y1 \
	VPSRLW  $4, Y1, Y2 \
	VPAND   Y14, Y1, Y1 \
	VPAND   Y14, Y2, Y2 \
	VPSRLW  $s0, Y8, Y3 \
	VPAND   Y13, Y3, Y3 \
	VPSLLW  $4, Y3, Y3 \
	VPOR    Y3, Y1, Y1 \
	VPSRLW  $s1, Y8, Y3 \
	VPAND   Y13, Y3, Y3 \
	VPSLLW  $4, Y3, Y3 \
	VPOR    Y3, Y2, Y2 \
	KPAIR(aoff, soff)

// func q5KDotAVX2(w, a *byte, nb int) float32
// genericQ5KDot for nb >= 1 block_q5_K (176 B) x block_q8_K (292 B).
TEXT ·q5KDotAVX2(SB), NOSPLIT, $16-28
	MOVQ         w+0(FP), SI
	MOVQ         a+8(FP), DI
	MOVQ         nb+16(FP), CX
	VXORPS       X9, X9, X9
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x01010101, AX
	VMOVD        AX, X13
	VPBROADCASTD X13, Y13

q5kloop:
	KSCALES
	VMOVDQU 16(SI), Y8
	VPXOR   Y0, Y0, Y0
	Q5K_PAIR(48, 4, 0, 0, 1)
	Q5K_PAIR(80, 68, 4, 2, 3)
	Q5K_PAIR(112, 132, 8, 4, 5)
	Q5K_PAIR(144, 196, 12, 6, 7)
	KFLOAT
	ADDQ    $176, SI
	ADDQ    $292, DI
	DECQ    CX
	JNZ     q5kloop
	VMOVSS  X9, ret+24(FP)
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

// func q6KDotAVX2(w, a *byte, nb int) float32
// genericQ6KDot for nb >= 1 block_q6_K (210 B) x block_q8_K (292 B):
// isum = sum_g sc_g * sum (q6-32)*q8 exactly, then
// sumf += (d_w*d_a) * float32(isum).
TEXT ·q6KDotAVX2(SB), NOSPLIT, $32-28
	MOVQ         w+0(FP), SI
	MOVQ         a+8(FP), DI
	MOVQ         nb+16(FP), CX
	VXORPS       X15, X15, X15
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
	VPMOVSXBW 192(SI), Y0
	VMOVDQU   Y0, 0(SP)
	VPXOR     Y0, Y0, Y0
	Q6K_HALF(0, 128, 4, 0)
	Q6K_HALF(64, 160, 132, 16)
	HSUM(Y0, X0, X1)
	VCVTDQ2PS X0, X0
	F16SS(208, SI, X2)
	VMOVSS    0(DI), X3
	VMULSS    X3, X2, X2
	VMULSS    X0, X2, X2
	VADDSS    X2, X15, X15
	ADDQ      $210, SI
	ADDQ      $292, DI
	DECQ      CX
	JNZ       q6kloop
	VMOVSS    X15, ret+24(FP)
	VZEROUPPER
	RET

// Constants for the Q5_0/Q5_1 high-bit expansion (ggml's bytes_from_bits_32):
// byte e of a ymm takes byte e/8 of the broadcast qh, then bit e%8 is tested.
DATA qhshuf<>+0(SB)/8, $0x0000000000000000
DATA qhshuf<>+8(SB)/8, $0x0101010101010101
DATA qhshuf<>+16(SB)/8, $0x0202020202020202
DATA qhshuf<>+24(SB)/8, $0x0303030303030303
GLOBL qhshuf<>(SB), RODATA|NOPTR, $32

DATA qhbits<>+0(SB)/8, $0x8040201008040201
DATA qhbits<>+8(SB)/8, $0x8040201008040201
DATA qhbits<>+16(SB)/8, $0x8040201008040201
DATA qhbits<>+24(SB)/8, $0x8040201008040201
GLOBL qhbits<>(SB), RODATA|NOPTR, $32

// QX_SETUP loads the constants: Y14 = 0x0f bytes, Y13 = 0x10 bytes, Y12 =
// bit masks, Y11 = shuffle, X9 = 0 (sumf).
#define QX_SETUP \
	VXORPS       X9, X9, X9 \
	MOVL         $0x0f0f0f0f, AX \
	VMOVD        AX, X14 \
	VPBROADCASTD X14, Y14 \
	MOVL         $0x10101010, AX \
	VMOVD        AX, X13 \
	VPBROADCASTD X13, Y13 \
	VMOVDQU      qhbits<>(SB), Y12 \
	VMOVDQU      qhshuf<>(SB), Y11

// QX_NIBBLES: Y1 = the 32 4-bit codes of the 16 bytes at qoff(SI), in
// element order (low nibbles = elements 0..15, high = 16..31).
#define QX_NIBBLES(qoff) \
	VMOVDQU     qoff(SI), X1 \
	VPSRLW      $4, X1, X2 \
	VPAND       X14, X1, X1 \
	VPAND       X14, X2, X2 \
	VINSERTI128 $1, X2, Y1, Y1

// QX_HIGHBITS ORs 16 into byte e of Y1 where bit e of the uint32 at
// hoff(SI) is set (the 5th bit of Q5_0/Q5_1).
#define QX_HIGHBITS(hoff) \
	MOVL         hoff(SI), BX \
	VMOVD        BX, X6 \
	VPBROADCASTD X6, Y6 \
	VPSHUFB      Y11, Y6, Y6 \
	VPAND        Y12, Y6, Y6 \
	VPCMPEQB     Y12, Y6, Y6 \
	VPAND        Y13, Y6, Y6 \
	VPOR         Y6, Y1, Y1

// QX_DOT: X0[0] = float32(sum of the 32 products of the signed bytes in
// Y1 with the int8 codes at aoff(DI)), exact (16-bit products, VPMADDWD).
#define QX_DOT(aoff) \
	VPMOVSXBW    X1, Y2 \
	VEXTRACTI128 $1, Y1, X3 \
	VPMOVSXBW    X3, Y3 \
	VPMOVSXBW    aoff(DI), Y4 \
	VPMOVSXBW    (aoff+16)(DI), Y5 \
	VPMADDWD     Y4, Y2, Y2 \
	VPMADDWD     Y5, Y3, Y3 \
	VPADDD       Y3, Y2, Y0 \
	HSUM(Y0, X0, X1) \
	VCVTDQ2PS    X0, X0

// func qx0DotAVX2(w, a *byte, nb int, kind int) float32
// genericQ4_0Dot (kind 0, 18-byte blocks, codes q-8) or genericQ5_0Dot
// (kind 1, 22-byte blocks, codes q-16) against nb >= 1 block_q8_0:
// sumf += (d_w*d_a) * float32(isum) per block.
TEXT ·qx0DotAVX2(SB), NOSPLIT, $0-36
	MOVQ w+0(FP), SI
	MOVQ a+8(FP), DI
	MOVQ nb+16(FP), CX
	MOVQ kind+24(FP), DX
	QX_SETUP
	TESTQ DX, DX
	JNZ   q50loop
	MOVL         $0x08080808, AX
	VMOVD        AX, X10
	VPBROADCASTD X10, Y10

q40loop:
	QX_NIBBLES(2)
	VPSUBB    Y10, Y1, Y1
	QX_DOT(2)
	F16SS(0, SI, X2)
	F16SS(0, DI, X3)
	VMULSS    X3, X2, X2
	VMULSS    X0, X2, X2
	VADDSS    X2, X9, X9
	ADDQ      $18, SI
	ADDQ      $34, DI
	DECQ      CX
	JNZ       q40loop
	JMP       qx0done

q50loop:
	QX_NIBBLES(6)
	QX_HIGHBITS(2)
	VPSUBB    Y13, Y1, Y1
	QX_DOT(2)
	F16SS(0, SI, X2)
	F16SS(0, DI, X3)
	VMULSS    X3, X2, X2
	VMULSS    X0, X2, X2
	VADDSS    X2, X9, X9
	ADDQ      $22, SI
	ADDQ      $34, DI
	DECQ      CX
	JNZ       q50loop

qx0done:
	VMOVSS X9, ret+32(FP)
	VZEROUPPER
	RET

// QX1_FLOAT: sumf += (d_w*d_a)*float32(isum) + m_w*s_a (genericQ4_1Dot).
#define QX1_FLOAT \
	F16SS(0, SI, X2) \
	F16SS(0, DI, X3) \
	VMULSS X3, X2, X2 \
	VMULSS X0, X2, X2 \
	F16SS(2, SI, X4) \
	F16SS(2, DI, X5) \
	VMULSS X5, X4, X4 \
	VADDSS X4, X2, X2 \
	VADDSS X2, X9, X9

// func qx1DotAVX2(w, a *byte, nb int, kind int) float32
// genericQ4_1Dot (kind 0, 20-byte blocks) or genericQ5_1Dot (kind 1,
// 24-byte blocks) against nb >= 1 block_q8_1 (36 bytes).
TEXT ·qx1DotAVX2(SB), NOSPLIT, $0-36
	MOVQ w+0(FP), SI
	MOVQ a+8(FP), DI
	MOVQ nb+16(FP), CX
	MOVQ kind+24(FP), DX
	QX_SETUP
	TESTQ DX, DX
	JNZ   q51loop

q41loop:
	QX_NIBBLES(4)
	QX_DOT(4)
	QX1_FLOAT
	ADDQ $20, SI
	ADDQ $36, DI
	DECQ CX
	JNZ  q41loop
	JMP  qx1done

q51loop:
	QX_NIBBLES(8)
	QX_HIGHBITS(4)
	QX_DOT(4)
	QX1_FLOAT
	ADDQ $24, SI
	ADDQ $36, DI
	DECQ CX
	JNZ  q51loop

qx1done:
	VMOVSS X9, ret+32(FP)
	VZEROUPPER
	RET

// KSCALES4 is KSCALES for the 4-row kernel: scales as words at 0(SP) and
// Y7 = the duplicated mins words [m0,m0,m1,m1,...,m7,m7] (the bsums
// product is per row). Uses AX, BX, DX, R8, R9, R10, X5, X6, X8.
#define KSCALES4 \
	MOVL        4(SI), AX \
	MOVL        8(SI), BX \
	MOVL        12(SI), R8 \
	MOVL        AX, R9 \
	ANDL        $0x3f3f3f3f, R9 \
	MOVL        R8, R10 \
	ANDL        $0x0f0f0f0f, R10 \
	MOVL        AX, DX \
	SHRL        $6, DX \
	ANDL        $0x03030303, DX \
	SHLL        $4, DX \
	ORL         DX, R10 \
	SHLQ        $32, R10 \
	ORQ         R10, R9 \
	VMOVQ        R9, X5 \
	VPMOVZXBW   X5, X5 \
	VMOVDQU     X5, 0(SP) \
	MOVL        BX, R9 \
	ANDL        $0x3f3f3f3f, R9 \
	MOVL        R8, R10 \
	SHRL        $4, R10 \
	ANDL        $0x0f0f0f0f, R10 \
	MOVL        BX, DX \
	SHRL        $6, DX \
	ANDL        $0x03030303, DX \
	SHLL        $4, DX \
	ORL         DX, R10 \
	SHLQ        $32, R10 \
	ORQ         R10, R9 \
	VMOVQ        R9, X6 \
	VPMOVZXBW   X6, X6 \
	VPUNPCKLWD  X6, X6, X7 \
	VPUNPCKHWD  X6, X6, X8 \
	VINSERTI128 $1, X8, Y7, Y7

// KROW4 accumulates one activation row (pointer P, int accumulator Y) for
// the nibble vectors Y4/Y5 and scale broadcasts Y6/Y8.
#define KROW4(P, Y, aoff) \
	VPMADDUBSW aoff(P), Y4, Y13 \
	VPMADDUBSW (aoff+32)(P), Y5, Y15 \
	VPMADDWD   Y6, Y13, Y13 \
	VPMADDWD   Y8, Y15, Y15 \
	VPADDD     Y13, Y, Y \
	VPADDD     Y15, Y, Y

// Q4K_PAIR4: sub-blocks 2k, 2k+1 for the 4 rows.
#define Q4K_PAIR4(qoff, aoff, soff) \
	VMOVDQU      qoff(SI), Y4 \
	VPSRLW       $4, Y4, Y5 \
	VPAND        Y14, Y4, Y4 \
	VPAND        Y14, Y5, Y5 \
	VPBROADCASTW soff(SP), Y6 \
	VPBROADCASTW (soff+2)(SP), Y8 \
	KROW4(DI, Y0, aoff) \
	KROW4(R11, Y1, aoff) \
	KROW4(R12, Y2, aoff) \
	KROW4(R13, Y3, aoff)

// KFLOAT4 finishes one row's block as KFLOAT does: P the row's block_q8_K,
// Y/X its integer accumulator, F its float accumulator; X6 = fp16 d_w,
// X8 = fp16 dmin_w (as float32). Same scalar operations in the same order.
#define KFLOAT4(P, Y, X, F) \
	VPMADDWD  260(P), Y7, Y4 \
	HSUM(Y, X, X13) \
	HSUM(Y4, X4, X13) \
	VCVTDQ2PS X, X \
	VCVTDQ2PS X4, X4 \
	VMOVSS    0(P), X15 \
	VMULSS    X15, X6, X5 \
	VMULSS    X15, X8, X13 \
	VMULSS    X, X5, X5 \
	VMULSS    X4, X13, X13 \
	VADDSS    X5, F, F \
	VSUBSS    X13, F, F

// func q4KDot4AVX2(w, a0, a1, a2, a3 *byte, nb int, out *[4]float32)
// out[r] = q4KDotAVX2(w, a_r, nb) for the 4 activation rows, bit for bit:
// the weight block is unpacked once and each row keeps its own integer and
// float accumulators with the single-row operation order.
TEXT ·q4KDot4AVX2(SB), NOSPLIT, $16-56
	MOVQ         w+0(FP), SI
	MOVQ         a0+8(FP), DI
	MOVQ         a1+16(FP), R11
	MOVQ         a2+24(FP), R12
	MOVQ         a3+32(FP), R13
	MOVQ         nb+40(FP), CX
	VXORPS       X9, X9, X9
	VXORPS       X10, X10, X10
	VXORPS       X11, X11, X11
	VXORPS       X12, X12, X12
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14

q4k4loop:
	KSCALES4
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	Q4K_PAIR4(16, 4, 0)
	Q4K_PAIR4(48, 68, 4)
	Q4K_PAIR4(80, 132, 8)
	Q4K_PAIR4(112, 196, 12)
	F16SS(0, SI, X6)
	F16SS(2, SI, X8)
	KFLOAT4(DI, Y0, X0, X9)
	KFLOAT4(R11, Y1, X1, X10)
	KFLOAT4(R12, Y2, X2, X11)
	KFLOAT4(R13, Y3, X3, X12)
	ADDQ $144, SI
	ADDQ $292, DI
	ADDQ $292, R11
	ADDQ $292, R12
	ADDQ $292, R13
	DECQ CX
	JNZ  q4k4loop
	MOVQ   out+48(FP), AX
	VMOVSS X9, 0(AX)
	VMOVSS X10, 4(AX)
	VMOVSS X11, 8(AX)
	VMOVSS X12, 12(AX)
	VZEROUPPER
	RET

// Q6K4_ROW: one activation row (pointer P, accumulator Y) times the codes
// in Q for the 32 q8 codes at aoff(P), scale vector in Y8.
#define Q6K4_ROW(P, Y, Q, aoff) \
	VMOVDQU    aoff(P), Y9 \
	VPMADDUBSW Y9, Q, Y10 \
	VPMADDUBSW Y9, Y13, Y11 \
	VPSUBW     Y11, Y10, Y10 \
	VPMADDWD   Y8, Y10, Y10 \
	VPADDD     Y10, Y, Y

// Q6K4_QUARTER: 32 codes (register Q) with scales soff(SP) (low 16) and
// soff+2(SP) (high 16), for the 4 rows.
#define Q6K4_QUARTER(Q, aoff, soff) \
	VPBROADCASTW soff(SP), Y8 \
	VPBROADCASTW (soff+2)(SP), Y9 \
	VINSERTI128  $1, X9, Y8, Y8 \
	Q6K4_ROW(DI, Y0, Q, aoff) \
	Q6K4_ROW(R11, Y1, Q, aoff) \
	Q6K4_ROW(R12, Y2, Q, aoff) \
	Q6K4_ROW(R13, Y3, Q, aoff)

// Q6K4_HALF decodes 128 codes into Y4..Y7 (as Q6K_HALF) and accumulates
// them for the 4 rows.
#define Q6K4_HALF(qloff, hoff, aoff, soff) \
	VMOVDQU hoff(SI), Y8 \
	VMOVDQU qloff(SI), Y9 \
	VMOVDQU (qloff+32)(SI), Y10 \
	VPAND   Y14, Y9, Y4 \
	VPSLLW  $4, Y8, Y11 \
	VPAND   Y12, Y11, Y11 \
	VPOR    Y11, Y4, Y4 \
	VPAND   Y14, Y10, Y5 \
	VPSLLW  $2, Y8, Y11 \
	VPAND   Y12, Y11, Y11 \
	VPOR    Y11, Y5, Y5 \
	VPSRLW  $4, Y9, Y6 \
	VPAND   Y14, Y6, Y6 \
	VPAND   Y12, Y8, Y11 \
	VPOR    Y11, Y6, Y6 \
	VPSRLW  $4, Y10, Y7 \
	VPAND   Y14, Y7, Y7 \
	VPSRLW  $2, Y8, Y11 \
	VPAND   Y12, Y11, Y11 \
	VPOR    Y11, Y7, Y7 \
	Q6K4_QUARTER(Y4, aoff, soff) \
	Q6K4_QUARTER(Y5, (aoff+32), (soff+4)) \
	Q6K4_QUARTER(Y6, (aoff+64), (soff+8)) \
	Q6K4_QUARTER(Y7, (aoff+96), (soff+12))

// Q6K4_FLOAT: sumf_r (float at foff(SP)) += (d_w*d_a)*float32(isum) for
// one row, as q6KDotAVX2 does; X15 = d_w.
#define Q6K4_FLOAT(P, Y, X, foff) \
	HSUM(Y, X, X9) \
	VCVTDQ2PS X, X \
	VMOVSS    0(P), X10 \
	VMULSS    X10, X15, X10 \
	VMULSS    X, X10, X10 \
	VMOVSS    foff(SP), X11 \
	VADDSS    X10, X11, X11 \
	VMOVSS    X11, foff(SP)

// func q6KDot4AVX2(w, a0, a1, a2, a3 *byte, nb int, out *[4]float32)
// out[r] = q6KDotAVX2(w, a_r, nb) for 4 activation rows, bit for bit.
TEXT ·q6KDot4AVX2(SB), NOSPLIT, $48-56
	MOVQ         w+0(FP), SI
	MOVQ         a0+8(FP), DI
	MOVQ         a1+16(FP), R11
	MOVQ         a2+24(FP), R12
	MOVQ         a3+32(FP), R13
	MOVQ         nb+40(FP), CX
	VXORPS       X0, X0, X0
	VMOVDQU      X0, 32(SP)
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x30303030, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12
	MOVL         $0x20202020, AX
	VMOVD        AX, X13
	VPBROADCASTD X13, Y13

q6k4loop:
	VPMOVSXBW 192(SI), Y8
	VMOVDQU   Y8, 0(SP)
	VPXOR     Y0, Y0, Y0
	VPXOR     Y1, Y1, Y1
	VPXOR     Y2, Y2, Y2
	VPXOR     Y3, Y3, Y3
	Q6K4_HALF(0, 128, 4, 0)
	Q6K4_HALF(64, 160, 132, 16)
	F16SS(208, SI, X15)
	Q6K4_FLOAT(DI, Y0, X0, 32)
	Q6K4_FLOAT(R11, Y1, X1, 36)
	Q6K4_FLOAT(R12, Y2, X2, 40)
	Q6K4_FLOAT(R13, Y3, X3, 44)
	ADDQ $210, SI
	ADDQ $292, DI
	ADDQ $292, R11
	ADDQ $292, R12
	ADDQ $292, R13
	DECQ CX
	JNZ  q6k4loop
	MOVQ    out+48(FP), AX
	VMOVDQU 32(SP), X0
	VMOVDQU X0, 0(AX)
	VZEROUPPER
	RET

// REDUCE32 sums the 32 float32 lanes Y0 (lanes 0-7), Y1 (8-15), Y2
// (16-23), Y3 (24-31) into X0[0] with reduceLanes' tree: acc[i] +=
// acc[i+w] for w = 16, 8, 4, 2, 1, each add acc[i] + acc[i+w] as in Go.
#define REDUCE32 \
	VADDPS       Y2, Y0, Y0 \
	VADDPS       Y3, Y1, Y1 \
	VADDPS       Y1, Y0, Y0 \
	VEXTRACTF128 $1, Y0, X1 \
	VADDPS       X1, X0, X0 \
	VPSHUFD      $0x4e, X0, X1 \
	VADDPS       X1, X0, X0 \
	VPSHUFD      $0xb1, X0, X1 \
	VADDSS       X1, X0, X0

// f32tailmask: 32 all-ones dwords then 32 zero dwords; the 32 dwords from
// index 32-t are the load mask of the first t lanes.
DATA f32tailmask<>+0(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+8(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+16(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+24(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+32(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+40(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+48(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+56(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+64(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+72(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+80(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+88(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+96(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+104(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+112(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+120(SB)/8, $0xffffffffffffffff
DATA f32tailmask<>+128(SB)/8, $0
DATA f32tailmask<>+136(SB)/8, $0
DATA f32tailmask<>+144(SB)/8, $0
DATA f32tailmask<>+152(SB)/8, $0
DATA f32tailmask<>+160(SB)/8, $0
DATA f32tailmask<>+168(SB)/8, $0
DATA f32tailmask<>+176(SB)/8, $0
DATA f32tailmask<>+184(SB)/8, $0
DATA f32tailmask<>+192(SB)/8, $0
DATA f32tailmask<>+200(SB)/8, $0
DATA f32tailmask<>+208(SB)/8, $0
DATA f32tailmask<>+216(SB)/8, $0
DATA f32tailmask<>+224(SB)/8, $0
DATA f32tailmask<>+232(SB)/8, $0
DATA f32tailmask<>+240(SB)/8, $0
DATA f32tailmask<>+248(SB)/8, $0
GLOBL f32tailmask<>(SB), RODATA|NOPTR, $256

// func dotF32AVX2(a, b *float32, n int) float32
// DotF32 for n >= 0 elements: the 32-lane loop of dotF32LanesAVX2 from
// zero accumulators; the n%32 tail elements i go to lane i%32 through
// masked loads (lanes past the tail add 0*0 = +0, which leaves every
// accumulator value reachable from +0 unchanged, -0 never being one);
// then REDUCE32.
TEXT ·dotF32AVX2(SB), NOSPLIT, $0-28
	MOVQ   a+0(FP), SI
	MOVQ   b+8(FP), DI
	MOVQ   n+16(FP), CX
	MOVQ   CX, DX
	ANDQ   $31, DX
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	SHRQ   $5, CX
	JZ     df32tail

df32loop:
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
	JNZ     df32loop

df32tail:
	TESTQ      DX, DX
	JZ         df32reduce
	MOVQ       $32, R8
	SUBQ       DX, R8
	LEAQ       f32tailmask<>(SB), AX
	LEAQ       (AX)(R8*4), AX
	VMOVUPS    0(AX), Y8
	VMOVUPS    32(AX), Y9
	VMOVUPS    64(AX), Y10
	VMOVUPS    96(AX), Y11
	VMASKMOVPS 0(SI), Y8, Y4
	VMASKMOVPS 32(SI), Y9, Y5
	VMASKMOVPS 64(SI), Y10, Y6
	VMASKMOVPS 96(SI), Y11, Y7
	VMASKMOVPS 0(DI), Y8, Y12
	VMASKMOVPS 32(DI), Y9, Y13
	VMASKMOVPS 64(DI), Y10, Y14
	VMASKMOVPS 96(DI), Y11, Y15
	VMULPS     Y12, Y4, Y4
	VMULPS     Y13, Y5, Y5
	VMULPS     Y14, Y6, Y6
	VMULPS     Y15, Y7, Y7
	VADDPS     Y4, Y0, Y0
	VADDPS     Y5, Y1, Y1
	VADDPS     Y6, Y2, Y2
	VADDPS     Y7, Y3, Y3

df32reduce:
	REDUCE32
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func dotF32RowsAVX2(x, m *float32, n, rows, stride int, out *float32)
// out[j] = dotF32AVX2(x, m + j*stride, n) for j < rows (rows >= 1, n >=
// 0, stride in floats): the tail masks are loaded once for all rows.
TEXT ·dotF32RowsAVX2(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), R11
	MOVQ m+8(FP), BX
	MOVQ n+16(FP), R12
	MOVQ R12, DX
	ANDQ $31, DX
	SHRQ $5, R12
	MOVQ rows+24(FP), R8
	MOVQ stride+32(FP), R9
	SHLQ $2, R9
	MOVQ out+40(FP), R10
	MOVQ $32, AX
	SUBQ DX, AX
	LEAQ f32tailmask<>(SB), CX
	LEAQ (CX)(AX*4), AX
	VMOVUPS 0(AX), Y8
	VMOVUPS 32(AX), Y9
	VMOVUPS 64(AX), Y10
	VMOVUPS 96(AX), Y11

dfrrow:
	MOVQ   R11, SI
	MOVQ   BX, DI
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	MOVQ   R12, CX
	TESTQ  CX, CX
	JZ     dfrtail

dfrloop:
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
	JNZ     dfrloop

dfrtail:
	TESTQ      DX, DX
	JZ         dfrreduce
	VMASKMOVPS 0(SI), Y8, Y4
	VMASKMOVPS 32(SI), Y9, Y5
	VMASKMOVPS 64(SI), Y10, Y6
	VMASKMOVPS 96(SI), Y11, Y7
	VMASKMOVPS 0(DI), Y8, Y12
	VMASKMOVPS 32(DI), Y9, Y13
	VMASKMOVPS 64(DI), Y10, Y14
	VMASKMOVPS 96(DI), Y11, Y15
	VMULPS     Y12, Y4, Y4
	VMULPS     Y13, Y5, Y5
	VMULPS     Y14, Y6, Y6
	VMULPS     Y15, Y7, Y7
	VADDPS     Y4, Y0, Y0
	VADDPS     Y5, Y1, Y1
	VADDPS     Y6, Y2, Y2
	VADDPS     Y7, Y3, Y3

dfrreduce:
	REDUCE32
	VMOVSS X0, 0(R10)
	ADDQ   $4, R10
	ADDQ   R9, BX
	DECQ   R8
	JNZ    dfrrow
	VZEROUPPER
	RET

// F16F32ROW computes one fp16 row dot (vecDotF16) of n = 32*CX elements:
// fp16 weights at SI, the activations already float32 at DI (the exact
// values VCVTPH2PS gives); w*a products in dotF16LanesAVX2's lanes and
// order, then REDUCE32 into X0[0]. SI, DI advance; CX >= 1 reaches 0.
#define F16F32ROW(lbl) \
	VXORPS Y0, Y0, Y0 \
	VXORPS Y1, Y1, Y1 \
	VXORPS Y2, Y2, Y2 \
	VXORPS Y3, Y3, Y3 \
lbl: \
	VCVTPH2PS 0(SI), Y4 \
	VCVTPH2PS 16(SI), Y5 \
	VCVTPH2PS 32(SI), Y6 \
	VCVTPH2PS 48(SI), Y7 \
	VMULPS    0(DI), Y4, Y4 \
	VMULPS    32(DI), Y5, Y5 \
	VMULPS    64(DI), Y6, Y6 \
	VMULPS    96(DI), Y7, Y7 \
	VADDPS    Y4, Y0, Y0 \
	VADDPS    Y5, Y1, Y1 \
	VADDPS    Y6, Y2, Y2 \
	VADDPS    Y7, Y3, Y3 \
	ADDQ      $64, SI \
	ADDQ      $128, DI \
	DECQ      CX \
	JNZ       lbl \
	REDUCE32

// func f16RowsAVX2(w, a *byte, n, rows, rb int, out *float32, buf *float32)
// out[r] = vecDotF16(w[r*rb:], a, n) for r < rows (rows >= 1; n a
// multiple of 32, n >= 32). The fp16 activations are first converted once
// into buf (n float32s), then each row converts only its weights.
TEXT ·f16RowsAVX2(SB), NOSPLIT, $0-56
	MOVQ a+8(FP), SI
	MOVQ buf+48(FP), DI
	MOVQ n+16(FP), CX
	SHRQ $3, CX

f16cvt:
	VCVTPH2PS 0(SI), Y0
	VMOVUPS   Y0, 0(DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       f16cvt
	MOVQ w+0(FP), BX
	MOVQ buf+48(FP), R11
	MOVQ n+16(FP), DX
	SHRQ $5, DX
	MOVQ rows+24(FP), R8
	MOVQ rb+32(FP), R9
	MOVQ out+40(FP), R10

f16rows:
	MOVQ   BX, SI
	MOVQ   R11, DI
	MOVQ   DX, CX
	F16F32ROW(f16rowloop)
	VMOVSS X0, 0(R10)
	ADDQ   $4, R10
	ADDQ   R9, BX
	DECQ   R8
	JNZ    f16rows
	VZEROUPPER
	RET

// Q8BLK(off, Y): Y = the 8 int32 lane partials of block off/34 (exact
// 16-bit products, as q8_0DotAVX2). Uses Y4..Y7.
#define Q8BLK(off, Y) \
	VPMOVSXBW (off+2)(SI), Y4 \
	VPMOVSXBW (off+18)(SI), Y5 \
	VPMOVSXBW (off+2)(DI), Y6 \
	VPMOVSXBW (off+18)(DI), Y7 \
	VPMADDWD  Y6, Y4, Y4 \
	VPMADDWD  Y7, Y5, Y5 \
	VPADDD    Y5, Y4, Y

// GATHERH4(R, X): the fp16 d of the 4 blocks at R, R+34, R+68, R+102 as
// float32 lanes of X (exact).
#define GATHERH4(R, X) \
	MOVWLZX   0(R), AX \
	VMOVD     AX, X \
	VPINSRW   $1, 34(R), X, X \
	VPINSRW   $2, 68(R), X, X \
	VPINSRW   $3, 102(R), X, X \
	VCVTPH2PS X, X

// func q8_0RowsAVX2(w, a *byte, nb, rows, rb int, out *float32)
// out[r] = q8_0DotAVX2(w + r*rb, a, nb) for r < rows (rows, nb >= 1).
// Blocks go 4 at a time: their integer sums are reduced together (HSUM4)
// and the products (d_w*d_a)*float32(isum) computed packed (lane k =
// block k's scalar operations), then added to sumf one lane at a time in
// block order, as the single-block loop (used for the nb%4 left) does.
TEXT ·q8_0RowsAVX2(SB), NOSPLIT, $0-48
	MOVQ w+0(FP), BX
	MOVQ a+8(FP), R11
	MOVQ nb+16(FP), DX
	MOVQ rows+24(FP), R8
	MOVQ rb+32(FP), R9
	MOVQ out+40(FP), R10

q8rows:
	MOVQ   BX, SI
	MOVQ   R11, DI
	VXORPS X9, X9, X9
	MOVQ   DX, CX
	SHRQ   $2, CX
	JZ     q8rowone

q8rowquad:
	Q8BLK(0, Y0)
	Q8BLK(34, Y1)
	Q8BLK(68, Y2)
	Q8BLK(102, Y3)
	HSUM4(Y0, Y1, Y2, Y3, X0, X4)
	VCVTDQ2PS X0, X0
	GATHERH4(SI, X5)
	GATHERH4(DI, X6)
	VMULPS    X6, X5, X5
	VMULPS    X0, X5, X5
	VADDSS    X5, X9, X9
	VMOVSHDUP X5, X7
	VADDSS    X7, X9, X9
	VMOVHLPS  X5, X5, X7
	VADDSS    X7, X9, X9
	VPSHUFD   $0xff, X5, X7
	VADDSS    X7, X9, X9
	ADDQ      $136, SI
	ADDQ      $136, DI
	DECQ      CX
	JNZ       q8rowquad

q8rowone:
	MOVQ DX, CX
	ANDQ $3, CX
	JZ   q8rowend

q8rowloop:
	VPMOVSXBW 2(SI), Y0
	VPMOVSXBW 18(SI), Y1
	VPMOVSXBW 2(DI), Y2
	VPMOVSXBW 18(DI), Y3
	VPMADDWD  Y2, Y0, Y0
	VPMADDWD  Y3, Y1, Y1
	VPADDD    Y1, Y0, Y0
	HSUM(Y0, X0, X1)
	VCVTDQ2PS X0, X0
	F16SS(0, SI, X2)
	F16SS(0, DI, X3)
	VMULSS    X3, X2, X2
	VMULSS    X0, X2, X2
	VADDSS    X2, X9, X9
	ADDQ      $34, SI
	ADDQ      $34, DI
	DECQ      CX
	JNZ       q8rowloop

q8rowend:
	VMOVSS    X9, 0(R10)
	ADDQ      $4, R10
	ADDQ      R9, BX
	DECQ      R8
	JNZ       q8rows
	VZEROUPPER
	RET

// func q4KRowsAVX2(w, a *byte, nb, rows, rb int, out *float32)
// out[r] = q4KDotAVX2(w + r*rb, a, nb) for r < rows (rows, nb >= 1). The
// row loop state lives at 16(SP) (next row), 24(SP) (rows left), 32(SP)
// (out) since KSCALES uses the general registers.
TEXT ·q4KRowsAVX2(SB), NOSPLIT, $40-48
	MOVQ         w+0(FP), AX
	MOVQ         AX, 16(SP)
	MOVQ         rows+24(FP), AX
	MOVQ         AX, 24(SP)
	MOVQ         out+40(FP), AX
	MOVQ         AX, 32(SP)
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14

q4krows:
	MOVQ   16(SP), SI
	MOVQ   a+8(FP), DI
	MOVQ   nb+16(FP), CX
	VXORPS X9, X9, X9

q4krowloop:
	KSCALES
	VPXOR Y0, Y0, Y0
	Q4K_PAIR(16, 4, 0)
	Q4K_PAIR(48, 68, 4)
	Q4K_PAIR(80, 132, 8)
	Q4K_PAIR(112, 196, 12)
	KFLOAT
	ADDQ  $144, SI
	ADDQ  $292, DI
	DECQ  CX
	JNZ   q4krowloop
	MOVQ   32(SP), DX
	VMOVSS X9, 0(DX)
	ADDQ   $4, DX
	MOVQ   DX, 32(SP)
	MOVQ   rb+32(FP), DX
	ADDQ   DX, 16(SP)
	DECQ   24(SP)
	JNZ    q4krows
	VZEROUPPER
	RET

// Q6K_QUARTERB is Q6K_QUARTER without the -32 offset: the multi-row
// kernels start each block's integer accumulator at -32*sum_g sc_g*bsums_g
// (the bsums of the block_q8_K, as ggml's AVX2 ggml_vec_dot_q6_K_q8_K
// does), which is the same exact integer. The scale words come from Y13
// (Q6K_SCALES: even scales in the low lane, odd in the high) by one
// in-lane shuffle: quarter q = soff/4 takes word q of each lane.
#define Q6K_QUARTERB(Q, aoff, soff) \
	VPMADDUBSW aoff(DI), Q, Q \
	VPSHUFB    q6kscq<>+(8*soff)(SB), Y13, Y10 \
	VPMADDWD   Y10, Q, Q \
	VPADDD     Q, Y0, Y0

// Q6K_SCALES: Y13 = the 16 int8 scales of the block_q6_K at SI as words,
// sc0, sc2, .., sc14 in the low lane and sc1, .., sc15 in the high one.
#define Q6K_SCALES \
	VMOVDQU   192(SI), X13 \
	VPSHUFB   q6kevenodd<>(SB), X13, X13 \
	VPMOVSXBW X13, Y13

// Q6K_HALFB is Q6K_HALF with Q6K_QUARTERB.
#define Q6K_HALFB(qloff, hoff, aoff, soff) \
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
	Q6K_QUARTERB(Y1, aoff, soff) \
	Q6K_QUARTERB(Y2, (aoff+32), (soff+4)) \
	Q6K_QUARTERB(Y3, (aoff+64), (soff+8)) \
	Q6K_QUARTERB(Y4, (aoff+96), (soff+12))

// func q6KRowsAVX2(w, a *byte, nb, rows, rb int, out *float32)
// out[r] = q6KDotAVX2(w + r*rb, a, nb) for r < rows (rows, nb >= 1).
TEXT ·q6KRowsAVX2(SB), NOSPLIT, $0-48
	MOVQ         w+0(FP), BX
	MOVQ         a+8(FP), R11
	MOVQ         nb+16(FP), DX
	MOVQ         rows+24(FP), R8
	MOVQ         rb+32(FP), R9
	MOVQ         out+40(FP), R10
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x30303030, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12

q6krows:
	MOVQ   BX, SI
	MOVQ   R11, DI
	MOVQ   DX, CX
	VXORPS X15, X15, X15

q6krowloop:
	VPMOVSXBW 192(SI), Y0
	Q6K_SCALES
	VPMADDWD  260(DI), Y0, Y0
	VPSLLD    $5, Y0, Y1
	VPXOR     Y0, Y0, Y0
	VPSUBD    Y1, Y0, Y0
	Q6K_HALFB(0, 128, 4, 0)
	Q6K_HALFB(64, 160, 132, 16)
	HSUM(Y0, X0, X1)
	VCVTDQ2PS X0, X0
	F16SS(208, SI, X2)
	VMOVSS    0(DI), X3
	VMULSS    X3, X2, X2
	VMULSS    X0, X2, X2
	VADDSS    X2, X15, X15
	ADDQ      $210, SI
	ADDQ      $292, DI
	DECQ      CX
	JNZ       q6krowloop
	VMOVSS    X15, 0(R10)
	ADDQ      $4, R10
	ADDQ      R9, BX
	DECQ      R8
	JNZ       q6krows
	VZEROUPPER
	RET

// func q4KRows4AVX2(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)
// For r < rows: y[j*ys+r] = q4KDot4AVX2(w + r*rb, a_j, nb) row j, j < 4
// (rows, nb >= 1). Row-loop state: 16(SP) next weight row, 24(SP) rows
// left, 32(SP) &y[r].
TEXT ·q4KRows4AVX2(SB), NOSPLIT, $40-80
	MOVQ         w+0(FP), AX
	MOVQ         AX, 16(SP)
	MOVQ         rows+48(FP), AX
	MOVQ         AX, 24(SP)
	MOVQ         y+64(FP), AX
	MOVQ         AX, 32(SP)
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14

q4k4rows:
	MOVQ   16(SP), SI
	MOVQ   a0+8(FP), DI
	MOVQ   a1+16(FP), R11
	MOVQ   a2+24(FP), R12
	MOVQ   a3+32(FP), R13
	MOVQ   nb+40(FP), CX
	VXORPS X9, X9, X9

q4k4rowloop:
	KSCALES4
	VPXOR Y0, Y0, Y0
	VPXOR Y1, Y1, Y1
	VPXOR Y2, Y2, Y2
	VPXOR Y3, Y3, Y3
	Q4K_PAIR4(16, 4, 0)
	Q4K_PAIR4(48, 68, 4)
	Q4K_PAIR4(80, 132, 8)
	Q4K_PAIR4(112, 196, 12)
	VPMADDWD     260(DI), Y7, Y4
	VPMADDWD     260(R11), Y7, Y5
	VPMADDWD     260(R12), Y7, Y6
	VPMADDWD     260(R13), Y7, Y8
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	HSUM4(Y4, Y5, Y6, Y8, X4, X5)
	VCVTDQ2PS    X0, X0
	VCVTDQ2PS    X4, X4
	F16SS(0, SI, X6)
	VBROADCASTSS X6, X6
	F16SS(2, SI, X8)
	VBROADCASTSS X8, X8
	GATHER4D(X15)
	VMULPS       X15, X6, X5
	VMULPS       X15, X8, X13
	VMULPS       X0, X5, X5
	VMULPS       X4, X13, X13
	VADDPS       X5, X9, X9
	VSUBPS       X13, X9, X9
	ADDQ $144, SI
	ADDQ $292, DI
	ADDQ $292, R11
	ADDQ $292, R12
	ADDQ $292, R13
	DECQ CX
	JNZ  q4k4rowloop
	MOVQ 32(SP), BX
	MOVQ ys+72(FP), DX
	SHLQ $2, DX
	STOREL4(X9)
	ADDQ $4, 32(SP)
	MOVQ rb+56(FP), DX
	ADDQ DX, 16(SP)
	DECQ 24(SP)
	JNZ  q4k4rows
	VZEROUPPER
	RET

// Q6K4_ROWB is Q6K4_ROW without the -32 offset (see Q6K_QUARTERB).
#define Q6K4_ROWB(P, Y, Q, aoff) \
	VPMADDUBSW aoff(P), Q, Y10 \
	VPMADDWD   Y8, Y10, Y10 \
	VPADDD     Y10, Y, Y

// Q6K4_QUARTERB: quarter q = soff/4 for the 4 rows, its scale words
// picked from Y13 (Q6K_SCALES) into Y8.
#define Q6K4_QUARTERB(Q, aoff, soff) \
	VPSHUFB q6kscq<>+(8*soff)(SB), Y13, Y8 \
	Q6K4_ROWB(DI, Y0, Q, aoff) \
	Q6K4_ROWB(R11, Y1, Q, aoff) \
	Q6K4_ROWB(R12, Y2, Q, aoff) \
	Q6K4_ROWB(R13, Y3, Q, aoff)

// Q6K4_HALFB is Q6K4_HALF with Q6K4_QUARTERB.
#define Q6K4_HALFB(qloff, hoff, aoff, soff) \
	VMOVDQU hoff(SI), Y8 \
	VMOVDQU qloff(SI), Y9 \
	VMOVDQU (qloff+32)(SI), Y10 \
	VPAND   Y14, Y9, Y4 \
	VPSLLW  $4, Y8, Y11 \
	VPAND   Y12, Y11, Y11 \
	VPOR    Y11, Y4, Y4 \
	VPAND   Y14, Y10, Y5 \
	VPSLLW  $2, Y8, Y11 \
	VPAND   Y12, Y11, Y11 \
	VPOR    Y11, Y5, Y5 \
	VPSRLW  $4, Y9, Y6 \
	VPAND   Y14, Y6, Y6 \
	VPAND   Y12, Y8, Y11 \
	VPOR    Y11, Y6, Y6 \
	VPSRLW  $4, Y10, Y7 \
	VPAND   Y14, Y7, Y7 \
	VPSRLW  $2, Y8, Y11 \
	VPAND   Y12, Y11, Y11 \
	VPOR    Y11, Y7, Y7 \
	Q6K4_QUARTERB(Y4, aoff, soff) \
	Q6K4_QUARTERB(Y5, (aoff+32), (soff+4)) \
	Q6K4_QUARTERB(Y6, (aoff+64), (soff+8)) \
	Q6K4_QUARTERB(Y7, (aoff+96), (soff+12))

// Q6K4_OFFSET(P, Y) sets Y = -32*sum_g sc_g*bsums_g for the block_q8_K at
// P (scales as words in Y8; Y9 = 0).
#define Q6K4_OFFSET(P, Y) \
	VPMADDWD 260(P), Y8, Y \
	VPSLLD   $5, Y, Y \
	VPSUBD   Y, Y9, Y

// func q6KRows4AVX2(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)
// For r < rows: y[j*ys+r] = q6KDot4AVX2(w + r*rb, a_j, nb) row j, j < 4
// (rows, nb >= 1). Row-loop state: 48(SP) next weight row, 56(SP) rows
// left, 64(SP) &y[r]; X15 the 4 rows' float accumulators.
TEXT ·q6KRows4AVX2(SB), NOSPLIT, $72-80
	MOVQ         w+0(FP), AX
	MOVQ         AX, 48(SP)
	MOVQ         rows+48(FP), AX
	MOVQ         AX, 56(SP)
	MOVQ         y+64(FP), AX
	MOVQ         AX, 64(SP)
	MOVL         $0x0f0f0f0f, AX
	VMOVD        AX, X14
	VPBROADCASTD X14, Y14
	MOVL         $0x30303030, AX
	VMOVD        AX, X12
	VPBROADCASTD X12, Y12

q6k4rows:
	MOVQ    48(SP), SI
	MOVQ    a0+8(FP), DI
	MOVQ    a1+16(FP), R11
	MOVQ    a2+24(FP), R12
	MOVQ    a3+32(FP), R13
	MOVQ    nb+40(FP), CX
	VXORPS  X15, X15, X15

q6k4rowloop:
	VPMOVSXBW 192(SI), Y8
	Q6K_SCALES
	VPXOR     Y9, Y9, Y9
	Q6K4_OFFSET(DI, Y0)
	Q6K4_OFFSET(R11, Y1)
	Q6K4_OFFSET(R12, Y2)
	Q6K4_OFFSET(R13, Y3)
	Q6K4_HALFB(0, 128, 4, 0)
	Q6K4_HALFB(64, 160, 132, 16)
	HSUM4(Y0, Y1, Y2, Y3, X0, X1)
	VCVTDQ2PS    X0, X0
	F16SS(208, SI, X8)
	VBROADCASTSS X8, X8
	GATHER4D(X10)
	VMULPS       X10, X8, X10
	VMULPS       X0, X10, X10
	VADDPS       X10, X15, X15
	ADDQ $210, SI
	ADDQ $292, DI
	ADDQ $292, R11
	ADDQ $292, R12
	ADDQ $292, R13
	DECQ CX
	JNZ  q6k4rowloop
	MOVQ   64(SP), BX
	MOVQ   ys+72(FP), DX
	SHLQ   $2, DX
	STOREL4(X15)
	ADDQ $4, 64(SP)
	MOVQ rb+56(FP), DX
	ADDQ DX, 48(SP)
	DECQ 56(SP)
	JNZ  q6k4rows
	VZEROUPPER
	RET

// Q8ROW4(P, Y): the exact int32 lane products of the block at P with the
// sign-extended weight codes in Y0/Y1, into Y (8 lanes; HSUM4 finishes).
#define Q8ROW4(P, Y) \
	VPMOVSXBW 2(P), Y \
	VPMOVSXBW 18(P), Y6 \
	VPMADDWD  Y, Y0, Y \
	VPMADDWD  Y6, Y1, Y6 \
	VPADDD    Y6, Y, Y

// func q8_0Rows4AVX2(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)
// For r < rows: y[j*ys+r] = q8_0DotAVX2(w + r*rb, a_j, nb), j < 4 (rows,
// nb >= 1): each weight block is sign-extended once for the 4 rows.
TEXT ·q8_0Rows4AVX2(SB), NOSPLIT, $0-80
	MOVQ w+0(FP), R8
	MOVQ rows+48(FP), R9
	MOVQ y+64(FP), R10

q84rows:
	MOVQ   R8, SI
	MOVQ   a0+8(FP), DI
	MOVQ   a1+16(FP), R11
	MOVQ   a2+24(FP), R12
	MOVQ   a3+32(FP), R13
	MOVQ   nb+40(FP), CX
	VXORPS X9, X9, X9

q84rowloop:
	VPMOVSXBW 2(SI), Y0
	VPMOVSXBW 18(SI), Y1
	Q8ROW4(DI, Y2)
	Q8ROW4(R11, Y3)
	Q8ROW4(R12, Y4)
	Q8ROW4(R13, Y5)
	HSUM4(Y2, Y3, Y4, Y5, X2, X6)
	VCVTDQ2PS    X2, X2
	F16SS(0, SI, X8)
	VBROADCASTSS X8, X8
	MOVWLZX      0(DI), AX
	VMOVD        AX, X7
	VPINSRW      $1, 0(R11), X7, X7
	VPINSRW      $2, 0(R12), X7, X7
	VPINSRW      $3, 0(R13), X7, X7
	VCVTPH2PS    X7, X7
	VMULPS       X7, X8, X7
	VMULPS       X2, X7, X7
	VADDPS       X7, X9, X9
	ADDQ $34, SI
	ADDQ $34, DI
	ADDQ $34, R11
	ADDQ $34, R12
	ADDQ $34, R13
	DECQ CX
	JNZ  q84rowloop
	MOVQ R10, BX
	MOVQ ys+72(FP), DX
	SHLQ $2, DX
	STOREL4(X9)
	ADDQ $4, R10
	ADDQ rb+56(FP), R8
	DECQ R9
	JNZ  q84rows
	VZEROUPPER
	RET

// func deltaRuleAVX2(st, q, k, v, o *float32, n, rows int, beta, decay, scale float32)
// genericDeltaRule for n, rows >= 1, as deltaRuleAVX512 on 32 lanes in
// Y0-Y3 (dotF32AVX2's order; the n%32 tail through the masks Y8-Y11 of
// f32tailmask, masked loads and stores, lanes past the tail adding a
// zero). Y12 holds decay in pass 1 and d in pass 2. Pass 1 prefetches
// the state D2PFD bytes ahead, the entry its first D2PFD bytes
// (deltaRuleAVX512's reasons).
#define D2PFD 4096

TEXT ·deltaRuleAVX2(SB), NOSPLIT, $0-68
	MOVQ    st+0(FP), BX
	MOVQ    v+24(FP), R13
	MOVQ    o+32(FP), R10
	MOVQ    n+40(FP), DX
	MOVQ    DX, R9
	SHLQ    $2, R9
	MOVQ    DX, R12
	SHRQ    $5, R12
	ANDQ    $31, DX
	MOVQ    rows+48(FP), R8
	MOVQ    $32, AX
	SUBQ    DX, AX
	LEAQ    f32tailmask<>(SB), CX
	LEAQ    (CX)(AX*4), AX
	VMOVUPS 0(AX), Y8
	VMOVUPS 32(AX), Y9
	VMOVUPS 64(AX), Y10
	VMOVUPS 96(AX), Y11
	// The first D2PFD bytes of the state (d2aloop prefetches D2PFD ahead).
	MOVQ BX, SI
	MOVQ $(D2PFD/256), CX

d2warm:
	PREFETCHT0 (SI)
	PREFETCHT0 64(SI)
	PREFETCHT0 128(SI)
	PREFETCHT0 192(SI)
	ADDQ       $256, SI
	DECQ       CX
	JNZ        d2warm

d2row:
	VBROADCASTSS decay+60(FP), Y12
	MOVQ         BX, SI
	MOVQ         k+16(FP), DI
	VXORPS       Y0, Y0, Y0
	VXORPS       Y1, Y1, Y1
	VXORPS       Y2, Y2, Y2
	VXORPS       Y3, Y3, Y3
	MOVQ         R12, CX
	TESTQ        CX, CX
	JZ           d2atail

d2aloop:
	PREFETCHT0 D2PFD(SI)
	PREFETCHT0 (D2PFD+64)(SI)
	VMULPS  0(SI), Y12, Y4
	VMULPS  32(SI), Y12, Y5
	VMULPS  64(SI), Y12, Y6
	VMULPS  96(SI), Y12, Y7
	VMOVUPS Y4, 0(SI)
	VMOVUPS Y5, 32(SI)
	VMOVUPS Y6, 64(SI)
	VMOVUPS Y7, 96(SI)
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
	JNZ     d2aloop

d2atail:
	TESTQ      DX, DX
	JZ         d2areduce
	VMASKMOVPS 0(SI), Y8, Y4
	VMASKMOVPS 32(SI), Y9, Y5
	VMASKMOVPS 64(SI), Y10, Y6
	VMASKMOVPS 96(SI), Y11, Y7
	VMULPS     Y12, Y4, Y4
	VMULPS     Y12, Y5, Y5
	VMULPS     Y12, Y6, Y6
	VMULPS     Y12, Y7, Y7
	VMASKMOVPS Y4, Y8, 0(SI)
	VMASKMOVPS Y5, Y9, 32(SI)
	VMASKMOVPS Y6, Y10, 64(SI)
	VMASKMOVPS Y7, Y11, 96(SI)
	VMASKMOVPS 0(DI), Y8, Y13
	VMASKMOVPS 32(DI), Y9, Y14
	VMULPS     Y13, Y4, Y4
	VMULPS     Y14, Y5, Y5
	VMASKMOVPS 64(DI), Y10, Y13
	VMASKMOVPS 96(DI), Y11, Y14
	VMULPS     Y13, Y6, Y6
	VMULPS     Y14, Y7, Y7
	VADDPS     Y4, Y0, Y0
	VADDPS     Y5, Y1, Y1
	VADDPS     Y6, Y2, Y2
	VADDPS     Y7, Y3, Y3

d2areduce:
	REDUCE32
	VMOVSS       0(R13), X2
	VSUBSS       X0, X2, X2
	VMULSS       beta+56(FP), X2, X2
	VBROADCASTSS X2, Y12
	MOVQ         BX, SI
	MOVQ         k+16(FP), DI
	MOVQ         q+8(FP), R11
	VXORPS       Y0, Y0, Y0
	VXORPS       Y1, Y1, Y1
	VXORPS       Y2, Y2, Y2
	VXORPS       Y3, Y3, Y3
	MOVQ         R12, CX
	TESTQ        CX, CX
	JZ           d2btail

d2bloop:
	VMULPS  0(DI), Y12, Y4
	VMULPS  32(DI), Y12, Y5
	VMULPS  64(DI), Y12, Y6
	VMULPS  96(DI), Y12, Y7
	VADDPS  0(SI), Y4, Y4
	VADDPS  32(SI), Y5, Y5
	VADDPS  64(SI), Y6, Y6
	VADDPS  96(SI), Y7, Y7
	VMOVUPS Y4, 0(SI)
	VMOVUPS Y5, 32(SI)
	VMOVUPS Y6, 64(SI)
	VMOVUPS Y7, 96(SI)
	VMULPS  0(R11), Y4, Y4
	VMULPS  32(R11), Y5, Y5
	VMULPS  64(R11), Y6, Y6
	VMULPS  96(R11), Y7, Y7
	VADDPS  Y4, Y0, Y0
	VADDPS  Y5, Y1, Y1
	VADDPS  Y6, Y2, Y2
	VADDPS  Y7, Y3, Y3
	ADDQ    $128, SI
	ADDQ    $128, DI
	ADDQ    $128, R11
	DECQ    CX
	JNZ     d2bloop

d2btail:
	TESTQ      DX, DX
	JZ         d2breduce
	VMASKMOVPS 0(DI), Y8, Y4
	VMASKMOVPS 32(DI), Y9, Y5
	VMASKMOVPS 64(DI), Y10, Y6
	VMASKMOVPS 96(DI), Y11, Y7
	VMULPS     Y12, Y4, Y4
	VMULPS     Y12, Y5, Y5
	VMULPS     Y12, Y6, Y6
	VMULPS     Y12, Y7, Y7
	VMASKMOVPS 0(SI), Y8, Y13
	VMASKMOVPS 32(SI), Y9, Y14
	VADDPS     Y13, Y4, Y4
	VADDPS     Y14, Y5, Y5
	VMASKMOVPS 64(SI), Y10, Y13
	VMASKMOVPS 96(SI), Y11, Y14
	VADDPS     Y13, Y6, Y6
	VADDPS     Y14, Y7, Y7
	VMASKMOVPS Y4, Y8, 0(SI)
	VMASKMOVPS Y5, Y9, 32(SI)
	VMASKMOVPS Y6, Y10, 64(SI)
	VMASKMOVPS Y7, Y11, 96(SI)
	VMASKMOVPS 0(R11), Y8, Y13
	VMASKMOVPS 32(R11), Y9, Y14
	VMULPS     Y13, Y4, Y4
	VMULPS     Y14, Y5, Y5
	VMASKMOVPS 64(R11), Y10, Y13
	VMASKMOVPS 96(R11), Y11, Y14
	VMULPS     Y13, Y6, Y6
	VMULPS     Y14, Y7, Y7
	VADDPS     Y4, Y0, Y0
	VADDPS     Y5, Y1, Y1
	VADDPS     Y6, Y2, Y2
	VADDPS     Y7, Y3, Y3

d2breduce:
	REDUCE32
	VMULSS scale+64(FP), X0, X0
	VMOVSS X0, 0(R10)
	ADDQ   $4, R10
	ADDQ   $4, R13
	ADDQ   R9, BX
	DECQ   R8
	JNZ    d2row
	VZEROUPPER
	RET
