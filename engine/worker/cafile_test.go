package worker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// otherCertPEM is a self-signed certificate for 127.0.0.1 that no test
// server uses (a gateway's certificate before it was rotated).
func otherCertPEM(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "old gateway"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

// TestCAFileReadAtEachDial: a worker with Config.CAFile reads the file at
// every dial, so that a gateway certificate rotated by the operator is
// trusted once the new file is copied in place, without a restart: first
// the file holds no certificate (a dial error naming it), then an old
// certificate (unknown authority), then the gateway's (the upgrade reaches
// the gateway).
func TestCAFileReadAtEachDial(t *testing.T) {
	var reached atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		http.Error(rw, "backbone unreachable", http.StatusServiceUnavailable)
	}))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
	srv.StartTLS()
	defer srv.Close()
	caFile := filepath.Join(t.TempDir(), "gateway.crt")
	if err := os.WriteFile(caFile, []byte("not yet\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	w := runWorker(t, Config{GatewayURL: "wss" + strings.TrimPrefix(srv.URL, "https"), CAFile: caFile,
		BackoffBase: 5 * time.Millisecond, BackoffMax: 20 * time.Millisecond})
	waitErr := func(want string) {
		t.Helper()
		var st Stats
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			if st = w.Stats(); strings.Contains(st.LastError, want) {
				return
			}
		}
		t.Fatalf("last error %q, want %q", st.LastError, want)
	}
	waitErr(caFile + ": no PEM certificate")
	if err := os.WriteFile(caFile, otherCertPEM(t), 0o644); err != nil {
		t.Fatal(err)
	}
	waitErr("pass --ca FILE")
	if reached.Load() != 0 {
		t.Fatal("an untrusted dial reached the gateway")
	}
	rotated := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	if err := os.WriteFile(caFile, rotated, 0o644); err != nil {
		t.Fatal(err)
	}
	waitErr("503")
	if reached.Load() == 0 {
		t.Fatal("the gateway saw no request")
	}
}
