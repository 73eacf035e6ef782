package credit

import (
	"context"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Store keeps a gateway's crediting state: the cursor (the id of the last
// ledger row credited), each worker's totals, the signed statements and
// the gateway's signing seed. Two implementations: an SQLite file (the
// embedded default, one or more gateway processes on one machine) and a
// PostgreSQL database that several gateways share (one cursor, one set of
// wallets, one signing key). Methods are safe for concurrent use.
type Store interface {
	// Seed returns the stored signing seed; when none is stored yet it
	// stores fresh first (of concurrent callers, one seed wins and all
	// get it).
	Seed(ctx context.Context, fresh []byte) ([]byte, error)
	// Cursor returns the committed cursor.
	Cursor(ctx context.Context) (int64, error)
	// CursorRow returns the committed cursor and the fingerprint of the
	// ledger row it names (RowPrint), read together; nil when none was
	// stored (a store written before fingerprints, or cursor 0).
	CursorRow(ctx context.Context) (int64, []byte, error)
	// Begin starts a crediting transaction.
	Begin(ctx context.Context) (Tx, error)
	// Wallets returns every worker's totals ordered by worker id.
	Wallets(ctx context.Context) ([]Wallet, error)
	// Statements returns up to limit signed statements of worker with
	// N > after in increasing N.
	Statements(ctx context.Context, worker string, after uint64, limit int) ([]walletapi.Signed, error)
	// Kind is "sqlite" or "postgres".
	Kind() string
	// Close releases the store.
	Close() error
}

// Tx is one crediting transaction. Nothing it writes is visible to
// anyone, nor survives a crash, before Commit returns nil.
type Tx interface {
	// LockCursor returns the committed cursor and keeps every other
	// crediting transaction from committing until this one ends (SQLite:
	// the write lock BEGIN IMMEDIATE took; PostgreSQL: SELECT ... FOR
	// UPDATE on the cursor row).
	LockCursor(ctx context.Context) (int64, error)
	// Wallets returns the current totals of workers (absent ones are
	// missing from the map).
	Wallets(ctx context.Context, workers []string) (map[string]Wallet, error)
	// Write stores the workers' new totals and their statements, and
	// moves the cursor to last, whose ledger row's fingerprint is
	// lastPrint (RowPrint).
	Write(ctx context.Context, ws []Wallet, sts []StatementRow, updated time.Time, last int64, lastPrint []byte) error
	// Commit makes the transaction durable.
	Commit(ctx context.Context) error
	// Rollback abandons the transaction (a no-op after Commit).
	Rollback() error
}

// StatementRow is a signed statement as a store keeps it: the signed
// bytes and, for queries, its key fields.
type StatementRow struct {
	Worker      string // hex ed25519 public key
	N           uint64 // the worker's statement number, 1, 2, ...
	LedgerAfter int64  // the cursor before the credit
	LedgerUpTo  int64  // the cursor after it
	Bytes       uint64 // creditable bytes credited
	NKVR        uint64 // nKVR credited
	Body, Sig   []byte // walletapi.Signed
}
