package model

import (
	"math"
	"testing"
)

// TestTopP32: a threshold that rounds to 0 in float32 stays positive (the
// filter on, keeping the top token); others convert as float32 does.
func TestTopP32(t *testing.T) {
	for _, c := range []struct {
		in   float64
		want float32
	}{{1, 1}, {0.9, 0.9}, {1e-30, 1e-30}, {1e-300, math.SmallestNonzeroFloat32}, {1e-46, math.SmallestNonzeroFloat32}} {
		if got := TopP32(c.in); got != c.want || got <= 0 {
			t.Errorf("TopP32(%g) = %g, want %g", c.in, got, c.want)
		}
	}
}
