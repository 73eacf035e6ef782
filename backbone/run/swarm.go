package run

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

// SwarmConfig configures StartSwarm.
type SwarmConfig struct {
	// Listen is the dispatcher's listen address (LAN host:port; port 0
	// picks one) for the hub's worker links. It must be loopback or
	// private (hub.CheckListenAddr) unless AllowPublic: the links are
	// not authenticated.
	Listen      string
	AllowPublic bool
	// Workers, if > 0, makes StartSwarm wait (bounded by its ctx) until
	// that many workers are connected.
	Workers int
	// Listening, if set, is called with the bound address once the
	// dispatcher listens, before the wait for Workers.
	Listening func(addr string)
	// MinDeadline, if > 0, is the lower bound of a worker request's
	// adaptive deadline (dispatch.Config.MinDeadline; MaxDeadline is raised
	// to at least it). 0 keeps dispatch's defaults.
	MinDeadline time.Duration
	// Provision turns provisioning on: workers that announce a disk quota
	// are assigned experts and download them from the model's file
	// (dispatch.Config.Catalog, engine/slice.NewCatalog).
	Provision bool
	// ProvisionRate bounds the expert bytes sent to one worker, bytes/s; 0
	// is unlimited.
	ProvisionRate int64
	// Source is the model source announced to provisioned workers: the
	// http(s) URL of the full model file, from which they fetch their
	// experts' byte ranges (dispatch.Config.Source). "" uses a
	// backbone-only file's stored URL, or CHUNKs from a full file.
	Source string
	// HolderWait bounds how long a step waits for a worker holding an
	// expert the backbone cannot compute (dispatch.Config.HolderWait); 0
	// is dispatch's default.
	HolderWait time.Duration
	// Logger is the dispatcher's logger (nil: dispatch's default).
	Logger *slog.Logger
	// Tune, if set, has the last word on the dispatcher's configuration,
	// after the fields above (tests and benchmarks set deadlines with it).
	Tune func(*dispatch.Config)
}

// StartSwarm starts a dispatcher for m on c.Listen and, for c.Workers > 0,
// waits until that many workers are connected or ctx ends; ctx bounds only
// that wait, the dispatcher runs until its Close, which is the caller's.
//
// The dispatcher accepts workers announcing m's ID, uses a holding only if
// its hash equals the SHA-256 of m's own expert bytes (slice.HashExpert,
// computed once per expert on first use), and computes with m's local
// experts whatever no worker delivers in time. The caller installs it with
// m.Engine().SetExperts.
//
// For a backbone-only m the hashes are the file's stored ones, the local
// experts are only its hot ones (dispatch.Config.LocalHeld): every other
// pair is computed by workers, verified by replica comparison, and waited
// for (HolderWait) when no worker holds it. With Provision its catalog has
// no bytes: workers fetch them from the model source (Source, else the
// file's stored URL; an error if neither).
//
// Errors: "provisioning catalog" wrapping slice.NewCatalog's, those of
// dispatch.New and Start, or "waiting for N workers" wrapping
// WaitWorkers'. On error nothing is left running (a dispatcher whose Start
// failed holds nothing).
func StartSwarm(ctx context.Context, m *Model, c SwarmConfig) (*dispatch.Dispatcher, error) {
	if err := hub.CheckListenAddr(c.Listen, c.AllowPublic); err != nil {
		// Whoever reaches the listener can speak as any worker key (the
		// hub's link preamble is the hub's word, docs/protocol.md).
		return nil, fmt.Errorf("--dispatch-listen: %w (the hub's worker links are not authenticated: use a loopback or private address, or --dispatch-allow-public)", err)
	}
	cfg, err := dispatcherConfig(m, c)
	if err != nil {
		return nil, err
	}
	d, err := dispatch.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := d.Start(); err != nil {
		return nil, err
	}
	if c.Listening != nil {
		c.Listening(d.Addr())
	}
	if c.Workers > 0 {
		if err := d.WaitWorkers(ctx, c.Workers); err != nil {
			d.Close()
			return nil, fmt.Errorf("waiting for %d workers: %w", c.Workers, err)
		}
	}
	return d, nil
}

// dispatcherConfig is the dispatch.Config of StartSwarm: m's shapes, id,
// local experts as the fallback and their hashes, then c's deadline,
// provisioning and Tune.
func dispatcherConfig(m *Model, c SwarmConfig) (dispatch.Config, error) {
	p := m.m.Params()
	local := m.m.LocalExperts()
	if m.bo != nil {
		return backboneOnlyConfig(m, c)
	}
	var mu sync.Mutex
	hashes := map[[2]int][32]byte{}
	cfg := dispatch.Config{Listen: c.Listen, Fallback: local, Logger: c.Logger,
		Model: dispatch.Model{ID: m.id, D: p.Embd, K: p.ExpertsUsed, NLayer: p.ExpertLayers, NExpert: p.Experts},
		ExpertHash: func(l, e int) ([32]byte, bool) {
			if l < 0 || l >= local.NumLayers() {
				return [32]byte{}, false
			}
			mu.Lock()
			defer mu.Unlock()
			if h, ok := hashes[[2]int{l, e}]; ok {
				return h, true
			}
			h, ok := slice.HashExpert(local.Layer(l), e)
			if ok {
				hashes[[2]int{l, e}] = h
			}
			return h, ok
		}}
	if c.MinDeadline > 0 {
		cfg.MinDeadline = c.MinDeadline
		cfg.MaxDeadline = max(cfg.MaxDeadline, c.MinDeadline, 5*time.Second)
	}
	if c.Provision {
		cat, err := slice.NewCatalog(m.f)
		if err != nil {
			return dispatch.Config{}, fmt.Errorf("provisioning catalog: %w", err)
		}
		cfg.Catalog, cfg.RateLimit, cfg.Source = cat, float64(c.ProvisionRate), c.Source
	}
	cfg.HolderWait = c.HolderWait
	if c.Tune != nil {
		c.Tune(&cfg)
	}
	return cfg, nil
}

// backboneOnlyConfig is dispatcherConfig for a backbone-only m.
func backboneOnlyConfig(m *Model, c SwarmConfig) (dispatch.Config, error) {
	p := m.m.Params()
	local := m.m.LocalExperts()
	bo := m.bo
	cfg := dispatch.Config{Listen: c.Listen, Fallback: local, Logger: c.Logger, HolderWait: c.HolderWait,
		Model:      dispatch.Model{ID: m.id, D: p.Embd, K: p.ExpertsUsed, NLayer: p.ExpertLayers, NExpert: p.Experts},
		ExpertHash: bo.Sum,
		LocalHeld: func(l, e int) bool {
			ly := local.Layer(l)
			return ly != nil && ly.Held(e)
		}}
	if c.MinDeadline > 0 {
		cfg.MinDeadline = c.MinDeadline
		cfg.MaxDeadline = max(cfg.MaxDeadline, c.MinDeadline, 5*time.Second)
	}
	if c.Provision {
		cat, err := slice.NewBackboneCatalog(bo)
		if err != nil {
			return dispatch.Config{}, fmt.Errorf("provisioning catalog: %w", err)
		}
		cfg.Catalog, cfg.RateLimit, cfg.Source = cat, float64(c.ProvisionRate), c.Source
		if cfg.Source == "" {
			cfg.Source = bo.SourceURL
		}
		if cfg.Source == "" {
			return dispatch.Config{}, errors.New("provisioning a backbone-only model needs a model source: --model-source URL of the full GGUF (this file stores none)")
		}
	}
	if c.Tune != nil {
		c.Tune(&cfg)
	}
	return cfg, nil
}
