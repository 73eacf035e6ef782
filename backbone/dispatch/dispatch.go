// Package dispatch is the backbone side of the swarm: it accepts the hub's
// links (one per worker session, engine/wire link framing), keeps track of the
// connected workers and the (layer, expert) pairs they hold, and implements
// expert.Computer by sending each worker one DISPATCH per call with all the
// rows routed to its experts, computing locally (Config.Fallback) whatever no
// worker holds or a worker failed to return in time.
//
// The result never depends on who computed what: every (row, slot) output is
// written to its own place in out, and a pair a worker did not deliver in time,
// delivered in the wrong shape, or refused is recomputed by Fallback. A call
// never waits longer than the per-request deadline (adaptive from the worker's
// recent round trips, bounded by [MinDeadline, MaxDeadline]) plus the local
// recomputation.
package dispatch

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
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

	MinDeadline    time.Duration // default 50 ms
	MaxDeadline    time.Duration // default 5 s; also the deadline until a worker has 4 samples
	DeadlineMargin time.Duration // added to 3 x p99; default 20 ms
	HelloTimeout   time.Duration // default 10 s
	IdleTimeout    time.Duration // close a link silent this long (workers ping every 20 s); default 90 s
	Logger         *slog.Logger

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
}

// Errors returned (wrapped) by ComputeExperts.
var (
	ErrShape  = errors.New("dispatch: argument shapes do not match the model")
	ErrClosed = errors.New("dispatch: dispatcher closed")
)

// Dispatcher routes expert computations to connected workers. It implements
// expert.Computer and is safe for concurrent use.
type Dispatcher struct {
	cfg  Config
	log  *slog.Logger
	lim  wire.Limits
	ln   net.Listener
	stop chan struct{}
	wg   sync.WaitGroup

	mu      sync.Mutex
	workers map[string]*conn // by session id, HELLO done
	gone    []WorkerStats    // closed sessions, most recent last (bounded)
	index   map[uint64][]*conn
	changed chan struct{} // closed and replaced when the worker set changes

	calls, reqs          atomic.Uint64
	remote, local, fails atomic.Uint64

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
	def(&cfg.DeadlineMargin, 20*time.Millisecond)
	def(&cfg.HelloTimeout, 10*time.Second)
	def(&cfg.IdleTimeout, 90*time.Second)
	def(&cfg.ReplanEvery, 30*time.Second)
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
	if cat := cfg.Catalog; cat != nil {
		h := cat.Header()
		if h.NLayer != m.NLayer || h.NExpert != m.NExpert || h.DModel != m.D {
			return nil, fmt.Errorf("%w: catalog has %d layers of %d experts, d %d; model %+v", ErrShape, h.NLayer, h.NExpert, h.DModel, m)
		}
		if cfg.ExpertHash == nil {
			cfg.ExpertHash = cat.Hash
		}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	d := &Dispatcher{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}),
		workers: map[string]*conn{}, index: map[uint64][]*conn{}, changed: make(chan struct{}),
		usage: make([]atomic.Uint64, m.NLayer*m.NExpert), rows: make([]atomic.Uint64, m.NLayer)}
	d.lim = wire.Limits{D: m.D, K: m.K, NLayer: m.NLayer, NExpert: m.NExpert,
		MaxRows: wire.MaxMessage / (4 * (m.D + m.K))}
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
		for {
			c, err := ln.Accept()
			if err != nil {
				select {
				case <-d.stop:
					return
				default:
				}
				if ne, ok := err.(net.Error); ok && ne.Timeout() {
					continue
				}
				d.log.Error("dispatch: accept", "err", err)
				return
			}
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
		if c.paused.Load() {
			continue
		}
		for k := range c.holds {
			idx[k] = append(idx[k], c)
		}
	}
	d.index = idx
	close(d.changed)
	d.changed = make(chan struct{})
}

// pair is one (row, slot) of a call.
type pair struct{ r, s int32 }

// job is the part of one call sent to one worker.
type job struct {
	c     *conn
	req   uint64
	nrows int         // distinct rows in the DISPATCH
	bytes int         // DISPATCH message bytes
	pairs []pair      // in row-major (row, slot) order = RESULT order
	done  chan reply  // receives exactly one reply once the request leaves pending
	sent  time.Time   // when the DISPATCH was written
	timer *time.Timer // per-request deadline
}

// reply is a worker's answer to a job, or why there is none.
type reply struct {
	out []float32 // len(pairs) x D on success
	err error
}

// ComputeExperts implements expert.Computer (see its contract): out[r][s] is
// the output of expert ids[r*k+s] of layer on row r. k must equal the model's
// K. Each pair goes to a connected, unpaused worker holding that expert (the
// replica rotates per call), or to Fallback when none does; a worker's
// failure or lateness sends its pairs to Fallback. Errors: ErrShape (wrapped)
// for bad arguments, ctx.Err(), or Fallback's error.
func (d *Dispatcher) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	D := d.cfg.Model.D
	if n < 0 || k != d.cfg.Model.K || layer < 0 || layer >= d.cfg.Model.NLayer ||
		len(hidden) != n*D || len(ids) != n*k || len(out) != n*k*D {
		return fmt.Errorf("%w: layer %d n %d k %d, len(hidden) %d len(ids) %d len(out) %d (d %d)",
			ErrShape, layer, n, k, len(hidden), len(ids), len(out), D)
	}
	if n == 0 {
		return nil
	}
	for _, e := range ids {
		if e < 0 || int(e) >= d.cfg.Model.NExpert {
			return fmt.Errorf("%w: expert id %d", ErrShape, e)
		}
	}
	d.rows[layer].Add(uint64(n))
	for _, e := range ids {
		d.usage[layer*d.cfg.Model.NExpert+int(e)].Add(1)
	}
	seq := d.calls.Add(1)
	d.mu.Lock()
	idx := d.index
	d.mu.Unlock()

	var local []pair
	jobs := map[*conn]*job{}
	var order []*job
	for r := 0; r < n; r++ {
		for s := 0; s < k; s++ {
			e := int(ids[r*k+s])
			hs := idx[key(layer, e)]
			if len(hs) == 0 {
				local = append(local, pair{int32(r), int32(s)})
				continue
			}
			c := hs[(uint64(e)+seq)%uint64(len(hs))]
			j := jobs[c]
			if j == nil {
				j = &job{c: c, done: make(chan reply, 1)}
				jobs[c] = j
				order = append(order, j)
			}
			j.pairs = append(j.pairs, pair{int32(r), int32(s)})
		}
	}
	for _, j := range order {
		if err := d.send(j, layer, hidden, ids, k); err != nil {
			local = append(local, j.pairs...)
			j.pairs = nil
		}
	}
	// Compute locally while the workers compute.
	nLocal := len(local)
	if err := d.computeLocal(ctx, layer, hidden, ids, local, k, out); err != nil {
		d.abandon(order)
		return err
	}
	var retry []pair
	for _, j := range order {
		if j.pairs == nil {
			continue
		}
		rep, err := d.wait(ctx, j)
		if err != nil {
			d.abandon(order)
			return err
		}
		if rep.err != nil {
			d.fails.Add(1)
			d.log.Debug("dispatch: recomputing locally", "worker", short(j.c.worker), "req", j.req, "err", rep.err)
			retry = append(retry, j.pairs...)
			continue
		}
		for i, p := range j.pairs {
			copy(out[(int(p.r)*k+int(p.s))*D:][:D], rep.out[i*D:(i+1)*D])
		}
		d.remote.Add(uint64(len(j.pairs)))
	}
	if err := d.computeLocal(ctx, layer, hidden, ids, retry, k, out); err != nil {
		return err
	}
	d.local.Add(uint64(nLocal + len(retry)))
	return nil
}

// send writes j's DISPATCH and registers it as pending.
func (d *Dispatcher) send(j *job, layer int, hidden []float32, ids []int32, k int) error {
	D := d.cfg.Model.D
	rows := make([]int32, 0, len(j.pairs))
	for _, p := range j.pairs {
		if len(rows) == 0 || rows[len(rows)-1] != p.r {
			rows = append(rows, p.r)
		}
	}
	j.req = d.reqs.Add(1)
	msg := make([]byte, 0, wire.DispatchSize(len(rows), D, k))
	msg = (&wire.Dispatch{Request: j.req, Layer: uint16(layer), N: len(rows), D: D, K: k}).Append(msg)
	for _, r := range rows {
		msg = wire.AppendFloats(msg, hidden[int(r)*D:(int(r)+1)*D])
	}
	pi := 0
	for _, r := range rows {
		for s := 0; s < k; s++ {
			id := int32(-1)
			if pi < len(j.pairs) && j.pairs[pi].r == r && int(j.pairs[pi].s) == s {
				id = ids[int(r)*k+s]
				pi++
			}
			msg = append(msg, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
		}
	}
	j.bytes = len(msg)
	deadline := j.c.deadline(d.cfg, len(msg)+wire.ResultSize(len(j.pairs), D))
	j.nrows = len(rows)
	j.sent = time.Now()
	j.timer = time.NewTimer(deadline)
	if !j.c.addPending(j) {
		j.timer.Stop()
		return ErrClosed
	}
	if err := j.c.sendData(msg, deadline); err != nil {
		j.timer.Stop()
		j.c.take(j.req, false)
		j.c.close(wire.CodeShutdown, "link write failed: "+err.Error())
		return err
	}
	j.c.reqsSent.Add(1)
	return nil
}

// wait returns j's reply, or a timeout reply once its deadline passes.
// Only ctx's end is an error.
func (d *Dispatcher) wait(ctx context.Context, j *job) (reply, error) {
	defer j.timer.Stop()
	select {
	case rep := <-j.done:
		return rep, nil
	case <-j.timer.C:
		if j.c.take(j.req, true) != nil {
			j.c.timeouts.Add(1)
			return reply{err: fmt.Errorf("request %d: deadline exceeded", j.req)}, nil
		}
		return <-j.done, nil // the reader took it first; its reply is on the way
	case <-ctx.Done():
		return reply{}, ctx.Err()
	}
}

// abandon expires every still-pending job of a failed call.
func (d *Dispatcher) abandon(order []*job) {
	for _, j := range order {
		if j.pairs != nil && j.timer != nil {
			j.timer.Stop()
			j.c.take(j.req, true)
		}
	}
}

// computeLocal computes pairs with Fallback as one batch of m = len(pairs)
// rows and k = 1 (row i is hidden row pairs[i].r, its expert ids[r*k+s]) and
// scatters them into out. Batch invariance (expert.Computer's contract) makes
// each output bit-identical to computing the full call.
func (d *Dispatcher) computeLocal(ctx context.Context, layer int, hidden []float32, ids []int32, pairs []pair, k int, out []float32) error {
	m, D := len(pairs), d.cfg.Model.D
	if m == 0 {
		return nil
	}
	xs := make([]float32, m*D)
	es := make([]int32, m)
	for i, p := range pairs {
		copy(xs[i*D:(i+1)*D], hidden[int(p.r)*D:])
		es[i] = ids[int(p.r)*k+int(p.s)]
	}
	tmp := make([]float32, m*D)
	if err := d.cfg.Fallback.ComputeExperts(ctx, layer, xs, es, m, 1, tmp); err != nil {
		return fmt.Errorf("dispatch: local fallback: %w", err)
	}
	for i, p := range pairs {
		copy(out[(int(p.r)*k+int(p.s))*D:][:D], tmp[i*D:(i+1)*D])
	}
	return nil
}
