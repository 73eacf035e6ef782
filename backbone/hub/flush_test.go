package hub

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// countingMeter is a BatchMeter over a ledger that counts transactions and
// can fail an append before it reaches the ledger, or after the ledger
// committed it (the acknowledgement lost, as when a connection drops
// during COMMIT).
type countingMeter struct {
	l           *ledger.Ledger
	calls, rows atomic.Int64
	maxRows     atomic.Int64
	failBefore  func(call int64) bool
	failAfter   func(call int64) bool
	lost        atomic.Int64 // appends that committed and reported an error
}

func (m *countingMeter) Append(e ledger.Entry) error {
	return m.AppendAll(context.Background(), []ledger.Entry{e})
}

func (m *countingMeter) AppendAll(ctx context.Context, es []ledger.Entry) error {
	n := m.calls.Add(1)
	if m.failBefore != nil && m.failBefore(n) {
		return errors.New("injected: ledger unreachable")
	}
	if err := m.l.AppendAll(ctx, es); err != nil {
		return err
	}
	if m.failAfter != nil && m.failAfter(n) {
		m.lost.Add(1)
		return errors.New("injected: commit acknowledgement lost")
	}
	m.rows.Add(int64(len(es)))
	for {
		if old := m.maxRows.Load(); int64(len(es)) <= old || m.maxRows.CompareAndSwap(old, int64(len(es))) {
			break
		}
	}
	return nil
}

// fleet is a hub with many raw WebSocket workers and a hand-written
// backbone that sends each session DISPATCH frames.
type fleet struct {
	h     *Hub
	mu    sync.Mutex
	links []*bufio.Writer // one per session, in accept order
	conns []net.Conn
	ws    []*websocket.Conn
	sent  atomic.Int64 // DISPATCH messages written to links
	round uint64       // request id of the last dispatchAll
}

func workerHex(i int) string { return fmt.Sprintf("%064x", i+1) }

func startFleet(t testing.TB, n int, meter Meter, mod func(*Config)) *fleet {
	t.Helper()
	secret := []byte("0123456789abcdef")
	bln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bln.Close() })
	cfg := Config{Listen: "127.0.0.1:0", Backbone: bln.Addr().String(), Secret: secret, Meter: meter,
		FlushEvery: 100 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
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
	f := &fleet{h: h}
	accepted := make(chan struct{}, n)
	go func() {
		for {
			c, err := bln.Accept()
			if err != nil {
				return
			}
			br := bufio.NewReader(c)
			if _, _, err := wire.ReadLinkPreamble(br); err != nil {
				c.Close()
				continue
			}
			f.mu.Lock()
			f.links = append(f.links, bufio.NewWriter(c))
			f.conns = append(f.conns, c)
			f.mu.Unlock()
			go func() { _, _ = io.Copy(io.Discard, br) }()
			accepted <- struct{}{}
		}
	}()
	for i := range n {
		hdr := http.Header{}
		SignGateway(hdr, secret, workerHex(i), time.Now())
		c, _, err := websocket.Dial(context.Background(), "ws://"+h.Addr()+wire.WorkerPath, &websocket.DialOptions{HTTPHeader: hdr})
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadLimit(wire.MaxMessage)
		go func() { // the worker reads what it is sent
			for {
				if _, _, err := c.Read(context.Background()); err != nil {
					return
				}
			}
		}()
		f.ws = append(f.ws, c)
		<-accepted
	}
	t.Cleanup(func() {
		for _, c := range f.ws {
			c.CloseNow()
		}
		h.Close()
		f.mu.Lock()
		for _, c := range f.conns {
			c.Close()
		}
		f.mu.Unlock()
	})
	return f
}

// dispatchAll sends one 44-byte DISPATCH on every link.
func (f *fleet) dispatchAll(t testing.TB) {
	t.Helper()
	f.mu.Lock()
	defer f.mu.Unlock()
	// Each round is a new request; the backbone's verdict that its answer
	// was accepted follows it (a DISPATCH is creditable once its request
	// is answered acceptably; the answer itself is not what these tests
	// count).
	f.round++
	msg := dispatch(f.round)
	for _, bw := range f.links {
		if err := wire.WriteLink(bw, wire.LinkData, msg); err != nil {
			t.Fatal(err)
		}
		if err := wire.WriteLink(bw, wire.LinkAccepted, wire.AppendLinkRequest(nil, f.round)); err != nil {
			t.Fatal(err)
		}
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		f.sent.Add(1)
	}
}

// endAll waits until the hub has bridged every DISPATCH sent (a worker
// closing first would find them undelivered, unmetered), closes every
// worker and waits until each session's final row is in the ledger
// (Ended).
func (f *fleet) endAll(t testing.TB) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var n uint64
		for _, s := range f.h.Sessions() {
			n += s.DispatchesSent
		}
		if n >= uint64(f.sent.Load()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d DISPATCHes bridged", n, f.sent.Load())
		}
	}
	for _, c := range f.ws {
		c.Close(websocket.StatusNormalClosure, "bye")
	}
	f.mu.Lock()
	for _, c := range f.conns { // the backbone closes the links (no verdicts owed)
		c.Close()
	}
	f.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ended := 0
		for _, s := range f.h.Sessions() {
			if s.Ended {
				ended++
			}
		}
		if ended == len(f.ws) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d sessions ended", ended, len(f.ws))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// checkExact: the ledger holds 44 bytes per DISPATCH sent, per worker,
// every session has exactly one final row, and no (session, seq) twice.
func checkExact(t *testing.T, l *ledger.Ledger, f *fleet, perSession int) {
	t.Helper()
	es, err := l.Since(0, ledger.MaxLimit)
	if err != nil {
		t.Fatal(err)
	}
	finals := map[string]int{}
	per := map[string]uint64{}
	for _, e := range es {
		per[e.WorkerID] += e.BytesOut + e.BytesIn
		if e.Final {
			finals[e.SessionID]++
		}
	}
	if len(finals) != len(f.ws) {
		t.Errorf("%d sessions have a final row, want %d", len(finals), len(f.ws))
	}
	for id, n := range finals {
		if n != 1 {
			t.Errorf("session %s: %d final rows", id, n)
		}
	}
	for i := range f.ws {
		if got, want := per[workerHex(i)], uint64(44*perSession); got != want {
			t.Errorf("worker %d: %d creditable bytes in the ledger, want %d", i, got, want)
		}
	}
}

type hubBackend struct {
	name string
	pg   bool
}

func openLedger(t *testing.T, b hubBackend) *ledger.Ledger {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.sqlite")
	if b.pg {
		path = pgtest.DSN(t)
	}
	l, err := ledger.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

var hubBackends = []hubBackend{{"sqlite", false}, {"postgres", true}}

// TestFlushBatchesSessions: 150 sessions metered for about a second cost
// one ledger transaction per flush period (AppendAll with every session's
// row), not one per session; every byte is in the ledger once.
func TestFlushBatchesSessions(t *testing.T) {
	for _, b := range hubBackends {
		t.Run(b.name, func(t *testing.T) {
			const n, rounds = 150, 8
			m := &countingMeter{l: openLedger(t, b)}
			f := startFleet(t, n, m, func(c *Config) { c.FlushEvery = 150 * time.Millisecond })
			start := time.Now()
			for range rounds {
				f.dispatchAll(t)
				time.Sleep(150 * time.Millisecond)
			}
			f.endAll(t)
			elapsed := time.Since(start)
			checkExact(t, m.l, f, rounds)
			calls, rows := m.calls.Load(), m.rows.Load()
			if limit := int64(elapsed/(150*time.Millisecond)) + 3; calls > limit {
				t.Errorf("%d ledger transactions in %v (flush every 150 ms): want at most %d", calls, elapsed, limit)
			}
			if m.maxRows.Load() < n {
				t.Errorf("largest transaction %d rows, want all %d sessions in one", m.maxRows.Load(), n)
			}
			t.Logf("%s: %d sessions, %d rows in %d transactions over %v", b.name, n, rows, calls, elapsed.Round(time.Millisecond))
		})
	}
}

// TestFlushRetriesSameRows: appends that fail before reaching the ledger
// (both backends), or that the ledger committed but whose answer was lost
// (PostgreSQL, which keys rows by (session, seq)), are sent again
// unchanged; the ledger ends with every byte exactly once.
func TestFlushRetriesSameRows(t *testing.T) {
	for _, b := range hubBackends {
		t.Run(b.name, func(t *testing.T) {
			const n, rounds = 20, 24
			m := &countingMeter{l: openLedger(t, b), failBefore: func(c int64) bool { return c%3 == 0 }}
			if b.pg {
				m.failAfter = func(c int64) bool { return c%4 == 1 }
			}
			f := startFleet(t, n, m, func(c *Config) { c.FlushEvery = 40 * time.Millisecond })
			for range rounds {
				f.dispatchAll(t)
				time.Sleep(25 * time.Millisecond)
			}
			f.endAll(t)
			checkExact(t, m.l, f, rounds)
			if b.pg && m.lost.Load() == 0 {
				t.Error("no append lost its acknowledgement")
			}
			t.Logf("%s: %d appends, %d with a lost acknowledgement", b.name, m.calls.Load(), m.lost.Load())
		})
	}
}

// TestHubMetrics: the hub serves Prometheus series on /metrics: sessions,
// bytes bridged, ledger rows and transactions, refused upgrades by reason.
func TestHubMetrics(t *testing.T) {
	m := &countingMeter{l: openLedger(t, hubBackend{"sqlite", false})}
	f := startFleet(t, 3, m, nil)
	f.dispatchAll(t)
	bad := http.Header{}
	SignGateway(bad, []byte("another secret!!"), workerHex(0), time.Now())
	if _, resp, err := websocket.Dial(context.Background(), "ws://"+f.h.Addr()+wire.WorkerPath, &websocket.DialOptions{HTTPHeader: bad}); err == nil || resp.StatusCode != 403 {
		t.Fatalf("forged upgrade: %v", err)
	}
	if _, resp, err := websocket.Dial(context.Background(), "ws://"+f.h.Addr()+wire.WorkerPath, nil); err == nil || resp.StatusCode != 403 {
		t.Fatalf("unsigned upgrade: %v", err)
	}
	f.endAll(t)
	wants := []string{
		"kvasir_hub_sessions_total 3",
		"kvasir_hub_sessions_open 0",
		`kvasir_hub_bytes_bridged_total{dir="to_worker"} 132`,
		`kvasir_hub_refused_upgrades_total{reason="bad_mac"} 1`,
		`kvasir_hub_refused_upgrades_total{reason="unsigned"} 1`,
		`kvasir_hub_ledger_bytes_total{kind="creditable"} 132`,
		"kvasir_hub_ledger_rows_total ",
		"kvasir_hub_ledger_transactions_total ",
		"kvasir_hub_ledger_append_seconds_bucket",
		"kvasir_hub_ledger_lag_seconds 0",
		"kvasir_hub_ledger_unacked_rows 0",
	}
	// A session's last bytes are counted as its bridge ends, which may be
	// a moment after endAll returns: read until everything is there.
	var missing []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + f.h.Addr() + MetricsPath)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		missing = missing[:0]
		for _, want := range wants {
			if !strings.Contains(string(body), want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range missing {
		t.Errorf("/metrics lacks %q", want)
	}
}
