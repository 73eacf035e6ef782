package ledger

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/pgstore"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Sentinel errors. Every error returned by this package wraps one of these
// or a database error.
var (
	// ErrInvalid: an Entry that cannot be recorded (bad worker id, empty
	// session, a count above 2^63-1).
	ErrInvalid = errors.New("ledger: invalid entry")
	// ErrAppendOnly: an attempt to update or delete a row (refused by triggers).
	ErrAppendOnly = errors.New("ledger: rows are append-only")
	// ErrSchema: the file or database is not a ledger of this version.
	ErrSchema = errors.New("ledger: unsupported schema")
	// ErrConflict: an append carried a (SessionID, Seq) already recorded
	// with other contents; nothing of the batch was recorded.
	ErrConflict = errors.New("ledger: row already recorded with other contents")
)

// SchemaVersion is the SQLite ledger's schema version, stored in PRAGMA
// user_version (dbfile.Ledger.Version): 1, the entries table; 2, with each
// row's Seq (column seq, unique per session). PostgreSQL keeps its own in
// kvasir_schema_migrations (component "ledger", Migrations).
const SchemaVersion = 2

// MaxSessionLen bounds a session id, in bytes.
const MaxSessionLen = 128

// DefaultLimit and MaxLimit bound the number of entries one Since returns.
const (
	DefaultLimit = 1000
	MaxLimit     = 10000
)

// Store keeps a ledger's rows: an SQLite file or a PostgreSQL database.
// Both keep rows append-only in the database itself (triggers refuse
// UPDATE, DELETE and, on PostgreSQL, TRUNCATE) and assign ids that
// increase in commit order, so that a reader that has seen id N has seen
// every row below N that will ever exist (docs/accounting.md argues it for
// each). Methods are safe for concurrent use.
type Store interface {
	// Insert records es (already validated, times set) in one
	// transaction, all or none, durably once it returns nil, and returns
	// their ids in order. A row whose (SessionID, Seq) with Seq > 0 is
	// already recorded with the same contents is not added again (its id
	// is returned); with other contents the batch fails with ErrConflict.
	Insert(ctx context.Context, es []Entry) ([]int64, error)
	// Read returns up to limit (1..MaxLimit) rows with id > afterID in
	// increasing id order.
	Read(ctx context.Context, afterID int64, limit int) ([]Entry, error)
	// Totals returns every worker's totals ordered by worker id.
	Totals(ctx context.Context) ([]WorkerTotal, error)
	// LastID returns the largest id (0 when empty).
	LastID(ctx context.Context) (int64, error)
	// Kind is "sqlite" or "postgres".
	Kind() string
	// Close releases the store.
	Close() error
}

// Ledger is the hub's append-only contribution ledger over a Store: an
// SQLite file (WAL journal, synchronous=FULL), or a PostgreSQL database
// that several hubs append to at once. It validates entries before they
// reach the store. It is safe for concurrent use.
type Ledger struct {
	st           Store
	db           *sql.DB // the SQLite handle (nil on PostgreSQL); tests reach the file through it
	upgradedFrom int     // the SQLite file's schema version before this open upgraded it (0: none)
}

// UpgradedFrom returns the schema version an SQLite ledger had before
// Open upgraded it to SchemaVersion, or 0 when Open upgraded nothing (a
// current, new or PostgreSQL ledger; PostgreSQL logs its migrations).
func (l *Ledger) UpgradedFrom() int { return l.upgradedFrom }

var _ Reader = (*Ledger)(nil)

// Reader reads ledger entries with id > afterID in increasing id order, at
// most limit of them (limit <= 0 means DefaultLimit; capped at MaxLimit).
// *Ledger reads its store; *Client reads a hub over HTTP.
type Reader interface {
	Read(ctx context.Context, afterID int64, limit int) ([]Entry, error)
}

// Open opens the ledger named by path for appending: a PostgreSQL database
// when path is a postgres:// or postgresql:// URL (OpenPostgres), an SQLite
// file otherwise (OpenSQLite).
func Open(path string) (*Ledger, error) {
	if pgstore.IsURL(path) {
		return OpenPostgres(context.Background(), path)
	}
	return OpenSQLite(path)
}

// OpenReadOnly opens an existing ledger for reading only (Totals, Read,
// LastID): a PostgreSQL URL through read-only transactions, requiring the
// schema to be at this program's version; an SQLite file as
// OpenSQLiteReadOnly. Appends on the result fail.
func OpenReadOnly(path string) (*Ledger, error) {
	if pgstore.IsURL(path) {
		return OpenPostgresReadOnly(context.Background(), path)
	}
	return OpenSQLiteReadOnly(path)
}

// New returns a Ledger over st.
func New(st Store) *Ledger { return &Ledger{st: st} }

// Store returns the ledger's store.
func (l *Ledger) Store() Store { return l.st }

// Close closes the store.
func (l *Ledger) Close() error { return l.st.Close() }

// Validate checks that e can be appended: WorkerID is a 64-char lower-case
// hex key, SessionID is 1..MaxSessionLen bytes, and every byte count (and
// Seq) is at most 2^63-1. It returns an error wrapping ErrInvalid otherwise.
func Validate(e Entry) error {
	switch {
	case !walletapi.IsKeyHex(e.WorkerID):
		return fmt.Errorf("%w: worker id %q is not a 64-char lower-case hex key", ErrInvalid, e.WorkerID)
	case len(e.SessionID) == 0 || len(e.SessionID) > MaxSessionLen:
		return fmt.Errorf("%w: session id of %d bytes (want 1..%d)", ErrInvalid, len(e.SessionID), MaxSessionLen)
	case e.BytesIn > walletapi.MaxAmount || e.BytesOut > walletapi.MaxAmount || e.RejectedBytes > walletapi.MaxAmount:
		return fmt.Errorf("%w: byte count above 2^63-1", ErrInvalid)
	case e.Seq > walletapi.MaxAmount:
		return fmt.Errorf("%w: seq above 2^63-1", ErrInvalid)
	}
	if _, err := walletapi.AddAmount(e.BytesIn, e.BytesOut); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return nil
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
	ids, err := l.st.Insert(ctx, []Entry{e})
	if err != nil {
		return 0, err
	}
	return ids[0], nil
}

// AppendAll records es in one transaction (one fsync): all or none. Use it
// to flush many sessions at once; a single Append costs one fsync (about
// 3.6 ms on the 2-core test machine under load), which bounds per-entry
// appends to a few hundred per second. Zero times become now; errors wrap
// ErrInvalid for a bad entry (nothing is recorded then). On PostgreSQL an
// error may follow a commit whose answer was lost; calling AppendAll again
// with the same rows (same SessionID and Seq > 0) records them once.
func (l *Ledger) AppendAll(ctx context.Context, es []Entry) error {
	_, err := l.AppendAllIDs(ctx, es)
	return err
}

// AppendAllIDs is AppendAll returning the ids of es in order.
func (l *Ledger) AppendAllIDs(ctx context.Context, es []Entry) ([]int64, error) {
	now := time.Now()
	for i := range es {
		if err := Validate(es[i]); err != nil {
			return nil, fmt.Errorf("entry %d: %w", i, err)
		}
	}
	if len(es) == 0 {
		return nil, nil
	}
	batch := make([]Entry, len(es))
	for i, e := range es {
		if e.Time.IsZero() {
			e.Time = now
		}
		batch[i] = e
	}
	return l.st.Insert(ctx, batch)
}

// Since returns up to limit entries with id > afterID in increasing id
// order (limit <= 0 means DefaultLimit; capped at MaxLimit).
func (l *Ledger) Since(afterID int64, limit int) ([]Entry, error) {
	return l.Read(context.Background(), afterID, limit)
}

// Read implements Reader; see Since.
func (l *Ledger) Read(ctx context.Context, afterID int64, limit int) ([]Entry, error) {
	return l.st.Read(ctx, afterID, clampLimit(limit))
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
// 2^63-1 is an error.
func (l *Ledger) Totals() ([]WorkerTotal, error) { return l.st.Totals(context.Background()) }

// LastID returns the largest id in the ledger (0 when empty).
func (l *Ledger) LastID() (int64, error) { return l.st.LastID(context.Background()) }

// execer is implemented by both stores: a raw statement, for tests that
// prove the database refuses what the code never does.
type execer interface {
	exec(q string, args ...any) error
}

// exec runs a raw statement; tests use it to prove the triggers hold.
// Errors from the append-only triggers wrap ErrAppendOnly.
func (l *Ledger) exec(q string, args ...any) error {
	x, ok := l.st.(execer)
	if !ok {
		return errors.New("ledger: store runs no raw statements")
	}
	return x.exec(q, args...)
}
