package credit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/kvasir-ai/kvasir/backbone/pgstore"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Migrations are the gateway wallets' PostgreSQL schema versions
// (component "wallets"; pgstore.Migrate applies the missing ones on Open).
// The tables live beside the ledger's (ledger_entries) when both use one
// database.
//
// Version 1: gateway_meta (the signing seed, never changed once written),
// gateway_cursor (one row; the cursor only moves forward), gateway_wallets
// (per-worker totals that only grow, never deleted) and gateway_statements
// (append-only), each rule enforced by triggers whoever connects.
// Version 2: gateway_cursor.last_row, the fingerprint of the ledger row
// the cursor names (RowPrint; NULL until the next credit).
var Migrations = []pgstore.Migration{{Name: "gateway cursor, wallets, statements, signing seed", SQL: `
CREATE TABLE gateway_meta (k text PRIMARY KEY, v bytea NOT NULL);
CREATE TABLE gateway_cursor (one integer PRIMARY KEY CHECK (one = 1), last_id bigint NOT NULL CHECK (last_id >= 0));
INSERT INTO gateway_cursor (one, last_id) VALUES (1, 0);
CREATE TABLE gateway_wallets (
	worker     text   PRIMARY KEY CHECK (worker ~ '^[0-9a-f]{64}$'),
	bytes      bigint NOT NULL CHECK (bytes >= 0),
	nkvr       bigint NOT NULL CHECK (nkvr >= 0),
	rejected   bigint NOT NULL CHECK (rejected >= 0),
	statements bigint NOT NULL CHECK (statements >= 0),
	updated    bigint NOT NULL -- unix ms
);
CREATE TABLE gateway_statements (
	worker       text   NOT NULL CHECK (worker ~ '^[0-9a-f]{64}$'),
	n            bigint NOT NULL CHECK (n >= 1),
	ledger_after bigint NOT NULL,
	ledger_upto  bigint NOT NULL CHECK (ledger_upto > ledger_after),
	bytes        bigint NOT NULL CHECK (bytes >= 0),
	nkvr         bigint NOT NULL CHECK (nkvr >= 0),
	body         bytea  NOT NULL,
	sig          bytea  NOT NULL,
	PRIMARY KEY (worker, n)
);
CREATE FUNCTION gateway_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	RAISE EXCEPTION 'credit: % on % refused (%)', TG_OP, TG_TABLE_NAME, TG_ARGV[0];
END $$;
CREATE FUNCTION gateway_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	IF TG_TABLE_NAME = 'gateway_cursor' THEN
		IF NEW.one <> OLD.one OR NEW.last_id < OLD.last_id THEN
			RAISE EXCEPTION 'credit: the cursor only moves forward (% -> %)', OLD.last_id, NEW.last_id;
		END IF;
	ELSIF NEW.worker <> OLD.worker OR NEW.bytes < OLD.bytes OR NEW.nkvr < OLD.nkvr OR NEW.rejected < OLD.rejected
			OR NEW.statements < OLD.statements THEN
		RAISE EXCEPTION 'credit: wallet totals only grow';
	END IF;
	RETURN NEW;
END $$;
CREATE TRIGGER gateway_statements_append_only BEFORE UPDATE OR DELETE ON gateway_statements
	FOR EACH ROW EXECUTE FUNCTION gateway_refuse('statements are append-only');
CREATE TRIGGER gateway_statements_no_truncate BEFORE TRUNCATE ON gateway_statements
	FOR EACH STATEMENT EXECUTE FUNCTION gateway_refuse('statements are append-only');
CREATE TRIGGER gateway_meta_fixed BEFORE UPDATE OR DELETE ON gateway_meta
	FOR EACH ROW EXECUTE FUNCTION gateway_refuse('the signing seed is fixed');
CREATE TRIGGER gateway_meta_no_truncate BEFORE TRUNCATE ON gateway_meta
	FOR EACH STATEMENT EXECUTE FUNCTION gateway_refuse('the signing seed is fixed');
CREATE TRIGGER gateway_cursor_forward BEFORE UPDATE ON gateway_cursor
	FOR EACH ROW EXECUTE FUNCTION gateway_forward_only();
CREATE TRIGGER gateway_cursor_kept BEFORE DELETE ON gateway_cursor
	FOR EACH ROW EXECUTE FUNCTION gateway_refuse('the cursor is kept');
CREATE TRIGGER gateway_cursor_no_truncate BEFORE TRUNCATE ON gateway_cursor
	FOR EACH STATEMENT EXECUTE FUNCTION gateway_refuse('the cursor is kept');
CREATE TRIGGER gateway_wallets_grow BEFORE UPDATE ON gateway_wallets
	FOR EACH ROW EXECUTE FUNCTION gateway_forward_only();
CREATE TRIGGER gateway_wallets_kept BEFORE DELETE ON gateway_wallets
	FOR EACH ROW EXECUTE FUNCTION gateway_refuse('wallets are kept');
CREATE TRIGGER gateway_wallets_no_truncate BEFORE TRUNCATE ON gateway_wallets
	FOR EACH STATEMENT EXECUTE FUNCTION gateway_refuse('wallets are kept');
`}, {Name: "the fingerprint of the cursor's ledger row", SQL: `
ALTER TABLE gateway_cursor ADD COLUMN last_row bytea;
`}}

// pgStore is the wallets in a PostgreSQL database shared by gateways.
type pgStore struct {
	pool *pgxpool.Pool
}

// openPostgres connects to dsn and applies the missing migrations; a
// newer or different schema is refused (ErrSchema) and left as it was.
func openPostgres(ctx context.Context, dsn string) (*pgStore, error) {
	pool, err := pgstore.Connect(ctx, dsn, pgstore.Options{AppName: "kvasir-gateway-wallets", MaxConns: 6})
	if err != nil {
		return nil, fmt.Errorf("credit: %w", err)
	}
	if _, err := pgstore.Migrate(ctx, pool, "wallets", Migrations); err != nil {
		pool.Close()
		if errors.Is(err, pgstore.ErrNewerSchema) || errors.Is(err, pgstore.ErrSchemaMismatch) {
			return nil, fmt.Errorf("%w: %w", ErrSchema, err)
		}
		return nil, fmt.Errorf("credit: %w", err)
	}
	return &pgStore{pool: pool}, nil
}

// openPostgresReadOnly connects to dsn with read-only transactions; the
// wallets schema must be at this program's version (ErrSchema otherwise).
func openPostgresReadOnly(ctx context.Context, dsn string) (*pgStore, error) {
	pool, err := pgstore.Connect(ctx, dsn, pgstore.Options{AppName: "kvasir-wallets-reader", ReadOnly: true, MaxConns: 2})
	if err != nil {
		return nil, fmt.Errorf("credit: %w", err)
	}
	if err := pgstore.CheckVersion(ctx, pool, "wallets", Migrations); err != nil {
		pool.Close()
		return nil, fmt.Errorf("%w: %w", ErrSchema, err)
	}
	return &pgStore{pool: pool}, nil
}

// Kind implements Store.
func (s *pgStore) Kind() string { return "postgres" }

// Close implements Store.
func (s *pgStore) Close() error { s.pool.Close(); return nil }

// Seed implements Store: the first gateway's seed wins (ON CONFLICT DO
// NOTHING), every gateway signs with it.
func (s *pgStore) Seed(ctx context.Context, fresh []byte) ([]byte, error) {
	if fresh != nil {
		if _, err := s.pool.Exec(ctx, `INSERT INTO gateway_meta (k, v) VALUES ('signing_seed', $1) ON CONFLICT (k) DO NOTHING`, fresh); err != nil {
			return nil, err
		}
	}
	var seed []byte
	if err := s.pool.QueryRow(ctx, `SELECT v FROM gateway_meta WHERE k = 'signing_seed'`).Scan(&seed); err != nil {
		return nil, fmt.Errorf("%w: signing seed: %v", ErrSchema, err)
	}
	return seed, nil
}

// Cursor implements Store.
func (s *pgStore) Cursor(ctx context.Context) (int64, error) {
	var c int64
	err := s.pool.QueryRow(ctx, `SELECT last_id FROM gateway_cursor WHERE one = 1`).Scan(&c)
	return c, err
}

// CursorRow implements Store.
func (s *pgStore) CursorRow(ctx context.Context) (int64, []byte, error) {
	var c int64
	var fp []byte
	err := s.pool.QueryRow(ctx, `SELECT last_id, last_row FROM gateway_cursor WHERE one = 1`).Scan(&c, &fp)
	return c, fp, err
}

// Begin implements Store (READ COMMITTED: after LockCursor every
// statement sees what the previous crediting transaction committed).
func (s *pgStore) Begin(ctx context.Context) (Tx, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	return &pgTx{tx: tx}, nil
}

type pgTx struct{ tx pgx.Tx }

// LockCursor implements Tx.
func (t *pgTx) LockCursor(ctx context.Context) (int64, error) {
	var c int64
	err := t.tx.QueryRow(ctx, `SELECT last_id FROM gateway_cursor WHERE one = 1 FOR UPDATE`).Scan(&c)
	return c, err
}

// Wallets implements Tx.
func (t *pgTx) Wallets(ctx context.Context, workers []string) (map[string]Wallet, error) {
	rows, err := t.tx.Query(ctx, `SELECT worker, bytes, nkvr, rejected, statements FROM gateway_wallets WHERE worker = ANY($1)`, workers)
	if err != nil {
		return nil, err
	}
	ws, err := pgx.CollectRows(rows, scanWallet)
	if err != nil {
		return nil, err
	}
	out := make(map[string]Wallet, len(ws))
	for _, w := range ws {
		out[w.Worker] = w
	}
	return out, nil
}

func scanWallet(r pgx.CollectableRow) (Wallet, error) {
	var w Wallet
	var b, n, rj, c int64
	err := r.Scan(&w.Worker, &b, &n, &rj, &c)
	w.Bytes, w.NKVR, w.RejectedBytes, w.Statements = uint64(b), uint64(n), uint64(rj), uint64(c)
	return w, err
}

// Write implements Tx.
func (t *pgTx) Write(ctx context.Context, ws []Wallet, sts []StatementRow, updated time.Time, last int64, lastPrint []byte) error {
	n := len(ws)
	worker := make([]string, n)
	b, k, r, c := make([]int64, n), make([]int64, n), make([]int64, n), make([]int64, n)
	for i, w := range ws {
		worker[i], b[i], k[i], r[i], c[i] = w.Worker, int64(w.Bytes), int64(w.NKVR), int64(w.RejectedBytes), int64(w.Statements)
	}
	if _, err := t.tx.Exec(ctx, `INSERT INTO gateway_wallets (worker, bytes, nkvr, rejected, statements, updated)
		SELECT w, b, k, r, c, $6 FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[]) AS t(w, b, k, r, c)
		ON CONFLICT (worker) DO UPDATE SET bytes = excluded.bytes, nkvr = excluded.nkvr, rejected = excluded.rejected,
			statements = excluded.statements, updated = excluded.updated`,
		worker, b, k, r, c, updated.UnixMilli()); err != nil {
		return fmt.Errorf("wallets: %w", err)
	}
	m := len(sts)
	sw, body, sig := make([]string, m), make([][]byte, m), make([][]byte, m)
	sn, after, upto, sb, sk := make([]int64, m), make([]int64, m), make([]int64, m), make([]int64, m), make([]int64, m)
	for i, st := range sts {
		sw[i], sn[i], after[i], upto[i], sb[i], sk[i], body[i], sig[i] = st.Worker, int64(st.N), st.LedgerAfter, st.LedgerUpTo,
			int64(st.Bytes), int64(st.NKVR), st.Body, st.Sig
	}
	if _, err := t.tx.Exec(ctx, `INSERT INTO gateway_statements (worker, n, ledger_after, ledger_upto, bytes, nkvr, body, sig)
		SELECT * FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::bigint[], $6::bigint[], $7::bytea[], $8::bytea[])`,
		sw, sn, after, upto, sb, sk, body, sig); err != nil {
		return fmt.Errorf("statements: %w", err)
	}
	if _, err := t.tx.Exec(ctx, `UPDATE gateway_cursor SET last_id = $1, last_row = $2 WHERE one = 1`, last, lastPrint); err != nil {
		return fmt.Errorf("cursor: %w", err)
	}
	return nil
}

// Commit implements Tx.
func (t *pgTx) Commit(ctx context.Context) error { return t.tx.Commit(ctx) }

// Rollback implements Tx.
func (t *pgTx) Rollback() error { return t.tx.Rollback(context.Background()) }

// Wallets implements Store.
func (s *pgStore) Wallets(ctx context.Context) ([]Wallet, error) {
	rows, err := s.pool.Query(ctx, `SELECT worker, bytes, nkvr, rejected, statements FROM gateway_wallets ORDER BY worker COLLATE "C"`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, scanWallet)
}

// Statements implements Store.
func (s *pgStore) Statements(ctx context.Context, worker string, after uint64, limit int) ([]walletapi.Signed, error) {
	rows, err := s.pool.Query(ctx, `SELECT body, sig FROM gateway_statements WHERE worker = $1 AND n > $2 ORDER BY n LIMIT $3`, worker, int64(after), limit)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (walletapi.Signed, error) {
		var sg walletapi.Signed
		err := r.Scan(&sg.Body, &sg.Sig)
		return sg, err
	})
}
