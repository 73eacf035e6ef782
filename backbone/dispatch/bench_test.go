package dispatch_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
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
	s.startWorker(b, &fakeExperts{d: m.D, nExpert: m.NExpert}, 0)
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
