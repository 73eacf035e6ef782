//go:build !noasm

#include "textflag.h"

// AVX-512 kernels for package quant (F, BW, VL and VNNI; hand-written Go
// assembly), chosen at run time over the AVX2 ones of kernels_amd64.s (see
// kernels_amd64.go). Integer sums are exact whatever their order; the float
// part of each block is the scalar (or per-lane packed) operation sequence
// of the pure-Go code in vecdot.go, so every result is bit-identical to it.
//
// Layouts (llama.cpp ggml/src/ggml-common.h @3f545beccee69d9975f466ec7e45fd9aacd8ba90):
//   block_q4_K (144 B): fp16 d, fp16 dmin, scales[12] (6-bit scale and min of
//     8 sub-blocks of 32, get_scale_min_k4), qs[128] (byte 32k+l: low nibble
//     element 64k+l, high nibble element 64k+32+l).
//   block_q8_K (292 B): float32 d, int8 qs[256], int16 bsums[16] (sums of 16).
//
// The kernels read activations reordered by q8KPermAVX512 into 384-byte
// blocks ("q8KP"): 0..255 the codes, each 128-element half as elements
// 0..31, 64..95, 32..63, 96..127 (so that one 64-byte load of weight
// nibbles, masked or shifted, meets one aligned 64-byte load of codes);
// 256..319 the 16 bsums twice; 320 the float32 d.

// Q4_K scale decoding (get_scale_min_k4 for all 8 j at once), per 16-byte
// lane holding the bytes s at 4(block) (scales[12] and 4 code bytes):
// A = s[0..3], s[8..11], s[4..7], s[8..11] and B = 0, s[0..3], 0, s[4..7];
// then out = A&[63,15,63,0] | (A>>4)&[0,0,0,15] | (B>>6)<<4 per group of
// 4 bytes = sc0..sc7, m0..m7. Each constant is repeated for the 4 lanes of
// a zmm (up to 4 weight rows decoded at once).
DATA k4shufA<>+0(SB)/8, $0x0b0a090803020100
DATA k4shufA<>+8(SB)/8, $0x0b0a090807060504
DATA k4shufA<>+16(SB)/8, $0x0b0a090803020100
DATA k4shufA<>+24(SB)/8, $0x0b0a090807060504
DATA k4shufA<>+32(SB)/8, $0x0b0a090803020100
DATA k4shufA<>+40(SB)/8, $0x0b0a090807060504
DATA k4shufA<>+48(SB)/8, $0x0b0a090803020100
DATA k4shufA<>+56(SB)/8, $0x0b0a090807060504
GLOBL k4shufA<>(SB), RODATA|NOPTR, $64
DATA k4shufB<>+0(SB)/8, $0x0302010080808080
DATA k4shufB<>+8(SB)/8, $0x0706050480808080
DATA k4shufB<>+16(SB)/8, $0x0302010080808080
DATA k4shufB<>+24(SB)/8, $0x0706050480808080
DATA k4shufB<>+32(SB)/8, $0x0302010080808080
DATA k4shufB<>+40(SB)/8, $0x0706050480808080
DATA k4shufB<>+48(SB)/8, $0x0302010080808080
DATA k4shufB<>+56(SB)/8, $0x0706050480808080
GLOBL k4shufB<>(SB), RODATA|NOPTR, $64
DATA k4m1a<>+0(SB)/8, $0x0f0f0f0f3f3f3f3f
DATA k4m1a<>+8(SB)/8, $0x000000003f3f3f3f
DATA k4m1a<>+16(SB)/8, $0x0f0f0f0f3f3f3f3f
DATA k4m1a<>+24(SB)/8, $0x000000003f3f3f3f
DATA k4m1a<>+32(SB)/8, $0x0f0f0f0f3f3f3f3f
DATA k4m1a<>+40(SB)/8, $0x000000003f3f3f3f
DATA k4m1a<>+48(SB)/8, $0x0f0f0f0f3f3f3f3f
DATA k4m1a<>+56(SB)/8, $0x000000003f3f3f3f
GLOBL k4m1a<>(SB), RODATA|NOPTR, $64
DATA k4m1b<>+0(SB)/8, $0x0000000000000000
DATA k4m1b<>+8(SB)/8, $0x0f0f0f0f00000000
DATA k4m1b<>+16(SB)/8, $0x0000000000000000
DATA k4m1b<>+24(SB)/8, $0x0f0f0f0f00000000
DATA k4m1b<>+32(SB)/8, $0x0000000000000000
DATA k4m1b<>+40(SB)/8, $0x0f0f0f0f00000000
DATA k4m1b<>+48(SB)/8, $0x0000000000000000
DATA k4m1b<>+56(SB)/8, $0x0f0f0f0f00000000
GLOBL k4m1b<>(SB), RODATA|NOPTR, $64
DATA k4m30<>+0(SB)/8, $0x3030303030303030
DATA k4m30<>+8(SB)/8, $0x3030303030303030
DATA k4m30<>+16(SB)/8, $0x3030303030303030
DATA k4m30<>+24(SB)/8, $0x3030303030303030
DATA k4m30<>+32(SB)/8, $0x3030303030303030
DATA k4m30<>+40(SB)/8, $0x3030303030303030
DATA k4m30<>+48(SB)/8, $0x3030303030303030
DATA k4m30<>+56(SB)/8, $0x3030303030303030
GLOBL k4m30<>(SB), RODATA|NOPTR, $64

// k4perm: VPERMW word indices into the decoded scales of one row (words
// 0..7 sc0..sc7, 8..15 m0..m7; +16 for the second row of a zmm). Half h
// (elements 128h..128h+127) of a block: K4DOT's packed words take, per
// 128-bit lane, 4 words of one sub-block then 4 of the next: sc4h, sc4h+1
// (lanes 0, 1), then sc4h+2, sc4h+3 (lanes 2, 3). Order: half 0, half 1 of
// the first row, then of the second.
DATA k4perm<>+0(SB)/8, $0x0000000000000000
DATA k4perm<>+8(SB)/8, $0x0001000100010001
DATA k4perm<>+16(SB)/8, $0x0000000000000000
DATA k4perm<>+24(SB)/8, $0x0001000100010001
DATA k4perm<>+32(SB)/8, $0x0002000200020002
DATA k4perm<>+40(SB)/8, $0x0003000300030003
DATA k4perm<>+48(SB)/8, $0x0002000200020002
DATA k4perm<>+56(SB)/8, $0x0003000300030003
DATA k4perm<>+64(SB)/8, $0x0004000400040004
DATA k4perm<>+72(SB)/8, $0x0005000500050005
DATA k4perm<>+80(SB)/8, $0x0004000400040004
DATA k4perm<>+88(SB)/8, $0x0005000500050005
DATA k4perm<>+96(SB)/8, $0x0006000600060006
DATA k4perm<>+104(SB)/8, $0x0007000700070007
DATA k4perm<>+112(SB)/8, $0x0006000600060006
DATA k4perm<>+120(SB)/8, $0x0007000700070007
DATA k4perm<>+128(SB)/8, $0x0010001000100010
DATA k4perm<>+136(SB)/8, $0x0011001100110011
DATA k4perm<>+144(SB)/8, $0x0010001000100010
DATA k4perm<>+152(SB)/8, $0x0011001100110011
DATA k4perm<>+160(SB)/8, $0x0012001200120012
DATA k4perm<>+168(SB)/8, $0x0013001300130013
DATA k4perm<>+176(SB)/8, $0x0012001200120012
DATA k4perm<>+184(SB)/8, $0x0013001300130013
DATA k4perm<>+192(SB)/8, $0x0014001400140014
DATA k4perm<>+200(SB)/8, $0x0015001500150015
DATA k4perm<>+208(SB)/8, $0x0014001400140014
DATA k4perm<>+216(SB)/8, $0x0015001500150015
DATA k4perm<>+224(SB)/8, $0x0016001600160016
DATA k4perm<>+232(SB)/8, $0x0017001700170017
DATA k4perm<>+240(SB)/8, $0x0016001600160016
DATA k4perm<>+248(SB)/8, $0x0017001700170017
GLOBL k4perm<>(SB), RODATA|NOPTR, $256

// k4minp: VPMADDWD word pairs of the mins: m0, m0, m1, m1, .., m7, m7 of
// the row in the low half of a zmm of decoded scales, then those of the
// row in the high half (words 8..15 and 24..31).
DATA k4minp<>+0(SB)/8, $0x0009000900080008
DATA k4minp<>+8(SB)/8, $0x000b000b000a000a
DATA k4minp<>+16(SB)/8, $0x000d000d000c000c
DATA k4minp<>+24(SB)/8, $0x000f000f000e000e
DATA k4minp<>+32(SB)/8, $0x0019001900180018
DATA k4minp<>+40(SB)/8, $0x001b001b001a001a
DATA k4minp<>+48(SB)/8, $0x001d001d001c001c
DATA k4minp<>+56(SB)/8, $0x001f001f001e001e
GLOBL k4minp<>(SB), RODATA|NOPTR, $64

// func q8KPermAVX512(src, dst *byte, nb int)
// Writes nb q8KP blocks (384 B, see above) at dst from the nb block_q8_K
// at src.
TEXT ·q8KPermAVX512(SB), NOSPLIT, $0-24
	MOVQ    src+0(FP), SI
	MOVQ    dst+8(FP), DI
	MOVQ    nb+16(FP), CX

q8kperm:
	MOVL         0(SI), AX
	MOVL         AX, 320(DI)
	VMOVDQU      4(SI), Y0
	VMOVDQU      36(SI), Y1
	VMOVDQU      68(SI), Y2
	VMOVDQU      100(SI), Y3
	VMOVDQU      132(SI), Y4
	VMOVDQU      164(SI), Y5
	VMOVDQU      196(SI), Y6
	VMOVDQU      228(SI), Y7
	VMOVDQU      260(SI), Y8
	VMOVDQU      Y0, 0(DI)
	VMOVDQU      Y2, 32(DI)
	VMOVDQU      Y1, 64(DI)
	VMOVDQU      Y3, 96(DI)
	VMOVDQU      Y4, 128(DI)
	VMOVDQU      Y6, 160(DI)
	VMOVDQU      Y5, 192(DI)
	VMOVDQU      Y7, 224(DI)
	VMOVDQU      Y8, 256(DI)
	VMOVDQU      Y8, 288(DI)
	ADDQ         $292, SI
	ADDQ         $384, DI
	DECQ         CX
	JNZ          q8kperm
	VZEROUPPER
	RET

// K4SETUP loads the constants: Z31 = 0x0f bytes, Z28, Z29 = the scale
// permutations of halves 0, 1 for a row in the low half of a zmm of
// words, Z26, Z27 for one in the high half; Z25 = k4minp.
#define K4SETUP \
	VMOVDQU64    k4minp<>(SB), Z25 \
	MOVL         $0x0f0f0f0f, AX \
	VPBROADCASTD AX, Z31 \
	VMOVDQU64    k4perm<>+0(SB), Z28 \
	VMOVDQU64    k4perm<>+64(SB), Z29 \
	VMOVDQU64    k4perm<>+128(SB), Z26 \
	VMOVDQU64    k4perm<>+192(SB), Z27

// K4DEC(X8, X9): the 16-byte lanes of X8 (s of up to 4 blocks) decoded
// into sc0..sc7, m0..m7 per lane in X9 (X is X, Y or Z; clobbers X10, X11).
#define K4DEC(R8_, R9_, R10_, R11_) \
	VPSHUFB    k4shufA<>(SB), R8_, R9_ \
	VPSHUFB    k4shufB<>(SB), R8_, R10_ \
	VPSRLW     $4, R9_, R11_ \
	VPANDD     k4m1a<>(SB), R9_, R9_ \
	VPANDD     k4m1b<>(SB), R11_, R11_ \
	VPSRLW     $2, R10_, R10_ \
	VPANDD     k4m30<>(SB), R10_, R10_ \
	VPTERNLOGD $0xfe, R11_, R10_, R9_

// K4CODES(W): Z16, Z17 (half 0) and Z18, Z19 (half 1) = the low and the
// high nibbles of the 64 qs bytes of each half of the block_q4_K at W, as
// unsigned bytes: elements 0..31, 64..95 and 32..63, 96..127 of the half.
#define K4CODES(W) \
	VMOVDQU64 16(W), Z16 \
	VMOVDQU64 80(W), Z18 \
	VPSRLW    $4, Z16, Z17 \
	VPSRLW    $4, Z18, Z19 \
	VPANDD    Z31, Z16, Z16 \
	VPANDD    Z31, Z17, Z17 \
	VPANDD    Z31, Z18, Z18 \
	VPANDD    Z31, Z19, Z19

// K4DOT(P, Z, T0, T1, T2, T3) sets Z = 16 int32 partials of the block's
// scaled integer sum sum_j sc_j * sum(q4*q8) against the q8KP block at P,
// given the codes (K4CODES) and the scale words Z20, Z21: VPDPBUSD gives
// exact sums of 4 code products (|s| <= 4*15*128 < 2^15), VPACKSSDW packs
// those of the low and the high nibbles to words without saturating, and
// VPMADDWD / VPDPWSSD multiply them with the scale words and add them up
// in int32 (exact: |isum| <= 256*15*128*63).
#define K4DOT(P, Z, T0, T1, T2, T3) \
	VPXORD    T0, T0, T0 \
	VPXORD    T1, T1, T1 \
	VPXORD    T2, T2, T2 \
	VPXORD    T3, T3, T3 \
	VPDPBUSD  0(P), Z16, T0 \
	VPDPBUSD  64(P), Z17, T1 \
	VPDPBUSD  128(P), Z18, T2 \
	VPDPBUSD  192(P), Z19, T3 \
	VPACKSSDW T1, T0, T0 \
	VPACKSSDW T3, T2, T2 \
	VPMADDWD  Z20, T0, Z \
	VPDPWSSD  Z21, T2, Z

// K4CLEAN zeroes Z16..Z31 before VZEROUPPER (which clears only the upper
// halves of Z0..Z15): a dirty upper state left in them makes every later
// legacy-SSE instruction of Go code slow on Intel cores.
#define K4CLEAN \
	VPXORD Z16, Z16, Z16 \
	VPXORD Z17, Z17, Z17 \
	VPXORD Z18, Z18, Z18 \
	VPXORD Z19, Z19, Z19 \
	VPXORD Z20, Z20, Z20 \
	VPXORD Z21, Z21, Z21 \
	VPXORD Z22, Z22, Z22 \
	VPXORD Z23, Z23, Z23 \
	VPXORD Z24, Z24, Z24 \
	VPXORD Z25, Z25, Z25 \
	VPXORD Z26, Z26, Z26 \
	VPXORD Z27, Z27, Z27 \
	VPXORD Z28, Z28, Z28 \
	VPXORD Z29, Z29, Z29 \
	VPXORD Z30, Z30, Z30 \
	VPXORD Z31, Z31, Z31 \
	VZEROUPPER

// PFD is the software prefetch distance in bytes along a weight row run.
#define PFD 2048

// PF3(W) prefetches the 144 bytes PFD ahead of W.
#define PF3(W) \
	PREFETCHT0 PFD(W) \
	PREFETCHT0 (PFD+64)(W) \
	PREFETCHT0 (PFD+128)(W)

// FOLD(Z, Y, T): Y = the 8-lane sum of the halves of Z (T a scratch ymm).
#define FOLD(Z, Y, T) \
	VEXTRACTI64X4 $1, Z, T \
	VPADDD        T, Y, Y

// HSUM4X(A, B, C, D, XA, XT): XA = [sum A, sum B, sum C, sum D] of four
// 8-lane int32 registers (exact; clobbers A, C and XT).
#define HSUM4X(A, B, C, D, XA, XT) \
	VPHADDD      B, A, A \
	VPHADDD      D, C, C \
	VPHADDD      C, A, A \
	VEXTRACTI128 $1, A, XT \
	VPADDD       XT, XA, XA

// K4ROW(W, ZW, I0, I1, Z): one weight row's block at W (its scale words
// in ZW, picked by I0, I1) against the q8KP block at DI: Z = the 16 isum
// partials.
#define K4ROW(W, ZW, I0, I1, Z) \
	VPERMW ZW, I0, Z20 \
	VPERMW ZW, I1, Z21 \
	K4CODES(W) \
	K4DOT(DI, Z, Z4, Z5, Z6, Z7)

// func q4KRowsAVX512(w, a *byte, nb, rows, rb int, out *float32)
// out[r] = genericQ4KDot(w + r*rb, a, nb) for r < rows (rows, nb >= 1), a
// as nb q8KP blocks. Weight rows go 4 at a time, block by block: their 4
// blocks' scales are decoded in one zmm, their integer sums reduced
// together (HSUM4X), and the float steps run packed, lane j being row j's
// scalar sequence sumf += (d_w*d_a)*isum, sumf -= (dmin_w*d_a)*imin
// (kDotSums); the rows%4 left go one at a time, the same steps in scalar.
TEXT ·q4KRowsAVX512(SB), NOSPLIT, $0-48
	MOVQ w+0(FP), BX
	MOVQ nb+16(FP), DX
	MOVQ rows+24(FP), R8
	MOVQ rb+32(FP), R9
	MOVQ out+40(FP), R10
	K4SETUP
	CMPQ R8, $4
	JB   q4k5rows

q4k5quad:
	MOVQ   BX, SI
	LEAQ   (BX)(R9*1), R11
	LEAQ   (BX)(R9*2), R12
	LEAQ   (R11)(R9*2), R13
	MOVQ   a+8(FP), DI
	MOVQ   DX, CX
	VXORPS X14, X14, X14

q4k5quadloop:
	PF3(SI)
	PF3(R11)
	PF3(R12)
	PF3(R13)
	VMOVDQU      4(SI), X8
	VINSERTI32X4 $1, 4(R11), Z8, Z8
	VINSERTI32X4 $2, 4(R12), Z8, Z8
	VINSERTI32X4 $3, 4(R13), Z8, Z8
	K4DEC(Z8, Z9, Z10, Z11)
	VPMOVZXBW     Y9, Z10
	VEXTRACTI64X4 $1, Z9, Y11
	VPMOVZXBW     Y11, Z11
	VPERMW        Z10, Z25, Z12
	VPERMW        Z11, Z25, Z13
	VPMADDWD      256(DI), Z12, Z12
	VPMADDWD      256(DI), Z13, Z13
	K4ROW(SI, Z10, Z28, Z29, Z0)
	K4ROW(R11, Z10, Z26, Z27, Z1)
	K4ROW(R12, Z11, Z28, Z29, Z2)
	K4ROW(R13, Z11, Z26, Z27, Z3)
	FOLD(Z0, Y0, Y4)
	FOLD(Z1, Y1, Y5)
	FOLD(Z2, Y2, Y6)
	FOLD(Z3, Y3, Y7)
	HSUM4X(Y0, Y1, Y2, Y3, X0, X4)
	VEXTRACTI64X4 $1, Z12, Y5
	VEXTRACTI64X4 $1, Z13, Y7
	HSUM4X(Y12, Y5, Y13, Y7, X12, X4)
	VCVTDQ2PS     X0, X0
	VCVTDQ2PS     X12, X12
	VMOVD         0(SI), X3
	VPINSRD       $1, 0(R11), X3, X3
	VPINSRD       $2, 0(R12), X3, X3
	VPINSRD       $3, 0(R13), X3, X3
	VCVTPH2PS     X3, Y3
	VEXTRACTF128  $1, Y3, X4
	VSHUFPS       $0x88, X4, X3, X5
	VSHUFPS       $0xdd, X4, X3, X3
	VBROADCASTSS  320(DI), X4
	VMULPS        X4, X5, X5
	VMULPS        X4, X3, X3
	VMULPS        X0, X5, X5
	VMULPS        X12, X3, X3
	VADDPS        X5, X14, X14
	VSUBPS        X3, X14, X14
	ADDQ          $144, SI
	ADDQ          $144, R11
	ADDQ          $144, R12
	ADDQ          $144, R13
	ADDQ          $384, DI
	DECQ          CX
	JNZ           q4k5quadloop
	VMOVUPS X14, 0(R10)
	ADDQ    $16, R10
	LEAQ    (BX)(R9*4), BX
	SUBQ    $4, R8
	CMPQ    R8, $4
	JAE     q4k5quad
	TESTQ   R8, R8
	JZ      q4k5done

q4k5rows:
	MOVQ   BX, SI
	MOVQ   a+8(FP), DI
	MOVQ   DX, CX
	VXORPS X14, X14, X14

q4k5loop:
	PF3(SI)
	VMOVDQU      4(SI), X8
	K4DEC(X8, X9, X10, X11)
	VPMOVZXBW    X9, Y10
	VPERMW       Y10, Y25, Y12
	VPMADDWD     256(DI), Y12, Y12
	K4ROW(SI, Z10, Z28, Z29, Z0)
	FOLD(Z0, Y0, Y4)
	VPHADDD      Y12, Y0, Y0
	VEXTRACTI128 $1, Y0, X4
	VPADDD       X4, X0, X0
	VPHADDD      X0, X0, X0
	VCVTDQ2PS    X0, X0
	VCVTPH2PS    0(SI), X3
	VBROADCASTSS 320(DI), X4
	VMULPS       X4, X3, X3
	VMULPS       X0, X3, X3
	VADDSS       X3, X14, X14
	VMOVSHDUP    X3, X3
	VSUBSS       X3, X14, X14
	ADDQ         $144, SI
	ADDQ         $384, DI
	DECQ         CX
	JNZ          q4k5loop
	VMOVSS X14, 0(R10)
	ADDQ   $4, R10
	ADDQ   R9, BX
	DECQ   R8
	JNZ    q4k5rows

q4k5done:
	K4CLEAN
	RET

// func q4KRows4AVX512(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)
// For r < rows and j < 4: y[j*ys+r] = genericQ4KDot(w + r*rb, a_j, nb)
// (rows, nb >= 1), a_j as nb q8KP blocks: each weight block is decoded
// once for the 4 activation rows; the float steps run packed, lane j
// being row j's scalar sequence.
TEXT ·q4KRows4AVX512(SB), NOSPLIT, $0-80
	MOVQ w+0(FP), R8
	MOVQ rows+48(FP), R9
	MOVQ y+64(FP), R10
	K4SETUP

q4k54rows:
	MOVQ   R8, SI
	MOVQ   a0+8(FP), DI
	MOVQ   a1+16(FP), R11
	MOVQ   a2+24(FP), R12
	MOVQ   a3+32(FP), R13
	MOVQ   nb+40(FP), CX
	VXORPS X14, X14, X14

q4k54loop:
	PF3(SI)
	VMOVDQU    4(SI), X8
	K4DEC(X8, X9, X10, X11)
	VPMOVZXBW  X9, Y10
	VPERMW     Z10, Z28, Z20
	VPERMW     Z10, Z29, Z21
	K4CODES(SI)
	K4DOT(DI, Z0, Z4, Z5, Z6, Z7)
	K4DOT(R11, Z1, Z4, Z5, Z6, Z7)
	K4DOT(R12, Z2, Z4, Z5, Z6, Z7)
	K4DOT(R13, Z3, Z4, Z5, Z6, Z7)
	VPERMW       Y10, Y25, Y11
	VPMADDWD     256(DI), Y11, Y12
	VPMADDWD     256(R11), Y11, Y13
	VPMADDWD     256(R12), Y11, Y8
	VPMADDWD     256(R13), Y11, Y9
	FOLD(Z0, Y0, Y4)
	FOLD(Z1, Y1, Y5)
	FOLD(Z2, Y2, Y6)
	FOLD(Z3, Y3, Y7)
	HSUM4X(Y0, Y1, Y2, Y3, X0, X4)
	HSUM4X(Y12, Y13, Y8, Y9, X12, X4)
	VCVTDQ2PS    X0, X0
	VCVTDQ2PS    X12, X12
	VCVTPH2PS    0(SI), X3
	VBROADCASTSS X3, X5
	VMOVSHDUP    X3, X3
	VBROADCASTSS X3, X3
	VMOVSS       320(DI), X4
	VINSERTPS    $0x10, 320(R11), X4, X4
	VINSERTPS    $0x20, 320(R12), X4, X4
	VINSERTPS    $0x30, 320(R13), X4, X4
	VMULPS       X4, X5, X5
	VMULPS       X4, X3, X3
	VMULPS       X0, X5, X5
	VMULPS       X12, X3, X3
	VADDPS       X5, X14, X14
	VSUBPS       X3, X14, X14
	ADDQ         $144, SI
	ADDQ         $384, DI
	ADDQ         $384, R11
	ADDQ         $384, R12
	ADDQ         $384, R13
	DECQ         CX
	JNZ          q4k54loop
	MOVQ       ys+72(FP), DX
	SHLQ       $2, DX
	MOVQ       R10, BX
	VMOVSS     X14, (BX)
	ADDQ       DX, BX
	VEXTRACTPS $1, X14, (BX)
	ADDQ       DX, BX
	VEXTRACTPS $2, X14, (BX)
	ADDQ       DX, BX
	VEXTRACTPS $3, X14, (BX)
	ADDQ       $4, R10
	ADDQ       rb+56(FP), R8
	DECQ       R9
	JNZ        q4k54rows
	K4CLEAN
	RET
