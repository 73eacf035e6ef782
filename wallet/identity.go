package wallet

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/zalando/go-keyring"
)

// KeyringService is the service name of kvasir's items in the OS keyring.
const KeyringService = "kvasir"

// IdentityAccount is the keyring account (user) holding the worker key.
const IdentityAccount = "worker-identity"

// Identity errors.
var (
	// ErrKeyNotFound: the KeyStore holds no secret for the account.
	ErrKeyNotFound = errors.New("wallet: key not found")
	// ErrBadKey: the stored secret is not an encoded ed25519 seed.
	ErrBadKey = errors.New("wallet: stored key is malformed")
	// ErrKeyMode: the key file may be read or written by other users (its
	// key may be fine); it is not used until its mode is 0600.
	ErrKeyMode = errors.New("wallet: the key file is open to other users")
	// ErrIdentityUnavailable: an identity exists (identity.json) but its
	// key store cannot produce the key; a new key is NOT made, because that
	// would silently change the wallet address.
	ErrIdentityUnavailable = errors.New("wallet: identity key unavailable")
	// ErrAddress: a string that is not a valid kvr1 address.
	ErrAddress = errors.New("wallet: invalid address")
)

// KeyStore stores small secrets (the encoded identity key) by account name.
// The desktop uses the OS keyring (Keyring) or, without one, a 0600 file
// (FileStore); mobile shells pass their own (Android Keystore, iOS
// Keychain) through the same interface.
type KeyStore interface {
	// Get returns the secret for account, or an error wrapping
	// ErrKeyNotFound when there is none.
	Get(account string) (string, error)
	// Set stores secret for account, replacing any previous one.
	Set(account, secret string) error
}

// Keyring is a KeyStore in the OS keyring through go-keyring (Secret
// Service on Linux/BSD, Keychain on macOS, Credential Manager on Windows).
type Keyring struct {
	Service string // keyring service name; "" means KeyringService
}

func (k Keyring) service() string {
	if k.Service == "" {
		return KeyringService
	}
	return k.Service
}

// Get implements KeyStore.
func (k Keyring) Get(account string) (string, error) {
	s, err := keyring.Get(k.service(), account)
	if errors.Is(err, keyring.ErrNotFound) {
		return "", fmt.Errorf("%w: keyring %s/%s", ErrKeyNotFound, k.service(), account)
	}
	if err != nil {
		return "", fmt.Errorf("wallet: keyring: %w", err)
	}
	return s, nil
}

// Set implements KeyStore.
func (k Keyring) Set(account, secret string) error {
	if err := keyring.Set(k.service(), account, secret); err != nil {
		return fmt.Errorf("wallet: keyring: %w", err)
	}
	return nil
}

// FileStore is a KeyStore of files <Dir>/<account>.key with mode 0600, for
// machines without a keyring. Anyone who can read the file owns the key.
type FileStore struct {
	Dir string
}

func (f FileStore) path(account string) (string, error) {
	if account == "" || strings.ContainsAny(account, `/\`) || account == "." || account == ".." {
		return "", fmt.Errorf("wallet: bad account name %q", account)
	}
	return filepath.Join(f.Dir, account+".key"), nil
}

// Get implements KeyStore. It refuses a key file readable by group or
// others (on Unix), which may have leaked.
func (f FileStore) Get(account string) (string, error) {
	p, err := f.path(account)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(p)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%w: %s", ErrKeyNotFound, p)
	}
	if err != nil {
		return "", fmt.Errorf("wallet: key file: %w", err)
	}
	if runtime.GOOS != "windows" && fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%w: %s has mode %v; run chmod 600 %s", ErrKeyMode, p, fi.Mode().Perm(), p)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("wallet: key file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Set implements KeyStore: it writes a temporary 0600 file and renames it
// over the key file.
func (f FileStore) Set(account, secret string) error {
	p, err := f.path(account)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(f.Dir, 0o700); err != nil {
		return fmt.Errorf("wallet: key file: %w", err)
	}
	tmp, err := os.CreateTemp(f.Dir, "."+account+".*.tmp")
	if err != nil {
		return fmt.Errorf("wallet: key file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return fmt.Errorf("wallet: key file: %w", err)
	}
	if _, err := tmp.WriteString(secret + "\n"); err != nil {
		tmp.Close()
		return fmt.Errorf("wallet: key file: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("wallet: key file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("wallet: key file: %w", err)
	}
	if err := os.Rename(tmp.Name(), p); err != nil {
		return fmt.Errorf("wallet: key file: %w", err)
	}
	return nil
}

// keyringUsable reports whether the OS keyring answers within timeout, and
// why not. On Linux/BSD it first requires a D-Bus session bus
// (DBUS_SESSION_BUS_ADDRESS): without one go-keyring would try to launch a
// stray bus.
func keyringUsable(k Keyring, timeout time.Duration) (bool, string) {
	switch runtime.GOOS {
	case "android", "ios":
		return false, "go-keyring has no backend on " + runtime.GOOS
	case "darwin", "windows":
	default:
		if a := os.Getenv("DBUS_SESSION_BUS_ADDRESS"); a == "" || a == "disabled:" {
			return false, "no D-Bus session (DBUS_SESSION_BUS_ADDRESS is empty), so no Secret Service"
		}
	}
	done := make(chan error, 1)
	go func() { // a locked keyring may block on a prompt: do not wait forever
		_, err := keyring.Get(k.service(), "probe")
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil || errors.Is(err, keyring.ErrNotFound) {
			return true, ""
		}
		return false, err.Error()
	case <-time.After(timeout):
		return false, fmt.Sprintf("the keyring did not answer within %v", timeout)
	}
}

// DefaultKeyStore returns the OS keyring when it works, and otherwise a
// FileStore in dir, writing a warning that says why to warn (if not nil).
// The second result names the store: "keyring" or "file".
func DefaultKeyStore(dir string, warn io.Writer) (KeyStore, string) {
	k := Keyring{}
	ok, why := keyringUsable(k, 5*time.Second)
	if ok {
		return k, "keyring"
	}
	if warn != nil {
		path := filepath.Join(dir, IdentityAccount+".key")
		verb := "storing"
		if _, err := os.Stat(path); err == nil {
			verb = "using" // the key is there already: read, not written
		}
		fmt.Fprintf(warn, "kvasir: WARNING: OS keyring unavailable (%s); %s the identity key in %s (mode 0600). "+
			"Anyone who can read that file can spend this wallet's earnings.\n", why, verb, path)
	}
	return FileStore{Dir: dir}, "file"
}

// Identity is a worker's ed25519 identity and the wallet address derived
// from it.
type Identity struct {
	Key      ed25519.PrivateKey // 64 bytes
	Public   ed25519.PublicKey  // 32 bytes
	WorkerID string             // hex of Public (64 chars): the id in the ledger and statements
	Address  string             // Address(Public)
}

const seedPrefix = "ed25519-seed:"

// SeedStore is a KeyStore holding one identity key that its caller keeps
// itself: a phone shell's Android Keystore or iOS Keychain hands the seed
// over at start. Get returns it for IdentityAccount; Set accepts only the
// same seed (the key never changes underneath a wallet).
type SeedStore struct {
	Seed []byte // ed25519 seed, 32 bytes
}

// Get implements KeyStore.
func (s SeedStore) Get(account string) (string, error) {
	if account != IdentityAccount || len(s.Seed) != ed25519.SeedSize {
		return "", fmt.Errorf("%w: seed store holds %d bytes for %q", ErrKeyNotFound, len(s.Seed), IdentityAccount)
	}
	return seedPrefix + hex.EncodeToString(s.Seed), nil
}

// Set implements KeyStore: it fails unless secret is the held seed.
func (s SeedStore) Set(account, secret string) error {
	if got, err := s.Get(account); err != nil || got != secret {
		return fmt.Errorf("wallet: the seed store is read-only")
	}
	return nil
}

// NewIdentity returns the identity of an ed25519 private key.
func NewIdentity(key ed25519.PrivateKey) Identity {
	pub := key.Public().(ed25519.PublicKey)
	return Identity{Key: key, Public: pub, WorkerID: hex.EncodeToString(pub), Address: Address(pub)}
}

// LoadIdentity reads the key of account from ks, or, when there is none,
// makes a new random key and stores it. created reports the latter.
// Errors: ErrBadKey for a malformed stored secret, or the store's error.
func LoadIdentity(ks KeyStore, account string) (id Identity, created bool, err error) {
	s, err := ks.Get(account)
	switch {
	case err == nil:
		hexSeed, ok := strings.CutPrefix(s, seedPrefix)
		seed, herr := hex.DecodeString(hexSeed)
		if !ok || herr != nil || len(seed) != ed25519.SeedSize {
			return Identity{}, false, fmt.Errorf("%w: want %q + 64 hex chars", ErrBadKey, seedPrefix)
		}
		return NewIdentity(ed25519.NewKeyFromSeed(seed)), false, nil
	case errors.Is(err, ErrKeyNotFound):
		seed := make([]byte, ed25519.SeedSize)
		if _, err := rand.Read(seed); err != nil {
			return Identity{}, false, fmt.Errorf("wallet: new key: %w", err)
		}
		if err := ks.Set(account, seedPrefix+hex.EncodeToString(seed)); err != nil {
			return Identity{}, false, err
		}
		return NewIdentity(ed25519.NewKeyFromSeed(seed)), true, nil
	default:
		return Identity{}, false, err
	}
}

// identityRecord is <dir>/identity.json: the public facts of the identity,
// so a later run that cannot reach the key store refuses to make a new one.
type identityRecord struct {
	Address string `json:"address"`
	Worker  string `json:"worker"`
	Store   string `json:"store"` // "keyring", "file", or a custom store's name
}

// IdentityRecordName is the file in an app data folder that records its
// identity (address, worker key, key store): absent, the folder has none
// yet, and OpenIdentity makes one.
const IdentityRecordName = "identity.json"

// OpenIdentity loads the worker identity kept for the app data folder dir,
// creating it on first run in ks (storeName labels ks in dir/identity.json;
// pass DefaultKeyStore's results). If identity.json records an identity
// whose key ks cannot return (e.g. it lives in a keyring that is not
// reachable now), it returns ErrIdentityUnavailable rather than a new key.
func OpenIdentity(dir string, ks KeyStore, storeName string) (Identity, error) {
	recPath := filepath.Join(dir, IdentityRecordName)
	var rec identityRecord
	b, err := os.ReadFile(recPath)
	haveRec := err == nil
	if haveRec {
		if err := json.Unmarshal(b, &rec); err != nil {
			return Identity{}, fmt.Errorf("%w: %s: %v", ErrIdentityUnavailable, recPath, err)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return Identity{}, fmt.Errorf("wallet: %w", err)
	}
	if haveRec {
		if _, err := ks.Get(IdentityAccount); errors.Is(err, ErrKeyNotFound) {
			return Identity{}, fmt.Errorf("%w: %s was created in the %q key store, which does not hold its key now; "+
				"restore the key or move %s away to start a new identity", ErrIdentityUnavailable, rec.Address, rec.Store, recPath)
		}
	}
	id, _, err := LoadIdentity(ks, IdentityAccount)
	if err != nil {
		return Identity{}, err
	}
	if haveRec && rec.Worker != id.WorkerID {
		return Identity{}, fmt.Errorf("%w: the %q store holds key %s but %s records %s", ErrIdentityUnavailable, storeName, id.Address, recPath, rec.Address)
	}
	if !haveRec {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return Identity{}, fmt.Errorf("wallet: %w", err)
		}
		b, _ := json.MarshalIndent(identityRecord{Address: id.Address, Worker: id.WorkerID, Store: storeName}, "", "  ")
		if err := os.WriteFile(recPath, append(b, '\n'), 0o600); err != nil {
			return Identity{}, fmt.Errorf("wallet: %w", err)
		}
	}
	return id, nil
}

// Address format: "kvr1" followed by the unpadded lower-case RFC 4648
// base32 encoding of 24 bytes: h = SHA-256(public key)[:20], then a 4-byte
// checksum SHA-256("kvr1" || h)[:4]. 43 characters in all.
const (
	AddressPrefix = "kvr1"
	AddressLen    = len(AddressPrefix) + 39
)

var b32 = base32.StdEncoding.WithPadding(base32.NoPadding)

// Address returns the wallet address of an ed25519 public key (see
// AddressPrefix for the format).
func Address(pub ed25519.PublicKey) string {
	h := sha256.Sum256(pub)
	payload := append([]byte{}, h[:20]...)
	c := sha256.Sum256(append([]byte(AddressPrefix), payload...))
	return AddressPrefix + strings.ToLower(b32.EncodeToString(append(payload, c[:4]...)))
}

// AddressOfHex returns the wallet address of a worker id, its ed25519
// public key in hex (as ledgers and wallets files store it), or "" when
// the id is not 32 bytes of hex.
func AddressOfHex(workerHex string) string {
	pub, err := hex.DecodeString(workerHex)
	if err != nil || len(pub) != ed25519.PublicKeySize {
		return ""
	}
	return Address(pub)
}

// ParseAddress checks an address and returns its 20-byte key hash. It
// returns ErrAddress for a wrong prefix, length, alphabet or checksum.
func ParseAddress(s string) ([]byte, error) {
	if len(s) != AddressLen || !strings.HasPrefix(s, AddressPrefix) {
		return nil, fmt.Errorf("%w: want %q and %d characters", ErrAddress, AddressPrefix, AddressLen)
	}
	body := s[len(AddressPrefix):]
	if strings.ToLower(body) != body {
		return nil, fmt.Errorf("%w: upper-case characters", ErrAddress)
	}
	raw, err := b32.DecodeString(strings.ToUpper(body))
	if err != nil || len(raw) != 24 || strings.ToLower(b32.EncodeToString(raw)) != body {
		return nil, fmt.Errorf("%w: not canonical base32", ErrAddress)
	}
	c := sha256.Sum256(append([]byte(AddressPrefix), raw[:20]...))
	if string(c[:4]) != string(raw[20:]) {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrAddress)
	}
	return raw[:20], nil
}
