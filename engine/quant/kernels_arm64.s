//go:build !noasm

// NEON kernels for package quant (hand-written Go assembly). Instructions
// the Go assembler lacks (SMULL, SADDLP, SADALP, vector FMUL/FADD) are
// emitted as WORDs, each with its disassembly (encodings checked with
// aarch64-linux-gnu-as). FMLA is deliberately not used: products are
// rounded before the add, like the pure-Go code.

#include "textflag.h"

// func dotF32LanesNEON(a, b *float32, n int, acc *[32]float32)
// acc[l] += a[i]*b[i] for i%32 == l (lanes 4k..4k+3 in V<k>); n a multiple
// of 32.
TEXT ·dotF32LanesNEON(SB), NOSPLIT, $0-32
	MOVD a+0(FP), R0
	MOVD b+8(FP), R1
	MOVD n+16(FP), R2
	MOVD acc+24(FP), R3
	VLD1 (R3), [V0.S4, V1.S4, V2.S4, V3.S4]
	ADD  $64, R3, R4
	VLD1 (R4), [V4.S4, V5.S4, V6.S4, V7.S4]
	LSR  $5, R2, R2
	CBZ  R2, f32done

f32loop:
	VLD1.P 64(R0), [V16.S4, V17.S4, V18.S4, V19.S4]
	VLD1.P 64(R0), [V20.S4, V21.S4, V22.S4, V23.S4]
	VLD1.P 64(R1), [V24.S4, V25.S4, V26.S4, V27.S4]
	VLD1.P 64(R1), [V28.S4, V29.S4, V30.S4, V31.S4]
	WORD $0x6e38de10 // FMUL V16.4S, V16.4S, V24.4S
	WORD $0x6e39de31 // FMUL V17.4S, V17.4S, V25.4S
	WORD $0x6e3ade52 // FMUL V18.4S, V18.4S, V26.4S
	WORD $0x6e3bde73 // FMUL V19.4S, V19.4S, V27.4S
	WORD $0x6e3cde94 // FMUL V20.4S, V20.4S, V28.4S
	WORD $0x6e3ddeb5 // FMUL V21.4S, V21.4S, V29.4S
	WORD $0x6e3eded6 // FMUL V22.4S, V22.4S, V30.4S
	WORD $0x6e3fdef7 // FMUL V23.4S, V23.4S, V31.4S
	WORD $0x4e30d400 // FADD V0.4S, V0.4S, V16.4S
	WORD $0x4e31d421 // FADD V1.4S, V1.4S, V17.4S
	WORD $0x4e32d442 // FADD V2.4S, V2.4S, V18.4S
	WORD $0x4e33d463 // FADD V3.4S, V3.4S, V19.4S
	WORD $0x4e34d484 // FADD V4.4S, V4.4S, V20.4S
	WORD $0x4e35d4a5 // FADD V5.4S, V5.4S, V21.4S
	WORD $0x4e36d4c6 // FADD V6.4S, V6.4S, V22.4S
	WORD $0x4e37d4e7 // FADD V7.4S, V7.4S, V23.4S
	SUBS $1, R2, R2
	BNE  f32loop

f32done:
	VST1 [V0.S4, V1.S4, V2.S4, V3.S4], (R3)
	VST1 [V4.S4, V5.S4, V6.S4, V7.S4], (R4)
	RET

// func q8_0SumsNEON(w, a *byte, nb int, out *int32)
// out[b] = sum_j int8(w.qs[j]) * int8(a.qs[j]) for nb >= 1 blocks of 34
// bytes: exact 16-bit products (SMULL, |p| <= 16384), pairwise widened to
// 32 bits (SADDLP/SADALP), then ADDV.
TEXT ·q8_0SumsNEON(SB), NOSPLIT, $0-32
	MOVD w+0(FP), R0
	MOVD a+8(FP), R1
	MOVD nb+16(FP), R2
	MOVD out+24(FP), R3

q8loop:
	ADD  $2, R0, R4
	ADD  $2, R1, R5
	VLD1 (R4), [V0.B16, V1.B16]
	VLD1 (R5), [V2.B16, V3.B16]
	WORD $0x0e22c004 // SMULL  V4.8H, V0.8B, V2.8B
	WORD $0x4e22c005 // SMULL2 V5.8H, V0.16B, V2.16B
	WORD $0x0e23c026 // SMULL  V6.8H, V1.8B, V3.8B
	WORD $0x4e23c027 // SMULL2 V7.8H, V1.16B, V3.16B
	WORD $0x4e602890 // SADDLP V16.4S, V4.8H
	WORD $0x4e6068b0 // SADALP V16.4S, V5.8H
	WORD $0x4e6068d0 // SADALP V16.4S, V6.8H
	WORD $0x4e6068f0 // SADALP V16.4S, V7.8H
	VADDV V16.S4, V16
	VMOV  V16.S[0], R6
	MOVW  R6, (R3)
	ADD   $4, R3
	ADD   $34, R0
	ADD   $34, R1
	SUBS  $1, R2, R2
	BNE   q8loop
	RET
