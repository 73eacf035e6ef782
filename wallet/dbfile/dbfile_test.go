package dbfile_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/dbfile/dbfiletest"
)

// TestAppIDHeaderBytes: the ids are the documented ASCII tags, and SQLite
// stores them big-endian at header offset 68 (fileformat2.html).
func TestAppIDHeaderBytes(t *testing.T) {
	dir := t.TempDir()
	for tag, k := range map[string]dbfile.Kind{"KVLG": dbfile.Ledger, "KVGW": dbfile.GatewayWallets, "KVWW": dbfile.WorkerWallet} {
		p := dbfiletest.Make(t, filepath.Join(dir, tag), k.Tables, 1, k.AppID)
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := string(b[68:72]); got != tag {
			t.Errorf("%s: header bytes 68..71 = %q", k.Name, got)
		}
		if got := b[63]; got != 1 { // user_version, big-endian at 60
			t.Errorf("%s: user_version byte %d", k.Name, got)
		}
	}
}

func TestCheckClassifies(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, tables []string, v int, id int32) string {
		return dbfiletest.Make(t, filepath.Join(dir, name), tables, v, id)
	}
	ledger := mk("ledger", dbfile.Ledger.Tables, dbfile.Ledger.Version, dbfile.AppIDLedger)
	legacyLedger := mk("legacy-ledger", dbfile.Ledger.Tables, 1, 0)
	wallets := mk("wallets", dbfile.GatewayWallets.Tables, 1, dbfile.AppIDGatewayWallets)
	legacyWallets := mk("legacy-wallets", dbfile.GatewayWallets.Tables, 1, 0)
	newer := mk("newer", dbfile.Ledger.Tables, 3, dbfile.AppIDLedger)
	olderLedger := mk("older-ledger", dbfile.Ledger.Tables, 1, dbfile.AppIDLedger)
	newerLegacy := mk("newer-legacy", dbfile.Ledger.Tables, 3, 0)
	other := mk("other", []string{"entries"}, 0, 0)
	otherApp := mk("other-app", []string{"t"}, 1, 0x12345678)
	fresh := mk("fresh", nil, 0, 0)
	wrongTables := mk("wrong-tables", []string{"entries", "extra"}, 1, dbfile.AppIDLedger)
	empty := filepath.Join(dir, "empty")
	garbage := filepath.Join(dir, "garbage")
	truncated := filepath.Join(dir, "truncated")
	folder := filepath.Join(dir, "folder")
	if err := os.Mkdir(folder, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(garbage, []byte(strings.Repeat("not a database ", 100)), 0o600); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(ledger)
	if err := os.WriteFile(truncated, b[:len(b)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		path  string
		state dbfile.State
		err   error
		say   string // substring of the error
	}{
		{filepath.Join(dir, "missing"), dbfile.Missing, nil, ""},
		{empty, dbfile.Empty, nil, ""},
		{fresh, dbfile.Empty, nil, ""},
		{ledger, dbfile.Current, nil, ""},
		{legacyLedger, dbfile.Legacy, nil, ""},
		{wallets, 0, dbfile.ErrForeign, "is a kvasir gateway wallets file, not a kvasir contribution ledger"},
		{legacyWallets, 0, dbfile.ErrForeign, "is a kvasir gateway wallets file (written before application ids)"},
		{newer, 0, dbfile.ErrNewerSchema, "schema version 3"},
		{olderLedger, dbfile.Older, nil, ""},
		{newerLegacy, 0, dbfile.ErrNewerSchema, "schema version 3"},
		{other, 0, dbfile.ErrForeign, "tables [entries] and user_version 0"},
		{otherApp, 0, dbfile.ErrForeign, "application_id 0x12345678"},
		{wrongTables, 0, dbfile.ErrCorrupt, "tables [entries extra]"},
		{garbage, 0, dbfile.ErrCorrupt, "no SQLite header"},
		{truncated, 0, dbfile.ErrCorrupt, ""},
		{folder, 0, dbfile.ErrCorrupt, "is a folder, not a kvasir contribution ledger file"},
	}
	before := dbfiletest.Snapshot(t, dir)
	for _, c := range cases {
		info, err := dbfile.Check(c.path, dbfile.Ledger)
		name := filepath.Base(c.path)
		switch {
		case c.err == nil && err != nil:
			t.Errorf("%s: %v", name, err)
		case c.err == nil && info.State != c.state:
			t.Errorf("%s: state %d, want %d", name, info.State, c.state)
		case c.err != nil && !errors.Is(err, c.err):
			t.Errorf("%s: %v, want %v", name, err, c.err)
		case c.err != nil && !strings.Contains(err.Error(), c.say):
			t.Errorf("%s: %q does not say %q", name, err, c.say)
		}
	}
	dbfiletest.Unchanged(t, dir, before)
	if _, err := dbfile.CheckExisting(filepath.Join(dir, "missing"), dbfile.Ledger); !errors.Is(err, dbfile.ErrNotExist) {
		t.Errorf("CheckExisting missing: %v", err)
	}
	if _, err := dbfile.CheckExisting(fresh, dbfile.Ledger); !errors.Is(err, dbfile.ErrForeign) {
		t.Errorf("CheckExisting fresh: %v", err)
	}
}

// FuzzCheck: any bytes in the file give a state or an error, never a
// panic, and the directory is left as it was.
func FuzzCheck(f *testing.F) {
	dir := f.TempDir()
	p := dbfiletest.Make(f, filepath.Join(dir, "seed"), dbfile.Ledger.Tables, 1, dbfile.AppIDLedger)
	valid, err := os.ReadFile(p)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add(valid[:100])
	f.Add(valid[:len(valid)-1])
	f.Add(append(append([]byte{}, valid...), make([]byte, 4096)...))
	f.Add([]byte("SQLite format 3\x00"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		p := filepath.Join(dir, "f")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		before := dbfiletest.Snapshot(t, dir)
		for _, k := range []dbfile.Kind{dbfile.Ledger, dbfile.GatewayWallets, dbfile.WorkerWallet} {
			_, _ = dbfile.Check(p, k)
		}
		dbfiletest.Unchanged(t, dir, before)
	})
}

// TestCreateEmpty: a missing path becomes an empty 0600 file that Check
// reports Empty; an existing file is left byte for byte; a path in a
// missing directory is an error.
func TestCreateEmpty(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "new.sqlite")
	if err := dbfile.CreateEmpty(p); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() != 0 || st.Mode().Perm() != 0o600 {
		t.Errorf("created %v, %d bytes; want mode 0600, 0 bytes", st.Mode().Perm(), st.Size())
	}
	if info, err := dbfile.Check(p, dbfile.Ledger); err != nil || info.State != dbfile.Empty {
		t.Errorf("Check of the created file: %+v, %v; want Empty", info, err)
	}
	old := filepath.Join(dir, "old")
	if err := os.WriteFile(old, []byte("keep me"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := dbfile.CreateEmpty(old); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(old); string(b) != "keep me" {
		t.Errorf("existing file now holds %q", b)
	}
	if err := dbfile.CreateEmpty(filepath.Join(dir, "missing", "x")); err == nil {
		t.Error("CreateEmpty in a missing directory: no error")
	}
}

// Writable names what cannot be written: the file, or its folder (where
// SQLite creates the -wal and -shm files); nil for a writable folder and a
// file that does not exist yet.
func TestWritable(t *testing.T) {
	dir := t.TempDir()
	if err := dbfile.Writable(filepath.Join(dir, "new.db")); err != nil {
		t.Fatalf("writable folder: %v", err)
	}
	// A folder nobody may create files in, root included.
	if runtime.GOOS == "linux" {
		if err := dbfile.Writable("/proc/kvasir-wallet.db"); !errors.Is(err, dbfile.ErrNotWritable) || !strings.Contains(err.Error(), "-wal and -shm") {
			t.Fatalf("/proc: %v", err)
		}
	}
	ro := filepath.Join(dir, "ro")
	if err := os.Mkdir(ro, 0o500); err != nil {
		t.Fatal(err)
	}
	defer os.Chmod(ro, 0o700)
	if f, err := os.CreateTemp(ro, "probe"); err == nil { // root ignores the mode
		f.Close()
		os.Remove(f.Name())
		t.Skip("running as root: a 0500 folder is writable")
	}
	if err := dbfile.Writable(filepath.Join(ro, "w.db")); !errors.Is(err, dbfile.ErrNotWritable) || !strings.Contains(err.Error(), "-wal and -shm") {
		t.Fatalf("read-only folder: %v", err)
	}
}

// TestCheckUnreadable: a ledger with a write-ahead log in a folder this
// user may not write to (SQLite must create the -shm file to read the
// log) is ErrUnreadable with the reason, not "corrupt"; once the folder is
// writable it checks as a current ledger.
func TestCheckUnreadable(t *testing.T) {
	src := filepath.Join(t.TempDir(), "l.db")
	dbfiletest.Make(t, src, dbfile.Ledger.Tables, dbfile.Ledger.Version, dbfile.AppIDLedger)
	dsn, err := dbfile.DSN(src, "_journal_mode=WAL")
	if err != nil {
		t.Fatal(err)
	}
	db, err := dbfile.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`PRAGMA wal_autocheckpoint = 0; INSERT INTO entries VALUES (1)`); err != nil {
		t.Fatal(err)
	}
	// A copy of the file and its log as a writer leaves them while it runs.
	dir := t.TempDir()
	dst := filepath.Join(dir, "l.db")
	for _, sfx := range []string{"", "-wal"} {
		b, err := os.ReadFile(src + sfx)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst+sfx, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if os.Geteuid() == 0 {
		if out, err := exec.Command("chattr", "+i", dir).CombinedOutput(); err != nil {
			t.Skipf("root, and chattr +i failed (%v: %s)", err, out)
		}
		defer exec.Command("chattr", "-i", dir).Run()
	} else {
		if err := os.Chmod(dir, 0o500); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(dir, 0o700)
	}
	_, err = dbfile.Check(dst, dbfile.Ledger)
	if !errors.Is(err, dbfile.ErrUnreadable) || errors.Is(err, dbfile.ErrCorrupt) || !strings.Contains(err.Error(), "-shm") {
		t.Fatalf("read-only folder with a log: %v", err)
	}
	if os.Geteuid() == 0 {
		exec.Command("chattr", "-i", dir).Run()
	} else {
		os.Chmod(dir, 0o700)
	}
	if info, err := dbfile.Check(dst, dbfile.Ledger); err != nil || info.State != dbfile.Current {
		t.Fatalf("writable again: %+v, %v", info, err)
	}
}
