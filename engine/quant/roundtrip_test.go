package quant

import (
	"math"
	"math/rand/v2"
	"testing"
)

// randomRows returns n standard normal floats from a fixed seed.
func randomRows(seed uint64, n int) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

func rmsRel(x, y []float32) float64 {
	var num, den float64
	for i := range x {
		d := float64(x[i]) - float64(y[i])
		num += d * d
		den += float64(x[i]) * float64(x[i])
	}
	return math.Sqrt(num / den)
}

// TestQuantizeRoundTrip bounds the rms relative error of
// Dequantize(Quantize(x)) on standard normal data. A uniform quantizer of
// step D has rms error D/sqrt(12); the expected max |x| of a block of 32
// normals is about 2.1 (256: 2.9; 16: 1.8), so e.g. Q8_0 D = 2.1/127 gives
// 0.48%, Q4_0 (D = amax/8) 7.6%, Q6_K (amax/32 over 16) 1.6%, Q4_1 (range
// 4.1/15) 7.9%. The K-quant fits (make_qkx2_quants) should land below their
// plain min/max counterparts. Bounds are these estimates plus ~15%.
func TestQuantizeRoundTrip(t *testing.T) {
	x := randomRows(7, 16*QK_K)
	cases := []struct {
		t     Type
		bound float64
	}{
		{F32, 0},
		{F16, 1e-3},
		{BF16, 5e-3},
		{Q8_0, 0.006},
		{Q8_1, 0.006},
		{Q8_K, 0.0085},
		{Q6_K, 0.019},
		{Q5_K, 0.038},
		{Q5_0, 0.048},
		{Q5_1, 0.041},
		{Q4_K, 0.076},
		{Q4_0, 0.092},
		{Q4_1, 0.086},
	}
	for _, c := range cases {
		rb, err := c.t.RowBytes(len(x))
		if err != nil {
			t.Fatal(err)
		}
		q := make([]byte, rb)
		if err := Quantize(c.t, x, q); err != nil {
			t.Fatalf("%s: %v", c.t, err)
		}
		y := make([]float32, len(x))
		if err := Dequantize(c.t, q, y); err != nil {
			t.Fatalf("%s: %v", c.t, err)
		}
		e := rmsRel(x, y)
		t.Logf("%-5s rms rel error %.5f (bound %.4f)", c.t, e, c.bound)
		if e > c.bound || math.IsNaN(e) {
			t.Errorf("%s: rms rel error %.5f > %.4f", c.t, e, c.bound)
		}
	}
}
