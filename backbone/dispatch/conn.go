package dispatch

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// conn is one worker session: a hub link after a valid HELLO.
type conn struct {
	d               *Dispatcher
	session, worker string
	link            net.Conn
	hello           *wire.Hello
	holds           map[uint64]struct{} // accepted holdings; replaced (never modified) under d.mu
	nholds          atomic.Int64        // len(holds)
	since           time.Time
	paused          atomic.Bool
	// stalled: a request to it passed its deadline unanswered, or was
	// answered with an ERROR, and no answer has come from it since (a
	// frozen process, a laptop asleep, a black hole, a holder that never
	// computes). It is out of the holder index, so calls route its experts
	// to other holders or compute them here at once instead of each
	// waiting out a deadline, until it answers a request (its late RESULT
	// or DIGEST) or, for one more try, until its backoff passes: 1 s after
	// the first stall of a run, doubling up to StallBackoffMax (stall,
	// unstall, probe). A PING or any other control frame does not bring it
	// back: a holder that only pings would otherwise stall a step at every
	// ping.
	stalled  atomic.Bool
	stallRun atomic.Int32 // stalls since its last answer

	// PAUSE changes in the current window (pauseAllowed; the reader's own).
	pauseStart time.Time
	pauseCount int
	tol        float64 // verification tolerance: 0 (exact bits) for CPU backends

	// Verification: checks passed (probation ends at Config.Probation),
	// checks and mismatches, and the checked RESULTs received whose
	// verdict is not sent yet (a closing session waits for them).
	passed, checks, mismatches atomic.Uint64
	verifying                  atomic.Int64
	punished                   atomic.Bool // caught: punish ran

	// Provisioning, guarded by d.mu: the quota from HELLO/HOLDINGS (bytes),
	// the assignment (order: priority order; target: the same as a set) and
	// its generation.
	quota     uint64
	order     []uint64
	target    map[uint64]bool
	assignGen uint64
	amu       sync.Mutex // serialises ASSIGN sends; guards sentGen
	sentGen   uint64
	chunks    chan *wire.ChunkReq // low-priority queue served by chunkSender
	done      chan struct{}       // closed when the session ends

	wmu    sync.Mutex // guards bw and link writes
	bw     *bufio.Writer
	urgent atomic.Int32 // high-priority writers waiting for wmu; CHUNKs yield to them

	mu      sync.Mutex
	pending map[uint64]*job
	expired map[uint64]time.Time // requests given up on; their RESULTs are late, not unknown
	rtts    [128]sample          // ring of recent requests' round trips and sizes
	nrtt    int
	times   [128]timing // ring of recent RESULTs' timings
	ntimes  int
	lat     time.Duration // latency estimate for replica choice (hedge.go)
	latAt   time.Time     // when lat last changed
	closed  bool          // retired: no new requests
	reason  string
	// linkClosed: LinkClose sent and the link closed
	linkClosed bool
	// readAt is when serveLink read the message being handled whole (only
	// its goroutine uses it).
	readAt time.Time

	reqsSent, rows, pairs, results, timeouts, late atomic.Uint64
	stalls                                         atomic.Uint64 // runs of missed deadlines (stall)
	nonFinite                                      atomic.Uint64 // RESULTs refused for a NaN or Inf value
	digests                                        atomic.Uint64 // DIGESTs received (quorum)
	bytesIn, bytesOut                              atomic.Uint64
	assignedBytes, assigns, chunkReqs, chunkBytes  atomic.Uint64
	quotaNow                                       atomic.Uint64 // quota, for stats (which may run under d.mu)
	nassigned                                      atomic.Int64  // len(order), for stats
}

const maxGone = 256

// serveLink runs one hub link: preamble, HELLO, WELCOME, then frames until
// the link ends or the session is closed for a bad frame.
func (d *Dispatcher) serveLink(link net.Conn) {
	defer link.Close()
	_ = link.SetDeadline(time.Now().Add(d.cfg.HelloTimeout))
	br := bufio.NewReaderSize(link, 64<<10)
	session, worker, err := wire.ReadLinkPreamble(br)
	if err != nil {
		if errors.Is(err, io.EOF) && br.Buffered() == 0 {
			// A connection closed before sending a byte: a health probe
			// (the hub's /readyz dials this port), not a bad link.
			d.log.Debug("dispatch: connection closed before its preamble", "remote", link.RemoteAddr().String())
			return
		}
		d.log.Warn("dispatch: bad link preamble", "remote", link.RemoteAddr().String(), "err", err)
		if errors.Is(err, wire.ErrLinkVersion) {
			// Every link version has LinkClose: the hub closes the
			// worker's WebSocket with this reason and logs it.
			_ = link.SetWriteDeadline(time.Now().Add(time.Second))
			_ = wire.WriteLink(link, wire.LinkClose, wire.AppendLinkClose(nil, 1008, err.Error()))
		}
		return
	}
	c := &conn{d: d, session: session, worker: worker, link: link, since: time.Now(),
		bw: bufio.NewWriterSize(link, 64<<10), pending: map[uint64]*job{}, expired: map[uint64]time.Time{},
		chunks: make(chan *wire.ChunkReq, 64), done: make(chan struct{})}
	kind, p, err := wire.ReadLink(br)
	if err != nil || kind != wire.LinkData {
		d.log.Warn("dispatch: no HELLO", "session", session, "err", err)
		return
	}
	c.bytesIn.Add(uint64(len(p)))
	if reason := d.hello(c, p); reason != "" {
		d.log.Warn("dispatch: refused worker", "session", session, "worker", short(worker), "reason", reason)
		c.closeLink(reason)
		return
	}
	_ = link.SetDeadline(time.Time{})
	d.mu.Lock()
	select {
	case <-d.stop:
		d.mu.Unlock()
		// Going away (1001), not a refusal: workers treat a policy
		// violation (1008) before WELCOME as permanent.
		c.sendCtl(wire.LinkClose, wire.AppendLinkClose(nil, 1001, "backbone shutting down"))
		return
	default:
	}
	var twin string // another live session under this worker's key
	for s, o := range d.workers {
		if o.worker == worker { // d.workers holds live sessions (retire deletes)
			twin = s
		}
	}
	d.workers[session] = c
	d.rebuildLocked()
	d.mu.Unlock()
	d.log.Info("dispatch: worker joined", "session", session, "worker", short(worker),
		"holdings", len(c.holds), "backend", c.hello.Backend, "threads", c.hello.Threads, "quota", c.hello.Quota)
	if twin != "" {
		// Two processes sharing a key file (backbone worker's default
		// --key): quorum, coverage and readiness count keys, so they are
		// one holder, and one wallet.
		d.log.Warn("dispatch: a second session under one worker key: they count as one holder (quorum, coverage, /readyz) "+
			"and are paid to one wallet; give each worker process its own --key", "worker", short(worker), "session", session, "other_session", twin)
	}
	if d.cfg.Catalog != nil {
		d.wg.Add(1)
		go func() { defer d.wg.Done(); c.chunkSender() }()
		d.plan()
	}
	var buf []byte // the last payload's memory, reused: handle keeps no part of a message
	for {
		_ = link.SetReadDeadline(time.Now().Add(d.cfg.IdleTimeout))
		kind, p, err := wire.ReadLinkBuf(br, buf)
		buf = p[:0]
		c.readAt = time.Now()
		if err != nil {
			// The hub half-closes the link when the worker is gone: the
			// verdicts of the results being verified still reach it.
			c.retire("link closed: " + err.Error())
			c.awaitVerdicts(10 * time.Second)
			c.close(wire.CodeShutdown, "link closed: "+err.Error())
			return
		}
		if kind != wire.LinkData {
			c.close(wire.CodeProtocol, fmt.Sprintf("unexpected link kind %d from hub", kind))
			return
		}
		c.bytesIn.Add(uint64(len(p)))
		if reason := c.handle(p); reason != "" {
			d.log.Warn("dispatch: closing worker session", "session", session, "worker", short(worker), "reason", reason)
			c.close(wire.CodeBadFrame, reason)
			return
		}
	}
}

// hello validates the first message and answers WELCOME; it returns a
// refusal reason or "".
//
// The frame is decoded twice: first without the model's shapes, so that a
// worker serving another model hears that (not that its holdings are out
// of range), then against them.
func (d *Dispatcher) hello(c *conn, msg []byte) string {
	f, err := wire.Decode(msg, nil)
	if errors.Is(err, wire.ErrVersion) && len(msg) >= wire.HeaderSize {
		return fmt.Sprintf("the worker speaks protocol version %d, this backbone speaks %d: upgrade the worker",
			uint16(msg[1])|uint16(msg[2])<<8, wire.Version)
	}
	if err != nil {
		return "bad HELLO: " + err.Error()
	}
	h, ok := f.(*wire.Hello)
	if !ok {
		return "first frame is " + f.Type().String() + ", want HELLO"
	}
	if hex.EncodeToString(h.Key) != c.worker {
		return "HELLO key differs from the authenticated worker key"
	}
	if b, banned := d.bans.Banned(c.worker, time.Now()); banned {
		d.refusedBanned.Add(1)
		return fmt.Sprintf("worker key banned until %s (%s)", b.Until.UTC().Format(time.RFC3339), clipWords(b.Reason, 100))
	}
	if !isCPUBackend(h.Backend) {
		if d.cfg.Tolerance < 0 {
			return fmt.Sprintf("backend %q is not a CPU backend (\"cpu\", \"cpu-*\"): this backbone accepts only exact workers (run the worker with --backend cpu)", clipWords(h.Backend, 64))
		}
		c.tol = d.cfg.Tolerance
	}
	// A worker with nothing yet (an empty slice directory) may not know the
	// model id; ASSIGN tells it.
	if d.cfg.Model.ID != "" && h.ModelID != d.cfg.Model.ID && (h.ModelID != "" || len(h.Holdings) > 0) {
		if d.cfg.Catalog == nil || h.Quota == 0 {
			return fmt.Sprintf("model id %q does not match the backbone's %q", h.ModelID, d.cfg.Model.ID)
		}
		// A provisioned worker whose folder holds another model's slice
		// (its network changed models): it is welcomed as empty, and the
		// ASSIGN of this model makes it delete that slice and download
		// ours (slice.Store.SetModel). Refused, it retried forever.
		d.log.Info("dispatch: worker's slice holds another model; provisioning it afresh", "worker", short(c.worker),
			"its_model", clipStr(h.ModelID, 64), "holdings", len(h.Holdings))
		h.Holdings = nil
	}
	if _, err := wire.Decode(msg, &d.lim); err != nil {
		return "bad HELLO: " + err.Error()
	}
	c.hello = h
	c.holds = make(map[uint64]struct{}, len(h.Holdings))
	for _, x := range h.Holdings {
		if d.cfg.ExpertHash != nil {
			sum, ok := d.cfg.ExpertHash(int(x.Layer), int(x.Expert))
			if !ok || sum != x.SHA256 {
				continue
			}
		}
		c.holds[key(int(x.Layer), int(x.Expert))] = struct{}{}
	}
	c.nholds.Store(int64(len(c.holds)))
	if d.cfg.Catalog != nil {
		c.quota = h.Quota
		c.quotaNow.Store(h.Quota)
	}
	m := d.cfg.Model
	w := &wire.Welcome{Session: c.session, D: uint32(m.D), K: uint16(m.K), NLayer: uint16(m.NLayer),
		NExpert: uint32(m.NExpert), Accepted: uint32(len(c.holds))}
	if err := c.sendData(w.Append(nil), 5*time.Second); err != nil {
		return "WELCOME write: " + err.Error()
	}
	return ""
}

// handle processes one worker message; it returns a reason to close the
// session, or "".
func (c *conn) handle(msg []byte) string {
	f, err := wire.Decode(msg, &c.d.lim)
	if err != nil {
		return err.Error()
	}
	switch f := f.(type) {
	case *wire.Result:
		c.unstall()
		return c.answer(msg, f.Request, f.M, f.Out, nil, &f.Timing)
	case *wire.Digest:
		c.unstall()
		return c.answer(msg, f.Request, f.M, nil, &f.Sum, nil)
	case *wire.Error:
		if f.Request != 0 {
			if j := c.take(f.Request, false); j != nil {
				j.deliver(reply{err: f})
				// Its pairs are computed here; routing to it again at
				// once would cost the next step the same round trip.
				c.stall()
			}
		}
	case *wire.Ping:
		if err := c.sendData((&wire.Pong{Time: f.Time}).Append(nil), 5*time.Second); err != nil {
			return "PONG write: " + err.Error()
		}
	case *wire.Pong:
	case *wire.ChunkReq:
		if c.d.cfg.Catalog == nil {
			return "CHUNK_REQ but provisioning is off"
		}
		return c.chunkReq(f)
	case *wire.Holdings:
		c.holdingsUpdate(f)
	case *wire.Pause:
		if c.paused.Load() != f.Paused && !c.pauseAllowed(time.Now()) {
			// Each change rebuilds the holder index under the
			// dispatcher's lock: a session flipping it thousands of
			// times a second slowed every step (a CPU limit's duty
			// cycle flips it a few times a second).
			return fmt.Sprintf("PAUSE flood: more than %d changes in %v", pauseBurst, pauseWindow)
		}
		if c.paused.Swap(f.Paused) != f.Paused {
			c.d.mu.Lock()
			if c.d.workers[c.session] == c {
				c.d.rebuildLocked()
			}
			c.d.mu.Unlock()
		}
	default:
		return "unexpected " + f.Type().String() + " from worker"
	}
	return ""
}

// pauseBurst PAUSE changes are allowed within any pauseWindow; more close
// the session (conn.pauseAllowed).
const (
	pauseBurst  = 50
	pauseWindow = time.Second
)

// pauseAllowed reports whether one more PAUSE change at now stays within
// pauseBurst changes per pauseWindow (a sliding count of the window's
// changes). Only the session's reader calls it.
func (c *conn) pauseAllowed(now time.Time) bool {
	if now.Sub(c.pauseStart) >= pauseWindow {
		c.pauseStart, c.pauseCount = now, 0
	}
	c.pauseCount++
	return c.pauseCount <= pauseBurst
}

// stall takes c out of the holder index after one of its requests passed
// its deadline unanswered (conn.stalled); the first stall of a run of
// them is counted and logged.
func (c *conn) stall() {
	if c.stalled.Swap(true) {
		return
	}
	c.stalls.Add(1)
	run := c.stallRun.Add(1)
	wait := min(c.d.cfg.StallBackoffMax, time.Second<<min(run-1, 16))
	c.d.mu.Lock()
	if c.d.workers[c.session] == c {
		c.d.rebuildLocked()
	}
	c.d.mu.Unlock()
	time.AfterFunc(wait, c.probe)
	if run == 1 {
		c.d.log.Warn("dispatch: worker missed a deadline or answered an error: routing around it until it answers", "worker", short(c.worker), "session", c.session, "retry_in", wait)
	}
}

// probe puts a stalled c back in the holder index once its backoff passed,
// for one more request: answered, the run of stalls ends (unstall); missed
// again, the next backoff is twice as long.
func (c *conn) probe() {
	if c.isClosed() || !c.stalled.CompareAndSwap(true, false) {
		return
	}
	c.d.mu.Lock()
	if c.d.workers[c.session] == c {
		c.d.rebuildLocked()
	}
	c.d.mu.Unlock()
}

// unstall ends c's run of stalls: it answered a request. A stalled c goes
// back in the holder index.
func (c *conn) unstall() {
	c.stallRun.Store(0)
	if !c.stalled.Load() || !c.stalled.CompareAndSwap(true, false) {
		return
	}
	c.d.mu.Lock()
	if c.d.workers[c.session] == c {
		c.d.rebuildLocked()
	}
	c.d.mu.Unlock()
	c.d.log.Info("dispatch: worker answers again", "worker", short(c.worker), "session", c.session)
}

// answer takes a RESULT (out, with the worker's timing tm) or a DIGEST
// (sum) for request req with m outputs; msg is the whole message, read
// whole at c.readAt. It returns a reason to close the session, or "".
func (c *conn) answer(msg []byte, req uint64, m int, out []float32, sum *[32]byte, tm *wire.Timing) string {
	what := "RESULT"
	if sum != nil {
		what = "DIGEST"
	}
	now := time.Now()
	c.mu.Lock()
	j := c.pending[req]
	_, late := c.expired[req]
	closed := c.closed
	if j != nil {
		delete(c.pending, req)
	}
	c.mu.Unlock()
	switch {
	case j == nil && (late || closed):
		c.late.Add(1)
		c.sendCtl(wire.LinkRejected, wire.AppendLinkRequest(nil, req))
		return ""
	case j == nil:
		// Request ids are never reused and each is answered once: a
		// RESULT for one that is neither pending nor given up on
		// (never sent here, or answered already) is made-up work.
		c.sendCtl(wire.LinkRejected, wire.AppendLinkRequest(nil, req))
		c.punish(fmt.Sprintf("%s for request %d, not pending at this session (never sent to it, or answered already)", what, req), "a result for work not asked for")
		return ""
	case m != j.answerRows():
		c.sendCtl(wire.LinkRejected, wire.AppendLinkRequest(nil, req))
		j.deliver(reply{err: fmt.Errorf("result has %d rows, want %d", m, j.answerRows())})
		return fmt.Sprintf("%s for request %d has %d rows, want %d", what, req, m, j.answerRows())
	case j.digest != (sum != nil):
		c.sendCtl(wire.LinkRejected, wire.AppendLinkRequest(nil, req))
		j.deliver(reply{err: fmt.Errorf("a %s answers a %s", what, wire.Type(msg[3]))})
		return fmt.Sprintf("%s for request %d, which asked for the other answer", what, req)
	}
	if i := expert.FirstNonFinite(out); i >= 0 {
		// A hostile or broken worker: never credit it, never let a NaN
		// or Inf reach the decode (the router would panic on it).
		c.nonFinite.Add(1)
		c.sendCtl(wire.LinkRejected, wire.AppendLinkRequest(nil, req))
		j.deliver(reply{err: fmt.Errorf("result value %d is not finite (%v)", i, out[i])})
		return fmt.Sprintf("RESULT for request %d has a non-finite value at %d (%v)", req, i, out[i])
	}
	at := c.readAt
	if at.IsZero() || at.After(now) {
		at = now
	}
	c.addRTT(at.Sub(j.sent), j.bytes+len(msg))
	if c.d.cfg.Hedge {
		c.noteLatency(at.Sub(j.sent))
	}
	if tm != nil {
		c.addTiming(timing{encode: j.encode, write: time.Duration(j.write.Load()), rtt: at.Sub(j.sent), decode: now.Sub(at),
			queue: time.Duration(tm.QueueMicros) * time.Microsecond, compute: time.Duration(tm.ComputeMicros) * time.Microsecond})
	}
	c.results.Add(1)
	c.rows.Add(uint64(j.nrows))
	c.pairs.Add(uint64(len(j.pairs)))
	if j.check || j.hedged {
		// The verdict comes after the comparison, or once the call knows
		// which of a hedged pair's answers it used (call.resolve).
		c.verifying.Add(1)
	} else {
		c.sendCtl(wire.LinkAccepted, wire.AppendLinkRequest(nil, req))
	}
	rep := reply{out: out, at: at}
	switch {
	case sum != nil:
		rep.sum, rep.hasSum = *sum, true
	case j.wantSum:
		// Hashed here, on the session's reader, in parallel with the
		// other workers' answers: the call compares 32 bytes.
		rep.sum, rep.hasSum = wire.ResultDigest(msg), true
	}
	j.deliver(rep)
	return ""
}

// answerRows is the number of output rows j's answer carries: one per
// pair, or one per row for a sum job.
func (j *job) answerRows() int {
	if j.sum {
		return j.nrows
	}
	return len(j.pairs)
}

// addPending registers j; false if the session is closed.
func (c *conn) addPending(j *job) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return false
	}
	c.pending[j.req] = j
	return true
}

// take removes request req from pending and returns its job (nil if it was
// not pending); expire remembers req so a later RESULT counts as late.
func (c *conn) take(req uint64, expire bool) *job {
	c.mu.Lock()
	defer c.mu.Unlock()
	j := c.pending[req]
	if j == nil {
		return nil
	}
	delete(c.pending, req)
	if expire {
		c.expired[req] = time.Now()
	}
	c.pruneLocked()
	return j
}

// expiredKeep is how long a request given up on (or answered) is
// remembered: a RESULT for it within that time is late, not unknown
// (unknown ones are punished). Far above any deadline and the hub's
// idle timeouts.
const expiredKeep = 10 * time.Minute

// pruneLocked forgets expired requests older than expiredKeep once there
// are many; c.mu is held.
func (c *conn) pruneLocked() {
	if len(c.expired) <= 4096 {
		return
	}
	now := time.Now()
	for r, t := range c.expired {
		if now.Sub(t) > expiredKeep {
			delete(c.expired, r)
		}
	}
}

// sample is one answered request: its round trip and its DISPATCH + RESULT
// bytes.
type sample struct {
	dur   time.Duration
	bytes int
}

func (c *conn) addRTT(d time.Duration, bytes int) {
	c.mu.Lock()
	c.rtts[c.nrtt%len(c.rtts)] = sample{d, bytes}
	c.nrtt++
	c.mu.Unlock()
}

func (c *conn) samples() []sample {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]sample(nil), c.rtts[:min(c.nrtt, len(c.rtts))]...)
}

// quantile returns the q-quantile (nearest rank) of v, sorting v.
func quantile[T int64 | float64](v []T, q float64) T {
	if len(v) == 0 {
		return 0
	}
	sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
	r := int(math.Ceil(q*float64(len(v)))) - 1
	return v[max(0, min(r, len(v)-1))]
}

// quantiles returns the q-quantiles of the recent round trips and the
// sample count.
func (c *conn) quantiles(qs ...float64) ([]time.Duration, int) {
	ss := c.samples()
	v := make([]int64, len(ss))
	for i, s := range ss {
		v[i] = int64(s.dur)
	}
	out := make([]time.Duration, len(qs))
	for i, q := range qs {
		out[i] = time.Duration(quantile(v, q))
	}
	return out, len(ss)
}

// deadline returns the time to wait for a request of the given bytes
// (DISPATCH + expected RESULT). It models a round trip as latency + bytes /
// throughput from the recent samples: bw is the median effective throughput
// bytes/dur of the samples (a lower bound of the link's bandwidth, since dur
// includes latency and compute), the latency of a sample is what remains of
// dur after bytes/bw (at least 0), and
//
//	deadline = 3 x p99(latency) + margin + 4 x bytes / bw
//
// bounded by [MinDeadline, MaxDeadline]; MaxDeadline until 4 samples exist.
// Erring long only delays the recovery from a failed worker; erring short
// recomputes locally work a slow but healthy worker would have delivered.
func (c *conn) deadline(cfg Config, bytes int) time.Duration {
	ss := c.samples()
	if len(ss) < 4 {
		return cfg.MaxDeadline
	}
	bw, lat := latencyModel(ss)
	d := 3*time.Duration(quantile(lat, 0.99)) + cfg.DeadlineMargin + time.Duration(4*float64(bytes)/bw*1e9)
	return max(cfg.MinDeadline, min(cfg.MaxDeadline, d))
}

// sendData writes one worker message as a LinkData frame.
func (c *conn) sendData(msg []byte, timeout time.Duration) error {
	c.urgent.Add(1)
	c.wmu.Lock()
	c.urgent.Add(-1)
	defer c.wmu.Unlock()
	return c.writeDataLocked(msg, max(timeout, time.Second))
}

// writeDataLocked writes msg as a LinkData frame within timeout, flushes it
// and counts its bytes out; the caller holds c.wmu.
func (c *conn) writeDataLocked(msg []byte, timeout time.Duration) error {
	_ = c.link.SetWriteDeadline(time.Now().Add(timeout))
	err := wire.WriteLink(c.bw, wire.LinkData, msg)
	if err == nil {
		err = c.bw.Flush()
	}
	if err == nil {
		c.bytesOut.Add(uint64(len(msg)))
	}
	return err
}

// sendLow writes one low-priority worker message (a CHUNK) as a LinkData
// frame once no high-priority write (sendData, sendCtl) is waiting.
func (c *conn) sendLow(msg []byte) error {
	for {
		c.wmu.Lock()
		if c.urgent.Load() == 0 {
			break
		}
		c.wmu.Unlock()
		time.Sleep(50 * time.Microsecond)
	}
	defer c.wmu.Unlock()
	return c.writeDataLocked(msg, 30*time.Second)
}

// sendCtl writes a link control frame (best effort: a failed write surfaces
// as a read error on the link).
func (c *conn) sendCtl(kind byte, payload []byte) {
	c.urgent.Add(1)
	c.wmu.Lock()
	c.urgent.Add(-1)
	defer c.wmu.Unlock()
	_ = c.link.SetWriteDeadline(time.Now().Add(time.Second))
	if wire.WriteLink(c.bw, kind, payload) == nil {
		_ = c.bw.Flush()
	}
}

// closeLink asks the hub to close the worker's WebSocket with reason
// (policy violation, 1008) and closes the link.
func (c *conn) closeLink(reason string) {
	c.sendCtl(wire.LinkClose, wire.AppendLinkClose(nil, 1008, reason))
	c.link.Close()
}

// retire ends the session's work: it fails its pending requests (their
// pairs then go to a replica or are recomputed locally) and unregisters
// it. It returns false if the session was already closed.
func (c *conn) retire(reason string) bool {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return false
	}
	c.closed, c.reason = true, reason
	close(c.done)
	pend := c.pending
	c.pending = map[uint64]*job{}
	now := time.Now()
	for req := range pend {
		c.expired[req] = now // a RESULT still on its way is late, not unknown
	}
	c.mu.Unlock()
	for _, j := range pend {
		j.deliver(reply{err: fmt.Errorf("session closed: %s", reason)})
	}
	d := c.d
	d.mu.Lock()
	if d.workers[c.session] == c {
		delete(d.workers, c.session)
		d.rebuildLocked()
		d.gone = append(d.gone, c.stats())
		if len(d.gone) > maxGone {
			d.gone = d.gone[len(d.gone)-maxGone:]
		}
	}
	d.mu.Unlock()
	select {
	case <-d.stop:
	default:
		d.plan() // its experts go to the others
	}
	return true
}

// awaitVerdicts waits (at most max) until no checked RESULT of the session
// awaits its verdict.
func (c *conn) awaitVerdicts(max time.Duration) {
	deadline := time.Now().Add(max)
	for c.verifying.Load() > 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
}

// isClosed reports whether the session has ended.
func (c *conn) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// close ends the session (retire, unless done) and closes the link with
// reason: "going away" (1001) for CodeShutdown, else policy violation
// (1008).
func (c *conn) close(code uint16, reason string) {
	first := c.retire(reason)
	c.mu.Lock()
	linkClosed := c.linkClosed
	c.linkClosed = true
	c.mu.Unlock()
	if linkClosed {
		return
	}
	if code == wire.CodeShutdown {
		c.sendCtl(wire.LinkClose, wire.AppendLinkClose(nil, 1001, reason)) // going away
		c.link.Close()
	} else {
		c.closeLink(reason)
	}
	d := c.d
	if !first {
		reason = c.reasonNow()
	}
	d.log.Info("dispatch: worker left", "session", c.session, "worker", short(c.worker), "reason", reason)
}

func (c *conn) reasonNow() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reason
}

// clipStr cuts s to at most n bytes on a UTF-8 boundary.
func clipStr(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// clipWords is s cut to at most n bytes at a space, with "..." when cut
// (a ban's reason in a refusal read "...: outpu").
func clipWords(s string, n int) string {
	if len(s) <= n {
		return s
	}
	c := clipStr(s, n-3)
	if i := strings.LastIndexByte(c, ' '); i > n/2 {
		c = c[:i]
	}
	return c + "..."
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// latencyModel splits a worker's round-trip samples into a throughput and
// latencies: bw is the median of bytes/s over the samples, lat each
// sample's time less its bytes at bw (ns, at least 0). deadline and
// hedgeDelay take quantiles of lat.
func latencyModel(ss []sample) (bw float64, lat []int64) {
	rates := make([]float64, len(ss))
	for i, s := range ss {
		rates[i] = float64(s.bytes) / max(s.dur.Seconds(), 1e-6)
	}
	bw = quantile(rates, 0.5)
	lat = make([]int64, len(ss))
	for i, s := range ss {
		lat[i] = max(0, int64(s.dur)-int64(float64(s.bytes)/bw*1e9))
	}
	return bw, lat
}
