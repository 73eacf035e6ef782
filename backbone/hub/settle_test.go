package hub

import (
	"bufio"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// rig is a hub with a SQLite ledger between a raw WebSocket worker and a
// hand-written backbone (the test reads and writes the link itself).
type rig struct {
	h      *Hub
	l      *ledger.Ledger
	c      *websocket.Conn // the worker's side
	link   net.Conn        // the backbone's side
	bw     *bufio.Writer
	fromHb chan linkFrame // frames the hub wrote on the link; closed at EOF
}

type linkFrame struct {
	kind byte
	p    []byte
}

const rigWorker = "cdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcdcd"

func newRig(t *testing.T, mod func(*Config)) *rig {
	t.Helper()
	secret := []byte("0123456789abcdef")
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bln.Close() })
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	cfg := Config{Listen: "127.0.0.1:0", Backbone: bln.Addr().String(), Secret: secret, Meter: l,
		FlushEvery: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	if mod != nil {
		mod(&cfg)
	}
	h, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	r := &rig{h: h, l: l, fromHb: make(chan linkFrame, 64)}
	ready := make(chan struct{})
	go func() {
		c, err := bln.Accept()
		if err != nil {
			return
		}
		r.link = c
		br := bufio.NewReader(c)
		if _, _, err := wire.ReadLinkPreamble(br); err != nil {
			t.Errorf("preamble: %v", err)
		}
		r.bw = bufio.NewWriter(c)
		close(ready)
		for {
			k, p, err := wire.ReadLink(br)
			if err != nil {
				close(r.fromHb)
				return
			}
			r.fromHb <- linkFrame{k, p}
		}
	}()
	hdr := http.Header{}
	SignGateway(hdr, secret, rigWorker, time.Now())
	c, _, err := websocket.Dial(context.Background(), "ws://"+h.Addr()+wire.WorkerPath, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		t.Fatal(err)
	}
	c.SetReadLimit(wire.MaxMessage)
	t.Cleanup(func() { c.CloseNow() })
	<-ready
	t.Cleanup(func() { r.link.Close() })
	r.c = c
	return r
}

// toBackbone sends msg from the worker and waits for it on the link.
func (r *rig) toBackbone(t *testing.T, msg []byte) {
	t.Helper()
	if err := r.c.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
		t.Fatal(err)
	}
	if f := <-r.fromHb; f.kind != wire.LinkData || len(f.p) != len(msg) {
		t.Fatalf("backbone got kind %d, %d bytes", f.kind, len(f.p))
	}
}

// send writes link frames from the backbone.
func (r *rig) send(t *testing.T, kind byte, p []byte) {
	t.Helper()
	if err := wire.WriteLink(r.bw, kind, p); err != nil {
		t.Fatal(err)
	}
	if err := r.bw.Flush(); err != nil {
		t.Fatal(err)
	}
}

// toWorker sends a DISPATCH from the backbone and waits for the worker to
// receive it.
func (r *rig) toWorker(t *testing.T, msg []byte) {
	t.Helper()
	r.send(t, wire.LinkData, msg)
	if _, got, err := r.c.Read(context.Background()); err != nil || len(got) != len(msg) {
		t.Fatalf("worker got %d bytes, %v", len(got), err)
	}
}

func (r *rig) session(t *testing.T) SessionStats {
	t.Helper()
	ss := r.h.Sessions()
	if len(ss) != 1 {
		t.Fatalf("%d sessions", len(ss))
	}
	return ss[0]
}

// ledgerSums sums the ledger's rows: creditable in, out, rejected, and
// whether the last row is final.
func (r *rig) ledgerSums(t *testing.T) (in, out, rej uint64, final bool) {
	t.Helper()
	es, err := r.l.Since(0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range es {
		in, out, rej = in+e.BytesIn, out+e.BytesOut, rej+e.RejectedBytes
	}
	return in, out, rej, len(es) > 0 && es[len(es)-1].Final
}

func rigWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func result(req uint64) []byte { // 28 + 12 = 40 bytes (wire 5)
	return (&wire.Result{Request: req, M: 1, D: 3, Out: make([]float32, 3)}).Append(nil)
}

func dispatch(req uint64) []byte { // 24 + 12 + 8 = 44 bytes
	return (&wire.Dispatch{Request: req, Layer: 0, N: 1, D: 3, K: 2, Hidden: []float32{1, 2, 3}, IDs: []int32{0, 1}}).Append(nil)
}

// TestForfeitUnsettled: creditable bytes wait for their settle delay; a
// LinkForfeit that comes after they were metered (and after several ledger
// flushes) rejects them and every later creditable byte of the session, so
// the ledger never holds a creditable byte of that session.
func TestForfeitUnsettled(t *testing.T) {
	r := newRig(t, func(c *Config) { c.SettleDelay = time.Hour })
	r.toWorker(t, dispatch(1))
	r.toBackbone(t, result(1))
	r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, 1))
	rigWait(t, "the verdict", func() bool { return r.session(t).CreditIn == 40 })
	time.Sleep(100 * time.Millisecond) // five flush periods
	if in, out, _, _ := r.ledgerSums(t); in != 0 || out != 0 {
		t.Fatalf("ledger credited in %d out %d before settling", in, out)
	}
	if s := r.session(t); s.Unsettled != 84 || s.CreditOut != 44 {
		t.Fatalf("session %+v, want 84 unsettled", s)
	}
	r.toWorker(t, dispatch(2))
	r.toBackbone(t, result(2)) // the lie: its verdict is REJECTED (its DISPATCH with it), then FORFEIT
	r.send(t, wire.LinkRejected, wire.AppendLinkRequest(nil, 2))
	r.send(t, wire.LinkForfeit, wire.AppendLinkForfeit(nil, "verification failed"))
	rigWait(t, "the forfeit", func() bool { s := r.session(t); return s.Forfeited == 84 && s.Rejected == 168 })
	r.toWorker(t, dispatch(3)) // after the forfeit: never creditable
	r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, 3))
	rigWait(t, "the later dispatch", func() bool { return r.session(t).Forfeited == 128 })
	r.send(t, wire.LinkClose, wire.AppendLinkClose(nil, 1008, "verification failed; banned"))
	if _, _, err := r.c.Read(context.Background()); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("worker read: %v", err)
	}
	rigWait(t, "the final row", func() bool { _, _, _, f := r.ledgerSums(t); return f })
	in, out, rej, _ := r.ledgerSums(t)
	s := r.session(t)
	if in != 0 || out != 0 || rej != 3*44+2*40 || s.CreditIn != 0 || s.CreditOut != 0 || s.Unsettled != 0 ||
		s.ForfeitReason != "verification failed" {
		t.Fatalf("ledger in %d out %d rejected %d; session %+v", in, out, rej, s)
	}
}

// TestSettleByTimeAndCount: bytes settle once SettleDelay old and followed
// by SettleResults RESULTs while the worker keeps answering; a later
// forfeit leaves settled bytes credited.
func TestSettleByTimeAndCount(t *testing.T) {
	r := newRig(t, func(c *Config) { c.SettleDelay = 100 * time.Millisecond; c.SettleResults = 40 })
	r.toWorker(t, dispatch(1))
	r.toBackbone(t, result(1))
	r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, 1))
	rigWait(t, "the verdict", func() bool { return r.session(t).CreditIn == 40 })
	// RESULTs every 10 ms (verdicts pending): never idle for the delay,
	// fewer than 40 of them for ~300 ms, then 40.
	for req := uint64(100); req < 130; req++ {
		r.toBackbone(t, result(req))
		time.Sleep(10 * time.Millisecond)
	}
	if in, out, _, _ := r.ledgerSums(t); in != 0 || out != 0 {
		t.Fatalf("settled with fewer than 40 RESULTs after and no idle delay: in %d out %d", in, out)
	}
	for req := uint64(130); ; req++ {
		r.toBackbone(t, result(req))
		if in, out, _, _ := r.ledgerSums(t); in == 40 && out == 44 {
			if req < 139 {
				t.Fatalf("settled after RESULT %d, before the 40th", req)
			}
			break
		}
		if req > 1000 {
			t.Fatal("never settled")
		}
		time.Sleep(10 * time.Millisecond)
	}
	r.send(t, wire.LinkRejected, wire.AppendLinkRequest(nil, 130))
	r.send(t, wire.LinkForfeit, wire.AppendLinkForfeit(nil, "lied"))
	rigWait(t, "the forfeit", func() bool { return r.session(t).ForfeitReason == "lied" })
	r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, 131)) // accepted after the forfeit: rejected
	r.send(t, wire.LinkClose, wire.AppendLinkClose(nil, 1008, "bye"))
	if _, _, err := r.c.Read(context.Background()); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("worker read: %v", err)
	}
	rigWait(t, "the final row", func() bool { _, _, _, f := r.ledgerSums(t); return f })
	if in, out, _, _ := r.ledgerSums(t); in != 40 || out != 44 {
		t.Fatalf("ledger in %d out %d", in, out)
	}
}

// TestDrainAfterWorkerLeft: the worker closes while the backbone still owes
// a verdict; the hub half-closes the link, the backbone (seeing EOF) sends
// the verdict and closes, and the final row credits the RESULT.
func TestDrainAfterWorkerLeft(t *testing.T) {
	r := newRig(t, func(c *Config) { c.SettleDelay = time.Hour })
	r.toWorker(t, dispatch(1))
	r.toBackbone(t, result(1))
	r.c.Close(websocket.StatusNormalClosure, "bye")
	if f, ok := <-r.fromHb; ok {
		t.Fatalf("link frame %d after the worker left, want EOF", f.kind)
	}
	time.Sleep(50 * time.Millisecond) // the hub waits for us
	if s := r.session(t); s.Ended {
		t.Fatalf("session ended before the backbone closed the link: %+v", s)
	}
	r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, 1))
	r.send(t, wire.LinkData, dispatch(2)) // the worker is gone: dropped, not metered
	r.link.Close()
	rigWait(t, "the final row", func() bool { _, _, _, f := r.ledgerSums(t); return f })
	in, out, rej, _ := r.ledgerSums(t)
	if s := r.session(t); in != 40 || out != 44 || rej != 0 || !strings.Contains(s.Reason, "worker closed: 1000") {
		t.Fatalf("ledger in %d out %d rejected %d; session %+v", in, out, rej, s)
	}
}

// TestDrainTimeout: a backbone that never closes the link after the
// worker left holds the session for DrainTimeout only; its pending request
// (the DISPATCH and the RESULT that got no verdict) is then rejected.
func TestDrainTimeout(t *testing.T) {
	r := newRig(t, func(c *Config) { c.SettleDelay = time.Hour; c.DrainTimeout = 100 * time.Millisecond })
	r.toWorker(t, dispatch(1))
	r.toBackbone(t, result(1))
	r.c.Close(websocket.StatusNormalClosure, "bye")
	rigWait(t, "the final row", func() bool { _, _, _, f := r.ledgerSums(t); return f })
	if in, out, rej, _ := r.ledgerSums(t); in != 0 || out != 0 || rej != 84 {
		t.Fatalf("ledger in %d out %d rejected %d", in, out, rej)
	}
}

// TestMessageLimitBoundary: with no request outstanding, a worker message
// of ControlMessageCap bytes crosses the hub and one byte more closes the
// session with 1009 (a worker cannot make the hub hold 64 MiB per session
// unasked); with a DISPATCH outstanding whose answer may be as large as
// wire.MaxMessage, a message of exactly that many bytes crosses, one more
// closes.
func TestMessageLimitBoundary(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int
		ask   bool
	}{{"unasked", ControlMessageCap, false}, {"asked", wire.MaxMessage, true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, nil)
			if tc.ask {
				d := dispatch(9) // declares 1 row of d = MaxMessage/8 with k = 2: an answer of up to MaxMessage
				binary.LittleEndian.PutUint32(d[wire.HeaderSize+14:], uint32(wire.MaxMessage/8))
				r.toWorker(t, d)
			}
			msg := make([]byte, tc.limit)
			copy(msg, result(9)) // a RESULT header; the hub only peeks at it
			r.toBackbone(t, msg)
			msg = append(msg, 0)
			if err := r.c.Write(context.Background(), websocket.MessageBinary, msg); err != nil {
				t.Fatal(err)
			}
			_, _, err := r.c.Read(context.Background())
			if websocket.CloseStatus(err) != websocket.StatusMessageTooBig {
				t.Fatalf("worker read after an oversized message: %v", err)
			}
		})
	}
}

// TestDispatchPaidOnlyWhenAnswered: a DISPATCH is creditable only with an
// accepted answer to its request. A worker that answers ERROR, answers
// nothing, or answers with a RESULT the backbone rejects earns nothing for
// the rows it was sent (they are rejected bytes); the request it answered
// acceptably is paid, DISPATCH and RESULT.
func TestDispatchPaidOnlyWhenAnswered(t *testing.T) {
	r := newRig(t, func(c *Config) { c.SettleDelay = time.Hour })
	r.toWorker(t, dispatch(1))
	r.toBackbone(t, (&wire.Error{Request: 1, Code: 4, Message: "no"}).Append(nil)) // overhead, no verdict
	r.toWorker(t, dispatch(2))                                                     // never answered
	r.toWorker(t, dispatch(3))
	r.toBackbone(t, result(3))
	r.send(t, wire.LinkRejected, wire.AppendLinkRequest(nil, 3))
	r.toWorker(t, dispatch(4))
	r.toBackbone(t, result(4))
	r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, 4))
	rigWait(t, "the verdicts", func() bool { s := r.session(t); return s.CreditIn == 40 && s.Rejected == 84 })
	if s := r.session(t); s.CreditOut != 44 || s.Pending != 88 {
		t.Fatalf("session %+v: want 44 creditable out (request 4) and requests 1, 2 pending", s)
	}
	r.link.Close()
	rigWait(t, "the final row", func() bool { _, _, _, f := r.ledgerSums(t); return f })
	if in, out, rej, _ := r.ledgerSums(t); in != 40 || out != 44 || rej != 3*44+40 {
		t.Fatalf("ledger in %d out %d rejected %d, want 40, 44, %d", in, out, rej, 3*44+40)
	}
}

// TestLateBigAnswerRead: an answer larger than ControlMessageCap to a
// request the hub gave up on (its hold passed) is still read and passed
// on, to be rejected as late, not taken for an unasked message: a slow
// honest worker finishing a queue of large answers kept its session.
func TestLateBigAnswerRead(t *testing.T) {
	r := newRig(t, func(c *Config) { c.ResultHold, c.FlushEvery = 100*time.Millisecond, 20*time.Millisecond })
	d := dispatch(9) // declares 1 row of d = 5 MiB/8 with k = 2: an answer of about 5 MiB
	binary.LittleEndian.PutUint32(d[wire.HeaderSize+14:], uint32(5<<20/8))
	r.toWorker(t, d)
	rigWait(t, "the request given up", func() bool { return r.session(t).Rejected == uint64(len(d)) })
	msg := make([]byte, 5<<20)
	copy(msg, result(9))
	r.toBackbone(t, msg) // passed on whole
	if s := r.session(t); s.Ended || s.Reason != "" {
		t.Fatalf("session closed by a late answer: %+v", s)
	}
}
