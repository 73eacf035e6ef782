package worker

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ErrKeyFile is wrapped by LoadOrCreateKeyFile's errors about the file's
// contents or permissions.
var ErrKeyFile = errors.New("worker: bad key file")

// LoadOrCreateKeyFile returns the ed25519 identity stored at path as the hex
// of its 32-byte seed (RFC 8032 private key), creating a fresh one (file mode
// 0600, parent directories 0700) if the file does not exist. An existing file
// readable or writable by group or others is refused (like ssh), as is one
// that does not hold exactly 32 bytes of hex. Until the wallet's keyring
// identity exists, the headless worker uses this file.
func LoadOrCreateKeyFile(path string) (ed25519.PrivateKey, error) {
	st, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			if errors.Is(err, os.ErrExist) {
				return LoadOrCreateKeyFile(path)
			}
			return nil, err
		}
		_, err = f.WriteString(hex.EncodeToString(priv.Seed()) + "\n")
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		return priv, nil
	}
	if err != nil {
		return nil, err
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %v, want 0600", ErrKeyFile, path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	seed, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("%w: %s must hold the hex of a 32-byte seed", ErrKeyFile, path)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}
