package gateway

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// SelfSigned makes a self-signed ECDSA P-256 certificate valid for one year
// for hosts (IP literals become IP SANs, others DNS SANs; none given means
// "127.0.0.1", "::1" and "localhost"). It returns the certificate and the
// private key in PEM ("CERTIFICATE", "EC PRIVATE KEY"). The certificate is its
// own CA, so workers trust it with --ca CERT. For tests and the demo only.
func SelfSigned(hosts ...string) (certPEM, keyPEM []byte, err error) {
	if len(hosts) == 0 {
		hosts = []string{"127.0.0.1", "::1", "localhost"}
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "kvasir gateway (self-signed)"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(365 * 24 * time.Hour),
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

// WriteSelfSigned writes a SelfSigned pair to dir/gateway.crt (0644) and
// dir/gateway.key (0600) and returns their paths.
func WriteSelfSigned(dir string, hosts ...string) (certFile, keyFile string, err error) {
	c, k, err := SelfSigned(hosts...)
	if err != nil {
		return "", "", err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(dir, "gateway.crt"), filepath.Join(dir, "gateway.key")
	if err := os.WriteFile(keyFile, k, 0o600); err != nil {
		return "", "", fmt.Errorf("gateway: %w", err)
	}
	if err := os.WriteFile(certFile, c, 0o644); err != nil {
		return "", "", fmt.Errorf("gateway: %w", err)
	}
	return certFile, keyFile, nil
}
