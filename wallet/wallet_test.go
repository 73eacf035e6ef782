package wallet

import (
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

func testID(b byte) Identity {
	s := make([]byte, 32)
	s[0] = b
	return NewIdentity(ed25519.NewKeyFromSeed(s))
}

func gwKey() ed25519.PrivateKey {
	s := make([]byte, 32)
	s[0] = 0xee
	return ed25519.NewKeyFromSeed(s)
}

// statements signs a chain of statements for id with the given byte deltas.
func statements(t *testing.T, id Identity, rate uint64, firstN uint64, cumB uint64, deltas ...uint64) []walletapi.Signed {
	t.Helper()
	var out []walletapi.Signed
	for i, d := range deltas {
		cumB += d
		st := walletapi.Statement{Worker: id.WorkerID, N: firstN + uint64(i), LedgerAfter: int64(firstN + uint64(i)), LedgerUpTo: int64(firstN+uint64(i)) + 1,
			Bytes: d, RateNKVRPerByte: rate, NKVR: d * rate, CumulativeBytes: cumB, CumulativeNKVR: cumB * rate, TimeUnixMilli: 1_700_000_000_000 + int64(i)}
		sg, err := walletapi.Sign(gwKey(), st)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, sg)
	}
	return out
}

func openW(t *testing.T, path string, id Identity) *Wallet {
	t.Helper()
	w, err := Open(path, id, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestMeteredCreditedPaid(t *testing.T) {
	id := testID(1)
	path := filepath.Join(t.TempDir(), "wallet.db")
	w := openW(t, path, id)
	// The reference vector as the worker counts it: two sessions.
	w.Served("s1", 500_000, 200_000)
	w.Served("s1", 500_000, 77_952)
	w.Served("s2", 0, 0)
	gw := gwKey().Public().(ed25519.PublicKey)
	if n, err := w.AddStatements(gw, statements(t, id, 7, 1, 0, 1_000_000, 277_952)); err != nil || n != 2 {
		t.Fatalf("AddStatements = %d, %v", n, err)
	}
	if err := w.RecordPayout(1_000_000, "tx-1", time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	if err := w.RecordPayout(8_000_000, "too much", time.Now()); !errors.Is(err, ErrPayout) {
		t.Fatalf("overpay: %v", err)
	}
	w.Close()
	w = openW(t, path, id) // persisted across restart
	s, err := w.Summary()
	if err != nil {
		t.Fatal(err)
	}
	if s.BytesServed != 1_277_952 || s.MeteredNKVR != 8_945_664 || s.CreditedBytes != 1_277_952 || s.CreditedNKVR != 8_945_664 ||
		s.PaidNKVR != 1_000_000 || s.PendingNKVR != 7_945_664 || s.Address != id.Address || s.Statements != 2 || s.Reconcile.Mismatch {
		t.Fatalf("summary %+v", s)
	}
	states := map[string]int{}
	for _, e := range s.History {
		states[e.State]++
	}
	if states[StateMetered] != 2 || states[StateCredited] != 2 || states[StatePaid] != 1 {
		t.Fatalf("history states %v", states)
	}
	var js bytes.Buffer
	if err := WriteJSON(&js, s); err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(js.Bytes(), &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"address", "metered_nkvr", "credited_nkvr", "paid_nkvr", "bytes_served", "history"} {
		if _, ok := m[k]; !ok {
			t.Errorf("JSON lacks %q", k)
		}
	}
	if m["credited_nkvr"].(float64) != 8_945_664 {
		t.Errorf("credited_nkvr %v", m["credited_nkvr"])
	}
	var txt bytes.Buffer
	if err := WriteText(&txt, s); err != nil {
		t.Fatal(err)
	}
	// 1,277,952 bytes = 1.28 MB (decimal, as everywhere), no "units".
	for _, want := range []string{"Credited  0.00895 KVR", "1.28 MB in 2 statements", "Paid out  0.00100 KVR", "Pending   0.00795 KVR",
		"at 7 nKVR per byte (0.00700 KVR per MB)", id.Address, "Reconcile: ok"} {
		if !strings.Contains(txt.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, txt.String())
		}
	}
	if strings.Contains(txt.String(), "units") || strings.Contains(txt.String(), "iB") {
		t.Errorf("text mixes in other units:\n%s", txt.String())
	}
}

func TestStatementChainChecks(t *testing.T) {
	id := testID(1)
	w := openW(t, filepath.Join(t.TempDir(), "w.db"), id)
	gw := gwKey().Public().(ed25519.PublicKey)
	sts := statements(t, id, 7, 1, 0, 10, 20, 30)
	if _, err := w.AddStatements(gw, sts[:1]); err != nil {
		t.Fatal(err)
	}
	// A gap (3 after 1) is refused, and nothing of the batch is stored.
	if _, err := w.AddStatements(gw, sts[2:]); !errors.Is(err, ErrStatement) {
		t.Fatalf("gap: %v", err)
	}
	// Re-delivery of a stored statement is harmless.
	if n, err := w.AddStatements(gw, sts); err != nil || n != 2 {
		t.Fatalf("redelivery: %d %v", n, err)
	}
	// Another worker's statement is refused.
	if _, err := w.AddStatements(gw, statements(t, testID(2), 7, 4, 60, 5)); !errors.Is(err, ErrStatement) {
		t.Fatalf("other worker: %v", err)
	}
	// Cumulative totals that do not follow are refused.
	if _, err := w.AddStatements(gw, statements(t, id, 7, 4, 999, 5)); !errors.Is(err, ErrStatement) {
		t.Fatalf("cumulative: %v", err)
	}
	// Another gateway key is refused once one is pinned.
	s := make([]byte, 32)
	other := ed25519.NewKeyFromSeed(s).Public().(ed25519.PublicKey)
	if _, err := w.AddStatements(other, nil); !errors.Is(err, ErrGatewayKey) {
		t.Fatalf("other gateway: %v", err)
	}
	if n, _ := w.LastStatement(); n != 3 {
		t.Fatalf("last statement %d", n)
	}
}

// clock is a settable test clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                   { return &clock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)} }
func openClock(t *testing.T, path string, id Identity, c *clock) *Wallet {
	t.Helper()
	w, err := Open(path, id, Options{Now: c.now, CreditLag: 90 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

func TestReconcileFlags(t *testing.T) {
	id := testID(1)
	c := newClock()
	w := openClock(t, filepath.Join(t.TempDir(), "w.db"), id, c)
	w.Served("s", 10_000_000, 0)
	c.advance(91 * time.Second) // older than the credit lag
	gw := gwKey().Public().(ed25519.PublicKey)
	// Credited 9,800,000 of 10,000,000: diff 200,000 > 1% (100,000) + 65,536 -> flagged.
	if _, err := w.AddStatements(gw, statements(t, id, 7, 1, 0, 9_800_000)); err != nil {
		t.Fatal(err)
	}
	s, _ := w.Summary()
	if !s.Reconcile.Mismatch || s.Reconcile.DiffBytes != 200_000 || s.Reconcile.ThresholdBytes != 165_536 ||
		!strings.HasPrefix(s.Reconcile.Explanation, "200 kB that this computer counted more than 1m30s before a statement fetch (in session s, last counted 2026-05-01 12:00:00Z, or before it) are neither credited nor reported rejected") {
		t.Fatalf("reconcile %+v", s.Reconcile)
	}
	// 100,000 more credited: diff 100,000 <= 165,536 -> agrees.
	if _, err := w.AddStatements(gw, statements(t, id, 7, 2, 9_800_000, 100_000)); err != nil {
		t.Fatal(err)
	}
	if s, _ = w.Summary(); s.Reconcile.Mismatch {
		t.Fatalf("within threshold flagged: %+v", s.Reconcile)
	}
	// Credited far more than counted -> flagged the other way, at once.
	if _, err := w.AddStatements(gw, statements(t, id, 7, 3, 9_900_000, 5_000_000)); err != nil {
		t.Fatal(err)
	}
	if s, _ = w.Summary(); !s.Reconcile.Mismatch || s.Reconcile.DiffBytes != -4_900_000 || !strings.Contains(s.Reconcile.Explanation, "more") {
		t.Fatalf("over-credit %+v", s.Reconcile)
	}
}

// TestMismatchOnlyAfterCreditLag replays the report in issue 15: a minute
// of steady work whose credits arrive 40 s behind it never shows a
// mismatch (the gap is "awaiting credit"), and neither does a restart
// right after work; a gateway that stops crediting is flagged once the
// uncredited bytes are older than the credit lag, not before.
func TestMismatchOnlyAfterCreditLag(t *testing.T) {
	id := testID(1)
	c := newClock()
	path := filepath.Join(t.TempDir(), "w.db")
	w := openClock(t, path, id, c)
	gw := gwKey().Public().(ed25519.PublicKey)
	const perSecond = 3_600_000 // 216 MB a minute, as in the report
	var n, cum uint64
	servedAt := map[int]uint64{}
	for sec := 1; sec <= 60; sec++ {
		c.advance(time.Second)
		w.Served("load", perSecond/2, perSecond/2)
		servedAt[sec] = uint64(sec) * perSecond
		if sec > 40 { // the gateway credits what was served 40 s ago
			n++
			cum += perSecond
			if _, err := w.AddStatements(gw, statements(t, id, 7, n, cum-perSecond, perSecond)); err != nil {
				t.Fatal(err)
			}
		}
		s, err := w.Summary()
		if err != nil {
			t.Fatal(err)
		}
		if s.Reconcile.Mismatch {
			t.Fatalf("second %d: mismatch while credits are only 40 s behind: %+v", sec, s.Reconcile)
		}
		if sec > 2 && (s.Reconcile.AwaitingBytes == 0 || !strings.Contains(s.Reconcile.Explanation, "not credited yet")) {
			t.Fatalf("second %d: the credit lag is not explained: %+v", sec, s.Reconcile)
		}
	}
	// A restart: the reopened wallet knows when its sessions were counted.
	w.Close()
	c.advance(5 * time.Second)
	w = openClock(t, path, id, c)
	if s, _ := w.Summary(); s.Reconcile.Mismatch {
		t.Fatalf("after a restart 5 s after the work: %+v", s.Reconcile)
	}
	// The wallet is not asked to fetch (the app is closed, or the gateway
	// is unreachable): the last 40 s of work (144 MB) stay uncredited, but
	// that is no mismatch however long it lasts, only unconfirmed.
	c.advance(95 * time.Second)
	s, _ := w.Summary()
	if s.Reconcile.Mismatch || s.Reconcile.AwaitingBytes != 40*perSecond ||
		s.Reconcile.Explanation != "144 MB counted, not credited yet: statements were last fetched 2026-05-01 12:01Z, 1m40s ago (is the gateway reachable?)" {
		t.Fatalf("95 s after the work, no fetch since: %+v", s.Reconcile)
	}
	// The gateway answers but credits nothing more (each fetch finds no
	// new statement). Not a mismatch until the bytes are 90 s older than
	// the fetch (the reopened wallet dates the session's bytes at its last
	// count)...
	c.t = c.t.Add(-95 * time.Second)
	c.advance(80 * time.Second) // 85 s after the last count
	if _, err := w.AddStatements(gw, nil); err != nil {
		t.Fatal(err)
	}
	if s, _ := w.Summary(); s.Reconcile.Mismatch {
		t.Fatalf("85 s after the work: %+v", s.Reconcile)
	}
	// ... then it is, naming the shortfall.
	c.advance(10 * time.Second)
	if _, err := w.AddStatements(gw, nil); err != nil {
		t.Fatal(err)
	}
	s, _ = w.Summary()
	if !s.Reconcile.Mismatch || s.Reconcile.DiffBytes != 40*perSecond || !strings.HasPrefix(s.Reconcile.Explanation, "144 MB that this computer counted") {
		t.Fatalf("95 s after the work: %+v", s.Reconcile)
	}
}

// TestHistoryGroups: an hour of statements (one a second, as the gateway
// credits under load) and three sessions group into hours, days and
// sessions with exact sums; Events gives the detail of one group and, with
// no bounds and no limit, every row.
func TestHistoryGroups(t *testing.T) {
	id := testID(1)
	c := newClock() // 12:00:00 UTC
	w := openClock(t, filepath.Join(t.TempDir(), "w.db"), id, c)
	gw := gwKey().Public().(ed25519.PublicKey)
	sessions := []struct {
		name  string
		start time.Duration
		secs  int
	}{{"a", 0, 1500}, {"b", 1500 * time.Second, 1500}, {"c", 3000 * time.Second, 1200}} // c: 12:50-13:10
	var n, cum uint64
	var sts []walletapi.Signed
	for _, ss := range sessions {
		c.t = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC).Add(ss.start)
		for i := 0; i < ss.secs; i++ {
			c.advance(time.Second)
			w.Served(ss.name, 600, 400)
			n++
			cum += 1000
			st := walletapi.Statement{Worker: id.WorkerID, N: n, LedgerAfter: int64(n), LedgerUpTo: int64(n) + 1, Bytes: 1000,
				RateNKVRPerByte: 7, NKVR: 7000, CumulativeBytes: cum, CumulativeNKVR: 7 * cum, TimeUnixMilli: c.t.Add(2 * time.Second).UnixMilli()}
			sg, err := walletapi.Sign(gwKey(), st)
			if err != nil {
				t.Fatal(err)
			}
			sts = append(sts, sg)
		}
	}
	for i := 0; i < len(sts); i += walletapi.MaxPage {
		if _, err := w.AddStatements(gw, sts[i:min(i+walletapi.MaxPage, len(sts))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.RecordPayout(1_000_000, "p1", time.Date(2026, 5, 1, 13, 10, 0, 0, time.UTC)); err != nil {
		t.Fatal(err)
	}
	hours, err := w.Groups(ByHour, 0)
	if err != nil {
		t.Fatal(err)
	}
	// 12:00-13:00: statements timed 12:00:03 .. 12:59:59 (3597), sessions a and
	// b (last counted 12:25:00, 12:50:00); 13:00-14:00: the remaining 603
	// statements, session c (last counted 13:10:00) and the payout.
	want := []Group{
		{By: ByHour, From: time.Date(2026, 5, 1, 13, 0, 0, 0, time.UTC), To: time.Date(2026, 5, 1, 14, 0, 0, 0, time.UTC),
			Sessions: 1, MeteredBytes: 1_200_000, MeteredNKVR: 8_400_000, Statements: 603, CreditedBytes: 603_000, CreditedNKVR: 4_221_000,
			Payouts: 1, PaidNKVR: 1_000_000},
		{By: ByHour, From: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC), To: time.Date(2026, 5, 1, 13, 0, 0, 0, time.UTC),
			Sessions: 2, MeteredBytes: 3_000_000, MeteredNKVR: 21_000_000, Statements: 3597, CreditedBytes: 3_597_000, CreditedNKVR: 25_179_000},
	}
	if !reflect.DeepEqual(hours, want) {
		t.Fatalf("by hour:\n%+v\nwant\n%+v", hours, want)
	}
	days, err := w.Groups(ByDay, 0)
	if err != nil || len(days) != 1 || days[0].Statements != 4200 || days[0].Sessions != 3 || days[0].MeteredBytes != 4_200_000 ||
		days[0].From != time.Date(2026, 5, 1, 0, 0, 0, 0, time.UTC) {
		t.Fatalf("by day: %+v %v", days, err)
	}
	bySession, err := w.Groups(BySession, 0)
	if err != nil || len(bySession) != 3 {
		t.Fatalf("by session: %+v %v", bySession, err)
	}
	// Session b: first counted 12:25:01, c 12:50:01; statements timed
	// 12:25:01 .. 12:50:00 (a's last two, then b's) fall in b: 1500.
	b := bySession[1]
	if b.Session != "b" || b.From != time.Date(2026, 5, 1, 12, 25, 1, 0, time.UTC) || b.To != bySession[0].From ||
		b.MeteredBytes != 1_500_000 || b.Statements != 1500 || b.CreditedBytes != 1_500_000 || bySession[0].To != (time.Time{}) ||
		bySession[0].Payouts != 1 || bySession[2].Statements != 1500-2 {
		t.Fatalf("by session: %+v", bySession)
	}
	detail, err := w.Events(b.From, b.To, 0)
	states := map[string]int{}
	for _, e := range detail {
		states[e.State]++
		if e.Time.Before(b.From) || !e.Time.Before(b.To) {
			t.Fatalf("event %+v outside session b", e)
		}
	}
	if err != nil || states[StateCredited] != 1500 || states[StateMetered] != 1 || len(detail) != 1501 {
		t.Fatalf("detail of session b: %v, %v", states, err)
	}
	all, err := w.Events(time.Time{}, time.Time{}, 0)
	if err != nil || len(all) != 4200+3+1 {
		t.Fatalf("all events: %d, %v", len(all), err)
	}
	for i := 1; i < len(all); i++ {
		if all[i].Time.After(all[i-1].Time) {
			t.Fatalf("events not newest first at %d", i)
		}
	}
	if s, _ := w.Summary(); len(s.History) != HistoryLimit || s.History[0] != all[0] {
		t.Fatalf("summary history: %d events", len(s.History))
	}
	var txt bytes.Buffer
	if err := WriteGroups(&txt, hours); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"History by hour", "2026-05-01 13:00–14:00 UTC", "credited 0.00422 KVR in 603 statements",
		"metered ≈0.00840 KVR in 1 session", "paid 0.00100 KVR", "2026-05-01 12:00–13:00 UTC"} {
		if !strings.Contains(txt.String(), want) {
			t.Errorf("grouped text lacks %q:\n%s", want, txt.String())
		}
	}
	if got := GroupLabel(b); got != "session b from 2026-05-01 12:25:01 UTC" {
		t.Errorf("label %q", got)
	}
}

func fileHash(t *testing.T, p string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

func TestBadFilesLeftUntouched(t *testing.T) {
	dir := t.TempDir()
	id := testID(1)
	// Not SQLite at all, a truncated SQLite header, and a valid header over garbage pages.
	good := filepath.Join(dir, "good.db")
	w, err := Open(good, id, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Served("s", 1, 2)
	w.Close()
	gb, _ := os.ReadFile(good)
	garbage := append(append([]byte{}, gb[:100]...), bytes.Repeat([]byte{0xA5}, len(gb)-100)...)
	cases := map[string][]byte{
		"text.db":      []byte("this is not a wallet\n"),
		"truncated.db": gb[:50],
		"garbage.db":   garbage,
	}
	for name, content := range cases {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, content, 0o600); err != nil {
			t.Fatal(err)
		}
		before := fileHash(t, p)
		if _, err := Open(p, id, Options{}); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", name, err)
		}
		if fileHash(t, p) != before {
			t.Errorf("%s: file changed", name)
		}
		for _, ext := range []string{"-wal", "-shm", "-journal"} {
			if _, err := os.Stat(p + ext); err == nil {
				t.Errorf("%s: a %s file was left behind", name, ext)
			}
		}
	}
	// A wallet from a newer schema.
	newer := filepath.Join(dir, "newer.db")
	w, err = Open(newer, id, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	u := url.URL{Scheme: "file", Path: newer, RawQuery: "_journal_mode=DELETE"}
	db, err := dbfile.Open(u.String())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`PRAGMA user_version = 2`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	before := fileHash(t, newer)
	_, err = Open(newer, id, Options{})
	if !errors.Is(err, ErrNewerSchema) || !strings.Contains(err.Error(), "version 2") {
		t.Errorf("newer: %v, want ErrNewerSchema naming version 2", err)
	}
	if fileHash(t, newer) != before {
		t.Error("newer: file changed")
	}
	// Another identity's wallet.
	if _, err := Open(good, testID(2), Options{}); !errors.Is(err, ErrWrongIdentity) {
		t.Errorf("other identity: %v", err)
	}
}

func TestAddress(t *testing.T) {
	id := testID(7)
	a := id.Address
	if len(a) != AddressLen || !strings.HasPrefix(a, "kvr1") || strings.ToLower(a) != a {
		t.Fatalf("address %q", a)
	}
	h, err := ParseAddress(a)
	sum := sha256.Sum256(id.Public)
	if err != nil || !bytes.Equal(h, sum[:20]) {
		t.Fatalf("ParseAddress: %x %v", h, err)
	}
	// Every single-character change is caught.
	alphabet := "abcdefghijklmnopqrstuvwxyz234567"
	for i := len("kvr1"); i < len(a); i++ {
		for _, c := range alphabet {
			if byte(c) == a[i] {
				continue
			}
			b := a[:i] + string(c) + a[i+1:]
			if _, err := ParseAddress(b); err == nil {
				t.Fatalf("changed address %q accepted", b)
			}
		}
	}
	if testID(8).Address == a {
		t.Fatal("two keys, one address")
	}
	if hex.EncodeToString(id.Public) != id.WorkerID {
		t.Fatal("worker id is not the hex public key")
	}
}

func FuzzParseAddress(f *testing.F) {
	f.Add(testID(1).Address)
	f.Add("kvr1")
	f.Add(strings.ToUpper(testID(1).Address))
	f.Add(testID(1).Address + "a")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := ParseAddress(s)
		if err != nil {
			return
		}
		if len(h) != 20 || !strings.HasPrefix(s, "kvr1") || len(s) != AddressLen {
			t.Fatalf("accepted %q", s)
		}
	})
}
