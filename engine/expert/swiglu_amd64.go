//go:build !noasm

package expert

import (
	"golang.org/x/sys/cpu"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

//go:noescape
func swigluAVX512(dst, gate, up *float32, n int) int

//go:noescape
func siluAVX512(dst, x *float32, n int) int

//go:noescape
func gateSigmoidAVX512(dst, gate *float32, n int) int

//go:noescape
func expShiftedAVX512(dst, src *float32, n int, m float32) int

// swigluFMA: math.Exp takes its FMA path here (Go's math package uses
// FMA when the CPU has AVX and FMA), which swigluAVX512 reproduces.
var swigluFMA = cpu.X86.HasAVX && cpu.X86.HasFMA

// swigluFast runs swigluAVX512 on the quant package's AVX-512 kernel path
// and returns how many leading elements it did (0: none, do them in Go).
func swigluFast(dst, gate, up []float32) int {
	if !swigluFMA || len(gate) < 8 || quant.SIMDPath() != "avx512" {
		return 0
	}
	return swigluAVX512(&dst[0], &gate[0], &up[0], len(gate))
}

// siluFast runs siluAVX512 on the quant package's AVX-512 kernel path and
// returns how many leading elements it did (0: none, do them in Go).
func siluFast(dst, x []float32) int {
	if !swigluFMA || len(x) < 8 || quant.SIMDPath() != "avx512" {
		return 0
	}
	return siluAVX512(&dst[0], &x[0], len(x))
}

// gateSigmoidFast runs gateSigmoidAVX512 on the quant package's AVX-512
// kernel path and returns how many leading elements it did (0: none, do
// them in Go).
func gateSigmoidFast(dst, gate []float32) int {
	if !swigluFMA || len(gate) < 8 || quant.SIMDPath() != "avx512" {
		return 0
	}
	return gateSigmoidAVX512(&dst[0], &gate[0], len(gate))
}

// expShiftedFast runs expShiftedAVX512 on the quant package's AVX-512
// kernel path and returns how many leading elements it did (0: none, do
// them in Go).
func expShiftedFast(dst, src []float32, m float32) int {
	if !swigluFMA || len(src) < 8 || quant.SIMDPath() != "avx512" {
		return 0
	}
	return expShiftedAVX512(&dst[0], &src[0], len(src), m)
}
