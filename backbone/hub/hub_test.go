package hub

import (
	"bytes"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestCheckListenAddr(t *testing.T) {
	for _, c := range []struct {
		addr string
		ok   bool
	}{
		{"127.0.0.1:7001", true},
		{"[::1]:7001", true},
		{"10.1.2.3:7001", true},
		{"192.168.0.5:80", true},
		{"172.16.0.1:80", true},
		{"[fd00::1]:7001", true},
		{"169.254.1.1:7001", true},
		{"localhost:7001", true},
		{":7001", false},
		{"0.0.0.0:7001", false},
		{"[::]:7001", false},
		{"8.8.8.8:7001", false},
		{"172.32.0.1:80", false},
		{"[2001:db8::1]:7001", false},
	} {
		err := CheckListenAddr(c.addr, false)
		if (err == nil) != c.ok || (err != nil && !c.ok && !errors.Is(err, ErrPublic)) {
			t.Errorf("%s: err %v, want ok=%v", c.addr, err, c.ok)
		}
		if CheckListenAddr(c.addr, true) != nil {
			t.Errorf("%s refused with allowPublic", c.addr)
		}
	}
	if _, err := New(Config{Listen: "0.0.0.0:0", Backbone: "127.0.0.1:1", Secret: make([]byte, 32)}); !errors.Is(err, ErrPublic) {
		t.Fatalf("New on 0.0.0.0: %v", err)
	}
	if _, err := New(Config{Listen: "127.0.0.1:0", Backbone: "127.0.0.1:1", Secret: make([]byte, 8)}); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("short secret: %v", err)
	}
}

func TestGatewayAuth(t *testing.T) {
	secret := []byte("0123456789abcdef")
	now := time.Now()
	req := func(h http.Header) *http.Request { return &http.Request{Header: h} }
	h := http.Header{}
	SignGateway(h, secret, "abcd", now)
	if !Authorized(req(h), secret) {
		t.Fatal("valid MAC refused")
	}
	if Authorized(req(h), []byte("another secret!!")) {
		t.Fatal("wrong secret accepted")
	}
	forged := h.Clone()
	forged.Set(HeaderWorker, "abce")
	if Authorized(req(forged), secret) {
		t.Fatal("changed worker accepted")
	}
	old := http.Header{}
	SignGateway(old, secret, "abcd", now.Add(-2*time.Minute))
	if Authorized(req(old), secret) {
		t.Fatal("stale MAC accepted")
	}
	if Authorized(req(http.Header{}), secret) || Authorized(req(h), nil) {
		t.Fatal("missing headers or secret accepted")
	}
	var c nonceCache
	if !c.add("n", now, now.Add(time.Minute)) || c.add("n", now.Add(time.Second), now.Add(time.Minute)) {
		t.Fatal("replay not detected")
	}
	if !c.add("n", now.Add(2*time.Minute), now.Add(3*time.Minute)) {
		t.Fatal("expired nonce still remembered")
	}
}

func TestLoadOrCreateSecret(t *testing.T) {
	p := filepath.Join(t.TempDir(), "d", "secret")
	s1, err := LoadOrCreateSecret(p)
	if err != nil || len(s1) != 32 {
		t.Fatal(err)
	}
	st, _ := os.Stat(p)
	if st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode().Perm())
	}
	s2, err := LoadOrCreateSecret(p)
	if err != nil || string(s1) != string(s2) {
		t.Fatal("secret not stable")
	}
	_ = os.WriteFile(p, []byte("abcd\n"), 0o600)
	if _, err := LoadOrCreateSecret(p); !errors.Is(err, ErrNoSecret) {
		t.Fatalf("short secret file: %v", err)
	}
	// A secret every local user may read is refused, naming the fix; a
	// group-readable one (a shared service group) is accepted.
	_ = os.WriteFile(p, []byte(strings.Repeat("ab", 32)+"\n"), 0o600)
	if err := os.Chmod(p, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadSecret(p); !errors.Is(err, ErrSecretOpen) || !strings.Contains(err.Error(), "chmod 600 "+p) {
		t.Fatalf("world-readable secret: %v", err)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if s, err := LoadSecret(p); err != nil || len(s) != 32 {
		t.Fatalf("group-readable secret: %v", err)
	}
}

// A missing secret file is an error naming the path: nothing is created.
func TestLoadSecretMissing(t *testing.T) {
	p := filepath.Join(t.TempDir(), "nope", "secret")
	_, err := LoadSecret(p)
	if !errors.Is(err, ErrSecretMissing) || !strings.Contains(err.Error(), p) {
		t.Fatalf("missing file: %v", err)
	}
	if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("LoadSecret created %s", p)
	}
}

// TestBackboneUnreachableLogged: a backbone that cannot be dialled is
// logged when it first fails, then once a minute with the refusals since,
// and once when it is back: not at every worker's retry.
func TestBackboneUnreachableLogged(t *testing.T) {
	var buf bytes.Buffer
	h := &Hub{cfg: Config{Backbone: "127.0.0.1:1"}, log: slog.New(slog.NewTextHandler(&buf, nil))}
	t0 := time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC)
	down := errors.New("connection refused")
	h.noteBackbone(nil, t0)
	for i := range 6 {
		h.noteBackbone(down, t0.Add(time.Duration(i)*time.Second))
	}
	h.noteBackbone(down, t0.Add(61*time.Second))
	h.noteBackbone(nil, t0.Add(62*time.Second))
	h.noteBackbone(nil, t0.Add(63*time.Second))
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 3 || !strings.Contains(lines[0], "backbone unreachable") || !strings.Contains(lines[0], "refused_since_last_line=0") ||
		!strings.Contains(lines[1], "refused_since_last_line=5") || !strings.Contains(lines[2], "backbone reachable again") {
		t.Fatalf("log:\n%s", buf.String())
	}
}

// TestCheckDialAddr: the hub refuses at New a backbone address no dial can
// use (it started, and only /readyz said "missing port"), as the gateway
// does for its hub address.
func TestCheckDialAddr(t *testing.T) {
	for addr, ok := range map[string]bool{
		"127.0.0.1:7002": true, "localhost:7002": true, "[::1]:7002": true, "backbone.lan:http": true,
		"nohost": false, "127.0.0.1:99999": false, "127.0.0.1:0": false, ":7002": false, "127.0.0.1:-1": false, "h:nosuchservice": false,
	} {
		if err := CheckDialAddr(addr); (err == nil) != ok {
			t.Errorf("%s: %v, want ok=%v", addr, err, ok)
		}
		_, err := New(Config{Listen: "127.0.0.1:0", Backbone: addr, Secret: []byte("0123456789abcdef")})
		if (err == nil) != ok || (!ok && !strings.Contains(err.Error(), "backbone address")) {
			t.Errorf("New with backbone %s: %v", addr, err)
		}
	}
}
