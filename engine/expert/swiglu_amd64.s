//go:build !noasm

#include "textflag.h"

// swigluAVX512: SwiGLU (local.go) on 8 float32 lanes at a time with e^-x
// computed as Go's math.Exp computes it on amd64 with FMA (archExp in
// $GOROOT/src/math/exp_amd64.s: the same float64 operations, fused where it
// fuses, in the same order), for |x| < 700 (the normal range of its
// ldexp); then float32(e), x / (1 + e) * up in float32, as the Go loop.

DATA swexp<>+0(SB)/8, $1.4426950408889634073599246810018920 // LOG2E
DATA swexp<>+8(SB)/8, $0.69314718055966295651160180568695068359375 // LN2U
DATA swexp<>+16(SB)/8, $0.28235290563031577122588448175013436025525412068e-12 // LN2L
DATA swexp<>+24(SB)/8, $0.0625
DATA swexp<>+32(SB)/8, $2.4801587301587301587e-5
DATA swexp<>+40(SB)/8, $1.9841269841269841270e-4
DATA swexp<>+48(SB)/8, $1.3888888888888888889e-3
DATA swexp<>+56(SB)/8, $8.3333333333333333333e-3
DATA swexp<>+64(SB)/8, $4.1666666666666666667e-2
DATA swexp<>+72(SB)/8, $1.6666666666666666667e-1
DATA swexp<>+80(SB)/8, $0.5
DATA swexp<>+88(SB)/8, $1.0
DATA swexp<>+96(SB)/8, $2.0
DATA swexp<>+104(SB)/8, $700.0
GLOBL swexp<>(SB), RODATA|NOPTR, $112

// SWSETUP loads the constants of SWSILU into Z16..Z25.
#define SWSETUP \
	VBROADCASTSD swexp<>+0(SB), Z16 \
	VBROADCASTSD swexp<>+8(SB), Z17 \
	VBROADCASTSD swexp<>+16(SB), Z18 \
	VBROADCASTSD swexp<>+24(SB), Z19 \
	VBROADCASTSD swexp<>+96(SB), Z20 \
	VBROADCASTSD swexp<>+88(SB), Z21 \
	VBROADCASTSD swexp<>+104(SB), Z22 \
	MOVL         $0x3ff, BX \
	VPBROADCASTD BX, Y23 \
	MOVL         $0x3f800000, BX \
	VPBROADCASTD BX, Y24 \
	MOVQ         $0x7fffffffffffffff, BX \
	VPBROADCASTQ BX, Z25

// SWEXP1(done): for the 8 float32 x at (SI)(AX*4), Y0 = x and Y1 = 1 + e
// in float32 with e = float32(math.Exp(-x)) (see above); jumps to done,
// Y0 and Y1 unspecified, when a lane has |x| >= 700 or NaN. Clobbers
// Z2..Z4, K1, K2.
#define SWEXP1(done) \
	VMOVUPS      (SI)(AX*4), Y0 \
	SWEXP0(done) \
	VADDPS       Y24, Y1, Y1

// SWEXP0(done): for the 8 float32 x in Y0, Y1 = e = float32(math.Exp(-x))
// (see above); jumps to done, Y1 unspecified, when a lane has |x| >= 700
// or NaN. Y0 is kept. Clobbers Z2..Z4, K1, K2.
#define SWEXP0(done) \
	VCVTPS2PD    Y0, Z1 \
	VXORPD       Z2, Z2, Z2 \
	VSUBPD       Z1, Z2, Z1 \
	VANDPD       Z25, Z1, Z2 \
	VCMPPD       $0x1d, Z22, Z2, K1 \
	VCMPPD       $0x03, Z1, Z1, K2 \
	KORB         K1, K2, K1 \
	KORTESTB     K1, K1 \
	JNZ          done \
	VMULPD       Z16, Z1, Z2 \
	VCVTPD2DQ    Z2, Y3 \
	VCVTDQ2PD    Y3, Z2 \
	VFNMADD231PD Z17, Z2, Z1 \
	VFNMADD231PD Z18, Z2, Z1 \
	VMULPD       Z19, Z1, Z1 \
	VBROADCASTSD swexp<>+32(SB), Z4 \
	VFMADD213PD.BCST swexp<>+40(SB), Z1, Z4 \
	VFMADD213PD.BCST swexp<>+48(SB), Z1, Z4 \
	VFMADD213PD.BCST swexp<>+56(SB), Z1, Z4 \
	VFMADD213PD.BCST swexp<>+64(SB), Z1, Z4 \
	VFMADD213PD.BCST swexp<>+72(SB), Z1, Z4 \
	VFMADD213PD.BCST swexp<>+80(SB), Z1, Z4 \
	VFMADD213PD      Z21, Z1, Z4 \
	VMULPD       Z4, Z1, Z1 \
	VADDPD       Z20, Z1, Z4 \
	VMULPD       Z4, Z1, Z1 \
	VADDPD       Z20, Z1, Z4 \
	VMULPD       Z4, Z1, Z1 \
	VADDPD       Z20, Z1, Z4 \
	VMULPD       Z4, Z1, Z1 \
	VADDPD       Z20, Z1, Z4 \
	VFMADD213PD  Z21, Z4, Z1 \
	VPADDD       Y23, Y3, Y3 \
	VPMOVSXDQ    Y3, Z3 \
	VPSLLQ       $52, Z3, Z3 \
	VMULPD       Z3, Z1, Z1 \
	VCVTPD2PS    Z1, Y1

// SWSILU(done): Y0 = silu of the 8 float32 at (SI)(AX*4), x / (1 + e)
// (SWEXP1); jumps to done, Y0 unspecified, when a lane has |x| >= 700 or
// NaN. Clobbers Z1..Z4, K1, K2.
#define SWSILU(done) \
	SWEXP1(done) \
	VDIVPS Y1, Y0, Y0

// SWCLEAN zeroes Z16..Z25 before VZEROUPPER (see the quant package's
// K4CLEAN).
#define SWCLEAN \
	VPXORD Z16, Z16, Z16 \
	VPXORD Z17, Z17, Z17 \
	VPXORD Z18, Z18, Z18 \
	VPXORD Z19, Z19, Z19 \
	VPXORD Z20, Z20, Z20 \
	VPXORD Z21, Z21, Z21 \
	VPXORD Z22, Z22, Z22 \
	VPXORD Z23, Z23, Z23 \
	VPXORD Z24, Z24, Z24 \
	VPXORD Z25, Z25, Z25

// func swigluAVX512(dst, gate, up *float32, n int) int
// For 8-lane groups g < n/8 in order: dst[8g:8g+8] = SwiGLU of gate and up
// there, stopping before the first group with a |gate| >= 700 or NaN (the
// caller finishes that group in Go); returns the elements done.
TEXT ·swigluAVX512(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         gate+8(FP), SI
	MOVQ         up+16(FP), DX
	MOVQ         n+24(FP), CX
	SHRQ         $3, CX
	XORQ         AX, AX
	TESTQ        CX, CX
	JZ           swdone
	SWSETUP

swloop:
	SWSILU(swdone)
	VMULPS       (DX)(AX*4), Y0, Y0
	VMOVUPS      Y0, (DI)(AX*4)
	ADDQ         $8, AX
	DECQ         CX
	JNZ          swloop

swdone:
	MOVQ   AX, ret+32(FP)
	SWCLEAN
	VZEROUPPER
	RET

// func siluAVX512(dst, x *float32, n int) int
// For 8-lane groups g < n/8 in order: dst[8g:8g+8] = SiLU of x there (the
// SwiGLU steps without the multiply by up), stopping before the first
// group with a |x| >= 700 or NaN; returns the elements done.
TEXT ·siluAVX512(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         x+8(FP), SI
	MOVQ         n+16(FP), CX
	SHRQ         $3, CX
	XORQ         AX, AX
	TESTQ        CX, CX
	JZ           sidone
	SWSETUP

siloop:
	SWSILU(sidone)
	VMOVUPS      Y0, (DI)(AX*4)
	ADDQ         $8, AX
	DECQ         CX
	JNZ          siloop

sidone:
	MOVQ   AX, ret+24(FP)
	SWCLEAN
	VZEROUPPER
	RET

// func gateSigmoidAVX512(dst, gate *float32, n int) int
// For 8-lane groups g < n/8 in order: dst[i] = dst[i] * (1 / (1 + e)) for
// i in the group, e = float32(math.Exp(-gate[i])) (SWEXP1), each step
// rounded to float32 as the Go loop's, stopping before the first group
// with a |gate| >= 700 or NaN; returns the elements done.
TEXT ·gateSigmoidAVX512(SB), NOSPLIT, $0-32
	MOVQ         dst+0(FP), DI
	MOVQ         gate+8(FP), SI
	MOVQ         n+16(FP), CX
	SHRQ         $3, CX
	XORQ         AX, AX
	TESTQ        CX, CX
	JZ           gsdone
	SWSETUP

gsloop:
	SWEXP1(gsdone)
	VDIVPS       Y1, Y24, Y1
	VMULPS       (DI)(AX*4), Y1, Y1
	VMOVUPS      Y1, (DI)(AX*4)
	ADDQ         $8, AX
	DECQ         CX
	JNZ          gsloop

gsdone:
	MOVQ   AX, ret+24(FP)
	SWCLEAN
	VZEROUPPER
	RET

// func expShiftedAVX512(dst, src *float32, n int, m float32) int
// For 8-lane groups g < n/8 in order: dst[i] = float32(math.Exp(src[i] -
// m)) for i in the group, the difference in float32 as the Go loop's (m -
// src[i], exactly its negation, which SWEXP0 negates back in float64),
// stopping before the first group with a |src[i] - m| >= 700 or NaN;
// returns the elements done.
TEXT ·expShiftedAVX512(SB), NOSPLIT, $0-40
	MOVQ         dst+0(FP), DI
	MOVQ         src+8(FP), SI
	MOVQ         n+16(FP), CX
	VBROADCASTSS m+24(FP), Y5
	SHRQ         $3, CX
	XORQ         AX, AX
	TESTQ        CX, CX
	JZ           exdone
	SWSETUP

exloop:
	VMOVUPS      (SI)(AX*4), Y0
	VSUBPS       Y0, Y5, Y0
	SWEXP0(exdone)
	VMOVUPS      Y1, (DI)(AX*4)
	ADDQ         $8, AX
	DECQ         CX
	JNZ          exloop

exdone:
	MOVQ   AX, ret+32(FP)
	SWCLEAN
	VPXORD Z5, Z5, Z5
	VZEROUPPER
	RET
