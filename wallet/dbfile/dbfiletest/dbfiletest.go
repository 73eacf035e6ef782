// Package dbfiletest has test helpers for the "file left untouched"
// checks of kvasir's SQLite files: a snapshot of every file in a directory
// (name -> SHA-256 of its bytes) and a maker of SQLite files with a given
// schema, user_version and application_id.
package dbfiletest

import (
	"crypto/sha256"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvasir-ai/kvasir/wallet/dbfile"
)

// Snapshot returns name -> hex SHA-256 of every regular file in dir
// (not recursive), so -wal/-shm/-journal files that appear are seen too.
func Snapshot(t testing.TB, dir string) map[string]string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		out[e.Name()] = fmt.Sprintf("%x", sha256.Sum256(b))
	}
	return out
}

// Unchanged fails t unless dir holds exactly the files of before, byte
// for byte.
func Unchanged(t testing.TB, dir string, before map[string]string) {
	t.Helper()
	after := Snapshot(t, dir)
	if maps.Equal(before, after) {
		return
	}
	for _, n := range slices.Sorted(maps.Keys(after)) {
		if b, ok := before[n]; !ok {
			t.Errorf("%s: new file appeared", n)
		} else if b != after[n] {
			t.Errorf("%s: bytes changed (sha256 %.16s -> %.16s)", n, b, after[n])
		}
	}
	for n := range before {
		if _, ok := after[n]; !ok {
			t.Errorf("%s: file disappeared", n)
		}
	}
}

// Make creates an SQLite file at path in rollback-journal mode (header
// bytes 18-19 = 1, so a switch to WAL would show) holding one table per
// name in tables (a single column x), with the given user_version and
// application_id. It returns path.
func Make(t testing.TB, path string, tables []string, version int, appID int32) string {
	t.Helper()
	dsn, err := dbfile.DSN(path, "_journal_mode=DELETE")
	if err != nil {
		t.Fatal(err)
	}
	db, err := dbfile.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, tb := range tables {
		if _, err := db.Exec(fmt.Sprintf(`CREATE TABLE %q (x)`, tb)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec(fmt.Sprintf(`PRAGMA user_version = %d; PRAGMA application_id = %d`, version, appID)); err != nil {
		t.Fatal(err)
	}
	return path
}

// ToRollback switches an existing SQLite file (closed by its writer) back
// to rollback-journal mode, so header bytes 18-19 read 1 and a later switch
// to WAL is visible in a byte comparison, and sets user_version and
// application_id (pass version < 0 or appID == -1 to keep them).
func ToRollback(t testing.TB, path string, version int, appID int64) {
	t.Helper()
	dsn, err := dbfile.DSN(path)
	if err != nil {
		t.Fatal(err)
	}
	db, err := dbfile.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if _, err := db.Exec(`PRAGMA journal_mode = DELETE`); err != nil {
		t.Fatal(err)
	}
	if version >= 0 {
		if _, err := db.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, version)); err != nil {
			t.Fatal(err)
		}
	}
	if appID != -1 {
		if _, err := db.Exec(fmt.Sprintf(`PRAGMA application_id = %d`, appID)); err != nil {
			t.Fatal(err)
		}
	}
}
