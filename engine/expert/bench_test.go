package expert

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// pooledStack returns n matrices of rows x cols of type t, assembled from
// 64 quantized random rows (the bytes differ per matrix position, so reads
// are not served from cache any more than real weights would be).
func pooledStack(b *testing.B, rng *rand.Rand, t quant.Type, n, rows, cols int) []byte {
	rb, err := t.RowBytes(cols)
	if err != nil {
		b.Fatal(err)
	}
	const pool = 64
	x := make([]float32, pool*cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	p := make([]byte, pool*rb)
	if err := quant.Quantize(t, x, p); err != nil {
		b.Fatal(err)
	}
	out := make([]byte, n*rows*rb)
	for r := range n * rows {
		k := rng.IntN(pool)
		copy(out[r*rb:(r+1)*rb], p[k*rb:(k+1)*rb])
	}
	return out
}

// BenchmarkLocalQwen3_30B measures the expert function (what a worker
// sells) on one Qwen3-30B-A3B layer (128 experts of d 2048, FFN 768, Q4_K,
// 340 MB) with GOMAXPROCS goroutines at batches of 1 (a decode step, top-8),
// 8, 64 and 512 rows, cycling through the experts so that weights come from
// memory. GB/s counts the weight bytes of the distinct experts each call
// reads (once per call, however many rows route to an expert); rows/s the
// input rows.
func BenchmarkLocalQwen3_30B(b *testing.B) {
	const ne, d, dff, k = 128, 2048, 768, 8
	rng := rand.New(rand.NewPCG(1, 2))
	l, err := StackedLayer(ne, d, dff, quant.Q4_K, pooledStack(b, rng, quant.Q4_K, ne, dff, d),
		quant.Q4_K, pooledStack(b, rng, quant.Q4_K, ne, dff, d), quant.Q4_K, pooledStack(b, rng, quant.Q4_K, ne, d, dff))
	if err != nil {
		b.Fatal(err)
	}
	c, err := NewLocal([]*Layer{l}, 0)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{1, 8, 64, 512} {
		b.Run(fmt.Sprintf("batch=%d", n), func(b *testing.B) {
			x := make([]float32, n*d)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			ids := make([]int32, n*k)
			out := make([]float32, n*k*d)
			distinct := 0
			b.ResetTimer()
			for it := 0; it < b.N; it++ {
				seen := map[int32]bool{}
				for r := range n {
					for s := range k {
						ids[r*k+s] = int32((it*k*n + r*k + s) * 37 % ne)
						seen[ids[r*k+s]] = true
					}
				}
				distinct += len(seen)
				if err := c.ComputeExperts(context.Background(), 0, x, ids, n, k, out); err != nil {
					b.Fatal(err)
				}
			}
			bytes := float64(distinct) * float64(l.ExpertBytes())
			b.ReportMetric(bytes/b.Elapsed().Seconds()/1e9, "GB/s")
			b.ReportMetric(float64(b.N*n)/b.Elapsed().Seconds(), "rows/s")
		})
	}
}
