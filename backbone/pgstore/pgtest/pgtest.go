// Package pgtest gives tests a fresh PostgreSQL database on the server
// named by KVASIR_TEST_PG_DSN, which scripts/pg.sh starts (scripts/test.sh
// does it for the whole suite). Without the variable the tests skip,
// saying so.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Env names the variable holding the server's URL.
const Env = "KVASIR_TEST_PG_DSN"

// SkipMessage is why PostgreSQL tests skip when Env is unset.
const SkipMessage = Env + " is unset: no PostgreSQL server for this test (start one with: eval \"$(bash scripts/pg.sh start)\"; scripts/test.sh does)"

// Server returns the server URL from Env, skipping t when it is unset.
func Server(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(Env)
	if dsn == "" {
		t.Skip(SkipMessage)
	}
	return dsn
}

// DSN creates a new empty database on the server of Env and returns its
// URL; the database is dropped when t ends. It skips t when Env is unset.
func DSN(t testing.TB) string {
	t.Helper()
	base := Server(t)
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "kvasir_t_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgtest: connect to %s: %v", Env, err)
	}
	defer c.Close(ctx)
	if _, err := c.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: drop %s: %v", name, err)
		}
	})
	return WithDatabase(t, base, name)
}

// WithDatabase returns dsn with its database replaced by name.
func WithDatabase(t testing.TB, dsn, name string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatalf("pgtest: %s: %v", Env, err)
	}
	u.Path = "/" + name
	return u.String()
}

// Exec runs one statement on dsn with a fresh connection (tests use it to
// try what the stores must refuse) and returns its error.
func Exec(t testing.TB, dsn, sql string, args ...any) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, err := pgx.Connect(ctx, dsn)
	if err != nil {
		t.Fatalf("pgtest: connect: %v", err)
	}
	defer c.Close(ctx)
	_, err = c.Exec(ctx, sql, args...)
	return err
}
