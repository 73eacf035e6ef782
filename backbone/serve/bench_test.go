package serve

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/engine/cputime"
	"github.com/kvasir-ai/kvasir/engine/idlespin"
)

// benchRTT is the simulated round trip: 13 ms, or KVASIR_BENCH_RTT_MS.
func benchRTT() time.Duration {
	if v, err := strconv.Atoi(os.Getenv("KVASIR_BENCH_RTT_MS")); err == nil && v >= 0 {
		return time.Duration(v) * time.Millisecond
	}
	return 13 * time.Millisecond
}

// benchTokens is max_tokens per request: 16, or KVASIR_BENCH_TOKENS.
func benchTokens() int {
	if v, err := strconv.Atoi(os.Getenv("KVASIR_BENCH_TOKENS")); err == nil && v > 0 {
		return v
	}
	return 16
}

// BenchmarkSwarmBatching measures aggregate decode throughput with 1, 8, 64
// and 512 concurrent sequences on the tiny model, with every MoE layer's
// expert call behind a simulated 13 ms round trip (slowExperts: sleep, then
// compute locally), as a swarm would add. Each iteration submits N
// one-token prompts (different tokens) with max_tokens 16 and waits for all.
// Reported: tok/s (generated tokens / wall time), ms/step (wall time per
// step of one lane, meaningful when every lane has work) and
// tok/s/seq, and cpu-ms/tok (process CPU time per generated token: on a
// shared machine tok/s measures the share of the CPU the run got, this
// does not; the idle spinners' time, engine/idlespin, is left out and
// reported as spin-ms/tok). The per-token throughput gain at 512 over 1 is the ratio of
// their tok/s. lanes=2 splits the sequences over two model instances that
// take turns on the CPU while the other waits for its round trip.
//
// KVASIR_BENCH_RTT_MS overrides the 13 ms; KVASIR_BENCH_TOKENS the 16.
func BenchmarkSwarmBatching(b *testing.B) {
	rtt := benchRTT()
	maxTok := benchTokens()
	for _, lanes := range []int{1, 2} {
		for _, n := range []int{1, 8, 64, 512} {
			b.Run(fmt.Sprintf("lanes=%d/seqs=%d", lanes, n), func(b *testing.B) {
				m, tok := loadTiny(b)
				cfg := Config{Model: m, Tokenizer: tok, MaxBatchRows: 512, MaxSeqs: 512, Registry: prometheus.NewRegistry(), Logger: quiet}
				ex := &slowExperts{inner: m.LocalExperts(), delay: rtt}
				m.SetExperts(ex)
				for range lanes - 1 {
					lm, _ := loadTiny(b)
					cfg.Lanes = append(cfg.Lanes, lm)
					cfg.Experts = ex
				}
				benchServer(b, cfg, n, maxTok, nil)
			})
		}
	}
}

// benchServer runs waves of n requests on a server made from cfg and
// reports tok/s, tok/s/seq and ms/step of the server's steady state: one
// untimed wave of n requests of warmTokens tokens goes first (a swarm's
// sessions pass their probation, whose every result the backbone checks,
// and every server's buffers and caches are warm), as a server that runs
// for hours is measured.
// warmed, when set, runs between the warm-up and the timed waves.
func benchServer(b *testing.B, cfg Config, n, maxTok int, warmed func()) *Server {
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	s.Start()
	b.Cleanup(func() { s.Close() })
	reg := cfg.Registry.(prometheus.Gatherer)
	warmWave(b, s, n)
	if warmed != nil {
		warmed()
	}
	steps0 := gatherValue(b, reg, "kvasir_serve_steps_total")
	cpu0, spin0 := cputime.Used(), idlespin.Read().CPU
	tokens, elapsed := runWaves(b, s, n, maxTok)
	spin := idlespin.Read().CPU - spin0
	cpu := cputime.Used() - cpu0 - spin
	steps := gatherValue(b, reg, "kvasir_serve_steps_total") - steps0
	tps := float64(tokens) / elapsed.Seconds()
	b.ReportMetric(tps, "tok/s")
	b.ReportMetric(tps/float64(n), "tok/s/seq")
	b.ReportMetric(elapsed.Seconds()*1e3/steps*float64(len(s.lanes)), "ms/step") // per lane, when all lanes are busy
	b.ReportMetric(cpu.Seconds()*1e3/float64(tokens), "cpu-ms/tok")
	b.ReportMetric(spin.Seconds()*1e3/float64(tokens), "spin-ms/tok")
	return s
}

// warmTokens is the length of benchServer's warm-up requests: 24 steps,
// enough for two workers holding every expert of a 4-layer model to pass
// dispatch.DefaultProbation (32 checked results each) even at n = 1 (a
// request per layer and step, 96 in all).
const warmTokens = 24

// warmWave submits n one-token prompts of warmTokens tokens and waits for
// them, untimed.
func warmWave(b *testing.B, s *Server, n int) {
	b.StopTimer()
	defer b.StartTimer()
	streams := make([]*Stream, n)
	for i := range streams {
		st, err := s.Submit(context.Background(), Job{Prompt: []int32{int32(3 + i%(s.p.Vocab-3))}, MaxTokens: warmTokens})
		if err != nil {
			b.Fatal(err)
		}
		streams[i] = st
	}
	for _, st := range streams {
		if _, _, d := collect(b, st); d.Finish == FinishError {
			b.Fatal(d.Err)
		}
	}
}
