// Package quant holds the ggml tensor types that kvasir reads and computes
// with, their block layouts, (de)quantisation, the activation conversions that
// llama.cpp's CPU backend applies before each matrix product, and the dot
// product / matrix product kernels.
//
// Block layouts follow llama.cpp ggml/src/ggml-common.h at commit
// 3f545beccee69d9975f466ec7e45fd9aacd8ba90.
//
// Numerics (vecdot.go): every dot product has one fixed operation order -
// exact integer sums per block, then float32 scale products and a float32
// accumulation, never fused - so MatMul is batch- and thread-invariant and
// the SIMD kernels (amd64: AVX2+F16C in kernels_amd64.s, AVX-512 F/BW/VL/VNNI
// in kernels_avx512_amd64.s; arm64: NEON, with SDOT where the CPU has it,
// in kernels_arm64.s and kernels_rows_arm64.s) give the same
// bits as the pure-Go code (build tag noasm or other GOARCHes), which tests
// check kernel by kernel on every path the CPU has. Results are therefore
// also identical across amd64 and arm64. The path is chosen at run time
// (the best the CPU has); SIMDEnv (KVASIR_SIMD=none|avx2|avx512|neon|dotprod) forces
// one for a whole process, SetSIMDPath for tests and benchmarks.
//
// MatMulConverted validates once per call, then hands whole tiles of weight
// rows to multi-row kernels (matmul.go: vecDotRows for one activation row,
// vecDot4Rows for four; AVX2 for Q4_K, Q6_K, Q8_0 and F16; on AVX-512,
// Q4_K runs 4 weight rows at a time for one activation row and 8 or 4
// activation rows at a time per weight row; NEON/SDOT for Q4_K, Q6_K and
// Q8_0, one or four activation rows per weight block), each element still the
// single-row operation order. Packed float steps in those kernels compute
// lane r exactly as the scalar step for row r would.
package quant

import (
	"errors"
	"fmt"
	"math"
	"strings"
)

// Sentinel errors; functions of this package wrap them with details
// (test with errors.Is).
var (
	// ErrUnknownType: the type id or name is not a ggml type this package knows.
	ErrUnknownType = errors.New("quant: unknown tensor type")
	// ErrUnsupported: the type is known but cannot be used for this operation
	// (e.g. Q2_K weights, or Q8_K as a weight type in VecDot).
	ErrUnsupported = errors.New("quant: unsupported tensor type for this operation")
	// ErrSize: an element count is not a multiple of the block size, or a
	// buffer does not have the length the element count requires.
	ErrSize = errors.New("quant: bad size")
)

// Type is a ggml tensor type id (enum ggml_type in ggml/include/ggml.h). The
// numeric values are the ones stored in GGUF tensor infos.
type Type uint32

// ggml type ids (ggml.h). Only the types listed in blockInfo are known to this
// package; Supported reports which ones it can compute with.
const (
	F32  Type = 0
	F16  Type = 1
	Q4_0 Type = 2
	Q4_1 Type = 3
	Q5_0 Type = 6
	Q5_1 Type = 7
	Q8_0 Type = 8
	Q8_1 Type = 9
	Q2_K Type = 10
	Q3_K Type = 11
	Q4_K Type = 12
	Q5_K Type = 13
	Q6_K Type = 14
	Q8_K Type = 15
	BF16 Type = 30
)

// QK_K is the super-block size of the K-quants (ggml-common.h).
const QK_K = 256

type blockInfo struct {
	name   string
	elems  int // elements per block
	bytes  int // bytes per block
	vecDot Type
}

// Block sizes from ggml-common.h (static_asserts next to each block_* struct).
var blockInfos = [...]blockInfo{
	F32:  {"F32", 1, 4, F32},
	F16:  {"F16", 1, 2, F16},
	BF16: {"BF16", 1, 2, BF16},
	Q4_0: {"Q4_0", 32, 2 + 16, Q8_0},
	Q4_1: {"Q4_1", 32, 2 + 2 + 16, Q8_1},
	Q5_0: {"Q5_0", 32, 2 + 4 + 16, Q8_0},
	Q5_1: {"Q5_1", 32, 2 + 2 + 4 + 16, Q8_1},
	Q8_0: {"Q8_0", 32, 2 + 32, Q8_0},
	Q8_1: {"Q8_1", 32, 2 + 2 + 32, Q8_1},
	Q2_K: {"Q2_K", QK_K, QK_K/16 + QK_K/4 + 2 + 2, Q8_K},
	Q3_K: {"Q3_K", QK_K, QK_K/8 + QK_K/4 + 12 + 2, Q8_K},
	Q4_K: {"Q4_K", QK_K, 2 + 2 + 12 + QK_K/2, Q8_K},
	Q5_K: {"Q5_K", QK_K, 2 + 2 + 12 + QK_K/8 + QK_K/2, Q8_K},
	Q6_K: {"Q6_K", QK_K, QK_K/2 + QK_K/4 + QK_K/16 + 2, Q8_K},
	Q8_K: {"Q8_K", QK_K, 4 + QK_K + QK_K/16*2, Q8_K},
}

// Known reports whether t is a type whose block layout this package knows.
func (t Type) Known() bool { _, ok := t.info(); return ok }

// info returns the block description of t (array lookup: used per row in
// the kernels).
func (t Type) info() (blockInfo, bool) {
	if uint64(t) >= uint64(len(blockInfos)) || blockInfos[t].elems == 0 {
		return blockInfo{}, false
	}
	return blockInfos[t], true
}

// Supported reports whether weights of type t can be dequantised and used in
// matrix products (the types of llama.cpp's Q4_K_M, Q5_K_M, Q6_K and Q8_0
// quantisations of Qwen MoE models).
func (t Type) Supported() bool {
	switch t {
	case F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K:
		return true
	}
	return false
}

// String returns the ggml name of the type ("Q4_K"), or "type(N)" if unknown.
func (t Type) String() string {
	if b, ok := t.info(); ok {
		return b.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// BlockSize returns the number of elements per block (1 for float types), or 0
// for an unknown type.
func (t Type) BlockSize() int { b, _ := t.info(); return b.elems }

// BlockBytes returns the number of bytes per block, or 0 for an unknown type.
func (t Type) BlockBytes() int { b, _ := t.info(); return b.bytes }

// VecDotType returns the type that llama.cpp's CPU backend converts
// activations to before a matrix product with weights of type t
// (type_traits_cpu[t].vec_dot_type in ggml/src/ggml-cpu/ggml-cpu.c).
// It returns 0 (F32) for an unknown type.
func (t Type) VecDotType() Type { b, _ := t.info(); return b.vecDot }

// RowBytes returns the bytes taken by n elements of type t. It fails with
// ErrUnknownType when t is unknown and ErrSize when n is negative or not a
// multiple of the block size.
func (t Type) RowBytes(n int) (int, error) {
	b, ok := t.info()
	if !ok {
		return 0, fmt.Errorf("%w: id %d", ErrUnknownType, uint32(t))
	}
	if n < 0 || n%b.elems != 0 {
		return 0, fmt.Errorf("%w: %d elements is not a multiple of the %s block size %d", ErrSize, n, b.name, b.elems)
	}
	if n/b.elems > math.MaxInt/b.bytes {
		return 0, fmt.Errorf("%w: %d elements of %s overflow int", ErrSize, n, b.name)
	}
	return n / b.elems * b.bytes, nil
}

// ParseType parses a ggml type name such as "Q4_K" or "f16" (case-insensitive);
// unknown names give ErrUnknownType.
func ParseType(s string) (Type, error) {
	for t, b := range blockInfos {
		if b.elems != 0 && strings.EqualFold(b.name, s) {
			return Type(t), nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrUnknownType, s)
}
