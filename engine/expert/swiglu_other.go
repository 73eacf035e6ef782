//go:build noasm || !amd64

package expert

// swigluFast has no kernel in this build: SwiGLU runs in Go.
func swigluFast(dst, gate, up []float32) int { return 0 }

// siluFast has no kernel in this build: SiLU runs in Go.
func siluFast(dst, x []float32) int { return 0 }

// gateSigmoidFast has no kernel in this build: GateSigmoid runs in Go.
func gateSigmoidFast(dst, gate []float32) int { return 0 }

// expShiftedFast has no kernel in this build: ExpShifted runs in Go.
func expShiftedFast(dst, src []float32, m float32) int { return 0 }
