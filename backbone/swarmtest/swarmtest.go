// Package swarmtest (a test harness, imported by _test.go files only:
// TestImportArrows checks it) starts a
// complete kvasir swarm in one process on
// loopback, for the app's end-to-end tests and its screenshot: a backbone
// dispatcher over the generated tiny qwen3moe model (engine/modelgen), the
// hub metering into a real SQLite ledger, the gateway on TLS with a
// self-signed certificate and the wallet API of the crediting service
// mounted, the crediting loop, a slice directory cut from the model for a
// worker, and a load generator that asks the dispatcher for expert outputs
// as a decode would. Provisioning is on (the dispatcher's catalog is the
// model): a worker started with a quota and an empty folder is assigned
// experts and downloads them. Only the contributor node is left for the
// test to start.
package swarmtest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/credit"
	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/gateway"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/moeshape"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

// Swarm is a running loopback swarm. Close stops everything.
type Swarm struct {
	URL      string // wss://127.0.0.1:PORT of the gateway
	CAFile   string // PEM of the gateway's self-signed certificate
	SliceDir string // a worker slice: every expert of layer 0
	Model    dispatch.Model

	Disp   *dispatch.Dispatcher
	Hub    *hub.Hub
	GW     *gateway.Gateway
	Ledger *ledger.Ledger
	Credit *credit.Service

	Calls, Errors atomic.Uint64 // load generator's ComputeExperts calls and failures

	dir      string
	full     *slice.Slice
	file     *gguf.File
	cancel   context.CancelFunc
	stopLoad func()
	wg       sync.WaitGroup
	closes   []func() error
}

// Options tunes StartWith.
type Options struct {
	CreditEvery time.Duration // the gateway's crediting poll; 0 = 1 s, the gateway command's default
	// NoSettle runs the hub without settling (SettleDelay and
	// SettleResults 0, a 200 ms flush): creditable bytes reach the ledger
	// within a flush, for tests that need credits within seconds while the
	// worker works. Without it the hub runs on the hub command's defaults
	// (hub.DefaultSettleDelay, hub.DefaultSettleResults, a 1 s flush), as
	// a real deployment does.
	NoSettle bool
}

// Start starts the swarm in dir (created) with the hub on the hub
// command's default settle rules, crediting every creditEvery.
func Start(dir string, creditEvery time.Duration) (*Swarm, error) {
	return StartWith(dir, Options{CreditEvery: creditEvery})
}

// StartWith starts the swarm in dir (created) as o says.
func StartWith(dir string, o Options) (_ *Swarm, err error) {
	if o.CreditEvery <= 0 {
		o.CreditEvery = time.Second
	}
	creditEvery := o.CreditEvery
	s := &Swarm{dir: dir}
	defer func() {
		if err != nil {
			s.Close() // what started so far
		}
	}()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	data, err := demomodel.Bytes()
	if err != nil {
		return nil, err
	}
	modelPath := filepath.Join(dir, "tiny.gguf")
	if err := os.WriteFile(modelPath, data, 0o600); err != nil {
		return nil, err
	}
	if s.file, err = gguf.Open(modelPath); err != nil {
		return nil, err
	}
	s.closes = append(s.closes, s.file.Close)
	if s.full, err = slice.FromGGUF(s.file, nil, nil); err != nil {
		return nil, err
	}
	s.closes = append(s.closes, s.full.Close)
	m := s.full.Manifest()
	sh, err := moeshape.Read(s.file)
	if err == nil && sh.ExpertsUsed == 0 {
		err = fmt.Errorf("swarmtest: %s: no %s.%s", modelPath, sh.Arch, moeshape.KeyExpertUsed)
	}
	if err != nil {
		return nil, err
	}
	s.Model = dispatch.Model{ID: m.ModelID, D: m.DModel, K: moeshape.Int(sh.ExpertsUsed), NLayer: m.NLayer, NExpert: m.NExpert}
	s.SliceDir = filepath.Join(dir, "slice")
	if _, err := slice.Cut(s.file, []int{0}, nil, s.SliceDir); err != nil {
		return nil, err
	}
	local, err := s.full.Computer(1)
	if err != nil {
		return nil, err
	}
	cat, err := slice.NewCatalog(s.file)
	if err != nil {
		return nil, err
	}
	if s.Disp, err = dispatch.New(dispatch.Config{Listen: "127.0.0.1:0", Model: s.Model, Fallback: local, Logger: quiet,
		Catalog: cat, HotShare: 2}); err != nil {
		return nil, err
	}
	if err := s.Disp.Start(); err != nil {
		return nil, err
	}
	s.closes = append(s.closes, s.Disp.Close)

	if s.Ledger, err = ledger.Open(filepath.Join(dir, "ledger.sqlite")); err != nil {
		return nil, err
	}
	s.closes = append(s.closes, s.Ledger.Close)
	secret := []byte("swarmtest-secret-0123456789abcdef")
	hc := hub.Config{Listen: "127.0.0.1:0", Backbone: s.Disp.Addr(), Secret: secret, Meter: s.Ledger, Logger: quiet,
		SettleDelay: hub.DefaultSettleDelay, SettleResults: hub.DefaultSettleResults}
	if o.NoSettle {
		hc.SettleDelay, hc.SettleResults, hc.FlushEvery = 0, 0, 200*time.Millisecond
	}
	if s.Hub, err = hub.New(hc); err != nil {
		return nil, err
	}
	if err := s.Hub.Start(); err != nil {
		return nil, err
	}
	s.closes = append(s.closes, s.Hub.Close)

	if s.Credit, err = credit.Open(credit.Config{Path: filepath.Join(dir, "wallets.sqlite"), Source: s.Ledger}); err != nil {
		return nil, err
	}
	s.closes = append(s.closes, s.Credit.Close)
	certPEM, keyPEM, err := gateway.SelfSigned("127.0.0.1")
	if err != nil {
		return nil, err
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, err
	}
	s.CAFile = filepath.Join(dir, "gateway.crt")
	if err := os.WriteFile(s.CAFile, certPEM, 0o600); err != nil {
		return nil, err
	}
	if s.GW, err = gateway.New(gateway.Config{Listen: "127.0.0.1:0", HubURL: s.Hub.Addr(), Secret: secret,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, Logger: quiet,
		Extra: map[string]http.Handler{"/v1/wallet/": s.Credit.Handler(credit.HandlerOptions{})}}); err != nil {
		return nil, err
	}
	if err := s.GW.Start(); err != nil {
		return nil, err
	}
	s.closes = append(s.closes, s.GW.Close)
	s.URL = "wss://" + s.GW.Addr()

	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = s.Credit.Run(ctx, creditEvery, func(string, ...any) {})
	}()
	return s, nil
}

// Load asks the dispatcher for layer-0 expert outputs of rows random rows
// (each with K distinct random experts) every period until Close, as a
// decode step would. Rows are computed by a worker holding layer 0 when
// one is connected, else locally.
func (s *Swarm) Load(rows int, period time.Duration) {
	ctx, cancel := context.WithCancel(context.Background())
	prev := s.cancel
	s.cancel = func() { cancel(); prev() }
	done := make(chan struct{})
	s.stopLoad = func() { cancel(); <-done }
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		defer close(done)
		m := s.Model
		rng := rand.New(rand.NewPCG(1, 2))
		hidden := make([]float32, rows*m.D)
		ids := make([]int32, rows*m.K)
		out := make([]float32, rows*m.K*m.D)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			for i := range hidden {
				hidden[i] = float32(rng.NormFloat64())
			}
			for r := 0; r < rows; r++ {
				perm := rng.Perm(m.NExpert)
				for j := 0; j < m.K; j++ {
					ids[r*m.K+j] = int32(perm[j])
				}
			}
			s.Calls.Add(1)
			// Not ctx: a stopped load lets its last request finish.
			if err := s.Disp.ComputeExperts(context.Background(), 0, hidden, ids, rows, m.K, out); err != nil {
				s.Errors.Add(1)
			}
		}
	}()
}

// StopLoad stops the load generator started by Load and waits for its
// last call to return.
func (s *Swarm) StopLoad() {
	if s.stopLoad != nil {
		s.stopLoad()
	}
}

// WaitWorkers waits until n workers are connected to the dispatcher.
func (s *Swarm) WaitWorkers(ctx context.Context, n int) error { return s.Disp.WaitWorkers(ctx, n) }

// Close stops the load, the crediting and every server, newest first.
func (s *Swarm) Close() error {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	var errs []error
	for i := len(s.closes) - 1; i >= 0; i-- {
		if err := s.closes[i](); err != nil {
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("swarmtest: close: %w", errors.Join(errs...))
	}
	return nil
}
