package status

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestExplainDial: connection errors as the worker's dialer writes them
// (real ones made on loopback where they can be, the exact strings Go
// writes otherwise) become a sentence that names the problem.
func TestExplainDial(t *testing.T) {
	// A port that refuses: listen, note the port, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	_, refused := net.DialTimeout("tcp", closed, time.Second)
	// A TLS server whose self-signed certificate nobody trusts.
	srv := httptest.NewUnstartedServer(http.NotFoundHandler())
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.StartTLS()
	defer srv.Close()
	_, untrusted := (&http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{}}}).Get(srv.URL)
	// A plain HTTP server on the address given as wss://.
	plain := httptest.NewServer(http.NotFoundHandler())
	defer plain.Close()
	_, httpOnly := http.Get(strings.Replace(plain.URL, "http://", "https://", 1))
	if refused == nil || untrusted == nil || httpOnly == nil {
		t.Fatalf("loopback errors: %v, %v, %v", refused, untrusted, httpOnly)
	}
	dial := func(err error) string {
		return fmt.Sprintf(`dial: failed to WebSocket dial: failed to send handshake request: Get "https://gw/v1/worker": %v`, err)
	}
	dns := &net.DNSError{Err: "no such host", Name: "gate.kvasir-ai.net", IsNotFound: true}
	cases := []struct {
		err, kind, says string
	}{
		{dial(refused), ProblemRefused, "refused the connection"},
		{dial(untrusted), ProblemTLS, "not signed by an authority this device trusts"},
		{dial(httpOnly), ProblemTLS, "speaks plain HTTP on that port, not TLS"},
		{dial(&net.OpError{Op: "dial", Net: "tcp", Err: dns}), ProblemDNS, "its name does not resolve"},
		{dial(errors.New("dial tcp 10.1.2.3:443: connect: network is unreachable")), ProblemNetwork, "no network"},
		{dial(errors.New("dial tcp 10.1.2.3:443: i/o timeout")), ProblemTimeout, "did not answer in time"},
		{dial(errors.New("tls: failed to verify certificate: x509: certificate is valid for a.example, not gw")), ProblemTLS, "another name"},
		{"dial: 503 Service Unavailable: backbone unreachable: failed to WebSocket dial: expected handshake response status code 101 but got 503",
			ProblemGateway, "HTTP 503: the gateway is up but the swarm behind it is not available"},
		{"dial: something new", ProblemOther, "cannot reach gate.kvasir-ai.net:443: dial: something new"},
	}
	for _, c := range cases {
		kind, text := ExplainDial("gate.kvasir-ai.net:443", c.err)
		if kind != c.kind || !strings.Contains(text, c.says) {
			t.Errorf("%s:\n  got %s %q, want %s saying %q", c.err, kind, text, c.kind, c.says)
		}
	}
	if k, s := ExplainDial("gw", ""); k != "" || s != "" {
		t.Errorf("no error: %q %q", k, s)
	}
	got := DialReason("gw:443", "reconnecting in 1.25s: "+dial(refused), dial(refused))
	if got != "gw:443 refused the connection: the gateway is down or the address is wrong; retrying in 1.25s" {
		t.Errorf("DialReason %q", got)
	}
	if got := DialReason("gw:443", "refused: x; retrying in 30s (the backoff's longest)", dial(untrusted)); !strings.HasSuffix(got, "; retrying in 30s") || !strings.HasPrefix(got, "TLS:") {
		t.Errorf("DialReason permanent %q", got)
	}
	if got := DialReason("gw", "connecting", ""); got != "connecting" {
		t.Errorf("DialReason without error %q", got)
	}
}

// TestDialReasonCountsDown: the worker's backoff delay, set once, counts
// down with the time since it was set.
func TestDialReasonCountsDown(t *testing.T) {
	const reason = "reconnecting in 11.09s: dial tcp 1.2.3.4:443: connect: connection refused"
	for _, c := range []struct {
		elapsed time.Duration
		want    string
	}{{0, "retrying in 12 s"}, {time.Second, "retrying in 11 s"}, {10 * time.Second, "retrying in 2 s"}, {11090 * time.Millisecond, "retrying now"},
		{time.Minute, "retrying now"}} {
		got := DialReasonAt("gw:443", reason, "dial tcp 1.2.3.4:443: connect: connection refused", c.elapsed)
		if want := "gw:443 refused the connection: the gateway is down or the address is wrong; " + c.want; got != want {
			t.Errorf("after %v: %q, want %q", c.elapsed, got, want)
		}
	}
}
