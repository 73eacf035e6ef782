package modelgen

import (
	"hash/fnv"
	"math/bits"
	"math/rand/v2"
)

// stream is the random source of one tensor: a PCG generator seeded from
// the spec's seed and the tensor's name, so that every tensor has its own
// stream whatever the order, concurrency or layout (fused or separate) of
// generation.
//
// Every value it returns is computed with integer operations and float
// operations that IEEE 754 defines exactly (conversions of integers below
// 2^53, multiplication by powers of two, and single roundings written with
// explicit conversions), so the weights are the same bits on every GOARCH.
// It deliberately avoids math/rand/v2's NormFloat64 and ExpFloat64 (their
// ziggurat tails call math.Exp and math.Log, which have per-architecture
// assembly, and their float expressions may be fused into FMA instructions
// on arm64) and anything from package math except exact operations.
type stream struct {
	pcg *rand.PCG
}

func newStream(seed uint64, name string) stream {
	h := fnv.New64a()
	h.Write([]byte(name))
	return stream{rand.NewPCG(seed, h.Sum64())}
}

// normal returns an approximately standard normal value: the Irwin-Hall
// sum of 12 independent uniform 32-bit integers, centred and scaled by
// 2^-32. Its mean is -1.4e-9 (the integers' mean is (2^32-1)/2), its
// variance 1 - 2^-64, its support [-6, 6]; the kurtosis is 2.9 instead of
// 3, which random weights do not notice. The sum is below 2^36, so its
// conversion to float64 and the scaling are exact.
func (s stream) normal() float64 {
	var sum uint64
	for range 6 {
		v := s.pcg.Uint64()
		sum += v&0xffffffff + v>>32
	}
	return float64(int64(sum)-6<<32) * 0x1p-32
}

// uniform returns a value in [0, 1) with 24 random bits (exact in float32).
func (s stream) uniform() float32 {
	return float32(s.pcg.Uint64()>>40) * 0x1p-24
}

// intN returns a value in [0, n) (n > 0): the high word of a 64x64-bit
// product, Lemire's multiply-shift without the rejection step (its bias,
// below n/2^64, does not matter here).
func (s stream) intN(n int) int {
	hi, _ := bits.Mul64(s.pcg.Uint64(), uint64(n))
	return int(hi)
}
