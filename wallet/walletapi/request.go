package walletapi

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Signed-request headers. They are the same headers the worker sends at the
// WebSocket upgrade; here the signed target also includes the query.
const (
	HeaderKey   = "X-Kvasir-Key"   // hex ed25519 public key (64 chars)
	HeaderTime  = "X-Kvasir-Time"  // unix milliseconds, decimal
	HeaderNonce = "X-Kvasir-Nonce" // hex of 16 random bytes (32 chars)
	HeaderSig   = "X-Kvasir-Sig"   // hex ed25519 signature (128 chars)
)

// DefaultMaxSkew is the freshness window for signed requests: a request
// whose time differs from the verifier's clock by more is refused.
const DefaultMaxSkew = 60 * time.Second

const requestDomain = "kvasir-request-v1\n"

// ErrUnauthorized is returned by VerifyRequest for a missing, malformed,
// stale, or forged signature, and by NonceCache users for a replay.
var ErrUnauthorized = errors.New("walletapi: unauthorized request")

// requestMessage is the signed message:
//
//	"kvasir-request-v1\n" METHOD "\n" TARGET "\n" TIME "\n" NONCE
//
// where TARGET is the request path with its raw query ("/v1/wallet/statements?after=3").
func requestMessage(method, target, ms, nonce string) []byte {
	return []byte(requestDomain + method + "\n" + target + "\n" + ms + "\n" + nonce)
}

// SignRequest returns the four X-Kvasir-* headers that authenticate a
// request of method to target (path plus "?"+raw query if any) at time now,
// with a fresh random nonce. It returns an error only if key is malformed or
// the system random source fails.
func SignRequest(key ed25519.PrivateKey, method, target string, now time.Time) (http.Header, error) {
	if len(key) != ed25519.PrivateKeySize {
		return nil, fmt.Errorf("walletapi: signing key is %d bytes, want %d", len(key), ed25519.PrivateKeySize)
	}
	var n [16]byte
	if _, err := rand.Read(n[:]); err != nil {
		return nil, fmt.Errorf("walletapi: nonce: %w", err)
	}
	nonce := hex.EncodeToString(n[:])
	ms := strconv.FormatInt(now.UnixMilli(), 10)
	h := http.Header{}
	h.Set(HeaderKey, hex.EncodeToString(key.Public().(ed25519.PublicKey)))
	h.Set(HeaderTime, ms)
	h.Set(HeaderNonce, nonce)
	h.Set(HeaderSig, hex.EncodeToString(ed25519.Sign(key, requestMessage(method, target, ms, nonce))))
	return h, nil
}

// RequestTarget returns the signed target of r: its escaped path, plus "?"
// and the raw query when there is one.
func RequestTarget(r *http.Request) string {
	t := r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		t += "?" + r.URL.RawQuery
	}
	return t
}

// VerifyRequest checks the X-Kvasir-* headers in h for a request of method
// to target: well-formed fields, a time within maxSkew of now, and a valid
// signature. It returns the signer's public key and the nonce, which the
// caller must pass to a NonceCache to refuse replays. Every failure wraps
// ErrUnauthorized.
func VerifyRequest(h http.Header, method, target string, now time.Time, maxSkew time.Duration) (ed25519.PublicKey, string, error) {
	keyHex, ms, nonce, sigHex := h.Get(HeaderKey), h.Get(HeaderTime), h.Get(HeaderNonce), h.Get(HeaderSig)
	if !IsKeyHex(keyHex) {
		return nil, "", fmt.Errorf("%w: %s is not a 64-char hex key", ErrUnauthorized, HeaderKey)
	}
	pub, _ := hex.DecodeString(keyHex)
	if len(nonce) != 32 {
		return nil, "", fmt.Errorf("%w: %s must be 32 hex chars", ErrUnauthorized, HeaderNonce)
	}
	if _, err := hex.DecodeString(nonce); err != nil {
		return nil, "", fmt.Errorf("%w: %s is not hex", ErrUnauthorized, HeaderNonce)
	}
	if len(ms) == 0 || len(ms) > 19 {
		return nil, "", fmt.Errorf("%w: %s malformed", ErrUnauthorized, HeaderTime)
	}
	t, err := strconv.ParseInt(ms, 10, 64)
	if err != nil || strconv.FormatInt(t, 10) != ms {
		return nil, "", fmt.Errorf("%w: %s malformed", ErrUnauthorized, HeaderTime)
	}
	skew := now.Sub(time.UnixMilli(t))
	if skew > maxSkew || skew < -maxSkew {
		return nil, "", fmt.Errorf("%w: request time is %v from now (allowed %v)", ErrUnauthorized, skew, maxSkew)
	}
	sig, err := hex.DecodeString(sigHex)
	if err != nil || len(sig) != ed25519.SignatureSize {
		return nil, "", fmt.Errorf("%w: %s malformed", ErrUnauthorized, HeaderSig)
	}
	if !ed25519.Verify(pub, requestMessage(method, target, ms, nonce), sig) {
		return nil, "", fmt.Errorf("%w: signature does not verify", ErrUnauthorized)
	}
	return ed25519.PublicKey(pub), nonce, nil
}

// NonceCache remembers the nonces of accepted requests for TTL (which must
// be at least twice the freshness window, so a request stays refused for as
// long as its time is acceptable) and at most Max entries. It is safe for
// concurrent use.
type NonceCache struct {
	ttl  time.Duration
	max  int
	mu   sync.Mutex
	seen map[string]time.Time // key -> expiry
}

// NewNonceCache returns a cache that keeps each nonce for ttl and holds at
// most max nonces (max <= 0 means 1<<20).
func NewNonceCache(ttl time.Duration, max int) *NonceCache {
	if max <= 0 {
		max = 1 << 20
	}
	return &NonceCache{ttl: ttl, max: max, seen: map[string]time.Time{}}
}

// Use records key (signer + nonce) at time now. It returns false if key was
// already used within the TTL (a replay) or the cache is full of unexpired
// nonces (refusing is safer than forgetting).
func (c *NonceCache) Use(key string, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if exp, ok := c.seen[key]; ok && now.Before(exp) {
		return false
	}
	if len(c.seen) >= c.max {
		for k, exp := range c.seen {
			if !now.Before(exp) {
				delete(c.seen, k)
			}
		}
		if len(c.seen) >= c.max {
			return false
		}
	}
	c.seen[key] = now.Add(c.ttl)
	return true
}
