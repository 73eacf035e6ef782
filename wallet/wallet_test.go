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
	for _, want := range []string{"0.00895 KVR", "1.277952 units", "0.00100 KVR", "0.00795 KVR", id.Address, "Reconcile: ok"} {
		if !strings.Contains(txt.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, txt.String())
		}
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

func TestReconcileFlags(t *testing.T) {
	id := testID(1)
	w := openW(t, filepath.Join(t.TempDir(), "w.db"), id)
	w.Served("s", 10_000_000, 0)
	gw := gwKey().Public().(ed25519.PublicKey)
	// Credited 9,800,000 of 10,000,000: diff 200,000 > 1% (100,000) + 65,536 -> flagged.
	if _, err := w.AddStatements(gw, statements(t, id, 7, 1, 0, 9_800_000)); err != nil {
		t.Fatal(err)
	}
	s, _ := w.Summary()
	if !s.Reconcile.Mismatch || s.Reconcile.DiffBytes != 200_000 || s.Reconcile.ThresholdBytes != 165_536 ||
		!strings.Contains(s.Reconcile.Explanation, "fewer") {
		t.Fatalf("reconcile %+v", s.Reconcile)
	}
	// 100,000 more credited: diff 100,000 <= 165,536 -> agrees.
	if _, err := w.AddStatements(gw, statements(t, id, 7, 2, 9_800_000, 100_000)); err != nil {
		t.Fatal(err)
	}
	if s, _ = w.Summary(); s.Reconcile.Mismatch {
		t.Fatalf("within threshold flagged: %+v", s.Reconcile)
	}
	// Credited far more than counted -> flagged the other way.
	if _, err := w.AddStatements(gw, statements(t, id, 7, 3, 9_900_000, 5_000_000)); err != nil {
		t.Fatal(err)
	}
	if s, _ = w.Summary(); !s.Reconcile.Mismatch || s.Reconcile.DiffBytes != -4_900_000 || !strings.Contains(s.Reconcile.Explanation, "more") {
		t.Fatalf("over-credit %+v", s.Reconcile)
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
