// Package credit is the gateway's crediting service: it polls the hub's
// contribution ledger and credits each worker's wallet exactly once, in
// integer nKVR, signing a statement per credit that the worker can verify;
// and it serves those statements to their worker only (Handler).
//
// Exactly once: the wallets store (an SQLite file, or a PostgreSQL
// database several gateways share) holds one cursor, the id of the last
// ledger row credited. One transaction adds the delta of rows (cursor,
// last] to the wallets, writes the statements and moves the cursor to
// last. A crash before the commit leaves nothing; after it, everything.
// Ledger ids only grow, in commit order, and rows never change, so no row
// is paid twice or skipped. See docs/accounting.md.
package credit

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Sentinel errors; returned errors wrap one of these or a database error.
var (
	// ErrSchema: the wallets file or database is of a newer or foreign schema.
	ErrSchema = errors.New("credit: unsupported wallets schema")
	// ErrSource: the ledger source returned rows that break its contract
	// (ids not strictly increasing above the cursor, invalid rows).
	ErrSource = errors.New("credit: bad ledger rows")
	// ErrConflict: another process moved the cursor between the read of the
	// ledger and the transaction; the batch was not credited (retry).
	ErrConflict = errors.New("credit: cursor moved concurrently")
	// ErrLedgerBehind: the wallets' cursor names a ledger row the ledger
	// does not hold (a ledger restored from an older backup, recreated,
	// or another hub's): crediting from it would skip its rows up to the
	// cursor for good, so it stops until the files match.
	ErrLedgerBehind = errors.New("credit: the wallets were credited past this ledger's rows")
)

// cursorCheckEvery is how often an idle crediting pass checks that the
// ledger holds the cursor's row (checkCursorRow).
const cursorCheckEvery = 10 * time.Second

// SchemaVersion of the wallets SQLite file, kept in PRAGMA user_version
// (the cursor row's fingerprint is a meta key there). The PostgreSQL
// schema's version, in kvasir_schema_migrations (component "wallets"), is
// len(Migrations).
const SchemaVersion = 1

// DefaultBatch is the number of ledger rows credited per transaction.
const DefaultBatch = 1000

// Config configures Open.
type Config struct {
	// Path is the wallets SQLite file (created 0600 if missing), or a
	// postgres:// URL of a database several gateways share.
	Path            string
	Source          ledger.Reader // the hub's ledger (ledger.Client) or a local *ledger.Ledger
	RateNKVRPerByte uint64        // price in nKVR per creditable byte; 0 means walletapi.DefaultRateNKVRPerByte
	Batch           int           // ledger rows per transaction; <= 0 means DefaultBatch
}

// Service credits workers from a ledger into a Store. Methods are safe for
// concurrent use; several processes may share one store (the cursor check
// in each transaction keeps crediting exactly once).
type Service struct {
	st    Store
	src   ledger.Reader
	rate  uint64
	batch int
	key   ed25519.PrivateKey
	now   func() time.Time
	stats stats
	// created: this Open made the store's signing seed (a new store).
	created bool
	// checked is when checkCursorRow last passed, unix ns (0: never).
	checked atomic.Int64
	// runErr is the error of Run's last pass, nil after one that credited
	// (CreditError).
	runErr atomic.Pointer[error]

	// beforeCommit, when set (tests), runs inside the credit transaction
	// just before COMMIT; an error aborts the transaction like a crash.
	beforeCommit func() error
}

// Open opens or creates the wallets store named by cfg.Path and its
// gateway signing key: a PostgreSQL database for a postgres:// URL
// (schema migrations applied; a newer or different schema refused with an
// error wrapping ErrSchema and left as it was), an SQLite file otherwise.
// The file is first checked through a read-only connection (dbfile.Check):
// a corrupt file, a file of another kind (application_id, tables) or of a
// newer schema is refused with an error wrapping ErrSchema and the dbfile
// error (dbfile.ErrCorrupt, ErrForeign, ErrNewerSchema), and left byte for
// byte as it was. A new or empty file gets the schema, user_version =
// SchemaVersion and application_id = dbfile.AppIDGatewayWallets; a
// wallets file written before application ids (id 0, version 1, exactly
// its four tables) is adopted by setting the id.
func Open(cfg Config) (*Service, error) {
	var st Store
	var err error
	if pgstore.IsURL(cfg.Path) {
		st, err = openPostgres(context.Background(), cfg.Path)
	} else {
		st, err = openSQLite(cfg.Path)
	}
	if err != nil {
		return nil, err
	}
	s, err := New(st, cfg)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("credit: open %s: %w", pgstore.RedactPath(cfg.Path), err)
	}
	return s, nil
}

// New returns a Service over st, creating the gateway's signing seed in st
// when it holds none. The Service owns st (Close closes it).
func New(st Store, cfg Config) (*Service, error) {
	if cfg.RateNKVRPerByte == 0 {
		cfg.RateNKVRPerByte = walletapi.DefaultRateNKVRPerByte
	}
	if cfg.Batch <= 0 {
		cfg.Batch = DefaultBatch
	}
	fresh := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(fresh); err != nil {
		return nil, err
	}
	seed, err := st.Seed(context.Background(), fresh)
	if err != nil {
		return nil, err
	}
	if len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%w: signing seed is %d bytes", ErrSchema, len(seed))
	}
	return &Service{st: st, src: cfg.Source, rate: cfg.RateNKVRPerByte, batch: cfg.Batch, now: time.Now,
		key: ed25519.NewKeyFromSeed(seed), created: bytes.Equal(seed, fresh)}, nil
}

// Created reports whether this Service's Open or New made the store's
// signing seed: the store is new and will credit the ledger from its
// first row. Two stores crediting one ledger pay its rows twice (the
// exactly-once rule is per store), so a gateway says so when it starts on
// a new store (StartFromHub).
func (s *Service) Created() bool { return s.created }

// OpenReadOnly opens an existing wallets store to read it (PublicKey,
// Cursor, Wallets, Statements); crediting through the result fails. An
// SQLite file is never written to, nor are -wal/-shm files left that were
// not there (dbfile.ReadOnlyDSN): a missing file gives an error wrapping
// dbfile.ErrNotExist; an empty, corrupt, foreign or newer file one
// wrapping ErrSchema and the dbfile error. A PostgreSQL database is read
// through read-only transactions and must hold the wallets schema of this
// version (ErrSchema otherwise).
func OpenReadOnly(path string) (*Service, error) {
	var st Store
	var seed []byte
	var err error
	if pgstore.IsURL(path) {
		var p *pgStore
		if p, err = openPostgresReadOnly(context.Background(), path); err != nil {
			return nil, err
		}
		st = p
		seed, err = p.Seed(context.Background(), nil)
	} else {
		var q *sqliteStore
		if q, err = openSQLiteReadOnly(path); err != nil {
			return nil, err
		}
		st = q
		seed, err = q.readSeed(context.Background())
	}
	if err != nil || len(seed) != ed25519.SeedSize {
		st.Close()
		return nil, fmt.Errorf("%w: %s: no valid signing seed (%v)", ErrSchema, pgstore.RedactPath(path), err)
	}
	return &Service{st: st, rate: walletapi.DefaultRateNKVRPerByte, batch: DefaultBatch, now: time.Now,
		key: ed25519.NewKeyFromSeed(seed)}, nil
}

// Close closes the store.
func (s *Service) Close() error { return s.st.Close() }

// Store returns the service's store.
func (s *Service) Store() Store { return s.st }

// PublicKey returns the gateway's statement-signing public key.
func (s *Service) PublicKey() ed25519.PublicKey { return s.key.Public().(ed25519.PublicKey) }

// Rate returns the configured price in nKVR per creditable byte.
func (s *Service) Rate() uint64 { return s.rate }

// Cursor returns the id of the last ledger row credited (0: none).
func (s *Service) Cursor() (int64, error) {
	c, err := s.st.Cursor(context.Background())
	if err != nil {
		return 0, fmt.Errorf("credit: cursor: %w", err)
	}
	return c, nil
}

// Ping reports whether the wallets store answers: it reads the cursor
// within ctx. Errors name the store ("wallets store (sqlite): ...").
func (s *Service) Ping(ctx context.Context) error {
	if _, err := s.st.Cursor(ctx); err != nil {
		return fmt.Errorf("wallets store (%s): %w", s.st.Kind(), err)
	}
	return nil
}

// PingLedger reports whether the ledger source answers: it reads at most
// one row after the cursor within ctx (for the hub's ledger, one signed
// HTTP request, so a wrong shared secret fails here too). Errors: the
// store's, as Ping words them, or the source's as it returned them
// (ledger.Client: "ledger: ..."); a service without a source
// (OpenReadOnly) fails.
func (s *Service) PingLedger(ctx context.Context) error {
	if s.src == nil {
		return errors.New("credit: no ledger source")
	}
	cur, err := s.st.Cursor(ctx)
	if err != nil {
		return fmt.Errorf("wallets store (%s): %w", s.st.Kind(), err)
	}
	if _, err := s.src.Read(ctx, cur, 1); err != nil {
		return err
	}
	return s.checkCursorRow(ctx)
}

// RowPrint is the fingerprint of a ledger row that the wallets store
// keeps with the cursor: the SHA-256 of its id, session, worker and byte
// counts (not its time, which the two ledger backends keep at different
// precisions). Session ids are unique per bridged connection, so a row of
// another ledger at the same id has another print.
func RowPrint(e ledger.Entry) []byte {
	h := sha256.New()
	fmt.Fprintf(h, "kvasir ledger row\x00%d\x00%s\x00%s\x00%d\x00%d\x00%d\x00%t\x00%d",
		e.ID, e.SessionID, e.WorkerID, e.BytesIn, e.BytesOut, e.RejectedBytes, e.Final, e.Seq)
	return h.Sum(nil)
}

// checkCursorRow reports ErrLedgerBehind (wrapped, naming the cursor) when
// the ledger does not hold row cur, the last one credited (cur > 0), or
// holds another row there than the one credited (its RowPrint differs
// from the one stored with the cursor): the ledger is not the one the
// wallets were credited from (a backup restored and grown past the cursor
// again, another hub's). Ledger ids only grow and rows never change, so
// the row of a matching ledger is there, the same. A cursor stored before
// fingerprints (print nil) is checked for the row's presence only, until
// the next credit stores one. The check runs at every readiness probe and
// at least every cursorCheckEvery while crediting.
func (s *Service) checkCursorRow(ctx context.Context) error {
	cur, print, err := s.st.CursorRow(ctx)
	if err != nil {
		return fmt.Errorf("wallets store (%s): %w", s.st.Kind(), err)
	}
	if cur <= 0 {
		s.checked.Store(s.now().UnixNano())
		return nil
	}
	es, err := s.src.Read(ctx, cur-1, 1)
	if err != nil {
		return err
	}
	if len(es) != 1 || es[0].ID != cur {
		return fmt.Errorf("%w: the cursor is at ledger id %d, a row this ledger does not hold (restored from an older backup, recreated, or another hub's?); crediting stops until the wallets and the ledger match (docs/operating.md, Backups)", ErrLedgerBehind, cur)
	}
	if print != nil && !bytes.Equal(print, RowPrint(es[0])) {
		return fmt.Errorf("%w: the cursor is at ledger id %d, and this ledger's row %d (session %s, worker %s) is not the row credited (a ledger restored from an older backup and grown again, or another hub's?); crediting stops until the wallets and the ledger match (docs/operating.md, Backups)", ErrLedgerBehind, cur, cur, es[0].SessionID, es[0].WorkerID)
	}
	s.checked.Store(s.now().UnixNano())
	return nil
}

// CreditError is the error of Run's last crediting pass when it failed
// (a wallets store that refuses writes: a full disk, a read-only file; a
// ledger the hub does not serve), nil after a pass that worked; the
// gateway's /readyz reports it (check "crediting"), as reads alone pass
// on a full disk.
func (s *Service) CreditError(context.Context) error {
	if e := s.runErr.Load(); e != nil {
		return *e
	}
	return nil
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
// it) and the next call resumes there. It updates the lag statistics
// (Stats): the uncredited rows this pass found and the age of the oldest.
func (s *Service) Credit(ctx context.Context) (Result, error) {
	var total Result
	p := pass{start: s.now()}
	defer func() { s.stats.endPass(p, s.now()) }()
	for {
		r, err := s.creditBatch(ctx, &p)
		total.Rows += r.Rows
		total.Statements += r.Statements
		total.Bytes += r.Bytes
		total.NKVR += r.NKVR
		total.Cursor = r.Cursor
		if errors.Is(err, ErrConflict) {
			s.stats.conflicts.Add(1)
			continue
		}
		if err != nil {
			s.stats.errors.Add(1)
			p.failed = true
			return total, err
		}
		if r.Rows == 0 {
			return total, nil
		}
	}
}

type acc struct{ bytes, rejected uint64 }

// CreditBatch credits at most one batch of ledger rows after the cursor in
// one transaction. It returns Result.Rows == 0 when there was nothing to do.
func (s *Service) CreditBatch(ctx context.Context) (Result, error) {
	return s.creditBatch(ctx, nil)
}

func (s *Service) creditBatch(ctx context.Context, p *pass) (Result, error) {
	cur, err := s.Cursor()
	if err != nil {
		return Result{}, err
	}
	if time.Duration(s.now().UnixNano()-s.checked.Load()) >= cursorCheckEvery {
		if err := s.checkCursorRow(ctx); err != nil {
			return Result{Cursor: cur}, err
		}
	}
	es, err := s.src.Read(ctx, cur, s.batch)
	if err != nil {
		return Result{Cursor: cur}, fmt.Errorf("credit: read ledger after %d: %w", cur, err)
	}
	if p != nil {
		p.saw(cur, es)
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
	res, err := s.commit(ctx, cur, last, RowPrint(es[len(es)-1]), per)
	if err != nil {
		return Result{Cursor: cur}, err
	}
	res.Rows = len(es)
	s.stats.committed(res, es, s.now())
	return res, nil
}

func (s *Service) commit(ctx context.Context, cur, last int64, lastPrint []byte, per map[string]*acc) (Result, error) {
	tx, err := s.st.Begin(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("credit: begin: %w", err)
	}
	defer tx.Rollback()
	got, err := tx.LockCursor(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("credit: cursor: %w", err)
	}
	if got != cur {
		return Result{}, fmt.Errorf("%w: expected %d, found %d", ErrConflict, cur, got)
	}
	workers := make([]string, 0, len(per))
	for w, a := range per {
		if a.bytes == 0 && a.rejected == 0 {
			continue // only overhead rows: nothing to say
		}
		workers = append(workers, w)
	}
	sort.Strings(workers)
	prevs, err := tx.Wallets(ctx, workers)
	if err != nil {
		return Result{}, fmt.Errorf("credit: %w", err)
	}
	now := s.now()
	res := Result{Cursor: last}
	ws := make([]Wallet, 0, len(workers))
	sts := make([]StatementRow, 0, len(workers))
	for _, w := range workers {
		a := per[w]
		prev := prevs[w]
		nkvr, err := walletapi.NKVR(a.bytes, s.rate)
		if err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		st := walletapi.Statement{
			Worker: w, N: prev.Statements + 1, LedgerAfter: cur, LedgerUpTo: last,
			Bytes: a.bytes, RejectedBytes: a.rejected, RateNKVRPerByte: s.rate, NKVR: nkvr,
			TimeUnixMilli: now.UnixMilli(),
		}
		if st.CumulativeBytes, err = walletapi.AddAmount(prev.Bytes, a.bytes); err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		if st.CumulativeNKVR, err = walletapi.AddAmount(prev.NKVR, nkvr); err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		rej, err := walletapi.AddAmount(prev.RejectedBytes, a.rejected)
		if err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		signed, err := walletapi.Sign(s.key, st)
		if err != nil {
			return Result{}, fmt.Errorf("credit: worker %s: %w", w, err)
		}
		ws = append(ws, Wallet{Worker: w, Bytes: st.CumulativeBytes, NKVR: st.CumulativeNKVR, RejectedBytes: rej, Statements: st.N})
		sts = append(sts, StatementRow{Worker: w, N: st.N, LedgerAfter: cur, LedgerUpTo: last, Bytes: a.bytes, NKVR: nkvr,
			Body: signed.Body, Sig: signed.Sig})
		res.Statements++
		res.Bytes += a.bytes
		res.NKVR += nkvr
	}
	if err := tx.Write(ctx, ws, sts, now, last, lastPrint); err != nil {
		return Result{}, fmt.Errorf("credit: %w", err)
	}
	if s.beforeCommit != nil {
		if err := s.beforeCommit(); err != nil {
			return Result{}, err
		}
	}
	if err := tx.Commit(ctx); err != nil {
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
	ws, err := s.st.Wallets(context.Background())
	if err != nil {
		return nil, fmt.Errorf("credit: wallets: %w", err)
	}
	return ws, nil
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
	out, err := s.st.Statements(ctx, worker, after, limit+1)
	if err != nil {
		return nil, false, fmt.Errorf("credit: statements: %w", err)
	}
	more := len(out) > limit
	if more {
		out = out[:limit]
	}
	return out, more, nil
}

// Run credits every interval until ctx is done, reporting errors (which
// are retried on the next tick) to logf when it is not nil: an error the
// first time it occurs, the same error again at most once a minute with
// how many times it recurred, and the recovery once a pass succeeds (a
// hub that is down for an hour logs some sixty lines, not one per
// tick). It returns ctx.Err().
func (s *Service) Run(ctx context.Context, interval time.Duration, logf func(format string, args ...any)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	var last string
	var lastAt time.Time
	repeats := 0
	for {
		_, err := s.Credit(ctx)
		if err != nil && ctx.Err() == nil {
			s.runErr.Store(&err)
		} else if err == nil {
			s.runErr.Store(nil)
		}
		switch {
		case logf == nil || ctx.Err() != nil:
		case err != nil:
			msg, now := err.Error(), s.now()
			if msg != last || now.Sub(lastAt) >= time.Minute {
				if msg == last && repeats > 0 {
					logf("%v (%d more times since %s)", err, repeats, lastAt.UTC().Format(time.TimeOnly)) // the package's errors begin with "credit: "
				} else {
					logf("%v", err)
				}
				last, lastAt, repeats = msg, now, 0
			} else {
				repeats++
			}
		case last != "":
			logf("credit: crediting again after %q", last)
			last, repeats = "", 0
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}
