package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Self-signed pair files and their lifetime.
const (
	// SelfSignedCertName and SelfSignedKeyName are the file names of a
	// self-signed pair in its directory (LoadOrNewSelfSigned).
	SelfSignedCertName = "gateway.crt"
	SelfSignedKeyName  = "gateway.key"
	// SelfSignedValidity is how long a new self-signed certificate is
	// valid (one year).
	SelfSignedValidity = 365 * 24 * time.Hour
	// SelfSignedMinRemaining is how long a kept certificate must still be
	// valid: one expiring sooner is replaced at the gateway's start (7
	// days).
	SelfSignedMinRemaining = 7 * 24 * time.Hour
)

// DefaultSelfSignedHosts are the names SelfSigned covers when given none.
var DefaultSelfSignedHosts = []string{"127.0.0.1", "::1", "localhost"}

// SelfSigned makes a self-signed ECDSA P-256 certificate valid for
// SelfSignedValidity (one year) for hosts (IP literals become IP SANs,
// others DNS SANs; none given means DefaultSelfSignedHosts). It returns the
// certificate and the private key in PEM ("CERTIFICATE", "EC PRIVATE KEY").
// The certificate is its own CA, so workers trust it with --ca CERT. For
// tests and the demo only.
func SelfSigned(hosts ...string) (certPEM, keyPEM []byte, err error) {
	now := time.Now()
	return selfSigned(cleanHosts(hosts), now.Add(-time.Hour), now.Add(SelfSignedValidity))
}

// selfSigned is SelfSigned valid from notBefore to notAfter.
func selfSigned(hosts []string, notBefore, notAfter time.Time) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kvasir gateway (self-signed)"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), nil
}

// cleanHosts trims hosts and drops empty ones; none left means
// DefaultSelfSignedHosts.
func cleanHosts(hosts []string) []string {
	var out []string
	for _, h := range hosts {
		if h = strings.TrimSpace(h); h != "" {
			out = append(out, h)
		}
	}
	if len(out) == 0 {
		return DefaultSelfSignedHosts
	}
	return out
}

// SelfSignedPair is a gateway's self-signed certificate and key for a
// directory (LoadOrNewSelfSigned): the pair already there, kept, or a new
// one that Write puts there.
type SelfSignedPair struct {
	CertFile, KeyFile string // dir/gateway.crt, dir/gateway.key
	CertPEM, KeyPEM   []byte // the pair (PEM), as in the files once written
	NotAfter          time.Time
	// Reused is true when the files in the directory were kept; Write
	// then does nothing.
	Reused bool
	// Reason says why a new pair was made ("" when Reused), starting with
	// "missing", "unreadable" (a file cannot be read or parsed, or the key
	// is not the certificate's: "unreadable or mismatched"), "not yet
	// valid", "expired", "expiring" (within SelfSignedMinRemaining) or
	// "hosts differ" (a requested host is not covered), then the details.
	Reason string
}

// LoadOrNewSelfSigned returns the pair in dir (SelfSignedCertName,
// SelfSignedKeyName) when both files parse, the key is the certificate's,
// the certificate is valid at now and for SelfSignedMinRemaining more, and
// it covers every host (an IP SAN for an IP literal, a DNS SAN otherwise;
// none given means DefaultSelfSignedHosts); otherwise a new SelfSigned
// pair for hosts with Reason saying what was wrong with the files. It
// writes nothing (see Write), so a gateway that fails to listen leaves the
// files as they were. Errors: only failing to make a new pair; a file that
// cannot be read is a Reason, not an error.
func LoadOrNewSelfSigned(dir string, hosts []string, now time.Time) (*SelfSignedPair, error) {
	hosts = cleanHosts(hosts)
	p := &SelfSignedPair{CertFile: filepath.Join(dir, SelfSignedCertName), KeyFile: filepath.Join(dir, SelfSignedKeyName)}
	reason, leaf := p.check(hosts, now)
	if reason == "" {
		p.Reused, p.NotAfter = true, leaf.NotAfter
		return p, nil
	}
	c, k, err := selfSigned(hosts, now.Add(-time.Hour), now.Add(SelfSignedValidity))
	if err != nil {
		return nil, fmt.Errorf("gateway: self-signed certificate: %w", err)
	}
	p.CertPEM, p.KeyPEM, p.Reason = c, k, reason
	pair, err := p.Certificate()
	if err != nil {
		return nil, fmt.Errorf("gateway: self-signed certificate: %w", err)
	}
	p.NotAfter = pair.Leaf.NotAfter
	return p, nil
}

// check reads p's files into p and returns why they cannot be kept ("" if
// they can) and the certificate.
func (p *SelfSignedPair) check(hosts []string, now time.Time) (string, *x509.Certificate) {
	c, cerr := os.ReadFile(p.CertFile)
	k, kerr := os.ReadFile(p.KeyFile)
	switch {
	case errors.Is(cerr, fs.ErrNotExist) && errors.Is(kerr, fs.ErrNotExist):
		return fmt.Sprintf("missing: no %s and %s in %s", SelfSignedCertName, SelfSignedKeyName, filepath.Dir(p.CertFile)), nil
	case errors.Is(cerr, fs.ErrNotExist):
		return fmt.Sprintf("missing: %s (there is a %s)", p.CertFile, SelfSignedKeyName), nil
	case errors.Is(kerr, fs.ErrNotExist):
		return fmt.Sprintf("missing: %s (there is a %s)", p.KeyFile, SelfSignedCertName), nil
	case cerr != nil:
		return "unreadable: " + cerr.Error(), nil
	case kerr != nil:
		return "unreadable: " + kerr.Error(), nil
	}
	pair, err := tls.X509KeyPair(c, k)
	if err != nil {
		return fmt.Sprintf("unreadable or mismatched: %s and %s: %v", p.CertFile, p.KeyFile, err), nil
	}
	leaf := pair.Leaf // set by X509KeyPair since Go 1.23
	switch {
	case now.Before(leaf.NotBefore):
		return fmt.Sprintf("not yet valid: %s from %s", p.CertFile, leaf.NotBefore.UTC().Format(time.RFC3339)), nil
	case !now.Before(leaf.NotAfter):
		return fmt.Sprintf("expired: %s on %s", p.CertFile, leaf.NotAfter.UTC().Format(time.RFC3339)), nil
	case now.Add(SelfSignedMinRemaining).After(leaf.NotAfter):
		return fmt.Sprintf("expiring: %s on %s, within %v", p.CertFile, leaf.NotAfter.UTC().Format(time.RFC3339), SelfSignedMinRemaining), nil
	}
	for _, h := range hosts {
		if !covers(leaf, h) {
			return fmt.Sprintf("hosts differ: %s does not cover %q (it has %s)", p.CertFile, h, strings.Join(sans(leaf), ",")), nil
		}
	}
	p.CertPEM, p.KeyPEM = c, k
	return "", leaf
}

// covers reports whether leaf names h exactly: an IP SAN for an IP
// literal, a DNS SAN (case-insensitive) otherwise.
func covers(leaf *x509.Certificate, h string) bool {
	if ip := net.ParseIP(h); ip != nil {
		for _, a := range leaf.IPAddresses {
			if a.Equal(ip) {
				return true
			}
		}
		return false
	}
	for _, d := range leaf.DNSNames {
		if strings.EqualFold(d, h) {
			return true
		}
	}
	return false
}

// sans lists leaf's IP and DNS SANs.
func sans(leaf *x509.Certificate) []string {
	var out []string
	for _, ip := range leaf.IPAddresses {
		out = append(out, ip.String())
	}
	return append(out, leaf.DNSNames...)
}

// Certificate returns the pair for a tls.Config. Errors: tls.X509KeyPair's.
func (p *SelfSignedPair) Certificate() (tls.Certificate, error) {
	return tls.X509KeyPair(p.CertPEM, p.KeyPEM)
}

// Write puts a new pair into its directory (created 0700 if needed): the
// key (0600) and the certificate (0644), each written to a temporary file
// in the directory and renamed over the old one, so a reader sees the old
// file or the new one, never a part. It does nothing for a Reused pair.
// Call it once the gateway listens. Errors: the file system's.
func (p *SelfSignedPair) Write() error {
	if p.Reused {
		return nil
	}
	if err := os.MkdirAll(filepath.Dir(p.CertFile), 0o700); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if err := writeAtomic(p.KeyFile, p.KeyPEM, 0o600); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if err := writeAtomic(p.CertFile, p.CertPEM, 0o644); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	return nil
}

// writeAtomic writes b to a temporary file next to path with mode perm,
// syncs it and renames it to path.
func writeAtomic(path string, b []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // fails harmlessly once renamed
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// WriteSelfSigned makes sure dir holds a good self-signed pair for hosts
// (LoadOrNewSelfSigned at time.Now, then Write: a good pair is kept, else
// a new one written) and returns the paths of dir/gateway.crt (0644) and
// dir/gateway.key (0600). A gateway should rather call Write once it
// listens. Errors: LoadOrNewSelfSigned's and Write's.
func WriteSelfSigned(dir string, hosts ...string) (certFile, keyFile string, err error) {
	p, err := LoadOrNewSelfSigned(dir, hosts, time.Now())
	if err != nil {
		return "", "", err
	}
	if err := p.Write(); err != nil {
		return "", "", err
	}
	return p.CertFile, p.KeyFile, nil
}
