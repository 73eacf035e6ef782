package credit

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// workerKey returns a deterministic worker key i.
func workerKey(i int) ed25519.PrivateKey {
	seed := make([]byte, ed25519.SeedSize)
	seed[0], seed[1] = byte(i), 0x5a
	return ed25519.NewKeyFromSeed(seed)
}

func workerID(i int) string { return hex.EncodeToString(workerKey(i).Public().(ed25519.PublicKey)) }

func openPair(t *testing.T, dir string, rate uint64) (*ledger.Ledger, *Service) {
	t.Helper()
	l, err := ledger.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(Config{Path: filepath.Join(dir, "wallets.db"), Source: l, RateNKVRPerByte: rate})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); l.Close() })
	return l, s
}

// The reference deployment's vector: 1,277,952 bytes -> 1.277952 units ->
// 8,945,664 nKVR at 7 nKVR/byte -> "0.00895 KVR".
func TestReferenceVector(t *testing.T) {
	l, s := openPair(t, t.TempDir(), 0) // 0: the default rate
	if s.Rate() != 7 {
		t.Fatalf("default rate %d", s.Rate())
	}
	// Two entries of one session: 1,000,000 DISPATCH + 277,952 RESULT bytes, plus rejected bytes that must not count.
	if err := l.Append(ledger.Entry{SessionID: "s", WorkerID: workerID(1), BytesOut: 1_000_000, RejectedBytes: 4096}); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(ledger.Entry{SessionID: "s", WorkerID: workerID(1), BytesIn: 277_952, Final: true}); err != nil {
		t.Fatal(err)
	}
	res, err := s.Credit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Rows != 2 || res.Bytes != 1_277_952 || res.NKVR != 8_945_664 || res.Cursor != 2 {
		t.Fatalf("Credit = %+v", res)
	}
	ws, _ := s.Wallets()
	if len(ws) != 1 || ws[0].Bytes != 1_277_952 || ws[0].NKVR != 8_945_664 || ws[0].RejectedBytes != 4096 || ws[0].Statements != 1 {
		t.Fatalf("wallets = %+v", ws)
	}
	if got := walletapi.FormatUnits(ws[0].Bytes); got != "1.277952" {
		t.Errorf("units %q", got)
	}
	if got := walletapi.FormatKVR(ws[0].NKVR); got != "0.00895 KVR" {
		t.Errorf("display %q", got)
	}
	sts, more, err := s.Statements(context.Background(), workerID(1), 0, 10)
	if err != nil || more || len(sts) != 1 {
		t.Fatalf("statements: %v %v %d", err, more, len(sts))
	}
	st, err := walletapi.Open(s.PublicKey(), sts[0])
	if err != nil {
		t.Fatal(err)
	}
	want := walletapi.Statement{Version: 1, Gateway: hex.EncodeToString(s.PublicKey()), Worker: workerID(1), N: 1, LedgerAfter: 0, LedgerUpTo: 2,
		Bytes: 1_277_952, RejectedBytes: 4096, RateNKVRPerByte: 7, NKVR: 8_945_664, CumulativeBytes: 1_277_952, CumulativeNKVR: 8_945_664,
		TimeUnixMilli: st.TimeUnixMilli}
	if st != want {
		t.Fatalf("statement %+v\nwant %+v", st, want)
	}
	// Nothing new: a second Credit is a no-op.
	if res, err := s.Credit(context.Background()); err != nil || res.Rows != 0 {
		t.Fatalf("second Credit = %+v, %v", res, err)
	}
}

// flaky fails a fraction of reads, like a hub that restarts or a network
// that drops.
type flaky struct {
	r      ledger.Reader
	rng    *rand.Rand
	fail   float64
	onRead func() // runs after the read (once; it clears itself)
}

func (f *flaky) Read(ctx context.Context, after int64, limit int) ([]ledger.Entry, error) {
	if f.onRead != nil {
		defer f.onRead()
	}
	if f.rng.Float64() < f.fail {
		return nil, errors.New("flaky: hub unreachable")
	}
	return f.r.Read(ctx, after, limit)
}

// ledgerTruth sums the creditable bytes per worker of entries with id <= upto.
func ledgerTruth(t *testing.T, l *ledger.Ledger, upto int64) (map[string]uint64, uint64) {
	t.Helper()
	es, err := l.Since(0, ledger.MaxLimit)
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]uint64{}
	var total uint64
	for _, e := range es {
		if e.ID <= upto {
			per[e.WorkerID] += e.BytesIn + e.BytesOut
			total += e.BytesIn + e.BytesOut
		}
	}
	return per, total
}

func creditedTotal(t *testing.T, s *Service) (map[string]Wallet, uint64) {
	t.Helper()
	ws, err := s.Wallets()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]Wallet{}
	var n uint64
	for _, w := range ws {
		m[w.Worker] = w
		n += w.NKVR
	}
	return m, n
}

// checkStatements verifies every worker's statement chain: signatures,
// numbering 1..N without gaps, cumulative totals = running sums = wallet.
func checkStatements(t *testing.T, s *Service) {
	t.Helper()
	ws, _ := s.Wallets()
	for _, w := range ws {
		var sts []walletapi.Signed
		for more := true; more; {
			page, m, err := s.Statements(context.Background(), w.Worker, uint64(len(sts)), walletapi.MaxPage)
			if err != nil {
				t.Fatal(err)
			}
			sts, more = append(sts, page...), m
		}
		var b, n uint64
		for i, sg := range sts {
			st, err := walletapi.Open(s.PublicKey(), sg)
			if err != nil {
				t.Fatalf("worker %s statement %d: %v", w.Worker[:8], i+1, err)
			}
			b += st.Bytes
			n += st.NKVR
			if st.N != uint64(i+1) || st.CumulativeBytes != b || st.CumulativeNKVR != n || st.Worker != w.Worker {
				t.Fatalf("worker %s statement %d inconsistent: %+v", w.Worker[:8], i+1, st)
			}
		}
		if uint64(len(sts)) != w.Statements || b != w.Bytes || n != w.NKVR {
			t.Fatalf("worker %s: statements sum %d bytes %d nKVR in %d, wallet %+v", w.Worker[:8], b, n, len(sts), w)
		}
	}
}

// TestPropertyExactlyOnce runs random sequences of appends, crediting with
// injected crashes (before commit), failing reads, concurrent gateways and
// restarts of hub and gateway; after every step the credited nKVR equals
// rate x the creditable bytes up to the cursor, and never exceeds rate x
// all creditable bytes; at the end they are equal per worker.
func TestPropertyExactlyOnce(t *testing.T) {
	seeds, steps := 6, 200 // about 10 s: every append and credit fsyncs
	if testing.Short() {
		seeds, steps = 3, 120
	}
	if os.Getenv("KVASIR_LONG_TESTS") != "" {
		seeds, steps = 40, 400
	}
	forBackends(t, func(t *testing.T, b backend) { propertyExactlyOnce(t, b, seeds, steps) })
}

// propertyExactlyOnce is TestPropertyExactlyOnce on one backend.
func propertyExactlyOnce(t *testing.T, b backend, seeds, steps int) {
	totalConflicts := 0
	defer func() {
		if !t.Failed() && !t.Skipped() && totalConflicts == 0 {
			t.Error("no run exercised a crediting conflict")
		}
	}()
	for seed := range seeds {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(seed), 42))
			rate := []uint64{1, 7, 13, 1_000_000}[seed%4]
			lpath, wpath := b.paths(t)
			l, err := ledger.Open(lpath)
			if err != nil {
				t.Fatal(err)
			}
			src := &flaky{r: l, rng: rng, fail: 0.15}
			open := func() *Service {
				s, err := Open(Config{Path: wpath, Source: src, RateNKVRPerByte: rate, Batch: 1 + rng.IntN(7)})
				if err != nil {
					t.Fatal(err)
				}
				return s
			}
			s := open()
			pub := s.PublicKey()
			if !s.Created() {
				t.Fatal("a new wallets file: Created false")
			}
			var abandoned []*Service
			defer func() {
				s.Close()
				for _, a := range abandoned {
					a.Close()
				}
				l.Close()
			}()
			sessions := 0
			crashes, conflicts, raced := 0, 0, 0
			for step := range steps {
				switch op := rng.IntN(100); {
				case op < 45: // hub appends
					sessions += rng.IntN(2)
					e := ledger.Entry{SessionID: fmt.Sprint("sess", sessions), WorkerID: workerID(rng.IntN(5)),
						BytesIn: uint64(rng.IntN(3)) * uint64(rng.IntN(1<<20)), BytesOut: uint64(rng.IntN(1 << 16)),
						RejectedBytes: uint64(rng.IntN(2)) * uint64(rng.IntN(5000)), Final: rng.IntN(4) == 0}
					if err := l.Append(e); err != nil {
						t.Fatal(err)
					}
				case op < 70: // gateway credits, maybe crashing before commit
					if rng.IntN(4) == 0 {
						s.beforeCommit = func() error { return errors.New("simulated crash before commit") }
					}
					_, err := s.Credit(context.Background())
					if err != nil {
						crashes++
					}
					s.beforeCommit = nil
				case op < 78: // two gateway processes on one wallets file
					s2 := open()
					_, e1 := s2.CreditBatch(context.Background())
					_, e2 := s.CreditBatch(context.Background())
					if errors.Is(e1, ErrConflict) || errors.Is(e2, ErrConflict) {
						conflicts++
					}
					s2.Close()
				case op < 86: // gateway restart; half the time a "crash" that never closes
					if rng.IntN(2) == 0 {
						abandoned = append(abandoned, s)
					} else {
						s.Close()
					}
					s = open()
					if !s.PublicKey().Equal(pub) || s.Created() {
						t.Fatalf("gateway restart: key changed %v, created %v", !s.PublicKey().Equal(pub), s.Created())
					}
				case op < 94: // hub restart
					l.Close()
					if l, err = ledger.Open(lpath); err != nil {
						t.Fatal(err)
					}
					src.r = l
				default: // race: another gateway commits while this one reads the ledger
					src.onRead = func() {
						src.onRead = nil
						s2 := open()
						if r, err := s2.Credit(context.Background()); err == nil && r.Rows > 0 {
							raced++
						}
						s2.Close()
					}
					before := raced
					_, err := s.CreditBatch(context.Background())
					src.onRead = nil
					if raced > before && err == nil {
						t.Fatalf("step %d: batch committed although another gateway moved the cursor", step)
					}
					if errors.Is(err, ErrConflict) {
						conflicts++
					}
				}
				cur, err := s.Cursor()
				if err != nil {
					t.Fatal(err)
				}
				_, upto := ledgerTruth(t, l, cur)
				_, all := ledgerTruth(t, l, 1<<62)
				_, paid := creditedTotal(t, s)
				if paid != rate*upto {
					t.Fatalf("step %d: credited %d nKVR, want rate %d x %d bytes up to cursor %d", step, paid, rate, upto, cur)
				}
				if paid > rate*all {
					t.Fatalf("step %d: credited %d nKVR > rate x all bytes %d", step, paid, rate*all)
				}
			}
			src.fail = 0
			if _, err := s.Credit(context.Background()); err != nil {
				t.Fatal(err)
			}
			per, all := ledgerTruth(t, l, 1<<62)
			ws, paid := creditedTotal(t, s)
			if paid != rate*all {
				t.Fatalf("final: credited %d nKVR, want %d", paid, rate*all)
			}
			tot, _ := l.Totals()
			for _, wt := range tot {
				if ws[wt.ID].Bytes != wt.Bytes || ws[wt.ID].NKVR != rate*wt.Bytes || ws[wt.ID].RejectedBytes != wt.RejectedBytes || per[wt.ID] != wt.Bytes {
					if wt.Bytes == 0 && wt.RejectedBytes == 0 {
						continue
					}
					t.Fatalf("worker %s: wallet %+v, ledger %+v", wt.ID[:8], ws[wt.ID], wt)
				}
			}
			checkStatements(t, s)
			t.Logf("rate %d: %d bytes, %d nKVR, %d failed credits, %d conflicts", rate, all, paid, crashes, conflicts)
			totalConflicts += conflicts
		})
	}
}

func TestBadSourceRowsRefused(t *testing.T) {
	dir := t.TempDir()
	for name, es := range map[string][]ledger.Entry{
		"not increasing": {{ID: 2, SessionID: "s", WorkerID: workerID(1), BytesIn: 1}, {ID: 2, SessionID: "s", WorkerID: workerID(1), BytesIn: 1}},
		"bad worker":     {{ID: 1, SessionID: "s", WorkerID: "nope", BytesIn: 1}},
		"overflow":       {{ID: 1, SessionID: "s", WorkerID: workerID(1), BytesIn: 1 << 62}, {ID: 2, SessionID: "s", WorkerID: workerID(1), BytesIn: 1 << 62}},
	} {
		s, err := Open(Config{Path: filepath.Join(dir, name+".db"), Source: fixed(es)})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Credit(context.Background()); !errors.Is(err, ErrSource) && !errors.Is(err, walletapi.ErrOverflow) {
			t.Errorf("%s: %v, want ErrSource or ErrOverflow", name, err)
		}
		if c, _ := s.Cursor(); c != 0 {
			t.Errorf("%s: cursor moved to %d", name, c)
		}
		s.Close()
	}
}

type fixed []ledger.Entry

func (f fixed) Read(_ context.Context, after int64, limit int) ([]ledger.Entry, error) {
	var out []ledger.Entry
	for _, e := range f {
		if e.ID > after || after == 0 {
			out = append(out, e)
		}
	}
	return out, nil
}

// BenchmarkCredit measures crediting 1000 ledger rows of 50 workers in one
// transaction (reported per row).
func BenchmarkCredit(b *testing.B) {
	dir := b.TempDir()
	l, err := ledger.Open(filepath.Join(dir, "l.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	var es []ledger.Entry
	for i := range 1000 {
		es = append(es, ledger.Entry{ID: int64(i + 1), SessionID: "s", WorkerID: workerID(i % 50), BytesIn: 10, BytesOut: 20})
	}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		s, err := Open(Config{Path: filepath.Join(dir, fmt.Sprint("w", i, ".db")), Source: fixed(es)})
		if err != nil {
			b.Fatal(err)
		}
		if r, err := s.CreditBatch(context.Background()); err != nil || r.Rows != 1000 {
			b.Fatal(r, err)
		}
		s.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "ns/row")
}

// downSource is a ledger that cannot be read while down is set, and is
// empty otherwise.
type downSource struct{ down atomic.Bool }

func (d *downSource) Read(context.Context, int64, int) ([]ledger.Entry, error) {
	if d.down.Load() {
		return nil, errors.New("hub unreachable")
	}
	return nil, nil
}

// TestRunLogsErrorOnce: a ledger that fails every tick is logged once,
// the same error again once a minute (with how often it recurred), and
// the recovery once; a gateway polling every second while its hub is down
// logged every tick before.
func TestRunLogsErrorOnce(t *testing.T) {
	src := &downSource{}
	src.down.Store(true)
	s, err := Open(Config{Path: filepath.Join(t.TempDir(), "w.db"), Source: src})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var mu sync.Mutex
	clock := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	s.now = func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	var lines []string
	logf := func(f string, a ...any) { mu.Lock(); lines = append(lines, fmt.Sprintf(f, a...)); mu.Unlock() }
	nlines := func() int { mu.Lock(); defer mu.Unlock(); return len(lines) }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx, time.Millisecond, logf) }()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				mu.Lock()
				t.Fatalf("%s: lines %q", what, lines)
			}
		}
	}
	waitFor("the first error", func() bool { return nlines() == 1 })
	time.Sleep(30 * time.Millisecond) // ~30 more failing ticks, within the minute
	if n := nlines(); n != 1 {
		t.Fatalf("%d lines within the minute", n)
	}
	mu.Lock()
	clock = clock.Add(61 * time.Second)
	mu.Unlock()
	waitFor("the reminder after a minute", func() bool { return nlines() == 2 })
	src.down.Store(false)
	waitFor("the recovery", func() bool { return nlines() == 3 })
	time.Sleep(10 * time.Millisecond)
	cancel()
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 3 || !strings.Contains(lines[0], "hub unreachable") || !strings.Contains(lines[1], "more times since 08:00:00") ||
		!strings.Contains(lines[2], "crediting again") {
		t.Errorf("lines %q", lines)
	}
}

// TestLedgerBehindCursor: wallets credited up to ledger id 5, then opened
// against a ledger that does not hold row 5 (an empty one, one of 3 rows:
// restored from an older backup, or recreated) stop crediting with
// ErrLedgerBehind, from Credit and from PingLedger (the gateway's
// readiness), and the cursor stays: the new ledger's rows are not skipped
// in silence. The wallets against their own ledger go on as before.
func TestLedgerBehindCursor(t *testing.T) {
	dir := t.TempDir()
	l, s := openPair(t, dir, 7)
	for i := range 5 {
		if err := l.Append(ledger.Entry{SessionID: "s1", WorkerID: workerID(1), BytesIn: uint64(100 + i), Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Credit(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c, _ := s.Cursor(); c != 5 {
		t.Fatalf("cursor %d, want 5", c)
	}
	if err := s.PingLedger(context.Background()); err != nil {
		t.Fatalf("PingLedger against its own ledger: %v", err)
	}
	s.Close()
	other, err := ledger.Open(filepath.Join(dir, "other.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	s2, err := Open(Config{Path: filepath.Join(dir, "wallets.db"), Source: other, RateNKVRPerByte: 7})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	for rows := 0; rows <= 3; rows += 3 {
		for range rows {
			if err := other.Append(ledger.Entry{SessionID: "s2", WorkerID: workerID(2), BytesIn: 1000, Time: time.Now()}); err != nil {
				t.Fatal(err)
			}
		}
		_, err := s2.Credit(context.Background())
		if !errors.Is(err, ErrLedgerBehind) || !strings.Contains(err.Error(), "ledger id 5") {
			t.Errorf("ledger of %d rows: Credit = %v, want ErrLedgerBehind naming id 5", rows, err)
		}
		if err := s2.PingLedger(context.Background()); !errors.Is(err, ErrLedgerBehind) {
			t.Errorf("ledger of %d rows: PingLedger = %v, want ErrLedgerBehind", rows, err)
		}
		if c, _ := s2.Cursor(); c != 5 {
			t.Fatalf("cursor moved to %d", c)
		}
	}
}
