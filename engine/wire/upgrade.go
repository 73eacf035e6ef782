package wire

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Headers of a signed worker upgrade request (GET /v1/worker).
const (
	HeaderKey   = "X-Kvasir-Key"   // hex of the worker's 32-byte ed25519 public key (64 chars)
	HeaderTime  = "X-Kvasir-Time"  // decimal unix time in milliseconds when signed
	HeaderNonce = "X-Kvasir-Nonce" // hex of 16 random bytes (32 chars)
	HeaderSig   = "X-Kvasir-Sig"   // hex of the 64-byte ed25519 signature over UpgradeMessage (v2: the host included)
)

// WorkerPath is the HTTP path of the worker WebSocket on gateway and hub.
const WorkerPath = "/v1/worker"

// Errors returned (wrapped) by VerifyUpgrade.
var (
	ErrNoSignature  = errors.New("wire: upgrade not signed")
	ErrBadSignature = errors.New("wire: bad upgrade signature")
	ErrStale        = errors.New("wire: upgrade timestamp outside the allowed skew")
	// ErrOldSignature comes wrapped with ErrBadSignature: the signature is
	// valid under version 1's message (kvasir-upgrade-v1, no host), i.e.
	// from a worker older than this verifier, which it should update.
	ErrOldSignature = errors.New("wire: upgrade signed as kvasir-upgrade-v1 (a worker older than kvasir-upgrade-v2, which names the host)")
)

// UpgradeMessage is the byte string a worker signs at the upgrade:
//
//	"kvasir-upgrade-v2\n" + method + "\n" + host + "\n" + path + "\n" + unixMillis + "\n" + nonceHex
//
// Binding method and path keeps a signature for one endpoint from being used
// on another; binding host (the gateway's name as the worker dialled it,
// UpgradeHost) keeps it from being used at another gateway (one that saw
// it: a gateway of another network, a TLS-terminating proxy) within its
// life, where the first gateway's nonce cache does not reach; the time
// bounds its life and the nonce makes it single-use for a verifier that
// remembers nonces for the skew window. (Version 1 signed no host: a
// signature replayed at a second gateway got the worker's key banned
// there.)
func UpgradeMessage(method, host, path string, unixMillis int64, nonce string) []byte {
	return []byte("kvasir-upgrade-v2\n" + method + "\n" + host + "\n" + path + "\n" + strconv.FormatInt(unixMillis, 10) + "\n" + nonce)
}

// upgradeMessageV1 is version 1's message (no host), recognised only to
// tell an old worker why it is refused (ErrOldSignature).
func upgradeMessageV1(method, path string, unixMillis int64, nonce string) []byte {
	return []byte("kvasir-upgrade-v1\n" + method + "\n" + path + "\n" + strconv.FormatInt(unixMillis, 10) + "\n" + nonce)
}

// UpgradeHost is the host an upgrade signature names: the host part of a
// URL's or request's authority (hostport: "gate.example.net:443",
// "[2001:db8::1]:443", "127.0.0.1"), without the port and a trailing dot,
// lower-cased.
func UpgradeHost(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	return strings.TrimSuffix(strings.ToLower(strings.Trim(h, "[]")), ".") // "gate.example.net." is the same name
}

// SignUpgrade returns the four X-Kvasir-* headers that authenticate a worker
// holding key for one upgrade request (method, path) to the gateway host
// (UpgradeHost of the URL it dials) made at now. It draws a fresh 16-byte
// nonce from crypto/rand. key must be a 64-byte ed25519 private key.
func SignUpgrade(key ed25519.PrivateKey, method, host, path string, now time.Time) http.Header {
	var nb [16]byte
	_, _ = rand.Read(nb[:]) // crypto/rand.Read never fails on supported platforms
	nonce := hex.EncodeToString(nb[:])
	ms := now.UnixMilli()
	sig := ed25519.Sign(key, UpgradeMessage(method, UpgradeHost(host), path, ms, nonce))
	h := http.Header{}
	h.Set(HeaderKey, hex.EncodeToString(key.Public().(ed25519.PublicKey)))
	h.Set(HeaderTime, strconv.FormatInt(ms, 10))
	h.Set(HeaderNonce, nonce)
	h.Set(HeaderSig, hex.EncodeToString(sig))
	return h
}

// VerifyUpgrade checks the X-Kvasir-* headers of an upgrade request for
// (method, path) to host (the request's Host; UpgradeHost is applied)
// received at now: all four present (else ErrNoSignature), well-formed and
// a valid ed25519 signature over that host (else ErrBadSignature, with
// ErrOldSignature too when it is a valid version 1 signature), and a
// timestamp within maxSkew of now either way (else ErrStale). It returns
// the worker's public key and the nonce; remembering nonces to refuse
// replays within the skew window, and refusing a host that is not the
// verifier's own, are the caller's job.
func VerifyUpgrade(h http.Header, method, host, path string, now time.Time, maxSkew time.Duration) (ed25519.PublicKey, string, error) {
	ks, ts, ns, ss := h.Get(HeaderKey), h.Get(HeaderTime), h.Get(HeaderNonce), h.Get(HeaderSig)
	if ks == "" || ts == "" || ns == "" || ss == "" {
		return nil, "", fmt.Errorf("%w: missing X-Kvasir-* header", ErrNoSignature)
	}
	key, err := hex.DecodeString(ks)
	if err != nil || len(key) != ed25519.PublicKeySize {
		return nil, "", fmt.Errorf("%w: key is not 32 hex bytes", ErrBadSignature)
	}
	sig, err := hex.DecodeString(ss)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, "", fmt.Errorf("%w: signature is not 64 hex bytes", ErrBadSignature)
	}
	if nb, err := hex.DecodeString(ns); err != nil || len(nb) != 16 {
		return nil, "", fmt.Errorf("%w: nonce is not 16 hex bytes", ErrBadSignature)
	}
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nil, "", fmt.Errorf("%w: time %q", ErrBadSignature, ts)
	}
	if !ed25519.Verify(key, UpgradeMessage(method, UpgradeHost(host), path, ms, ns), sig) {
		if ed25519.Verify(key, upgradeMessageV1(method, path, ms, ns), sig) {
			return nil, "", fmt.Errorf("%w: %w", ErrBadSignature, ErrOldSignature)
		}
		return nil, "", fmt.Errorf("%w: verification failed", ErrBadSignature)
	}
	skew := now.Sub(time.UnixMilli(ms))
	if skew > maxSkew || skew < -maxSkew {
		return nil, "", fmt.Errorf("%w: %v off (max %v)", ErrStale, skew.Round(time.Millisecond), maxSkew)
	}
	return ed25519.PublicKey(key), ns, nil
}
