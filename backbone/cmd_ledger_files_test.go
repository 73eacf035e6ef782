package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/credit"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/wallet/dbfile"
	"github.com/kvasir-ai/kvasir/wallet/dbfile/dbfiletest"
)

// TestLedgerFilesLeftAlone: `ledger --db`, `wallets --db`, `hub --ledger`
// and the gateway's `--wallets` refuse files that are not theirs (any
// SQLite file of user_version 0, the other kind of kvasir file, a newer
// schema, an empty file for the readers) with a message naming what the
// file is, and leave every file byte for byte as it was, with no -wal/-shm.
func TestLedgerFilesLeftAlone(t *testing.T) {
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "secret")
	if err := os.WriteFile(secretFile, []byte(strings.Repeat("42", 32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Real files of each kind, closed, then switched back to a rollback
	// journal so that a switch to WAL (header byte 19) would show.
	lp, wp := filepath.Join(dir, "ledger.sqlite"), filepath.Join(dir, "wallets.sqlite")
	l, err := ledger.Open(lp)
	if err != nil {
		t.Fatal(err)
	}
	s, err := credit.Open(credit.Config{Path: wp, Source: l})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	l.Close()
	dbfiletest.ToRollback(t, lp, -1, -1)
	dbfiletest.ToRollback(t, wp, -1, -1)
	other := dbfiletest.Make(t, filepath.Join(dir, "other.sqlite"), []string{"notes"}, 0, 0)
	fresh := dbfiletest.Make(t, filepath.Join(dir, "fresh.sqlite"), nil, 0, 0)
	newerL := filepath.Join(dir, "newer-ledger.sqlite")
	newerW := filepath.Join(dir, "newer-wallets.sqlite")
	newer := map[string]int{newerL: ledger.SchemaVersion + 1, newerW: credit.SchemaVersion + 1}
	for src, dst := range map[string]string{lp: newerL, wp: newerW} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, b, 0o600); err != nil {
			t.Fatal(err)
		}
		dbfiletest.ToRollback(t, dst, newer[dst], -1)
	}
	before := dbfiletest.Snapshot(t, dir)
	if len(before) != 7 {
		t.Fatalf("setup left %v", before)
	}

	run := func(name string, main func([]string, *bytes.Buffer, *bytes.Buffer) int, args []string, say string) {
		t.Helper()
		var out, errb bytes.Buffer
		code := main(args, &out, &errb)
		if code != 1 || !strings.Contains(errb.String(), say) || out.Len() != 0 {
			t.Errorf("%s %v: exit %d, stdout %q, stderr %q; want exit 1 saying %q", name, args, code, out.String(), errb.String(), say)
		}
	}
	ledgerCmd := func(a []string, o, e *bytes.Buffer) int { return ledgerMain(a, o, e) }
	walletsCmd := func(a []string, o, e *bytes.Buffer) int { return walletsMain(a, o, e) }
	run("ledger", ledgerCmd, []string{"--db", other, "--json"}, "not a kvasir contribution ledger")
	run("ledger", ledgerCmd, []string{"--db", fresh, "--json"}, "not a kvasir contribution ledger")
	run("ledger", ledgerCmd, []string{"--db", wp, "--json"}, "is a kvasir gateway wallets file, not a kvasir contribution ledger")
	run("ledger", ledgerCmd, []string{"--db", newerL, "--json"}, fmt.Sprintf("schema version %d", ledger.SchemaVersion+1))
	run("ledger", ledgerCmd, []string{"--db", filepath.Join(dir, "missing.sqlite")}, "no such file")
	run("wallets", walletsCmd, []string{"--db", lp}, "is a kvasir contribution ledger, not a kvasir gateway wallets file")
	run("wallets", walletsCmd, []string{"--db", other}, "not a kvasir gateway wallets file")
	run("wallets", walletsCmd, []string{"--db", newerW}, "schema version 2")
	run("wallets", walletsCmd, []string{"--db", filepath.Join(dir, "missing.sqlite")}, "no such file")
	for _, f := range []string{wp, other, newerL} {
		done := make(chan int, 1)
		go func() {
			done <- runHub([]string{"--listen", "127.0.0.1:0", "--secret-file", secretFile, "--ledger", f})
		}()
		select {
		case code := <-done:
			if code != 1 {
				t.Errorf("hub --ledger %s: exit %d", filepath.Base(f), code)
			}
		case <-time.After(10 * time.Second):
			// It accepted the file and is serving. Fail at once rather than
			// signal the test process (another test's handler may take the
			// signal, and the wait would hang); the hub goroutine is leaked
			// in this failing run only.
			t.Fatalf("hub --ledger %s: accepted the file", filepath.Base(f))
		}
	}
	for f, say := range map[string]string{lp: "is a kvasir contribution ledger", other: "not a kvasir gateway wallets file", newerW: "schema version 2"} {
		fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
		cf := addCreditFlags(fs)
		if err := fs.Parse([]string{"--wallets", f}); err != nil {
			t.Fatal(err)
		}
		cr, err := cf.start(context.Background(), "127.0.0.1:1", []byte("secret"), t.Logf)
		if err == nil {
			cr.Stop()
		}
		if !strings.Contains(errString(err), say) {
			t.Errorf("gateway --wallets %s: %v, want %q", filepath.Base(f), err, say)
		}
	}
	dbfiletest.Unchanged(t, dir, before)

	// The real files are read without a byte changing.
	var out, errb bytes.Buffer
	if code := ledgerMain([]string{"--db", lp, "--json"}, &out, &errb); code != 0 || !strings.Contains(out.String(), `"workers": []`) {
		t.Errorf("ledger --db ledger: %d %s %s", code, out.String(), errb.String())
	}
	if code := walletsMain([]string{"--db", wp, "--json"}, &out, &errb); code != 0 {
		t.Errorf("wallets --db wallets: %d %s", code, errb.String())
	}
	dbfiletest.Unchanged(t, dir, before)
	if _, err := dbfile.Check(lp, dbfile.Ledger); err != nil {
		t.Error(err)
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
