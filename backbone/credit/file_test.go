package credit

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/dbfile/dbfiletest"
)

// TestBadWalletsFilesUntouched: Open (the gateway's --wallets) and
// OpenReadOnly (`backbone wallets`) refuse a file that is not a wallets file
// of this version before writing anything: same bytes (header byte 19 stays
// 1: no switch to WAL), no -wal/-shm left, an error naming what it is.
func TestBadWalletsFilesUntouched(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, tables []string, v int, id int32) string {
		return dbfiletest.Make(t, filepath.Join(dir, name), tables, v, id)
	}
	type tc struct {
		path string
		err  error
		say  string
	}
	cases := []tc{
		{mk("newer", dbfile.GatewayWallets.Tables, 2, dbfile.AppIDGatewayWallets), dbfile.ErrNewerSchema, "schema version 2"},
		{mk("ledger", dbfile.Ledger.Tables, 1, dbfile.AppIDLedger), dbfile.ErrForeign, "is a kvasir contribution ledger"},
		{mk("legacy-ledger", dbfile.Ledger.Tables, 1, 0), dbfile.ErrForeign, "is a kvasir contribution ledger"},
		{mk("worker", dbfile.WorkerWallet.Tables, 1, dbfile.AppIDWorkerWallet), dbfile.ErrForeign, "is a kvasir worker wallet"},
		{mk("other", []string{"t"}, 0, 0), dbfile.ErrForeign, "not a kvasir gateway wallets file"},
	}
	garbage := filepath.Join(dir, "garbage")
	if err := os.WriteFile(garbage, bytes.Repeat([]byte("x"), 4096), 0o600); err != nil {
		t.Fatal(err)
	}
	cases = append(cases, tc{garbage, dbfile.ErrCorrupt, "not an SQLite database"})
	before := dbfiletest.Snapshot(t, dir)
	for _, c := range cases {
		s, err := Open(Config{Path: c.path})
		if err == nil {
			s.Close()
		}
		r, rerr := OpenReadOnly(c.path)
		if rerr == nil {
			r.Close()
		}
		for _, e := range []error{err, rerr} {
			if !errors.Is(e, ErrSchema) || !errors.Is(e, c.err) || !strings.Contains(e.Error(), c.say) {
				t.Errorf("%s: %v, want ErrSchema and %v saying %q", filepath.Base(c.path), e, c.err, c.say)
			}
		}
	}
	dbfiletest.Unchanged(t, dir, before)
}

// TestWalletsAppIDReadOnlyAndAdoption: a new wallets file carries
// dbfile.AppIDGatewayWallets; OpenReadOnly reads the same key, cursor and
// wallets without changing a byte; a file written before application ids
// is adopted by Open with its contents.
func TestWalletsAppIDReadOnlyAndAdoption(t *testing.T) {
	dir := t.TempDir()
	l, s := openPair(t, dir, 7)
	if err := l.Append(ledger.Entry{SessionID: "s", WorkerID: workerID(1), BytesIn: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Credit(context.Background()); err != nil {
		t.Fatal(err)
	}
	pub := s.PublicKey()
	s.Close()
	l.Close()
	wp := filepath.Join(dir, "wallets.db")
	if info, err := dbfile.Check(wp, dbfile.GatewayWallets); err != nil || info.State != dbfile.Current {
		t.Fatalf("new wallets file: %+v, %v", info, err)
	}
	before := dbfiletest.Snapshot(t, dir)
	r, err := OpenReadOnly(wp)
	if err != nil {
		t.Fatal(err)
	}
	cur, cerr := r.Cursor()
	ws, werr := r.Wallets()
	if !bytes.Equal(r.PublicKey(), pub) || cur != 1 || cerr != nil || werr != nil || len(ws) != 1 || ws[0].NKVR != 7000 {
		t.Fatalf("read-only: key %x cursor %d (%v) wallets %+v (%v)", r.PublicKey(), cur, cerr, ws, werr)
	}
	r.Close()
	dbfiletest.Unchanged(t, dir, before)
	if _, err := OpenReadOnly(filepath.Join(dir, "missing")); !errors.Is(err, dbfile.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}

	dbfiletest.ToRollback(t, wp, -1, 0)
	if info, err := dbfile.Check(wp, dbfile.GatewayWallets); err != nil || info.State != dbfile.Legacy {
		t.Fatalf("legacy wallets file: %+v, %v", info, err)
	}
	s2, err := Open(Config{Path: wp})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(s2.PublicKey(), pub) {
		t.Error("adopted file lost its signing key")
	}
	s2.Close()
	if info, err := dbfile.Check(wp, dbfile.GatewayWallets); err != nil || info.State != dbfile.Current {
		t.Fatalf("adopted wallets file: %+v, %v", info, err)
	}
}
