package model

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/cputime"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// realModel is the GGUF file of BenchmarkRealModel, opened once per process.
var realModel struct {
	once sync.Once
	m    *Model
	err  error
}

// BenchmarkRealModel measures decode and prefill on a real-size GGUF file,
// named by KVASIR_BENCH_MODEL (skipped when unset; scripts/bench.sh writes
// Q4_K files of the Qwen3-30B-A3B and Qwen3.5-35B-A3B shapes with backbone
// genmodel and runs it on each, alternating with llama-bench), on
// KVASIR_BENCH_THREADS goroutines (default 2), the way llama-bench measures
// llama.cpp:
//
//   - tg32: one iteration decodes 32 tokens one at a time from an empty
//     sequence (llama-bench -n 32); tok/s, weight bytes read per token and
//     their GB/s (tok/s x bytes/token: compare with the memory bandwidth),
//     the sequence memory moved (memB/tok, Model.MemoryBytesPerToken) and
//     weights plus memory per second (traffic-GB/s). Each iteration is
//     paired with the read bandwidth measured (untimed) right before it on
//     KVASIR_BENCH_THREADS goroutines: pair-read-GB/s, and the medians over
//     the pairs of the weight GB/s / that bandwidth (bw-frac) and of the
//     traffic / it (traffic-frac).
//   - pp512: one iteration runs a 512-token prompt as one batch, logits for
//     its last row (llama-bench -p 512); tok/s.
//   - membw, run first: the machine's read bandwidth at that moment
//     (read-GB/s: the better of 1 and 2 goroutines summing a 256 MiB
//     float32 buffer with quant.DotF32, 8 passes per iteration), measured
//     beside the decode rather than minutes before on a machine whose
//     bandwidth varies.
//
// The weights are made resident as `backbone generate` and `serve` make
// them by default when they fit (--resident auto): copied into the
// process's memory, on huge pages where granted (gguf.ResidentCopied);
// KVASIR_BENCH_RESIDENT=mmap|lock|copy chooses (mmap: the file's page
// cache mapping, as before issue 24's round 2).
//
// One untimed iteration first warms the caches (llama-bench also runs one
// warm-up). cpu-us/tok is the process CPU time per token (on a shared
// machine, wall-clock rates are low bounds).
func BenchmarkRealModel(b *testing.B) {
	path := os.Getenv("KVASIR_BENCH_MODEL")
	if path == "" {
		b.Skip("KVASIR_BENCH_MODEL not set: no real-size model to measure")
	}
	realModel.once.Do(func() {
		mode := gguf.ResidentCopied
		if s := os.Getenv("KVASIR_BENCH_RESIDENT"); s != "" {
			if mode, realModel.err = gguf.ParseResidency(s); realModel.err != nil {
				return
			}
		}
		f, err := gguf.Open(path)
		if err != nil {
			realModel.err = err
			return
		}
		if _, err := f.MakeResident(mode, nil); err != nil {
			realModel.err = err
			return
		}
		realModel.m, realModel.err = Load(f)
	})
	if realModel.err != nil {
		b.Fatal(realModel.err)
	}
	m := realModel.m
	threads := 2
	if s := os.Getenv("KVASIR_BENCH_THREADS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			b.Fatalf("KVASIR_BENCH_THREADS=%q: want a positive integer", s)
		}
		threads = n
	}
	m.SetThreads(threads)
	ctx := context.Background()
	vocab := m.Params().Vocab
	logits := make([]float32, vocab)
	// One 256 MiB buffer for the bandwidth measurements (membw and the
	// pairs of tg32), every page touched before timing.
	bwBuf := make([]float32, 256<<20/4)
	for i := range bwBuf {
		bwBuf[i] = float32(i & 255)
	}
	b.Run("membw", func(b *testing.B) {
		best := 0.0
		for _, th := range []int{1, 2} {
			var bytes float64
			t0 := time.Now()
			for range b.N {
				bytes += readPasses(bwBuf, th, 8)
			}
			best = max(best, bytes/time.Since(t0).Seconds()/1e9)
		}
		b.ReportMetric(best, "read-GB/s")
	})
	b.Run("tg32", func(b *testing.B) {
		const n = 32
		seq := m.NewSequence()
		row := []Row{{Seq: seq, Logits: true}}
		gen := func() {
			_ = seq.Truncate(0)
			tok := int32(1)
			for range n {
				row[0].Token, row[0].Pos = tok, seq.Len()
				if err := m.Forward(ctx, row, logits); err != nil {
					b.Fatal(err)
				}
				tok = Greedy(logits)
			}
		}
		var mem int64 // positions 0..n-1, one generation
		for pos := range n {
			mem += m.MemoryBytesPerToken(pos)
		}
		wb := float64(m.BytesPerToken())
		gen()
		b.ResetTimer()
		cpu0 := cputime.Used()
		var cpuOut time.Duration // the pairs' bandwidth passes, not decode
		var bws, fw, ft []float64
		for range b.N {
			// Each generation paired with the read bandwidth right
			// before it (8 passes on the decode's goroutine count,
			// untimed), so that the fractions compare like with like on
			// a host whose bandwidth moves from second to second.
			b.StopTimer()
			c0 := cputime.Used()
			t0 := time.Now()
			bw := readPasses(bwBuf, threads, 8) / time.Since(t0).Seconds() / 1e9
			cpuOut += cputime.Used() - c0
			b.StartTimer()
			t1 := time.Now()
			gen()
			el := time.Since(t1).Seconds()
			bws = append(bws, bw)
			fw = append(fw, n*wb/el/1e9/bw)
			ft = append(ft, (n*wb+float64(mem))/el/1e9/bw)
		}
		reportCPU(b, cpu0+cpuOut, n*b.N)
		reportTraffic(b, m, n*b.N, mem*int64(b.N))
		b.ReportMetric(median(bws), "pair-read-GB/s")
		b.ReportMetric(median(fw), "bw-frac")
		b.ReportMetric(median(ft), "traffic-frac")
	})
	b.Run("pp512", func(b *testing.B) {
		const n = 512
		seq := m.NewSequence()
		prompt := make([]Row, n)
		run := func(it int) {
			_ = seq.Truncate(0)
			for j := range prompt {
				prompt[j] = Row{Seq: seq, Token: int32((j*101 + it + 1) % vocab), Pos: j, Logits: j == n-1}
			}
			if err := m.Forward(ctx, prompt, logits); err != nil {
				b.Fatal(err)
			}
		}
		run(-1)
		b.ResetTimer()
		cpu0 := cputime.Used()
		for i := range b.N {
			run(i)
		}
		reportCPU(b, cpu0, n*b.N)
		b.ReportMetric(float64(n*b.N)/b.Elapsed().Seconds(), "tok/s")
	})
}

// readPasses reads buf passes times, split over threads goroutines
// (quant.DotF32 of each chunk with itself: AVX-512 loads where the CPU
// has them), and returns the bytes read.
func readPasses(buf []float32, threads, passes int) float64 {
	for range passes {
		quant.ParallelFor(len(buf), threads, func(lo, hi int) { _ = quant.DotF32(buf[lo:hi], buf[lo:hi]) })
	}
	return 4 * float64(len(buf)) * float64(passes)
}

// median returns the median of xs (the mean of the middle two for an even
// count; 0 for none), sorting a copy.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
