package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	_ "github.com/mattn/go-sqlite3" // SQLite driver "sqlite3" (cgo)

	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Sentinel errors. Every error returned by this package wraps one of these
// or a database/sql error.
var (
	// ErrInvalid: an Entry that cannot be recorded (bad worker id, empty
	// session, a count above 2^63-1).
	ErrInvalid = errors.New("ledger: invalid entry")
	// ErrAppendOnly: an attempt to update or delete a row (refused by triggers).
	ErrAppendOnly = errors.New("ledger: rows are append-only")
	// ErrSchema: the file is not a ledger of this version.
	ErrSchema = errors.New("ledger: unsupported schema")
)

// SchemaVersion is the ledger schema version stored in PRAGMA user_version.
const SchemaVersion = 1

// MaxSessionLen bounds a session id, in bytes.
const MaxSessionLen = 128

// DefaultLimit and MaxLimit bound the number of entries one Since returns.
const (
	DefaultLimit = 1000
	MaxLimit     = 10000
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

// Ledger is the hub's append-only contribution ledger in one SQLite file
// (WAL journal, synchronous=FULL). It is safe for concurrent use, and
// several processes may open the same file (writers serialise on SQLite's
// lock, waiting up to 10 s).
//
// Durability: synchronous=FULL fsyncs the WAL on every commit. With NORMAL,
// a power cut may roll back the last commits; AUTOINCREMENT would then hand
// out the lost ids again, and a gateway whose cursor already passed them
// would never credit the new rows. Appends are a few per second per
// session, so the fsync costs nothing that matters.
type Ledger struct {
	db *sql.DB
}

var _ Reader = (*Ledger)(nil)

// Reader reads ledger entries with id > afterID in increasing id order, at
// most limit of them (limit <= 0 means DefaultLimit; capped at MaxLimit).
// *Ledger reads its file; *Client reads a hub over HTTP.
type Reader interface {
	Read(ctx context.Context, afterID int64, limit int) ([]Entry, error)
}

// Open opens (creating if needed) the ledger at path for appending. The
// file is first checked through a read-only connection (dbfile.Check): a
// corrupt file, a file of another kind (application_id, tables) or of a
// newer schema is refused with an error wrapping ErrSchema and the
// dbfile error (dbfile.ErrCorrupt, ErrForeign, ErrNewerSchema), and is left
// byte for byte as it was. A new or empty file gets the schema,
// user_version = SchemaVersion and application_id = dbfile.AppIDLedger; a
// ledger written before application ids (id 0, version 1, exactly the
// entries table) is adopted by setting the id.
func Open(path string) (*Ledger, error) {
	info, err := dbfile.Check(path, dbfile.Ledger)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	dsn, err := dbfile.DSN(path, "_journal_mode=WAL", "_synchronous=FULL", "_busy_timeout=10000", "_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("ledger: open %s: %w", path, err)
	}
	l := &Ledger{db: db}
	if err := l.init(info.State); err != nil {
		db.Close()
		return nil, fmt.Errorf("ledger: open %s: %w", path, err)
	}
	return l, nil
}

// OpenReadOnly opens an existing ledger for reading only (Totals, Read,
// LastID); it never writes to path nor leaves -wal/-shm files that were
// not there (see dbfile.ReadOnlyDSN). A missing file gives an error
// wrapping dbfile.ErrNotExist; an empty file, a corrupt one, one of another
// kind or of a newer schema an error wrapping ErrSchema and the dbfile
// error. Appends on the result fail.
func OpenReadOnly(path string) (*Ledger, error) {
	db, checkErr, err := dbfile.OpenReadOnly(path, dbfile.Ledger)
	if err != nil {
		if checkErr && !errors.Is(err, dbfile.ErrNotExist) {
			return nil, fmt.Errorf("%w: %w", ErrSchema, err)
		}
		return nil, fmt.Errorf("ledger: %w", err)
	}
	return &Ledger{db: db}, nil
}

func (l *Ledger) init(state dbfile.State) error {
	tx, err := l.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		return err
	}
	// Another process may have created the file since the check.
	if state != dbfile.Current || v == 0 {
		if v > SchemaVersion {
			return fmt.Errorf("%w: file has schema version %d, this program knows %d", ErrSchema, v, SchemaVersion)
		}
		if _, err := tx.Exec(schema); err != nil {
			return fmt.Errorf("%w: %v", ErrSchema, err)
		}
		if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, SchemaVersion)); err != nil {
			return err
		}
		if _, err := tx.Exec(dbfile.Ledger.SetAppID()); err != nil {
			return err
		}
	}
	// A pre-existing table named entries with another shape fails here.
	if _, err := tx.Exec(`SELECT id, session, worker, bytes_in, bytes_out, rejected, final, time FROM entries LIMIT 0`); err != nil {
		return fmt.Errorf("%w: %v", ErrSchema, err)
	}
	return tx.Commit()
}

// Close closes the database.
func (l *Ledger) Close() error { return l.db.Close() }

// Validate checks that e can be appended: WorkerID is a 64-char lower-case
// hex key, SessionID is 1..MaxSessionLen bytes, and every byte count is at
// most 2^63-1. It returns an error wrapping ErrInvalid otherwise.
func Validate(e Entry) error {
	switch {
	case !walletapi.IsKeyHex(e.WorkerID):
		return fmt.Errorf("%w: worker id %q is not a 64-char lower-case hex key", ErrInvalid, e.WorkerID)
	case len(e.SessionID) == 0 || len(e.SessionID) > MaxSessionLen:
		return fmt.Errorf("%w: session id of %d bytes (want 1..%d)", ErrInvalid, len(e.SessionID), MaxSessionLen)
	case e.BytesIn > walletapi.MaxAmount || e.BytesOut > walletapi.MaxAmount || e.RejectedBytes > walletapi.MaxAmount:
		return fmt.Errorf("%w: byte count above 2^63-1", ErrInvalid)
	}
	if _, err := walletapi.AddAmount(e.BytesIn, e.BytesOut); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
}

// insertEntry appends one row; its arguments are insertArgs.
const insertEntry = `INSERT INTO entries (session, worker, bytes_in, bytes_out, rejected, final, time) VALUES (?, ?, ?, ?, ?, ?, ?)`

// insertArgs are the insertEntry arguments of a validated e (counts fit
// int64; time as Unix nanoseconds UTC).
func insertArgs(e Entry) []any {
	return []any{e.SessionID, e.WorkerID, int64(e.BytesIn), int64(e.BytesOut), int64(e.RejectedBytes), e.Final, e.Time.UTC().UnixNano()}
}

// Append records e durably (committed and fsynced when it returns nil). The
// ledger assigns e.ID; a zero e.Time is replaced by the current time. It
// implements the hub's Meter. Errors wrap ErrInvalid for a bad entry.
func (l *Ledger) Append(e Entry) error {
	_, err := l.Add(context.Background(), e)
	return err
}

// Add is Append that honours ctx and returns the assigned id.
func (l *Ledger) Add(ctx context.Context, e Entry) (int64, error) {
	if err := Validate(e); err != nil {
		return 0, err
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	res, err := l.db.ExecContext(ctx, insertEntry, insertArgs(e)...)
	if err != nil {
		return 0, fmt.Errorf("ledger: append: %w", err)
	}
	return res.LastInsertId()
}

// AppendAll records es in one transaction (one fsync): all or none. Use it
// to flush many sessions at once; a single Append costs one fsync (about
// 3.6 ms on the 2-core test machine under load), which bounds per-entry
// appends to a few hundred per second. Zero times become now; errors wrap
// ErrInvalid for a bad entry (nothing is recorded then).
func (l *Ledger) AppendAll(ctx context.Context, es []Entry) error {
	now := time.Now()
	for i := range es {
		if err := Validate(es[i]); err != nil {
			return fmt.Errorf("entry %d: %w", i, err)
		}
	}
	tx, err := l.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("ledger: append: %w", err)
	}
	defer tx.Rollback()
	for _, e := range es {
		if e.Time.IsZero() {
			e.Time = now
		}
		if _, err := tx.ExecContext(ctx, insertEntry, insertArgs(e)...); err != nil {
			return fmt.Errorf("ledger: append: %w", err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("ledger: append: %w", err)
	}
	return nil
}

// Since returns up to limit entries with id > afterID in increasing id
// order (limit <= 0 means DefaultLimit; capped at MaxLimit).
func (l *Ledger) Since(afterID int64, limit int) ([]Entry, error) {
	return l.Read(context.Background(), afterID, limit)
}

// Read implements Reader; see Since.
func (l *Ledger) Read(ctx context.Context, afterID int64, limit int) ([]Entry, error) {
	limit = clampLimit(limit)
	rows, err := l.db.QueryContext(ctx,
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

func clampLimit(limit int) int {
	if limit <= 0 {
		return DefaultLimit
	}
	return min(limit, MaxLimit)
}

// WorkerTotal is one worker's ledger totals. Bytes are the creditable bytes
// (BytesIn + BytesOut of all its entries); RejectedBytes are never paid.
type WorkerTotal struct {
	ID            string `json:"id"`             // hex ed25519 public key
	Bytes         uint64 `json:"bytes"`          // creditable bytes
	RejectedBytes uint64 `json:"rejected_bytes"` // rejected bytes
	Sessions      int    `json:"sessions"`       // distinct session ids
	Entries       int    `json:"entries"`        // rows
}

// Totals returns every worker's totals, ordered by worker id. A sum above
// 2^63-1 is an error (SQLite reports integer overflow).
func (l *Ledger) Totals() ([]WorkerTotal, error) {
	rows, err := l.db.Query(`SELECT worker, SUM(bytes_in) + SUM(bytes_out), SUM(rejected), COUNT(DISTINCT session), COUNT(*)
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

// LastID returns the largest id in the ledger (0 when empty).
func (l *Ledger) LastID() (int64, error) {
	var id sql.NullInt64
	if err := l.db.QueryRow(`SELECT MAX(id) FROM entries`).Scan(&id); err != nil {
		return 0, fmt.Errorf("ledger: %w", err)
	}
	return id.Int64, nil
}

// exec runs a raw statement; tests use it to prove the triggers hold.
func (l *Ledger) exec(q string, args ...any) error {
	_, err := l.db.Exec(q, args...)
	if err != nil && strings.Contains(err.Error(), "append-only") {
		return fmt.Errorf("%w: %v", ErrAppendOnly, err)
	}
	return err
}
