// Package hub is the LAN-only bridge between worker sessions (arriving from
// the gateway as WebSockets on /v1/worker) and the backbone's dispatch
// listener (one TCP link per session, framed as in engine/wire/link.go). It
// meters the bytes it bridges per session into the contribution ledger.
//
// Metering (docs/protocol.md, backbone/ledger): every WebSocket message is
// counted whole, both ways. Backbone->worker DISPATCH (and DISPATCH_DIGEST,
// DISPATCH_SUM, DISPATCH_SUM_DIGEST) messages are creditable (BytesOut). A
// worker's RESULT (or DIGEST, metered as the bytes of the RESULT it stands
// for, wire.DigestCredit; or the RESULT answering a DISPATCH_SUM, metered as
// the RESULT of the rows x k outputs summed in it, wire.SumCredit; or the
// DIGEST answering a DISPATCH_SUM_DIGEST, metered as that same RESULT,
// wire.SumDigestCredit) is held as pending under its request id until
// the backbone sends LinkAccepted (creditable BytesIn) or LinkRejected, or
// ResultHold passes, or the session ends (both: RejectedBytes). Worker
// messages that are not valid frames are rejected at once. Other control
// frames (HELLO, PING, PONG, PAUSE, ERROR, WELCOME) are overhead: counted in
// the session totals, neither credited nor rejected.
//
// Settling (docs/accounting.md, "Verification and forfeit"): creditable
// bytes reach the ledger only once settled: at least SettleDelay old
// (counted from when they were metered) and followed by at least
// SettleResults RESULTs of the session, or followed by SettleDelay without
// any RESULT (a paused or idle session), or when the session ends. Until then a LinkForfeit from the backbone (a result failed
// verification) turns them, and every later creditable byte of the
// session, into rejected bytes.
package hub

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/engine/wire"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Hub is a running hub. Create with New, then Start.
type Hub struct {
	appendErr atomic.Pointer[appendFailure] // the last flush's failed append (LedgerError)
	cfg       Config
	log       *slog.Logger
	srv       *http.Server
	ln        net.Listener
	nonces    nonceCache

	mu        sync.Mutex
	sessions  map[string]*session // being bridged
	finishing map[string]*session // ended, their final ledger row not yet appended
	ended     []SessionStats      // most recent last, bounded by maxEnded
	conns     uint64              // accepted /v1/worker upgrades
	closing   bool                // Close has begun: no new session

	met      *metrics
	gatherer prometheus.Gatherer
	toW      prometheus.Counter // met.bridged{dir="to_worker"}
	fromW    prometheus.Counter // met.bridged{dir="from_worker"}

	// unreachable: the backbone could not be dialled at the last upgrade
	// (since unreachableAt, with unreachableN refusals not logged since);
	// guarded by mu. A down backbone is logged once a minute, not at
	// every worker's retry.
	unreachable   bool
	unreachableAt time.Time
	unreachableN  int

	stopOnce sync.Once
	stop     chan struct{}
	wg       sync.WaitGroup // server and flush loop
	sessWG   sync.WaitGroup // session goroutines
	flushMu  sync.Mutex     // one flush at a time
}

const maxEnded = 1024

// New validates cfg (listen address, secret) and returns a Hub that is not
// yet listening. Errors wrap ErrPublic or ErrNoSecret.
func New(cfg Config) (*Hub, error) {
	if err := CheckListenAddr(cfg.Listen, cfg.AllowPublic); err != nil {
		return nil, err
	}
	if len(cfg.Secret) < 16 {
		return nil, ErrNoSecret
	}
	if cfg.Backbone == "" {
		return nil, errors.New("hub: Backbone address required")
	}
	if err := CheckDialAddr(cfg.Backbone); err != nil {
		return nil, fmt.Errorf("hub: backbone address %w", err)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.MaxSkew, DefaultMaxSkew)
	def(&cfg.IdleTimeout, 75*time.Second)
	def(&cfg.ResultHold, 60*time.Second)
	def(&cfg.FlushEvery, time.Second)
	def(&cfg.DialTimeout, 5*time.Second)
	def(&cfg.DrainTimeout, 10*time.Second)
	def(&cfg.CloseRetry, 20*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	h := &Hub{cfg: cfg, log: cfg.Logger, sessions: map[string]*session{}, finishing: map[string]*session{}, stop: make(chan struct{})}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	h.gatherer = reg
	met, err := newMetrics(h, reg)
	if err != nil {
		return nil, fmt.Errorf("hub: metrics: %w", err)
	}
	h.met = met
	h.toW, h.fromW = met.bridged.WithLabelValues("to_worker"), met.bridged.WithLabelValues("from_worker")
	mux := http.NewServeMux()
	mux.HandleFunc(wire.WorkerPath, h.serveWorker)
	mux.Handle(MetricsPath, h.MetricsHandler())
	for p, x := range cfg.Extra {
		mux.Handle(p, x)
	}
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn),
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			if bc, ok := c.(*wire.BatchConn); ok {
				return context.WithValue(ctx, batchConnKey{}, bc)
			}
			return ctx
		}}
	return h, nil
}

// Start binds the listen address and serves in the background.
func (h *Hub) Start() error {
	if err := h.unspill(); err != nil {
		return err
	}
	if err := h.checkSpillWritable(); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", h.cfg.Listen)
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	h.ln = ln
	h.wg.Add(2)
	go func() { defer h.wg.Done(); _ = h.srv.Serve(batchListener{ln}) }()
	go func() { defer h.wg.Done(); h.flushLoop() }()
	h.log.Info("hub listening", "addr", ln.Addr().String(), "backbone", h.cfg.Backbone)
	return nil
}

// batchListener gives the hub's HTTP server its connections as
// wire.BatchConns, which the server's ConnContext puts in each request's
// context (batchConnKey) for the bridge.
type batchListener struct{ net.Listener }

// Accept returns the next connection with batching.
func (l batchListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return wire.NewBatchConn(c, nil), nil
}

// batchConnKey is the request context key of its connection (a
// *wire.BatchConn).
type batchConnKey struct{}

// Addr is the bound listen address (after Start).
func (h *Hub) Addr() string { return h.ln.Addr().String() }

// Close stops listening, ends every session, waits for the hub's
// goroutines and appends the sessions' last rows (their Final entries),
// trying a few times if the ledger fails.
func (h *Hub) Close() error {
	var err error
	h.stopOnce.Do(func() {
		err = h.srv.Close() // hijacked WebSockets are not closed by this
		h.mu.Lock()
		h.closing = true // no session starts from now on
		for _, s := range h.sessions {
			s.cancel()
		}
		h.mu.Unlock()
		h.sessWG.Wait()
		close(h.stop)
		h.wg.Wait()
		deadline := time.Now().Add(h.cfg.CloseRetry)
		for wait := 100 * time.Millisecond; ; wait = min(2*wait, time.Second) {
			n, ferr := h.flushAll(time.Now())
			if n == 0 || time.Now().After(deadline) {
				break
			}
			if ferr != nil {
				time.Sleep(wait)
			}
		}
		if serr := h.spill(); serr != nil && err == nil {
			err = serr
		}
	})
	return err
}

// spill writes the rows of the sessions whose last ledger rows are not
// appended (Close gave up on the ledger) to SpillFile, and returns an
// error saying what was kept there or, without a SpillFile, what was lost
// (per worker).
func (h *Hub) spill() error {
	if h.cfg.Meter == nil {
		return nil
	}
	// Every row still due of each session: its unacknowledged row, then
	// the rest of its bytes and its final row (taken as written: the
	// process is ending, and the spill file is where they go).
	var rows []ledger.Entry
	now := time.Now()
	for _, s := range h.live() {
		for range 3 { // the unacked row, the delta after it, the final row (at most)
			e, ok := s.nextRow(now, h.cfg.SettleDelay, h.cfg.SettleResults)
			if !ok {
				break
			}
			rows = append(rows, e)
			s.acked(true)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	var cred uint64
	byWorker := map[string]uint64{}
	for _, e := range rows {
		cred += e.BytesIn + e.BytesOut
		byWorker[e.WorkerID] += e.BytesIn + e.BytesOut
	}
	if h.cfg.SpillFile == "" {
		h.log.Error("hub: closing without the last ledger rows of some sessions: their bytes are lost", "rows", len(rows), "creditable_bytes", cred, "by_worker", byWorker)
		return fmt.Errorf("hub: %d ledger rows (%d creditable bytes) not appended and lost: the ledger refused them", len(rows), cred)
	}
	if err := appendSpill(h.cfg.SpillFile, rows); err != nil {
		h.log.Error("hub: closing without the last ledger rows of some sessions, and the spill file failed too: their bytes are lost", "rows", len(rows), "creditable_bytes", cred, "by_worker", byWorker, "err", err)
		return fmt.Errorf("hub: %d ledger rows (%d creditable bytes) not appended, and not kept: %w", len(rows), cred, err)
	}
	h.log.Warn("hub: the ledger refused the last rows; kept in the spill file, appended at the next start", "file", h.cfg.SpillFile, "rows", len(rows), "creditable_bytes", cred)
	return fmt.Errorf("hub: %d ledger rows (%d creditable bytes) not appended: kept in %s, appended at the next start", len(rows), cred, h.cfg.SpillFile)
}

// Upgrades is the number of /v1/worker requests that passed the gateway
// check (each becomes a session if the backbone answers).
func (h *Hub) Upgrades() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.conns
}

// live returns the sessions being bridged and those awaiting their final
// ledger row.
func (h *Hub) live() []*session {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]*session, 0, len(h.sessions)+len(h.finishing))
	for _, s := range h.sessions {
		out = append(out, s)
	}
	for _, s := range h.finishing {
		out = append(out, s)
	}
	return out
}

// Sessions returns a snapshot of open sessions (and of ended ones whose
// final ledger row is not appended yet) and of up to 1024 ended ones,
// ordered by start time.
func (h *Hub) Sessions() []SessionStats {
	h.mu.Lock()
	out := append([]SessionStats(nil), h.ended...)
	h.mu.Unlock()
	for _, s := range h.live() {
		out = append(out, s.snapshot())
	}
	for i := 1; i < len(out); i++ { // insertion sort by start: small n
		for j := i; j > 0 && out[j].Started.Before(out[j-1].Started); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}

// noteBackbone logs a failed dial of the backbone (err) when the backbone
// was reachable before, or the last such line is a minute old (with how
// many refusals it stood for), and a successful one after failures.
func (h *Hub) noteBackbone(err error, now time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case err == nil && h.unreachable:
		h.unreachable = false
		h.log.Info("hub: backbone reachable again", "backbone", h.cfg.Backbone, "refused_since_last_line", h.unreachableN)
	case err == nil:
	case !h.unreachable || now.Sub(h.unreachableAt) >= time.Minute:
		h.log.Warn("hub: backbone unreachable: workers are refused (503) until it listens", "backbone", h.cfg.Backbone, "err", err,
			"refused_since_last_line", h.unreachableN)
		h.unreachable, h.unreachableAt, h.unreachableN = true, now, 0
	default:
		h.unreachableN++
	}
}

func (h *Hub) serveWorker(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	worker, nonce, err := verifyGateway(r.Header, h.cfg.Secret, now, h.cfg.MaxSkew)
	if err == nil && !h.nonces.add(nonce, now, now.Add(2*h.cfg.MaxSkew)) {
		err = fmt.Errorf("%w: replayed gateway nonce", ErrUnverified)
	}
	if err == nil && !walletapi.IsKeyHex(worker) { // the ledger's worker id form (ledger.Validate)
		err = fmt.Errorf("%w: worker id %q", ErrUnverified, worker)
	}
	if err != nil {
		h.met.refused.WithLabelValues(refusalReason(err)).Inc()
		h.log.Warn("hub: refused upgrade", "remote", r.RemoteAddr, "err", err)
		http.Error(w, "forbidden", http.StatusForbidden)
		return
	}
	h.mu.Lock()
	h.conns++
	h.mu.Unlock()
	link, err := net.DialTimeout("tcp", h.cfg.Backbone, h.cfg.DialTimeout)
	h.noteBackbone(err, now)
	if err != nil {
		h.met.bridgeErrors.WithLabelValues("backbone_unreachable").Inc()
		// The body is the reason workers show (engine/worker: LastError).
		http.Error(w, "backbone unreachable", http.StatusServiceUnavailable)
		return
	}
	c, err := websocket.Accept(w, r, &websocket.AcceptOptions{CompressionMode: websocket.CompressionDisabled, InsecureSkipVerify: true})
	if err != nil {
		link.Close()
		return
	}
	c.SetReadLimit(wire.MaxMessage)
	var idb [8]byte
	_, _ = rand.Read(idb[:])
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{id: hex.EncodeToString(idb[:]), worker: worker, started: now, cancel: cancel, pending: map[uint64]pendingResult{},
		merge: h.cfg.FlushEvery, lastResult: now}
	h.mu.Lock()
	if h.closing {
		h.mu.Unlock()
		cancel()
		link.Close()
		c.Close(websocket.StatusGoingAway, "hub closing")
		return
	}
	h.sessions[s.id] = s
	h.sessWG.Add(1)
	h.mu.Unlock()
	h.met.sessions.Inc()
	h.log.Info("hub: session started", "session", s.id, "worker", worker, "remote", r.Header.Get("X-Forwarded-For"))
	go func() {
		defer h.sessWG.Done()
		cb, _ := r.Context().Value(batchConnKey{}).(*wire.BatchConn)
		reason := newBridge(h, ctx, s, c, cb, link).run()
		cancel()
		h.sessionEnded(s, reason)
	}()
}

// sessionEnded ends s, whose bridge ended for reason: it leaves the open
// sessions for those awaiting their final ledger row (or, without a
// ledger, for the ended ones).
func (h *Hub) sessionEnded(s *session, reason string) {
	s.end(reason)
	if r := endReason(reason); r != "" {
		h.met.bridgeErrors.WithLabelValues(r).Inc()
	}
	h.mu.Lock()
	delete(h.sessions, s.id)
	if h.cfg.Meter != nil {
		h.finishing[s.id] = s // the next flush appends its final row
	} else {
		h.endedLocked(s)
	}
	h.mu.Unlock()
	st := s.snapshot()
	h.log.Info("hub: session ended", "session", s.id, "worker", s.worker, "reason", reason,
		"duration", time.Since(st.Started).Round(time.Millisecond), "to_worker", st.ToWorker, "from_worker", st.FromWorker,
		"creditable", st.CreditOut+st.CreditIn, "rejected", st.Rejected)
}

// endedLocked records a finished session's last snapshot; h.mu is held.
func (h *Hub) endedLocked(s *session) {
	s.mu.Lock()
	s.retired = true
	s.mu.Unlock()
	h.ended = append(h.ended, s.snapshot())
	if len(h.ended) > maxEnded {
		h.ended = h.ended[len(h.ended)-maxEnded:]
	}
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}
