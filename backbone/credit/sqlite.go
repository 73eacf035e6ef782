package credit

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/sqlitestore"
	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

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

// sqliteStore is the wallets SQLite file (WAL, synchronous=FULL, created
// 0600). Several processes may share it: BEGIN IMMEDIATE serialises the
// crediting transactions.
type sqliteStore struct {
	db *sql.DB
}

// sqliteFile is the wallets SQLite file, created 0600, its schema
// (idempotent) applied on every open.
var sqliteFile = sqlitestore.File{Kind: dbfile.GatewayWallets, Prefix: "credit", ErrSchema: ErrSchema, Schema: schema,
	Create: true, Reapply: true}

// openSQLite opens or creates the wallets file at path
// (sqlitestore.File.Open). The file is first checked through a read-only
// connection (dbfile.Check): a corrupt file, a file of another kind
// (application_id, tables) or of a newer schema is refused with an error
// wrapping ErrSchema and the dbfile error, and left byte for byte as it
// was. A new or empty file gets the schema, user_version = SchemaVersion
// and application_id = dbfile.AppIDGatewayWallets; a wallets file written
// before application ids (id 0, version 1, exactly its four tables) is
// adopted by setting the id.
func openSQLite(path string) (*sqliteStore, error) {
	db, err := sqliteFile.Open(path)
	if err != nil {
		return nil, err
	}
	return &sqliteStore{db: db}, nil
}

// openSQLiteReadOnly opens an existing wallets file to read it; it never
// writes to path nor leaves -wal/-shm files that were not there
// (dbfile.ReadOnlyDSN). A missing file gives an error wrapping
// dbfile.ErrNotExist; an empty, corrupt, foreign or newer file one
// wrapping ErrSchema and the dbfile error.
func openSQLiteReadOnly(path string) (*sqliteStore, error) {
	db, err := sqliteFile.OpenReadOnly(path)
	if err != nil {
		return nil, err
	}
	return &sqliteStore{db: db}, nil
}

// Kind implements Store.
func (s *sqliteStore) Kind() string { return "sqlite" }

// Close implements Store.
func (s *sqliteStore) Close() error { return s.db.Close() }

// Seed implements Store (in one BEGIN IMMEDIATE transaction).
func (s *sqliteStore) Seed(ctx context.Context, fresh []byte) ([]byte, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	var seed []byte
	err = tx.QueryRowContext(ctx, `SELECT v FROM meta WHERE k = 'signing_seed'`).Scan(&seed)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		if fresh == nil {
			return nil, fmt.Errorf("%w: no signing seed", ErrSchema)
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO meta (k, v) VALUES ('signing_seed', ?)`, fresh); err != nil {
			return nil, err
		}
		seed = fresh
	case err != nil:
		return nil, fmt.Errorf("%w: %v", ErrSchema, err)
	}
	return seed, tx.Commit()
}

// readSeed reads the seed without a write transaction (read-only files).
func (s *sqliteStore) readSeed(ctx context.Context) ([]byte, error) {
	var seed []byte
	err := s.db.QueryRowContext(ctx, `SELECT v FROM meta WHERE k = 'signing_seed'`).Scan(&seed)
	return seed, err
}

// Cursor implements Store.
func (s *sqliteStore) Cursor(ctx context.Context) (int64, error) {
	var c int64
	if err := s.db.QueryRowContext(ctx, `SELECT last_id FROM cursor WHERE one = 1`).Scan(&c); err != nil {
		return 0, err
	}
	return c, nil
}

// CursorRow implements Store: the fingerprint is meta's 'cursor_row'.
func (s *sqliteStore) CursorRow(ctx context.Context) (int64, []byte, error) {
	var c int64
	var fp []byte
	err := s.db.QueryRowContext(ctx, `SELECT last_id, (SELECT v FROM meta WHERE k = 'cursor_row') FROM cursor WHERE one = 1`).Scan(&c, &fp)
	return c, fp, err
}

// Begin implements Store: BEGIN IMMEDIATE (_txlock) takes the file's
// write lock now, so no other process commits until this transaction
// ends.
func (s *sqliteStore) Begin(ctx context.Context) (Tx, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, err
	}
	return &sqliteTx{tx: tx}, nil
}

type sqliteTx struct{ tx *sql.Tx }

// LockCursor implements Tx.
func (t *sqliteTx) LockCursor(ctx context.Context) (int64, error) {
	var c int64
	err := t.tx.QueryRowContext(ctx, `SELECT last_id FROM cursor WHERE one = 1`).Scan(&c)
	return c, err
}

// Wallets implements Tx.
func (t *sqliteTx) Wallets(ctx context.Context, workers []string) (map[string]Wallet, error) {
	out := map[string]Wallet{}
	for _, w := range workers {
		var b, n, r, c int64
		err := t.tx.QueryRowContext(ctx, `SELECT bytes, nkvr, rejected, statements FROM wallets WHERE worker = ?`, w).Scan(&b, &n, &r, &c)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("wallet %s: %w", w, err)
		}
		out[w] = Wallet{Worker: w, Bytes: uint64(b), NKVR: uint64(n), RejectedBytes: uint64(r), Statements: uint64(c)}
	}
	return out, nil
}

// Write implements Tx.
func (t *sqliteTx) Write(ctx context.Context, ws []Wallet, sts []StatementRow, updated time.Time, last int64, lastPrint []byte) error {
	for _, w := range ws {
		if _, err := t.tx.ExecContext(ctx, `INSERT INTO wallets (worker, bytes, nkvr, rejected, statements, updated) VALUES (?, ?, ?, ?, ?, ?)
			ON CONFLICT (worker) DO UPDATE SET bytes = excluded.bytes, nkvr = excluded.nkvr, rejected = excluded.rejected,
			statements = excluded.statements, updated = excluded.updated`,
			w.Worker, int64(w.Bytes), int64(w.NKVR), int64(w.RejectedBytes), int64(w.Statements), updated.UnixMilli()); err != nil {
			return fmt.Errorf("wallet %s: %w", w.Worker, err)
		}
	}
	for _, st := range sts {
		if _, err := t.tx.ExecContext(ctx, `INSERT INTO statements (worker, n, ledger_after, ledger_upto, bytes, nkvr, body, sig) VALUES (?, ?, ?, ?, ?, ?, ?, ?)`,
			st.Worker, int64(st.N), st.LedgerAfter, st.LedgerUpTo, int64(st.Bytes), int64(st.NKVR), st.Body, st.Sig); err != nil {
			return fmt.Errorf("statement %s/%d: %w", st.Worker, st.N, err)
		}
	}
	if _, err := t.tx.ExecContext(ctx, `UPDATE cursor SET last_id = ? WHERE one = 1`, last); err != nil {
		return fmt.Errorf("cursor: %w", err)
	}
	if _, err := t.tx.ExecContext(ctx, `INSERT INTO meta (k, v) VALUES ('cursor_row', ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, lastPrint); err != nil {
		return fmt.Errorf("cursor row: %w", err)
	}
	return nil
}

// Commit implements Tx.
func (t *sqliteTx) Commit(context.Context) error { return t.tx.Commit() }

// Rollback implements Tx.
func (t *sqliteTx) Rollback() error { return t.tx.Rollback() }

// Wallets implements Store.
func (s *sqliteStore) Wallets(ctx context.Context) ([]Wallet, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT worker, bytes, nkvr, rejected, statements FROM wallets ORDER BY worker`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Wallet
	for rows.Next() {
		var w Wallet
		var b, n, r, c int64
		if err := rows.Scan(&w.Worker, &b, &n, &r, &c); err != nil {
			return nil, err
		}
		w.Bytes, w.NKVR, w.RejectedBytes, w.Statements = uint64(b), uint64(n), uint64(r), uint64(c)
		out = append(out, w)
	}
	return out, rows.Err()
}

// Statements implements Store.
func (s *sqliteStore) Statements(ctx context.Context, worker string, after uint64, limit int) ([]walletapi.Signed, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT body, sig FROM statements WHERE worker = ? AND n > ? ORDER BY n LIMIT ?`, worker, int64(after), limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []walletapi.Signed
	for rows.Next() {
		var sg walletapi.Signed
		if err := rows.Scan(&sg.Body, &sg.Sig); err != nil {
			return nil, err
		}
		out = append(out, sg)
	}
	return out, rows.Err()
}
