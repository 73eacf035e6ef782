package hub

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Headers the gateway adds when it forwards an authenticated worker's upgrade
// to the hub. The gateway strips any incoming copies first.
const (
	HeaderWorker  = "X-Kvasir-Worker"   // hex ed25519 public key the gateway verified (64 chars)
	HeaderGwTime  = "X-Kvasir-Gw-Time"  // decimal unix time in milliseconds
	HeaderGwNonce = "X-Kvasir-Gw-Nonce" // hex of 16 random bytes
	HeaderGwMAC   = "X-Kvasir-Gw-Mac"   // hex HMAC-SHA256(secret, worker "|" time "|" nonce), RFC 2104
)

// DefaultMaxSkew is how far the gateway's timestamp may be from the hub's
// clock (either way) for Authorized to accept it.
const DefaultMaxSkew = 60 * time.Second

// Errors returned (wrapped) by the hub.
var (
	// ErrPublic: Config.Listen is public and Config.AllowPublic is false
	// (the hub command's --allow-public).
	ErrPublic     = errors.New("hub: refusing to listen on a public address")
	ErrNoSecret   = errors.New("hub: a shared gateway secret of at least 16 bytes is required")
	ErrUnverified = errors.New("hub: gateway authentication failed")
)

func gatewayMAC(secret []byte, worker, ts, nonce string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(worker + "|" + ts + "|" + nonce))
	return m.Sum(nil)
}

// SignGateway sets on h the headers that prove to the hub that the gateway
// holding secret authenticated worker (hex public key, "" for requests not
// made for a worker) at now.
func SignGateway(h http.Header, secret []byte, worker string, now time.Time) {
	var nb [16]byte
	_, _ = rand.Read(nb[:])
	nonce := hex.EncodeToString(nb[:])
	ts := strconv.FormatInt(now.UnixMilli(), 10)
	h.Set(HeaderWorker, worker)
	h.Set(HeaderGwTime, ts)
	h.Set(HeaderGwNonce, nonce)
	h.Set(HeaderGwMAC, hex.EncodeToString(gatewayMAC(secret, worker, ts, nonce)))
}

// verifyGateway checks the gateway headers of h at now and returns the worker
// id and nonce. Errors wrap ErrUnverified.
func verifyGateway(h http.Header, secret []byte, now time.Time, maxSkew time.Duration) (worker, nonce string, err error) {
	if len(secret) == 0 {
		return "", "", fmt.Errorf("%w: no secret configured", ErrUnverified)
	}
	ts := h.Get(HeaderGwTime)
	worker, nonce = h.Get(HeaderWorker), h.Get(HeaderGwNonce)
	mac, err := hex.DecodeString(h.Get(HeaderGwMAC))
	if err != nil || len(mac) != sha256.Size || ts == "" || len(nonce) != 32 {
		return "", "", fmt.Errorf("%w: missing or malformed headers", ErrUnverified)
	}
	if !hmac.Equal(mac, gatewayMAC(secret, worker, ts, nonce)) {
		return "", "", fmt.Errorf("%w: bad MAC", ErrUnverified)
	}
	ms, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return "", "", fmt.Errorf("%w: time %q", ErrUnverified, ts)
	}
	if d := now.Sub(time.UnixMilli(ms)); d > maxSkew || d < -maxSkew {
		return "", "", fmt.Errorf("%w: stale by %v", ErrUnverified, d)
	}
	return worker, nonce, nil
}

// Authorized reports whether r carries a valid, fresh (within DefaultMaxSkew)
// gateway MAC made with secret. Handlers mounted in Config.Extra use it to
// accept requests only from the gateway. It does not check nonce replay.
func Authorized(r *http.Request, secret []byte) bool {
	_, _, err := verifyGateway(r.Header, secret, time.Now(), DefaultMaxSkew)
	return err == nil
}

// CheckDialAddr returns an error unless addr is host:port that a dial can
// use: a host (name or IP) and a port 1-65535 or a service name known to
// the system. It checks the form only, not that anything listens there.
func CheckDialAddr(addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: %w (want host:port)", addr, err)
	}
	if host == "" {
		return fmt.Errorf("%q: no host", addr)
	}
	if _, err := net.LookupPort("tcp", port); err != nil || port == "0" {
		return fmt.Errorf("%q: port %q: want 1-65535", addr, port)
	}
	return nil
}

// CheckListenAddr returns an error wrapping ErrPublic unless addr's host is a
// loopback, private (RFC 1918 / RFC 4193) or link-local IP, or a name that
// resolves only to such addresses; an empty or unspecified host (":7001",
// "0.0.0.0") counts as public. allowPublic skips the check.
func CheckListenAddr(addr string, allowPublic bool) error {
	if allowPublic {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("hub: listen address %q: %w", addr, err)
	}
	var ips []net.IP
	if ip := net.ParseIP(strings.Trim(host, "[]")); ip != nil {
		ips = []net.IP{ip}
	} else if host != "" {
		if ips, err = net.LookupIP(host); err != nil {
			return fmt.Errorf("hub: listen address %q: %w", addr, err)
		}
	}
	if len(ips) == 0 {
		return fmt.Errorf("%w: %q listens on every interface", ErrPublic, addr)
	}
	for _, ip := range ips {
		if !(ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast()) {
			return fmt.Errorf("%w: %q (%s)", ErrPublic, addr, ip)
		}
	}
	return nil
}

// nonceCache remembers nonces until they expire, to refuse replays.
type nonceCache struct {
	mu   sync.Mutex
	seen map[string]time.Time
	last time.Time
}

// add records nonce until expiry; it returns false if nonce is already
// recorded and not yet expired.
func (c *nonceCache) add(nonce string, now, expiry time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]time.Time{}
	}
	if now.Sub(c.last) > time.Second {
		for k, exp := range c.seen {
			if now.After(exp) {
				delete(c.seen, k)
			}
		}
		c.last = now
	}
	if exp, ok := c.seen[nonce]; ok && !now.After(exp) {
		return false
	}
	c.seen[nonce] = expiry
	return true
}

// ErrSecretMissing is returned by LoadSecret when the secret file does not
// exist: a missing file is created only where the operator asks for it
// (LoadOrCreateSecret, --create-secret), so that a gateway on another host
// never makes a secret of its own that its hub does not share.
var ErrSecretMissing = errors.New("hub: secret file does not exist")

// LoadSecret reads the shared gateway<->hub secret from path (hex, at least
// 16 bytes). A missing file is an error wrapping ErrSecretMissing that names
// the path; a short or malformed one wraps ErrNoSecret.
func LoadSecret(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s (create it on one host with --create-secret, then copy it to every hub and gateway)", ErrSecretMissing, path)
	}
	if err != nil {
		return nil, err
	}
	// Whoever reads the secret can sign as a gateway: credit any worker
	// id, forge upgrades. Like ssh with a private key, refuse one every
	// local user may read (or write).
	if st, err := os.Stat(path); err == nil && runtime.GOOS != "windows" && st.Mode().Perm()&0o007 != 0 {
		return nil, fmt.Errorf("%w: %s is open to every user of this machine (mode %04o): chmod 600 %s", ErrSecretOpen, path, st.Mode().Perm(), path)
	}
	s, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(s) < 16 {
		return nil, fmt.Errorf("%w: %s must hold >= 16 bytes in hex", ErrNoSecret, path)
	}
	return s, nil
}

// ErrSecretOpen is wrapped by LoadSecret's error for a secret file that
// other users of the machine may read or write (mode o+r or o+w).
var ErrSecretOpen = errors.New("hub: the shared secret file is readable by other users")

// LoadOrCreateSecret reads the shared gateway<->hub secret from path like
// LoadSecret, creating a random 32-byte one (0600, parent 0700) if the file
// does not exist. Use it only where the configuration says to create the
// secret (--create-secret): hub and gateway on one machine, or the first
// host of a network, whose file is then copied to the others.
func LoadOrCreateSecret(path string) ([]byte, error) {
	s, err := LoadSecret(path)
	if !errors.Is(err, ErrSecretMissing) {
		return s, err
	}
	var r [32]byte
	_, _ = rand.Read(r[:])
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		if errors.Is(err, os.ErrExist) { // created concurrently by the other role
			return LoadSecret(path)
		}
		return nil, err
	}
	_, err = f.WriteString(hex.EncodeToString(r[:]) + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	return r[:], nil
}

// DefaultSecretFile is the secret file used when none is given:
// $XDG_CONFIG_HOME/kvasir/hub-secret (os.UserConfigDir), or ./kvasir-hub-secret.
func DefaultSecretFile() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "kvasir-hub-secret"
	}
	return filepath.Join(dir, "kvasir", "hub-secret")
}
