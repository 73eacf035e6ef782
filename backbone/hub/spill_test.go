package hub

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
)

// TestSpillOnClose: the ledger refuses every append while the hub stops
// (disk full, database down). Close keeps trying for CloseRetry, then
// writes the sessions' last rows to the spill file and says so in its
// error (the hub command exits 1); the next hub appends them at Start and
// removes the file: the ledger ends with every creditable byte exactly
// once. Before, Close gave up after 5 tries in half a second, exited 0,
// and the bytes were lost.
func TestSpillOnClose(t *testing.T) {
	const n, rounds = 3, 4
	var fail atomic.Bool
	l := openLedger(t, hubBackend{"sqlite", false})
	m := &countingMeter{l: l, failBefore: func(int64) bool { return fail.Load() }}
	spill := filepath.Join(t.TempDir(), "ledger.unappended")
	f := startFleet(t, n, m, func(c *Config) {
		c.CloseRetry, c.SpillFile, c.SettleDelay = 300*time.Millisecond, spill, time.Hour
	})
	bridgeThenHangUp(t, f, rounds)
	fail.Store(true)
	t0 := time.Now()
	err := f.h.Close()
	if err == nil || !strings.Contains(err.Error(), spill) {
		t.Fatalf("Close = %v, want an error naming the spill file", err)
	}
	if el := time.Since(t0); el < 300*time.Millisecond {
		t.Fatalf("Close gave up after %v, before CloseRetry", el)
	}
	rows, err := readSpill(spill)
	if err != nil || len(rows) != n {
		t.Fatalf("spill file: %d rows, %v; want one per session (%d)", len(rows), err, n)
	}
	if es, _ := l.Since(0, 100); len(es) != 0 {
		t.Fatalf("the failing ledger holds %d rows", len(es))
	}

	// The next hub appends them before anything else.
	fail.Store(false)
	restartWithSpill(t, m, spill)
	if _, err := os.Stat(spill); !os.IsNotExist(err) {
		t.Fatalf("spill file still there after Start: %v", err)
	}
	checkExact(t, l, f, rounds)

	// A spill file the ledger refuses fails Start and is kept.
	if err := appendSpill(spill, rows); err != nil {
		t.Fatal(err)
	}
	fail.Store(true)
	h3, _ := New(Config{Listen: "127.0.0.1:0", Backbone: "127.0.0.1:1", Secret: []byte("0123456789abcdef"), Meter: m, SpillFile: spill, Logger: quietLog})
	if err := h3.Start(); err == nil || !strings.Contains(err.Error(), "nothing is lost") {
		t.Fatalf("Start with a refusing ledger = %v", err)
	}
	if got, _ := readSpill(spill); len(got) != n {
		t.Fatalf("spill file holds %d rows after a failed Start, want %d", len(got), n)
	}
}

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// LedgerError reports a ledger that refuses appends (the hub command's
// /readyz fails with it: reads still work on a full disk, so the read
// check alone stayed ready), and clears once an append goes through.
func TestLedgerError(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	m := &countingMeter{l: openLedger(t, hubBackend{"sqlite", false}), failBefore: func(int64) bool { return fail.Load() }}
	f := startFleet(t, 1, m, func(c *Config) { c.FlushEvery = 20 * time.Millisecond })
	f.dispatchAll(t)
	for deadline := time.Now().Add(5 * time.Second); f.h.LedgerError() == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no ledger error while every append fails")
		}
	}
	if err := f.h.LedgerError(); !strings.Contains(err.Error(), "injected: ledger unreachable") {
		t.Fatalf("LedgerError = %v", err)
	}
	fail.Store(false)
	for deadline := time.Now().Add(5 * time.Second); f.h.LedgerError() != nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("ledger error stays after appends work: %v", f.h.LedgerError())
		}
	}
}

// TestSpillKeepsEverything: a row that failed while the session was still
// working (unacknowledged, not final), then more accepted work and the
// session's end: the spill file holds the failed row, the rest of the
// bytes and the final row, so the next hub's ledger has every byte.
func TestSpillKeepsEverything(t *testing.T) {
	var fail atomic.Bool
	fail.Store(true)
	l := openLedger(t, hubBackend{"sqlite", false})
	m := &countingMeter{l: l, failBefore: func(int64) bool { return fail.Load() }}
	spill := filepath.Join(t.TempDir(), "ledger.unappended")
	f := startFleet(t, 1, m, func(c *Config) {
		c.CloseRetry, c.SpillFile, c.FlushEvery = 200*time.Millisecond, spill, 20*time.Millisecond
	})
	f.dispatchAll(t)
	for deadline := time.Now().Add(5 * time.Second); f.h.LedgerError() == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no failed append")
		}
	}
	f.dispatchAll(t)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if ss := f.h.Sessions(); len(ss) == 1 && ss[0].CreditOut == 88 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second request not metered: %+v", f.h.Sessions())
		}
	}
	f.ws[0].Close(websocket.StatusNormalClosure, "bye")
	f.mu.Lock()
	f.conns[0].Close()
	f.mu.Unlock()
	if err := f.h.Close(); err == nil || !strings.Contains(err.Error(), "88 creditable bytes") {
		t.Fatalf("Close = %v, want the spill of 88 creditable bytes", err)
	}
	rows, err := readSpill(spill)
	if err != nil || len(rows) == 0 || !rows[len(rows)-1].Final {
		t.Fatalf("spill: %+v, %v; want the rows ending with the final one", rows, err)
	}
	fail.Store(false)
	restartWithSpill(t, m, spill)
	checkExact(t, l, f, 2)
}

// restartWithSpill starts a hub on meter m with spill as its spill file
// (Start appends the file's rows first), closed at the test's end.
func restartWithSpill(t *testing.T, m Meter, spill string) {
	t.Helper()
	if err := startWithSpill(t, m, spill); err != nil {
		t.Fatal(err)
	}
}

// startWithSpill is restartWithSpill returning Start's error (a hub that
// started is closed at the test's end).
func startWithSpill(t *testing.T, m Meter, spill string) error {
	t.Helper()
	h, err := New(Config{Listen: "127.0.0.1:0", Backbone: "127.0.0.1:1", Secret: []byte("0123456789abcdef"), Meter: m, SpillFile: spill, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		return err
	}
	t.Cleanup(func() { h.Close() })
	return nil
}

// TestSpillFileDamaged: a spill file cut short mid-line, or holding a row
// the ledger would refuse, fails Start with the file and line named,
// appends nothing and leaves the file as it is (nothing is lost).
func TestSpillFileDamaged(t *testing.T) {
	key := strings.Repeat("ab", 32)
	good := `{"WorkerID":"` + key + `","SessionID":"s1","Seq":1}`
	for _, tc := range []struct{ name, body, want string }{
		{"truncated", good + "\n" + good[:len(good)/2], "line 2"},
		{"bad worker", good + "\n" + `{"WorkerID":"nothex","SessionID":"s1","Seq":2}` + "\n", "line 2"},
		{"not json", "\x00\xff garbage\n", "line 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spill := filepath.Join(t.TempDir(), "hub.unappended")
			if err := os.WriteFile(spill, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			l := openLedger(t, hubBackend{"sqlite", false})
			m := &countingMeter{l: l}
			err := startWithSpill(t, m, spill)
			if err == nil {
				t.Fatal("Start took a damaged spill file")
			}
			if !strings.Contains(err.Error(), spill) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start: %v; want the file and %s named", err, tc.want)
			}
			if es, _ := l.Since(0, 10); len(es) != 0 {
				t.Fatalf("%d rows appended from a damaged file", len(es))
			}
			if b, err := os.ReadFile(spill); err != nil || string(b) != tc.body {
				t.Fatalf("spill file changed: %q, %v", b, err)
			}
		})
	}
}

// bridgeThenHangUp has every worker of f answer rounds DISPATCHes, waits
// until the hub has bridged them all, then closes the workers' and the
// backbone's connections (the sessions' final rows become due).
func bridgeThenHangUp(t *testing.T, f *fleet, rounds int) {
	t.Helper()
	for range rounds {
		f.dispatchAll(t)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		var sent uint64
		for _, s := range f.h.Sessions() {
			sent += s.DispatchesSent
		}
		if sent >= uint64(f.sent.Load()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("DISPATCHes not bridged")
		}
	}
	for _, c := range f.ws {
		c.Close(websocket.StatusNormalClosure, "bye")
	}
	f.mu.Lock()
	for _, c := range f.conns {
		c.Close()
	}
	f.mu.Unlock()
}

// TestCloseRetriesOnDefaults is TestSpillOnClose's twin on the default
// CloseRetry (20 s): a ledger that refuses appends for the first 1.5 s of
// Close (a database restarting) gets every last row once it is back,
// Close returns nil, and no spill file is written.
func TestCloseRetriesOnDefaults(t *testing.T) {
	const n, rounds = 2, 3
	var fail atomic.Bool
	l := openLedger(t, hubBackend{"sqlite", false})
	m := &countingMeter{l: l, failBefore: func(int64) bool { return fail.Load() }}
	spill := filepath.Join(t.TempDir(), "ledger.unappended")
	f := startFleet(t, n, m, func(c *Config) { c.SpillFile, c.SettleDelay = spill, time.Hour })
	bridgeThenHangUp(t, f, rounds)
	fail.Store(true)
	time.AfterFunc(1500*time.Millisecond, func() { fail.Store(false) })
	t0 := time.Now()
	if err := f.h.Close(); err != nil {
		t.Fatalf("Close = %v, want the rows appended once the ledger is back", err)
	}
	if el := time.Since(t0); el < 1500*time.Millisecond {
		t.Fatalf("Close returned after %v, while the ledger still refused", el)
	}
	if _, err := os.Stat(spill); !os.IsNotExist(err) {
		t.Fatalf("spill file written: %v", err)
	}
	checkExact(t, l, f, rounds)
}

// protectDir makes dir's entries impossible to rename or remove: mode
// 0500, or for root (who ignores modes) the immutable attribute; it skips
// the test where neither holds. The protection is lifted at cleanup and by
// the returned func.
func protectDir(t *testing.T, dir string) (lift func()) {
	t.Helper()
	probe := filepath.Join(dir, ".probe")
	lift = func() {
		if os.Geteuid() == 0 {
			_ = exec.Command("chattr", "-i", dir).Run()
		}
		_ = os.Chmod(dir, 0o700)
	}
	t.Cleanup(lift)
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
			t.Skipf("root, and chattr +i failed (%v: %s): no way to make a folder read-only", err, out)
		}
	} else if err := os.Chmod(dir, 0o500); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(probe, nil, 0o600); err == nil {
		os.Remove(probe)
		t.Skip("the protected folder still takes new files")
	}
	return lift
}

// TestSpillNotMovable: a spill file in a folder where it cannot be
// renamed or removed fails Start before anything is appended, at every
// start (before, each start appended its rows again and then failed to
// remove the file: on an SQLite ledger of schema 1, which kept no Seq,
// every restart credited them once more). Once the folder is writable, one
// start appends them once.
func TestSpillNotMovable(t *testing.T) {
	key := strings.Repeat("cd", 32)
	body := `{"WorkerID":"` + key + `","SessionID":"s1","Seq":1,"BytesIn":1000,"BytesOut":200}` + "\n" +
		`{"WorkerID":"` + key + `","SessionID":"s1","Seq":2,"BytesIn":50,"Final":true}` + "\n"
	dir := t.TempDir()
	spill := filepath.Join(dir, "hub.unappended")
	if err := os.WriteFile(spill, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	l := openLedger(t, hubBackend{"sqlite", false})
	m := &countingMeter{l: l}
	lift := protectDir(t, dir)
	for try := range 2 {
		if err := startWithSpill(t, m, spill); err == nil {
			t.Fatalf("start %d: Start took a spill file it cannot remove", try)
		} else if !strings.Contains(err.Error(), "cannot be moved aside") || !strings.Contains(err.Error(), "nothing was appended") {
			t.Fatalf("start %d: %v", try, err)
		}
		if es, _ := l.Since(0, 10); len(es) != 0 {
			t.Fatalf("start %d: %d rows appended from a file that stays", try, len(es))
		}
	}
	lift()
	restartWithSpill(t, m, spill)
	es, err := l.Since(0, 10)
	if err != nil {
		t.Fatal(err)
	}
	var in uint64
	for _, e := range es {
		in += e.BytesIn
	}
	if len(es) != 2 || in != 1050 {
		t.Fatalf("after the folder was made writable: %d rows, %d bytes in; want the file's 2 rows, 1050 bytes, once", len(es), in)
	}
	for _, p := range []string{spill, spill + ".appending"} {
		if _, err := os.Stat(p); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("%s left after the append: %v", p, err)
		}
	}
}

// TestSpillLeftAppending: a ".appending" file (a start stopped between
// moving the spill file aside and removing it) fails Start with the file
// named and what to do, and appends nothing: its rows may be in the
// ledger already.
func TestSpillLeftAppending(t *testing.T) {
	key := strings.Repeat("ef", 32)
	body := `{"WorkerID":"` + key + `","SessionID":"s9","Seq":1,"BytesIn":7,"Final":true}` + "\n"
	spill := filepath.Join(t.TempDir(), "hub.unappended")
	if err := os.WriteFile(spill+".appending", []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	l := openLedger(t, hubBackend{"sqlite", false})
	err := startWithSpill(t, &countingMeter{l: l}, spill)
	if err == nil {
		t.Fatal("Start appended or ignored a half-appended spill file")
	}
	if !strings.Contains(err.Error(), spill+".appending") || !strings.Contains(err.Error(), "may be in the ledger already") || !strings.Contains(err.Error(), "sessions s9") {
		t.Fatalf("Start: %v", err)
	}
	if es, _ := l.Since(0, 10); len(es) != 0 {
		t.Fatalf("%d rows appended", len(es))
	}
	if b, err := os.ReadFile(spill + ".appending"); err != nil || string(b) != body {
		t.Fatalf("the .appending file changed: %q, %v", b, err)
	}
	// The stopped start had appended the row; the advice (rename it back)
	// records it once.
	if err := l.AppendAll(context.Background(), []ledger.Entry{{WorkerID: key, SessionID: "s9", Seq: 1, BytesIn: 7, Final: true, Time: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(spill+".appending", spill); err != nil {
		t.Fatal(err)
	}
	restartWithSpill(t, &countingMeter{l: l}, spill)
	if es, _ := l.Since(0, 10); len(es) != 1 || es[0].BytesIn != 7 || es[0].Seq != 1 {
		t.Fatalf("after renaming it back: %+v, want the one row once", es)
	}
	// A file of unnumbered rows (a hub from before rows were numbered): the
	// ledger cannot tell them from new ones, and the message says to look.
	old := `{"WorkerID":"` + key + `","SessionID":"s8","BytesIn":3,"Final":true}` + "\n"
	if err := os.WriteFile(spill+".appending", []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	err = startWithSpill(t, &countingMeter{l: l}, spill)
	if err == nil || !strings.Contains(err.Error(), "carry no number") || !strings.Contains(err.Error(), "Look for those sessions") || !strings.Contains(err.Error(), "sessions s8") {
		t.Fatalf("Start with an unnumbered .appending file: %v", err)
	}
}

// TestSpillAppendedTwice: a spill file put back after a start appended it
// (an operator restoring it from a backup) records nothing twice, on both
// ledgers: rows carry (SessionID, Seq), which SQLite keeps from schema 2
// as PostgreSQL does. Before, on SQLite, its rows were credited again.
func TestSpillAppendedTwice(t *testing.T) {
	for _, b := range hubBackends {
		t.Run(b.name, func(t *testing.T) {
			key := strings.Repeat("ab", 32)
			body := `{"WorkerID":"` + key + `","SessionID":"t1","Seq":1,"BytesIn":1000,"BytesOut":200,"Time":"2026-12-03T10:00:00Z"}` + "\n" +
				`{"WorkerID":"` + key + `","SessionID":"t1","Seq":2,"BytesIn":50,"Final":true,"Time":"2026-12-03T10:00:01Z"}` + "\n"
			spill := filepath.Join(t.TempDir(), "hub.unappended")
			l := openLedger(t, b)
			for round := range 2 {
				if err := os.WriteFile(spill, []byte(body), 0o600); err != nil {
					t.Fatal(err)
				}
				restartWithSpill(t, &countingMeter{l: l}, spill)
				tot, err := l.Totals()
				if err != nil {
					t.Fatal(err)
				}
				if len(tot) != 1 || tot[0].Bytes != 1250 || tot[0].Entries != 2 {
					t.Fatalf("after append %d: totals %+v, want 1250 bytes in 2 rows", round+1, tot)
				}
			}
			// Other contents under a recorded (session, seq) are refused, and
			// the file is kept for the operator.
			if err := os.WriteFile(spill, []byte(strings.Replace(body, `"BytesIn":50`, `"BytesIn":51`, 1)), 0o600); err != nil {
				t.Fatal(err)
			}
			if err := startWithSpill(t, &countingMeter{l: l}, spill); !errors.Is(err, ledger.ErrConflict) {
				t.Fatalf("a row recorded with other contents: %v, want ErrConflict", err)
			}
			if _, err := os.Stat(spill); err != nil {
				t.Fatalf("the refused spill file is gone: %v", err)
			}
			if tot, _ := l.Totals(); len(tot) != 1 || tot[0].Bytes != 1250 {
				t.Fatalf("after the refused append: %+v", tot)
			}
		})
	}
}

// TestSpillNotWritable: a spill file in a missing folder, or in one the
// hub may not write to, fails Start naming it. The hub started, and a stop
// whose ledger refused the last rows then lost them ("not appended, and
// not kept").
func TestSpillNotWritable(t *testing.T) {
	l := openLedger(t, hubBackend{"sqlite", false})
	start := func(spill string) error { return startWithSpill(t, &countingMeter{l: l}, spill) }
	missing := filepath.Join(t.TempDir(), "no", "such", "hub.unappended")
	if err := start(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Fatalf("missing folder: %v", err)
	}
	dir := t.TempDir()
	lift := protectDir(t, dir)
	if err := start(filepath.Join(dir, "hub.unappended")); err == nil || !strings.Contains(err.Error(), "could not be written") {
		t.Fatalf("read-only folder: %v", err)
	}
	lift()
	if err := start(filepath.Join(dir, "hub.unappended")); err != nil {
		t.Fatalf("writable again: %v", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Fatalf("the check left %d files", len(ents))
	}
}
