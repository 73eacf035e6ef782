package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
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
// not numbered) to schema 2: the column, NULL in every row so far (a
// UNIQUE index lets NULLs repeat, so the upgrade succeeds on any schema-1
// file), and, when there were rows, the view schema1View holding the
// largest id among them: the only rows the positional match of
// recordedSchema1 looks at.
var upgrades = []func(tx *sql.Tx) error{func(tx *sql.Tx) error {
	if _, err := tx.Exec(`ALTER TABLE entries ADD COLUMN seq INTEGER CHECK (seq >= 1)`); err != nil {
		return err
	}
	var last sql.NullInt64
	if err := tx.QueryRow(`SELECT MAX(id) FROM entries`).Scan(&last); err != nil || last.Int64 == 0 {
		return err
	}
	_, err := tx.Exec(fmt.Sprintf(`CREATE VIEW %s (last_id) AS SELECT %d`, schema1View, last.Int64))
	return err
}}

// schema1View is the view an upgrade from schema 1 leaves: one row, the
// largest id the file held then (its rows up to that id are unnumbered).
const schema1View = "entries_schema1"

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
	db *sql.DB
	// hasSeq is false for a schema-1 file opened read-only until a read
	// finds that a hub has upgraded it (a reader's rows then carry their
	// Seq, as every other reader's do: credit.RowPrint covers it).
	hasSeq atomic.Bool
	// schema1Last is the largest id of the rows a schema-1 file held when
	// it was upgraded (0: none, or created at schema 2).
	schema1Last int64
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
	st := &sqliteStore{db: db}
	st.hasSeq.Store(true)
	var views int
	err = db.QueryRow(`SELECT COUNT(*) FROM sqlite_schema WHERE type = 'view' AND name = ?`, schema1View).Scan(&views)
	if err == nil && views > 0 {
		err = db.QueryRow(`SELECT last_id FROM ` + schema1View).Scan(&st.schema1Last)
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger: open %s: %w", path, err)
	}
	l := &Ledger{st: st, db: db}
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
	st := &sqliteStore{db: db}
	st.hasSeq.Store(v >= SchemaVersion)
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

// insertEntry appends one row unless its (session, seq) is recorded; its
// arguments are insertArgs.
const insertEntry = `INSERT INTO entries (session, worker, bytes_in, bytes_out, rejected, final, time, seq) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (session, seq) DO NOTHING`

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
// lock is held from the start). A row with Seq > 0 whose (session, seq)
// is recorded is not inserted (ON CONFLICT DO NOTHING) but compared with
// the recorded row, as on PostgreSQL; in a file upgraded from schema 1 it
// is first looked for among the session's unnumbered rows
// (recordedSchema1). SQLite assigns ids in commit order: one writer at a
// time, and a row is visible only once committed.
func (s *sqliteStore) Insert(ctx context.Context, es []Entry) ([]int64, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("ledger: append: %w", err)
	}
	defer tx.Rollback()
	ins, err := tx.PrepareContext(ctx, insertEntry)
	if err != nil {
		return nil, fmt.Errorf("ledger: append: %w", err)
	}
	defer ins.Close()
	ids := make([]int64, len(es))
	for i, e := range es {
		if e.Seq > 0 && s.schema1Last > 0 {
			id, found, err := s.recordedSchema1(ctx, tx, e)
			if err != nil {
				return nil, err
			}
			if found {
				ids[i] = id
				continue
			}
		}
		res, err := ins.ExecContext(ctx, insertArgs(e)...)
		if err != nil {
			return nil, fmt.Errorf("ledger: append: %w", err)
		}
		n, err := res.RowsAffected()
		if err == nil && n == 1 {
			ids[i], err = res.LastInsertId()
		} else if err == nil { // (session, seq) is recorded
			ids[i], err = recorded(ctx, tx, e, `seq = ?`, int64(e.Seq))
		}
		if errors.Is(err, ErrConflict) {
			return nil, err
		} else if err != nil {
			return nil, fmt.Errorf("ledger: append: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("ledger: append: %w", err)
	}
	return ids, nil
}

// recordedSchema1 looks for e among the rows of its session that a
// schema-1 file held when it was upgraded (ids up to schema1Last,
// unnumbered): a hub numbers a session's rows 1, 2, ... and sends a row
// whose append failed again unchanged until it is in, so the k-th of them
// in id order is Seq k. A spill file an older hub wrote, appended before
// the upgrade and appended again after it, is found there. It returns the
// row's id and true when it is there with e's contents, false when the
// session has fewer such rows, and an error wrapping ErrConflict when it
// holds other contents.
func (s *sqliteStore) recordedSchema1(ctx context.Context, tx *sql.Tx, e Entry) (int64, bool, error) {
	id, err := recorded(ctx, tx, e, `seq IS NULL AND id <= ? ORDER BY id LIMIT 1 OFFSET ?`, s.schema1Last, int64(e.Seq-1))
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	} else if errors.Is(err, ErrConflict) {
		return 0, false, err
	} else if err != nil {
		return 0, false, fmt.Errorf("ledger: append: %w", err)
	}
	return id, true, nil
}

// recorded returns the id of the row of e's session that where (an SQL
// condition after "session = ? AND", with args) selects when it holds e's
// contents, an error wrapping ErrConflict when it holds others, and
// sql.ErrNoRows when there is none.
func recorded(ctx context.Context, tx *sql.Tx, e Entry, where string, args ...any) (int64, error) {
	var r Entry
	var in, out, rej int64
	err := tx.QueryRowContext(ctx, `SELECT id, worker, bytes_in, bytes_out, rejected, final FROM entries WHERE session = ? AND `+where,
		append([]any{e.SessionID}, args...)...).Scan(&r.ID, &r.WorkerID, &in, &out, &rej, &r.Final)
	if err != nil {
		return 0, err
	}
	if r.WorkerID != e.WorkerID || uint64(in) != e.BytesIn || uint64(out) != e.BytesOut || uint64(rej) != e.RejectedBytes || r.Final != e.Final {
		return 0, fmt.Errorf("%w: session %s seq %d is row %d (worker %.8s in %d out %d rejected %d final %v)",
			ErrConflict, e.SessionID, e.Seq, r.ID, r.WorkerID, in, out, rej, r.Final)
	}
	return r.ID, nil
}

// readColumns is the SELECT of Read's columns from entries (seq as NULL
// in a schema-1 file).
func (s *sqliteStore) readColumns() string {
	seq := "seq"
	if !s.hasSeq.Load() {
		seq = "NULL"
	}
	return `SELECT id, session, worker, bytes_in, bytes_out, rejected, final, time, ` + seq + ` FROM entries`
}

// Read implements Store.
func (s *sqliteStore) Read(ctx context.Context, afterID int64, limit int) ([]Entry, error) {
	if !s.hasSeq.Load() { // a hub may have upgraded the file since
		var v int
		if err := s.db.QueryRowContext(ctx, `PRAGMA user_version`).Scan(&v); err != nil {
			return nil, fmt.Errorf("ledger: read: %w", err)
		}
		s.hasSeq.Store(v >= SchemaVersion)
	}
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
