package expert

import (
	"context"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// TestWeightedSumRounding checks WeightedSum against values worked by hand
// where the order and the rounding of its operations decide the result.
func TestWeightedSumRounding(t *testing.T) {
	a := float32(1 + 1.0/4096) // 1 + 2^-12: a*a = 1 + 2^-11 + 2^-24, a tie rounded to 1 + 2^-11
	cases := []struct {
		name string
		outs []float32 // 1 row, k slots of d = 1
		w    []float32
		want float32
	}{
		// Products rounded before the add: -(1+2^-11) + float32(a*a) = 0;
		// a fused multiply-add would keep 2^-24.
		{"no fma", []float32{-(1 + 1.0/2048), a}, []float32{1, a}, 0},
		// Slots added left to right in float32: (1e8 + 1) rounds to 1e8
		// (ulp 8), then - 1e8 = 0; any other order gives 1.
		{"slot order", []float32{1e8, 1, -1e8}, []float32{1, 1, 1}, 0},
		{"weights", []float32{2, 4}, []float32{0.25, 0.5}, 2.5},
		{"one slot", []float32{3}, []float32{-0.5}, -1.5},
	}
	for _, c := range cases {
		k := len(c.w)
		dst := []float32{float32(math.NaN())}
		WeightedSum(dst, c.outs, c.w, k, 1)
		if math.Float32bits(dst[0]) != math.Float32bits(c.want) {
			t.Errorf("%s: %v (%#08x), want %v", c.name, dst[0], math.Float32bits(dst[0]), c.want)
		}
	}
}

// TestWeightedSumRows: rows and columns are independent, each the sum of
// its own slots (the same as one row at a time).
func TestWeightedSumRows(t *testing.T) {
	const n, k, d = 3, 2, 4
	outs := make([]float32, n*k*d)
	w := make([]float32, n*k)
	for i := range outs {
		outs[i] = float32(i%7) - 2.5
	}
	for i := range w {
		w[i] = float32(i+1) / 8
	}
	all := make([]float32, n*d)
	WeightedSum(all, outs, w, k, d)
	for r := range n {
		one := make([]float32, d)
		WeightedSum(one, outs[r*k*d:(r+1)*k*d], w[r*k:(r+1)*k], k, d)
		for j := range d {
			want := w[r*k]*outs[r*k*d+j] + w[r*k+1]*outs[(r*k+1)*d+j] // exact in float32 here (eighths of halves)
			if all[r*d+j] != one[j] || all[r*d+j] != want {
				t.Fatalf("row %d col %d: %v, one row %v, want %v", r, j, all[r*d+j], one[j], want)
			}
		}
	}
}

// TestComputeSumFallback: ComputeSum over a Computer without sums is
// ComputeExperts followed by WeightedSum, bit for bit, on the
// experts of a synthetic Q8_0 layer; and a SumComputer's own method is
// used when there is one.
func TestComputeSumFallback(t *testing.T) {
	s := synthLayer(t, quant.Q8_0, 8, 64, 64, 3)
	l, err := NewLocal([]*Layer{s.l}, 1)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3
	d, k := s.d, 2
	hidden, ids := randRows(rand.New(rand.NewPCG(7, 7)), n, d, k, s.nExpert)
	w := []float32{0.7, 0.3, 0.55, 0.45, 0.125, 0.875}
	pairs := make([]float32, n*k*d)
	if err := l.ComputeExperts(context.Background(), 0, hidden, ids, n, k, pairs); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, n*d)
	WeightedSum(want, pairs, w, k, d)
	got := make([]float32, n*d)
	if err := ComputeSum(context.Background(), l, 0, hidden, ids, w, n, k, got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("out[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	sc := &sumOnly{}
	if err := ComputeSum(context.Background(), sc, 0, hidden, ids, w, n, k, got); err != nil || !sc.summed {
		t.Fatalf("SumComputer not used: %v", err)
	}
	if err := ComputeSum(context.Background(), l, 0, hidden, ids, w[:1], n, k, got); err == nil {
		t.Fatal("ComputeSum accepted 1 weight for 6 slots")
	}
}

type sumOnly struct{ summed bool }

func (*sumOnly) ComputeExperts(context.Context, int, []float32, []int32, int, int, []float32) error {
	panic("ComputeExperts called")
}

func (s *sumOnly) ComputeExpertsSum(context.Context, int, []float32, []int32, []float32, int, int, []float32) error {
	s.summed = true
	return nil
}
