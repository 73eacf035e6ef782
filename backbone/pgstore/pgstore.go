// Package pgstore holds what the PostgreSQL stores of the money path share
// (the hub's contribution ledger, backbone/ledger, and the gateways'
// wallets, backbone/credit): recognising a PostgreSQL URL, connecting with
// the settings exactly-once crediting relies on, and versioned schema
// migrations applied on start that refuse a newer schema.
//
// Migrations: each component ("ledger", "wallets") has an ordered list of
// SQL scripts; script i (1-based) brings the component to version i. The
// table kvasir_schema_migrations records (component, version, sha256 of the
// script, time). Migrate takes a transaction-scoped advisory lock, so that
// hubs and gateways starting together apply each script once, checks the
// recorded versions against the scripts this program carries (a version
// above them is refused with ErrNewerSchema, a recorded script that differs
// from this program's with ErrSchemaMismatch), and applies the missing ones
// in the same transaction: all or nothing.
package pgstore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kvasir-ai/kvasir/backbone/config"
)

// Sentinel errors; returned errors wrap one of these or a pgx error.
var (
	// ErrNewerSchema: the database holds a schema version this program
	// does not know (written by a newer kvasir). Nothing was changed.
	ErrNewerSchema = errors.New("pgstore: database schema is newer than this program")
	// ErrSchemaMismatch: a recorded migration differs from this program's
	// script of the same version, or the tables do not have the expected
	// shape. Nothing was changed.
	ErrSchemaMismatch = errors.New("pgstore: database schema does not match this program")
	// ErrNoSchema: a read-only open found no schema of the component.
	ErrNoSchema = errors.New("pgstore: database holds no schema of this kind")
)

// IsURL reports whether s names a PostgreSQL database (a postgres:// or
// postgresql:// URL) rather than an SQLite file path.
func IsURL(s string) bool {
	l := strings.ToLower(s)
	return strings.HasPrefix(l, "postgres://") || strings.HasPrefix(l, "postgresql://")
}

// RedactPath returns a store's path for logs and errors: a PostgreSQL URL
// Redacted, an SQLite file path as it is.
func RedactPath(path string) string {
	if IsURL(path) {
		return Redact(path)
	}
	return path
}

// Redact returns dsn with any password replaced by "xxxxx", for logs and
// errors.
// (config.RedactPassword: the user's password and a password query
// parameter).
func Redact(dsn string) string {
	r, _ := config.RedactPassword(dsn)
	return r
}

// Options tunes Connect.
type Options struct {
	// ReadOnly makes every transaction of the pool read-only
	// (default_transaction_read_only), for the `backbone ledger` and
	// `backbone wallets` commands.
	ReadOnly bool
	// MaxConns bounds the pool (0: 4).
	MaxConns int32
	// AppName is the application_name the server shows (pg_stat_activity).
	AppName string
}

// Connect opens a connection pool to dsn and checks that the server
// answers. Every connection runs with synchronous_commit = on (a commit
// returns only once its WAL record is flushed, so an acknowledged ledger
// row or credit is durable, and a crash never hands out again an id that a
// reader has already seen), and with a lock and statement timeout so that
// a stuck peer cannot hold the ledger's id lock for ever.
func Connect(ctx context.Context, dsn string, opt Options) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %s: %w", Redact(dsn), err)
	}
	rp := cfg.ConnConfig.RuntimeParams
	rp["synchronous_commit"] = "on"
	if _, ok := rp["lock_timeout"]; !ok {
		rp["lock_timeout"] = "30s"
	}
	if _, ok := rp["idle_in_transaction_session_timeout"]; !ok {
		rp["idle_in_transaction_session_timeout"] = "60s"
	}
	if opt.AppName != "" {
		rp["application_name"] = opt.AppName
	}
	if opt.ReadOnly {
		rp["default_transaction_read_only"] = "on"
	}
	cfg.MaxConns = 4
	if opt.MaxConns > 0 {
		cfg.MaxConns = opt.MaxConns
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("pgstore: %s: %w", Redact(dsn), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("pgstore: %s: %w", Redact(dsn), err)
	}
	return pool, nil
}

// Migration is one versioned schema script of a component.
type Migration struct {
	Name string // short description, recorded with the version
	SQL  string // statements, run in one transaction
}

// Sum is the hex sha256 of the migration's SQL, recorded when applied.
func (m Migration) Sum() string {
	h := sha256.Sum256([]byte(m.SQL))
	return hex.EncodeToString(h[:])
}

const migrationsTable = `CREATE TABLE IF NOT EXISTS kvasir_schema_migrations (
	component text        NOT NULL,
	version   integer     NOT NULL CHECK (version >= 1),
	name      text        NOT NULL,
	sha256    text        NOT NULL,
	applied   timestamptz NOT NULL DEFAULT now(),
	PRIMARY KEY (component, version)
)`

// migrateLockKey is the advisory lock (per database) that serialises
// migrations of every component.
const migrateLockKey = 0x4b56534348454d41 // "KVSCHEMA"

// Migrate brings component to version len(ms), applying the missing
// scripts in one transaction under an advisory lock; it returns the
// version the database had before. A database with a version above
// len(ms) is refused with an error wrapping ErrNewerSchema, one whose
// recorded scripts differ from ms with ErrSchemaMismatch; neither is
// changed.
func Migrate(ctx context.Context, pool *pgxpool.Pool, component string, ms []Migration) (int, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("pgstore: migrate %s: %w", component, err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(migrateLockKey)); err != nil {
		return 0, fmt.Errorf("pgstore: migrate %s: lock: %w", component, err)
	}
	if _, err := tx.Exec(ctx, migrationsTable); err != nil {
		return 0, fmt.Errorf("pgstore: migrate %s: %w", component, err)
	}
	have, err := applied(ctx, tx, component, ms)
	if err != nil {
		return have, err
	}
	for v := have + 1; v <= len(ms); v++ {
		m := ms[v-1]
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return have, fmt.Errorf("pgstore: migrate %s to version %d (%s): %w", component, v, m.Name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO kvasir_schema_migrations (component, version, name, sha256) VALUES ($1, $2, $3, $4)`,
			component, v, m.Name, m.Sum()); err != nil {
			return have, fmt.Errorf("pgstore: migrate %s: record version %d: %w", component, v, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return have, fmt.Errorf("pgstore: migrate %s: commit: %w", component, err)
	}
	return have, nil
}

// CheckVersion verifies, without writing, that component is exactly at
// version len(ms) with this program's scripts. A database without the
// component gives ErrNoSchema; a newer one ErrNewerSchema; an older or
// different one ErrSchemaMismatch.
func CheckVersion(ctx context.Context, pool *pgxpool.Pool, component string, ms []Migration) error {
	var exists bool
	if err := pool.QueryRow(ctx, `SELECT to_regclass('kvasir_schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return fmt.Errorf("pgstore: %s: %w", component, err)
	}
	if !exists {
		return fmt.Errorf("%w: no kvasir_schema_migrations table (%s)", ErrNoSchema, component)
	}
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return fmt.Errorf("pgstore: %s: %w", component, err)
	}
	defer tx.Rollback(ctx)
	have, err := applied(ctx, tx, component, ms)
	if err != nil {
		return err
	}
	switch {
	case have == 0:
		return fmt.Errorf("%w: no %s schema", ErrNoSchema, component)
	case have < len(ms):
		return fmt.Errorf("%w: %s schema version %d, this program needs %d (start the hub or gateway once to migrate)",
			ErrSchemaMismatch, component, have, len(ms))
	}
	return nil
}

// applied reads the recorded versions of component and checks them
// against ms; it returns the highest version, all of 1..version being
// recorded with the scripts of ms.
func applied(ctx context.Context, tx pgx.Tx, component string, ms []Migration) (int, error) {
	rows, err := tx.Query(ctx, `SELECT version, sha256 FROM kvasir_schema_migrations WHERE component = $1 ORDER BY version`, component)
	if err != nil {
		return 0, fmt.Errorf("pgstore: %s: read versions: %w", component, err)
	}
	type rec struct {
		v   int
		sum string
	}
	recs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (rec, error) {
		var x rec
		err := r.Scan(&x.v, &x.sum)
		return x, err
	})
	if err != nil {
		return 0, fmt.Errorf("pgstore: %s: read versions: %w", component, err)
	}
	have := 0
	for i, r := range recs {
		if r.v > len(ms) {
			return 0, fmt.Errorf("%w: %s schema version %d, this program knows versions up to %d",
				ErrNewerSchema, component, recs[len(recs)-1].v, len(ms))
		}
		if r.v != i+1 {
			return 0, fmt.Errorf("%w: %s versions recorded out of sequence (%d at position %d)", ErrSchemaMismatch, component, r.v, i+1)
		}
		if r.sum != ms[i].Sum() {
			return 0, fmt.Errorf("%w: %s version %d (%s) was applied from a different script", ErrSchemaMismatch, component, r.v, ms[i].Name)
		}
		have = r.v
	}
	return have, nil
}

// Code returns the SQLSTATE of err when it is a server error ("" else).
func Code(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// Message returns the server's message of err when it is a server error
// (err.Error() else).
func Message(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Message
	}
	return err.Error()
}

// SQLSTATE codes the stores act on.
const (
	CodeCheckViolation  = "23514" // a CHECK constraint refused a row
	CodeUniqueViolation = "23505"
	CodeRaiseException  = "P0001" // RAISE EXCEPTION in a trigger (append-only)
)
