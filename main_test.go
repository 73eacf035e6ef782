//go:build !nogui

package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/kvasir-ai/kvasir/app"
	"github.com/kvasir-ai/kvasir/assets"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/wallet"
	"github.com/kvasir-ai/kvasir/wallet/dbfile"
)

// TestFyneAppMetadata holds FyneApp.toml (read by `fyne package`) to the
// app's constants: the same app ID as the Preferences store, and the
// embedded icon.
func TestFyneAppMetadata(t *testing.T) {
	var meta struct {
		Details struct {
			Icon    string
			Name    string
			ID      string
			Version string
			Build   int
		}
	}
	md, err := toml.DecodeFile("FyneApp.toml", &meta)
	if err != nil {
		t.Fatal(err)
	}
	if u := md.Undecoded(); len(u) > 0 {
		t.Logf("keys not checked here: %v", u)
	}
	d := meta.Details
	if d.ID != app.AppID || d.Name != "kvasir" || d.Version == "" || d.Build < 1 {
		t.Errorf("FyneApp.toml Details %+v, want ID %s", d, app.AppID)
	}
	icon, err := os.ReadFile(d.Icon)
	if err != nil || !bytes.Equal(icon, assets.Icon) {
		t.Errorf("icon %s: %v (equal to assets.Icon: %v)", d.Icon, err, bytes.Equal(icon, assets.Icon))
	}
}

// TestNoguiPureGoWallet builds the headless worker as a phone, Termux or a
// static server build would: CGO_ENABLED=0 -tags nogui. The binary links
// the pure-Go SQLite driver (modernc.org/sqlite) and no cgo one; run
// against a loopback swarm with nothing but the gateway and its CA, it
// downloads its experts into the data folder, serves, and keeps a real
// SQLite wallet (application id KVWW) that `kvasir wallet --json` reads
// back with the gateway's credits.
func TestNoguiPureGoWallet(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a binary and starts a loopback swarm")
	}
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to build with")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "kvasir-nogui")
	build := exec.Command(gobin, "build", "-tags", "nogui", "-o", bin, ".")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=0 go build -tags nogui: %v\n%s", err, out)
	}
	info, err := exec.Command(gobin, "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(info), "CGO_ENABLED=0") || !strings.Contains(string(info), "modernc.org/sqlite") ||
		strings.Contains(string(info), "mattn/go-sqlite3") || strings.Contains(string(info), "fyne.io/fyne") {
		t.Fatalf("the nogui binary's build info:\n%s", info)
	}

	sw, err := swarmtest.Start(filepath.Join(dir, "swarm"), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	sw.Load(16, 20*time.Millisecond)
	data := filepath.Join(dir, "data")
	env := append(os.Environ(), "DBUS_SESSION_BUS_ADDRESS=unix:path=/nonexistent") // key file, no keyring
	run := exec.Command(bin, "--headless", "--gateway", sw.URL, "--ca", sw.CAFile, "--data", data, "--threads", "1",
		"--interval", "500ms", "--sync", "300ms", "--duration", "6s")
	run.Env = env
	out, err := run.CombinedOutput()
	if err != nil {
		t.Fatalf("headless: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), " connected gw=") || strings.Contains(string(out), "stopped: served 0 B,") {
		t.Fatalf("headless output:\n%s", out)
	}
	// The hub runs on its defaults (settle 30 s): the session's bytes are
	// settled when it ends, and `kvasir wallet` fetches the credits from
	// the gateway the worker used (saved in the data folder).
	var s wallet.Summary
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		w := exec.Command(bin, "wallet", "--json", "--data", data)
		w.Env = env
		js, err := w.Output()
		if err != nil {
			t.Fatalf("wallet: %v", err)
		}
		s = wallet.Summary{}
		if err := json.Unmarshal(js, &s); err != nil {
			t.Fatalf("wallet JSON: %v\n%s", err, js)
		}
		if s.CreditedNKVR > 0 || time.Now().After(deadline) {
			break
		}
	}
	if s.BytesServed == 0 || s.CreditedNKVR == 0 || s.Statements == 0 || len(s.History) == 0 {
		t.Fatalf("the pure-Go wallet: %+v", s)
	}
	if in, err := dbfile.Check(filepath.Join(data, "wallet.db"), dbfile.WorkerWallet); err != nil || in.State != dbfile.Current {
		t.Fatalf("wallet file: %+v %v", in, err)
	}
	if ents, _ := os.ReadDir(filepath.Join(data, "slice")); len(ents) < 2 {
		t.Errorf("no experts downloaded into %s", filepath.Join(data, "slice"))
	}
	t.Logf("CGO_ENABLED=0 -tags nogui: served %d bytes, credited %d nKVR in %d statements", s.BytesServed, s.CreditedNKVR, s.Statements)
}
