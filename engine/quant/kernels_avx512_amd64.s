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
// The kernels read activations reordered by q8KPermAVX512 into 448-byte
// blocks ("q8KP"): 0..255 the codes, each 128-element half as elements
// 0..31, 64..95, 32..63, 96..127 (so that one 64-byte load of weight
// nibbles, masked or shifted, meets one aligned 64-byte load of codes);
// 256..319 the words 0 x 8, bsums[0, 2, .., 14], twice; 320..383 the same
// with bsums[1, 3, .., 15]; 384 the float32 d. Against a row of decoded
// scales (words sc0..sc7, m0..m7), VPMADDWD with the first and VPDPWSSD
// with the second give int32 partials of sum_j m_j*(bsums[2j] +
// bsums[2j+1]) (the sc words meet zeros), exact for any bsums.

// Q4_K scale decoding (get_scale_min_k4 for all 8 j at once), per 16-byte
// lane holding the first 16 bytes of a block (fp16 d, fp16 dmin, then the
// bytes s = scales[12] at 4..15):
// A = s[0..3], s[8..11], s[4..7], s[8..11] and B = 0, s[0..3], 0, s[4..7];
// then out = A&[63,15,63,0] | (A>>4)&[0,0,0,15] | (B>>6)<<4 per group of
// 4 bytes = sc0..sc7, m0..m7. Each constant is repeated for the 4 lanes of
// a zmm (up to 4 weight rows decoded at once).
DATA k4shufA<>+0(SB)/8, $0x0f0e0d0c07060504
DATA k4shufA<>+8(SB)/8, $0x0f0e0d0c0b0a0908
DATA k4shufA<>+16(SB)/8, $0x0f0e0d0c07060504
DATA k4shufA<>+24(SB)/8, $0x0f0e0d0c0b0a0908
DATA k4shufA<>+32(SB)/8, $0x0f0e0d0c07060504
DATA k4shufA<>+40(SB)/8, $0x0f0e0d0c0b0a0908
DATA k4shufA<>+48(SB)/8, $0x0f0e0d0c07060504
DATA k4shufA<>+56(SB)/8, $0x0f0e0d0c0b0a0908
GLOBL k4shufA<>(SB), RODATA|NOPTR, $64
DATA k4shufB<>+0(SB)/8, $0x0706050480808080
DATA k4shufB<>+8(SB)/8, $0x0b0a090880808080
DATA k4shufB<>+16(SB)/8, $0x0706050480808080
DATA k4shufB<>+24(SB)/8, $0x0b0a090880808080
DATA k4shufB<>+32(SB)/8, $0x0706050480808080
DATA k4shufB<>+40(SB)/8, $0x0b0a090880808080
DATA k4shufB<>+48(SB)/8, $0x0706050480808080
DATA k4shufB<>+56(SB)/8, $0x0b0a090880808080
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

// k4evod: VPSHUFB pattern putting the even words of each 128-bit lane
// before the odd ones (then VPERMQ 0xd8: bsums[0, 2, .., 14] in the low
// half, bsums[1, 3, .., 15] in the high one).
DATA k4evod<>+0(SB)/8, $0x0d0c090805040100
DATA k4evod<>+8(SB)/8, $0x0f0e0b0a07060302
DATA k4evod<>+16(SB)/8, $0x0d0c090805040100
DATA k4evod<>+24(SB)/8, $0x0f0e0b0a07060302
GLOBL k4evod<>(SB), RODATA|NOPTR, $32

// k4d4: VPERMD indices 0, 4, 8, 12: the first dword (fp16 d, dmin) of
// each 16-byte lane.
DATA k4d4<>+0(SB)/8, $0x0000000400000000
DATA k4d4<>+8(SB)/8, $0x0000000c00000008
DATA k4d4<>+16(SB)/8, $0
DATA k4d4<>+24(SB)/8, $0
DATA k4d4<>+32(SB)/8, $0
DATA k4d4<>+40(SB)/8, $0
DATA k4d4<>+48(SB)/8, $0
DATA k4d4<>+56(SB)/8, $0
GLOBL k4d4<>(SB), RODATA|NOPTR, $64

// k4sm: VPERMQ indices 0, 4, 1, 5 (the 4-row reduction's last step).
DATA k4sm<>+0(SB)/8, $0
DATA k4sm<>+8(SB)/8, $4
DATA k4sm<>+16(SB)/8, $1
DATA k4sm<>+24(SB)/8, $5
DATA k4sm<>+32(SB)/8, $2
DATA k4sm<>+40(SB)/8, $6
DATA k4sm<>+48(SB)/8, $3
DATA k4sm<>+56(SB)/8, $7
GLOBL k4sm<>(SB), RODATA|NOPTR, $64

// func q8KPermAVX512(src, dst *byte, nb int)
// Writes nb q8KP blocks (448 B, see above) at dst from the nb block_q8_K
// at src.
TEXT ·q8KPermAVX512(SB), NOSPLIT, $0-24
	MOVQ    src+0(FP), SI
	MOVQ    dst+8(FP), DI
	MOVQ    nb+16(FP), CX
	VMOVDQU k4evod<>(SB), Y9

q8kperm:
	MOVL        0(SI), AX
	MOVL        AX, 384(DI)
	VMOVDQU     4(SI), Y0
	VMOVDQU     36(SI), Y1
	VMOVDQU     68(SI), Y2
	VMOVDQU     100(SI), Y3
	VMOVDQU     132(SI), Y4
	VMOVDQU     164(SI), Y5
	VMOVDQU     196(SI), Y6
	VMOVDQU     228(SI), Y7
	VMOVDQU     260(SI), Y8
	VPSHUFB     Y9, Y8, Y8
	VMOVDQU     Y0, 0(DI)
	VMOVDQU     Y2, 32(DI)
	VMOVDQU     Y1, 64(DI)
	VMOVDQU     Y3, 96(DI)
	VMOVDQU     Y4, 128(DI)
	VMOVDQU     Y6, 160(DI)
	VMOVDQU     Y5, 192(DI)
	VMOVDQU     Y7, 224(DI)
	VPERMQ      $0xd8, Y8, Y8
	VPERM2I128  $0x08, Y8, Y8, Y10
	VPERM2I128  $0x18, Y8, Y8, Y11
	VMOVDQU     Y10, 256(DI)
	VMOVDQU     Y10, 288(DI)
	VMOVDQU     Y11, 320(DI)
	VMOVDQU     Y11, 352(DI)
	ADDQ        $292, SI
	ADDQ        $448, DI
	DECQ        CX
	JNZ         q8kperm
	VZEROUPPER
	RET

// K4SETUP loads the constants: Z31 = 0x0f bytes, Z28, Z29 = the scale
// permutations of halves 0, 1 for a row in the low half of a zmm of
// words, Z26, Z27 for one in the high half; Z25 = k4sm.
#define K4SETUP \
	VMOVDQU64    k4sm<>(SB), Z25 \
	MOVL         $0x0f0f0f0f, AX \
	VPBROADCASTD AX, Z31 \
	VMOVDQU64    k4perm<>+0(SB), Z28 \
	VMOVDQU64    k4perm<>+64(SB), Z29 \
	VMOVDQU64    k4perm<>+128(SB), Z26 \
	VMOVDQU64    k4perm<>+192(SB), Z27

// K4DEC(X8, X9): the 16-byte lanes of X8 (d, dmin, s of up to 4 blocks) decoded
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

// PFROWS is how many weight rows ahead the 4-row loop prefetches.
#ifndef PFROWS
#define PFROWS 8
#endif

// PF3(W) prefetches the 144 bytes PFD ahead of W.
#define PF3(W) \
	PREFETCHT0 PFD(W) \
	PREFETCHT0 (PFD+64)(W) \
	PREFETCHT0 (PFD+128)(W)

// PFR(W) prefetches the block of weight row W + 8 (R9 = the row stride):
// the 4-row loop reads 4 row runs side by side, so the bytes it needs two
// row groups from now are 8 rows down, not PFD bytes along.
#define PFR(W) \
	PREFETCHT0 (W)(AX*1) \
	PREFETCHT0 64(W)(AX*1) \
	PREFETCHT0 128(W)(AX*1)

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

// RED4(A0, A1, A2, A3) reduces the 4 rows' isum partials A0..A3 (16
// lanes each) and mins partials Z12 (rows 0, 1: 8 lanes each) and Z13
// (rows 2, 3) to Y0 = [isum0, imin0, isum1, imin1, .., isum3, imin3]
// (exact; clobbers Z0..Z7).
#define RED4(A0, A1, A2, A3) RED4M(A0, A1, A2, A3, Z12, Z13)

// RED4M is RED4 with the mins partials in M01, M23.
#define RED4M(A0, A1, A2, A3, M01, M23) \
	VSHUFI64X2  $0x44, A1, A0, Z4 \
	VSHUFI64X2  $0xee, A1, A0, Z5 \
	VPADDD      Z5, Z4, Z4 \
	VSHUFI64X2  $0x44, A3, A2, Z6 \
	VSHUFI64X2  $0xee, A3, A2, Z7 \
	VPADDD      Z7, Z6, Z6 \
	VPUNPCKLDQ  M01, Z4, Z0 \
	VPUNPCKHDQ  M01, Z4, Z1 \
	VPADDD      Z1, Z0, Z0 \
	VPUNPCKLDQ  M23, Z6, Z2 \
	VPUNPCKHDQ  M23, Z6, Z3 \
	VPADDD      Z3, Z2, Z2 \
	VPUNPCKLQDQ Z2, Z0, Z4 \
	VPUNPCKHQDQ Z2, Z0, Z5 \
	VPADDD      Z5, Z4, Z4 \
	VSHUFI64X2  $0xb1, Z4, Z4, Z5 \
	VPADDD      Z5, Z4, Z4 \
	VPERMQ      Z4, Z25, Z0

// Q4HALF(off, I0, I1, ACC) runs half h (qs at 16+off, codes at 2*off of
// the q8KP block at DI, off = 64h) of the 4 rows' blocks at SI, R11, R12,
// R13, breadth first so that the 4 rows' independent steps sit side by
// side: nibbles (Z16..Z23), VPDPBUSD (Z0..Z7), VPACKSSDW, then the scale
// words (VPERMW with I0 for rows 0, 2 and I1 for rows 1, 3) and ACC (a
// VPMADDWD for half 0, VPDPWSSD for half 1) into Z8, Z9, Z15, Z24.
#define Q4HALF(off, I0, I1, ACC) \
	VMOVDQU64 (16+off)(SI), Z16 \
	VMOVDQU64 (16+off)(R11), Z17 \
	VMOVDQU64 (16+off)(R12), Z18 \
	VMOVDQU64 (16+off)(R13), Z19 \
	VPSRLW    $4, Z16, Z20 \
	VPSRLW    $4, Z17, Z21 \
	VPSRLW    $4, Z18, Z22 \
	VPSRLW    $4, Z19, Z23 \
	VPANDD    Z31, Z16, Z16 \
	VPANDD    Z31, Z17, Z17 \
	VPANDD    Z31, Z18, Z18 \
	VPANDD    Z31, Z19, Z19 \
	VPANDD    Z31, Z20, Z20 \
	VPANDD    Z31, Z21, Z21 \
	VPANDD    Z31, Z22, Z22 \
	VPANDD    Z31, Z23, Z23 \
	VPXORD    Z0, Z0, Z0 \
	VPXORD    Z1, Z1, Z1 \
	VPXORD    Z2, Z2, Z2 \
	VPXORD    Z3, Z3, Z3 \
	VPXORD    Z4, Z4, Z4 \
	VPXORD    Z5, Z5, Z5 \
	VPXORD    Z6, Z6, Z6 \
	VPXORD    Z7, Z7, Z7 \
	VPDPBUSD  (2*off)(DI), Z16, Z0 \
	VPDPBUSD  (2*off+64)(DI), Z20, Z1 \
	VPDPBUSD  (2*off)(DI), Z17, Z2 \
	VPDPBUSD  (2*off+64)(DI), Z21, Z3 \
	VPDPBUSD  (2*off)(DI), Z18, Z4 \
	VPDPBUSD  (2*off+64)(DI), Z22, Z5 \
	VPDPBUSD  (2*off)(DI), Z19, Z6 \
	VPDPBUSD  (2*off+64)(DI), Z23, Z7 \
	VPERMW    Z10, I0, Z16 \
	VPERMW    Z10, I1, Z17 \
	VPERMW    Z11, I0, Z18 \
	VPERMW    Z11, I1, Z19 \
	VPACKSSDW Z1, Z0, Z0 \
	VPACKSSDW Z3, Z2, Z2 \
	VPACKSSDW Z5, Z4, Z4 \
	VPACKSSDW Z7, Z6, Z6 \
	ACC       Z16, Z0, Z8 \
	ACC       Z17, Z2, Z9 \
	ACC       Z18, Z4, Z15 \
	ACC       Z19, Z6, Z24

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
// together (RED4), and the float steps run packed, lane j being row j's
// scalar sequence sumf += (d_w*d_a)*isum, sumf -= (dmin_w*d_a)*imin
// (kDotSums); the rows%4 left go one at a time, the same steps in scalar.
// The 4 rows of a step are r, r+q, r+2q, r+3q (q = rows/4), so that the
// kernel reads 4 long sequential runs of rows (hardware prefetchers follow
// them; software prefetch runs PFD bytes ahead in each) rather than 4
// runs of one row each.
TEXT ·q4KRowsAVX512(SB), NOSPLIT, $24-48
	MOVQ w+0(FP), BX
	MOVQ nb+16(FP), DX
	MOVQ rows+24(FP), R8
	MOVQ rb+32(FP), R9
	MOVQ out+40(FP), R10
	K4SETUP
	SHRQ  $2, R8
	JZ    q4k5rows
	MOVQ  R8, AX
	SHLQ  $2, AX
	MOVQ  AX, 0(SP)
	MOVQ  R8, AX
	IMULQ R9, AX
	MOVQ  AX, 8(SP)
	MOVQ  BX, SI
	LEAQ  (BX)(AX*1), R11
	LEAQ  (BX)(AX*2), R12
	LEAQ  (R11)(AX*2), R13
	MOVQ  $(PFD/64), CX

q4k5warm:
	// The first PFD bytes of each row run: the loop's prefetches start PFD
	// bytes in, so without these a call's first blocks wait on memory one
	// demand miss after another.
	PREFETCHT0 (SI)
	PREFETCHT0 (R11)
	PREFETCHT0 (R12)
	PREFETCHT0 (R13)
	ADDQ       $64, SI
	ADDQ       $64, R11
	ADDQ       $64, R12
	ADDQ       $64, R13
	DECQ       CX
	JNZ        q4k5warm

q4k5quad:
	MOVQ   BX, SI
	LEAQ   (BX)(AX*1), R11
	LEAQ   (BX)(AX*2), R12
	LEAQ   (R11)(AX*2), R13
	MOVQ   a+8(FP), DI
	MOVQ   DX, CX
	VXORPS Y14, Y14, Y14

q4k5quadloop:
	PF3(SI)
	PF3(R11)
	PF3(R12)
	PF3(R13)
	VMOVDQU      0(SI), X8
	VINSERTI32X4 $1, 0(R11), Z8, Z8
	VINSERTI32X4 $2, 0(R12), Z8, Z8
	VINSERTI32X4 $3, 0(R13), Z8, Z8
	K4DEC(Z8, Z9, Z10, Z11)
	VMOVDQU64    k4d4<>(SB), Z30
	VPERMD       Z8, Z30, Z30
	VPMOVZXBW     Y9, Z10
	VEXTRACTI64X4 $1, Z9, Y11
	VPMOVZXBW     Y11, Z11
	VPMADDWD      256(DI), Z10, Z12
	VPMADDWD      256(DI), Z11, Z13
	VPDPWSSD      320(DI), Z10, Z12
	VPDPWSSD      320(DI), Z11, Z13
	Q4HALF(0, Z28, Z26, VPMADDWD)
	Q4HALF(64, Z29, Z27, VPDPWSSD)
	RED4(Z8, Z9, Z15, Z24)
	VCVTDQ2PS     Y0, Y0
	VCVTPH2PS     X30, Y3
	VBROADCASTSS  384(DI), Y4
	VMULPS        Y4, Y3, Y3
	VMULPS        Y0, Y3, Y3
	VADDPS        Y3, Y14, Y14
	VPSRLQ        $32, Y3, Y3
	VSUBPS        Y3, Y14, Y14
	ADDQ          $144, SI
	ADDQ          $144, R11
	ADDQ          $144, R12
	ADDQ          $144, R13
	ADDQ          $448, DI
	DECQ          CX
	JNZ           q4k5quadloop
	VEXTRACTF128 $1, Y14, X4
	VSHUFPS      $0x88, X4, X14, X14
	MOVQ         0(SP), CX
	VMOVSS       X14, (R10)
	VEXTRACTPS   $1, X14, (R10)(CX*1)
	LEAQ         (R10)(CX*2), SI
	VEXTRACTPS   $2, X14, (SI)
	VEXTRACTPS   $3, X14, (SI)(CX*1)
	ADDQ         $4, R10
	ADDQ         R9, BX
	MOVQ         8(SP), AX
	DECQ         R8
	JNZ          q4k5quad
	LEAQ         (BX)(AX*2), BX
	ADDQ         AX, BX
	MOVQ         0(SP), CX
	LEAQ         (R10)(CX*2), R10
	ADDQ         CX, R10
	MOVQ         rows+24(FP), R8
	ANDQ         $3, R8
	JZ           q4k5done

q4k5rows:
	MOVQ   rows+24(FP), R8
	ANDQ   $3, R8
	JZ     q4k5done

q4k5row:
	MOVQ   BX, SI
	MOVQ   a+8(FP), DI
	MOVQ   DX, CX
	VXORPS X14, X14, X14

q4k5loop:
	PF3(SI)
	VMOVDQU      0(SI), X8
	K4DEC(X8, X9, X10, X11)
	VPMOVZXBW    X9, Y10
	VPMADDWD     256(DI), Y10, Y12
	VPDPWSSD     320(DI), Y10, Y12
	K4ROW(SI, Z10, Z28, Z29, Z0)
	FOLD(Z0, Y0, Y4)
	VPHADDD      Y12, Y0, Y0
	VEXTRACTI128 $1, Y0, X4
	VPADDD       X4, X0, X0
	VPHADDD      X0, X0, X0
	VCVTDQ2PS    X0, X0
	VCVTPH2PS    0(SI), X3
	VBROADCASTSS 384(DI), X4
	VMULPS       X4, X3, X3
	VMULPS       X0, X3, X3
	VADDSS       X3, X14, X14
	VMOVSHDUP    X3, X3
	VSUBSS       X3, X14, X14
	ADDQ         $144, SI
	ADDQ         $448, DI
	DECQ         CX
	JNZ          q4k5loop
	VMOVSS X14, 0(R10)
	ADDQ   $4, R10
	ADDQ   R9, BX
	DECQ   R8
	JNZ    q4k5row

q4k5done:
	K4CLEAN
	RET

// func q4KRows4AVX512(w, a0, a1, a2, a3 *byte, nb, rows, rb int, y *float32, ys int)
// For r < rows and j < 4: y[j*ys+r] = genericQ4KDot(w + r*rb, a_j, nb)
// (rows, nb >= 1), a_j as nb q8KP blocks: each weight block is decoded
// once for the 4 activation rows, their sums reduced together (RED4), and
// the float steps run packed on [isum, imin] lane pairs, pair j being
// activation row j's scalar sequence.
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
	VXORPS Y14, Y14, Y14

q4k54loop:
	PF3(SI)
	VMOVDQU       0(SI), X8
	K4DEC(X8, X9, X10, X11)
	VPMOVZXBW     X9, Y10
	VPERMW        Z10, Z28, Z20
	VPERMW        Z10, Z29, Z21
	K4CODES(SI)
	K4DOT(DI, Z0, Z4, Z5, Z6, Z7)
	K4DOT(R11, Z1, Z4, Z5, Z6, Z7)
	K4DOT(R12, Z2, Z4, Z5, Z6, Z7)
	K4DOT(R13, Z3, Z4, Z5, Z6, Z7)
	VPMADDWD      256(DI), Y10, Y12
	VPDPWSSD      320(DI), Y10, Y12
	VPMADDWD      256(R11), Y10, Y9
	VPDPWSSD      320(R11), Y10, Y9
	VINSERTI64X4  $1, Y9, Z12, Z12
	VPMADDWD      256(R12), Y10, Y13
	VPDPWSSD      320(R12), Y10, Y13
	VPMADDWD      256(R13), Y10, Y9
	VPDPWSSD      320(R13), Y10, Y9
	VINSERTI64X4  $1, Y9, Z13, Z13
	RED4(Z0, Z1, Z2, Z3)
	VCVTDQ2PS     Y0, Y0
	VPBROADCASTD  0(SI), X3
	VCVTPH2PS     X3, Y3
	VBROADCASTSS  384(DI), Y4
	VBROADCASTSS  384(R11), Y5
	VBLENDPS      $0x0c, Y5, Y4, Y4
	VBROADCASTSS  384(R12), Y5
	VBLENDPS      $0x30, Y5, Y4, Y4
	VBROADCASTSS  384(R13), Y5
	VBLENDPS      $0xc0, Y5, Y4, Y4
	VMULPS        Y4, Y3, Y3
	VMULPS        Y0, Y3, Y3
	VADDPS        Y3, Y14, Y14
	VPSRLQ        $32, Y3, Y3
	VSUBPS        Y3, Y14, Y14
	ADDQ          $144, SI
	ADDQ          $448, DI
	ADDQ          $448, R11
	ADDQ          $448, R12
	ADDQ          $448, R13
	DECQ          CX
	JNZ           q4k54loop
	VEXTRACTF128 $1, Y14, X4
	VSHUFPS      $0x88, X4, X14, X14
	MOVQ         ys+72(FP), DX
	SHLQ         $2, DX
	MOVQ         R10, BX
	VMOVSS       X14, (BX)
	ADDQ         DX, BX
	VEXTRACTPS   $1, X14, (BX)
	ADDQ         DX, BX
	VEXTRACTPS   $2, X14, (BX)
	ADDQ         DX, BX
	VEXTRACTPS   $3, X14, (BX)
	ADDQ         $4, R10
	ADDQ         rb+56(FP), R8
	DECQ         R9
	JNZ          q4k54rows
	K4CLEAN
	RET

// REDUCE32Z sums the 32 float32 lanes Z0 (lanes 0-15) and Z1 (16-31) into
// X0[0] in reduceLanes' tree: lane i += lane i+16, +8, +4, +2, +1.
#define REDUCE32Z \
	VADDPS        Z1, Z0, Z0 \
	VEXTRACTF64X4 $1, Z0, Y1 \
	VADDPS        Y1, Y0, Y0 \
	VEXTRACTF128  $1, Y0, X1 \
	VADDPS        X1, X0, X0 \
	VPSHUFD       $0x4e, X0, X1 \
	VADDPS        X1, X0, X0 \
	VPSHUFD       $0xb1, X0, X1 \
	VADDSS        X1, X0, X0

// F32TAILMASKS sets K1, K2 to the lanes of the first DX%32 elements of a
// 32-element step (K1: lanes 0-15, K2: 16-31). Clobbers AX, CX.
#define F32TAILMASKS \
	MOVQ  DX, CX \
	MOVL  $1, AX \
	SHLQ  CX, AX \
	DECQ  AX \
	KMOVW AX, K1 \
	SHRQ  $16, AX \
	KMOVW AX, K2

// F32DOT32Z(lbl): Z0, Z1 (lanes 0-15, 16-31) += the products of CX steps
// of 32 floats at SI and DI (VMULPS then VADDPS: rounded like the Go
// code's acc[i%32] += float32(a[i]*b[i])); SI, DI advance.
#define F32DOT32Z(lbl) \
lbl: \
	VMOVUPS 0(SI), Z4 \
	VMOVUPS 64(SI), Z5 \
	VMULPS  0(DI), Z4, Z4 \
	VMULPS  64(DI), Z5, Z5 \
	VADDPS  Z4, Z0, Z0 \
	VADDPS  Z5, Z1, Z1 \
	ADDQ    $128, SI \
	ADDQ    $128, DI \
	DECQ    CX \
	JNZ     lbl

// F32TAILZ adds the products of the DX%32 tail elements at SI, DI into
// their lanes only (loads and adds masked by K1, K2).
#define F32TAILZ \
	VMOVUPS.Z 0(SI), K1, Z4 \
	VMOVUPS.Z 64(SI), K2, Z5 \
	VMOVUPS.Z 0(DI), K1, Z6 \
	VMOVUPS.Z 64(DI), K2, Z7 \
	VMULPS    Z6, Z4, Z4 \
	VMULPS    Z7, Z5, Z5 \
	VADDPS    Z4, Z0, K1, Z0 \
	VADDPS    Z5, Z1, K2, Z1

// func dotF32AVX512(a, b *float32, n int) float32
// genericDotF32 over n >= 1 elements: 32 lanes in two zmm, element i in
// lane i%32, then reduceLanes' tree.
TEXT ·dotF32AVX512(SB), NOSPLIT, $0-28
	MOVQ   a+0(FP), SI
	MOVQ   b+8(FP), DI
	MOVQ   n+16(FP), DX
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	MOVQ   DX, R8
	SHRQ   $5, R8
	ANDQ   $31, DX
	MOVQ   R8, CX
	TESTQ  CX, CX
	JZ     df5tail
	F32DOT32Z(df5loop)

df5tail:
	TESTQ DX, DX
	JZ    df5reduce
	F32TAILMASKS
	F32TAILZ

df5reduce:
	REDUCE32Z
	VMOVSS X0, ret+24(FP)
	VZEROUPPER
	RET

// func dotF32RowsAVX512(x, m *float32, n, rows, stride int, out *float32)
// out[j] = dotF32AVX512(x, m + j*stride, n) for j < rows (rows >= 1, n >=
// 1, stride in floats).
TEXT ·dotF32RowsAVX512(SB), NOSPLIT, $0-48
	MOVQ x+0(FP), R11
	MOVQ m+8(FP), BX
	MOVQ n+16(FP), DX
	MOVQ DX, R12
	SHRQ $5, R12
	ANDQ $31, DX
	MOVQ rows+24(FP), R8
	MOVQ stride+32(FP), R9
	SHLQ $2, R9
	MOVQ out+40(FP), R10
	F32TAILMASKS

df5row:
	MOVQ   R11, SI
	MOVQ   BX, DI
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	MOVQ   R12, CX
	TESTQ  CX, CX
	JZ     df5rtail
	F32DOT32Z(df5rloop)

df5rtail:
	TESTQ DX, DX
	JZ    df5rreduce
	F32TAILZ

df5rreduce:
	REDUCE32Z
	VMOVSS X0, 0(R10)
	ADDQ   $4, R10
	ADDQ   R9, BX
	DECQ   R8
	JNZ    df5row
	VZEROUPPER
	RET

// F32DOT32PF(lbl) is F32DOT32Z with the first operand (SI: a weight row
// read once, from memory) prefetched F32PFD bytes ahead (2 KiB: the 35B
// shape's router region, F32 router and shared gate/up, took 356-366 ms
// per 256 decoded tokens against 376-392 at 1 KiB and 362-366 at 4 KiB,
// alternated).
#define F32PFD 2048
#define F32DOT32PF(lbl) \
lbl: \
	PREFETCHT0 F32PFD(SI) \
	PREFETCHT0 (F32PFD+64)(SI) \
	VMOVUPS    0(SI), Z4 \
	VMOVUPS    64(SI), Z5 \
	VMULPS     0(DI), Z4, Z4 \
	VMULPS     64(DI), Z5, Z5 \
	VADDPS     Z4, Z0, Z0 \
	VADDPS     Z5, Z1, Z1 \
	ADDQ       $128, SI \
	ADDQ       $128, DI \
	DECQ       CX \
	JNZ        lbl

// func f32RowsAVX512(w, x *float32, n, rows, stride int, out *float32)
// out[j] = dotF32AVX512(w + j*stride, x, n) for j < rows (rows >= 1, n >=
// 1, stride in floats): an F32 weight matrix times one activation row,
// each weight row's products w*x in the operand order of DotF32(w, x), the
// weight rows prefetched ahead (dotF32RowsAVX512 serves cached attention
// rows and does not prefetch).
TEXT ·f32RowsAVX512(SB), NOSPLIT, $0-48
	MOVQ w+0(FP), BX
	MOVQ x+8(FP), R11
	MOVQ n+16(FP), DX
	MOVQ DX, R12
	SHRQ $5, R12
	ANDQ $31, DX
	MOVQ rows+24(FP), R8
	MOVQ stride+32(FP), R9
	SHLQ $2, R9
	MOVQ out+40(FP), R10
	F32TAILMASKS

f32wrow:
	MOVQ   BX, SI
	MOVQ   R11, DI
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	MOVQ   R12, CX
	TESTQ  CX, CX
	JZ     f32wtail
	F32DOT32PF(f32wloop)

f32wtail:
	TESTQ DX, DX
	JZ    f32wreduce
	F32TAILZ

f32wreduce:
	REDUCE32Z
	VMOVSS X0, 0(R10)
	ADDQ   $4, R10
	ADDQ   R9, BX
	DECQ   R8
	JNZ    f32wrow
	VZEROUPPER
	RET

// K4MINS(P, M, T): M (ymm) = the 8 mins-term partials of the q8KP block at P
// against the decoded scale words Y10.
#define K4MINS(P, M) \
	VPMADDWD 256(P), Y10, M \
	VPDPWSSD 320(P), Y10, M

// DYPAIR(P, K): lanes 2j, 2j+1 of Z27 (mask K) = the float32 d of the q8KP
// block at P.
#define DYPAIR(P, K) \
	VBROADCASTSS 384(P), Z9 \
	VBLENDMPS    Z9, Z27, K, Z27

// func q4KRows8AVX512(w, a *byte, pb, nb, rows, rb int, y *float32, ys int)
// For r < rows and j < 8: y[j*ys+r] = genericQ4KDot(w + r*rb, a + j*pb,
// nb) (rows, nb >= 1), the 8 activation rows as nb q8KP blocks each, pb
// bytes apart: each weight block is decoded once for 8 activation rows,
// their sums reduced 4 at a time (RED4M) and the float steps run packed on
// 16 lanes of [isum, imin] pairs, pair j being activation row j's scalar
// sequence. Loop state: 0(SP) rows left, 8(SP) &y[r].
TEXT ·q4KRows8AVX512(SB), NOSPLIT, $16-64
	MOVQ rows+32(FP), AX
	MOVQ AX, 0(SP)
	MOVQ y+48(FP), AX
	MOVQ AX, 8(SP)
	MOVQ w+0(FP), R8
	K4SETUP
	MOVL $0x000c, AX
	KMOVW AX, K1
	MOVL $0x0030, AX
	KMOVW AX, K2
	MOVL $0x00c0, AX
	KMOVW AX, K3
	MOVL $0x0300, AX
	KMOVW AX, K4
	MOVL $0x0c00, AX
	KMOVW AX, K5
	MOVL $0x3000, AX
	KMOVW AX, K6
	MOVL $0xc000, AX
	KMOVW AX, K7

q4k58rows:
	MOVQ   R8, SI
	MOVQ   a+8(FP), DI
	MOVQ   pb+16(FP), BX
	LEAQ   (DI)(BX*1), R9
	LEAQ   (DI)(BX*2), R10
	LEAQ   (R9)(BX*2), R11
	LEAQ   (DI)(BX*4), R12
	LEAQ   (R9)(BX*4), R13
	LEAQ   (R10)(BX*4), AX
	LEAQ   (R11)(BX*4), DX
	MOVQ   nb+24(FP), CX
	VXORPS Z30, Z30, Z30

q4k58loop:
	PF3(SI)
	VMOVDQU       0(SI), X8
	K4DEC(X8, X9, X10, X11)
	VPMOVZXBW     X9, Y10
	VPERMW        Z10, Z28, Z20
	VPERMW        Z10, Z29, Z21
	K4CODES(SI)
	K4DOT(DI, Z0, Z4, Z5, Z6, Z7)
	K4DOT(R9, Z1, Z4, Z5, Z6, Z7)
	K4DOT(R10, Z2, Z4, Z5, Z6, Z7)
	K4DOT(R11, Z3, Z4, Z5, Z6, Z7)
	K4DOT(R12, Z22, Z4, Z5, Z6, Z7)
	K4DOT(R13, Z23, Z4, Z5, Z6, Z7)
	K4DOT(AX, Z24, Z4, Z5, Z6, Z7)
	K4DOT(DX, Z26, Z4, Z5, Z6, Z7)
	K4MINS(DI, Y12)
	K4MINS(R9, Y9)
	VINSERTI64X4  $1, Y9, Z12, Z12
	K4MINS(R10, Y13)
	K4MINS(R11, Y9)
	VINSERTI64X4  $1, Y9, Z13, Z13
	K4MINS(R12, Y14)
	K4MINS(R13, Y9)
	VINSERTI64X4  $1, Y9, Z14, Z14
	K4MINS(AX, Y15)
	K4MINS(DX, Y9)
	VINSERTI64X4  $1, Y9, Z15, Z15
	RED4M(Z0, Z1, Z2, Z3, Z12, Z13)
	VMOVDQA64     Y0, Y8
	RED4M(Z22, Z23, Z24, Z26, Z14, Z15)
	VINSERTI64X4  $1, Y0, Z8, Z8
	VCVTDQ2PS     Z8, Z8
	VPBROADCASTD  0(SI), Y3
	VCVTPH2PS     Y3, Z3
	VBROADCASTSS  384(DI), Z27
	DYPAIR(R9, K1)
	DYPAIR(R10, K2)
	DYPAIR(R11, K3)
	DYPAIR(R12, K4)
	DYPAIR(R13, K5)
	DYPAIR(AX, K6)
	DYPAIR(DX, K7)
	VMULPS        Z27, Z3, Z3
	VMULPS        Z8, Z3, Z3
	VADDPS        Z3, Z30, Z30
	VPSRLQ        $32, Z3, Z3
	VSUBPS        Z3, Z30, Z30
	ADDQ          $144, SI
	ADDQ          $448, DI
	ADDQ          $448, R9
	ADDQ          $448, R10
	ADDQ          $448, R11
	ADDQ          $448, R12
	ADDQ          $448, R13
	ADDQ          $448, AX
	ADDQ          $448, DX
	DECQ          CX
	JNZ           q4k58loop
	VEXTRACTF64X4 $1, Z30, Y4
	VSHUFPS       $0x88, Y4, Y30, Y30
	VPERMQ        $0xd8, Y30, Y30
	MOVQ          ys+56(FP), DX
	SHLQ          $2, DX
	MOVQ          8(SP), BX
	VMOVSS        X30, (BX)
	ADDQ          DX, BX
	VEXTRACTPS    $1, X30, (BX)
	ADDQ          DX, BX
	VEXTRACTPS    $2, X30, (BX)
	ADDQ          DX, BX
	VEXTRACTPS    $3, X30, (BX)
	ADDQ          DX, BX
	VEXTRACTF32X4 $1, Y30, X4
	VMOVSS        X4, (BX)
	ADDQ          DX, BX
	VEXTRACTPS    $1, X4, (BX)
	ADDQ          DX, BX
	VEXTRACTPS    $2, X4, (BX)
	ADDQ          DX, BX
	VEXTRACTPS    $3, X4, (BX)
	ADDQ          $4, 8(SP)
	ADDQ          rb+40(FP), R8
	DECQ          0(SP)
	JNZ           q4k58rows
	K4CLEAN
	RET

// REDUCE32Z2 is REDUCE32Z on Z2 (lanes 0-15) and Z3 (16-31) into X2[0].
#define REDUCE32Z2 \
	VADDPS        Z3, Z2, Z2 \
	VEXTRACTF64X4 $1, Z2, Y3 \
	VADDPS        Y3, Y2, Y2 \
	VEXTRACTF128  $1, Y2, X3 \
	VADDPS        X3, X2, X2 \
	VPSHUFD       $0x4e, X2, X3 \
	VADDPS        X3, X2, X2 \
	VPSHUFD       $0xb1, X2, X3 \
	VADDSS        X3, X2, X2

// REDUCE32R(ZA, ZB, YA, YB, XA, XB) is REDUCE32Z on ZA, ZB (the sum in
// XA's lane 0; clobbers ZB).
#define REDUCE32R(ZA, ZB, YA, YB, XA, XB) \
	VADDPS        ZB, ZA, ZA \
	VEXTRACTF64X4 $1, ZA, YB \
	VADDPS        YB, YA, YA \
	VEXTRACTF128  $1, YA, XB \
	VADDPS        XB, XA, XA \
	VPSHUFD       $0x4e, XA, XB \
	VADDPS        XB, XA, XA \
	VPSHUFD       $0xb1, XA, XB \
	VADDSS        XB, XA, XA

// DQASTEP(off, P0, P1, A0, A1): one 32-float step of dquad's pass 1 at
// byte offset off of the row at SI and of k at DI: the state scaled by
// decay (Z20) and stored, its products with k added to A0 (lanes 0-15)
// and A1 (16-31).
#define DQASTEP(off, P0, P1, A0, A1) \
	VMULPS  off(SI), Z20, P0 \
	VMULPS  (off+64)(SI), Z20, P1 \
	VMOVUPS P0, off(SI) \
	VMOVUPS P1, (off+64)(SI) \
	VMULPS  off(DI), P0, P0 \
	VMULPS  (off+64)(DI), P1, P1 \
	VADDPS  P0, A0, A0 \
	VADDPS  P1, A1, A1

// DQBSTEP(off, D, P0, P1, A0, A1): one 32-float step of dquad's pass 2 at
// byte offset off of the row at SI, of k at DI and of q at R11: k*d (d in
// D) added to the state (multiply, then add) and stored, its products
// with q added to A0 and A1.
#define DQBSTEP(off, D, P0, P1, A0, A1) \
	VMULPS  off(DI), D, P0 \
	VMULPS  (off+64)(DI), D, P1 \
	VADDPS  off(SI), P0, P0 \
	VADDPS  (off+64)(SI), P1, P1 \
	VMOVUPS P0, off(SI) \
	VMOVUPS P1, (off+64)(SI) \
	VMULPS  off(R11), P0, P0 \
	VMULPS  (off+64)(R11), P1, P1 \
	VADDPS  P0, A0, A0 \
	VADDPS  P1, A1, A1

// DQA(A0, A1, P0, P1, lbl, tlbl, elbl): pass 1 of dquad for the row at
// SI (SI ends at the next row; DI = k): the row scaled by decay (Z20) and stored,
// its products with k summed into A0, A1 (lanes 0-15, 16-31), the n%32
// tail by the masks K1, K2; P0, P1 hold products. Clobbers DI, CX, Z8, Z9.
#define DQA(A0, A1, P0, P1, lbl, tlbl, elbl) \
	MOVQ    R12, CX \
	TESTQ   CX, CX \
	JZ      tlbl \
lbl: \
	DQASTEP(0, P0, P1, A0, A1) \
	ADDQ    $128, SI \
	ADDQ    $128, DI \
	DECQ    CX \
	JNZ     lbl \
tlbl: \
	TESTQ     DX, DX \
	JZ        elbl \
	VMOVUPS.Z 0(SI), K1, P0 \
	VMOVUPS.Z 64(SI), K2, P1 \
	VMULPS    Z20, P0, P0 \
	VMULPS    Z20, P1, P1 \
	VMOVUPS   P0, K1, 0(SI) \
	VMOVUPS   P1, K2, 64(SI) \
	VMOVUPS.Z 0(DI), K1, Z8 \
	VMOVUPS.Z 64(DI), K2, Z9 \
	VMULPS    Z8, P0, P0 \
	VMULPS    Z9, P1, P1 \
	VADDPS    P0, A0, K1, A0 \
	VADDPS    P1, A1, K2, A1 \
	LEAQ      (SI)(DX*4), SI \
elbl:

// DQB(D, A0, A1, P0, P1, lbl, tlbl, elbl): pass 2 of dquad for the row
// at SI with d in D (SI ends at the next row; DI = k, R11 = q): k*d added to the row
// (multiply, then add) and stored, its products with q summed into A0,
// A1 as DQA does. Clobbers DI, R11, CX, Z8, Z9, Z18, Z19.
#define DQB(D, A0, A1, P0, P1, lbl, tlbl, elbl) \
	MOVQ    R12, CX \
	TESTQ   CX, CX \
	JZ      tlbl \
lbl: \
	DQBSTEP(0, D, P0, P1, A0, A1) \
	ADDQ    $128, SI \
	ADDQ    $128, DI \
	ADDQ    $128, R11 \
	DECQ    CX \
	JNZ     lbl \
tlbl: \
	TESTQ     DX, DX \
	JZ        elbl \
	VMOVUPS.Z 0(DI), K1, Z8 \
	VMOVUPS.Z 64(DI), K2, Z9 \
	VMULPS    Z8, D, P0 \
	VMULPS    Z9, D, P1 \
	VMOVUPS.Z 0(SI), K1, Z18 \
	VMOVUPS.Z 64(SI), K2, Z19 \
	VADDPS    Z18, P0, P0 \
	VADDPS    Z19, P1, P1 \
	VMOVUPS   P0, K1, 0(SI) \
	VMOVUPS   P1, K2, 64(SI) \
	VMOVUPS.Z 0(R11), K1, Z8 \
	VMOVUPS.Z 64(R11), K2, Z9 \
	VMULPS    Z8, P0, P0 \
	VMULPS    Z9, P1, P1 \
	VADDPS    P0, A0, K1, A0 \
	VADDPS    P1, A1, K2, A1 \
	LEAQ      (SI)(DX*4), SI \
elbl:

// DPFD is the software prefetch distance in bytes along a delta-rule state.
#ifndef DPFD
#define DPFD 4096
#endif

// DQA128(A0, A1) is DQA for a row of n = 128 floats (Qwen3.5's
// SSMState), unrolled: the same steps in the same order, four registers
// of products (Z10..Z17) in flight.
#define DQA128(A0, A1) \
	PREFETCHT0 DPFD(SI) \
	PREFETCHT0 (DPFD+64)(SI) \
	PREFETCHT0 (DPFD+128)(SI) \
	PREFETCHT0 (DPFD+192)(SI) \
	PREFETCHT0 (DPFD+256)(SI) \
	PREFETCHT0 (DPFD+320)(SI) \
	PREFETCHT0 (DPFD+384)(SI) \
	PREFETCHT0 (DPFD+448)(SI) \
	DQASTEP(0, Z10, Z11, A0, A1) \
	DQASTEP(128, Z12, Z13, A0, A1) \
	DQASTEP(256, Z14, Z15, A0, A1) \
	DQASTEP(384, Z16, Z17, A0, A1) \
	ADDQ    $512, SI

// DQB128(D, A0, A1) is DQB for a row of n = 128 floats, unrolled (Z10..Z17).
#define DQB128(D, A0, A1) \
	DQBSTEP(0, D, Z10, Z11, A0, A1) \
	DQBSTEP(128, D, Z12, Z13, A0, A1) \
	DQBSTEP(256, D, Z14, Z15, A0, A1) \
	DQBSTEP(384, D, Z16, Z17, A0, A1) \
	ADDQ    $512, SI

// func deltaRuleAVX512(st, q, k, v, o *float32, n, rows int, beta, decay, scale float32)
// genericDeltaRule for n, rows >= 1: per state row j (n floats at st +
// j*n), pass 1 scales the row by decay, stores it and sums its products
// with k into 32 lanes (dotF32AVX512's order, tail by masks K1, K2);
// d = (v[j] - sum) * beta; pass 2 adds k*d (multiply, then add), stores
// the row and sums its products with q; o[j] = sum * scale. Registers:
// BX row, R8 rows left, R9 row bytes, R10 &o[j], R13 &v[j], R12 steps of
// 32, DX tail, Z20 decay, X21 scale, X22 beta, Z23 d. Groups of four
// rows go through dquad (one row's reductions' latency overlaps the
// other rows' work), each pass reading its four rows in address order
// (a cold 128 x 128 head in 3.7-4.5 us instead of 8.3-10.2 with the rows
// interleaved step by step, BenchmarkDeltaRuleCold; rows of 128 floats,
// Qwen3.5's, go through the unrolled DQA128 and DQB128, which keep a warm
// head at the interleaved code's 1.9-2.3 us), then a pair left through dpair
// and an odd last row through drow's single-row code. DQA128 prefetches
// the state DPFD bytes ahead (past the head's end, into the next head's
// state where a caller's heads lie side by side) and the kernel's entry
// the first DPFD bytes: a cold head in 2.7-2.9 us instead of 4.6 (on the
// AMD EPYC Turin guest; 7.5 % less CPU per token in the 35B shape's
// decode, BenchmarkRealModel tg32).
TEXT ·deltaRuleAVX512(SB), NOSPLIT, $0-68
	MOVQ         st+0(FP), BX
	MOVQ         v+24(FP), R13
	MOVQ         o+32(FP), R10
	MOVQ         n+40(FP), DX
	MOVQ         DX, R9
	SHLQ         $2, R9
	MOVQ         DX, R12
	SHRQ         $5, R12
	ANDQ         $31, DX
	MOVQ         rows+48(FP), R8
	VMOVSS       beta+56(FP), X22
	VBROADCASTSS decay+60(FP), Z20
	VMOVSS       scale+64(FP), X21
	F32TAILMASKS
	// The first DPFD bytes of the state: DQA128's prefetches run DPFD
	// ahead, so without these the head's first rows wait on memory one
	// demand miss after another.
	MOVQ BX, SI
	MOVQ $(DPFD/256), CX

dwarm:
	PREFETCHT0 (SI)
	PREFETCHT0 64(SI)
	PREFETCHT0 128(SI)
	PREFETCHT0 192(SI)
	ADDQ       $256, SI
	DECQ       CX
	JNZ        dwarm

drow:
	CMPQ   R8, $4
	JGE    dquad
	CMPQ   R8, $2
	JGE    dpair
	MOVQ   BX, SI
	MOVQ   k+16(FP), DI
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	MOVQ   R12, CX
	TESTQ  CX, CX
	JZ     datail

daloop:
	VMULPS  0(SI), Z20, Z4
	VMULPS  64(SI), Z20, Z5
	VMOVUPS Z4, 0(SI)
	VMOVUPS Z5, 64(SI)
	VMULPS  0(DI), Z4, Z4
	VMULPS  64(DI), Z5, Z5
	VADDPS  Z4, Z0, Z0
	VADDPS  Z5, Z1, Z1
	ADDQ    $128, SI
	ADDQ    $128, DI
	DECQ    CX
	JNZ     daloop

datail:
	TESTQ     DX, DX
	JZ        dareduce
	VMOVUPS.Z 0(SI), K1, Z4
	VMOVUPS.Z 64(SI), K2, Z5
	VMULPS    Z20, Z4, Z4
	VMULPS    Z20, Z5, Z5
	VMOVUPS   Z4, K1, 0(SI)
	VMOVUPS   Z5, K2, 64(SI)
	VMOVUPS.Z 0(DI), K1, Z6
	VMOVUPS.Z 64(DI), K2, Z7
	VMULPS    Z6, Z4, Z4
	VMULPS    Z7, Z5, Z5
	VADDPS    Z4, Z0, K1, Z0
	VADDPS    Z5, Z1, K2, Z1

dareduce:
	REDUCE32Z
	VMOVSS       0(R13), X2
	VSUBSS       X0, X2, X2
	VMULSS       X22, X2, X2
	VBROADCASTSS X2, Z23
	MOVQ         BX, SI
	MOVQ         k+16(FP), DI
	MOVQ         q+8(FP), R11
	VXORPS       Z0, Z0, Z0
	VXORPS       Z1, Z1, Z1
	MOVQ         R12, CX
	TESTQ        CX, CX
	JZ           dbtail

dbloop:
	VMULPS  0(DI), Z23, Z4
	VMULPS  64(DI), Z23, Z5
	VADDPS  0(SI), Z4, Z4
	VADDPS  64(SI), Z5, Z5
	VMOVUPS Z4, 0(SI)
	VMOVUPS Z5, 64(SI)
	VMULPS  0(R11), Z4, Z4
	VMULPS  64(R11), Z5, Z5
	VADDPS  Z4, Z0, Z0
	VADDPS  Z5, Z1, Z1
	ADDQ    $128, SI
	ADDQ    $128, DI
	ADDQ    $128, R11
	DECQ    CX
	JNZ     dbloop

dbtail:
	TESTQ     DX, DX
	JZ        dbreduce
	VMOVUPS.Z 0(DI), K1, Z4
	VMOVUPS.Z 64(DI), K2, Z5
	VMULPS    Z23, Z4, Z4
	VMULPS    Z23, Z5, Z5
	VMOVUPS.Z 0(SI), K1, Z6
	VMOVUPS.Z 64(SI), K2, Z7
	VADDPS    Z6, Z4, Z4
	VADDPS    Z7, Z5, Z5
	VMOVUPS   Z4, K1, 0(SI)
	VMOVUPS   Z5, K2, 64(SI)
	VMOVUPS.Z 0(R11), K1, Z6
	VMOVUPS.Z 64(R11), K2, Z7
	VMULPS    Z6, Z4, Z4
	VMULPS    Z7, Z5, Z5
	VADDPS    Z4, Z0, K1, Z0
	VADDPS    Z5, Z1, K2, Z1

dbreduce:
	REDUCE32Z
	VMULSS X21, X0, X0
	VMOVSS X0, 0(R10)
	ADDQ   $4, R10
	ADDQ   $4, R13
	ADDQ   R9, BX
	DECQ   R8
	JNZ    drow
	VZEROUPPER
	RET

	// Four rows at once (rows j..j+3 from BX; accumulators Z0..Z7, d in
	// Z24..Z27): the same operations per row, four independent chains, so
	// that the reductions' latency of one row overlaps the others' work.
	// Each pass runs the four rows one after the other (DQA, DQB), so
	// that the state is read in address order, as the hardware prefetchers
	// follow it: interleaving the rows step by step read 4 runs 512 bytes
	// apart, which took a cold head twice as long (BenchmarkDeltaRuleCold).
dquad:
	VXORPS        Z0, Z0, Z0
	VXORPS        Z1, Z1, Z1
	VXORPS        Z2, Z2, Z2
	VXORPS        Z3, Z3, Z3
	VXORPS        Z4, Z4, Z4
	VXORPS        Z5, Z5, Z5
	VXORPS        Z6, Z6, Z6
	VXORPS        Z7, Z7, Z7
	MOVQ          BX, SI
	MOVQ          k+16(FP), DI
	CMPQ          R9, $512
	JNE           dqagen
	DQA128(Z0, Z1)
	DQA128(Z2, Z3)
	DQA128(Z4, Z5)
	DQA128(Z6, Z7)
	JMP           dqared

dqagen:
	DQA(Z0, Z1, Z10, Z11, dqa0, dqa0t, dqa0e)
	MOVQ          k+16(FP), DI
	DQA(Z2, Z3, Z12, Z13, dqa1, dqa1t, dqa1e)
	MOVQ          k+16(FP), DI
	DQA(Z4, Z5, Z14, Z15, dqa2, dqa2t, dqa2e)
	MOVQ          k+16(FP), DI
	DQA(Z6, Z7, Z16, Z17, dqa3, dqa3t, dqa3e)

dqared:
	REDUCE32R(Z0, Z1, Y0, Y1, X0, X1)
	REDUCE32R(Z2, Z3, Y2, Y3, X2, X3)
	REDUCE32R(Z4, Z5, Y4, Y5, X4, X5)
	REDUCE32R(Z6, Z7, Y6, Y7, X6, X7)
	VMOVSS        0(R13), X10
	VSUBSS        X0, X10, X10
	VMULSS        X22, X10, X10
	VBROADCASTSS  X10, Z24
	VMOVSS        4(R13), X11
	VSUBSS        X2, X11, X11
	VMULSS        X22, X11, X11
	VBROADCASTSS  X11, Z25
	VMOVSS        8(R13), X12
	VSUBSS        X4, X12, X12
	VMULSS        X22, X12, X12
	VBROADCASTSS  X12, Z26
	VMOVSS        12(R13), X13
	VSUBSS        X6, X13, X13
	VMULSS        X22, X13, X13
	VBROADCASTSS  X13, Z27
	VXORPS        Z0, Z0, Z0
	VXORPS        Z1, Z1, Z1
	VXORPS        Z2, Z2, Z2
	VXORPS        Z3, Z3, Z3
	VXORPS        Z4, Z4, Z4
	VXORPS        Z5, Z5, Z5
	VXORPS        Z6, Z6, Z6
	VXORPS        Z7, Z7, Z7
	MOVQ          BX, SI
	MOVQ          k+16(FP), DI
	MOVQ          q+8(FP), R11
	CMPQ          R9, $512
	JNE           dqbgen
	DQB128(Z24, Z0, Z1)
	DQB128(Z25, Z2, Z3)
	DQB128(Z26, Z4, Z5)
	DQB128(Z27, Z6, Z7)
	JMP           dqbred

dqbgen:
	DQB(Z24, Z0, Z1, Z10, Z11, dqb0, dqb0t, dqb0e)
	MOVQ          k+16(FP), DI
	MOVQ          q+8(FP), R11
	DQB(Z25, Z2, Z3, Z12, Z13, dqb1, dqb1t, dqb1e)
	MOVQ          k+16(FP), DI
	MOVQ          q+8(FP), R11
	DQB(Z26, Z4, Z5, Z14, Z15, dqb2, dqb2t, dqb2e)
	MOVQ          k+16(FP), DI
	MOVQ          q+8(FP), R11
	DQB(Z27, Z6, Z7, Z16, Z17, dqb3, dqb3t, dqb3e)

dqbred:
	REDUCE32R(Z0, Z1, Y0, Y1, X0, X1)
	REDUCE32R(Z2, Z3, Y2, Y3, X2, X3)
	REDUCE32R(Z4, Z5, Y4, Y5, X4, X5)
	REDUCE32R(Z6, Z7, Y6, Y7, X6, X7)
	VMULSS        X21, X0, X0
	VMOVSS        X0, 0(R10)
	VMULSS        X21, X2, X2
	VMOVSS        X2, 4(R10)
	VMULSS        X21, X4, X4
	VMOVSS        X4, 8(R10)
	VMULSS        X21, X6, X6
	VMOVSS        X6, 12(R10)
	ADDQ          $16, R10
	ADDQ          $16, R13
	LEAQ          (BX)(R9*4), BX
	SUBQ          $4, R8
	JNZ           drow
	VZEROUPPER    
	RET           

	// Two rows at once (rows j and j+1 at BX, AX; accumulators Z0, Z1
	// and Z2, Z3; d in Z23, Z24): the same operations per row, two
	// independent chains to overlap.
dpair:
	MOVQ   BX, SI
	LEAQ   (BX)(R9*1), AX
	MOVQ   k+16(FP), DI
	VXORPS Z0, Z0, Z0
	VXORPS Z1, Z1, Z1
	VXORPS Z2, Z2, Z2
	VXORPS Z3, Z3, Z3
	MOVQ   R12, CX
	TESTQ  CX, CX
	JZ     dpatail

dpaloop:
	VMULPS  0(SI), Z20, Z4
	VMULPS  64(SI), Z20, Z5
	VMULPS  0(AX), Z20, Z6
	VMULPS  64(AX), Z20, Z7
	VMOVUPS Z4, 0(SI)
	VMOVUPS Z5, 64(SI)
	VMOVUPS Z6, 0(AX)
	VMOVUPS Z7, 64(AX)
	VMOVUPS 0(DI), Z8
	VMOVUPS 64(DI), Z9
	VMULPS  Z8, Z4, Z4
	VMULPS  Z9, Z5, Z5
	VMULPS  Z8, Z6, Z6
	VMULPS  Z9, Z7, Z7
	VADDPS  Z4, Z0, Z0
	VADDPS  Z5, Z1, Z1
	VADDPS  Z6, Z2, Z2
	VADDPS  Z7, Z3, Z3
	ADDQ    $128, SI
	ADDQ    $128, AX
	ADDQ    $128, DI
	DECQ    CX
	JNZ     dpaloop

dpatail:
	TESTQ     DX, DX
	JZ        dpareduce
	VMOVUPS.Z 0(SI), K1, Z4
	VMOVUPS.Z 64(SI), K2, Z5
	VMOVUPS.Z 0(AX), K1, Z6
	VMOVUPS.Z 64(AX), K2, Z7
	VMULPS    Z20, Z4, Z4
	VMULPS    Z20, Z5, Z5
	VMULPS    Z20, Z6, Z6
	VMULPS    Z20, Z7, Z7
	VMOVUPS   Z4, K1, 0(SI)
	VMOVUPS   Z5, K2, 64(SI)
	VMOVUPS   Z6, K1, 0(AX)
	VMOVUPS   Z7, K2, 64(AX)
	VMOVUPS.Z 0(DI), K1, Z8
	VMOVUPS.Z 64(DI), K2, Z9
	VMULPS    Z8, Z4, Z4
	VMULPS    Z9, Z5, Z5
	VMULPS    Z8, Z6, Z6
	VMULPS    Z9, Z7, Z7
	VADDPS    Z4, Z0, K1, Z0
	VADDPS    Z5, Z1, K2, Z1
	VADDPS    Z6, Z2, K1, Z2
	VADDPS    Z7, Z3, K2, Z3

dpareduce:
	REDUCE32Z2
	REDUCE32Z
	VMOVSS       0(R13), X4
	VSUBSS       X0, X4, X4
	VMULSS       X22, X4, X4
	VBROADCASTSS X4, Z23
	VMOVSS       4(R13), X5
	VSUBSS       X2, X5, X5
	VMULSS       X22, X5, X5
	VBROADCASTSS X5, Z24
	MOVQ         BX, SI
	LEAQ         (BX)(R9*1), AX
	MOVQ         k+16(FP), DI
	MOVQ         q+8(FP), R11
	VXORPS       Z0, Z0, Z0
	VXORPS       Z1, Z1, Z1
	VXORPS       Z2, Z2, Z2
	VXORPS       Z3, Z3, Z3
	MOVQ         R12, CX
	TESTQ        CX, CX
	JZ           dpbtail

dpbloop:
	VMOVUPS 0(DI), Z8
	VMOVUPS 64(DI), Z9
	VMULPS  Z8, Z23, Z4
	VMULPS  Z9, Z23, Z5
	VMULPS  Z8, Z24, Z6
	VMULPS  Z9, Z24, Z7
	VADDPS  0(SI), Z4, Z4
	VADDPS  64(SI), Z5, Z5
	VADDPS  0(AX), Z6, Z6
	VADDPS  64(AX), Z7, Z7
	VMOVUPS Z4, 0(SI)
	VMOVUPS Z5, 64(SI)
	VMOVUPS Z6, 0(AX)
	VMOVUPS Z7, 64(AX)
	VMOVUPS 0(R11), Z8
	VMOVUPS 64(R11), Z9
	VMULPS  Z8, Z4, Z4
	VMULPS  Z9, Z5, Z5
	VMULPS  Z8, Z6, Z6
	VMULPS  Z9, Z7, Z7
	VADDPS  Z4, Z0, Z0
	VADDPS  Z5, Z1, Z1
	VADDPS  Z6, Z2, Z2
	VADDPS  Z7, Z3, Z3
	ADDQ    $128, SI
	ADDQ    $128, AX
	ADDQ    $128, DI
	ADDQ    $128, R11
	DECQ    CX
	JNZ     dpbloop

dpbtail:
	TESTQ     DX, DX
	JZ        dpbreduce
	VMOVUPS.Z 0(DI), K1, Z8
	VMOVUPS.Z 64(DI), K2, Z9
	VMULPS    Z8, Z23, Z4
	VMULPS    Z9, Z23, Z5
	VMULPS    Z8, Z24, Z6
	VMULPS    Z9, Z24, Z7
	VMOVUPS.Z 0(SI), K1, Z10
	VMOVUPS.Z 64(SI), K2, Z11
	VMOVUPS.Z 0(AX), K1, Z12
	VMOVUPS.Z 64(AX), K2, Z13
	VADDPS    Z10, Z4, Z4
	VADDPS    Z11, Z5, Z5
	VADDPS    Z12, Z6, Z6
	VADDPS    Z13, Z7, Z7
	VMOVUPS   Z4, K1, 0(SI)
	VMOVUPS   Z5, K2, 64(SI)
	VMOVUPS   Z6, K1, 0(AX)
	VMOVUPS   Z7, K2, 64(AX)
	VMOVUPS.Z 0(R11), K1, Z8
	VMOVUPS.Z 64(R11), K2, Z9
	VMULPS    Z8, Z4, Z4
	VMULPS    Z9, Z5, Z5
	VMULPS    Z8, Z6, Z6
	VMULPS    Z9, Z7, Z7
	VADDPS    Z4, Z0, K1, Z0
	VADDPS    Z5, Z1, K2, Z1
	VADDPS    Z6, Z2, K1, Z2
	VADDPS    Z7, Z3, K2, Z3

dpbreduce:
	REDUCE32Z2
	REDUCE32Z
	VMULSS X21, X0, X0
	VMOVSS X0, 0(R10)
	VMULSS X21, X2, X2
	VMOVSS X2, 4(R10)
	ADDQ   $8, R10
	ADDQ   $8, R13
	LEAQ   (BX)(R9*2), BX
	SUBQ   $2, R8
	JNZ    drow
	VZEROUPPER
	RET

// q8kbsperm: VPERMD indices putting the bsums of q8KQuantAVX512's 4x4
// reduction (lane L, dword c = group 4c+L) in group order.
DATA q8kbsperm<>+0(SB)/4, $0
DATA q8kbsperm<>+4(SB)/4, $4
DATA q8kbsperm<>+8(SB)/4, $8
DATA q8kbsperm<>+12(SB)/4, $12
DATA q8kbsperm<>+16(SB)/4, $1
DATA q8kbsperm<>+20(SB)/4, $5
DATA q8kbsperm<>+24(SB)/4, $9
DATA q8kbsperm<>+28(SB)/4, $13
DATA q8kbsperm<>+32(SB)/4, $2
DATA q8kbsperm<>+36(SB)/4, $6
DATA q8kbsperm<>+40(SB)/4, $10
DATA q8kbsperm<>+44(SB)/4, $14
DATA q8kbsperm<>+48(SB)/4, $3
DATA q8kbsperm<>+52(SB)/4, $7
DATA q8kbsperm<>+56(SB)/4, $11
DATA q8kbsperm<>+60(SB)/4, $15
GLOBL q8kbsperm<>(SB), RODATA|NOPTR, $64

// func q8KQuantAVX512(x *float32, dst *byte, nb int) int
// quantizeQ8KBlock for nb blocks of 256 floats at x into nb block_q8_K at
// dst, stopping before the first block holding a NaN (the count of
// blocks written is returned; the caller converts that block in Go).
// Per block: amax as the integer maximum of the |x| bit patterns (the
// float order for non-NaN values; a pattern above 0x7f800000 is a NaN),
// max = the first x whose |x| equals it (quantizeQ8KBlock's strict >
// scan), iscale = -127/max and d = 1/iscale (VDIVSS: Go's float32
// division), q = (bits(iscale*x + 12582912) & 0x7fffff) - 0x400000
// (nearestInt: multiply, then add, each rounded), min(q, 127), low byte;
// bsums by VPDPBUSD of the codes with ones, then pairwise word sums.
TEXT ·q8KQuantAVX512(SB), NOSPLIT, $0-32
	MOVQ         x+0(FP), SI
	MOVQ         dst+8(FP), DI
	MOVQ         nb+16(FP), DX
	XORQ         AX, AX
	MOVL         $0x7fffffff, CX
	VPBROADCASTD CX, Z30
	MOVL         $0x4b400000, CX
	VPBROADCASTD CX, Z29
	MOVL         $0x007fffff, CX
	VPBROADCASTD CX, Z28
	MOVL         $0x00400000, CX
	VPBROADCASTD CX, Z27
	MOVL         $127, CX
	VPBROADCASTD CX, Z26
	MOVL         $0x01010101, CX
	VPBROADCASTD CX, Z25
	MOVL         $0x00010001, CX
	VPBROADCASTD CX, Z24
	VMOVDQU32    q8kbsperm<>(SB), Z23
	VPXORD       Z22, Z22, Z22

qkblock:
	CMPQ AX, DX
	JGE  qkdone
	VPANDD       0(SI), Z30, Z0
	VPANDD       64(SI), Z30, Z1
	VPANDD       128(SI), Z30, Z2
	VPANDD       192(SI), Z30, Z3
	VPANDD       256(SI), Z30, Z4
	VPANDD       320(SI), Z30, Z5
	VPANDD       384(SI), Z30, Z6
	VPANDD       448(SI), Z30, Z7
	VPANDD       512(SI), Z30, Z8
	VPANDD       576(SI), Z30, Z9
	VPANDD       640(SI), Z30, Z10
	VPANDD       704(SI), Z30, Z11
	VPANDD       768(SI), Z30, Z12
	VPANDD       832(SI), Z30, Z13
	VPANDD       896(SI), Z30, Z14
	VPANDD       960(SI), Z30, Z15
	VPMAXUD      Z1, Z0, Z16
	VPMAXUD      Z3, Z2, Z17
	VPMAXUD      Z4, Z16, Z16
	VPMAXUD      Z5, Z17, Z17
	VPMAXUD      Z6, Z16, Z16
	VPMAXUD      Z7, Z17, Z17
	VPMAXUD      Z8, Z16, Z16
	VPMAXUD      Z9, Z17, Z17
	VPMAXUD      Z10, Z16, Z16
	VPMAXUD      Z11, Z17, Z17
	VPMAXUD      Z12, Z16, Z16
	VPMAXUD      Z13, Z17, Z17
	VPMAXUD      Z14, Z16, Z16
	VPMAXUD      Z15, Z17, Z17
	VPMAXUD       Z17, Z16, Z16
	VEXTRACTI64X4 $1, Z16, Y17
	VPMAXUD       Y17, Y16, Y16
	VEXTRACTI32X4 $1, Y16, X17
	VPMAXUD       X17, X16, X16
	VPSHUFD       $0x4e, X16, X17
	VPMAXUD       X17, X16, X16
	VPSHUFD       $0xb1, X16, X17
	VPMAXUD       X17, X16, X16
	VMOVD         X16, CX
	CMPL          CX, $0x7f800000
	JHI           qkdone
	TESTL         CX, CX
	JZ            qkzero
	VPBROADCASTD  X16, Z16
	VPCMPEQD     Z16, Z0, K1
	KMOVW        K1, BX
	MOVQ         $0, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z1, K1
	KMOVW        K1, BX
	MOVQ         $16, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z2, K1
	KMOVW        K1, BX
	MOVQ         $32, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z3, K1
	KMOVW        K1, BX
	MOVQ         $48, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z4, K1
	KMOVW        K1, BX
	MOVQ         $64, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z5, K1
	KMOVW        K1, BX
	MOVQ         $80, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z6, K1
	KMOVW        K1, BX
	MOVQ         $96, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z7, K1
	KMOVW        K1, BX
	MOVQ         $112, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z8, K1
	KMOVW        K1, BX
	MOVQ         $128, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z9, K1
	KMOVW        K1, BX
	MOVQ         $144, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z10, K1
	KMOVW        K1, BX
	MOVQ         $160, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z11, K1
	KMOVW        K1, BX
	MOVQ         $176, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z12, K1
	KMOVW        K1, BX
	MOVQ         $192, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z13, K1
	KMOVW        K1, BX
	MOVQ         $208, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z14, K1
	KMOVW        K1, BX
	MOVQ         $224, R8
	TESTL        BX, BX
	JNZ          qkfound
	VPCMPEQD     Z16, Z15, K1
	KMOVW        K1, BX
	MOVQ         $240, R8
	TESTL        BX, BX
	JNZ          qkfound
	JMP           qkdone // unreachable: amax is one of the |x|

qkfound:
	TZCNTL       BX, BX
	ADDQ         R8, BX
	VMOVSS       (SI)(BX*4), X17
	MOVL         $0xc2fe0000, CX // -127
	VMOVD        CX, X18
	VDIVSS       X17, X18, X18
	MOVL         $0x3f800000, CX // 1
	VMOVD        CX, X19
	VDIVSS       X18, X19, X19
	VMOVSS       X19, 0(DI)
	VBROADCASTSS X18, Z18
	VMULPS       0(SI), Z18, Z0
	VADDPS       Z29, Z0, Z0
	VPANDD       Z28, Z0, Z0
	VPSUBD       Z27, Z0, Z0
	VPMINSD      Z26, Z0, Z0
	VPMOVDB      Z0, 4(DI)
	VMULPS       64(SI), Z18, Z1
	VADDPS       Z29, Z1, Z1
	VPANDD       Z28, Z1, Z1
	VPSUBD       Z27, Z1, Z1
	VPMINSD      Z26, Z1, Z1
	VPMOVDB      Z1, 20(DI)
	VMULPS       128(SI), Z18, Z2
	VADDPS       Z29, Z2, Z2
	VPANDD       Z28, Z2, Z2
	VPSUBD       Z27, Z2, Z2
	VPMINSD      Z26, Z2, Z2
	VPMOVDB      Z2, 36(DI)
	VMULPS       192(SI), Z18, Z3
	VADDPS       Z29, Z3, Z3
	VPANDD       Z28, Z3, Z3
	VPSUBD       Z27, Z3, Z3
	VPMINSD      Z26, Z3, Z3
	VPMOVDB      Z3, 52(DI)
	VMULPS       256(SI), Z18, Z4
	VADDPS       Z29, Z4, Z4
	VPANDD       Z28, Z4, Z4
	VPSUBD       Z27, Z4, Z4
	VPMINSD      Z26, Z4, Z4
	VPMOVDB      Z4, 68(DI)
	VMULPS       320(SI), Z18, Z5
	VADDPS       Z29, Z5, Z5
	VPANDD       Z28, Z5, Z5
	VPSUBD       Z27, Z5, Z5
	VPMINSD      Z26, Z5, Z5
	VPMOVDB      Z5, 84(DI)
	VMULPS       384(SI), Z18, Z6
	VADDPS       Z29, Z6, Z6
	VPANDD       Z28, Z6, Z6
	VPSUBD       Z27, Z6, Z6
	VPMINSD      Z26, Z6, Z6
	VPMOVDB      Z6, 100(DI)
	VMULPS       448(SI), Z18, Z7
	VADDPS       Z29, Z7, Z7
	VPANDD       Z28, Z7, Z7
	VPSUBD       Z27, Z7, Z7
	VPMINSD      Z26, Z7, Z7
	VPMOVDB      Z7, 116(DI)
	VMULPS       512(SI), Z18, Z8
	VADDPS       Z29, Z8, Z8
	VPANDD       Z28, Z8, Z8
	VPSUBD       Z27, Z8, Z8
	VPMINSD      Z26, Z8, Z8
	VPMOVDB      Z8, 132(DI)
	VMULPS       576(SI), Z18, Z9
	VADDPS       Z29, Z9, Z9
	VPANDD       Z28, Z9, Z9
	VPSUBD       Z27, Z9, Z9
	VPMINSD      Z26, Z9, Z9
	VPMOVDB      Z9, 148(DI)
	VMULPS       640(SI), Z18, Z10
	VADDPS       Z29, Z10, Z10
	VPANDD       Z28, Z10, Z10
	VPSUBD       Z27, Z10, Z10
	VPMINSD      Z26, Z10, Z10
	VPMOVDB      Z10, 164(DI)
	VMULPS       704(SI), Z18, Z11
	VADDPS       Z29, Z11, Z11
	VPANDD       Z28, Z11, Z11
	VPSUBD       Z27, Z11, Z11
	VPMINSD      Z26, Z11, Z11
	VPMOVDB      Z11, 180(DI)
	VMULPS       768(SI), Z18, Z12
	VADDPS       Z29, Z12, Z12
	VPANDD       Z28, Z12, Z12
	VPSUBD       Z27, Z12, Z12
	VPMINSD      Z26, Z12, Z12
	VPMOVDB      Z12, 196(DI)
	VMULPS       832(SI), Z18, Z13
	VADDPS       Z29, Z13, Z13
	VPANDD       Z28, Z13, Z13
	VPSUBD       Z27, Z13, Z13
	VPMINSD      Z26, Z13, Z13
	VPMOVDB      Z13, 212(DI)
	VMULPS       896(SI), Z18, Z14
	VADDPS       Z29, Z14, Z14
	VPANDD       Z28, Z14, Z14
	VPSUBD       Z27, Z14, Z14
	VPMINSD      Z26, Z14, Z14
	VPMOVDB      Z14, 228(DI)
	VMULPS       960(SI), Z18, Z15
	VADDPS       Z29, Z15, Z15
	VPANDD       Z28, Z15, Z15
	VPSUBD       Z27, Z15, Z15
	VPMINSD      Z26, Z15, Z15
	VPMOVDB      Z15, 244(DI)
	VPXORD       Z0, Z0, Z0
	VPXORD       Z1, Z1, Z1
	VPXORD       Z2, Z2, Z2
	VPXORD       Z3, Z3, Z3
	VPDPBUSD     4(DI), Z25, Z0
	VPDPBUSD     68(DI), Z25, Z1
	VPDPBUSD     132(DI), Z25, Z2
	VPDPBUSD     196(DI), Z25, Z3
	VPACKSSDW    Z1, Z0, Z4
	VPACKSSDW    Z3, Z2, Z5
	VPMADDWD     Z24, Z4, Z4
	VPMADDWD     Z24, Z5, Z5
	VPACKSSDW    Z5, Z4, Z4
	VPMADDWD     Z24, Z4, Z4
	VPERMD       Z4, Z23, Z4
	VPMOVDW      Z4, 260(DI)
	JMP          qknext

qkzero:
	VMOVDQU64 Z22, 0(DI)
	VMOVDQU64 Z22, 64(DI)
	VMOVDQU64 Z22, 128(DI)
	VMOVDQU64 Z22, 192(DI)
	VMOVDQU64 Z22, 228(DI)

qknext:
	ADDQ $1024, SI
	ADDQ $292, DI
	INCQ AX
	JMP  qkblock

qkdone:
	K4CLEAN
	MOVQ AX, ret+24(FP)
	RET

// func mulAddF32AVX512(dst, x, w *float32, n int)
// dst[i] = dst[i] + x[i]*w[i] for i < n (n >= 1), 16 lanes at a time, the
// tail under a mask: VMULPS x*w then VADDPS dst+product, each rounded,
// with the scalar loop's operand order (x first in the multiply, dst
// first in the add).
TEXT ·mulAddF32AVX512(SB), NOSPLIT, $0-32
	MOVQ dst+0(FP), DI
	MOVQ x+8(FP), SI
	MOVQ w+16(FP), DX
	MOVQ n+24(FP), CX
	CMPQ CX, $16
	JLT  matail

maloop:
	VMOVUPS 0(SI), Z0
	VMULPS  0(DX), Z0, Z0
	VMOVUPS 0(DI), Z1
	VADDPS  Z0, Z1, Z1
	VMOVUPS Z1, 0(DI)
	ADDQ    $64, SI
	ADDQ    $64, DX
	ADDQ    $64, DI
	SUBQ    $16, CX
	CMPQ    CX, $16
	JGE     maloop

matail:
	TESTQ     CX, CX
	JZ        madone
	MOVL      $1, AX
	SHLL      CX, AX
	DECL      AX
	KMOVW     AX, K1
	VMOVUPS.Z 0(SI), K1, Z0
	VMOVUPS.Z 0(DX), K1, Z2
	VMULPS    Z2, Z0, Z0
	VMOVUPS.Z 0(DI), K1, Z1
	VADDPS    Z0, Z1, Z1
	VMOVUPS   Z1, K1, 0(DI)

madone:
	VZEROUPPER
	RET

// func scaleF32AVX512(dst, x *float32, a float32, n int)
// dst[i] = a*x[i] for i < n (n >= 1), 16 lanes at a time, the tail under
// a mask, with the scalar loop's operand order (a first).
TEXT ·scaleF32AVX512(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS a+16(FP), Z2
	MOVQ         n+24(FP), CX
	CMPQ         CX, $16
	JLT          sctail

scloop:
	VMULPS  0(SI), Z2, Z0
	VMOVUPS Z0, 0(DI)
	ADDQ    $64, SI
	ADDQ    $64, DI
	SUBQ    $16, CX
	CMPQ    CX, $16
	JGE     scloop

sctail:
	TESTQ     CX, CX
	JZ        scdone
	MOVL      $1, AX
	SHLL      CX, AX
	DECL      AX
	KMOVW     AX, K1
	VMOVUPS.Z 0(SI), K1, Z0
	VMULPS    Z0, Z2, Z0
	VMOVUPS   Z0, K1, 0(DI)

scdone:
	VZEROUPPER
	RET

// func scaleAddF32AVX512(dst, x *float32, a float32, n int)
// dst[i] = dst[i] + a*x[i] for i < n (n >= 1), 16 lanes at a time, the
// tail under a mask: VMULPS a*x then VADDPS dst+product, each rounded,
// with the scalar loop's operand order (a first in the multiply, dst
// first in the add).
TEXT ·scaleAddF32AVX512(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         x+8(FP), SI
	VBROADCASTSS a+16(FP), Z2
	MOVQ         n+24(FP), CX
	CMPQ         CX, $16
	JLT          satail

saloop:
	VMULPS  0(SI), Z2, Z0
	VMOVUPS 0(DI), Z1
	VADDPS  Z0, Z1, Z1
	VMOVUPS Z1, 0(DI)
	ADDQ    $64, SI
	ADDQ    $64, DI
	SUBQ    $16, CX
	CMPQ    CX, $16
	JGE     saloop

satail:
	TESTQ     CX, CX
	JZ        sadone
	MOVL      $1, AX
	SHLL      CX, AX
	DECL      AX
	KMOVW     AX, K1
	VMOVUPS.Z 0(SI), K1, Z0
	VMULPS    Z0, Z2, Z0
	VMOVUPS.Z 0(DI), K1, Z1
	VADDPS    Z0, Z1, Z1
	VMOVUPS   Z1, K1, 0(DI)

sadone:
	VZEROUPPER
	RET
