// Package credit is the gateway's crediting service: it polls the hub's
// contribution ledger and credits each worker's wallet exactly once, in
// integer nKVR, signing a statement per credit that the worker can verify;
// and it serves those statements to their worker only (Handler).
//
// Exactly once: the wallets file holds one cursor, the id of the last
// ledger row credited. One SQLite transaction adds the delta of rows
// (cursor, last] to the wallets, writes the statements and moves the cursor
// to last. A crash before the commit leaves nothing; after it, everything.
// Ledger ids only grow and rows never change, so no row is paid twice or
// skipped. See docs/accounting.md.
package credit

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Sentinel errors; returned errors wrap one of these or a database error.
var (
	// ErrSchema: the wallets file is of a newer or foreign schema.
	ErrSchema = errors.New("credit: unsupported wallets schema")
	// ErrSource: the ledger source returned rows that break its contract
	// (ids not strictly increasing above the cursor, invalid rows).
	ErrSource = errors.New("credit: bad ledger rows")
	// ErrConflict: another process moved the cursor between the read of the
	// ledger and the transaction; the batch was not credited (retry).
	ErrConflict = errors.New("credit: cursor moved concurrently")
)

// SchemaVersion of the wallets file, kept in PRAGMA user_version.
const SchemaVersion = 1

// DefaultBatch is the number of ledger rows credited per transaction.
const DefaultBatch = 1000

const schema = `
CREATE TABLE IF NOT EXISTS meta (k TEXT PRIMARY KEY, v BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS cursor (one INTEGER PRIMARY KEY CHECK (one = 1), last_id INTEGER NOT NULL CHECK (last_id >= 0));
INSERT OR IGNORE INTO cursor (one, last_id) VALUES (1, 0);
CREATE TABLE IF NOT EXISTS wallets (
	worker     TEXT PRIMARY KEY CHECK (length(worker) = 64),
	bytes      INTEGER NOT NULL CHECK (bytes >= 0),
	nkvr       INTEGER NOT NULL CHECK (nkvr >= 0),
	rejected   INTEGER NOT NULL CHECK (rejected >= 0),
	statements INTEGER NOT NULL CHECK (statements >= 0),
	updated    INTEGER NOT NULL -- unix ms
);
CREATE TABLE IF NOT EXISTS statements (
	worker       TEXT    NOT NULL,
	n            INTEGER NOT NULL,
	ledger_after INTEGER NOT NULL,
	ledger_upto  INTEGER NOT NULL,
	bytes        INTEGER NOT NULL,
	nkvr         INTEGER NOT NULL,
	body         BLOB    NOT NULL,
	sig          BLOB    NOT NULL,
	PRIMARY KEY (worker, n)
);
CREATE TRIGGER IF NOT EXISTS statements_no_update BEFORE UPDATE ON statements
	BEGIN SELECT RAISE(ABORT, 'credit: statements are append-only'); END;
CREATE TRIGGER IF NOT EXISTS statements_no_delete BEFORE DELETE ON statements
	BEGIN SELECT RAISE(ABORT, 'credit: statements are append-only'); END;
`

// Config configures Open.
type Config struct {
	Path            string        // wallets SQLite file (created 0600 if missing)
	Source          ledger.Reader // the hub's ledger (ledger.Client) or a local *ledger.Ledger
	RateNKVRPerByte uint64        // price in nKVR per creditable byte; 0 means walletapi.DefaultRateNKVRPerByte
	Batch           int           // ledger rows per transaction; <= 0 means DefaultBatch
}

// Service credits workers from a ledger into the wallets file. Methods are
// safe for concurrent use; several processes may share one file (the
// cursor check in each transaction keeps crediting exactly once).
type Service struct {
	db    *sql.DB
	src   ledger.Reader
	rate  uint64
	batch int
	key   ed25519.PrivateKey
	now   func() time.Time

	// beforeCommit, when set (tests), runs inside the credit transaction
	// just before COMMIT; an error aborts the transaction like a crash.
	beforeCommit func() error
}

// Open opens or creates the wallets file and its gateway signing key. The
// file is first checked through a read-only connection (dbfile.Check): a
// corrupt file, a file of another kind (application_id, tables) or of a
// newer schema is refused with an error wrapping ErrSchema and the dbfile
// error (dbfile.ErrCorrupt, ErrForeign, ErrNewerSchema), and left byte for
// byte as it was. A new or empty file gets the schema, user_version =
// SchemaVersion and application_id = dbfile.AppIDGatewayWallets; a
// wallets file written before application ids (id 0, version 1, exactly
// its four tables) is adopted by setting the id.
func Open(cfg Config) (*Service, error) {
	if cfg.RateNKVRPerByte == 0 {
		cfg.RateNKVRPerByte = walletapi.DefaultRateNKVRPerByte
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	if _, err := dbfile.Check(cfg.Path, dbfile.GatewayWallets); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	if err := dbfile.CreateEmpty(cfg.Path); err != nil {
		return nil, fmt.Errorf("credit: create %s: %w", cfg.Path, err)
	}
	dsn, err := dbfile.DSN(cfg.Path, "_journal_mode=WAL", "_synchronous=FULL", "_busy_timeout=10000", "_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("credit: %w", err)
	}
	db, err := sql.Open("sqlite3", dsn)
	if err != nil {
		return nil, fmt.Errorf("credit: open %s: %w", cfg.Path, err)
	}
	s := &Service{db: db, src: cfg.Source, rate: cfg.RateNKVRPerByte, batch: cfg.Batch, now: time.Now}
	if err := s.init(); err != nil {
		db.Close()
		return nil, fmt.Errorf("credit: open %s: %w", cfg.Path, err)
	}
	return s, nil
}

// OpenReadOnly opens an existing wallets file to read it (PublicKey,
// Cursor, Wallets, Statements); it never writes to path nor leaves
// -wal/-shm files that were not there (dbfile.ReadOnlyDSN). Crediting
// through the result fails. A missing file gives an error wrapping
// dbfile.ErrNotExist; an empty, corrupt, foreign or newer file one
// wrapping ErrSchema and the dbfile error.
func OpenReadOnly(path string) (*Service, error) {
	db, checkErr, err := dbfile.OpenReadOnly(path, dbfile.GatewayWallets)
	if err != nil {
		if checkErr && !errors.Is(err, dbfile.ErrNotExist) {
			return nil, fmt.Errorf("%w: %w", ErrSchema, err)
		}
		return nil, fmt.Errorf("credit: %w", err)
	}
	s := &Service{db: db, rate: walletapi.DefaultRateNKVRPerByte, batch: DefaultBatch, now: time.Now}
	var seed []byte
	if err := db.QueryRow(`SELECT v FROM meta WHERE k = 'signing_seed'`).Scan(&seed); err != nil || len(seed) != ed25519.SeedSize {
		db.Close()
		return nil, fmt.Errorf("%w: %s: no valid signing seed (%v)", ErrSchema, path, err)
	}
	s.key = ed25519.NewKeyFromSeed(seed)
	return s, nil
}

func (s *Service) init() error {
	tx, err := s.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		return err
	}
	if v > SchemaVersion { // another process may have written it since the check
		return fmt.Errorf("%w: file has version %d, this program knows %d", ErrSchema, v, SchemaVersion)
	}
	if _, err := tx.Exec(schema); err != nil {
		return fmt.Errorf("%w: %v", ErrSchema, err)
	}
	if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, SchemaVersion)); err != nil {
		return err
	}
	if _, err := tx.Exec(dbfile.GatewayWallets.SetAppID()); err != nil {
		return err
	}
	var seed []byte
	err = tx.QueryRow(`SELECT v FROM meta WHERE k = 'signing_seed'`).Scan(&seed)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		seed = make([]byte, ed25519.SeedSize)
		if _, err := rand.Read(seed); err != nil {
			return err
		}
		if _, err := tx.Exec(`INSERT INTO meta (k, v) VALUES ('signing_seed', ?)`, seed); err != nil {
			return err
		}
	case err != nil:
		return fmt.Errorf("%w: %v", ErrSchema, err)
	case len(seed) != ed25519.SeedSize:
		return fmt.Errorf("%w: signing seed is %d bytes", ErrSchema, len(seed))
	}
	s.key = ed25519.NewKeyFromSeed(seed)
	return tx.Commit()
}

// Close closes the wallets file.
func (s *Service) Close() error { return s.db.Close() }

// PublicKey returns the gateway's statement-signing public key.
func (s *Service) PublicKey() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Rate returns the configured price in nKVR per creditable byte.
func (s *Service) Rate() uint64 { return s.rate }

// Cursor returns the id of the last ledger row credited (0: none).
func (s *Service) Cursor() (int64, error) {
	var c int64
	if err := s.db.QueryRow(`SELECT last_id FROM cursor WHERE one = 1`).Scan(&c); err != nil {
		return 0, fmt.Errorf("credit: cursor: %w", err)
	}
	return c, nil
}

// Result summarises one Credit call.
type Result struct {
	Rows       int    // ledger rows consumed
	Statements int    // statements written
	Bytes      uint64 // creditable bytes credited
	NKVR       uint64 // nKVR credited
	Cursor     int64  // cursor after the call
}

// Credit credits every ledger row after the cursor, one transaction per
// batch, until the source has no more rows. On error the rows of the
// failed batch stay uncredited (the cursor is where the last commit left
// it) and the next call resumes there.
func (s *Service) Credit(ctx context.Context) (Result, error) {
	var total Result
	for {
		r, err := s.CreditBatch(ctx)
		total.Rows += r.Rows
		total.Statements += r.Statements
		total.Bytes += r.Bytes
		total.NKVR += r.NKVR
		total.Cursor = r.Cursor
		if errors.Is(err, ErrConflict) {
			continue
		}
		if err != nil || r.Rows == 0 {
			return total, err
		}
	}
}

type acc struct{ bytes, rejected uint64 }

// CreditBatch credits at most one batch of ledger rows after the cursor in
// one transaction. It returns Result.Rows == 0 when there was nothing to do.
func (s *Service) CreditBatch(ctx context.Context) (Result, error) {
	cur, err := s.Cursor()
	if err != nil {
		return Result{}, err
	}
	es, err := s.src.Read(ctx, cur, s.batch)
	if err != nil {
		return Result{Cursor: cur}, fmt.Errorf("credit: read ledger after %d: %w", cur, err)
	}
	if len(es) == 0 {
		return Result{Cursor: cur}, nil
	}
	per := map[string]*acc{}
	prev := cur
	for _, e := range es {
		if e.ID <= prev {
			return Result{Cursor: cur}, fmt.Errorf("%w: id %d after %d", ErrSource, e.ID, prev)
		}
		prev = e.ID
		if err := ledger.Validate(e); err != nil {
			return Result{Cursor: cur}, fmt.Errorf("%w: id %d: %v", ErrSource, e.ID, err)
		}
		a := per[e.WorkerID]
		if a == nil {
			a = &acc{}
			per[e.WorkerID] = a
		}
		b := e.BytesIn + e.BytesOut // Validate bounded the sum
		if a.bytes, err = walletapi.AddAmount(a.bytes, b); err != nil {
			return Result{Cursor: cur}, fmt.Errorf("%w: %v", ErrSource, err)
		}
		if a.rejected, err = walletapi.AddAmount(a.rejected, e.RejectedBytes); err != nil {
			return Result{Cursor: cur}, fmt.Errorf("%w: %v", ErrSource, err)
		}
	}
	last := es[len(es)-1].ID
	res, err := s.commit(ctx, cur, last, per)
	if err != nil {
		return Result{Cursor: cur}, err
	}
	res.Rows = len(es)
	return res, nil
}

func (s *Service) commit(ctx context.Context, cur, last int64, per map[string]*acc) (Result, error) {
	tx, err := s.db.BeginTx(ctx, nil) // BEGIN IMMEDIATE (_txlock): takes the write lock now
	if err != nil {
		return Result{}, fmt.Errorf("credit: begin: %w", err)
	}
	defer tx.Rollback()
	var got int64
	if err := tx.QueryRowContext(ctx, `SELECT last_id FROM cursor WHERE one = 1`).Scan(&got); err != nil {
		return Result{}, fmt.Errorf("credit: cursor: %w", err)
	}
	if got != cur {
		return Result{}, fmt.Errorf("%w: expected %d, found %d", ErrConflict, cur, got)
	}
	workers := make([]string, 0, len(per))
	for w := range per {
		workers = append(workers, w)
	}
	sort.Strings(workers)
	now := s.now()
	res := Result{Cursor: last}
	for _, w := range workers {
		a := per[w]
		if a.bytes == 0 && a.rejected == 0 {
			continue // only overhead rows: nothing to say
		}
		var cb, cn, cr, n int64
		err := tx.QueryRowContext(ctx, `SELECT bytes, nkvr, rejected, statements FROM wallets WHERE worker = ?`, w).Scan(&cb, &cn, &cr, &n)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return Result{}, fmt.Errorf("credit: wallet %s: %w", w, err)
		}
		nkvr, err := walletapi.NKVR(a.bytes, s.rate)
		if err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		st := walletapi.Statement{
			Worker: w, N: uint64(n) + 1, LedgerAfter: cur, LedgerUpTo: last,
			Bytes: a.bytes, RejectedBytes: a.rejected, RateNKVRPerByte: s.rate, NKVR: nkvr,
			TimeUnixMilli: now.UnixMilli(),
		}
		if st.CumulativeBytes, err = walletapi.AddAmount(uint64(cb), a.bytes); err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		if st.CumulativeNKVR, err = walletapi.AddAmount(uint64(cn), nkvr); err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		rej, err := walletapi.AddAmount(uint64(cr), a.rejected)
		if err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		signed, err := walletapi.Sign(s.key, st)
		if err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO wallets (worker, bytes, nkvr, rejected, statements, updated) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (worker) DO UPDATE SET bytes = excluded.bytes, nkvr = excluded.nkvr, rejected = excluded.rejected,
			statements = excluded.statements, updated = excluded.updated`,
			w, int64(st.CumulativeBytes), int64(st.CumulativeNKVR), int64(rej), int64(st.N), now.UnixMilli()); err != nil {
			return Result{}, fmt.Errorf("credit: wallet %s: %w", w, err)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO statements (worker, n, ledger_after, ledger_upto, bytes, nkvr, body, sig) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			w, int64(st.N), cur, last, int64(a.bytes), int64(nkvr), signed.Body, signed.Sig); err != nil {
			return Result{}, fmt.Errorf("credit: statement %s/%d: %w", w, st.N, err)
		}
		res.Statements++
		res.Bytes += a.bytes
		res.NKVR += nkvr
	}
	if _, err := tx.ExecContext(ctx, `UPDATE cursor SET last_id = ? WHERE one = 1`, last); err != nil {
		return Result{}, fmt.Errorf("credit: cursor: %w", err)
	}
	if s.beforeCommit != nil {
		if err := s.beforeCommit(); err != nil {
			return Result{}, err
		}
	}
	if err := tx.Commit(); err != nil {
		return Result{}, fmt.Errorf("credit: commit: %w", err)
	}
	return res, nil
}

// Wallet is one worker's credited totals on the gateway.
type Wallet struct {
	Worker        string `json:"worker"`         // hex ed25519 public key
	Bytes         uint64 `json:"bytes"`          // creditable bytes credited
	NKVR          uint64 `json:"nkvr"`           // nKVR credited
	RejectedBytes uint64 `json:"rejected_bytes"` // rejected bytes seen (never paid)
	Statements    uint64 `json:"statements"`     // statements issued (the last N)
}

// Wallets returns every worker's totals ordered by worker id.
func (s *Service) Wallets() ([]Wallet, error) {
	rows, err := s.db.Query(`SELECT worker, bytes, nkvr, rejected, statements FROM wallets ORDER BY worker`)
	if err != nil {
		return nil, fmt.Errorf("credit: wallets: %w", err)
	}
	defer rows.Close()
	var out []Wallet
	for rows.Next() {
		var w Wallet
		var b, n, r, c int64
		if err := rows.Scan(&w.Worker, &b, &n, &r, &c); err != nil {
			return nil, fmt.Errorf("credit: wallets: %w", err)
		}
		w.Bytes, w.NKVR, w.RejectedBytes, w.Statements = uint64(b), uint64(n), uint64(r), uint64(c)
		out = append(out, w)
	}
	return out, rows.Err()
}

// Statements returns up to limit (1..walletapi.MaxPage) signed statements
// of worker with N > after in increasing N, and whether more exist.
func (s *Service) Statements(ctx context.Context, worker string, after uint64, limit int) ([]walletapi.Signed, bool, error) {
	if limit < 1 || limit > walletapi.MaxPage {
		limit = walletapi.MaxPage
	}
	if after > walletapi.MaxAmount {
		return nil, false, nil
	}
	rows, err := s.db.QueryContext(ctx, `SELECT body, sig FROM statements WHERE worker = ? AND n > ? ORDER BY n LIMIT ?`, worker, int64(after), limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("credit: statements: %w", err)
	}
	defer rows.Close()
	var out []walletapi.Signed
	for rows.Next() {
		var sg walletapi.Signed
		if err := rows.Scan(&sg.Body, &sg.Sig); err != nil {
			return nil, false, fmt.Errorf("credit: statements: %w", err)
		}
		out = append(out, sg)
	}
	if err := rows.Err(); err != nil {
		return nil, false, fmt.Errorf("credit: statements: %w", err)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

// Run credits every interval until ctx is done, reporting errors (which
// are retried on the next tick) to logf when it is not nil. It returns
// ctx.Err().
func (s *Service) Run(ctx context.Context, interval time.Duration, logf func(format string, args ...any)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := s.Credit(ctx); err != nil && logf != nil && ctx.Err() == nil {
			logf("credit: %v", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
