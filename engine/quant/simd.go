package quant

// The arm64 row kernels (kernels_rows_arm64.s) are generated; llvm-mc encodes
// their NEON instructions.
//go:generate go run neon_gen.go

import (
	"fmt"
	"os"
	"slices"
)

// SIMDEnv is the environment variable that forces a kernel path for the
// whole process: "none" (the pure-Go code), "avx2" or "avx512" on amd64,
// "neon" or "dotprod" (NEON plus the ARMv8.2 SDOT instructions) on arm64.
// Unset or empty: the best path the CPU has. Every path
// gives the same bits (tests hold each to the pure-Go code), so this only
// changes speed; it exists so that each path can be run on a machine that
// would pick another.
const SIMDEnv = "KVASIR_SIMD"

// SIMDPaths returns the kernel paths this build can run on this CPU, best
// first; the last is always "none".
func SIMDPaths() []string { return simdPaths() }

// SIMDPath returns the kernel path in use.
func SIMDPath() string { return simdName() }

// SetSIMDPath switches every kernel to path (one of SIMDPaths) and returns
// the previous path. It is meant for tests and benchmarks: it must not be
// called while another goroutine runs a kernel of this package.
func SetSIMDPath(path string) (string, error) {
	old := simdName()
	if !slices.Contains(simdPaths(), path) {
		return old, fmt.Errorf("%w: kernel path %q not available here (have %v)", ErrUnsupported, path, simdPaths())
	}
	setSIMDPath(path)
	return old, nil
}

func init() {
	if p := os.Getenv(SIMDEnv); p != "" {
		if _, err := SetSIMDPath(p); err != nil {
			fmt.Fprintf(os.Stderr, "quant: %s=%s ignored: %v\n", SIMDEnv, p, err)
		}
	}
}
