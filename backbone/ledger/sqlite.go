package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/sqlitestore"
	"github.com/kvasir-ai/kvasir/wallet/dbfile"
)

const schema = `
CREATE TABLE IF NOT EXISTS entries (
	id        INTEGER PRIMARY KEY AUTOINCREMENT,
	session   TEXT    NOT NULL CHECK (length(session) BETWEEN 1 AND 128),
	worker    TEXT    NOT NULL CHECK (length(worker) = 64),
	bytes_in  INTEGER NOT NULL CHECK (bytes_in >= 0),
	bytes_out INTEGER NOT NULL CHECK (bytes_out >= 0),
	rejected  INTEGER NOT NULL CHECK (rejected >= 0),
	final     INTEGER NOT NULL CHECK (final IN (0, 1)),
	time      INTEGER NOT NULL, -- unix nanoseconds UTC
	seq       INTEGER CHECK (seq >= 1) -- Entry.Seq; NULL: not numbered (and every row of schema 1)
);
CREATE INDEX IF NOT EXISTS entries_worker ON entries(worker);
CREATE UNIQUE INDEX IF NOT EXISTS entries_session_seq ON entries(session, seq);
CREATE TRIGGER IF NOT EXISTS entries_no_update BEFORE UPDATE ON entries
	BEGIN SELECT RAISE(ABORT, 'ledger: rows are append-only'); END;
CREATE TRIGGER IF NOT EXISTS entries_no_delete BEFORE DELETE ON entries
	BEGIN SELECT RAISE(ABORT, 'ledger: rows are append-only'); END;
`

// upgrades bring an SQLite ledger of schema 1 (no seq column: rows were
// not numbered) to schema 2. The column's rows are NULL, which a UNIQUE
// index lets repeat, so the upgrade succeeds on any schema-1 file.
var upgrades = []string{`
ALTER TABLE entries ADD COLUMN seq INTEGER CHECK (seq >= 1);
`}

// sqliteStore is the ledger in one SQLite file (WAL journal,
// synchronous=FULL). Several processes may open the same file (writers
// serialise on SQLite's lock, waiting up to 10 s).
//
// Durability: synchronous=FULL fsyncs the WAL on every commit. With NORMAL,
// a power cut may roll back the last commits; AUTOINCREMENT would then hand
// out the lost ids again, and a gateway whose cursor already passed them
// would never credit the new rows. Appends are a few per second per
// session, so the fsync costs nothing that matters.
//
// Since schema 2 the file keeps each row's Seq, unique per session (the
// index entries_session_seq), so that appending rows already recorded (a
// hub's spill file appended again) records them once, as on PostgreSQL.
type sqliteStore struct {
	db     *sql.DB
	hasSeq bool // false only for a schema-1 file opened read-only
}

// sqliteFile is the ledger's SQLite file (created 0600, as the wallets:
// it names every worker key and its bytes): the schema on a new or empty
// file, then a check that the entries table has the ledger's columns.
var sqliteFile = sqlitestore.File{Kind: dbfile.Ledger, Prefix: "ledger", ErrSchema: ErrSchema, Schema: schema, Upgrades: upgrades, Create: true,
	Verify: `SELECT id, session, worker, bytes_in, bytes_out, rejected, final, time, seq FROM entries LIMIT 0`}

// OpenSQLite opens (creating if needed) the ledger in the SQLite file at
// path for appending (sqlitestore.File.Open). The file is first checked
// through a read-only connection (dbfile.Check): a corrupt file, a file of
// another kind (application_id, tables) or of a newer schema is refused
// with an error wrapping ErrSchema and the dbfile error (dbfile.ErrCorrupt,
// ErrForeign, ErrNewerSchema), and is left byte for byte as it was. A new
// or empty file gets the schema, user_version = SchemaVersion and
// application_id = dbfile.AppIDLedger; a ledger written before application
// ids (id 0, exactly the entries table) is adopted by setting the id. A
// ledger of schema 1 is upgraded to SchemaVersion (a seq column; its rows
// keep Seq 0). A pre-existing entries table of another shape is refused
// (ErrSchema).
func OpenSQLite(path string) (*Ledger, error) {
	db, from, err := sqliteFile.OpenFrom(path)
	if err != nil {
		return nil, err
	}
	l := &Ledger{st: &sqliteStore{db: db, hasSeq: true}, db: db}
	if from > 0 && from < SchemaVersion {
		l.upgradedFrom = from
	}
	return l, nil
}

// OpenSQLiteReadOnly opens an existing SQLite ledger for reading only; it
// never writes to path nor leaves -wal/-shm files that were not there (see
// dbfile.ReadOnlyDSN). A missing file gives an error wrapping
// dbfile.ErrNotExist; an empty file, a corrupt one, one of another kind or
// of a newer schema an error wrapping ErrSchema and the dbfile error.
//
// A schema-1 file is read as it is (every row's Seq 0), not upgraded.
func OpenSQLiteReadOnly(path string) (*Ledger, error) {
	db, err := sqliteFile.OpenReadOnly(path)
	if err != nil {
		return nil, err
	}
	var v int
	if err := db.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger: open %s: %w", path, err)
	}
	st := &sqliteStore{db: db, hasSeq: v >= 2}
	// The columns every read takes: a table of another shape is refused
	// here, as a read-write open refuses it, not at the first query.
	if _, err := db.Exec(st.readColumns() + ` LIMIT 0`); err != nil {
		db.Close()
		return nil, fmt.Errorf("%w: %s: %v", ErrSchema, path, err)
	}
	return &Ledger{st: st, db: db}, nil
}

// Kind implements Store.
func (s *sqliteStore) Kind() string { return "sqlite" }

// Close implements Store.
func (s *sqliteStore) Close() error { return s.db.Close() }

// insertEntry appends one row; its arguments are insertArgs.
const insertEntry = `INSERT INTO entries (session, worker, bytes_in, bytes_out, rejected, final, time, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`

// insertArgs are the insertEntry arguments of a validated e (counts fit
// int64; time as Unix nanoseconds UTC; Seq 0 as NULL).
func insertArgs(e Entry) []any {
	var seq any
	if e.Seq > 0 {
		seq = int64(e.Seq)
	}
	return []any{e.SessionID, e.WorkerID, int64(e.BytesIn), int64(e.BytesOut), int64(e.RejectedBytes), e.Final, e.Time.UTC().UnixNano(), seq}
}

// Insert implements Store in one transaction (BEGIN IMMEDIATE: the write
// lock is held from the start, so that no other writer records a row
// between a lookup of (session, seq) and the insert). A row with Seq > 0
// already recorded is compared with what is recorded, as on PostgreSQL.
// SQLite assigns ids in commit order: one writer at a time, and a row is
// visible only once committed.
func (s *sqliteStore) Insert(ctx context.Context, es []Entry) ([]int64, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("ledger: append: %w", err)
	}
	defer tx.Rollback()
	ids := make([]int64, len(es))
	for i, e := range es {
		if e.Seq > 0 {
			id, found, err := recorded(ctx, tx, e)
			if err != nil {
				return nil, err
			}
			if found {
				ids[i] = id
				continue
			}
		}
		res, err := tx.ExecContext(ctx, insertEntry, insertArgs(e)...)
		if err != nil {
			return nil, fmt.Errorf("ledger: append: %w", err)
		}
		if ids[i], err = res.LastInsertId(); err != nil {
			return nil, fmt.Errorf("ledger: append: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("ledger: append: %w", err)
	}
	return ids, nil
}

// recorded looks e's (SessionID, Seq) up: the row's id and true when it
// is recorded with e's contents, an error wrapping ErrConflict when it is
// recorded with others, false when it is not recorded.
func recorded(ctx context.Context, tx *sql.Tx, e Entry) (int64, bool, error) {
	var r Entry
	var in, out, rej int64
	err := tx.QueryRowContext(ctx, `SELECT id, worker, bytes_in, bytes_out, rejected, final FROM entries WHERE session = ? AND seq = ?`,
		e.SessionID, int64(e.Seq)).Scan(&r.ID, &r.WorkerID, &in, &out, &rej, &r.Final)
	if errors.Is(err, sql.ErrNoRows) {
		// Rows a schema-1 file holds (written by a hub before the upgrade)
		// are unnumbered, but a session's rows were appended in Seq order
		// (1, 2, ...: a row is sent again unchanged until it is in), so its
		// unnumbered rows in id order are its Seq 1..n: a row of a spill
		// file written before the upgrade and appended then is found there.
		err = tx.QueryRowContext(ctx, `SELECT id, worker, bytes_in, bytes_out, rejected, final FROM entries
			WHERE session = ? AND seq IS NULL ORDER BY id LIMIT 1 OFFSET ?`,
			e.SessionID, int64(e.Seq-1)).Scan(&r.ID, &r.WorkerID, &in, &out, &rej, &r.Final)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, false, nil
		}
	}
	if err != nil {
		return 0, false, fmt.Errorf("ledger: append: %w", err)
	}
	if r.WorkerID != e.WorkerID || uint64(in) != e.BytesIn || uint64(out) != e.BytesOut || uint64(rej) != e.RejectedBytes || r.Final != e.Final {
		return 0, false, fmt.Errorf("%w: session %s seq %d is row %d (worker %.8s in %d out %d rejected %d final %v)",
			ErrConflict, e.SessionID, e.Seq, r.ID, r.WorkerID, in, out, rej, r.Final)
	}
	return r.ID, true, nil
}

// readColumns is the SELECT of Read's columns from entries (seq as NULL
// in a schema-1 file).
func (s *sqliteStore) readColumns() string {
	seq := "seq"
	if !s.hasSeq {
		seq = "NULL"
	}
	return `SELECT id, session, worker, bytes_in, bytes_out, rejected, final, time, ` + seq + ` FROM entries`
}

// Read implements Store.
func (s *sqliteStore) Read(ctx context.Context, afterID int64, limit int) ([]Entry, error) {
	rows, err := s.db.QueryContext(ctx, s.readColumns()+` WHERE id > ? ORDER BY id LIMIT ?`, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: read: %w", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		var e Entry
		var in, outB, rej, ns int64
		var sq sql.NullInt64
		if err := rows.Scan(&e.ID, &e.SessionID, &e.WorkerID, &in, &outB, &rej, &e.Final, &ns, &sq); err != nil {
			return nil, fmt.Errorf("ledger: read: %w", err)
		}
		e.Seq = uint64(sq.Int64)
		e.BytesIn, e.BytesOut, e.RejectedBytes = uint64(in), uint64(outB), uint64(rej)
		e.Time = time.Unix(0, ns).UTC()
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: read: %w", err)
	}
	return out, nil
}

// Totals implements Store; a sum above 2^63-1 is an error (SQLite reports
// integer overflow).
func (s *sqliteStore) Totals(ctx context.Context) ([]WorkerTotal, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT worker, SUM(bytes_in) + SUM(bytes_out), SUM(rejected), COUNT(DISTINCT session), COUNT(*)
		FROM entries GROUP BY worker ORDER BY worker`)
	if err != nil {
		return nil, fmt.Errorf("ledger: totals: %w", err)
	}
	defer rows.Close()
	var out []WorkerTotal
	for rows.Next() {
		var t WorkerTotal
		var b, r int64
		if err := rows.Scan(&t.ID, &b, &r, &t.Sessions, &t.Entries); err != nil {
			return nil, fmt.Errorf("ledger: totals: %w", err)
		}
		t.Bytes, t.RejectedBytes = uint64(b), uint64(r)
		out = append(out, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("ledger: totals: %w", err)
	}
	return out, nil
}

// LastID implements Store.
func (s *sqliteStore) LastID(ctx context.Context) (int64, error) {
	var id sql.NullInt64
	if err := s.db.QueryRowContext(ctx, `SELECT MAX(id) FROM entries`).Scan(&id); err != nil {
		return 0, fmt.Errorf("ledger: %w", err)
	}
	return id.Int64, nil
}

func (s *sqliteStore) exec(q string, args ...any) error {
	_, err := s.db.Exec(q, args...)
	if err != nil && strings.Contains(err.Error(), "append-only") {
		return fmt.Errorf("%w: %v", ErrAppendOnly, err)
	}
	return err
}
