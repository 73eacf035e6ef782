//go:build unix

package ledger

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestSQLiteFileMode: a new ledger file, and the WAL files SQLite makes
// beside it, are readable by their owner only (0600), as the wallets
// are: the ledger names every worker key and the bytes it served.
func TestSQLiteFileMode(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	p := filepath.Join(t.TempDir(), "ledger.sqlite")
	l, err := Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Append(Entry{SessionID: "s", WorkerID: strings.Repeat("ab", 32), BytesIn: 1, Time: time.Now()}); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{p, p + "-wal", p + "-shm"} {
		fi, err := os.Stat(f)
		if errors.Is(err, os.ErrNotExist) && f != p {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if m := fi.Mode().Perm(); m != 0o600 {
			t.Errorf("%s: mode %v, want 0600", filepath.Base(f), m)
		}
	}
}
