// Package hub is the LAN-only bridge between worker sessions (arriving from
// the gateway as WebSockets on /v1/worker) and the backbone's dispatch
// listener (one TCP link per session, framed as in engine/wire/link.go). It
// meters the bytes it bridges per session into the contribution ledger.
//
// Metering (docs/protocol.md, backbone/ledger): every WebSocket message is
// counted whole, both ways. Backbone->worker DISPATCH (and DISPATCH_DIGEST)
// messages are creditable (BytesOut). A worker's RESULT (or DIGEST, metered
// as the bytes of the RESULT it stands for, wire.DigestCredit) is held as
// pending under its request id until
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
	"bufio"
	"bytes"
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

// Meter receives the ledger rows of every session: a delta at most every
// FlushEvery while the session has new settled or rejected bytes, and a
// Final row at the first flush after the session ends. Each row carries
// its session's row number (ledger.Entry.Seq). A failed append is logged
// and the same rows are sent again, unchanged, at the next flush (so that
// a ledger that did record them, its answer lost, records them once);
// bytes metered meanwhile go into the session's next row.
type Meter interface {
	Append(e ledger.Entry) error
}

// BatchMeter is a Meter that records many rows in one transaction
// (*ledger.Ledger is one). The hub then appends the rows of all its
// sessions with one AppendAll per flush: hundreds of sessions cost one
// transaction per FlushEvery.
type BatchMeter interface {
	Meter
	AppendAll(ctx context.Context, es []ledger.Entry) error
}

// Config configures a Hub. Zero durations take the defaults noted.
type Config struct {
	Listen      string                  // host:port, loopback or private unless AllowPublic ("127.0.0.1:0" picks a port)
	Backbone    string                  // host:port of the backbone's dispatch listener
	Secret      []byte                  // shared gateway secret, >= 16 bytes
	Meter       Meter                   // may be nil: counts are still kept (Sessions)
	AllowPublic bool                    // allow a public listen address
	Extra       map[string]http.Handler // more handlers by path pattern (http.ServeMux syntax)

	MaxSkew     time.Duration // gateway timestamp window; default DefaultMaxSkew
	IdleTimeout time.Duration // close a session after this long without a worker message; default 75 s (> the 20 s ping)
	ResultHold  time.Duration // how long a RESULT waits for LinkAccepted before it is rejected; default 60 s
	FlushEvery  time.Duration // ledger flush period; default 1 s
	DialTimeout time.Duration // backbone dial timeout; default 5 s
	Logger      *slog.Logger  // default slog.Default()

	// Registry receives the hub's Prometheus metrics, served on
	// MetricsPath; nil: the hub makes its own registry.
	Registry *prometheus.Registry

	// SettleDelay and SettleResults hold creditable bytes back from the
	// ledger until they are settled: at least SettleDelay old (from their
	// metering; under steady work bytes settle SettleDelay after they were
	// metered, give or take FlushEvery) and followed by at least
	// SettleResults RESULT messages of the same session, or by SettleDelay
	// without a RESULT (paused or idle), or the session ended without a
	// forfeit. Until then a LinkForfeit rejects
	// them. Zero values hold nothing back (bytes settle at the next flush);
	// the hub command uses DefaultSettleDelay and DefaultSettleResults.
	// SettleDelay must exceed the backbone's longest verdict delay (its
	// request deadline plus one local recomputation, dispatch.Config
	// MaxDeadline: 5 s by default).
	SettleDelay   time.Duration
	SettleResults int
	// DrainTimeout bounds how long the hub keeps reading the backbone link
	// for verdicts after the worker's side of a session ended; default 10 s.
	DrainTimeout time.Duration
}

// Settling defaults of the hub command (docs/accounting.md derives them:
// with the dispatcher's defaults, probation 32 and a check rate of 1 in 20,
// a window of 128 results makes every lie cost more in expectation than it
// saves, and leaves a worker that stops computing after its probation an
// expected 0.15 results' pay per identity).
const (
	// DefaultSettleDelay is the hub command's --settle: creditable bytes
	// are at least this old before they reach the ledger.
	DefaultSettleDelay = 30 * time.Second
	// DefaultSettleResults is the hub command's --settle-results: and
	// followed by at least this many RESULTs of their session.
	DefaultSettleResults = 128
)

// SessionStats is a snapshot of one session's counts; bytes are whole
// WebSocket message bytes.
type SessionStats struct {
	ID, WorkerID    string
	Started         time.Time
	Ended           bool   // the session ended and its Final ledger row is appended (at once without a ledger)
	Reason          string // why it ended ("" while open)
	ToWorker        uint64 // all bytes backbone -> worker
	FromWorker      uint64 // all bytes worker -> backbone
	CreditOut       uint64 // DISPATCH bytes (creditable; settled or not, never forfeited ones)
	CreditIn        uint64 // accepted RESULT bytes (creditable; settled or not, never forfeited ones)
	Unsettled       uint64 // creditable bytes (of CreditOut + CreditIn) not yet settled into the ledger
	Rejected        uint64 // bytes never credited: worker bytes refused, late, malformed or never accepted, and forfeited bytes
	Forfeited       uint64 // creditable bytes (included in Rejected) forfeited by a LinkForfeit
	ForfeitReason   string // the backbone's reason ("" without a forfeit)
	Pending         uint64 // RESULT bytes awaiting the backbone's verdict
	Messages        uint64 // messages bridged, both ways
	DispatchesSent  uint64 // DISPATCH messages to the worker
	ResultsReceived uint64 // RESULT messages from the worker
}

// Hub is a running hub. Create with New, then Start.
type Hub struct {
	cfg    Config
	log    *slog.Logger
	srv    *http.Server
	ln     net.Listener
	nonces nonceCache

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
	h.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	return h, nil
}

// Start binds the listen address and serves in the background.
func (h *Hub) Start() error {
	ln, err := net.Listen("tcp", h.cfg.Listen)
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	h.ln = ln
	h.wg.Add(2)
	go func() { defer h.wg.Done(); _ = h.srv.Serve(ln) }()
	go func() { defer h.wg.Done(); h.flushLoop() }()
	h.log.Info("hub listening", "addr", ln.Addr().String(), "backbone", h.cfg.Backbone)
	return nil
}

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
		for try := 0; try < 5; try++ {
			n, ferr := h.flushAll(time.Now())
			if n == 0 {
				break
			}
			if ferr != nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
		h.mu.Lock()
		if n := len(h.finishing); n > 0 && h.cfg.Meter != nil {
			h.log.Error("hub: closing without the final ledger rows of some sessions", "sessions", n)
		}
		h.mu.Unlock()
	})
	return err
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
	if err != nil {
		h.met.bridgeErrors.WithLabelValues("backbone_unreachable").Inc()
		h.log.Warn("hub: backbone unreachable", "err", err)
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
	go func() {
		defer h.sessWG.Done()
		reason := h.bridge(ctx, s, c, link)
		cancel()
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
		h.log.Info("hub: session ended", "session", s.id, "worker", short(worker), "reason", reason)
	}()
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

// bridge copies messages between the worker WebSocket c and the backbone
// link until either side ends; it returns the reason. When the worker's side
// ends first, the link is half-closed and read for up to DrainTimeout more,
// so that the verdicts the backbone still owes (LinkAccepted, LinkRejected,
// LinkForfeit) are metered before the session's final ledger entry.
func (h *Hub) bridge(ctx context.Context, s *session, c *websocket.Conn, link net.Conn) string {
	defer link.Close()
	bw := bufio.NewWriterSize(link, 64<<10)
	var wmu sync.Mutex // guards bw
	if err := wire.WriteLinkPreamble(bw, s.id, s.worker); err != nil || bw.Flush() != nil {
		c.Close(websocket.StatusInternalError, "backbone link failed")
		return "backbone link failed"
	}
	workerEnd := make(chan string, 1) // the worker -> backbone direction ended, and why
	linkEnd := make(chan string, 1)   // the backbone -> worker direction ended, and why
	var workerGone atomic.Bool        // no more writes to c
	var writeErr atomic.Value         // string: why a write to the worker failed
	// worker -> backbone
	go func() {
		var buf bytes.Buffer // reused: grows once to the largest message
		for {
			rctx, rcancel := context.WithTimeout(ctx, h.cfg.IdleTimeout)
			typ, msg, err := readInto(rctx, c, &buf)
			rcancel()
			if err != nil {
				var ce websocket.CloseError
				switch {
				case writeErr.Load() != nil:
					workerEnd <- writeErr.Load().(string)
				case errors.As(err, &ce):
					workerEnd <- fmt.Sprintf("worker closed: %d %s", ce.Code, ce.Reason)
				case ctx.Err() != nil:
					workerEnd <- "hub closing"
				default:
					workerEnd <- "worker read: " + err.Error()
				}
				return
			}
			if typ != websocket.MessageBinary {
				s.fromWorker(nil, len(msg))
				c.Close(websocket.StatusUnsupportedData, "binary frames only")
				workerEnd <- "worker sent a text message"
				return
			}
			s.fromWorker(msg, len(msg))
			h.fromW.Add(float64(len(msg)))
			wmu.Lock()
			err = wire.WriteLink(bw, wire.LinkData, msg)
			if err == nil {
				err = bw.Flush()
			}
			wmu.Unlock()
			if err != nil {
				c.Close(websocket.StatusGoingAway, "backbone link lost")
				workerEnd <- "backbone write: " + err.Error()
				return
			}
		}
	}()
	// backbone -> worker
	go func() {
		br := bufio.NewReaderSize(link, 64<<10)
		for {
			kind, p, err := wire.ReadLink(br)
			if err != nil {
				if !workerGone.Load() {
					c.Close(websocket.StatusGoingAway, "backbone link closed")
				}
				linkEnd <- "backbone link: " + err.Error()
				return
			}
			switch kind {
			case wire.LinkData:
				if workerGone.Load() {
					continue // the worker is gone: nothing to meter or deliver
				}
				s.toWorker(p)
				h.toW.Add(float64(len(p)))
				if err := c.Write(ctx, websocket.MessageBinary, p); err != nil {
					writeErr.CompareAndSwap(nil, "worker write: "+err.Error())
					workerGone.Store(true)
					c.CloseNow() // ends the worker reader, which half-closes the link
				}
			case wire.LinkAccepted, wire.LinkRejected:
				req, err := wire.LinkRequest(p)
				if err == nil {
					s.verdict(req, kind == wire.LinkAccepted)
				}
			case wire.LinkForfeit:
				n := s.forfeit(string(p))
				h.met.forfeited.Add(float64(n))
				h.log.Warn("hub: session forfeited", "session", s.id, "worker", short(s.worker), "bytes", n, "reason", string(p))
			case wire.LinkClose:
				code, reason, _ := wire.LinkCloseReason(p)
				c.Close(websocket.StatusCode(code), reason)
				linkEnd <- "backbone closed session: " + reason
				return
			default:
				c.Close(websocket.StatusInternalError, "bad backbone link")
				linkEnd <- fmt.Sprintf("backbone link kind %d", kind)
				return
			}
		}
	}()
	var reason string
	select {
	case reason = <-workerEnd:
		workerGone.Store(true)
		// Drain: FIN tells the backbone the worker is gone; it sends the
		// verdicts it still owes and closes the link.
		if hc, ok := link.(interface{ CloseWrite() error }); ok {
			_ = hc.CloseWrite()
		}
		drain := h.cfg.DrainTimeout
		if ctx.Err() != nil {
			drain = min(drain, time.Second)
		}
		_ = link.SetReadDeadline(time.Now().Add(drain))
		<-linkEnd
	case reason = <-linkEnd:
		workerGone.Store(true)
		c.CloseNow()
		link.Close()
		<-workerEnd
	}
	c.CloseNow()
	return reason
}

func (h *Hub) flushLoop() {
	t := time.NewTicker(h.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case now := <-t.C:
			h.mu.Lock()
			open := make([]*session, 0, len(h.sessions))
			for _, s := range h.sessions {
				open = append(open, s)
			}
			h.mu.Unlock()
			for _, s := range open {
				s.expire(now.Add(-h.cfg.ResultHold))
			}
			_, _ = h.flushAll(now)
		}
	}
}

// flushAll appends one row for every session that has one due (new
// settled or rejected bytes, a final row, or a row a failed append left
// unacknowledged) in one AppendAll when the Meter is a BatchMeter, and
// retires the sessions whose final row is in. It returns the rows it
// tried and the append error.
func (h *Hub) flushAll(now time.Time) (int, error) {
	if h.cfg.Meter == nil {
		return 0, nil
	}
	h.flushMu.Lock()
	defer h.flushMu.Unlock()
	sessions := h.live()
	var rows []ledger.Entry
	var owners []*session
	for _, s := range sessions {
		if e, ok := s.nextRow(now, h.cfg.SettleDelay, h.cfg.SettleResults); ok {
			rows = append(rows, e)
			owners = append(owners, s)
		}
	}
	if len(rows) == 0 {
		return 0, nil
	}
	var err error
	if bm, ok := h.cfg.Meter.(BatchMeter); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t0 := time.Now()
		err = bm.AppendAll(ctx, rows)
		cancel()
		h.met.appended(len(rows), time.Since(t0), err)
		for _, s := range owners {
			s.acked(err == nil)
		}
	} else {
		for i, s := range owners {
			t0 := time.Now()
			e := h.cfg.Meter.Append(rows[i])
			h.met.appended(1, time.Since(t0), e)
			s.acked(e == nil)
			if e != nil && err == nil {
				err = e
			}
		}
	}
	if err != nil {
		h.log.Error("hub: ledger append failed; the rows will be sent again", "rows", len(rows), "err", err)
	} else {
		var cred, rej uint64
		for _, e := range rows {
			cred += e.BytesIn + e.BytesOut
			rej += e.RejectedBytes
		}
		h.met.ledgerBytes.WithLabelValues("creditable").Add(float64(cred))
		h.met.ledgerBytes.WithLabelValues("rejected").Add(float64(rej))
	}
	h.mu.Lock()
	for _, s := range owners {
		if s.done() {
			if _, ok := h.finishing[s.id]; ok {
				delete(h.finishing, s.id)
				h.endedLocked(s)
			}
		}
	}
	h.mu.Unlock()
	return len(rows), err
}

// nextRow returns the session's row due at this flush: the row a failed
// append left unacknowledged (unchanged, so a ledger that recorded it
// records it once), else the delta of settled and rejected bytes since the
// last row (the final row once the session ended). ok is false when
// nothing is due.
func (s *session) nextRow(now time.Time, delay time.Duration, results int) (ledger.Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finalWritten {
		return ledger.Entry{}, false
	}
	if s.unacked != nil {
		return *s.unacked, true
	}
	final := s.ended
	s.settleLocked(now, delay, results, final)
	e := ledger.Entry{SessionID: s.id, WorkerID: s.worker,
		BytesIn:       s.settled.in - s.flushed.creditIn,
		BytesOut:      s.settled.out - s.flushed.creditOut,
		RejectedBytes: s.rejected - s.flushed.rejected,
		Final:         final, Time: now.UTC()}
	if !final && e.BytesIn == 0 && e.BytesOut == 0 && e.RejectedBytes == 0 {
		return ledger.Entry{}, false
	}
	s.seq++
	e.Seq = s.seq
	s.unacked = &e
	s.queued.creditIn, s.queued.creditOut, s.queued.rejected = s.settled.in, s.settled.out, s.rejected
	return e, true
}

// acked records the outcome of appending the session's unacknowledged
// row.
func (s *session) acked(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok || s.unacked == nil {
		return
	}
	s.flushed = s.queued
	s.finalWritten = s.unacked.Final
	s.unacked = nil
}

// done reports whether the session's final row is in the ledger.
func (s *session) done() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finalWritten
}

type pendingResult struct {
	bytes uint64
	at    time.Time
}

// bucket is creditable bytes metered at about the same time, not yet
// settled: first and at are when the first and the last of them were
// metered (a bucket takes bytes for at most the session's merge period
// after first, so under steady work new buckets open and the old ones
// settle on time) and seq the session's RESULT count when the last of them
// was metered.
type bucket struct {
	first   time.Time
	at      time.Time
	seq     uint64
	out, in uint64
}

// session holds one bridged connection's counts.
type session struct {
	id, worker string
	started    time.Time
	cancel     context.CancelFunc
	merge      time.Duration // bytes metered within this of a bucket's first bytes join it

	mu                               sync.Mutex
	ended                            bool
	reason                           string
	toW, fromW, msgs, nDisp, nResult uint64
	lastResult                       time.Time // when the last RESULT arrived (session start before any)
	creditOut, creditIn, rejected    uint64
	pending                          map[uint64]pendingResult
	unsettled                        []bucket // oldest first
	settled                          struct{ out, in uint64 }
	forfeited                        bool
	forfeitReason                    string
	forfeitBytes                     uint64
	flushed                          counts        // in rows the ledger acknowledged
	queued                           counts        // in rows created (acknowledged, or the unacked one)
	unacked                          *ledger.Entry // the row in flight, sent again unchanged until acknowledged
	seq                              uint64        // rows created (ledger.Entry.Seq of the last)
	finalWritten                     bool
	retired                          bool // ended, and its final row appended (or there is no ledger)
}

// counts are cumulative ledger amounts of a session.
type counts struct{ creditIn, creditOut, rejected uint64 }

// creditLocked meters creditable bytes (out: DISPATCH, in: accepted
// RESULT) as unsettled, or as rejected once the session is forfeited;
// s.mu is held.
func (s *session) creditLocked(out, in uint64) {
	if s.forfeited {
		s.rejected += out + in
		s.forfeitBytes += out + in
		return
	}
	s.creditOut += out
	s.creditIn += in
	s.addUnsettledLocked(time.Now(), out, in)
}

// addUnsettledLocked adds creditable bytes metered at now to the newest
// bucket while that bucket's first bytes are younger than the merge period
// (never measured from its newest bytes: a bucket fed by steady work would
// then stay open, and never settle, for as long as the work lasts), else
// to a new bucket; s.mu is held.
func (s *session) addUnsettledLocked(now time.Time, out, in uint64) {
	if n := len(s.unsettled); n > 0 && now.Sub(s.unsettled[n-1].first) < s.merge {
		b := &s.unsettled[n-1]
		b.at, b.seq = now, s.nResult
		b.out += out
		b.in += in
		return
	}
	s.unsettled = append(s.unsettled, bucket{first: now, at: now, seq: s.nResult, out: out, in: in})
}

// settleLocked moves into the settled totals the unsettled buckets, oldest
// first, whose newest bytes are at least delay old and
// either followed by at least results RESULTs or, when the session has
// received no RESULT for delay (paused or idle: the results that would
// fill the window are not coming), with no further condition; all of them
// when all is set (the session ended, not forfeited). s.mu is held.
func (s *session) settleLocked(now time.Time, delay time.Duration, results int, all bool) {
	idle := now.Sub(s.lastResult) >= delay
	i := 0
	for ; i < len(s.unsettled); i++ {
		b := s.unsettled[i]
		if !all && (now.Sub(b.at) < delay || (!idle && s.nResult-b.seq < uint64(max(results, 0)))) {
			break
		}
		s.settled.out += b.out
		s.settled.in += b.in
	}
	s.unsettled = s.unsettled[i:]
}

// forfeit rejects every unsettled creditable byte of the session, and every
// later one; it returns the bytes it rejected now.
func (s *session) forfeit(reason string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n uint64
	for _, b := range s.unsettled {
		s.creditOut -= b.out
		s.creditIn -= b.in
		n += b.out + b.in
	}
	s.unsettled = nil
	s.rejected += n
	s.forfeitBytes += n
	if !s.forfeited {
		s.forfeited, s.forfeitReason = true, reason
	}
	return n
}

func (s *session) fromWorker(msg []byte, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fromW += uint64(n)
	s.msgs++
	if msg == nil {
		s.rejected += uint64(n)
		return
	}
	t, req, ok := wire.PeekRequest(msg)
	if t == wire.TypeDigest {
		// A DIGEST stands for the RESULT the worker computed: metered as
		// that RESULT's bytes (docs/accounting.md, "Quorum").
		var size int
		req, size, ok = wire.DigestCredit(msg)
		n = size
	}
	switch {
	case ok && (t == wire.TypeResult || t == wire.TypeDigest):
		p := s.pending[req]
		p.bytes += uint64(n)
		p.at = time.Now()
		s.pending[req] = p
		s.nResult++
		s.lastResult = p.at
	case t == wire.TypeResult || t == wire.TypeDigest || t == wire.TypeDispatch || t == wire.TypeDispatchDigest:
		// a short RESULT or DIGEST, or a worker sending DISPATCH
		s.rejected += uint64(len(msg))
	default:
		if _, err := wire.Peek(msg); err != nil || !workerControl(t) {
			s.rejected += uint64(n) // garbage, or a frame only the backbone sends
		}
	}
}

// workerControl reports whether t is a control frame a worker may send: overhead,
// neither credited nor rejected (docs/accounting.md).
func workerControl(t wire.Type) bool {
	switch t {
	case wire.TypeHello, wire.TypeError, wire.TypePing, wire.TypePong, wire.TypePause,
		wire.TypeChunkReq, wire.TypeHoldings:
		return true
	}
	return false
}

func (s *session) toWorker(msg []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.toW += uint64(len(msg))
	s.msgs++
	if t, _ := wire.Peek(msg); t == wire.TypeDispatch || t == wire.TypeDispatchDigest {
		s.creditLocked(uint64(len(msg)), 0)
		s.nDisp++
	}
}

func (s *session) verdict(req uint64, accepted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pending[req]
	if !ok {
		return
	}
	delete(s.pending, req)
	if accepted {
		s.creditLocked(0, p.bytes)
	} else {
		s.rejected += p.bytes
	}
}

// expire rejects pending results received before cutoff.
func (s *session) expire(cutoff time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for req, p := range s.pending {
		if p.at.Before(cutoff) {
			s.rejected += p.bytes
			delete(s.pending, req)
		}
	}
}

func (s *session) end(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended, s.reason = true, reason
	for req, p := range s.pending {
		s.rejected += p.bytes
		delete(s.pending, req)
	}
}

func (s *session) snapshot() SessionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pend, unsettled uint64
	for _, p := range s.pending {
		pend += p.bytes
	}
	for _, b := range s.unsettled {
		unsettled += b.out + b.in
	}
	return SessionStats{ID: s.id, WorkerID: s.worker, Started: s.started, Ended: s.retired, Reason: s.reason,
		ToWorker: s.toW, FromWorker: s.fromW, CreditOut: s.creditOut, CreditIn: s.creditIn, Unsettled: unsettled,
		Rejected: s.rejected, Forfeited: s.forfeitBytes, ForfeitReason: s.forfeitReason, Pending: pend,
		Messages: s.msgs, DispatchesSent: s.nDisp, ResultsReceived: s.nResult}
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// readInto reads one message into buf (reset first) and returns its bytes,
// valid until the next call.
func readInto(ctx context.Context, c *websocket.Conn, buf *bytes.Buffer) (websocket.MessageType, []byte, error) {
	typ, r, err := c.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	buf.Reset()
	if _, err := buf.ReadFrom(r); err != nil {
		return 0, nil, err
	}
	return typ, buf.Bytes(), nil
}
