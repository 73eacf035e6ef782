package expert

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/cputime"
	"github.com/kvasir-ai/kvasir/engine/gguf"

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

// BenchmarkLocalQwen35Decode measures one decode step's routed experts
// (n = 1, top-8) on the Qwen3.5-35B-A3B expert shape (d 2048, FFN 512,
// Q4_K; 64 experts, 113 MB, cycled so that weights come from memory) on
// 1 and 2 goroutines. cpu-ns/KB is the process CPU time per KiB of expert
// weights read (steady on a shared machine; the model's DeltaNet
// projections reach about 31 at one goroutine, see quant's
// BenchmarkKernelShapes), GB/s the wall-clock rate.
func BenchmarkLocalQwen35Decode(b *testing.B) {
	const ne, d, dff, k = 64, 2048, 512, 8
	rng := rand.New(rand.NewPCG(3, 4))
	l, err := StackedLayer(ne, d, dff, quant.Q4_K, pooledStack(b, rng, quant.Q4_K, ne, dff, d),
		quant.Q4_K, pooledStack(b, rng, quant.Q4_K, ne, dff, d), quant.Q4_K, pooledStack(b, rng, quant.Q4_K, ne, d, dff))
	if err != nil {
		b.Fatal(err)
	}
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads=%d", th), func(b *testing.B) {
			c, err := NewLocal([]*Layer{l}, th)
			if err != nil {
				b.Fatal(err)
			}
			x := make([]float32, d)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			ids := make([]int32, k)
			out := make([]float32, k*d)
			it := 0
			cpu0 := cputime.Used()
			for b.Loop() {
				for s := range k {
					ids[s] = int32((it*k + s) % ne)
				}
				it++
				if err := c.ComputeExperts(context.Background(), 0, x, ids, 1, k, out); err != nil {
					b.Fatal(err)
				}
			}
			kb := float64(b.N) * k * float64(l.ExpertBytes()) / 1024
			b.ReportMetric(kb*1024/b.Elapsed().Seconds()/1e9, "GB/s")
			if c := cputime.Used() - cpu0; cpu0 > 0 {
				b.ReportMetric(float64(c.Nanoseconds())/kb, "cpu-ns/KB")
			}
		})
	}
}

// BenchmarkLocalFile measures one decode step's routed experts (n = 1,
// top-8 drawn at random per layer) on the experts of the first two MoE
// layers of the GGUF file named by KVASIR_BENCH_MODEL (skipped when
// unset; two layers keep the pages read, 0.9 GB on the Qwen3.5-35B-A3B
// shape, in the page cache of a small machine), alternating between them,
// on 1 and 2 goroutines. "mmap" reads the weights where the model reads
// them (the file's mapping: 4 KiB page-cache pages), "heap" from an
// anonymous copy of the first layer's (transparent huge pages where the
// kernel gives them; 453 MB on the 35B shape): the difference is what
// the TLB costs. cpu-ns/KB as BenchmarkLocalQwen35Decode's.
func BenchmarkLocalFile(b *testing.B) {
	path := os.Getenv("KVASIR_BENCH_MODEL")
	if path == "" {
		b.Skip("KVASIR_BENCH_MODEL not set: no model file to read experts from")
	}
	f, err := gguf.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	var layers []*Layer
	for blk := 0; blk < 64 && len(layers) < 2; blk++ {
		if l, err := FromGGUF(f, blk); err == nil {
			layers = append(layers, l)
		}
	}
	if len(layers) == 0 {
		b.Skip("no expert layers in " + path)
	}
	mapped := layers
	for _, mem := range []string{"mmap", "heap"} {
		layers := mapped
		if mem == "heap" {
			c := *mapped[0]
			for _, p := range []*Proj{&c.Gate, &c.Up, &c.Down} {
				ex := make([][]byte, len(p.Expert))
				for e, w := range p.Expert {
					ex[e] = append([]byte(nil), w...)
				}
				p.Expert = ex
			}
			layers = []*Layer{&c}
		}
		benchLocalLayers(b, mem, layers)
	}
}

// benchLocalLayers is BenchmarkLocalFile's decode-step loop over layers.
func benchLocalLayers(b *testing.B, name string, layers []*Layer) {
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprintf("%s/threads=%d", name, th), func(b *testing.B) {
			c, err := NewLocal(layers, th)
			if err != nil {
				b.Fatal(err)
			}
			l0 := layers[0]
			const k = 8
			rng := rand.New(rand.NewPCG(5, 6))
			x := make([]float32, l0.DModel)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			ids := make([]int32, k)
			out := make([]float32, k*l0.DModel)
			it := 0
			cpu0 := cputime.Used()
			for b.Loop() {
				perm := rng.Perm(l0.NExpert)
				for s := range k {
					ids[s] = int32(perm[s])
				}
				if err := c.ComputeExperts(context.Background(), it%len(layers), x, ids, 1, k, out); err != nil {
					b.Fatal(err)
				}
				it++
			}
			kb := float64(b.N) * k * float64(l0.ExpertBytes()) / 1024
			b.ReportMetric(kb*1024/b.Elapsed().Seconds()/1e9, "GB/s")
			if c := cputime.Used() - cpu0; cpu0 > 0 {
				b.ReportMetric(float64(c.Nanoseconds())/kb, "cpu-ns/KB")
			}
		})
	}
}
