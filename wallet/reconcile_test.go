package wallet

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestOldShortfallNotHiddenByNewWork replays the report: the hub was
// killed during traffic and 14.3 MB of session "a" were never credited.
// Idle, the wallet shows the mismatch; while session "b" works non-stop
// with its credits 40 s behind, credits for b must not fill a's gap: the
// mismatch stays at a's 14.3 MB, naming a, and only b's uncredited bytes
// are awaiting credit. The figures come from the wallet file (the test
// reopens it in the middle), not only from the running process.
func TestOldShortfallNotHiddenByNewWork(t *testing.T) {
	id := testID(1)
	c := newClock()
	path := filepath.Join(t.TempDir(), "wallet.db")
	w := openClock(t, path, id, c)
	gw := gwKey().Public().(ed25519.PublicKey)
	var n, cum uint64
	credit := func(b uint64) {
		t.Helper()
		var sts = statements(t, id, 7, n+1, cum, b)
		if b == 0 {
			sts = nil
		} else {
			n++
			cum += b
		}
		if _, err := w.AddStatements(gw, sts); err != nil {
			t.Fatal(err)
		}
	}
	summary := func() Summary {
		t.Helper()
		s, err := w.Summary()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	const lost = 14_300_000
	// Session a: 100 MB in 10 s; the gateway credits 85.7 MB of it.
	for range 10 {
		c.advance(time.Second)
		w.Served("a", 5_000_000, 5_000_000)
	}
	c.advance(30 * time.Second)
	credit(100_000_000 - lost)
	// Idle, fetching every 30 s: a mismatch once a's last count is 90 s
	// older than a fetch.
	for range 3 {
		c.advance(30 * time.Second)
		credit(0)
	}
	s := summary()
	if r := s.Reconcile; !r.Mismatch || r.MismatchBytes != lost || r.MismatchSession != "a" || r.AwaitingBytes != 0 ||
		!strings.HasPrefix(r.Explanation, "14.3 MB that this computer counted more than 1m30s before a statement fetch (in session a, last counted 2026-05-01 12:00:10Z, or before it)") {
		t.Fatalf("idle after a: %+v", r)
	}
	// Session b: 2 MB a second for 5 minutes, credited 40 s behind and
	// fetched every second.
	const rate = 2_000_000
	var servedB, creditedB uint64
	for sec := 1; sec <= 300; sec++ {
		c.advance(time.Second)
		w.Served("b", rate/2, rate/2)
		servedB += rate
		if sec > 40 {
			credit(rate)
			creditedB += rate
		} else {
			credit(0)
		}
		if sec == 150 { // a restart: only the file remembers
			w.Close()
			w = openClock(t, path, id, c)
		}
		r := summary().Reconcile
		if !r.Mismatch || r.MismatchBytes != lost || r.MismatchSession != "a" || r.AwaitingBytes != servedB-creditedB ||
			!strings.Contains(r.Explanation, "; besides, ") {
			t.Fatalf("b second %d (served %d, credited %d): %+v", sec, servedB, creditedB, r)
		}
	}
	// JSON and text say the same.
	var buf bytes.Buffer
	if err := WriteJSON(&buf, summary()); err != nil {
		t.Fatal(err)
	}
	var js struct {
		Reconcile map[string]any `json:"reconcile"`
	}
	if err := json.Unmarshal(buf.Bytes(), &js); err != nil {
		t.Fatal(err)
	}
	if js.Reconcile["mismatch"] != true || js.Reconcile["mismatch_bytes"] != float64(lost) ||
		js.Reconcile["awaiting_bytes"] != float64(servedB-creditedB) || js.Reconcile["mismatch_session"] != "a" {
		t.Fatalf("JSON reconcile %v", js.Reconcile)
	}
	buf.Reset()
	if err := WriteText(&buf, summary()); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "Reconcile: MISMATCH: 14.3 MB that this computer counted") ||
		!strings.Contains(buf.String(), "; besides, 80.0 MB counted since are awaiting credit") {
		t.Fatalf("text:\n%s", buf.String())
	}
	// b's last 40 s are credited; idle again: the same mismatch, nothing
	// awaiting.
	for range 40 {
		c.advance(time.Second)
		credit(rate)
	}
	c.advance(60 * time.Second)
	credit(0)
	if r := summary().Reconcile; !r.Mismatch || r.MismatchBytes != lost || r.MismatchSession != "a" || r.AwaitingBytes != 0 ||
		strings.Contains(r.Explanation, "besides") {
		t.Fatalf("idle after b: %+v", r)
	}
}

// TestNewWorkAwaitingWithoutOldShortfall: a fully credited old session and
// a new one in flight are "awaiting credit" with only the new bytes, never
// a mismatch.
func TestNewWorkAwaitingWithoutOldShortfall(t *testing.T) {
	id := testID(1)
	c := newClock()
	w := openClock(t, filepath.Join(t.TempDir(), "wallet.db"), id, c)
	gw := gwKey().Public().(ed25519.PublicKey)
	w.Served("a", 50_000_000, 50_000_000)
	c.advance(30 * time.Second)
	if _, err := w.AddStatements(gw, statements(t, id, 7, 1, 0, 100_000_000)); err != nil {
		t.Fatal(err)
	}
	c.advance(120 * time.Second)
	w.Served("b", 3_000_000, 2_000_000)
	if _, err := w.AddStatements(gw, nil); err != nil {
		t.Fatal(err)
	}
	s, err := w.Summary()
	if err != nil {
		t.Fatal(err)
	}
	if r := s.Reconcile; r.Mismatch || r.MismatchBytes != 0 || r.AwaitingBytes != 5_000_000 || ReconcileFlag(r) != "awaiting credit" {
		t.Fatalf("%+v", r)
	}
}
