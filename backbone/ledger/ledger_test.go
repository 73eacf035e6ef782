package ledger

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/dbfile/dbfiletest"
)

func hexKey(b byte) string { return strings.Repeat(string("0123456789abcdef"[b%16]), 64) }

func openTemp(t *testing.T) (*Ledger, string) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "ledger.db")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, p
}

func TestAppendSinceTotals(t *testing.T) {
	l, _ := openTemp(t)
	a, b := hexKey(1), hexKey(2)
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	in := []Entry{
		{SessionID: "s1", WorkerID: a, BytesIn: 100, BytesOut: 1000, Time: t0},
		{SessionID: "s2", WorkerID: b, BytesIn: 7, BytesOut: 0, RejectedBytes: 50, Time: t0},
		{SessionID: "s1", WorkerID: a, BytesIn: 1, BytesOut: 2, RejectedBytes: 3, Final: true, Time: t0},
		{SessionID: "s3", WorkerID: a, BytesIn: 0, BytesOut: 0},
	}
	for _, e := range in {
		if err := l.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := l.Since(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 4 {
		t.Fatalf("Since(0) = %d entries, want 4", len(got))
	}
	for i, e := range got {
		if e.ID != int64(i+1) {
			t.Errorf("entry %d id %d", i, e.ID)
		}
		w := in[i]
		if e.SessionID != w.SessionID || e.WorkerID != w.WorkerID || e.BytesIn != w.BytesIn || e.BytesOut != w.BytesOut ||
			e.RejectedBytes != w.RejectedBytes || e.Final != w.Final {
			t.Errorf("entry %d = %+v, want %+v", i, e, w)
		}
		if i < 3 && !e.Time.Equal(t0) {
			t.Errorf("entry %d time %v want %v", i, e.Time, t0)
		}
		if i == 3 && time.Since(e.Time) > time.Minute {
			t.Errorf("zero time not replaced by now: %v", e.Time)
		}
	}
	got, _ = l.Since(1, 2)
	if len(got) != 2 || got[0].ID != 2 || got[1].ID != 3 {
		t.Fatalf("Since(1, 2) = %+v", got)
	}
	tot, err := l.Totals()
	if err != nil {
		t.Fatal(err)
	}
	// Hand sums: a = 100+1000+1+2+0 = 1103 creditable, 3 rejected, sessions s1,s3;
	// b = 7 creditable, 50 rejected.
	want := []WorkerTotal{{ID: a, Bytes: 1103, RejectedBytes: 3, Sessions: 2, Entries: 3}, {ID: b, Bytes: 7, RejectedBytes: 50, Sessions: 1, Entries: 1}}
	if len(tot) != 2 || tot[0] != want[0] || tot[1] != want[1] {
		t.Fatalf("Totals = %+v, want %+v", tot, want)
	}
	if id, _ := l.LastID(); id != 4 {
		t.Fatalf("LastID = %d", id)
	}
}

func TestAppendOnly(t *testing.T) {
	l, p := openTemp(t)
	if err := l.Append(Entry{SessionID: "s", WorkerID: hexKey(1), BytesIn: 5}); err != nil {
		t.Fatal(err)
	}
	if err := l.exec(`UPDATE entries SET bytes_in = 999`); !errors.Is(err, ErrAppendOnly) {
		t.Fatalf("UPDATE: %v, want ErrAppendOnly", err)
	}
	if err := l.exec(`DELETE FROM entries`); !errors.Is(err, ErrAppendOnly) {
		t.Fatalf("DELETE: %v, want ErrAppendOnly", err)
	}
	// The triggers live in the file: another connection is refused too.
	dsn, _ := dbfile.DSN(p)
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`DELETE FROM entries WHERE id = 1`); err == nil || !strings.Contains(err.Error(), "append-only") {
		t.Fatalf("raw DELETE: %v", err)
	}
	es, _ := l.Since(0, 10)
	if len(es) != 1 || es[0].BytesIn != 5 {
		t.Fatalf("row changed: %+v", es)
	}
}

func TestValidate(t *testing.T) {
	l, _ := openTemp(t)
	bad := []Entry{
		{SessionID: "s", WorkerID: "abc"},
		{SessionID: "s", WorkerID: strings.ToUpper(hexKey(10))},
		{SessionID: "", WorkerID: hexKey(1)},
		{SessionID: strings.Repeat("x", MaxSessionLen+1), WorkerID: hexKey(1)},
		{SessionID: "s", WorkerID: hexKey(1), BytesIn: 1 << 63},
		{SessionID: "s", WorkerID: hexKey(1), BytesIn: 1<<63 - 1, BytesOut: 1},
	}
	for i, e := range bad {
		if err := l.Append(e); !errors.Is(err, ErrInvalid) {
			t.Errorf("case %d: %v, want ErrInvalid", i, err)
		}
	}
	if n, _ := l.LastID(); n != 0 {
		t.Fatalf("invalid entries were stored: last id %d", n)
	}
}

func TestNewerSchemaRefused(t *testing.T) {
	l, p := openTemp(t)
	if _, err := l.db.Exec(`PRAGMA user_version = 9`); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if _, err := Open(p); !errors.Is(err, ErrSchema) {
		t.Fatalf("Open newer schema: %v, want ErrSchema", err)
	}
}

func TestHandlerAndClient(t *testing.T) {
	l, _ := openTemp(t)
	for i := range 5 {
		if err := l.Append(Entry{SessionID: "s", WorkerID: hexKey(byte(i)), BytesIn: uint64(i), BytesOut: 10, RejectedBytes: uint64(i * 2)}); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(Handler(l, func(r *http.Request) bool { return r.Header.Get("X-Test-Auth") == "yes" }))
	defer srv.Close()
	ctx := context.Background()
	c := &Client{BaseURL: srv.URL}
	if _, err := c.Read(ctx, 0, 10); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("unauthenticated read: %v, want 401", err)
	}
	c.Sign = func(r *http.Request) error { r.Header.Set("X-Test-Auth", "yes"); return nil }
	got, err := c.Read(ctx, 1, 3)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := l.Since(1, 3)
	if len(got) != 3 {
		t.Fatalf("got %d entries", len(got))
	}
	for i := range got {
		if got[i] != want[i] && !(got[i].Time.Equal(want[i].Time) && sameButTime(got[i], want[i])) {
			t.Errorf("entry %d: %+v != %+v", i, got[i], want[i])
		}
	}
	for _, q := range []string{"?after=-1", "?after=x", "?limit=0", "?limit=10001"} {
		req, _ := http.NewRequest("GET", srv.URL+Path+q, nil)
		req.Header.Set("X-Test-Auth", "yes")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 400 {
			t.Errorf("%s: status %d, want 400", q, resp.StatusCode)
		}
	}
	// A nil authorize refuses everything.
	rec := httptest.NewRecorder()
	Handler(l, nil).ServeHTTP(rec, httptest.NewRequest("GET", Path, nil))
	if rec.Code != 401 {
		t.Fatalf("nil authorize: %d", rec.Code)
	}
}

func sameButTime(a, b Entry) bool { a.Time, b.Time = time.Time{}, time.Time{}; return a == b }

func TestDecodePageContract(t *testing.T) {
	w := hexKey(3)
	ok := `{"entries":[{"id":5,"session":"s","worker":"` + w + `","bytes_in":1,"bytes_out":2,"rejected_bytes":0,"final":false,"time_ns":1}]}`
	if es, err := DecodePage(strings.NewReader(ok), 4, 10); err != nil || len(es) != 1 || es[0].BytesOut != 2 {
		t.Fatalf("valid page: %v %+v", err, es)
	}
	for name, body := range map[string]string{
		"id not after cursor": ok, // after=5 below
		"decreasing":          `{"entries":[{"id":7,"session":"s","worker":"` + w + `","time_ns":1},{"id":6,"session":"s","worker":"` + w + `","time_ns":1}]}`,
		"bad worker":          `{"entries":[{"id":7,"session":"s","worker":"zz","time_ns":1}]}`,
		"truncated":           ok[:40],
	} {
		if _, err := DecodePage(strings.NewReader(body), 5, 10); !errors.Is(err, ErrPage) {
			t.Errorf("%s: %v, want ErrPage", name, err)
		}
	}
	if _, err := DecodePage(strings.NewReader(ok), 0, 0); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte(" "), MaxPageBytes+1)
	if _, err := DecodePage(bytes.NewReader(big), 0, 10); !errors.Is(err, ErrPage) {
		t.Fatalf("oversized: %v", err)
	}
}

func FuzzDecodePage(f *testing.F) {
	w := hexKey(3)
	valid := `{"entries":[{"id":5,"session":"s","worker":"` + w + `","bytes_in":1,"bytes_out":2,"rejected_bytes":0,"final":true,"time_ns":1}]}`
	f.Add([]byte(valid), int64(0), 10)
	f.Add([]byte(valid[:30]), int64(0), 10)
	f.Add([]byte(`{"entries":[{"id":9223372036854775807,"bytes_in":18446744073709551615}]}`), int64(-1), 1)
	f.Add([]byte(`{"entries":null}`), int64(3), 0)
	f.Fuzz(func(t *testing.T, body []byte, after int64, limit int) {
		es, err := DecodePage(bytes.NewReader(body), after, limit)
		if err != nil {
			return
		}
		prev := after
		for _, e := range es {
			if e.ID <= prev || Validate(e) != nil {
				t.Fatalf("accepted bad entry %+v after %d", e, prev)
			}
			prev = e.ID
		}
		if len(es) > clampLimit(limit) {
			t.Fatalf("accepted %d > limit %d", len(es), limit)
		}
	})
}

// BenchmarkAppend measures one durable append (WAL, synchronous=FULL: one
// fsync per commit).
func BenchmarkAppend(b *testing.B) {
	l, err := Open(filepath.Join(b.TempDir(), "l.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	e := Entry{SessionID: "s", WorkerID: hexKey(1), BytesIn: 1000, BytesOut: 2000}
	for b.Loop() {
		if err := l.Append(e); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAppendAllAtomic(t *testing.T) {
	l, _ := openTemp(t)
	good := Entry{SessionID: "s", WorkerID: hexKey(1), BytesIn: 1}
	if err := l.AppendAll(context.Background(), []Entry{good, {SessionID: "s", WorkerID: "bad"}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad batch: %v", err)
	}
	if n, _ := l.LastID(); n != 0 {
		t.Fatalf("partial batch stored: %d", n)
	}
	if err := l.AppendAll(context.Background(), []Entry{good, good, good}); err != nil {
		t.Fatal(err)
	}
	if tot, _ := l.Totals(); len(tot) != 1 || tot[0].Bytes != 3 || tot[0].Entries != 3 {
		t.Fatalf("totals %+v", tot)
	}
}

// BenchmarkAppendAll100 measures flushing 100 sessions in one transaction.
func BenchmarkAppendAll100(b *testing.B) {
	l, err := Open(filepath.Join(b.TempDir(), "l.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	es := make([]Entry, 100)
	for i := range es {
		es[i] = Entry{SessionID: "s", WorkerID: hexKey(byte(i)), BytesIn: 1000, BytesOut: 2000}
	}
	for b.Loop() {
		if err := l.AppendAll(context.Background(), es); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBadFilesUntouched: Open (read-write, the hub) and OpenReadOnly (the
// ledger command) refuse a file that is not a ledger of this version before
// writing anything: same bytes (header byte 19 stays 1, no switch to WAL),
// no -wal/-shm left behind. The error says what the file is.
func TestBadFilesUntouched(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, tables []string, v int, id int32) string {
		return dbfiletest.Make(t, filepath.Join(dir, name), tables, v, id)
	}
	cases := []struct {
		path string
		err  error
		say  string
	}{
		{mk("newer", dbfile.Ledger.Tables, SchemaVersion+1, dbfile.AppIDLedger), dbfile.ErrNewerSchema, fmt.Sprintf("schema version %d", SchemaVersion+1)},
		{mk("wallets", dbfile.GatewayWallets.Tables, 1, dbfile.AppIDGatewayWallets), dbfile.ErrForeign, "gateway wallets file"},
		{mk("legacy-wallets", dbfile.GatewayWallets.Tables, 1, 0), dbfile.ErrForeign, "gateway wallets file"},
		{mk("worker", dbfile.WorkerWallet.Tables, 1, dbfile.AppIDWorkerWallet), dbfile.ErrForeign, "worker wallet"},
		{mk("other", []string{"t"}, 0, 0), dbfile.ErrForeign, "not a kvasir contribution ledger"},
	}
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte{0xa5}, 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, struct {
		path string
		err  error
		say  string
	}{garbage, dbfile.ErrCorrupt, "not an SQLite database"})
	before := dbfiletest.Snapshot(t, dir)
	for _, c := range cases {
		for _, open := range []func(string) (*Ledger, error){Open, OpenReadOnly} {
			l, err := open(c.path)
			if err == nil {
				l.Close()
			}
			if !errors.Is(err, ErrSchema) || !errors.Is(err, c.err) || !strings.Contains(err.Error(), c.say) {
				t.Errorf("%s: %v, want ErrSchema and %v saying %q", filepath.Base(c.path), err, c.err, c.say)
			}
		}
	}
	dbfiletest.Unchanged(t, dir, before)
}

// TestOpenReadOnly: reading a ledger leaves the directory byte for byte as
// it was (closed ledger: immutable read), reads a live writer's WAL, and a
// missing or empty file is an error.
func TestOpenReadOnly(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "ledger.db")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Append(Entry{SessionID: "s", WorkerID: hexKey(1), BytesIn: 5, BytesOut: 7, RejectedBytes: 3}); err != nil {
		t.Fatal(err)
	}
	// Live writer: the row is only in the -wal file.
	r, err := OpenReadOnly(p)
	if err != nil {
		t.Fatal(err)
	}
	tot, err := r.Totals()
	if err != nil || len(tot) != 1 || tot[0].Bytes != 12 || tot[0].RejectedBytes != 3 {
		t.Fatalf("totals with live writer: %+v, %v", tot, err)
	}
	if err := r.Append(Entry{SessionID: "s", WorkerID: hexKey(1)}); err == nil {
		t.Error("append through a read-only ledger succeeded")
	}
	r.Close()
	l.Close()
	before := dbfiletest.Snapshot(t, dir)
	if len(before) != 1 {
		t.Fatalf("after close: %v", before)
	}
	r, err = OpenReadOnly(p)
	if err != nil {
		t.Fatal(err)
	}
	if tot, err := r.Totals(); err != nil || len(tot) != 1 || tot[0].Bytes != 12 {
		t.Fatalf("totals: %+v, %v", tot, err)
	}
	r.Close()
	dbfiletest.Unchanged(t, dir, before)
	if _, err := OpenReadOnly(filepath.Join(dir, "missing")); !errors.Is(err, dbfile.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Error("OpenReadOnly created the missing file")
	}
}

// TestAppIDAndLegacyAdoption: a new ledger carries dbfile.AppIDLedger; a
// ledger written before application ids (id 0, version 1, table entries)
// is adopted by Open with its rows and gets the id.
func TestAppIDAndLegacyAdoption(t *testing.T) {
	l, p := openTemp(t)
	if err := l.Append(Entry{SessionID: "s", WorkerID: hexKey(2), BytesIn: 1}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	if info, err := dbfile.Check(p, dbfile.Ledger); err != nil || info.State != dbfile.Current {
		t.Fatalf("new ledger: %+v, %v", info, err)
	}
	dbfiletest.ToRollback(t, p, -1, 0)
	if info, err := dbfile.Check(p, dbfile.Ledger); err != nil || info.State != dbfile.Legacy {
		t.Fatalf("legacy ledger: %+v, %v", info, err)
	}
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if n, _ := l.LastID(); n != 1 {
		t.Errorf("adopted ledger last id %d", n)
	}
	l.Close()
	if info, err := dbfile.Check(p, dbfile.Ledger); err != nil || info.State != dbfile.Current {
		t.Fatalf("adopted ledger: %+v, %v", info, err)
	}
}

// TestIdempotentAppend: on SQLite as on PostgreSQL, a batch sent again
// (same sessions and seqs) is recorded once, and a recorded (session, seq)
// with other contents fails the whole batch with ErrConflict.
func TestIdempotentAppend(t *testing.T) {
	l, _ := openTemp(t)
	checkIdempotentAppend(t, l)
	checkUnnumberedThenNumbered(t, l, 4)
	// Two copies of one row in a batch are one row.
	e := Entry{SessionID: "z", Seq: 1, WorkerID: hexKey(5), BytesIn: 9}
	ids, err := l.AppendAllIDs(context.Background(), []Entry{e, e})
	if err != nil || ids[0] != ids[1] {
		t.Fatalf("a row twice in a batch: ids %v, %v", ids, err)
	}
	es, _ := l.Since(ids[0]-1, 10)
	if len(es) != 1 || es[0].Seq != 1 || es[0].SessionID != "z" {
		t.Fatalf("read back %+v", es)
	}
}

// schema1 is the SQLite ledger's schema 1, as kvasir wrote it before rows
// kept their Seq (git history of backbone/ledger/sqlite.go).
const schema1 = `
CREATE TABLE entries (
	id        INTEGER PRIMARY KEY AUTOINCREMENT,
	session   TEXT    NOT NULL CHECK (length(session) BETWEEN 1 AND 128),
	worker    TEXT    NOT NULL CHECK (length(worker) = 64),
	bytes_in  INTEGER NOT NULL CHECK (bytes_in >= 0),
	bytes_out INTEGER NOT NULL CHECK (bytes_out >= 0),
	rejected  INTEGER NOT NULL CHECK (rejected >= 0),
	final     INTEGER NOT NULL CHECK (final IN (0, 1)),
	time      INTEGER NOT NULL
);
CREATE INDEX entries_worker ON entries(worker);
CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
	BEGIN SELECT RAISE(ABORT, 'ledger: rows are append-only'); END;
CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
	BEGIN SELECT RAISE(ABORT, 'ledger: rows are append-only'); END;
INSERT INTO entries (session, worker, bytes_in, bytes_out, rejected, final, time) VALUES
	('old', '` + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" + `', 100, 20, 0, 0, 1),
	('old', '` + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa" + `', 5, 0, 3, 1, 2);
PRAGMA user_version = 1;
`

// writeSchema1 writes the ledger of schema1 with application id appID at
// p through a connection with the DSN options opts, and returns that
// connection (the caller closes it).
func writeSchema1(t *testing.T, p string, appID int32, opts ...string) *sql.DB {
	t.Helper()
	dsn, err := dbfile.DSN(p, opts...)
	if err != nil {
		t.Fatal(err)
	}
	db, err := dbfile.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(schema1 + fmt.Sprintf("PRAGMA application_id = %d;", appID)); err != nil {
		db.Close()
		t.Fatal(err)
	}
	return db
}

// TestUpgradeSchema1: a ledger of schema 1 (with the ledger's application
// id, and from before ids) is read as it is by OpenReadOnly (rows
// unnumbered, the file unchanged), and upgraded by Open to schema 2 with
// its rows and ids kept; numbered rows then append once, and the old
// unnumbered rows stay as they were.
func TestUpgradeSchema1(t *testing.T) {
	for _, appID := range []int32{dbfile.AppIDLedger, 0} {
		p := filepath.Join(t.TempDir(), "ledger.db")
		writeSchema1(t, p, appID).Close()
		if info, err := dbfile.Check(p, dbfile.Ledger); err != nil || info.Version != 1 || (appID != 0) != (info.State == dbfile.Older) {
			t.Fatalf("id %x: schema-1 ledger: %+v, %v", appID, info, err)
		}
		before, _ := os.ReadFile(p)
		ro, err := OpenReadOnly(p)
		if err != nil {
			t.Fatalf("id %x: read-only: %v", appID, err)
		}
		es, err := ro.Since(0, 10)
		ro.Close()
		if err != nil || len(es) != 2 || es[0].BytesIn != 100 || es[1].RejectedBytes != 3 || es[1].Seq != 0 {
			t.Fatalf("id %x: read-only rows %+v, %v", appID, es, err)
		}
		if after, _ := os.ReadFile(p); !bytes.Equal(before, after) {
			t.Fatalf("id %x: OpenReadOnly changed the file", appID)
		}
		l, err := Open(p)
		if err != nil {
			t.Fatalf("id %x: upgrade: %v", appID, err)
		}
		if v := l.UpgradedFrom(); v != 1 {
			t.Fatalf("id %x: UpgradedFrom %d, want 1", appID, v)
		}
		e := Entry{SessionID: "new", Seq: 1, WorkerID: hexKey(7), BytesIn: 40}
		for range 2 {
			if err := l.AppendAll(context.Background(), []Entry{e}); err != nil {
				t.Fatal(err)
			}
		}
		es, err = l.Since(0, 10)
		if err != nil || len(es) != 3 || es[0].ID != 1 || es[1].ID != 2 || es[0].Seq != 0 || es[2].Seq != 1 || es[2].BytesIn != 40 {
			t.Fatalf("id %x: upgraded rows %+v, %v", appID, es, err)
		}
		if err := l.Append(Entry{SessionID: "old", WorkerID: hexKey(10), BytesIn: 1}); err != nil {
			t.Fatalf("id %x: an unnumbered row after the upgrade: %v", appID, err)
		}
		l.Close()
		if info, err := dbfile.Check(p, dbfile.Ledger); err != nil || info.State != dbfile.Current || info.Version != SchemaVersion || info.AppID != dbfile.AppIDLedger {
			t.Fatalf("id %x: upgraded ledger: %+v, %v", appID, info, err)
		}
		if l, err = Open(p); err != nil {
			t.Fatalf("id %x: reopened: %v", appID, err)
		} else if v := l.UpgradedFrom(); v != 0 {
			t.Fatalf("id %x: reopened: UpgradedFrom %d", appID, v)
		}
		l.Close()
	}
}

// TestUpgradeSchema1SpillRows: rows a hub appended to a schema-1 file
// (unnumbered) are found when a spill file written before the upgrade
// holds them again (a ".appending" file renamed back, as the hub's
// message says): a session's unnumbered rows are its Seq 1, 2, ... in id
// order. Rows past them append; other contents are ErrConflict.
func TestUpgradeSchema1SpillRows(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ledger.db")
	writeSchema1(t, p, dbfile.AppIDLedger).Close()
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	w := strings.Repeat("a", 64)
	again := []Entry{
		{SessionID: "old", Seq: 1, WorkerID: w, BytesIn: 100, BytesOut: 20},
		{SessionID: "old", Seq: 2, WorkerID: w, BytesIn: 5, RejectedBytes: 3, Final: true},
	}
	if err := l.AppendAll(context.Background(), again); err != nil {
		t.Fatal(err)
	}
	if es, _ := l.Since(0, 10); len(es) != 2 {
		t.Fatalf("schema-1 rows appended again: %+v", es)
	}
	if err := l.AppendAll(context.Background(), []Entry{{SessionID: "old", Seq: 1, WorkerID: w, BytesIn: 101, BytesOut: 20}}); !errors.Is(err, ErrConflict) {
		t.Fatalf("other contents: %v, want ErrConflict", err)
	}
	if err := l.AppendAll(context.Background(), []Entry{{SessionID: "old", Seq: 3, WorkerID: w, BytesIn: 7}}); err != nil {
		t.Fatal(err)
	}
	if es, _ := l.Since(0, 10); len(es) != 3 || es[2].Seq != 3 {
		t.Fatalf("a row past the unnumbered ones: %+v", es)
	}
	// Unnumbered rows appended after the upgrade are not schema-1 rows: a
	// numbered row of their session is recorded, not matched to them.
	checkUnnumberedThenNumbered(t, l, 3)
}

// checkUnnumberedThenNumbered appends an unnumbered row of a new session,
// then its row Seq 1 with the same contents: both are recorded (the ledger
// held n rows before). Before schema-1 rows were told apart, the second
// was taken for the first and 10 bytes were lost.
func checkUnnumberedThenNumbered(t *testing.T, l *Ledger, n int) {
	t.Helper()
	w := hexKey(11)
	for _, e := range []Entry{{SessionID: "later", WorkerID: w, BytesOut: 10}, {SessionID: "later", Seq: 1, WorkerID: w, BytesOut: 10}} {
		if err := l.AppendAll(context.Background(), []Entry{e}); err != nil {
			t.Fatal(err)
		}
	}
	if es, _ := l.Since(0, 100); len(es) != n+2 || es[n].Seq != 0 || es[n+1].Seq != 1 || es[n+1].SessionID != "later" {
		t.Fatalf("an unnumbered row, then Seq 1 of its session: %d rows, want %d (%+v)", len(es), n+2, es)
	}
}

// TestOpenReadOnlyOtherShape: an entries table without the ledger's
// columns is refused by OpenReadOnly with ErrSchema naming the file, as
// Open refuses it; before, it opened, and the first read failed with "no
// such column".
func TestOpenReadOnlyOtherShape(t *testing.T) {
	dir := t.TempDir()
	for _, v := range []int{1, SchemaVersion} {
		p := dbfiletest.Make(t, filepath.Join(dir, fmt.Sprintf("v%d.db", v)), dbfile.Ledger.Tables, v, dbfile.AppIDLedger)
		before := dbfiletest.Snapshot(t, dir)
		l, err := OpenReadOnly(p)
		if err == nil {
			l.Close()
		}
		if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), p) {
			t.Fatalf("schema %d, entries of another shape: %v, want ErrSchema naming the file", v, err)
		}
		dbfiletest.Unchanged(t, dir, before)
	}
}

// TestReaderSeesUpgrade: a reader that opened a schema-1 file while a
// writer had it open reads the Seq of rows appended after a hub upgraded
// the file, as a reader opened later does (credit.RowPrint covers Seq: two
// readers giving one row two prints stop the gateway's crediting).
func TestReaderSeesUpgrade(t *testing.T) {
	p := filepath.Join(t.TempDir(), "ledger.db")
	raw := writeSchema1(t, p, dbfile.AppIDLedger, "_journal_mode=WAL")
	defer raw.Close()
	r, err := OpenReadOnly(p) // the -wal is there: a live reader, not immutable
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if es, err := r.Since(0, 10); err != nil || len(es) != 2 {
		t.Fatalf("schema-1 rows: %+v, %v", es, err)
	}
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.AppendAll(context.Background(), []Entry{{SessionID: "new", Seq: 1, WorkerID: hexKey(3), BytesIn: 4}}); err != nil {
		t.Fatal(err)
	}
	es, err := r.Since(2, 10)
	if err != nil || len(es) != 1 || es[0].Seq != 1 {
		t.Fatalf("the early reader after the upgrade: %+v, %v; want the new row with Seq 1", es, err)
	}
}
