package ledger

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/kvasir-ai/kvasir/backbone/pgstore"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// openPG opens a ledger on a fresh PostgreSQL database (skipping without
// KVASIR_TEST_PG_DSN) and returns it with the database's URL.
func openPG(t *testing.T) (*Ledger, string) {
	t.Helper()
	dsn := pgtest.DSN(t)
	l, err := Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l, dsn
}

// TestPGAppendSinceTotals: the SQLite test's rows and hand sums on
// PostgreSQL.
func TestPGAppendSinceTotals(t *testing.T) {
	l, _ := openPG(t)
	if l.Store().Kind() != "postgres" {
		t.Fatalf("kind %s", l.Store().Kind())
	}
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
	if err != nil || len(got) != 4 {
		t.Fatalf("Since(0) = %d entries, %v", len(got), err)
	}
	for i, e := range got {
		w := in[i]
		if e.ID != int64(i+1) || e.SessionID != w.SessionID || e.WorkerID != w.WorkerID || e.BytesIn != w.BytesIn ||
			e.BytesOut != w.BytesOut || e.RejectedBytes != w.RejectedBytes || e.Final != w.Final {
			t.Errorf("entry %d = %+v, want %+v", i, e, w)
		}
		if i < 3 && !e.Time.Equal(t0) {
			t.Errorf("entry %d time %v want %v", i, e.Time, t0)
		}
	}
	if got, _ = l.Since(1, 2); len(got) != 2 || got[0].ID != 2 || got[1].ID != 3 {
		t.Fatalf("Since(1, 2) = %+v", got)
	}
	tot, err := l.Totals()
	want := []WorkerTotal{{ID: a, Bytes: 1103, RejectedBytes: 3, Sessions: 2, Entries: 3}, {ID: b, Bytes: 7, RejectedBytes: 50, Sessions: 1, Entries: 1}}
	if err != nil || len(tot) != 2 || tot[0] != want[0] || tot[1] != want[1] {
		t.Fatalf("Totals = %+v, %v; want %+v", tot, err, want)
	}
	if id, _ := l.LastID(); id != 4 {
		t.Fatalf("LastID = %d", id)
	}
	// A batch that Validate refuses records nothing.
	if err := l.AppendAll(context.Background(), []Entry{{SessionID: "s", WorkerID: a, BytesIn: 1}, {SessionID: "s", WorkerID: "bad"}}); !errors.Is(err, ErrInvalid) {
		t.Fatalf("bad batch: %v", err)
	}
	if id, _ := l.LastID(); id != 4 {
		t.Fatalf("partial batch stored: LastID = %d", id)
	}
}

// TestPGAppendOnly: UPDATE, DELETE and TRUNCATE are refused by the
// database, through the store and through any other connection.
func TestPGAppendOnly(t *testing.T) {
	l, dsn := openPG(t)
	if err := l.Append(Entry{SessionID: "s", WorkerID: hexKey(1), BytesIn: 5}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`UPDATE ledger_entries SET bytes_in = 999`, `DELETE FROM ledger_entries`} {
		if err := l.exec(q); !errors.Is(err, ErrAppendOnly) {
			t.Errorf("%s: %v, want ErrAppendOnly", q, err)
		}
	}
	for _, q := range []string{`UPDATE ledger_entries SET worker = worker`, `DELETE FROM ledger_entries WHERE id = 1`, `TRUNCATE ledger_entries`} {
		if err := pgtest.Exec(t, dsn, q); err == nil || pgstore.Message(err) != "ledger: rows are append-only" {
			t.Errorf("raw %s: %v", q, err)
		}
	}
	if es, _ := l.Since(0, 10); len(es) != 1 || es[0].BytesIn != 5 {
		t.Fatalf("row changed: %+v", es)
	}
}

// TestPGForgedRowRefused: a row written around the hub (a raw INSERT) with
// a worker id that is not a 64-char lower-case hex key, a negative count,
// an empty session or creditable bytes above 2^63-1 is refused by the
// database; a forged id is replaced by the next commit-ordered one.
func TestPGForgedRowRefused(t *testing.T) {
	l, dsn := openPG(t)
	if err := l.Append(Entry{SessionID: "s", WorkerID: hexKey(1), BytesIn: 5}); err != nil {
		t.Fatal(err)
	}
	ins := `INSERT INTO ledger_entries (session, worker, bytes_in, bytes_out, rejected, final, time) VALUES ($1, $2, $3, $4, 0, false, 0)`
	for _, c := range []struct {
		session, worker string
		in, out         int64
	}{
		{"s", "nope", 1, 0},
		{"s", hexKey(1)[:63] + "G", 1, 0},
		{"s", "ABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABABAB", 1, 0},
		{"s", hexKey(1) + "0", 1, 0},
		{"s", hexKey(1), -1, 0},
		{"", hexKey(1), 1, 0},
		{"s", hexKey(1), 1 << 62, 1 << 62},
	} {
		err := pgtest.Exec(t, dsn, ins, c.session, c.worker, c.in, c.out)
		if pgstore.Code(err) != pgstore.CodeCheckViolation {
			t.Errorf("forged row %+v: %v, want a check violation", c, err)
		}
	}
	if err := pgtest.Exec(t, dsn, `INSERT INTO ledger_entries (id, session, worker, bytes_in, bytes_out, rejected, final, time)
		VALUES (1000, 's', $1, 1, 0, 0, false, 0)`, hexKey(2)); err != nil {
		t.Fatal(err)
	}
	es, err := l.Since(0, 10)
	if err != nil || len(es) != 2 || es[1].ID >= 1000 || es[1].ID <= es[0].ID {
		t.Fatalf("rows %+v, %v: want the forged id replaced", es, err)
	}
	// The crediting side refuses such a row too (a ledger on a database
	// without these constraints): Validate, applied to every page.
	if err := Validate(Entry{SessionID: "s", WorkerID: "nope"}); !errors.Is(err, ErrInvalid) {
		t.Fatal("Validate accepted a bad worker id")
	}
}

// TestPGIdempotentAppend: a batch sent again after a lost commit
// acknowledgement (same sessions and seqs) is recorded once; a row that
// reuses a recorded (session, seq) with other contents fails the batch.
func TestPGIdempotentAppend(t *testing.T) {
	l, _ := openPG(t)
	checkIdempotentAppend(t, l)
}

// checkIdempotentAppend is TestPGIdempotentAppend and TestIdempotentAppend
// on l, an empty ledger.
func checkIdempotentAppend(t *testing.T, l *Ledger) {
	t.Helper()
	ctx := context.Background()
	batch := []Entry{
		{SessionID: "a", Seq: 1, WorkerID: hexKey(1), BytesOut: 10},
		{SessionID: "b", Seq: 1, WorkerID: hexKey(2), BytesIn: 20},
		{SessionID: "c", WorkerID: hexKey(3), BytesIn: 1}, // unnumbered: always a new row
	}
	ids1, err := l.AppendAllIDs(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	more := append(append([]Entry(nil), batch[:2]...), Entry{SessionID: "a", Seq: 2, WorkerID: hexKey(1), BytesOut: 30, Final: true})
	ids2, err := l.AppendAllIDs(ctx, more)
	if err != nil {
		t.Fatal(err)
	}
	if ids2[0] != ids1[0] || ids2[1] != ids1[1] || ids2[2] <= ids1[2] {
		t.Fatalf("ids %v then %v", ids1, ids2)
	}
	tot, _ := l.Totals()
	if len(tot) != 3 || tot[0].Bytes != 40 || tot[1].Bytes != 20 || tot[2].Bytes != 1 {
		t.Fatalf("totals %+v", tot)
	}
	last, _ := l.LastID()
	bad := []Entry{{SessionID: "d", Seq: 1, WorkerID: hexKey(4), BytesIn: 1}, {SessionID: "a", Seq: 1, WorkerID: hexKey(1), BytesOut: 11}}
	if _, err := l.AppendAllIDs(ctx, bad); !errors.Is(err, ErrConflict) {
		t.Fatalf("conflicting row: %v, want ErrConflict", err)
	}
	es, _ := l.Since(0, 100)
	if n, _ := l.LastID(); n != last || len(es) != 4 {
		t.Fatalf("a failed batch left rows: last %d -> %d, %d rows", last, n, len(es))
	}
}

// TestPGIdsInCommitOrder: while one transaction has inserted a row and not
// committed, another insert waits (the id lock), and its id is above the
// first one's; a reader meanwhile sees neither.
func TestPGIdsInCommitOrder(t *testing.T) {
	l, dsn := openPG(t)
	ctx := context.Background()
	a, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	tx, err := a.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var idA int64
	if err := tx.QueryRow(ctx, `INSERT INTO ledger_entries (session, worker, bytes_in, bytes_out, rejected, final, time)
		VALUES ('a', $1, 1, 0, 0, false, 0) RETURNING id`, hexKey(1)).Scan(&idA); err != nil {
		t.Fatal(err)
	}
	done := make(chan int64, 1)
	go func() {
		id, err := l.Add(ctx, Entry{SessionID: "b", WorkerID: hexKey(2), BytesIn: 2})
		if err != nil {
			t.Error(err)
		}
		done <- id
	}()
	select {
	case id := <-done:
		t.Fatalf("second insert (id %d) committed while the first (id %d) was open", id, idA)
	case <-time.After(300 * time.Millisecond):
	}
	if es, err := l.Since(0, 10); err != nil || len(es) != 0 {
		t.Fatalf("reader sees %+v, %v before any commit", es, err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if idB := <-done; idB <= idA {
		t.Fatalf("id %d committed after id %d", idB, idA)
	}
}

// TestPGCursorWalkSeesEverything: eight writers append concurrently (single
// rows and batches) while a reader walks the ledger with a cursor, as the
// gateway does; at the end the rows the walk returned are exactly the rows
// in the table: no row ever appeared below the cursor after it passed.
func TestPGCursorWalkSeesEverything(t *testing.T) {
	l, _ := openPG(t)
	ctx := context.Background()
	const writers, appends = 8, 40
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			for i := range appends {
				n := 1 + (i+w)%4
				es := make([]Entry, n)
				for j := range es {
					es[j] = Entry{SessionID: fmt.Sprintf("w%d-%d", w, i), Seq: uint64(j + 1), WorkerID: hexKey(byte(w)), BytesIn: uint64(j + 1)}
				}
				if err := l.AppendAll(ctx, es); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	seen := map[int64]bool{}
	var cursor int64
	walk := func() {
		for {
			es, err := l.Read(ctx, cursor, 7)
			if err != nil {
				t.Error(err)
				return
			}
			if len(es) == 0 {
				return
			}
			for _, e := range es {
				if e.ID <= cursor || seen[e.ID] {
					t.Errorf("id %d after cursor %d", e.ID, cursor)
				}
				seen[e.ID] = true
				cursor = e.ID
			}
		}
	}
	go func() { wg.Wait(); close(stop) }()
	for running := true; running; {
		select {
		case <-stop:
			running = false
		default:
		}
		walk()
	}
	walk()
	all, err := l.Since(0, MaxLimit)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range all {
		if !seen[e.ID] {
			t.Errorf("row %d appeared below the cursor after the walk had passed it", e.ID)
		}
	}
	if want := writers * appends * 10 / 4; len(all) != want || len(seen) != len(all) {
		t.Fatalf("%d rows, walk saw %d, want %d", len(all), len(seen), want)
	}
}

// TestPGMigrations: Open applies version 1 once (a second Open, even
// concurrent, changes nothing); a database recording a newer version or
// another script for version 1 is refused and left as it was;
// OpenReadOnly needs the schema and cannot write.
func TestPGMigrations(t *testing.T) {
	dsn := pgtest.DSN(t)
	if _, err := OpenReadOnly(dsn); !errors.Is(err, ErrSchema) || !errors.Is(err, pgstore.ErrNoSchema) {
		t.Fatalf("read-only open of an empty database: %v", err)
	}
	var wg sync.WaitGroup
	ls := make([]*Ledger, 4)
	for i := range ls {
		wg.Go(func() {
			var err error
			if ls[i], err = Open(dsn); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	for _, l := range ls {
		if l != nil {
			l.Close()
		}
	}
	l, err := Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Append(Entry{SessionID: "s", WorkerID: hexKey(1), BytesIn: 3}); err != nil {
		t.Fatal(err)
	}
	l.Close()
	r, err := OpenReadOnly(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if tot, err := r.Totals(); err != nil || len(tot) != 1 || tot[0].Bytes != 3 {
		t.Fatalf("read-only totals %+v, %v", tot, err)
	}
	if err := r.Append(Entry{SessionID: "s", WorkerID: hexKey(1), BytesIn: 1}); err == nil {
		t.Error("append through a read-only ledger succeeded")
	}
	r.Close()
	if err := pgtest.Exec(t, dsn, `INSERT INTO kvasir_schema_migrations (component, version, name, sha256) VALUES ('ledger', 2, 'from the future', 'x')`); err != nil {
		t.Fatal(err)
	}
	for _, open := range []func(string) (*Ledger, error){Open, OpenReadOnly} {
		if _, err := open(dsn); !errors.Is(err, ErrSchema) || !errors.Is(err, pgstore.ErrNewerSchema) {
			t.Errorf("newer schema: %v, want ErrSchema and ErrNewerSchema", err)
		}
	}
	if err := pgtest.Exec(t, dsn, `DELETE FROM kvasir_schema_migrations WHERE version = 2`); err != nil {
		t.Fatal(err)
	}
	if err := pgtest.Exec(t, dsn, `UPDATE kvasir_schema_migrations SET sha256 = 'other' WHERE component = 'ledger'`); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dsn); !errors.Is(err, ErrSchema) || !errors.Is(err, pgstore.ErrSchemaMismatch) {
		t.Errorf("changed script: %v, want ErrSchemaMismatch", err)
	}
	var n int
	c, err := pgx.Connect(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(context.Background())
	if err := c.QueryRow(context.Background(), `SELECT count(*) FROM ledger_entries`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("rows after refused opens: %d, %v", n, err)
	}
}
