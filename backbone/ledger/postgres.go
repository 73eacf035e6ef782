package ledger

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kvasir-ai/kvasir/backbone/pgstore"
)

// idLockKey is the advisory lock (per database) every insert into
// ledger_entries takes before it draws its id: the lock is held until the
// inserting transaction ends, so ids are drawn in commit order.
const idLockKey = 0x4b564c4749444c4b // "KVLGIDLK"

// Migrations are the ledger's PostgreSQL schema versions (component
// "ledger"; pgstore.Migrate applies the missing ones on Open).
//
// Version 1: table ledger_entries. Its id has no default: a BEFORE INSERT
// trigger takes the advisory lock idLockKey (held to the end of the
// transaction) and only then draws nextval, so of two inserting
// transactions the one that draws later commits later, and a reader that
// sees id N sees every committed row below N (docs/accounting.md). Any
// id a client supplies is overwritten. The same CHECKs as Validate refuse a
// forged row (a worker id that is not 64 lower-case hex characters, a
// negative count, an empty session), (session, seq) is unique (the
// idempotency key of a retried append), and UPDATE, DELETE and TRUNCATE
// are refused by triggers, whoever connects.
var Migrations = []pgstore.Migration{{Name: "ledger entries, commit-ordered ids, append-only", SQL: fmt.Sprintf(`
CREATE SEQUENCE ledger_entries_id_seq AS bigint MINVALUE 1 START 1 CACHE 1 NO CYCLE;
CREATE TABLE ledger_entries (
	id        bigint  PRIMARY KEY,
	session   text    NOT NULL CHECK (length(session) BETWEEN 1 AND 128),
	seq       bigint  CHECK (seq >= 1),
	worker    text    NOT NULL CHECK (worker ~ '^[0-9a-f]{64}$'),
	bytes_in  bigint  NOT NULL CHECK (bytes_in >= 0),
	bytes_out bigint  NOT NULL CHECK (bytes_out >= 0),
	rejected  bigint  NOT NULL CHECK (rejected >= 0),
	final     boolean NOT NULL,
	time      bigint  NOT NULL, -- unix nanoseconds UTC
	CONSTRAINT ledger_entries_creditable_fits CHECK (bytes_in <= 9223372036854775807 - bytes_out),
	CONSTRAINT ledger_entries_session_seq UNIQUE (session, seq)
);
ALTER SEQUENCE ledger_entries_id_seq OWNED BY ledger_entries.id;
CREATE INDEX ledger_entries_worker ON ledger_entries (worker);
CREATE FUNCTION ledger_entries_assign_id() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_advisory_xact_lock(%d);
	NEW.id := nextval('ledger_entries_id_seq');
	RETURN NEW;
END $$;
CREATE TRIGGER ledger_entries_assign_id BEFORE INSERT ON ledger_entries
	FOR EACH ROW EXECUTE FUNCTION ledger_entries_assign_id();
CREATE FUNCTION ledger_entries_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'ledger: rows are append-only';
END $$;
CREATE TRIGGER ledger_entries_no_change BEFORE UPDATE OR DELETE ON ledger_entries
	FOR EACH ROW EXECUTE FUNCTION ledger_entries_append_only();
CREATE TRIGGER ledger_entries_no_truncate BEFORE TRUNCATE ON ledger_entries
	FOR EACH STATEMENT EXECUTE FUNCTION ledger_entries_append_only();
`, int64(idLockKey))}}

// pgStore is the ledger in a PostgreSQL database shared by several hubs.
type pgStore struct {
	pool *pgxpool.Pool
}

// OpenPostgres connects to the PostgreSQL database at dsn (a postgres://
// URL), applies the missing schema migrations (Migrations) and returns the
// ledger for appending. A database with a newer or different ledger schema
// is refused with an error wrapping ErrSchema and pgstore.ErrNewerSchema or
// pgstore.ErrSchemaMismatch, and left as it was.
func OpenPostgres(ctx context.Context, dsn string) (*Ledger, error) {
	pool, err := pgstore.Connect(ctx, dsn, pgstore.Options{AppName: "kvasir-hub-ledger", MaxConns: 8})
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	if _, err := pgstore.Migrate(ctx, pool, "ledger", Migrations); err != nil {
		pool.Close()
		if errors.Is(err, pgstore.ErrNewerSchema) || errors.Is(err, pgstore.ErrSchemaMismatch) {
			return nil, fmt.Errorf("%w: %w", ErrSchema, err)
		}
		return nil, fmt.Errorf("ledger: %w", err)
	}
	return &Ledger{st: &pgStore{pool: pool}}, nil
}

// OpenPostgresReadOnly connects to dsn for reading only (every
// transaction read-only); the ledger schema must be at this program's
// version (else an error wrapping ErrSchema). Nothing is created.
func OpenPostgresReadOnly(ctx context.Context, dsn string) (*Ledger, error) {
	pool, err := pgstore.Connect(ctx, dsn, pgstore.Options{AppName: "kvasir-ledger-reader", ReadOnly: true, MaxConns: 2})
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	if err := pgstore.CheckVersion(ctx, pool, "ledger", Migrations); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	return &Ledger{st: &pgStore{pool: pool}}, nil
}

// Kind implements Store.
func (s *pgStore) Kind() string { return "postgres" }

// Close implements Store.
func (s *pgStore) Close() error { s.pool.Close(); return nil }

// Insert implements Store with one INSERT ... SELECT FROM unnest(...) in
// a transaction. The id trigger draws ids in the order the rows are
// inserted (the ORDER BY), so the returned ids, sorted, belong to the
// inserted rows in input order; rows skipped by ON CONFLICT (an already
// recorded (session, seq)) are compared with what is recorded.
func (s *pgStore) Insert(ctx context.Context, es []Entry) ([]int64, error) {
	n := len(es)
	sess, work := make([]string, n), make([]string, n)
	seq := make([]*int64, n)
	in, out, rej, ts := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	final := make([]bool, n)
	for i, e := range es {
		sess[i], work[i] = e.SessionID, e.WorkerID
		if e.Seq > 0 {
			v := int64(e.Seq)
			seq[i] = &v
		}
		in[i], out[i], rej[i] = int64(e.BytesIn), int64(e.BytesOut), int64(e.RejectedBytes)
		final[i], ts[i] = e.Final, e.Time.UTC().UnixNano()
	}
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("ledger: append: %w", err)
	}
	defer tx.Rollback(context.Background())
	rows, err := tx.Query(ctx, `INSERT INTO ledger_entries (session, seq, worker, bytes_in, bytes_out, rejected, final, time)
		SELECT session, seq, worker, bytes_in, bytes_out, rejected, final, time
		FROM unnest($1::text[], $2::bigint[], $3::text[], $4::bigint[], $5::bigint[], $6::bigint[], $7::boolean[], $8::bigint[])
			WITH ORDINALITY AS t(session, seq, worker, bytes_in, bytes_out, rejected, final, time, ord)
		ORDER BY ord
		ON CONFLICT (session, seq) DO NOTHING
		RETURNING id, session, seq`, sess, seq, work, in, out, rej, final, ts)
	if err != nil {
		return nil, appendErr(err)
	}
	type key struct {
		session string
		seq     int64
	}
	var got []int64
	inserted := map[key]bool{}
	for rows.Next() {
		var id int64
		var k key
		var sq *int64
		if err := rows.Scan(&id, &k.session, &sq); err != nil {
			rows.Close()
			return nil, appendErr(err)
		}
		if sq != nil {
			k.seq = *sq
			inserted[k] = true
		}
		got = append(got, id)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, appendErr(err)
	}
	sort.Slice(got, func(i, j int) bool { return got[i] < got[j] })
	ids := make([]int64, n)
	var dups []int // indexes of rows recorded before
	next := 0
	for i, e := range es {
		k := key{e.SessionID, int64(e.Seq)}
		if e.Seq > 0 && !inserted[k] {
			dups = append(dups, i)
			continue
		}
		if e.Seq > 0 {
			delete(inserted, k) // a second copy of k in this batch is a duplicate
		}
		if next >= len(got) {
			return nil, fmt.Errorf("ledger: append: %d rows inserted for %d entries", len(got), n)
		}
		ids[i] = got[next]
		next++
	}
	for _, i := range dups {
		e := es[i]
		var r Entry
		var in, out, rej, ns int64
		err := tx.QueryRow(ctx, `SELECT id, worker, bytes_in, bytes_out, rejected, final, time FROM ledger_entries WHERE session = $1 AND seq = $2`,
			e.SessionID, int64(e.Seq)).Scan(&r.ID, &r.WorkerID, &in, &out, &rej, &r.Final, &ns)
		if err != nil {
			return nil, appendErr(err)
		}
		if r.WorkerID != e.WorkerID || uint64(in) != e.BytesIn || uint64(out) != e.BytesOut || uint64(rej) != e.RejectedBytes || r.Final != e.Final {
			return nil, fmt.Errorf("%w: session %s seq %d is row %d (worker %.8s in %d out %d rejected %d final %v)",
				ErrConflict, e.SessionID, e.Seq, r.ID, r.WorkerID, in, out, rej, r.Final)
		}
		ids[i] = r.ID
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, appendErr(err)
	}
	return ids, nil
}

// appendErr wraps an insert error: a CHECK violation (a row Validate
// would refuse) wraps ErrInvalid.
func appendErr(err error) error {
	if pgstore.Code(err) == pgstore.CodeCheckViolation {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return fmt.Errorf("ledger: append: %w", err)
}

// Read implements Store.
func (s *pgStore) Read(ctx context.Context, afterID int64, limit int) ([]Entry, error) {
	rows, err := s.pool.Query(ctx,
		`SELECT id, session, seq, worker, bytes_in, bytes_out, rejected, final, time FROM ledger_entries WHERE id > $1 ORDER BY id LIMIT $2`,
		afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: read: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Entry, error) {
		var e Entry
		var sq *int64
		var in, outB, rej, ns int64
		if err := r.Scan(&e.ID, &e.SessionID, &sq, &e.WorkerID, &in, &outB, &rej, &e.Final, &ns); err != nil {
			return e, err
		}
		if sq != nil {
			e.Seq = uint64(*sq)
		}
		e.BytesIn, e.BytesOut, e.RejectedBytes = uint64(in), uint64(outB), uint64(rej)
		e.Time = time.Unix(0, ns).UTC()
		return e, nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: read: %w", err)
	}
	return out, nil
}

// Totals implements Store; a sum above 2^63-1 fails ("bigint out of
// range").
func (s *pgStore) Totals(ctx context.Context) ([]WorkerTotal, error) {
	rows, err := s.pool.Query(ctx, `SELECT worker, (SUM(bytes_in) + SUM(bytes_out))::bigint, SUM(rejected)::bigint,
		COUNT(DISTINCT session), COUNT(*) FROM ledger_entries GROUP BY worker ORDER BY worker COLLATE "C"`)
	if err != nil {
		return nil, fmt.Errorf("ledger: totals: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (WorkerTotal, error) {
		var t WorkerTotal
		var b, rj, sessions, entries int64
		err := r.Scan(&t.ID, &b, &rj, &sessions, &entries)
		t.Bytes, t.RejectedBytes, t.Sessions, t.Entries = uint64(b), uint64(rj), int(sessions), int(entries)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: totals: %w", err)
	}
	return out, nil
}

// LastID implements Store.
func (s *pgStore) LastID(ctx context.Context) (int64, error) {
	var id int64
	if err := s.pool.QueryRow(ctx, `SELECT COALESCE(MAX(id), 0) FROM ledger_entries`).Scan(&id); err != nil {
		return 0, fmt.Errorf("ledger: %w", err)
	}
	return id, nil
}

func (s *pgStore) exec(q string, args ...any) error {
	_, err := s.pool.Exec(context.Background(), q, args...)
	if err != nil && pgstore.Code(err) == pgstore.CodeRaiseException && pgstore.Message(err) == "ledger: rows are append-only" {
		return fmt.Errorf("%w: %v", ErrAppendOnly, err)
	}
	return err
}
