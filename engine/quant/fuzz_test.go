package quant

import (
	"encoding/binary"
	"errors"
	"math"
	"testing"
)

// fuzzTypes maps a fuzzer byte to a type id, unknown ids included.
func fuzzType(b uint8) Type {
	ids := []Type{F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, 4, 31, 1000}
	return ids[int(b)%len(ids)]
}

// expectSentinel fails unless err is nil or wraps one of the package's
// sentinel errors.
func expectSentinel(t *testing.T, err error) {
	t.Helper()
	if err != nil && !errors.Is(err, ErrSize) && !errors.Is(err, ErrUnknownType) && !errors.Is(err, ErrUnsupported) {
		t.Fatalf("error without a sentinel: %v", err)
	}
}

// repeatTo returns n bytes made by repeating seed (zeros if seed is empty).
func repeatTo(seed []byte, n int) []byte {
	out := make([]byte, n)
	if len(seed) > 0 {
		for i := range out {
			out[i] = seed[i%len(seed)]
		}
	}
	return out
}

// FuzzDequantize: arbitrary bytes and element counts never panic; a wrong
// length is ErrSize; a valid call fills dst.
func FuzzDequantize(f *testing.F) {
	f.Add(uint8(7), uint16(32), make([]byte, 34))    // valid Q8_0
	f.Add(uint8(11), uint16(256), make([]byte, 144)) // valid Q4_K
	f.Add(uint8(13), uint16(256), make([]byte, 209)) // truncated Q6_K
	f.Add(uint8(13), uint16(256), make([]byte, 300)) // oversized Q6_K
	f.Add(uint8(9), uint16(256), make([]byte, 84))   // Q2_K: unsupported
	f.Add(uint8(15), uint16(3), make([]byte, 12))    // unknown type
	f.Add(uint8(4), uint16(31), make([]byte, 20))    // not a block multiple
	f.Fuzz(func(t *testing.T, tb uint8, n uint16, src []byte) {
		typ := fuzzType(tb)
		dst := make([]float32, int(n)%4096)
		err := Dequantize(typ, src, dst)
		expectSentinel(t, err)
		if err == nil {
			if want, _ := typ.RowBytes(len(dst)); want != len(src) {
				t.Fatalf("%s: accepted %d bytes for %d elements", typ, len(src), len(dst))
			}
		}
		// The same bytes, resized to fit, must decode without error.
		if typ.Known() && typ.BlockSize() > 0 {
			n := len(dst) / typ.BlockSize() * typ.BlockSize()
			rb, _ := typ.RowBytes(n)
			err := Dequantize(typ, repeatTo(src, rb), dst[:n])
			if typ.Supported() || typ == Q8_1 || typ == Q8_K {
				if err != nil {
					t.Fatalf("%s n=%d: %v", typ, n, err)
				}
			} else {
				expectSentinel(t, err)
			}
		}
	})
}

// FuzzConvertActivation: arbitrary floats (NaN, Inf, subnormal) never
// panic, and the output decodes again.
func FuzzConvertActivation(f *testing.F) {
	f.Add(uint8(7), make([]byte, 4*32))
	f.Add(uint8(11), make([]byte, 4*256))
	nan := make([]byte, 4*256)
	for i := 0; i < len(nan); i += 4 {
		binary.LittleEndian.PutUint32(nan[i:], 0x7fc00000+uint32(i))
	}
	f.Add(uint8(13), nan)
	f.Add(uint8(3), nan[:4*32])
	f.Add(uint8(1), []byte{0, 0, 0x80, 0x7f, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, tb uint8, raw []byte) {
		typ := fuzzType(tb)
		x := make([]float32, len(raw)/4)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		ab, err := ActivationBytes(typ, len(x))
		expectSentinel(t, err)
		if err != nil {
			if ConvertActivation(typ, x, make([]byte, 8)) == nil {
				t.Fatalf("%s: ConvertActivation accepted what ActivationBytes refused", typ)
			}
			return
		}
		dst := make([]byte, ab)
		if err := ConvertActivation(typ, x, dst); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
		if err := ConvertActivation(typ, x, make([]byte, ab+1)); !errors.Is(err, ErrSize) {
			t.Fatalf("%s: oversized dst: %v", typ, err)
		}
		back := make([]float32, len(x))
		if err := Dequantize(typ.VecDotType(), dst, back); err != nil {
			t.Fatalf("%s: %v", typ, err)
		}
	})
}

// FuzzVecDot: arbitrary weight and activation bytes (resized to the
// lengths n needs) never panic and give the same bits with and without the
// SIMD kernels; lengths that do not fit are ErrSize.
func FuzzVecDot(f *testing.F) {
	f.Add(uint8(7), uint16(2), []byte{1, 2, 3}, []byte{0x80, 0x7f})
	f.Add(uint8(11), uint16(1), []byte{0xff}, []byte{0x80})
	f.Add(uint8(13), uint16(3), []byte{0x3c, 0x00, 0x55}, []byte{0x00, 0x00, 0x80, 0x3f, 7})
	f.Add(uint8(12), uint16(2), []byte{0x7c, 0x01}, []byte{0xff, 0xff, 0xff, 0x7f})
	f.Add(uint8(1), uint16(33), []byte{0x00, 0x3c}, []byte{0x00, 0xbc})
	f.Fuzz(func(t *testing.T, tb uint8, blocks uint16, w, a []byte) {
		typ := fuzzType(tb)
		if _, err := CheckedVecDot(typ, w, a, len(w)); err == nil && typ.Supported() {
			// raw lengths happen to fit: fine, any value is allowed
		} else {
			expectSentinel(t, err)
		}
		if !typ.Supported() {
			return
		}
		n := (int(blocks)%40 + 1) * typ.BlockSize()
		rb, _ := typ.RowBytes(n)
		ab, _ := ActivationBytes(typ, n)
		ww, aa := repeatTo(w, rb), repeatTo(a, ab)
		got, err := CheckedVecDot(typ, ww, aa, n)
		if err != nil {
			t.Fatalf("%s n=%d: %v", typ, n, err)
		}
		var want float32
		withGeneric(func() { want = VecDot(typ, ww, aa, n) })
		if !sameBits(got, want) {
			t.Fatalf("%s n=%d: simd %g, generic %g", typ, n, got, want)
		}
		if _, err := CheckedVecDot(typ, ww[:rb-1], aa, n); !errors.Is(err, ErrSize) {
			t.Fatalf("%s: short weights: %v", typ, err)
		}
		if _, err := CheckedVecDot(typ, ww, aa[:ab-1], n); !errors.Is(err, ErrSize) {
			t.Fatalf("%s: short activations: %v", typ, err)
		}
	})
}
