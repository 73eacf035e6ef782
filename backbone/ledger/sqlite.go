package ledger

import (
	"context"
	"database/sql"
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
	time      INTEGER NOT NULL -- unix nanoseconds UTC
);
CREATE INDEX IF NOT EXISTS entries_worker ON entries(worker);
CREATE TRIGGER IF NOT EXISTS entries_no_update BEFORE UPDATE ON entries
	BEGIN SELECT RAISE(ABORT, 'ledger: rows are append-only'); END;
CREATE TRIGGER IF NOT EXISTS entries_no_delete BEFORE DELETE ON entries
	BEGIN SELECT RAISE(ABORT, 'ledger: rows are append-only'); END;
`

// sqliteStore is the ledger in one SQLite file (WAL journal,
// synchronous=FULL). Several processes may open the same file (writers
// serialise on SQLite's lock, waiting up to 10 s).
//
// Durability: synchronous=FULL fsyncs the WAL on every commit. With NORMAL,
// a power cut may roll back the last commits; AUTOINCREMENT would then hand
// out the lost ids again, and a gateway whose cursor already passed them
// would never credit the new rows. Appends are a few per second per
// session, so the fsync costs nothing that matters.
type sqliteStore struct {
	db *sql.DB
}

// sqliteFile is the ledger's SQLite file (created 0600, as the wallets:
// it names every worker key and its bytes): the schema on a new or empty
// file, then a check that the entries table has the ledger's columns.
var sqliteFile = sqlitestore.File{Kind: dbfile.Ledger, Prefix: "ledger", ErrSchema: ErrSchema, Schema: schema, Create: true,
	Verify: `SELECT id, session, worker, bytes_in, bytes_out, rejected, final, time FROM entries LIMIT 0`}

// OpenSQLite opens (creating if needed) the ledger in the SQLite file at
// path for appending (sqlitestore.File.Open). The file is first checked
// through a read-only connection (dbfile.Check): a corrupt file, a file of
// another kind (application_id, tables) or of a newer schema is refused
// with an error wrapping ErrSchema and the dbfile error (dbfile.ErrCorrupt,
// ErrForeign, ErrNewerSchema), and is left byte for byte as it was. A new
// or empty file gets the schema, user_version = SchemaVersion and
// application_id = dbfile.AppIDLedger; a ledger written before application
// ids (id 0, version 1, exactly the entries table) is adopted by setting
// the id. A pre-existing entries table of another shape is refused
// (ErrSchema).
func OpenSQLite(path string) (*Ledger, error) {
	db, err := sqliteFile.Open(path)
	if err != nil {
		return nil, err
	}
	return &Ledger{st: &sqliteStore{db: db}, db: db}, nil
}

// OpenSQLiteReadOnly opens an existing SQLite ledger for reading only; it
// never writes to path nor leaves -wal/-shm files that were not there (see
// dbfile.ReadOnlyDSN). A missing file gives an error wrapping
// dbfile.ErrNotExist; an empty file, a corrupt one, one of another kind or
// of a newer schema an error wrapping ErrSchema and the dbfile error.
func OpenSQLiteReadOnly(path string) (*Ledger, error) {
	db, err := sqliteFile.OpenReadOnly(path)
	if err != nil {
		return nil, err
	}
	return &Ledger{st: &sqliteStore{db: db}, db: db}, nil
}

// Kind implements Store.
func (s *sqliteStore) Kind() string { return "sqlite" }

// Close implements Store.
func (s *sqliteStore) Close() error { return s.db.Close() }

// insertEntry appends one row; its arguments are insertArgs.
const insertEntry = `INSERT INTO entries (session, worker, bytes_in, bytes_out, rejected, final, time) VALUES (?, ?, ?, ?, ?, ?, ?)`

// insertArgs are the insertEntry arguments of a validated e (counts fit
// int64; time as Unix nanoseconds UTC).
func insertArgs(e Entry) []any {
	return []any{e.SessionID, e.WorkerID, int64(e.BytesIn), int64(e.BytesOut), int64(e.RejectedBytes), e.Final, e.Time.UTC().UnixNano()}
}

// Insert implements Store: one row in autocommit, several in one
// transaction (BEGIN IMMEDIATE). SQLite assigns ids in commit order: one
// writer at a time, and a row is visible only once committed.
func (s *sqliteStore) Insert(ctx context.Context, es []Entry) ([]int64, error) {
	if len(es) == 1 {
		res, err := s.db.ExecContext(ctx, insertEntry, insertArgs(es[0])...)
		if err != nil {
			return nil, fmt.Errorf("ledger: append: %w", err)
		}
		id, err := res.LastInsertId()
		if err != nil {
			return nil, fmt.Errorf("ledger: append: %w", err)
		}
		return []int64{id}, nil
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("ledger: append: %w", err)
	}
	defer tx.Rollback()
	ids := make([]int64, len(es))
	for i, e := range es {
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

// Read implements Store.
func (s *sqliteStore) Read(ctx context.Context, afterID int64, limit int) ([]Entry, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT id, session, worker, bytes_in, bytes_out, rejected, final, time FROM entries WHERE id > ? ORDER BY id LIMIT ?`,
		afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("ledger: read: %w", err)
	}
	defer rows.Close()
	var out []Entry
	for rows.Next() {
		var e Entry
		var in, outB, rej, ns int64
		if err := rows.Scan(&e.ID, &e.SessionID, &e.WorkerID, &in, &outB, &rej, &e.Final, &ns); err != nil {
			return nil, fmt.Errorf("ledger: read: %w", err)
		}
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
