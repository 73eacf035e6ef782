// Package wallet is the worker's local wallet and identity: an SQLite file
// with the worker's own count of bytes served per session (metered), the
// gateway's signed credit statements (credited) and payouts (paid), and
// the ed25519 identity whose key lives in the OS keyring (identity.go).
// See docs/accounting.md.
package wallet

import (
	"bytes"
	"crypto/ed25519"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// SchemaVersion is the wallet file's schema version (PRAGMA user_version).
// Changelog: 1 — sessions, statements, payouts, meta.
const SchemaVersion = 1

// Wallet errors.
var (
	// ErrCorrupt: the file is not a readable SQLite database, or fails
	// SQLite's quick_check. The file is left untouched.
	ErrCorrupt = errors.New("wallet: file is corrupt or not a wallet")
	// ErrNewerSchema: the file was written by a newer kvasir. Left untouched.
	ErrNewerSchema = errors.New("wallet: file is from a newer version of kvasir")
	// ErrWrongIdentity: the file belongs to another worker key.
	ErrWrongIdentity = errors.New("wallet: file belongs to another identity")
	// ErrGatewayKey: a statement source whose key differs from the gateway
	// key pinned on first use.
	ErrGatewayKey = errors.New("wallet: gateway key differs from the pinned key")
	// ErrStatement: a statement that fails verification or does not follow
	// the previous one (number, cumulative totals, worker).
	ErrStatement = errors.New("wallet: statement rejected")
	// ErrReissued (with ErrStatement): the gateway's statements no longer
	// extend this wallet's: one it sends under a number the wallet holds
	// differs, or its totals do not follow the wallet's last statement (a
	// gateway whose wallets store was restored from an older backup
	// numbers its new credits from there). Sync then takes the gateway's
	// current chain (ReplaceStatements).
	ErrReissued = errors.New("wallet: the gateway reissued its statements")
	// ErrPayout: a payout that is not positive or exceeds the credited amount.
	ErrPayout = errors.New("wallet: invalid payout")
)

const schema = `
CREATE TABLE meta (k TEXT PRIMARY KEY, v TEXT NOT NULL);
CREATE TABLE sessions (
	session   TEXT PRIMARY KEY,
	bytes_in  INTEGER NOT NULL CHECK (bytes_in >= 0),  -- DISPATCH bytes received
	bytes_out INTEGER NOT NULL CHECK (bytes_out >= 0), -- RESULT bytes sent
	started   INTEGER NOT NULL,                        -- unix ms
	updated   INTEGER NOT NULL                         -- unix ms
);
CREATE TABLE statements (
	n              INTEGER PRIMARY KEY,
	gateway        TEXT    NOT NULL,
	body           BLOB    NOT NULL,
	sig            BLOB    NOT NULL,
	bytes          INTEGER NOT NULL,
	rejected       INTEGER NOT NULL,
	nkvr           INTEGER NOT NULL,
	rate           INTEGER NOT NULL,
	cum_bytes      INTEGER NOT NULL,
	cum_nkvr       INTEGER NOT NULL,
	ledger_after   INTEGER NOT NULL,
	ledger_upto    INTEGER NOT NULL,
	time           INTEGER NOT NULL, -- unix ms, gateway's
	fetched        INTEGER NOT NULL  -- unix ms, ours
);
CREATE TABLE payouts (
	id   INTEGER PRIMARY KEY AUTOINCREMENT,
	nkvr INTEGER NOT NULL CHECK (nkvr > 0),
	ref  TEXT    NOT NULL,
	time INTEGER NOT NULL -- unix ms
);
`

// FlushInterval is how often Served writes its in-memory counts to disk;
// a crash loses at most this much of the worker's own count.
const FlushInterval = time.Second

// DefaultCreditLag is how long credits may follow the work before the
// wallet calls a gap a mismatch (Options.CreditLag): the hub holds
// creditable bytes back 30 s (hub.DefaultSettleDelay), the gateway credits
// about every second and the node fetches statements every 30 s, plus a
// margin for a busy machine.
const DefaultCreditLag = 90 * time.Second

// Wallet is an open wallet file bound to one worker identity. It is safe
// for concurrent use.
type Wallet struct {
	db     *sql.DB
	worker string // hex public key
	addr   string
	now    func() time.Time
	lag    time.Duration

	mu        sync.Mutex
	pending   map[string]*served // counts not yet written
	lastFlush time.Time
	total     uint64         // bytes served in all, written or pending
	samples   []servedSample // total over time, for the credit lag (see servedBy)
}

// servedSample is the wallet's total count of bytes served at time t.
type servedSample struct {
	t     time.Time
	total uint64
}

type served struct {
	in, out uint64
	first   time.Time
	last    time.Time
}

// Options tunes Open; the zero value is the production setting.
type Options struct {
	Now func() time.Time // clock; nil means time.Now
	// CreditLag is how long the gateway's credits may follow the work
	// before Summary reports a shortfall as a mismatch; 0 means
	// DefaultCreditLag. A node that fetches statements every S should pass
	// at least S + 60 s.
	CreditLag time.Duration
}

// Check inspects the wallet file at path without modifying it, through
// dbfile.Check (SQLite header, application_id dbfile.AppIDWorkerWallet,
// user_version, tables, PRAGMA quick_check, on a read-only connection that
// leaves no -wal/-shm behind). It returns the state found (dbfile.Missing
// or Empty: Open will create the wallet; Legacy: a wallet written before
// application ids, which Open adopts; Current), or an error wrapping
// ErrNewerSchema, or ErrCorrupt for a file that is corrupt or not a worker
// wallet (it names what the file is, e.g. a gateway wallets file); the
// error also wraps the dbfile error.
func Check(path string) (dbfile.Info, error) {
	info, err := dbfile.Check(path, dbfile.WorkerWallet)
	switch {
	case errors.Is(err, dbfile.ErrNewerSchema):
		return info, fmt.Errorf("%w: %w", ErrNewerSchema, err)
	case err != nil:
		return info, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return info, nil
}

// Open opens or creates the wallet at path for identity id. An existing
// file is first checked read-only (Check), so a corrupt file, a file of
// another kind or one from a newer schema is reported (ErrCorrupt,
// ErrNewerSchema) and left byte for byte as it was. A new wallet gets
// user_version SchemaVersion and application_id dbfile.AppIDWorkerWallet;
// a wallet written before application ids is adopted (the id is set). A
// file of another identity gives ErrWrongIdentity.
func Open(path string, id Identity, opt Options) (*Wallet, error) {
	info, err := Check(path)
	if err != nil {
		return nil, err
	}
	if info.State == dbfile.Legacy || info.State == dbfile.Current {
		// The owner, too, is checked before anything writes.
		if err := checkOwner(path, id.WorkerID); err != nil {
			return nil, err
		}
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.CreditLag <= 0 {
		opt.CreditLag = DefaultCreditLag
	}
	if err := dbfile.CreateEmpty(path); err != nil {
		return nil, fmt.Errorf("wallet: %w", err)
	}
	// synchronous=NORMAL in WAL: a power cut can lose the last second of
	// the worker's own count, an estimate; statements can be fetched again.
	dsn, err := dbfile.DSN(path, "_journal_mode=WAL", "_synchronous=NORMAL", "_busy_timeout=5000", "_txlock=immediate")
	if err != nil {
		return nil, fmt.Errorf("wallet: %w", err)
	}
	db, err := dbfile.Open(dsn)
	if err != nil {
		return nil, fmt.Errorf("wallet: %w", err)
	}
	w := &Wallet{db: db, worker: id.WorkerID, addr: id.Address, now: opt.Now, lag: opt.CreditLag, pending: map[string]*served{}}
	if err := w.init(info.State); err != nil {
		db.Close()
		if werr := dbfile.Writable(path); werr != nil {
			// A read-only folder: SQLite says "unable to open database
			// file: no such file or directory". OpenReadOnly still reads it.
			err = fmt.Errorf("%w (%v)", werr, err)
		}
		return nil, fmt.Errorf("wallet: open %s: %w", path, err)
	}
	if err := w.loadSamples(); err != nil {
		db.Close()
		return nil, fmt.Errorf("wallet: open %s: %w", path, err)
	}
	return w, nil
}

// loadSamples rebuilds the served-bytes history from the sessions table:
// each session's bytes count from its last update (a session's bytes are
// not credited before it was last counted, so this never makes a credit
// look late).
func (w *Wallet) loadSamples() error {
	rows, err := w.db.Query(`SELECT updated, bytes_in + bytes_out FROM sessions ORDER BY updated, session`)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		var upd, b int64
		if err := rows.Scan(&upd, &b); err != nil {
			return err
		}
		w.total += uint64(b)
		w.addSample(time.UnixMilli(upd), w.now())
	}
	return rows.Err()
}

// addSample records w.total at time t (one sample per clock second: a
// later count in the same second moves that second's sample) and drops
// the samples no lag lookup at or after now needs; w.mu held (or w not
// yet shared).
func (w *Wallet) addSample(t, now time.Time) {
	if n := len(w.samples); n > 0 && !t.Truncate(time.Second).After(w.samples[n-1].t.Truncate(time.Second)) {
		w.samples[n-1].total = w.total
		if t.After(w.samples[n-1].t) {
			w.samples[n-1].t = t
		}
	} else {
		w.samples = append(w.samples, servedSample{t: t, total: w.total})
	}
	cut := now.Add(-w.lag)
	i := 0
	for i+1 < len(w.samples) && !w.samples[i+1].t.After(cut) {
		i++
	}
	if i > 0 {
		w.samples = append(w.samples[:0], w.samples[i:]...)
	}
}

// servedBy returns the bytes served at or before t, as far as the samples
// kept for the credit lag tell (0 before the first).
func (w *Wallet) servedBy(t time.Time) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b uint64
	for _, s := range w.samples {
		if s.t.After(t) {
			break
		}
		b = s.total
	}
	return b
}

// checkOwner reads the wallet's worker key through a read-only connection
// and returns ErrWrongIdentity unless it is worker, ErrCorrupt if missing.
func checkOwner(path, worker string) error {
	dsn, err := dbfile.ReadOnlyDSN(path)
	if err != nil {
		return fmt.Errorf("wallet: %w", err)
	}
	db, err := dbfile.Open(dsn)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrCorrupt, path, err)
	}
	defer db.Close()
	var owner string
	if err := db.QueryRow(`SELECT v FROM meta WHERE k = 'worker'`).Scan(&owner); err != nil {
		return fmt.Errorf("%w: %s: no owner: %v", ErrCorrupt, path, err)
	}
	if owner != worker {
		return fmt.Errorf("%w: %s is for worker %s, identity is %s", ErrWrongIdentity, path, owner, worker)
	}
	return nil
}

func (w *Wallet) init(state dbfile.State) error {
	tx, err := w.db.Begin()
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var v int
	if err := tx.QueryRow(`PRAGMA user_version`).Scan(&v); err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	switch {
	case v > SchemaVersion: // written by another process since the check
		return fmt.Errorf("%w: schema version %d, this kvasir reads up to %d", ErrNewerSchema, v, SchemaVersion)
	case v == 0: // new or empty file (Missing, Empty, or created meanwhile)
		if _, err := tx.Exec(schema); err != nil {
			return fmt.Errorf("%w: %v", ErrCorrupt, err)
		}
		if _, err := tx.Exec(`INSERT INTO meta (k, v) VALUES ('worker', ?), ('address', ?)`, w.worker, w.addr); err != nil {
			return err
		}
		if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, SchemaVersion)); err != nil {
			return err
		}
		if _, err := tx.Exec(dbfile.WorkerWallet.SetAppID()); err != nil {
			return err
		}
	case state == dbfile.Legacy:
		if _, err := tx.Exec(dbfile.WorkerWallet.SetAppID()); err != nil {
			return err
		}
	}
	var owner string
	if err := tx.QueryRow(`SELECT v FROM meta WHERE k = 'worker'`).Scan(&owner); err != nil {
		return fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	if owner != w.worker {
		return fmt.Errorf("%w: file is for worker %s, identity is %s", ErrWrongIdentity, owner, w.worker)
	}
	return tx.Commit()
}

// Close writes pending counts and closes the file.
func (w *Wallet) Close() error {
	ferr := w.Flush()
	cerr := w.db.Close()
	return errors.Join(ferr, cerr)
}

// Address returns the wallet's address.
func (w *Wallet) Address() string { return w.addr }

// Served adds one served exchange to the worker's own count for session:
// bytesIn DISPATCH bytes received and bytesOut RESULT bytes sent (WebSocket
// message bytes). It is cheap (in memory) and writes to disk at most every
// FlushInterval; pass it as worker.Config.OnServed. Write errors are
// returned by a later Flush or Close.
func (w *Wallet) Served(session string, bytesIn, bytesOut uint64) {
	now := w.now()
	w.mu.Lock()
	s := w.pending[session]
	if s == nil {
		s = &served{first: now}
		w.pending[session] = s
	}
	s.in += bytesIn
	s.out += bytesOut
	s.last = now
	w.total += bytesIn + bytesOut
	w.addSample(now, now)
	due := now.Sub(w.lastFlush) >= FlushInterval
	w.mu.Unlock()
	if due {
		_ = w.Flush()
	}
}

// Flush writes the counts Served buffered, in one transaction.
func (w *Wallet) Flush() error {
	w.mu.Lock()
	p := w.pending
	w.pending = map[string]*served{}
	w.lastFlush = w.now()
	w.mu.Unlock()
	if len(p) == 0 {
		return nil
	}
	err := func() error {
		tx, err := w.db.Begin()
		if err != nil {
			return err
		}
		defer tx.Rollback()
		for sess, s := range p {
			if s.in > walletapi.MaxAmount || s.out > walletapi.MaxAmount {
				return fmt.Errorf("wallet: session %q count overflows", sess)
			}
			if _, err := tx.Exec(`INSERT INTO sessions (session, bytes_in, bytes_out, started, updated) VALUES (?, ?, ?, ?, ?)
				ON CONFLICT (session) DO UPDATE SET bytes_in = bytes_in + excluded.bytes_in,
				bytes_out = bytes_out + excluded.bytes_out, updated = excluded.updated`,
				sess, int64(s.in), int64(s.out), s.first.UnixMilli(), s.last.UnixMilli()); err != nil {
				return err
			}
		}
		return tx.Commit()
	}()
	if err != nil {
		// Put the counts back so they are not lost.
		w.mu.Lock()
		for sess, s := range p {
			if q := w.pending[sess]; q != nil {
				q.in += s.in
				q.out += s.out
				q.first = s.first
			} else {
				w.pending[sess] = s
			}
		}
		w.mu.Unlock()
		return fmt.Errorf("wallet: flush: %w", err)
	}
	return nil
}

// PinnedGateway returns the gateway key pinned on first use (nil if none).
func (w *Wallet) PinnedGateway() (ed25519.PublicKey, error) {
	var h string
	err := w.db.QueryRow(`SELECT v FROM meta WHERE k = 'gateway'`).Scan(&h)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wallet: %w", err)
	}
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: pinned gateway key %q", ErrCorrupt, h)
	}
	return b, nil
}

// LastStatement returns the number of the newest stored statement (0: none).
func (w *Wallet) LastStatement() (uint64, error) {
	var n sql.NullInt64
	if err := w.db.QueryRow(`SELECT MAX(n) FROM statements`).Scan(&n); err != nil {
		return 0, fmt.Errorf("wallet: %w", err)
	}
	return uint64(n.Int64), nil
}

// AddStatements verifies and stores statements signed by gateway, in one
// transaction (all or nothing), and records the time as the last fetch
// (LastFetched) and the shortfall of the sessions this fetch decides
// (checkSessions). The first gateway key seen is pinned;
// another key gives ErrGatewayKey. Each statement must verify, name this
// worker, and continue the stored ones: N = previous N + 1 and cumulative
// totals = previous + this credit (ErrStatement otherwise). A statement
// already stored with identical bytes is skipped. It returns how many were
// added.
func (w *Wallet) AddStatements(gateway ed25519.PublicKey, signed []walletapi.Signed) (int, error) {
	if err := w.Flush(); err != nil { // the sessions checked below are on disk
		return 0, err
	}
	tx, err := w.db.Begin()
	if err != nil {
		return 0, fmt.Errorf("wallet: %w", err)
	}
	defer tx.Rollback()
	gw := hex.EncodeToString(gateway)
	var pinned string
	err = tx.QueryRow(`SELECT v FROM meta WHERE k = 'gateway'`).Scan(&pinned)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if len(gateway) != ed25519.PublicKeySize {
			return 0, fmt.Errorf("%w: key of %d bytes", ErrGatewayKey, len(gateway))
		}
		if _, err := tx.Exec(`INSERT INTO meta (k, v) VALUES ('gateway', ?)`, gw); err != nil {
			return 0, fmt.Errorf("wallet: %w", err)
		}
	case err != nil:
		return 0, fmt.Errorf("wallet: %w", err)
	case pinned != gw:
		return 0, fmt.Errorf("%w: pinned %s, offered %s", ErrGatewayKey, pinned, gw)
	}
	var lastN, cumB, cumN int64
	err = tx.QueryRow(`SELECT n, cum_bytes, cum_nkvr FROM statements ORDER BY n DESC LIMIT 1`).Scan(&lastN, &cumB, &cumN)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("wallet: %w", err)
	}
	added := 0
	now := w.now().UnixMilli()
	for _, sg := range signed {
		st, err := walletapi.Open(gateway, sg)
		if err != nil {
			return 0, fmt.Errorf("%w: %v", ErrStatement, err)
		}
		if st.Worker != w.worker {
			return 0, fmt.Errorf("%w: statement %d is for worker %s", ErrStatement, st.N, st.Worker)
		}
		if st.N <= uint64(lastN) {
			var body []byte
			if err := tx.QueryRow(`SELECT body FROM statements WHERE n = ?`, int64(st.N)).Scan(&body); err == nil && bytes.Equal(body, sg.Body) {
				continue
			}
			return 0, fmt.Errorf("%w: %w: statement %d conflicts with the stored one", ErrStatement, ErrReissued, st.N)
		}
		if st.N != uint64(lastN)+1 {
			return 0, fmt.Errorf("%w: statement %d follows %d (gap)", ErrStatement, st.N, lastN)
		}
		if st.CumulativeBytes != uint64(cumB)+st.Bytes || st.CumulativeNKVR != uint64(cumN)+st.NKVR {
			return 0, fmt.Errorf("%w: %w: statement %d cumulative totals do not follow statement %d", ErrStatement, ErrReissued, st.N, lastN)
		}
		if _, err := tx.Exec(`INSERT INTO statements (n, gateway, body, sig, bytes, rejected, nkvr, rate, cum_bytes, cum_nkvr,
			ledger_after, ledger_upto, time, fetched) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			int64(st.N), gw, sg.Body, sg.Sig, int64(st.Bytes), int64(st.RejectedBytes), int64(st.NKVR), int64(st.RateNKVRPerByte),
			int64(st.CumulativeBytes), int64(st.CumulativeNKVR), st.LedgerAfter, st.LedgerUpTo, st.TimeUnixMilli, now); err != nil {
			return 0, fmt.Errorf("wallet: %w", err)
		}
		lastN, cumB, cumN = int64(st.N), int64(st.CumulativeBytes), int64(st.CumulativeNKVR)
		added++
	}
	// The statements are as the gateway had them now: a later shortfall of
	// credits is measured from here (Summary, Reconcile), and the sessions
	// last counted a credit lag before now are checked against them.
	if err := w.checkSessions(tx, now, uint64(cumB)); err != nil {
		return 0, fmt.Errorf("wallet: %w", err)
	}
	if _, err := tx.Exec(`INSERT INTO meta (k, v) VALUES ('fetched', ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`,
		strconv.FormatInt(now, 10)); err != nil {
		return 0, fmt.Errorf("wallet: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("wallet: %w", err)
	}
	return added, nil
}

// ReplaceStatements makes the wallet's statements those of the gateway's
// whole current chain for this worker (all, from statement 1, as the
// gateway serves them now): every statement is verified as AddStatements
// does (the pinned gateway's signature, this worker, numbers 1, 2, ...
// and totals that follow), the stored ones from the first that differs
// (the fork) on are replaced, and the fork is recorded (Reissued). It
// returns the fork (0: nothing differed) and the statements written. The
// gateway's credit is what its statements say; a gateway that restored
// older wallets credits the ledger rows after its cursor again under new
// numbers, so its totals come back as it catches up.
func (w *Wallet) ReplaceStatements(gateway ed25519.PublicKey, chain []walletapi.Signed) (fork uint64, written int, err error) {
	if err := w.Flush(); err != nil {
		return 0, 0, err
	}
	gw := hex.EncodeToString(gateway)
	if pinned, err := w.PinnedGateway(); err != nil {
		return 0, 0, err
	} else if pinned == nil || hex.EncodeToString(pinned) != gw {
		return 0, 0, fmt.Errorf("%w: statements of another gateway than the pinned one", ErrGatewayKey)
	}
	sts := make([]walletapi.Statement, len(chain))
	var cumB, cumN uint64
	for i, sg := range chain {
		st, err := walletapi.Open(gateway, sg)
		if err != nil {
			return 0, 0, fmt.Errorf("%w: %v", ErrStatement, err)
		}
		if st.Worker != w.worker || st.N != uint64(i)+1 || st.CumulativeBytes != cumB+st.Bytes || st.CumulativeNKVR != cumN+st.NKVR {
			return 0, 0, fmt.Errorf("%w: the gateway's chain is not consistent at statement %d", ErrStatement, st.N)
		}
		cumB, cumN = st.CumulativeBytes, st.CumulativeNKVR
		sts[i] = st
	}
	tx, err := w.db.Begin()
	if err != nil {
		return 0, 0, fmt.Errorf("wallet: %w", err)
	}
	defer tx.Rollback()
	var lastN int64
	if err := tx.QueryRow(`SELECT COALESCE(MAX(n), 0) FROM statements`).Scan(&lastN); err != nil {
		return 0, 0, fmt.Errorf("wallet: %w", err)
	}
	fork = uint64(len(chain)) + 1 // no difference in the gateway's chain: ours may be longer
	for i, sg := range chain {
		var body []byte
		err := tx.QueryRow(`SELECT body FROM statements WHERE n = ?`, int64(i+1)).Scan(&body)
		if errors.Is(err, sql.ErrNoRows) || (err == nil && !bytes.Equal(body, sg.Body)) {
			fork = uint64(i) + 1
			break
		}
		if err != nil {
			return 0, 0, fmt.Errorf("wallet: %w", err)
		}
	}
	if fork > uint64(lastN) && fork > uint64(len(chain)) {
		return 0, 0, nil // the same chain
	}
	if _, err := tx.Exec(`DELETE FROM statements WHERE n >= ?`, int64(fork)); err != nil {
		return 0, 0, fmt.Errorf("wallet: %w", err)
	}
	now := w.now().UnixMilli()
	for i := int(fork) - 1; i < len(chain); i++ {
		st, sg := sts[i], chain[i]
		if _, err := tx.Exec(`INSERT INTO statements (n, gateway, body, sig, bytes, rejected, nkvr, rate, cum_bytes, cum_nkvr,
			ledger_after, ledger_upto, time, fetched) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`,
			int64(st.N), gw, sg.Body, sg.Sig, int64(st.Bytes), int64(st.RejectedBytes), int64(st.NKVR), int64(st.RateNKVRPerByte),
			int64(st.CumulativeBytes), int64(st.CumulativeNKVR), st.LedgerAfter, st.LedgerUpTo, st.TimeUnixMilli, now); err != nil {
			return 0, 0, fmt.Errorf("wallet: %w", err)
		}
		written++
	}
	note := strconv.FormatUint(fork, 10) + " " + strconv.FormatInt(now, 10) + " " + strconv.FormatInt(lastN, 10)
	if _, err := tx.Exec(`INSERT INTO meta (k, v) VALUES ('reissued', ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, note); err != nil {
		return 0, 0, fmt.Errorf("wallet: %w", err)
	}
	if _, err := tx.Exec(`INSERT INTO meta (k, v) VALUES ('fetched', ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`,
		strconv.FormatInt(now, 10)); err != nil {
		return 0, 0, fmt.Errorf("wallet: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return 0, 0, fmt.Errorf("wallet: %w", err)
	}
	return fork, written, nil
}

// Reissue is when the gateway last reissued this wallet's statements
// (ReplaceStatements): from statement From on, at At, when the wallet held
// statements up to Had.
type Reissue struct {
	From, Had uint64
	At        time.Time
}

// Reissued returns the last Reissue, or nil if there was none.
func (w *Wallet) Reissued() (*Reissue, error) {
	var v string
	err := w.db.QueryRow(`SELECT v FROM meta WHERE k = 'reissued'`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("wallet: %w", err)
	}
	var from, had uint64
	var at int64
	if _, err := fmt.Sscan(v, &from, &at, &had); err != nil {
		return nil, fmt.Errorf("wallet: reissued %q: %w", v, err)
	}
	return &Reissue{From: from, Had: had, At: time.UnixMilli(at)}, nil
}

// LastFetched returns when statements were last received from the
// gateway (AddStatements, also with none new: Sync calls it for every
// page); zero if never.
func (w *Wallet) LastFetched() (time.Time, error) {
	var v string
	err := w.db.QueryRow(`SELECT v FROM meta WHERE k = 'fetched'`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("wallet: %w", err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: fetch time %q", ErrCorrupt, v)
	}
	return time.UnixMilli(ms), nil
}

// RecordPayout records that nkvr of the credited amount was paid (settled)
// at time t with an external reference. Payout itself is not built yet;
// this keeps the paid state. It returns ErrPayout when nkvr is 0 or the
// total paid would exceed the total credited.
func (w *Wallet) RecordPayout(nkvr uint64, ref string, t time.Time) error {
	if nkvr == 0 || nkvr > walletapi.MaxAmount {
		return fmt.Errorf("%w: amount %d", ErrPayout, nkvr)
	}
	tx, err := w.db.Begin()
	if err != nil {
		return fmt.Errorf("wallet: %w", err)
	}
	defer tx.Rollback()
	var paid, credited int64
	if err := tx.QueryRow(`SELECT COALESCE(SUM(nkvr), 0) FROM payouts`).Scan(&paid); err != nil {
		return fmt.Errorf("wallet: %w", err)
	}
	if err := tx.QueryRow(`SELECT COALESCE(MAX(cum_nkvr), 0) FROM statements`).Scan(&credited); err != nil {
		return fmt.Errorf("wallet: %w", err)
	}
	if uint64(paid)+nkvr > uint64(credited) {
		return fmt.Errorf("%w: paid %d + %d nKVR exceeds credited %d nKVR", ErrPayout, paid, nkvr, credited)
	}
	if _, err := tx.Exec(`INSERT INTO payouts (nkvr, ref, time) VALUES (?, ?, ?)`, int64(nkvr), ref, t.UnixMilli()); err != nil {
		return fmt.Errorf("wallet: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("wallet: %w", err)
	}
	return nil
}
