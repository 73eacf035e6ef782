package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
	"golang.org/x/crypto/acme/autocert"
)

// ACMEConfig configures the gateway's certificate by ACME (RFC 8555):
// obtained on first use and renewed before it expires by
// golang.org/x/crypto/acme/autocert, validated with TLS-ALPN-01 on the
// gateway's own TLS listener (which must therefore be reachable on port 443
// of every domain, or on the port the ACME server validates).
type ACMEConfig struct {
	// Domains are the names the certificate is for; the gateway answers
	// no other server name.
	Domains []string
	// CacheDir keeps the account key and certificates across restarts
	// (0700); required: without it every restart orders a new certificate
	// and soon meets the CA's rate limits.
	CacheDir string
	// DirectoryURL is the ACME server ("": Let's Encrypt's production
	// directory, autocert.DefaultACMEDirectory).
	DirectoryURL string
	// Email is the account's contact (optional; the CA's expiry notices).
	Email string
	// RootCAs, when set, are the only roots trusted for the ACME server's
	// own HTTPS (a test server such as pebble); nil: the system roots.
	RootCAs *x509.CertPool
	// RenewBefore: renew this long before expiry (0: autocert's 30 days).
	RenewBefore time.Duration
}

// ACME returns the TLS configuration (for Config.TLSConfig) and the
// autocert manager of c. The configuration offers the "acme-tls/1" ALPN
// protocol the TLS-ALPN-01 challenge needs besides HTTP/1.1.
func ACME(c ACMEConfig) (*tls.Config, *autocert.Manager, error) {
	if len(c.Domains) == 0 {
		return nil, nil, errors.New("gateway: ACME needs at least one domain")
	}
	if c.CacheDir == "" {
		return nil, nil, errors.New("gateway: ACME needs a cache directory")
	}
	if err := os.MkdirAll(c.CacheDir, 0o700); err != nil {
		return nil, nil, fmt.Errorf("gateway: ACME cache: %w", err)
	}
	dir := c.DirectoryURL
	if dir == "" {
		dir = autocert.DefaultACMEDirectory
	}
	client := &acme.Client{DirectoryURL: dir}
	if c.RootCAs != nil {
		client.HTTPClient = &http.Client{Timeout: time.Minute, Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: c.RootCAs, MinVersion: tls.VersionTLS12}}}
	}
	m := &autocert.Manager{
		Prompt:      autocert.AcceptTOS,
		Cache:       autocert.DirCache(c.CacheDir),
		HostPolicy:  autocert.HostWhitelist(c.Domains...),
		Client:      client,
		Email:       c.Email,
		RenewBefore: c.RenewBefore,
	}
	tc := m.TLSConfig()
	tc.NextProtos = []string{"http/1.1", acme.ALPNProto}
	return tc, m, nil
}

// ObtainCertificate asks m for the certificate of domain (from the cache,
// or ordered from the ACME server, which then validates on the gateway's
// listener: call it after Start) and retries every few seconds until ctx
// ends. The gateway command calls it at start, so that the first worker
// does not wait for the order and readiness (/readyz) can report it.
// failed, if set, receives each failed order's error (DNS, a refused
// connection, the CA's refusal), the cause an operator needs: autocert
// answers the retries within a minute of a failure with its
// errMissingCert ("missing certificate"), which is not passed on.
func ObtainCertificate(ctx context.Context, m *autocert.Manager, domain string, failed func(error)) (*tls.Certificate, error) {
	var last error
	for {
		// An ECDSA-capable hello, as every current client sends (autocert
		// bounds the order itself: 5 min).
		c, err := m.GetCertificate(&tls.ClientHelloInfo{ServerName: domain,
			CipherSuites:      []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256},
			SignatureSchemes:  []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256},
			SupportedCurves:   []tls.CurveID{tls.CurveP256},
			SupportedVersions: []uint16{tls.VersionTLS13, tls.VersionTLS12},
		})
		if err == nil {
			return c, nil
		}
		if !strings.Contains(err.Error(), "missing certificate") {
			last = err
			if failed != nil {
				failed(err)
			}
		}
		if last == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("gateway: ACME certificate for %s: %w (last error: %v)", domain, ctx.Err(), last)
		case <-time.After(3 * time.Second):
		}
	}
}
