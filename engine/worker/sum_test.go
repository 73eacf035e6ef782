package worker

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// sumScale is scale with row sums of its own (expert.SumComputer), made
// one row at a time without the N x K x D outputs, as a backend that
// fuses the sum would; calls counts them.
type sumScale struct {
	scale
	calls *atomic.Int64
}

func (s sumScale) ComputeExpertsSum(ctx context.Context, layer int, hidden []float32, ids []int32, weights []float32, n, k int, out []float32) error {
	s.calls.Add(1)
	tmp := make([]float32, k*s.d)
	for r := 0; r < n; r++ {
		if err := s.ComputeExperts(ctx, layer, hidden[r*s.d:(r+1)*s.d], ids[r*k:(r+1)*k], 1, k, tmp); err != nil {
			return err
		}
		expert.WeightedSum(out[r*s.d:(r+1)*s.d], tmp, weights[r*k:(r+1)*k], k, s.d)
	}
	return nil
}

// TestServeSumComputer: a DISPATCH_SUM (and its DIGEST form) to a worker
// whose Computer sums its own outputs is answered by ComputeExpertsSum,
// with the bytes a plain Computer's outputs summed by WeightedSum give.
// Other requests still take ComputeExperts.
func TestServeSumComputer(t *testing.T) {
	const d, k, n = 5, 3, 4
	_, key, _ := ed25519.GenerateKey(nil)
	var calls atomic.Int64
	answers := func(c expert.Computer) [][]byte {
		w, err := New(Config{GatewayURL: "wss://127.0.0.1:1", Key: key, Computer: c, ModelID: "m", Logger: quiet,
			Holdings: []wire.Holding{{Layer: 0, Expert: 0}, {Layer: 0, Expert: 1}, {Layer: 0, Expert: 2}, {Layer: 0, Expert: 3}}})
		if err != nil {
			t.Fatal(err)
		}
		hidden := make([]float32, n*d)
		for i := range hidden {
			hidden[i] = float32(i%7) - 2.75
		}
		ids := []int32{0, 1, 2, 3, 2, 1, 1, 1, 0, 2, 3, 0}
		weights := []float32{0.5, 0.3, 0.2, 0.125, 0.7, 0.175, 0.6, 0.2, 0.2, 0.1, 0.45, 0.45}
		var got [][]byte
		for i, req := range []*wire.Dispatch{
			{Request: 1, N: n, D: d, K: k, Hidden: hidden, IDs: ids, Sum: true, Weights: weights},
			{Request: 2, N: n, D: d, K: k, Hidden: hidden, IDs: ids, Sum: true, Weights: weights, Digest: true},
			{Request: 3, N: n, D: d, K: k, Hidden: hidden, IDs: ids},
		} {
			err := w.serve(context.Background(), req, time.Now(), 0, "s", func(b []byte) error {
				f, err := wire.Decode(b, &wire.Limits{D: d, K: k, NLayer: 1, NExpert: 4})
				if err != nil {
					return err
				}
				if r, ok := f.(*wire.Result); ok {
					r.Timing = wire.Timing{} // the times differ
					b = r.Append(nil)
				}
				got = append(got, bytes.Clone(b))
				return nil
			})
			if err != nil {
				t.Fatalf("request %d: %v", i, err)
			}
		}
		return got
	}
	want := answers(scale{d})
	got := answers(sumScale{scale{d}, &calls})
	if calls.Load() != 2 {
		t.Fatalf("ComputeExpertsSum called %d times, want 2 (the DISPATCH_SUM and its digest form)", calls.Load())
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("answer %d differs from the plain Computer's", i)
		}
	}
}
