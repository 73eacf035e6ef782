package wallet

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/zalando/go-keyring"
)

func TestKeyringMockIdentity(t *testing.T) {
	keyring.MockInit()
	ks := Keyring{}
	id, created, err := LoadIdentity(ks, "acct")
	if err != nil || !created {
		t.Fatalf("first load: %v created=%v", err, created)
	}
	secret, err := keyring.Get(KeyringService, "acct")
	if err != nil || !strings.HasPrefix(secret, seedPrefix) || len(secret) != len(seedPrefix)+64 {
		t.Fatalf("stored secret %q, %v", secret, err)
	}
	id2, created, err := LoadIdentity(ks, "acct")
	if err != nil || created || id2.Address != id.Address || !id2.Key.Equal(id.Key) {
		t.Fatalf("second load: %v created=%v %s vs %s", err, created, id2.Address, id.Address)
	}
	// A malformed stored secret is an error, not a new key.
	if err := keyring.Set(KeyringService, "bad", "ed25519-seed:zz"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := LoadIdentity(ks, "bad"); !errors.Is(err, ErrBadKey) {
		t.Fatalf("malformed secret: %v", err)
	}
}

func TestFallbackToKeyFile(t *testing.T) {
	dir := t.TempDir()
	// No session bus: the file store, with a warning that says why.
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "")
	var warn bytes.Buffer
	ks, kind := DefaultKeyStore(dir, &warn)
	if kind != "file" || !strings.Contains(warn.String(), "no D-Bus session") || !strings.Contains(warn.String(), "0600") {
		t.Fatalf("kind %q, warning %q", kind, warn.String())
	}
	// A bus whose keyring fails (go-keyring error): the file store too.
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent")
	keyring.MockInitWithError(errors.New("The name org.freedesktop.secrets was not provided by any .service files"))
	defer keyring.MockInit()
	warn.Reset()
	if _, kind := DefaultKeyStore(dir, &warn); kind != "file" || !strings.Contains(warn.String(), "org.freedesktop.secrets") {
		t.Fatalf("keyring error: kind %q, warning %q", kind, warn.String())
	}
	id, err := OpenIdentity(dir, ks, kind)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, IdentityAccount+".key"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", err, fi.Mode())
	}
	id2, err := OpenIdentity(dir, ks, kind)
	if err != nil || id2.Address != id.Address {
		t.Fatalf("reload: %v", err)
	}
	// A key file others can read is refused.
	if err := os.Chmod(filepath.Join(dir, IdentityAccount+".key"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenIdentity(dir, ks, kind); !errors.Is(err, ErrKeyMode) || errors.Is(err, ErrBadKey) || !strings.Contains(err.Error(), "chmod 600") {
		t.Fatalf("0644 key file: %v", err)
	}
}

// An identity made in one store is not silently replaced when that store
// cannot produce the key later (e.g. the keyring is unreachable today).
func TestOpenIdentityRefusesNewKey(t *testing.T) {
	dir := t.TempDir()
	if _, err := OpenIdentity(dir, FileStore{Dir: filepath.Join(dir, "a")}, "keyring"); err != nil {
		t.Fatal(err)
	}
	rec, _ := os.ReadFile(filepath.Join(dir, "identity.json"))
	_, err := OpenIdentity(dir, FileStore{Dir: filepath.Join(dir, "b")}, "file")
	if !errors.Is(err, ErrIdentityUnavailable) || !strings.Contains(err.Error(), `"keyring"`) {
		t.Fatalf("err %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "b", IdentityAccount+".key")); err == nil {
		t.Fatal("a new key was made")
	}
	if rec2, _ := os.ReadFile(filepath.Join(dir, "identity.json")); !bytes.Equal(rec, rec2) {
		t.Fatal("identity.json changed")
	}
}

const inSecretService = "KVASIR_TEST_IN_SECRET_SERVICE"

// TestSecretService stores the identity in a real Secret Service
// (gnome-keyring under dbus-run-session) through go-keyring, reads it back,
// and checks secret-tool sees the item. It re-runs itself inside the
// session; it skips where the tools are not installed.
func TestSecretService(t *testing.T) {
	if os.Getenv(inSecretService) == "1" {
		secretServiceInside(t)
		return
	}
	var missing []string
	for _, tool := range []string{"dbus-run-session", "dbus-send", "gnome-keyring-daemon", "secret-tool"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		t.Skipf("no Secret Service here (missing %s; apt-get install gnome-keyring dbus-x11 libsecret-tools); go-keyring's mock covers the logic", strings.Join(missing, ", "))
	}
	home, run := t.TempDir(), t.TempDir()
	// Wait until the unlocked daemon owns org.freedesktop.secrets before the
	// inner test asks for it: otherwise D-Bus activation starts a second,
	// locked daemon that wants a (GUI) unlock prompt.
	script := `echo -n pass | gnome-keyring-daemon --foreground --unlock --components=secrets >/dev/null 2>&1 & kpid=$!
for i in $(seq 100); do
  dbus-send --session --print-reply --dest=org.freedesktop.DBus /org/freedesktop/DBus org.freedesktop.DBus.NameHasOwner string:org.freedesktop.secrets 2>/dev/null | grep -q 'boolean true' && break
  sleep 0.1
done
"$0" -test.run='^TestSecretService$' -test.v; rc=$?
kill $kpid; wait $kpid 2>/dev/null; exit $rc`
	cmd := exec.Command("dbus-run-session", "--", "sh", "-c", script, os.Args[0])
	cmd.Env = append(os.Environ(), "HOME="+home, "XDG_RUNTIME_DIR="+run, inSecretService+"=1")
	done := make(chan struct{})
	var out []byte
	var err error
	go func() { out, err = cmd.CombinedOutput(); close(done) }()
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("secret service test hung:\n%s", out)
	}
	t.Logf("inside dbus-run-session:\n%s", out)
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestSecretService")) {
		t.Fatalf("inner test: %v", err)
	}
}

func secretServiceInside(t *testing.T) {
	dir := t.TempDir()
	var ks KeyStore
	var kind string
	var warn bytes.Buffer
	for range 50 { // the daemon takes a moment to claim its bus name
		warn.Reset()
		if ks, kind = DefaultKeyStore(dir, &warn); kind == "keyring" {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if kind != "keyring" {
		t.Fatalf("Secret Service not usable: %s", warn.String())
	}
	id, err := OpenIdentity(dir, ks, kind)
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("secret-tool", "lookup", "service", KeyringService, "username", IdentityAccount).Output()
	if err != nil {
		t.Fatalf("secret-tool lookup: %v", err)
	}
	if !strings.HasPrefix(string(out), seedPrefix) {
		t.Fatalf("secret-tool sees %q", out)
	}
	if _, err := os.Stat(filepath.Join(dir, IdentityAccount+".key")); err == nil {
		t.Fatal("a key file was written although the keyring works")
	}
	id2, err := OpenIdentity(dir, ks, kind)
	if err != nil || id2.Address != id.Address {
		t.Fatalf("reload from keyring: %v", err)
	}
	t.Logf("identity %s stored in the Secret Service", id.Address)
}
