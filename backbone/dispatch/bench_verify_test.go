package dispatch_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/engine/cputime"
	"github.com/kvasir-ai/kvasir/engine/idlespin"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

var q30Bench struct {
	once sync.Once
	m    *model.Model
	err  error
}

// q30Model is a 4-layer Q4_K model of Qwen3-30B-A3B's layer shapes (d 2048,
// 128 experts, top-8, d_ff 768; 1.4 GB generated in memory), shared by the
// sub-benchmarks.
func q30Model(b *testing.B) *model.Model {
	if os.Getenv("KVASIR_BENCH_Q30") != "1" {
		b.Skip("set KVASIR_BENCH_Q30=1 (generates a 1.4 GB model in memory)")
	}
	q30Bench.once.Do(func() {
		f, err := modelgen.PresetFile("qwen3-30b-a3b", 4, quant.Q4_K)
		if err != nil {
			q30Bench.err = err
			return
		}
		q30Bench.m, q30Bench.err = model.Load(f)
	})
	if q30Bench.err != nil {
		b.Fatal(q30Bench.err)
	}
	return q30Bench.m
}

// BenchmarkVerifyOverhead measures greedy single-token decode (tok/s) with
// every MoE layer's experts on one in-process worker behind the TLS
// gateway and hub (no injected delay: the recomputation is not hidden
// behind a network wait), for check rates p = 0, 0.01, 0.05 and 1, after
// probation (Probation off, so the rate alone is measured). Reported:
// tok/s, checks per token and the backbone's reference compute per token
// (check-ms/tok). Models: the Q8_0 fixture and, with KVASIR_BENCH_Q30=1, a
// 4-layer model of Qwen3-30B-A3B's shapes. Worker and backbone share the
// machine's CPUs.
func BenchmarkVerifyOverhead(b *testing.B) {
	models := []struct {
		name string
		load func(*testing.B) *model.Model
	}{
		{"fixture-Q8_0", func(b *testing.B) *model.Model { return loadFixture(b, "tiny-qwen3moe-Q8_0.gguf") }},
		{"qwen3-30b-shape-4L-Q4_K", q30Model},
	}
	for _, mc := range models {
		for _, p := range []float64{0, 0.01, 0.05, 1} {
			b.Run(fmt.Sprintf("%s/p=%g", mc.name, p), func(b *testing.B) {
				m := mc.load(b)
				prm := m.Params()
				local := m.LocalExperts() // safe for concurrent use: backbone and worker share it
				rate := p
				if rate == 0 {
					rate = -1
				}
				s := newStack(b, dispatch.Model{ID: "bench", D: prm.Embd, K: prm.ExpertsUsed, NLayer: prm.Layers, NExpert: prm.Experts},
					0, func(c *dispatch.Config) { c.Fallback = local; c.Probation, c.CheckRate = -1, rate })
				s.startInProc(b, local, worker.HoldingsOf(local, nil), backend("cpu"))
				s.waitWorkers(b, 1)
				m.SetExperts(s.disp)
				defer m.SetExperts(nil)
				logits := make([]float32, prm.Vocab)
				seq := m.NewSequence()
				tok := int32(1)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if seq.Len() >= 256 {
						seq = m.NewSequence()
					}
					if err := m.Forward(context.Background(), []model.Row{{Seq: seq, Token: tok, Pos: seq.Len(), Logits: true}}, logits); err != nil {
						b.Fatal(err)
					}
					tok = model.Greedy(logits)
				}
				b.StopTimer()
				st := s.disp.Stats()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
				b.ReportMetric(float64(st.Checks)/float64(b.N), "checks/tok")
				b.ReportMetric(float64(st.CheckTime.Microseconds())/1e3/float64(b.N), "check-ms/tok")
				b.ReportMetric(100*float64(st.ExpertsRemote)/float64(max(1, st.ExpertsRemote+st.ExpertsLocal)), "remote%")
			})
		}
	}
}

// BenchmarkDetection measures how long a worker that lies on 1 result in
// 20 after its probation survives with the default verification
// (Probation 32, CheckRate 0.05) and the hub's default settling (30 s, 64
// RESULTs): each iteration connects a fresh liar (in-process, through
// gateway and hub) to a fresh swarm and runs calls of 3 rows until it is
// caught. Reported per catch: results it returned, lies, lies that slipped
// through (used unchecked: the call's output differed from the
// reference), and the creditable bytes it had metered that were forfeited
// and that were settled (credited) before the catch.
func BenchmarkDetection(b *testing.B) {
	m := testModel()
	var results, lies, slipped, forfeited, settled float64
	for i := 0; i < b.N; i++ {
		s := newStackHub(b, m, 0, func(c *dispatch.Config) { c.Probation, c.CheckRate = 0, 0 },
			func(c *hub.Config) { c.SettleDelay, c.SettleResults = hub.DefaultSettleDelay, hub.DefaultSettleResults })
		liar := &lyingComputer{inner: newFake(m), after: dispatch.DefaultProbation, every: 20,
			say: func(string, ...any) {}}
		_, cancel := s.startWorkerWith(b, liar, holdings(m, 0, 1, 2, 3))
		s.waitWorkers(b, 1)
		rng := rand.New(rand.NewPCG(uint64(i), 71))
		wrong := 0
		for n := 0; s.disp.Stats().Caught == 0; n++ {
			if n > 100000 {
				b.Fatal("liar never caught")
			}
			c := randomCall(b, m, rng, n%m.NLayer, 3)
			out := make([]float32, len(c.want))
			if err := s.disp.ComputeExperts(context.Background(), c.layer, c.hidden, c.ids, c.n, c.k, out); err != nil {
				b.Fatal(err)
			}
			for j := range out {
				if fbits(out[j]) != fbits(c.want[j]) {
					wrong++
					break
				}
			}
		}
		cancel()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			if ss := s.hub.Sessions(); len(ss) > 0 && ss[0].Ended {
				forfeited += float64(ss[0].Forfeited)
				settled += float64(ss[0].CreditIn + ss[0].CreditOut)
				break
			}
			time.Sleep(time.Millisecond)
		}
		st := s.disp.Stats()
		results += float64(st.Workers[0].Results)
		lies += float64((liar.n.Load() - dispatch.DefaultProbation) / 20)
		slipped += float64(wrong)
	}
	n := float64(b.N)
	b.ReportMetric(results/n, "results/catch")
	b.ReportMetric(lies/n, "lies/catch")
	b.ReportMetric(slipped/n, "slipped/catch")
	b.ReportMetric(forfeited/n, "forfeited-B/catch")
	b.ReportMetric(settled/n, "credited-B/catch")
}

// BenchmarkQuorumRTT13ms compares the verification policies' throughput
// and bytes (issue 20) on Qwen3-30B-A3B's shapes (d 2048, top-8 of 128
// experts; one MoE layer's expert call per step) with an injected 13 ms
// round trip (6.5 ms each way between gateway and hub) and two workers
// ("cpu" backends, behind the TLS gateway and the hub) holding every
// expert, at 1, 64 and 256 rows (sequences) per step. spot: the default
// probation (32) and check rate (0.05), the rows split between the two
// workers, each row's weighted sum computed by its worker (DISPATCH_SUM,
// wire 6: the model's call, ComputeExpertsSum); spot-pairs: the same with
// Config.NoRowSums, every pair's output sent back (the protocol before
// row sums); quorum: every row to both, one answering its DISPATCH_SUM
// with the row's sum, the other its DISPATCH_SUM_DIGEST with the DIGEST of
// that sum RESULT (wire 7); quorum-pairs: the same with Config.NoRowSums,
// every pair to both, one answering with a DIGEST (quorum before wire 7).
// The workers compute the cheap fake function (fusedFake: vector passes,
// row sums without the rows x k x d outputs), so the time is the
// protocol's (what the swarm adds to a decode whose workers compute on
// other machines); under quorum the workers compute twice the pairs by
// design. The 13 ms are slept in a child process (swarmtest.ProcLink):
// slept in this one, they held the Ps of the processes under test. Reported: tok/s (rows per second), down-B/tok and up-B/tok
// (backbone -> workers and workers -> backbone message bytes per row, for
// this one layer: a model multiplies them by its MoE layers), local%
// (outputs the backbone computed: late answers, checks do not count) and
// cpu-us/tok, the process's CPU time per row (backbone, hub, gateway and
// both workers: the swarm's whole cost of the step on this machine, TLS
// and copies included; less sensitive to a loaded machine than tok/s)
// without the idle spinners' (spin-us/tok: idlespin's SCHED_IDLE threads
// fill the CPUs while a round trip is away and yield to any work, so
// their time is not a cost; counted in, they made the benchmark look
// CPU-bound, 518 of 75 cpu-us/tok at 64 rows).
func BenchmarkQuorumRTT13ms(b *testing.B) {
	m := dispatch.Model{ID: "bench", D: 2048, K: 8, NLayer: 1, NExpert: 128}
	for _, mc := range []struct {
		name   string
		mode   dispatch.VerifyMode
		noSums bool
	}{{"spot", dispatch.VerifySpot, false}, {"spot-pairs", dispatch.VerifySpot, true},
		{"quorum", dispatch.VerifyQuorum, false}, {"quorum-pairs", dispatch.VerifyQuorum, true}} {
		s := newStack(b, m, benchDelay, func(c *dispatch.Config) {
			c.Verify, c.Probation, c.CheckRate = mc.mode, 0, 0 // the defaults
			c.NoRowSums = mc.noSums
		})
		s.startHolder(b, fusedFake{newFake(m)}, 0)
		s.startHolder(b, fusedFake{newFake(m)}, 0)
		s.waitWorkers(b, 2)
		rng := rand.New(rand.NewPCG(43, 44))
		bytes := func() (down, up uint64) {
			for _, w := range s.disp.Stats().Workers {
				down += w.BytesOut
				up += w.BytesIn
			}
			return down, up
		}
		for _, n := range []int{1, 64, 256} {
			c := randomCall(b, m, rng, 0, n)
			w := randomWeights(rng, n, m.K)
			out := make([]float32, n*m.D)
			b.Run(fmt.Sprintf("%s/rows=%d", mc.name, n), func(b *testing.B) {
				st0 := s.disp.Stats()
				d0, u0 := bytes()
				cpu0, spin0 := cputime.Used(), idlespin.Read().CPU
				for i := 0; i < b.N; i++ {
					if err := s.disp.ComputeExpertsSum(context.Background(), 0, c.hidden, c.ids, w, n, m.K, out); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				spin := idlespin.Read().CPU - spin0
				cpu := cputime.Used() - cpu0 - spin
				st := s.disp.Stats()
				d1, u1 := bytes()
				toks := float64(n) * float64(b.N)
				b.ReportMetric(float64(cpu.Microseconds())/toks, "cpu-us/tok")
				b.ReportMetric(float64(spin.Microseconds())/toks, "spin-us/tok")
				b.ReportMetric(toks/b.Elapsed().Seconds(), "tok/s")
				b.ReportMetric(float64(d1-d0)/toks, "down-B/tok")
				b.ReportMetric(float64(u1-u0)/toks, "up-B/tok")
				local, remote := st.ExpertsLocal-st0.ExpertsLocal, st.ExpertsRemote-st0.ExpertsRemote
				b.ReportMetric(100*float64(local)/float64(max(1, local+remote)), "local%")
			})
		}
	}
}
