package dispatch_test

import (
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/gateway"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/wire"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// fakeExperts is a deterministic, batch-invariant stand-in for the expert
// function: out[r][s][j] = x[j]*(e+1) - 0.5*x[(j+1)%d] + 0.25*layer, exact
// float32 arithmetic, so any two computations of a pair agree bit for bit.
type fakeExperts struct {
	d, nExpert int
	holds      func(layer, e int) bool // nil: holds all
	delay      time.Duration           // sleep per call
	slow       atomic.Int64            // extra sleep per call, ns (changed while running)
	block      chan struct{}           // if set, calls wait for it (or ctx)
	calls      atomic.Int64
	onCall     func() // called at the start of each call
}

func (f *fakeExperts) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	if len(hidden) != n*f.d || len(ids) != n*k || len(out) != n*k*f.d {
		return fmt.Errorf("fake: bad lengths")
	}
	if err := f.enter(ctx); err != nil {
		return err
	}
	return f.compute(layer, hidden, ids, n, k, out)
}

// fusedFake is fakeExperts with row sums of its own (expert.SumComputer):
// each row's k outputs made in a k x d buffer and summed by
// expert.WeightedSum, the bits of ComputeExperts then WeightedSum without
// the n x k x d outputs, as a worker whose backend fuses the sum answers a
// DISPATCH_SUM. The benchmarks' workers compute this. (A separate type: a
// test computer that embeds fakeExperts to change its outputs must not
// inherit a sum that bypasses the change.)
type fusedFake struct{ *fakeExperts }

var _ expert.SumComputer = fusedFake{}

// ComputeExpertsSum implements expert.SumComputer.
func (f fusedFake) ComputeExpertsSum(ctx context.Context, layer int, hidden []float32, ids []int32, weights []float32, n, k int, out []float32) error {
	d := f.d
	if len(hidden) != n*d || len(ids) != n*k || len(weights) != n*k || len(out) != n*d {
		return fmt.Errorf("fake: bad lengths")
	}
	if err := f.enter(ctx); err != nil {
		return err
	}
	tmp := make([]float32, k*d)
	for r := 0; r < n; r++ {
		if err := f.compute(layer, hidden[r*d:(r+1)*d], ids[r*k:(r+1)*k], 1, k, tmp); err != nil {
			return err
		}
		expert.WeightedSum(out[r*d:(r+1)*d], tmp, weights[r*k:(r+1)*k], k, d)
	}
	return nil
}

// enter is a call's start: counted, onCall, the delays, the block.
func (f *fakeExperts) enter(ctx context.Context) error {
	f.calls.Add(1)
	if f.onCall != nil {
		f.onCall()
	}
	if f.delay > 0 {
		time.Sleep(f.delay)
	}
	if sl := f.slow.Load(); sl > 0 {
		time.Sleep(time.Duration(sl))
	}
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// compute is the function itself (lengths checked by the caller).
func (f *fakeExperts) compute(layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	d := f.d
	// o[j] = x[j]*(e+1) - 0.5*x[(j+1)%d] + 0.25*layer, in three vector
	// passes with the scalar loop's roundings (quant's ScaleF32 and
	// ScaleAddF32 round each product, fuse nothing): the benchmarks'
	// workers compute this, and their time should be the protocol's.
	fl := make([]float32, d)
	for j := range fl {
		fl[j] = 0.25 * float32(layer)
	}
	for r := 0; r < n; r++ {
		x := hidden[r*d : (r+1)*d]
		for s := 0; s < k; s++ {
			e := int(ids[r*k+s])
			if e < 0 || e >= f.nExpert || (f.holds != nil && !f.holds(layer, e)) {
				return fmt.Errorf("fake: expert (%d, %d) not held", layer, e)
			}
			o := out[(r*k+s)*d : (r*k+s+1)*d]
			quant.ScaleF32(o, x, float32(e+1))
			quant.ScaleAddF32(o[:d-1], x[1:], -0.5)
			o[d-1] += float32(-0.5 * x[0])
			quant.ScaleAddF32(o, fl, 1)
		}
	}
	return nil
}

// memMeter collects ledger entries.
type memMeter struct {
	mu sync.Mutex
	es []ledger.Entry
}

func (m *memMeter) Append(e ledger.Entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	e.ID = int64(len(m.es) + 1)
	m.es = append(m.es, e)
	return nil
}

func (m *memMeter) entries() []ledger.Entry {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]ledger.Entry(nil), m.es...)
}

// stack is dispatcher + hub + gateway (TLS) on loopback, with a counting
// (optionally delaying) proxy between gateway and hub.
type stack struct {
	disp   *dispatch.Dispatcher
	hub    *hub.Hub
	gw     *gateway.Gateway
	px     relay
	url    string
	pool   *x509.CertPool
	caFile string
	meter  *memMeter
	model  dispatch.Model
	local  *fakeExperts
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func testModel() dispatch.Model {
	return dispatch.Model{ID: "fake-moe", D: 16, K: 2, NLayer: 4, NExpert: 8}
}

// relay is the stack's link between gateway and hub: a swarmtest.Link,
// or a swarmtest.ProcLink when it has a delay.
type relay interface {
	Addr() string
	Conns() int64
	Close() error
}

// newStack starts a dispatcher, a hub and a TLS gateway on loopback, the
// gateway reaching the hub through a link with oneWay of delay each way.
func newStack(tb testing.TB, m dispatch.Model, oneWay time.Duration, mod func(*dispatch.Config)) *stack {
	tb.Helper()
	return newStackHub(tb, m, oneWay, mod, nil)
}

// newStackHub is newStack with hmod adjusting the hub's configuration
// (its Meter, settling) last.
func newStackHub(tb testing.TB, m dispatch.Model, oneWay time.Duration, mod func(*dispatch.Config), hmod func(*hub.Config)) *stack {
	tb.Helper()
	s := &stack{model: m, meter: &memMeter{}, local: &fakeExperts{d: m.D, nExpert: m.NExpert}}
	// Verification off unless a test turns it on (verify_test.go): the
	// tests below count local computations.
	cfg := dispatch.Config{Listen: "127.0.0.1:0", Model: m, Fallback: s.local, Logger: quiet, Probation: -1, CheckRate: -1}
	cfg.SpinWait = swarmtest.BenchSpinWait() // benchmarks' before/after (KVASIR_BENCH_SPIN=0)
	if mod != nil {
		mod(&cfg)
	}
	d, err := dispatch.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := d.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { d.Close() })
	s.disp = d
	secret := []byte("0123456789abcdef0123456789abcdef")
	hcfg := hub.Config{Listen: "127.0.0.1:0", Backbone: d.Addr(), Secret: secret, Meter: s.meter,
		Logger: quiet, FlushEvery: 50 * time.Millisecond}
	if hmod != nil {
		hmod(&hcfg)
	}
	h, err := hub.New(hcfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := h.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { h.Close() })
	s.hub = h
	if oneWay > 0 {
		// A delay is slept in a child process, as a wide-area link is
		// outside the backbone's (swarmtest.ProcLink says why).
		s.px, err = swarmtest.NewProcLink(h.Addr(), oneWay)
	} else {
		s.px, err = swarmtest.NewLink(h.Addr(), 0)
	}
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.px.Close() })
	certPEM, keyPEM, err := gateway.SelfSigned("127.0.0.1")
	if err != nil {
		tb.Fatal(err)
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		tb.Fatal(err)
	}
	s.pool = x509.NewCertPool()
	s.pool.AppendCertsFromPEM(certPEM)
	s.caFile = filepath.Join(tb.TempDir(), "ca.crt")
	if err := os.WriteFile(s.caFile, certPEM, 0o644); err != nil {
		tb.Fatal(err)
	}
	g, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", HubURL: s.px.Addr(), Secret: secret,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, Logger: quiet})
	if err != nil {
		tb.Fatal(err)
	}
	if err := g.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { g.Close() })
	s.gw = g
	s.url = "wss://" + g.Addr()
	return s
}

// holdings lists every expert of the given layers.
func holdings(m dispatch.Model, layers ...int) []wire.Holding {
	var hs []wire.Holding
	for _, l := range layers {
		for e := 0; e < m.NExpert; e++ {
			hs = append(hs, wire.Holding{Layer: uint16(l), Expert: uint32(e)})
		}
	}
	return hs
}

// holdingsWhere lists the experts (layer, expert) of m for which holds is
// true.
func holdingsWhere(m dispatch.Model, holds func(l, e int) bool) []wire.Holding {
	var hs []wire.Holding
	for l := 0; l < m.NLayer; l++ {
		for e := 0; e < m.NExpert; e++ {
			if holds(l, e) {
				hs = append(hs, wire.Holding{Layer: uint16(l), Expert: uint32(e)})
			}
		}
	}
	return hs
}

// holdsLayers reports the experts of layers as held (fakeExperts.holds).
func holdsLayers(layers ...int) func(l, e int) bool {
	return func(l, e int) bool {
		for _, x := range layers {
			if x == l {
				return true
			}
		}
		return false
	}
}

// inProc is an in-process worker started by startInProc.
type inProc struct {
	*worker.Worker
	id     string             // its worker id: the hex public key
	cancel context.CancelFunc // ends Run without waiting (safe inside a computation)
	stop   func()             // ends Run, waits for it and closes the worker; idempotent
}

// startInProc runs an in-process worker through the stack's gateway (its
// URL and CA) serving hs with comp: a fresh key, backend "fake" (held to
// the tolerance, not to exact bits), the stack's model id, one thread,
// reconnection backoff 20-200 ms, no logs. mod, if not nil, adjusts that
// configuration last (a given key, another backend, a slice folder in
// place of comp and hs...). The test's cleanup stops it (inProc.stop).
func (s *stack) startInProc(tb testing.TB, comp expert.Computer, hs []wire.Holding, mod func(*worker.Config)) *inProc {
	tb.Helper()
	_, key, _ := ed25519.GenerateKey(nil)
	cfg := worker.Config{GatewayURL: s.url, Key: key, RootCAs: s.pool, Computer: comp, Holdings: hs,
		ModelID: s.model.ID, Backend: "fake", Threads: 1, Logger: quiet,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	w, err := worker.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done; w.Close() }) }
	tb.Cleanup(stop)
	return &inProc{Worker: w, id: keyID(cfg.Key), cancel: cancel, stop: stop}
}

// backend is a startInProc mod declaring the HELLO backend b ("cpu": held
// to exact bits).
func backend(b string) func(*worker.Config) {
	return func(c *worker.Config) { c.Backend = b }
}

// startWorker runs an in-process worker ("fake" backend) holding every
// expert of layers; cancel stops it.
func (s *stack) startWorker(tb testing.TB, comp *fakeExperts, layers ...int) (*worker.Worker, context.CancelFunc) {
	tb.Helper()
	return s.startWorkerWith(tb, comp, holdings(s.model, layers...))
}

// startWorkerWith runs an in-process worker ("fake" backend) serving hs
// with comp; cancel stops it.
func (s *stack) startWorkerWith(tb testing.TB, comp expert.Computer, hs []wire.Holding) (*worker.Worker, context.CancelFunc) {
	tb.Helper()
	w := s.startInProc(tb, comp, hs, nil)
	return w.Worker, w.cancel
}

// startHolder runs an in-process worker with a fresh key holding every
// expert of layers with comp ("cpu" backend: held to exact bits) and
// returns its worker id and what stops it.
func (s *stack) startHolder(tb testing.TB, comp expert.Computer, layers ...int) (string, context.CancelFunc) {
	tb.Helper()
	w := s.startInProc(tb, comp, holdings(s.model, layers...), backend("cpu"))
	return w.id, w.cancel
}

func (s *stack) waitWorkers(tb testing.TB, n int) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.disp.WaitWorkers(ctx, n); err != nil {
		tb.Fatalf("waiting for %d workers: %v", n, err)
	}
}

// call is one random expert call with its local reference output.
type call struct {
	layer, n, k int
	hidden      []float32
	ids         []int32
	want        []float32
}

func randomCall(tb testing.TB, m dispatch.Model, rng *rand.Rand, layer, n int) call {
	c := call{layer: layer, n: n, k: m.K, hidden: make([]float32, n*m.D), ids: make([]int32, n*m.K)}
	for i := range c.hidden {
		c.hidden[i] = float32(rng.NormFloat64())
	}
	for r := 0; r < n; r++ { // top-k: k distinct experts per row
		perm := rng.Perm(m.NExpert)
		for s := 0; s < m.K; s++ {
			c.ids[r*m.K+s] = int32(perm[s])
		}
	}
	c.want = make([]float32, n*m.K*m.D)
	ref := &fakeExperts{d: m.D, nExpert: m.NExpert}
	if err := ref.ComputeExperts(context.Background(), layer, c.hidden, c.ids, n, m.K, c.want); err != nil {
		tb.Fatal(err)
	}
	return c
}

// tryCall computes c through the dispatcher and, when that succeeds,
// fails the test unless the outputs are c.want bit for bit. It returns
// the dispatcher's time (the comparison excluded) and its error.
func (s *stack) tryCall(tb testing.TB, c call) (time.Duration, error) {
	tb.Helper()
	out := make([]float32, len(c.want))
	for i := range out {
		out[i] = math.Float32frombits(0x7fc00001) // NaN poison
	}
	start := time.Now()
	if err := s.disp.ComputeExperts(context.Background(), c.layer, c.hidden, c.ids, c.n, c.k, out); err != nil {
		return time.Since(start), err
	}
	el := time.Since(start)
	for i := range out {
		if fbits(out[i]) != fbits(c.want[i]) {
			tb.Fatalf("layer %d: out[%d] = %v, want %v (bit-identical)", c.layer, i, out[i], c.want[i])
		}
	}
	return el, nil
}

// run is tryCall that fails the test on an error.
func (s *stack) run(tb testing.TB, c call) time.Duration {
	tb.Helper()
	el, err := s.tryCall(tb, c)
	if err != nil {
		tb.Fatalf("ComputeExperts: %v", err)
	}
	return el
}

// hubTotals waits until the hub has every verdict (no session has bytes
// pending) and returns its metering summed over the sessions: creditable
// bytes to and from the workers, rejected bytes, and the bytes the workers
// uploaded.
func (s *stack) hubTotals(t *testing.T) (out, in, rejected, up uint64) {
	t.Helper()
	waitFor(t, func() bool { // ACCEPTED frames reach the hub after the call returns
		for _, ss := range s.hub.Sessions() {
			if ss.Pending != 0 {
				return false
			}
		}
		return true
	})
	for _, ss := range s.hub.Sessions() {
		out += ss.CreditOut
		in += ss.CreditIn
		rejected += ss.Rejected
		up += ss.FromWorker
	}
	return out, in, rejected, up
}

// newFake returns the fake expert function for m's shapes, holding every
// expert.
func newFake(m dispatch.Model) *fakeExperts { return &fakeExperts{d: m.D, nExpert: m.NExpert} }

func fbits(f float32) uint32 { return math.Float32bits(f) }

// waitUntil polls cond every 10 ms for up to d and fails the test, naming
// what it waited for, if cond never held.
func waitUntil(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitFor is waitUntil for up to 5 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	waitUntil(t, 5*time.Second, "a condition (5 s)", cond)
}

// keyID returns the worker id of key: its public key in hex.
func keyID(key ed25519.PrivateKey) string {
	return hex.EncodeToString(key.Public().(ed25519.PublicKey))
}
