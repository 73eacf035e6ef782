package dispatch_test

import (
	"context"
	"crypto/ed25519"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// BenchmarkDispatchRTT13ms measures the dispatcher's per-token throughput
// (rows per second of one MoE layer's expert call) with an injected 13 ms
// round trip (6.5 ms each way in a loopback proxy between gateway and hub)
// at 1, 8, 64 and 512 rows per step. Shapes are Qwen3-30B-A3B's (d 2048,
// top-8 of 128 experts); one worker holds every expert and computes with the
// cheap fake function, so the time is the protocol's: round trip, bytes
// through TLS, encode and decode.
func BenchmarkDispatchRTT13ms(b *testing.B) {
	m := dispatch.Model{ID: "bench", D: 2048, K: 8, NLayer: 1, NExpert: 128}
	s := newStack(b, m, benchDelay, nil)
	s.startWorker(b, newFake(m), 0)
	s.waitWorkers(b, 1)
	rng := rand.New(rand.NewPCG(41, 42))
	for _, n := range []int{1, 8, 64, 512} {
		c := randomCall(b, m, rng, 0, n)
		out := make([]float32, len(c.want))
		b.Run(fmt.Sprintf("rows=%d", n), func(b *testing.B) {
			b.SetBytes(int64(4 * n * (m.D + m.K + m.K*m.D)))
			for i := 0; i < b.N; i++ {
				if err := s.disp.ComputeExperts(context.Background(), 0, c.hidden, c.ids, n, m.K, out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
			b.ReportMetric(float64(s.disp.Stats().ExpertsLocal), "local-total")
		})
	}
	if st := s.disp.Stats(); st.ExpertsLocal != 0 {
		b.Logf("%d of %d outputs recomputed locally after a deadline (machine too loaded?)", st.ExpertsLocal, st.ExpertsLocal+st.ExpertsRemote)
	}
}

// benchDelay is the injected one-way delay; KVASIR_BENCH_NODELAY=1 sets 0 to
// measure the protocol's raw throughput.
var benchDelay = func() time.Duration {
	if os.Getenv("KVASIR_BENCH_NODELAY") == "1" {
		return 0
	}
	return 6500 * time.Microsecond
}()

// BenchmarkFixtureDecode compares greedy decode speed of the tiny Q8_0
// fixture locally and with layer 0's experts on a worker behind the gateway
// with the injected 13 ms round trip (one round trip per token).
func BenchmarkFixtureDecode(b *testing.B) {
	const name = "tiny-qwen3moe-Q8_0.gguf"
	load := func() *model.Model { return loadFixture(b, name) }
	step := func(b *testing.B, m *model.Model) {
		ctx := context.Background()
		seq := m.NewSequence()
		logits := make([]float32, m.Params().Vocab)
		tok := int32(9707)
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if seq.Len() >= 512 {
				seq = m.NewSequence()
			}
			if err := m.Forward(ctx, []model.Row{{Seq: seq, Token: tok, Pos: seq.Len(), Logits: true}}, logits); err != nil {
				b.Fatal(err)
			}
			tok = model.Greedy(logits)
		}
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
	}
	b.Run("local", func(b *testing.B) { step(b, load()) })
	b.Run("swarm-layer0-gateway-13ms", func(b *testing.B) {
		bb := load()
		p := bb.Params()
		local := bb.LocalExperts()
		s := newStack(b, dispatch.Model{ID: name, D: p.Embd, K: p.ExpertsUsed, NLayer: p.Layers, NExpert: p.Experts},
			benchDelay, func(c *dispatch.Config) { c.Fallback = local })
		wl := load().LocalExperts()
		s.startWorkerWith(b, wl, worker.HoldingsOf(wl, []int{0}))
		s.waitWorkers(b, 1)
		bb.SetExperts(s.disp)
		step(b, bb)
	})
}

// BenchmarkDecodeWhileProvisioning measures greedy decode speed of the tiny
// Q8_0 fixture through gateway and hub (no injected delay) with every
// expert served by worker A, while worker B (paused, so it serves nothing)
// either idles with quota 0 ("idle") or downloads the whole model (64
// experts, 13.4 MB in 64 KiB chunks) over and over: DeleteSlice, SetQuota,
// download ("provisioning-unlimited", and "provisioning-2MiBps" with the
// backbone's per-worker rate limit at 2 MiB/s). The drop is the provisioning
// cost on the backbone's machine (chunk reads, TLS, hub, worker hashing and
// writes all share the CPUs here).
func BenchmarkDecodeWhileProvisioning(b *testing.B) {
	run := func(b *testing.B, rate float64, provision bool) {
		s := newProvStack(b, func(c *dispatch.Config) { c.RateLimit = rate })
		wl := loadFixture(b, provFixture).LocalExperts()
		s.startWorkerWith(b, wl, worker.HoldingsOf(wl, nil))
		s.waitWorkers(b, 1)
		_, kb, _ := ed25519.GenerateKey(nil)
		sb := s.startSliceWorker(b, kb, filepath.Join(b.TempDir(), "b"), 0)
		sb.Pause()
		s.waitWorkers(b, 2)
		stop := make(chan struct{})
		done := make(chan struct{})
		rounds := 0
		go func() {
			defer close(done)
			if !provision {
				return
			}
			for {
				_ = sb.SetQuota(64 << 20)
				for sb.Stats().Experts < 64 {
					select {
					case <-stop:
						return
					case <-time.After(5 * time.Millisecond):
					}
				}
				rounds++
				_ = sb.DeleteSlice()
			}
		}()
		bb := s.bb
		bb.SetExperts(s.disp)
		ctx := context.Background()
		seq := bb.NewSequence()
		logits := make([]float32, bb.Params().Vocab)
		tok := int32(9707)
		sent := func() uint64 {
			ws, _ := workerStats(s.stack, keyID(kb))
			return ws.ChunkBytes
		}
		before := sent()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			if seq.Len() >= 256 {
				seq = bb.NewSequence()
			}
			if err := bb.Forward(ctx, []model.Row{{Seq: seq, Token: tok, Pos: seq.Len(), Logits: true}}, logits); err != nil {
				b.Fatal(err)
			}
			tok = model.Greedy(logits)
		}
		b.StopTimer()
		el := b.Elapsed().Seconds()
		bytes := sent() - before
		close(stop)
		<-done
		b.ReportMetric(float64(b.N)/el, "tok/s")
		b.ReportMetric(float64(bytes)/el/1e6, "prov-MB/s")
		if st := s.disp.Stats(); st.ExpertsLocal != 0 {
			b.Logf("%d expert outputs computed locally", st.ExpertsLocal)
		}
	}
	b.Run("idle", func(b *testing.B) { run(b, 0, false) })
	b.Run("provisioning-unlimited", func(b *testing.B) { run(b, 0, true) })
	b.Run("provisioning-2MiBps", func(b *testing.B) { run(b, 2<<20, true) })
}

// BenchmarkHedgeSlowReplica13ms measures one-row expert calls (top-8 of 128
// at d 2048, fake experts taking 1 ms per call) over the injected 13 ms
// round trip with three workers holding every expert: all healthy, or one
// slowed 10x (10 ms per call), with and without Config.Hedge. tok/s is
// calls per second (one call per token and remote layer).
func BenchmarkHedgeSlowReplica13ms(b *testing.B) {
	m := dispatch.Model{ID: "bench", D: 2048, K: 8, NLayer: 1, NExpert: 128}
	for _, hedge := range []bool{false, true} {
		for _, slowed := range []bool{false, true} {
			name := fmt.Sprintf("hedge=%v/slowed=%v", hedge, slowed)
			b.Run(name, func(b *testing.B) {
				s := newStack(b, m, benchDelay, func(c *dispatch.Config) { c.Hedge = hedge })
				for i := 0; i < 3; i++ {
					f := &fakeExperts{d: m.D, nExpert: m.NExpert, delay: time.Millisecond}
					if slowed && i == 2 {
						f.delay = 10 * time.Millisecond
					}
					s.startWorker(b, f, 0)
				}
				s.waitWorkers(b, 3)
				rng := rand.New(rand.NewPCG(81, 82))
				c := randomCall(b, m, rng, 0, 1)
				out := make([]float32, len(c.want))
				for i := 0; i < 20; i++ { // warm-up: latency samples
					_ = s.disp.ComputeExperts(context.Background(), 0, c.hidden, c.ids, 1, m.K, out)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if err := s.disp.ComputeExperts(context.Background(), 0, c.hidden, c.ids, 1, m.K, out); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
				st := s.disp.Stats()
				b.ReportMetric(float64(st.Hedges), "hedges")
				b.ReportMetric(float64(st.ExpertsLocal), "local")
			})
		}
	}
}
