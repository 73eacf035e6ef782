// Package dispatch is the backbone side of the swarm: it accepts the hub's
// links (one per worker session, engine/wire link framing), keeps track of the
// connected workers and the (layer, expert) pairs they hold, and implements
// expert.Computer by sending each worker one DISPATCH per call with all the
// rows routed to its experts (split so that no frame exceeds
// wire.MaxMessage), computing locally (Config.Fallback) whatever no worker
// holds or no worker delivered in time.
//
// The result never depends on who computed what: every (row, slot) output is
// written to its own place in out. A pair a worker did not deliver in time,
// delivered in the wrong shape, or refused goes first to another connected
// worker holding the expert (a replica), within the time the step has left,
// and is otherwise recomputed by Fallback. A call never waits longer than
// the per-request deadline (adaptive from the worker's recent round trips,
// bounded by [MinDeadline, MaxDeadline]) plus one local recomputation.
//
// Trust (verify.go, docs/accounting.md): the first Probation results of a
// session, and then a random CheckRate of them chosen when the request is
// sent, are recomputed locally and compared bit for bit (CPU workers) or
// within Tolerance (other declared backends). A mismatch is never used: the
// pairs take the local outputs, the hub is told to forfeit the session's
// unsettled bytes (wire.LinkForfeit), the session is closed and the worker
// key banned for BanFor (Bans, durable in BanFile).
//
// Row sums (wire 6, sum.go): ComputeExpertsSum (expert.SumComputer) sends a
// row whose k experts one worker holds to it as a DISPATCH_SUM, answered by
// the row's router-weighted sum (d floats instead of k x d), bit-identical
// to summing the k outputs locally; the other rows take the per-pair paths.
//
// Capacity (issue 12, capacity.go): a backbone that holds only some experts
// (Config.LocalHeld, e.g. a backbone-only model file) sends every other
// pair to workers only. Pairs it cannot recompute are verified by replica
// comparison (the same request to a second holder, a third one deciding a
// disagreement), and a pair no connected worker holds waits for a holder up
// to Config.HolderWait, after which the call fails with a *MissingError
// (ErrNoHolder): never with a wrong or made-up output.
//
// Quorum (issue 20, quorum.go): with Config.Verify = VerifyQuorum every
// request goes to two holders under different keys, the second answering
// with a DIGEST (wire 4) when both are CPU backends, and an answer is used
// only when the two agree; a disagreement or a missing answer is decided by
// Fallback or, for pairs it cannot compute, by further holders; the liar is
// handled as above. No single dishonest worker can change an output.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"runtime"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/idlespin"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Model gives the shapes the dispatcher validates frames against.
type Model struct {
	ID      string // model identity workers must announce in HELLO ("" accepts any)
	D       int    // hidden size (floats per row)
	K       int    // experts per row (top-k)
	NLayer  int    // layers
	NExpert int    // experts per layer
}

// Config configures a Dispatcher. Zero durations take the defaults noted.
type Config struct {
	Listen   string          // host:port of the dispatch listener the hub dials
	Model    Model           // shapes; all fields but ID must be > 0
	Fallback expert.Computer // computes any (layer, expert) locally; required
	// ExpertHash, when set, gives the SHA-256 of an expert's bytes; holdings
	// announced with another hash are not used (they do not count in WELCOME's
	// accepted). ok=false means the expert is unknown to the backbone.
	ExpertHash func(layer, expert int) (sum [32]byte, ok bool)

	MinDeadline time.Duration // default 50 ms
	MaxDeadline time.Duration // default 5 s; also the deadline until a worker has 4 samples
	// StallBackoffMax bounds how long a worker that missed a deadline (or
	// answered an ERROR) and has not answered since is routed around
	// before it gets one more request: 1 s after the first miss of a run,
	// doubling at each miss up to this; default 1 minute.
	StallBackoffMax time.Duration
	DeadlineMargin  time.Duration // added to 3 x p99; default 20 ms
	HelloTimeout    time.Duration // default 10 s
	IdleTimeout     time.Duration // close a link silent this long (workers ping every 20 s); default 90 s
	Logger          *slog.Logger

	// Catalog, when set, turns provisioning on (see provision.go): workers
	// announcing a quota in HELLO are assigned experts and fetch their bytes
	// from it. ExpertHash defaults to Catalog.Hash.
	Catalog *slice.Catalog
	// ChunkSize is the CHUNK size in bytes, clamped to
	// [wire.MinChunk, wire.MaxChunk]; default 1 MiB.
	ChunkSize int
	// RateLimit bounds the expert bytes sent to one worker, bytes/s (token
	// bucket with a burst of one chunk); 0: unlimited.
	RateLimit float64
	// HotShare is the share of a layer's routed rows (pairs / rows, in
	// [0, 1]) at or above which an expert is hot and stays on the backbone;
	// default 0.9; > 1 disables. HotMinTokens is how many rows of the layer
	// must have been routed before any expert counts as hot; default 256.
	HotShare     float64
	HotMinTokens uint64
	// Replicas is how many workers should hold each routed expert; default 2.
	Replicas int
	// ReplanEvery reruns the assignment as routing statistics evolve;
	// default 30 s.
	ReplanEvery time.Duration
	// Source is the model source announced in ASSIGN: the http(s) URL of
	// the full model file, from which workers fetch their experts' byte
	// ranges (Catalog.Ranges) instead of asking for CHUNKs. Required when
	// the Catalog holds no bytes (a backbone-only file's).
	Source string

	// LocalHeld, when set, reports which (layer, expert) pairs Fallback
	// can compute (a backbone-only model's hot experts); nil means every
	// pair. Pairs it cannot compute go to workers only (capacity.go):
	// verified by replica comparison, waited for when no worker holds them,
	// never computed here. With LocalHeld set, provisioning keeps the
	// locally held experts off the workers and replicates every expert,
	// not only routed ones.
	LocalHeld func(layer, expert int) bool
	// HolderWait is how long a call waits for a connected worker holding a
	// pair it needs and cannot compute locally (none connected, or all
	// holders failed, or two holders disagree and a third must decide)
	// before failing with a *MissingError; default DefaultHolderWait.
	HolderWait time.Duration

	// Probation is how many checked results a session must pass before
	// its results are only sampled; 0 means DefaultProbation, negative
	// none.
	Probation int
	// CheckRate is the probability, drawn for each request when it is sent
	// (so the worker cannot tell), that a result after probation is
	// checked; 0 means DefaultCheckRate, negative 0 (none), at most 1.
	CheckRate float64
	// Tolerance is the bound for workers whose HELLO backend is not a CPU
	// backend ("cpu" or "cpu-*", held to exact bits): a checked output row
	// y passes when ||y - ref||_2 <= Tolerance * ||ref||_2. 0 means
	// DefaultTolerance; negative refuses such workers at HELLO.
	Tolerance float64
	// BanFile keeps the bans across restarts (OpenBans); "" keeps them in
	// memory only. Bans, when set, is used instead.
	BanFile string
	Bans    *Bans
	// Verify is the verification policy: VerifySpot ("" too: probation
	// and random checks, the fields above) or VerifyQuorum (quorum.go:
	// every answer confirmed by a second holder under another key, or
	// computed here; Probation is not used, CheckRate is the share of
	// requests whose agreed outputs are also compared with Fallback's
	// (audits: two colluding holders that agree on a lie are caught),
	// Replicas is at least 2 and every expert is replicated).
	Verify VerifyMode
	// Hedge turns on latency-aware replica choice and hedged requests
	// (issue 19, hedge.go): each pair goes to one of its fastest holders,
	// and a request later than its holder's recent p95 is sent again to
	// another holder of all its pairs, the first valid answer used. Spot
	// verification only (quorum requests are never hedged).
	Hedge bool
	// NoRowSums turns row sums off (sum.go): ComputeExpertsSum then
	// sends every pair as ComputeExperts does and sums locally. By
	// default a row whose k experts one worker holds is sent to it as a
	// DISPATCH_SUM (wire 6) and answered with d floats instead of k x d.
	NoRowSums bool
	// BanFor is how long a worker key caught returning a wrong result (or
	// a result for a request it was never sent) is refused; default
	// DefaultBanFor.
	BanFor time.Duration
	// SpinWait is the longest a call keeps the machine's CPUs spinning
	// (engine/idlespin: one SCHED_IDLE thread per CPU, up to GOMAXPROCS)
	// while it waits for workers, so that the answer's reader and the
	// layers after it run on CPUs that never halted (issue 19: 2-3 ms per
	// 13 ms round trip on a virtual machine without it). 0 means
	// DefaultSpinWait, negative off. The spinner threads are per process:
	// the first dispatcher started with spinning on sets their maximum.
	// Where the build has none (CGO_ENABLED=0, not Linux), Start logs it
	// and the calls wait as before.
	SpinWait time.Duration
	// SpinMinWait: calls spin only while the dispatcher's recent calls
	// waited at least this long on average (an EWMA of the wall time from
	// a call's first request to its end, 1/8 per call); 0 means
	// DefaultSpinMinWait. Sub-millisecond round trips (a loopback swarm)
	// ran slower with the spinners up: their many short waits keep waking
	// them, for halts too short to cost much (docs/BENCHMARKS-by-hand.md,
	// "Idle spinning through the round trip").
	SpinMinWait time.Duration
}

// Verification defaults (docs/accounting.md, "Verification and forfeit",
// derives them: with the hub's default settle window of 128 results, a lie
// costs a worker more in expectation than it can save).
const (
	// DefaultProbation is Config.Probation's default: checked results a
	// session passes before sampling starts.
	DefaultProbation = 32
	// DefaultCheckRate is Config.CheckRate's default: 1 result in 20.
	DefaultCheckRate = 0.05
	// DefaultTolerance is Config.Tolerance's default: relative L2 error per
	// output row allowed to a non-CPU backend.
	DefaultTolerance = 1.0 / 128
	// MaxTolerance bounds Config.Tolerance: an answer off by half of its
	// norm is not an approximation of it.
	MaxTolerance = 0.5
	// DefaultBanFor is Config.BanFor's default.
	DefaultBanFor = 24 * time.Hour
	// DefaultHolderWait is Config.HolderWait's default.
	DefaultHolderWait = 30 * time.Second
	// DefaultSpinWait is Config.SpinWait's default: longer than a
	// continent's round trip, short enough that a stalled worker does not
	// keep the CPUs busy for nothing.
	DefaultSpinWait = 100 * time.Millisecond
	// DefaultSpinMinWait is Config.SpinMinWait's default: above a LAN's or
	// a loopback swarm's round trips (0.6-0.8 ms in the demo, where
	// spinning on every call cost a tenth of its tok/s), below any WAN's
	// (13 ms: 1.5-2.7 ms less per remote layer with spinning).
	DefaultSpinMinWait = 2 * time.Millisecond
)

// Errors returned (wrapped) by ComputeExperts.
var (
	ErrShape  = errors.New("dispatch: argument shapes do not match the model")
	ErrClosed = errors.New("dispatch: dispatcher closed")
)

// Dispatcher routes expert computations to connected workers. It implements
// expert.Computer, expert.SumComputer (row sums, sum.go) and
// expert.Delegator, and is safe for concurrent use.
type Dispatcher struct {
	cfg  Config
	log  *slog.Logger
	lim  wire.Limits
	outs wire.FloatPool // the RESULT outputs lim.Floats hands out; calls give them back when they end
	ln   net.Listener
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	workers map[string]*conn // by session id, HELLO done
	gone    []WorkerStats    // closed sessions, most recent last (bounded)
	index   map[uint64][]*conn
	// layerFree[l]: no indexed worker holds any expert of layer l and
	// Fallback holds them all (DelegatesLayer); rebuilt with index.
	// localAll[l]: Fallback holds every expert of layer l (LocalHeld).
	layerFree, localAll []bool
	changed             chan struct{} // closed and replaced when the worker set changes

	bans *Bans
	spin bool // calls keep the CPUs spinning while they wait (Config.SpinWait, Start)
	// waitEWMA is the moving average of calls' waits, ns (from the first
	// request to the end; 1/8 per call that sent requests): spinning is
	// on while it is at least Config.SpinMinWait.
	waitEWMA atomic.Int64

	calls, reqs          atomic.Uint64
	remote, local, fails atomic.Uint64
	// Verification and failover (Stats).
	checks, checkPairs, mismatches, caught, refusedBanned atomic.Uint64
	checkNanos                                            atomic.Int64
	failovers, replicaPairs, splits                       atomic.Uint64
	hedges, hedgeWins, hedgeLost                          atomic.Uint64
	sumReqs, sumRows                                      atomic.Uint64 // row sums (sum.go)
	// Capacity (capacity.go).
	crossChecks, disputes, unverified, holderWaits, noHolder atomic.Uint64
	holderWaitNanos                                          atomic.Int64
	// Quorum (quorum.go).
	quorumReqs, quorumAgreed, quorumLocal, quorumDisputes, quorumAsks, quorumAudits, digests atomic.Uint64
	planUncovered, planNeed, planQuota                                                       atomic.Int64

	wmu    sync.Mutex
	wakes  [256]int64 // ring of recent answers' wake times (timing.go), ns
	nwakes int

	usage []atomic.Uint64 // (row, slot) pairs routed per (layer, expert): layer*NExpert + expert
	rows  []atomic.Uint64 // rows routed per layer
}

var _ expert.Computer = (*Dispatcher)(nil)

// New validates cfg and returns a Dispatcher that is not listening yet.
func New(cfg Config) (*Dispatcher, error) {
	m := cfg.Model
	if m.D <= 0 || m.K <= 0 || m.NLayer <= 0 || m.NExpert <= 0 || m.K > m.NExpert || m.NLayer > 0xFFFF {
		return nil, fmt.Errorf("%w: model %+v", ErrShape, m)
	}
	if cfg.Fallback == nil {
		return nil, errors.New("dispatch: Fallback computer required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.MinDeadline, 50*time.Millisecond)
	def(&cfg.MaxDeadline, 5*time.Second)
	def(&cfg.StallBackoffMax, time.Minute)
	def(&cfg.DeadlineMargin, 20*time.Millisecond)
	def(&cfg.HelloTimeout, 10*time.Second)
	def(&cfg.IdleTimeout, 90*time.Second)
	def(&cfg.ReplanEvery, 30*time.Second)
	def(&cfg.HolderWait, DefaultHolderWait)
	if cfg.ChunkSize <= 0 {
		cfg.ChunkSize = 1 << 20
	}
	cfg.ChunkSize = max(wire.MinChunk, min(wire.MaxChunk, cfg.ChunkSize))
	if cfg.HotShare <= 0 {
		cfg.HotShare = 0.9
	}
	if cfg.HotMinTokens == 0 {
		cfg.HotMinTokens = 256
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 2
	}
	switch {
	case cfg.Probation == 0:
		cfg.Probation = DefaultProbation
	case cfg.Probation < 0:
		cfg.Probation = 0
	}
	// NaN would turn checks off (rate) or fail every honest answer
	// (tolerance); +Inf would pass every answer.
	if math.IsNaN(cfg.CheckRate) || math.IsInf(cfg.CheckRate, 0) {
		return nil, fmt.Errorf("dispatch: check rate %v: want a number in [0, 1]", cfg.CheckRate)
	}
	if math.IsNaN(cfg.Tolerance) || math.IsInf(cfg.Tolerance, 0) || cfg.Tolerance > MaxTolerance {
		return nil, fmt.Errorf("dispatch: tolerance %v: want a relative error in (0, %g], or negative (CPU workers only)", cfg.Tolerance, MaxTolerance)
	}
	switch {
	case cfg.CheckRate == 0:
		cfg.CheckRate = DefaultCheckRate
	case cfg.CheckRate < 0:
		cfg.CheckRate = 0
	}
	cfg.CheckRate = min(cfg.CheckRate, 1)
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultTolerance
	}
	def(&cfg.BanFor, DefaultBanFor)
	if cfg.SpinWait == 0 {
		cfg.SpinWait = DefaultSpinWait
	}
	def(&cfg.SpinMinWait, DefaultSpinMinWait)
	v, err := ParseVerifyMode(string(cfg.Verify))
	if err != nil {
		return nil, err
	}
	cfg.Verify = v
	if v == VerifyQuorum {
		cfg.Replicas = max(cfg.Replicas, 2)
	}
	if maxFramePairs(m.D) < 1 || maxFrameRows(m.D, m.K) < 1 {
		return nil, fmt.Errorf("%w: d %d, k %d: one row does not fit a %d-byte frame", ErrShape, m.D, m.K, wire.MaxMessage)
	}
	bans := cfg.Bans
	if bans == nil {
		var err error
		if bans, err = OpenBans(cfg.BanFile); err != nil {
			return nil, err
		}
	}
	if cat := cfg.Catalog; cat != nil {
		h := cat.Header()
		if h.NLayer != m.NLayer || h.NExpert != m.NExpert || h.DModel != m.D {
			return nil, fmt.Errorf("%w: catalog has %d layers of %d experts, d %d; model %+v", ErrShape, h.NLayer, h.NExpert, h.DModel, m)
		}
		if cfg.ExpertHash == nil {
			cfg.ExpertHash = cat.Hash
		}
		if !cat.HasBytes() && cfg.Source == "" {
			return nil, errors.New("dispatch: the provisioning catalog holds no expert bytes (a backbone-only model): a model Source URL is required")
		}
		if cs := cat.ChunkSize(); cs != 0 {
			cfg.ChunkSize = cs
		}
	}
	if cfg.Source != "" && cfg.Catalog == nil {
		return nil, errors.New("dispatch: a model Source needs provisioning (Catalog)")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Dispatcher{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}), bans: bans,
		workers: map[string]*conn{}, index: map[uint64][]*conn{}, changed: make(chan struct{}),
		usage: make([]atomic.Uint64, m.NLayer*m.NExpert), rows: make([]atomic.Uint64, m.NLayer)}
	d.lim = wire.Limits{D: m.D, K: m.K, NLayer: m.NLayer, NExpert: m.NExpert,
		MaxRows: wire.MaxMessage / (4 * (m.D + m.K)), Floats: d.outs.Get}
	d.localAll = make([]bool, m.NLayer)
	for l := range d.localAll {
		d.localAll[l] = cfg.Fallback != nil
		for e := 0; e < m.NExpert && d.localAll[l]; e++ {
			d.localAll[l] = d.localOK(l, e)
		}
	}
	d.layerFree = d.freeLayers(d.index)
	return d, nil
}

// Start binds the dispatch listener and accepts links in the background.
func (d *Dispatcher) Start() error {
	ln, err := net.Listen("tcp", d.cfg.Listen)
	if err != nil {
		return fmt.Errorf("dispatch: %w", err)
	}
	d.ln = ln
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		var wait time.Duration // backoff after failed accepts
		for {
			c, err := ln.Accept()
			if err != nil {
				select {
				case <-d.stop:
					return
				default:
				}
				if errors.Is(err, net.ErrClosed) {
					return
				}
				// Out of file descriptors (EMFILE) and the like pass:
				// back off and accept again, as net/http does, instead
				// of leaving the swarm closed to workers for good.
				wait = min(max(2*wait, 5*time.Millisecond), time.Second)
				d.log.Error("dispatch: accept; retrying", "err", err, "in", wait)
				select {
				case <-d.stop:
					return
				case <-time.After(wait):
				}
				continue
			}
			wait = 0
			d.wg.Add(1)
			go func() { defer d.wg.Done(); d.serveLink(c) }()
		}
	}()
	if d.cfg.Catalog != nil {
		d.wg.Add(1)
		go func() {
			defer d.wg.Done()
			t := time.NewTicker(d.cfg.ReplanEvery)
			defer t.Stop()
			for {
				select {
				case <-d.stop:
					return
				case <-t.C:
					d.plan()
				}
			}
		}()
	}
	if d.cfg.SpinWait > 0 {
		if err := idlespin.Start(runtime.GOMAXPROCS(0), d.cfg.SpinWait); err != nil {
			d.log.Info("dispatch: CPUs not kept spinning through round trips", "err", err)
		} else {
			d.spin = true
		}
	}
	d.log.Info("dispatch listening", "addr", ln.Addr().String())
	return nil
}

// Addr is the bound listen address (after Start).
func (d *Dispatcher) Addr() string { return d.ln.Addr().String() }

// Close stops accepting links, closes every session and waits.
func (d *Dispatcher) Close() error {
	select {
	case <-d.stop:
		return nil
	default:
	}
	close(d.stop)
	var err error
	if d.ln != nil {
		err = d.ln.Close()
	}
	d.mu.Lock()
	ws := make([]*conn, 0, len(d.workers))
	for _, c := range d.workers {
		ws = append(ws, c)
	}
	d.mu.Unlock()
	for _, c := range ws {
		c.close(wire.CodeShutdown, "backbone shutting down")
	}
	d.wg.Wait()
	return err
}

// WaitWorkers blocks until at least n workers have completed HELLO, or ctx is
// done (returning ctx.Err()).
func (d *Dispatcher) WaitWorkers(ctx context.Context, n int) error {
	for {
		d.mu.Lock()
		have, ch := len(d.workers), d.changed
		d.mu.Unlock()
		if have >= n {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-d.stop:
			return ErrClosed
		}
	}
}

// freeLayers returns, per layer, whether no worker of idx holds any of its
// experts and Fallback holds them all (localAll): one pass over idx.
func (d *Dispatcher) freeLayers(idx map[uint64][]*conn) []bool {
	free := slices.Clone(d.localAll)
	for k, cs := range idx {
		if l := int(k >> 32); len(cs) > 0 && l < len(free) {
			free[l] = false
		}
	}
	return free
}

func key(layer, e int) uint64 { return uint64(layer)<<32 | uint64(uint32(e)) }

// rebuild recomputes the holder index; d.mu must be held.
func (d *Dispatcher) rebuildLocked() {
	idx := map[uint64][]*conn{}
	ids := make([]string, 0, len(d.workers))
	for s := range d.workers {
		ids = append(ids, s)
	}
	sort.Strings(ids) // deterministic replica order
	for _, s := range ids {
		c := d.workers[s]
		if c.paused.Load() || c.stalled.Load() {
			continue
		}
		for k := range c.holds {
			idx[k] = append(idx[k], c)
		}
	}
	d.index = idx
	d.layerFree = d.freeLayers(idx)
	close(d.changed)
	d.changed = make(chan struct{})
}
