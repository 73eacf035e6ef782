package wallet

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/dbfile/dbfiletest"
)

// TestForeignFilesUntouched: a gateway wallets file, a hub ledger (with or
// without application id), any other SQLite file and a newer worker wallet
// are refused by Open with an error naming what the file is, and the
// directory is left byte for byte as it was (no WAL switch, no -wal/-shm).
func TestForeignFilesUntouched(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, tables []string, v int, id int32) string {
		return dbfiletest.Make(t, filepath.Join(dir, name), tables, v, id)
	}
	cases := []struct {
		path string
		err  error
		say  string
	}{
		{mk("gw", dbfile.GatewayWallets.Tables, 1, dbfile.AppIDGatewayWallets), ErrCorrupt, "is a kvasir gateway wallets file, not a kvasir worker wallet"},
		{mk("legacy-gw", dbfile.GatewayWallets.Tables, 1, 0), ErrCorrupt, "is a kvasir gateway wallets file (written before application ids)"},
		{mk("ledger", dbfile.Ledger.Tables, 1, dbfile.AppIDLedger), ErrCorrupt, "is a kvasir contribution ledger"},
		{mk("other", []string{"t"}, 0, 0), ErrCorrupt, "not a kvasir worker wallet"},
		{mk("newer", dbfile.WorkerWallet.Tables, 2, dbfile.AppIDWorkerWallet), ErrNewerSchema, "schema version 2"},
	}
	before := dbfiletest.Snapshot(t, dir)
	for _, c := range cases {
		w, err := Open(c.path, testID(1), Options{})
		if err == nil {
			w.Close()
		}
		if !errors.Is(err, c.err) || !strings.Contains(errString(err), c.say) {
			t.Errorf("%s: %v, want %v saying %q", filepath.Base(c.path), err, c.err, c.say)
		}
	}
	dbfiletest.Unchanged(t, dir, before)
}

// TestWalletAppIDAndAdoption: a new wallet carries
// dbfile.AppIDWorkerWallet; one written before application ids keeps its
// counts and gets the id; Check itself changes nothing.
func TestWalletAppIDAndAdoption(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "w.db")
	id := testID(3)
	w, err := Open(p, id, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.Served("s", 100, 23)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if info, err := Check(p); err != nil || info.State != dbfile.Current || info.AppID != dbfile.AppIDWorkerWallet {
		t.Fatalf("new wallet: %+v, %v", info, err)
	}
	dbfiletest.ToRollback(t, p, -1, 0)
	before := dbfiletest.Snapshot(t, dir)
	if info, err := Check(p); err != nil || info.State != dbfile.Legacy {
		t.Fatalf("legacy wallet: %+v, %v", info, err)
	}
	dbfiletest.Unchanged(t, dir, before)
	if _, err := Open(p, testID(4), Options{}); !errors.Is(err, ErrWrongIdentity) {
		t.Fatalf("legacy wallet, other identity: %v", err)
	}
	dbfiletest.Unchanged(t, dir, before) // the refused adoption rolled back
	w, err = Open(p, id, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var in, out int64
	if err := w.db.QueryRow(`SELECT bytes_in, bytes_out FROM sessions WHERE session = 's'`).Scan(&in, &out); err != nil || in != 100 || out != 23 {
		t.Fatalf("adopted counts %d/%d, %v", in, out, err)
	}
	w.Close()
	if info, err := Check(p); err != nil || info.State != dbfile.Current {
		t.Fatalf("adopted wallet: %+v, %v", info, err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
