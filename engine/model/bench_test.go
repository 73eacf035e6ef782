package model

import (
	"context"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/cputime"
)

// benchDecode measures single-token decode at positions 64.. of one
// sequence (after a 64-token prefill), reporting tok/s, the bytes of
// weights read per token, and with the sequence memory's traffic
// (MemoryBytesPerToken: recurrent state, KV cache) traffic-GB/s.
func benchDecode(b *testing.B, m *Model) {
	ctx := context.Background()
	vocab := m.Params().Vocab
	logits := make([]float32, vocab)
	seq := m.NewSequence()
	prompt := make([]Row, 64)
	for i := range prompt {
		prompt[i] = Row{Seq: seq, Token: int32(i*37) % int32(vocab), Pos: i}
	}
	prompt[63].Logits = true
	if err := m.Forward(ctx, prompt, logits); err != nil {
		b.Fatal(err)
	}
	row := []Row{{Seq: seq, Logits: true}}
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cputime.Used()
	var mem int64 // sequence memory moved, bytes
	for i := 0; i < b.N; i++ {
		if seq.Len() >= 256 && seq.Truncate(64) != nil {
			// A recurrent sequence cannot rewind: prefill it again.
			b.StopTimer()
			_ = seq.Truncate(0)
			if err := m.Forward(ctx, prompt, logits); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
		row[0].Token = Greedy(logits)
		row[0].Pos = seq.Len()
		mem += m.MemoryBytesPerToken(row[0].Pos)
		if err := m.Forward(ctx, row, logits); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, cpu0, b.N)
	reportTraffic(b, m, b.N, mem)
}

// reportTraffic reports tok/s, the bytes of weights per token and their
// rate (GB/s), and the mean bytes of sequence memory per token (memB/tok)
// and weights plus memory per second (traffic-GB/s), for n tokens decoded
// in b.Elapsed() that moved mem bytes of sequence memory in all.
func reportTraffic(b *testing.B, m *Model, n int, mem int64) {
	s := b.Elapsed().Seconds()
	w := float64(m.BytesPerToken())
	b.ReportMetric(float64(n)/s, "tok/s")
	b.ReportMetric(w, "weightB/tok")
	b.ReportMetric(w*float64(n)/s/1e9, "GB/s")
	b.ReportMetric(float64(mem)/float64(n), "memB/tok")
	b.ReportMetric((w*float64(n)+float64(mem))/s/1e9, "traffic-GB/s")
}

// benchPrefill measures a 64-token prompt in one batch (logits for the last
// row only, as llama-bench pp64).
func benchPrefill(b *testing.B, m *Model) {
	ctx := context.Background()
	vocab := m.Params().Vocab
	logits := make([]float32, vocab)
	seq := m.NewSequence()
	prompt := make([]Row, 64)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cputime.Used()
	for i := 0; i < b.N; i++ {
		_ = seq.Truncate(0)
		for j := range prompt {
			prompt[j] = Row{Seq: seq, Token: int32(j*101+i) % int32(vocab), Pos: j, Logits: j == 63}
		}
		if err := m.Forward(ctx, prompt, logits); err != nil {
			b.Fatal(err)
		}
	}
	reportCPU(b, cpu0, 64*b.N)
	b.ReportMetric(float64(64*b.N)/b.Elapsed().Seconds(), "tok/s")
}

// reportCPU reports the process CPU time (user+system, all threads) per
// token since cpu0 as "cpu-us/tok": on a shared machine it tracks the work
// done better than wall time does (wall time also shows how well the
// threads overlap).
func reportCPU(b *testing.B, cpu0 time.Duration, tokens int) {
	if cpu0 == 0 || tokens == 0 {
		return
	}
	b.ReportMetric(float64((cputime.Used()-cpu0).Microseconds())/float64(tokens), "cpu-us/tok")
}

func BenchmarkFixtureQ4KM(b *testing.B) {
	skipNoFixtures(b)
	_, m := loadFixture(b, "tiny-qwen3moe-Q4_K_M")
	b.Run("decode", func(b *testing.B) { benchDecode(b, m) })
	b.Run("prefill64", func(b *testing.B) { benchPrefill(b, m) })
}

// BenchmarkQwen3_30B_A3B_4L runs a 4-layer Q4_K model with Qwen3-30B-A3B
// layer shapes (modelgen preset qwen3-30b-a3b, 1.4 GB) generated in memory
// once per process (writing it to disk first only adds I/O time).
func BenchmarkQwen3_30B_A3B_4L(b *testing.B) {
	m := presetModel(b, &q30, "qwen3-30b-a3b")
	b.Run("decode", func(b *testing.B) { benchDecode(b, m) })
	b.Run("prefill64", func(b *testing.B) { benchPrefill(b, m) })
}

// BenchmarkMemoryBandwidth copies 256 MiB (read + write) to relate tok/s to
// the machine's memory bandwidth; GB/s counts bytes read plus bytes written.
func BenchmarkMemoryBandwidth(b *testing.B) {
	src := make([]byte, 256<<20)
	dst := make([]byte, len(src))
	for i := range src {
		src[i] = byte(i)
	}
	b.SetBytes(int64(2 * len(src)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		copy(dst, src)
	}
}
