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
// long as its time is acceptable), at most Max entries in all and
// PerSigner per signer. It is safe for concurrent use.
type NonceCache struct {
	ttl       time.Duration
	max       int
	perSigner int
	mu        sync.Mutex
	seen      map[string]nonceEntry  // signer + nonce -> entry
	bySigner  map[string][]time.Time // each signer's entries' expiries, oldest first
	pruned    time.Time              // the last sweep of seen (at most one a second)
}

type nonceEntry struct {
	signer string
	exp    time.Time
}

// Errors of NonceCache.Check.
var (
	ErrReplay = errors.New("walletapi: nonce already used")
	// ErrTooMany: the signer has DefaultPerSigner requests within the TTL
	// already (a wallet syncs every 30 s: a handful).
	ErrTooMany = errors.New("walletapi: too many requests from this key")
	// ErrBusy: the cache holds Max unexpired nonces of many signers.
	ErrBusy = errors.New("walletapi: too many requests; try again later")
)

// DefaultPerSigner is NewNonceCache's bound on one signer's nonces within
// the TTL.
const DefaultPerSigner = 256

// NewNonceCache returns a cache that keeps each nonce for ttl and holds at
// most max nonces (max <= 0 means 1<<20), DefaultPerSigner of them per
// signer.
func NewNonceCache(ttl time.Duration, max int) *NonceCache {
	if max <= 0 {
		max = 1 << 20
	}
	return &NonceCache{ttl: ttl, max: max, perSigner: DefaultPerSigner, seen: map[string]nonceEntry{}, bySigner: map[string][]time.Time{}}
}

// Use records key (signer + nonce) at time now, as Check does with the
// whole key as the signer; it returns whether Check accepted it.
func (c *NonceCache) Use(key string, now time.Time) bool { return c.Check(key, "", now) == nil }

// Check records signer's nonce at time now. It returns ErrReplay if the
// pair was used within the TTL, ErrTooMany when the signer has PerSigner
// unexpired nonces already (one key cannot fill the cache for everyone),
// ErrBusy when the cache is full of unexpired nonces (refusing is safer
// than forgetting), nil otherwise.
func (c *NonceCache) Check(signer, nonce string, now time.Time) error {
	key := signer + "\x00" + nonce
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.seen[key]; ok && now.Before(e.exp) {
		return ErrReplay
	}
	exps := c.bySigner[signer]
	for len(exps) > 0 && !now.Before(exps[0]) {
		exps = exps[1:] // its entries in seen go at the next sweep
	}
	c.bySigner[signer] = exps
	if len(exps) >= c.perSigner {
		return ErrTooMany
	}
	if len(c.seen) >= c.max && now.Sub(c.pruned) >= time.Second {
		c.pruneLocked(now)
	}
	if len(c.seen) >= c.max {
		return ErrBusy
	}
	c.seen[key] = nonceEntry{signer: signer, exp: now.Add(c.ttl)}
	c.bySigner[signer] = append(exps, now.Add(c.ttl))
	return nil
}

// pruneLocked forgets expired nonces and signers with none left; c.mu is
// held.
func (c *NonceCache) pruneLocked(now time.Time) {
	c.pruned = now
	for k, e := range c.seen {
		if !now.Before(e.exp) {
			delete(c.seen, k)
		}
	}
	for sg, exps := range c.bySigner {
		if len(exps) == 0 || !now.Before(exps[len(exps)-1]) {
			delete(c.bySigner, sg)
		}
	}
}
