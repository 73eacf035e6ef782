package dispatch_test

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/expert"
)

// TestFakeExperts: the stand-in expert function is the formula of its
// doc comment, element by element in float32, and its row sums
// (fusedFake) are the bits of expert.WeightedSum over its outputs.
func TestFakeExperts(t *testing.T) {
	const d, k, n, layer = 2048, 8, 5, 3
	f := &fakeExperts{d: d, nExpert: 128}
	rng := rand.New(rand.NewPCG(1, 2))
	h := make([]float32, n*d)
	for i := range h {
		h[i] = float32(rng.NormFloat64())
	}
	ids := make([]int32, n*k)
	w := make([]float32, n*k)
	for i := range ids {
		ids[i], w[i] = int32(rng.IntN(128)), rng.Float32()
	}
	out := make([]float32, n*k*d)
	if err := f.ComputeExperts(context.Background(), layer, h, ids, n, k, out); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < n; r++ {
		x := h[r*d : (r+1)*d]
		for s := 0; s < k; s++ {
			fe, fl := float32(ids[r*k+s]+1), float32(0.25*layer)
			for j := 0; j < d; j++ {
				want := float32(float32(x[j]*fe)-float32(0.5*x[(j+1)%d])) + fl
				if got := out[(r*k+s)*d+j]; math.Float32bits(got) != math.Float32bits(want) {
					t.Fatalf("row %d slot %d [%d]: %v, want %v", r, s, j, got, want)
				}
			}
		}
	}
	want := make([]float32, n*d)
	expert.WeightedSum(want, out, w, k, d)
	got := make([]float32, n*d)
	if err := (fusedFake{f}).ComputeExpertsSum(context.Background(), layer, h, ids, w, n, k, got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("sum [%d]: %v, want %v", i, got[i], want[i])
		}
	}
}
