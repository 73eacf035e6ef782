package credit

import (
	"path/filepath"
	"testing"

	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// backend is where a test keeps its ledger and wallets: SQLite files, or
// one PostgreSQL database (KVASIR_TEST_PG_DSN; the subtest skips without).
type backend struct {
	name string
	pg   bool
}

var backends = []backend{{"sqlite", false}, {"postgres", true}}

// paths returns a fresh ledger and wallets location: two files in a new
// folder, or the URL of a new database holding both.
func (b backend) paths(t *testing.T) (ledgerPath, walletsPath string) {
	t.Helper()
	if !b.pg {
		dir := t.TempDir()
		return filepath.Join(dir, "ledger.db"), filepath.Join(dir, "wallets.db")
	}
	dsn := pgtest.DSN(t)
	return dsn, dsn
}

// forBackends runs f as a subtest per backend.
func forBackends(t *testing.T, f func(t *testing.T, b backend)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			if b.pg {
				pgtest.Server(t) // skips the whole backend without a server
			}
			f(t, b)
		})
	}
}
