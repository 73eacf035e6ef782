package hub

import (
	"bufio"
	"context"
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

// TestMetering drives a hub between a raw WebSocket client (with the
// gateway's MAC) and a hand-written backbone, and checks the SQLite ledger
// against byte counts worked out from the frame layouts.
func TestMetering(t *testing.T) {
	secret := []byte("0123456789abcdef")
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer bln.Close()
	l, err := ledger.Open(filepath.Join(t.TempDir(), "ledger.sqlite"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h, err := New(Config{Listen: "127.0.0.1:0", Backbone: bln.Addr().String(), Secret: secret, Meter: l,
		FlushEvery: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()

	worker := strings.Repeat("ab", 32)
	type linkMsg struct {
		kind byte
		p    []byte
	}
	fromHub := make(chan linkMsg, 16)
	var link net.Conn
	linkReady := make(chan struct{})
	go func() {
		c, err := bln.Accept()
		if err != nil {
			return
		}
		link = c
		br := bufio.NewReader(c)
		sess, w, err := wire.ReadLinkPreamble(br)
		if err != nil || w != worker || sess == "" {
			t.Errorf("preamble %q %q %v", sess, w, err)
		}
		close(linkReady)
		for {
			k, p, err := wire.ReadLink(br)
			if err != nil {
				close(fromHub)
				return
			}
			fromHub <- linkMsg{k, p}
		}
	}()
	hdr := http.Header{}
	SignGateway(hdr, secret, worker, time.Now())
	ctx := context.Background()
	c, _, err := websocket.Dial(ctx, "ws://"+h.Addr()+wire.WorkerPath, &websocket.DialOptions{HTTPHeader: hdr})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseNow()
	<-linkReady
	send := func(b []byte) {
		if err := c.Write(ctx, websocket.MessageBinary, b); err != nil {
			t.Fatal(err)
		}
		if m := <-fromHub; m.kind != wire.LinkData || string(m.p) != string(b) {
			t.Fatalf("backbone got kind %d % x", m.kind, m.p)
		}
	}
	ping := (&wire.Ping{Time: 1}).Append(nil)                                           // 12 bytes: overhead
	res5 := (&wire.Result{Request: 5, M: 2, D: 3, Out: make([]float32, 6)}).Append(nil) // 28+24 = 52: accepted
	res6 := (&wire.Result{Request: 6, M: 1, D: 3, Out: make([]float32, 3)}).Append(nil) // 28+12 = 40: rejected
	garbage := []byte("garbage!!")                                                      // 9: rejected
	// DIGESTs (52 bytes each) are metered as the RESULT they stand for.
	dig7 := (&wire.Digest{Request: 7, M: 2, D: 3}).Append(nil) // stands for 52: accepted
	dig8 := (&wire.Digest{Request: 8, M: 1, D: 3}).Append(nil) // stands for 40: rejected
	send(ping)
	send(res5)
	send(res6)
	send(garbage)
	send(dig7)
	send(dig8)
	disp := (&wire.Dispatch{Request: 5, Layer: 0, N: 1, D: 3, K: 2, Hidden: []float32{1, 2, 3}, IDs: []int32{0, 1}}).Append(nil)                     // 24+12+8 = 44
	dispDigest := (&wire.Dispatch{Request: 7, Layer: 0, N: 1, D: 3, K: 2, Hidden: []float32{1, 2, 3}, IDs: []int32{0, 1}, Digest: true}).Append(nil) // 44
	welcome := (&wire.Welcome{Session: "x", D: 3, K: 2, NLayer: 1, NExpert: 2}).Append(nil)                                                          // overhead
	bw := bufio.NewWriter(link)
	_ = wire.WriteLink(bw, wire.LinkData, welcome)
	_ = wire.WriteLink(bw, wire.LinkData, disp)
	_ = wire.WriteLink(bw, wire.LinkData, dispDigest)
	_ = wire.WriteLink(bw, wire.LinkAccepted, wire.AppendLinkRequest(nil, 5))
	_ = wire.WriteLink(bw, wire.LinkAccepted, wire.AppendLinkRequest(nil, 7))
	_ = wire.WriteLink(bw, wire.LinkRejected, wire.AppendLinkRequest(nil, 8))
	_ = wire.WriteLink(bw, wire.LinkRejected, wire.AppendLinkRequest(nil, 6))
	_ = wire.WriteLink(bw, wire.LinkAccepted, wire.AppendLinkRequest(nil, 99)) // unknown: ignored
	_ = bw.Flush()
	for _, want := range [][]byte{welcome, disp, dispDigest} {
		_, got, err := c.Read(ctx)
		if err != nil || string(got) != string(want) {
			t.Fatalf("worker got % x %v", got, err)
		}
	}
	_ = wire.WriteLink(bw, wire.LinkClose, wire.AppendLinkClose(nil, 1008, "done"))
	_ = bw.Flush()
	if _, _, err := c.Read(ctx); websocket.CloseStatus(err) != websocket.StatusPolicyViolation {
		t.Fatalf("close: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		ss := h.Sessions()
		if len(ss) == 1 && ss[0].Ended {
			s := ss[0]
			if s.CreditIn != 52+52 || s.CreditOut != 44+44 || s.Rejected != 40+9+40 || s.Pending != 0 ||
				s.FromWorker != 12+52+40+9+2*wire.DigestSize || s.ToWorker != uint64(len(welcome))+44+44 {
				t.Fatalf("session %+v", s)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("session did not end: %+v", ss)
		}
		time.Sleep(10 * time.Millisecond)
	}
	totals, err := l.Totals()
	if err != nil {
		t.Fatal(err)
	}
	es, err := l.Since(0, 100)
	if err != nil || len(es) == 0 || !es[len(es)-1].Final {
		t.Fatalf("entries %+v %v", es, err)
	}
	var in, out, rej uint64
	for _, e := range es {
		in, out, rej = in+e.BytesIn, out+e.BytesOut, rej+e.RejectedBytes
	}
	if in != 104 || out != 88 || rej != 89 || len(totals) != 1 {
		t.Fatalf("ledger in %d out %d rejected %d totals %+v", in, out, rej, totals)
	}
}
