package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/credit"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
)

// The lines the children print once they listen (backbone/cmd_hub.go,
// cmd_gateway.go); submatch 1 is the bound address.
var (
	hubListening     = regexp.MustCompile(`^hub: listening on (\S+),`)
	gatewayListening = regexp.MustCompile(`^gateway: listening on (\S+) \(TLS\)`)
)

// Config configures a Swarm.
type Config struct {
	// Bin is the backbone binary (os.Executable() for the running one).
	Bin string
	// Env is added to every child's environment ("KEY=value").
	Env []string
	// Dir holds every file of the swarm: hub secret, ledger, wallets,
	// TLS pair, worker keys. It must exist.
	Dir string
	// Backbone is the dispatch listener (host:port) the hub bridges to.
	Backbone string
	// RateNKVRPerByte is the gateway's price (0: its default, 7).
	RateNKVRPerByte uint64
	// CreditEvery is the gateway's ledger polling period (0: 200 ms).
	CreditEvery time.Duration
	// Log receives every child's output, prefixed by its name (nil: none).
	Log io.Writer
	// StartTimeout bounds the wait for each child to listen (0: 30 s).
	StartTimeout time.Duration
}

// Swarm is a hub and a TLS gateway (with crediting) running as child
// processes on loopback, and the workers added to it.
type Swarm struct {
	cfg Config

	HubAddr     string // host:port the hub listens on
	GatewayAddr string // host:port of the gateway's TLS listener
	GatewayURL  string // wss://GatewayAddr
	CAFile      string // the gateway's self-signed certificate (PEM), for --ca
	SecretFile  string // shared hub<->gateway secret (hex)
	LedgerFile  string // the hub's --ledger
	WalletsFile string // the gateway's --wallets

	Hub, Gateway *Proc

	mu      sync.Mutex
	workers []*Proc
}

// StartSwarm writes a fresh hub secret to cfg.Dir, then starts `hub
// --ledger` and `gateway --self-signed-out --wallets` on 127.0.0.1:0 and
// waits until both listen. On error it stops whatever it started.
func StartSwarm(ctx context.Context, cfg Config) (_ *Swarm, err error) {
	if cfg.CreditEvery <= 0 {
		cfg.CreditEvery = 200 * time.Millisecond
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	s := &Swarm{cfg: cfg,
		SecretFile:  filepath.Join(cfg.Dir, "hub-secret"),
		LedgerFile:  filepath.Join(cfg.Dir, "ledger.sqlite"),
		WalletsFile: filepath.Join(cfg.Dir, "wallets.sqlite"),
		CAFile:      filepath.Join(cfg.Dir, "tls", "gateway.crt"),
	}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	var secret [32]byte
	if _, err := rand.Read(secret[:]); err != nil {
		return nil, err
	}
	if err := os.WriteFile(s.SecretFile, []byte(hex.EncodeToString(secret[:])+"\n"), 0o600); err != nil {
		return nil, err
	}
	s.Hub, err = s.start(ctx, "hub", hubListening, &s.HubAddr, "hub", "--listen", "127.0.0.1:0",
		"--backbone", cfg.Backbone, "--secret-file", s.SecretFile, "--ledger", s.LedgerFile)
	if err != nil {
		return nil, err
	}
	gwArgs := []string{"gateway", "--listen", "127.0.0.1:0", "--hub", s.HubAddr, "--secret-file", s.SecretFile,
		"--self-signed-out", filepath.Join(cfg.Dir, "tls"), "--wallets", s.WalletsFile,
		"--credit-every", cfg.CreditEvery.String()}
	if cfg.RateNKVRPerByte != 0 {
		gwArgs = append(gwArgs, "--rate-nkvr-per-byte", strconv.FormatUint(cfg.RateNKVRPerByte, 10))
	}
	s.Gateway, err = s.start(ctx, "gateway", gatewayListening, &s.GatewayAddr, gwArgs...)
	if err != nil {
		return nil, err
	}
	s.GatewayURL = "wss://" + s.GatewayAddr
	return s, nil
}

func (s *Swarm) start(ctx context.Context, name string, re *regexp.Regexp, addr *string, args ...string) (*Proc, error) {
	p, err := Start(name, s.cfg.Log, s.cfg.Env, s.cfg.Bin, args...)
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.StartTimeout)
	defer cancel()
	m, err := p.Await(wctx, re)
	if err != nil {
		p.Stop(2 * time.Second)
		return nil, err
	}
	*addr = m[1]
	return p, nil
}

// AddWorker starts `backbone worker --gateway GatewayURL --ca CAFile --key
// Dir/NAME.key --slice slicePath` plus extra flags (e.g. "--threads", "1")
// as the child name; with slicePath "" there is no --slice (extra then
// says what to serve, e.g. "--model-tiny"). It does not wait for the worker to connect: the
// dispatcher's WaitWorkers does.
func (s *Swarm) AddWorker(name, slicePath string, extra ...string) (*Proc, error) {
	args := append([]string{"worker", "--gateway", s.GatewayURL, "--ca", s.CAFile,
		"--key", s.KeyFile(name)}, extra...)
	if slicePath != "" {
		args = append(args, "--slice", slicePath)
	}
	p, err := Start(name, s.cfg.Log, s.cfg.Env, s.cfg.Bin, args...)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.workers = append(s.workers, p)
	s.mu.Unlock()
	return p, nil
}

// KeyFile is the identity key file (engine/worker.LoadOrCreateKeyFile)
// of the worker AddWorker started as name.
func (s *Swarm) KeyFile(name string) string { return filepath.Join(s.cfg.Dir, name+".key") }

// Workers returns the worker processes in the order they were added.
func (s *Swarm) Workers() []*Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*Proc(nil), s.workers...)
}

// StopWorkers stops every worker (SIGTERM, then SIGKILL after grace) in
// parallel and waits for them; their sessions end at the hub, which
// appends each session's final ledger row.
func (s *Swarm) StopWorkers(grace time.Duration) {
	var wg sync.WaitGroup
	for _, w := range s.Workers() {
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Stop(grace) }()
	}
	wg.Wait()
}

// Close stops the workers, then the gateway, then the hub, and waits for
// all of them. It is safe to call more than once.
func (s *Swarm) Close() {
	s.StopWorkers(5 * time.Second)
	if s.Gateway != nil {
		_ = s.Gateway.Stop(5 * time.Second)
	}
	if s.Hub != nil {
		_ = s.Hub.Stop(5 * time.Second)
	}
}

// Settled is what the hub metered and the gateway credited once every
// session given to Settle ended.
type Settled struct {
	Ledger  []ledger.WorkerTotal // per worker, from the hub's ledger file
	Wallets []credit.Wallet      // per worker, from the gateway's wallets file
	LastID  int64                // the ledger's last row id, which the gateway's cursor reached
}

// Settle waits until the hub's ledger holds the final row of each of the
// given hub session ids (the workers' sessions must have ended, e.g. after
// StopWorkers) and the gateway's crediting cursor reached the ledger's last
// row, then reads both files (SQLite WAL: safe beside the running hub and
// gateway). It polls every 50 ms until ctx ends.
func (s *Swarm) Settle(ctx context.Context, sessions []string) (*Settled, error) {
	l, err := ledger.Open(s.LedgerFile)
	if err != nil {
		return nil, err
	}
	defer l.Close()
	final := map[string]bool{}
	var after int64
	for {
		es, err := l.Read(ctx, after, 0)
		if err != nil {
			return nil, err
		}
		for _, e := range es {
			after = e.ID
			if e.Final {
				final[e.SessionID] = true
			}
		}
		missing := 0
		for _, id := range sessions {
			if !final[id] {
				missing++
			}
		}
		if missing == 0 && len(es) == 0 {
			break
		}
		if len(es) == 0 {
			if err := sleep(ctx, 50*time.Millisecond); err != nil {
				return nil, fmt.Errorf("demo: waiting for the final ledger rows of %d sessions: %w", missing, err)
			}
		}
	}
	out := &Settled{LastID: after}
	if out.Ledger, err = l.Totals(); err != nil {
		return nil, err
	}
	w, err := credit.Open(credit.Config{Path: s.WalletsFile, Source: noSource{}})
	if err != nil {
		return nil, err
	}
	defer w.Close()
	for {
		cur, err := w.Cursor()
		if err != nil {
			return nil, err
		}
		if cur >= out.LastID {
			break
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return nil, fmt.Errorf("demo: waiting for the gateway to credit up to ledger row %d (at %d): %w", out.LastID, cur, err)
		}
	}
	if out.Wallets, err = w.Wallets(); err != nil {
		return nil, err
	}
	return out, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// noSource is the ledger source of a wallets file opened only to read it.
type noSource struct{}

func (noSource) Read(context.Context, int64, int) ([]ledger.Entry, error) {
	return nil, errors.New("demo: wallets file opened read-only")
}
