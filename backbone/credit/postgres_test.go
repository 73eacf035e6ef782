package credit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// TestPGWalletsShared: gateways opening one PostgreSQL database share the
// signing key, the cursor and the wallets; the reference vector credits
// once whichever gateway runs; the database refuses to rewrite history
// (statements, seed, cursor backwards, shrinking or deleted wallets), a
// newer schema is refused, and OpenReadOnly reads without writing.
func TestPGWalletsShared(t *testing.T) {
	dsn := pgtest.DSN(t)
	l, err := ledger.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	a, err := Open(Config{Path: dsn, Source: l})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := Open(Config{Path: dsn, Source: l})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if a.Store().Kind() != "postgres" || !bytes.Equal(a.PublicKey(), b.PublicKey()) {
		t.Fatalf("kind %s; gateways sign with different keys", a.Store().Kind())
	}
	if err := l.Append(ledger.Entry{SessionID: "s", WorkerID: workerID(1), BytesOut: 1_000_000, RejectedBytes: 4096}); err != nil {
		t.Fatal(err)
	}
	if err := l.Append(ledger.Entry{SessionID: "s", WorkerID: workerID(1), BytesIn: 277_952, Final: true}); err != nil {
		t.Fatal(err)
	}
	ra, err := a.Credit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	rb, err := b.Credit(context.Background())
	if err != nil || ra.NKVR != 8_945_664 || rb.Rows != 0 {
		t.Fatalf("credits %+v then %+v (%v)", ra, rb, err)
	}
	ws, _ := b.Wallets()
	if len(ws) != 1 || ws[0].NKVR != 8_945_664 || ws[0].RejectedBytes != 4096 || walletapi.FormatKVR(ws[0].NKVR) != "0.00895 KVR" {
		t.Fatalf("wallets %+v", ws)
	}
	checkStatements(t, b)
	if st := a.Stats(); st.Rows != 2 || st.NKVR != 8_945_664 || st.Cursor != 2 || st.LagRows != 2 {
		t.Errorf("stats %+v", st)
	}
	for _, q := range []string{
		`UPDATE gateway_statements SET nkvr = 0`, `DELETE FROM gateway_statements`, `TRUNCATE gateway_statements`,
		`UPDATE gateway_meta SET v = '\x00'`, `DELETE FROM gateway_meta`,
		`UPDATE gateway_cursor SET last_id = 0`, `DELETE FROM gateway_cursor`,
		`UPDATE gateway_wallets SET nkvr = nkvr - 1`, `DELETE FROM gateway_wallets`, `TRUNCATE gateway_wallets`,
	} {
		if err := pgtest.Exec(t, dsn, q); pgstore.Code(err) != pgstore.CodeRaiseException {
			t.Errorf("%s: %v, want refused by a trigger", q, err)
		}
	}
	if err := pgtest.Exec(t, dsn, `INSERT INTO gateway_wallets (worker, bytes, nkvr, rejected, statements, updated) VALUES ('nope', 1, 1, 0, 0, 0)`); pgstore.Code(err) != pgstore.CodeCheckViolation {
		t.Errorf("forged wallet: %v", err)
	}
	r, err := OpenReadOnly(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := r.Cursor(); c != 2 || !bytes.Equal(r.PublicKey(), a.PublicKey()) {
		t.Errorf("read-only: cursor %d", c)
	}
	if _, err := r.st.Seed(context.Background(), make([]byte, 32)); pgstore.Code(err) != "25006" {
		t.Errorf("a write through the read-only store: %v, want refused (read-only transaction)", err)
	}
	r.Close()
	if err := pgtest.Exec(t, dsn, fmt.Sprintf(`INSERT INTO kvasir_schema_migrations (component, version, name, sha256) VALUES ('wallets', %d, 'future', 'x')`, len(Migrations)+1)); err != nil {
		t.Fatal(err)
	}
	for _, open := range []func() error{
		func() error { s, err := Open(Config{Path: dsn, Source: l}); closeIf(s); return err },
		func() error { s, err := OpenReadOnly(dsn); closeIf(s); return err },
	} {
		if err := open(); !errors.Is(err, ErrSchema) || !errors.Is(err, pgstore.ErrNewerSchema) {
			t.Errorf("newer wallets schema: %v", err)
		}
	}
}

func closeIf(s *Service) {
	if s != nil {
		s.Close()
	}
}
