package main

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"flag"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/credit"
	"github.com/kvasir-ai/kvasir/backbone/gateway"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/wallet"
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

// TestGatewayCreditsThroughHub wires the crediting as `backbone gateway
// --wallets` does: a real hub serving its ledger behind the shared-secret
// HMAC, a real TLS gateway serving /v1/wallet/, crediting over loopback, and
// a worker wallet syncing its verified statements through the gateway.
func TestGatewayCreditsThroughHub(t *testing.T) {
	dir := t.TempDir()
	secret := bytes.Repeat([]byte{0x42}, 32)
	l, err := ledger.Open(filepath.Join(dir, "ledger.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Backbone: "127.0.0.1:1", Secret: secret, Meter: l,
		Extra: map[string]http.Handler{ledger.Path: ledger.Handler(l, func(r *http.Request) bool { return hub.Authorized(r, secret) })}})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	// Without the secret the ledger is refused.
	resp, err := http.Get("http://" + h.Addr() + ledger.Path)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("unauthenticated ledger read: %d", resp.StatusCode)
	}

	seed := make([]byte, 32)
	seed[0] = 9
	id := wallet.NewIdentity(ed25519.NewKeyFromSeed(seed))
	if err := l.Append(ledger.Entry{SessionID: "x", WorkerID: id.WorkerID, BytesIn: 277_952, BytesOut: 1_000_000, RejectedBytes: 123, Final: true}); err != nil {
		t.Fatal(err)
	}
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	cf := addCreditFlags(fs)
	if err := fs.Parse([]string{"--wallets", filepath.Join(dir, "wallets.db"), "--rate-nkvr-per-byte", "7", "--credit-every", "20ms"}); err != nil {
		t.Fatal(err)
	}
	cr, err := cf.start(context.Background(), h.Addr(), secret, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer cr.Stop()
	srvTLS, pool := loopbackTLS(t)
	g, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", HubURL: h.Addr(), Secret: secret,
		TLSConfig: srvTLS, Extra: cr.Handlers})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}

	w, err := wallet.Open(filepath.Join(dir, "worker-wallet.db"), id, wallet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Served("x", 1_000_000, 277_952)
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := w.Sync(context.Background(), hc, "https://"+g.Addr(), id.Key)
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no statement credited within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	s, err := w.Summary()
	if err != nil {
		t.Fatal(err)
	}
	if s.CreditedNKVR != 8_945_664 || s.CreditedBytes != 1_277_952 || s.RejectedBytes != 123 || s.MeteredNKVR != 8_945_664 || s.Reconcile.Mismatch {
		t.Fatalf("summary %+v", s)
	}
	var txt bytes.Buffer
	if err := wallet.WriteText(&txt, s); err != nil || !strings.Contains(txt.String(), "Credited  0.00895 KVR") {
		t.Fatalf("text %v:\n%s", err, txt.String())
	}
}
