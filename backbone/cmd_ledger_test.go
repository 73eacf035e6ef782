package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/backbone/credit"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
)

func TestLedgerAndWalletsCommands(t *testing.T) {
	dir := t.TempDir()
	lp, wp := filepath.Join(dir, "ledger.db"), filepath.Join(dir, "wallets.db")
	l, err := ledger.Open(lp)
	if err != nil {
		t.Fatal(err)
	}
	seed := make([]byte, 32)
	a := hex.EncodeToString(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey))
	seed[0] = 1
	b := hex.EncodeToString(ed25519.NewKeyFromSeed(seed).Public().(ed25519.PublicKey))
	for _, e := range []ledger.Entry{
		{SessionID: "1", WorkerID: a, BytesIn: 277_952, BytesOut: 1_000_000},
		{SessionID: "2", WorkerID: b, BytesIn: 10, RejectedBytes: 5},
		{SessionID: "3", WorkerID: b, BytesOut: 20, RejectedBytes: 1},
	} {
		if err := l.Append(e); err != nil {
			t.Fatal(err)
		}
	}
	var out, errb bytes.Buffer
	if code := ledgerMain([]string{"--db", lp, "--json"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	var got struct {
		Workers []struct {
			ID            string `json:"id"`
			Bytes         uint64 `json:"bytes"`
			RejectedBytes uint64 `json:"rejected_bytes"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]uint64{a: {1_277_952, 0}, b: {30, 6}}
	if len(got.Workers) != 2 {
		t.Fatalf("workers %+v", got.Workers)
	}
	for _, w := range got.Workers {
		if want[w.ID] != [2]uint64{w.Bytes, w.RejectedBytes} {
			t.Errorf("worker %s: %d/%d, want %v", w.ID[:8], w.Bytes, w.RejectedBytes, want[w.ID])
		}
	}
	out.Reset()
	if code := ledgerMain([]string{"--db", lp}, &out, &errb); code != 0 || !strings.Contains(out.String(), "1.277952") {
		t.Fatalf("table: %d %s", code, out.String())
	}
	if code := ledgerMain([]string{"--db", filepath.Join(dir, "missing.db")}, &out, &errb); code != 1 {
		t.Fatalf("missing file: exit %d", code)
	}

	s, err := credit.Open(credit.Config{Path: wp, Source: l})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Credit(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.Close()
	l.Close()
	out.Reset()
	if code := walletsMain([]string{"--db", wp}, &out, &errb); code != 0 || !strings.Contains(out.String(), "0.00895 KVR") || !strings.Contains(out.String(), "ledger id 3") {
		t.Fatalf("wallets: %d %s %s", code, out.String(), errb.String())
	}
}
