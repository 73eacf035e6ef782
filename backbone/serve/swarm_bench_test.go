package serve

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/gateway"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// newSwarm starts a dispatcher for m, a hub, a TLS gateway, a delaying
// proxy between gateway and hub, and workers (each an independent instance
// of the tiny model) holding every expert; it returns the dispatcher once
// the workers are connected.
func newSwarm(tb testing.TB, m *model.Model, oneWay time.Duration, workers int) *dispatch.Dispatcher {
	return newSwarmOf(tb, m, oneWay, workers, func() *model.Model { wm, _ := loadTiny(tb); return wm }, "tiny")
}

// newSwarmOf is newSwarm with workers holding the experts of the models
// load returns, announced as model id. Row sums (DISPATCH_SUM) are on
// unless KVASIR_BENCH_NOSUMS=1 (every expert output travels: the protocol
// before wire 6, for a before/after comparison); idle spinning
// (dispatch.Config.SpinWait) unless KVASIR_BENCH_SPIN=0 (per process:
// compare in two runs).
func newSwarmOf(tb testing.TB, m *model.Model, oneWay time.Duration, workers int, load func() *model.Model, id string) *dispatch.Dispatcher {
	tb.Helper()
	p := m.Params()
	d, err := dispatch.New(dispatch.Config{Listen: "127.0.0.1:0", Fallback: m.LocalExperts(), Logger: quiet,
		Model:     dispatch.Model{ID: id, D: p.Embd, K: p.ExpertsUsed, NLayer: p.Layers, NExpert: p.Experts},
		NoRowSums: os.Getenv("KVASIR_BENCH_NOSUMS") == "1", SpinWait: swarmtest.BenchSpinWait()})
	if err != nil {
		tb.Fatal(err)
	}
	if err := d.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	secret := []byte("0123456789abcdef0123456789abcdef")
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Backbone: d.Addr(), Secret: secret, Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	if err := h.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	// A delay is slept in a child process (swarmtest.ProcLink: in this
	// one, its sleeps would hold the Ps that serve and the workers need).
	var px interface {
		Addr() string
		Close() error
	}
	if oneWay > 0 {
		px, err = swarmtest.NewProcLink(h.Addr(), oneWay)
	} else {
		px, err = swarmtest.NewLink(h.Addr(), 0)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { px.Close() })
	certPEM, keyPEM, err := gateway.SelfSigned("127.0.0.1")
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(certPEM)
	g, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", HubURL: px.Addr(), Secret: secret,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	if err := g.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	for range workers {
		local := load().LocalExperts()
		_, key, _ := ed25519.GenerateKey(nil)
		w, err := worker.New(worker.Config{GatewayURL: "wss://" + g.Addr(), Key: key, RootCAs: pool, Computer: local,
			Holdings: worker.HoldingsOf(local, nil), ModelID: id, Backend: "cpu", Threads: 2, Logger: quiet,
			BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
		if err != nil {
			tb.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = w.Run(ctx) }()
		tb.Cleanup(func() { cancel(); <-done })
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer wcancel()
	if err := d.WaitWorkers(wctx, workers); err != nil {
		tb.Fatal(err)
	}
	return d
}

// BenchmarkRealSwarm is BenchmarkSwarmBatching over the real swarm: every
// expert call goes dispatcher -> hub -> delaying proxy (6.5 ms each way,
// KVASIR_BENCH_RTT_MS overrides the 13 ms round trip) -> TLS gateway ->
// two workers, each holding every expert, and back. The workers run on the
// same machine, so they compete with the backbone for the CPU. local/ is
// the same server with the experts computed in-process (no swarm, one
// lane: the baseline of serve's swarm/local ratio); lanes=2 is the
// two-batch overlap (serve's default over a swarm). Also reported: the
// share of expert outputs the workers computed (remote%) and deadline
// misses.
func BenchmarkRealSwarm(b *testing.B) {
	rtt := benchRTT()
	maxTok := benchTokens()
	seqs := []int{1, 8, 64, 512}
	for _, n := range seqs {
		b.Run(fmt.Sprintf("local/seqs=%d", n), func(b *testing.B) {
			m, tok := loadTiny(b)
			benchServer(b, Config{Model: m, Tokenizer: tok, MaxBatchRows: 512, MaxSeqs: 512, Registry: prometheus.NewRegistry(), Logger: quiet}, n, maxTok, nil)
		})
	}
	for _, lanes := range []int{1, 2} {
		for _, n := range seqs {
			b.Run(fmt.Sprintf("lanes=%d/seqs=%d", lanes, n), func(b *testing.B) {
				m, tok := loadTiny(b)
				d := newSwarm(b, m, rtt/2, 2)
				m.SetExperts(d)
				cfg := Config{Model: m, Tokenizer: tok, MaxBatchRows: 512, MaxSeqs: 512, Registry: prometheus.NewRegistry(), Logger: quiet}
				for range lanes - 1 {
					lm, _ := loadTiny(b)
					cfg.Lanes = append(cfg.Lanes, lm)
					cfg.Experts = d
				}
				var st0 dispatch.Stats
				benchServer(b, cfg, n, maxTok, func() { st0 = d.Stats() })
				st := d.Stats()
				var misses uint64
				for _, w := range st.Workers {
					misses += w.Timeouts
				}
				b.ReportMetric(100*float64(st.ExpertsRemote)/float64(max(1, st.ExpertsRemote+st.ExpertsLocal)), "remote%")
				b.ReportMetric(float64(misses), "misses")
				reportUpload(b, st0, st, m.Params().ExpertsUsed)
			})
		}
	}
}

// runWaves submits n one-token prompts b.N times, each wave waited for, and
// returns the tokens generated and the wall time.
func runWaves(b *testing.B, s *Server, n, maxTok int) (int, time.Duration) {
	vocab := s.p.Vocab
	var tokens int
	var elapsed time.Duration
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		streams := make([]*Stream, n)
		for i := range streams {
			st, err := s.Submit(context.Background(), Job{Prompt: []int32{int32(3 + i%(vocab-3))}, MaxTokens: maxTok})
			if err != nil {
				b.Fatal(err)
			}
			streams[i] = st
		}
		for _, st := range streams {
			_, _, d := collect(b, st)
			if d.Finish == FinishError {
				b.Fatal(d.Err)
			}
			tokens += d.CompletionTokens
		}
		elapsed += time.Since(start)
	}
	b.StopTimer()
	return tokens, elapsed
}

// BenchmarkRealSwarmQ30 is BenchmarkRealSwarm at 512 sequences on a
// 4-layer Q4_K model of Qwen3-30B-A3B's layer shapes (d 2048, 128 experts
// top-8 of 768; generated once, 1.4 GB, shared by every instance as views
// of one buffer), where the experts' compute, not the protocol, is most of
// a token's work: local serving against the real swarm (two workers
// holding every expert, 13 ms round trip, two lanes). The workers share
// this machine's cores with the backbone. KVASIR_BENCH_Q30=1 runs it;
// KVASIR_BENCH_LANES sets the swarm's lanes (default 2).
func BenchmarkRealSwarmQ30(b *testing.B) {
	if os.Getenv("KVASIR_BENCH_Q30") != "1" {
		b.Skip("set KVASIR_BENCH_Q30=1 (generates a 1.4 GB model in memory)")
	}
	q30.once.Do(func() {
		s, err := modelgen.Preset("qwen3-30b-a3b")
		if err != nil {
			q30.err = err
			return
		}
		s.Layers, s.Type = 4, quant.Q4_K
		q30.data, q30.err = modelgen.Bytes(s)
	})
	if q30.err != nil {
		b.Fatal(q30.err)
	}
	load := func() (*model.Model, *tokenizer.Tokenizer) {
		f, err := gguf.Parse(q30.data)
		if err != nil {
			b.Fatal(err)
		}
		m, err := model.Load(f)
		if err != nil {
			b.Fatal(err)
		}
		tok, err := tokenizer.FromGGUF(f)
		if err != nil {
			b.Fatal(err)
		}
		return m, tok
	}
	const n = 512
	maxTok := benchTokens()
	b.Run(fmt.Sprintf("local/seqs=%d", n), func(b *testing.B) {
		m, tok := load()
		benchServer(b, Config{Model: m, Tokenizer: tok, MaxBatchRows: n, MaxSeqs: n, Registry: prometheus.NewRegistry(), Logger: quiet}, n, maxTok, nil)
	})
	lanes := 2
	if v, err := strconv.Atoi(os.Getenv("KVASIR_BENCH_LANES")); err == nil && v >= 2 {
		lanes = v
	}
	b.Run(fmt.Sprintf("lanes=%d/seqs=%d", lanes, n), func(b *testing.B) {
		m, tok := load()
		d := newSwarmOf(b, m, benchRTT()/2, 2, func() *model.Model { wm, _ := load(); return wm }, "q30")
		m.SetExperts(d)
		var more []*model.Model
		for range lanes - 1 {
			lm, _ := load()
			more = append(more, lm)
		}
		cfg := Config{Model: m, Lanes: more, Experts: d, Tokenizer: tok, MaxBatchRows: n, MaxSeqs: n,
			Registry: prometheus.NewRegistry(), Logger: quiet}
		var st0 dispatch.Stats
		benchServer(b, cfg, n, maxTok, func() { st0 = d.Stats() })
		st := d.Stats()
		b.ReportMetric(100*float64(st.ExpertsRemote)/float64(max(1, st.ExpertsRemote+st.ExpertsLocal)), "remote%")
		reportUpload(b, st0, st, m.Params().ExpertsUsed)
	})
}

// reportUpload reports the workers' upload per remote expert output
// (up-B/out: about 4 d bytes when every output travels, 4 d / k with row
// sums), the share of remote outputs that came summed (sum%) and the
// share the backbone recomputed to check them (checked%).
// k is the model's experts per row.
// st0 is the dispatcher's state before the timed waves, for checked%.
func reportUpload(b *testing.B, st0, st dispatch.Stats, k int) {
	var up uint64
	for _, w := range st.Workers {
		up += w.BytesIn
	}
	remote := float64(max(1, st.ExpertsRemote))
	b.ReportMetric(float64(up)/remote, "up-B/out")
	b.ReportMetric(100*float64(st.SumRows)*float64(k)/remote, "sum%")
	// Spot checks recompute outputs on the backbone: all of a session's
	// first results (probation), then 1 in 20.
	b.ReportMetric(100*float64(st.CheckPairs-st0.CheckPairs)/float64(max(1, st.ExpertsRemote-st0.ExpertsRemote)), "checked%")
}

// q30 is BenchmarkRealSwarmQ30's model file, generated once.
var q30 struct {
	once sync.Once
	data []byte
	err  error
}
