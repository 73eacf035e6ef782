package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestSaveGatewayAbsoluteCA: a CA file given relative to the directory
// the worker was started in is saved as an absolute path, so the wallet
// command finds it from any directory.
func TestSaveGatewayAbsoluteCA(t *testing.T) {
	start, data := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(start, "tls"), 0o700); err != nil {
		t.Fatal(err)
	}
	t.Chdir(start)
	if err := SaveGateway(data, SavedGateway{URL: "wss://gw.example:443", CAFile: "tls/gateway.crt"}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(data, GatewayFile))
	if err != nil {
		t.Fatal(err)
	}
	var g SavedGateway
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(start, "tls", "gateway.crt"); g.CAFile != want {
		t.Fatalf("saved CA %q, want %q", g.CAFile, want)
	}
	t.Chdir(t.TempDir())
	if g, err := LoadGateway(data); err != nil || g.CAFile != filepath.Join(start, "tls", "gateway.crt") {
		t.Fatalf("LoadGateway from elsewhere = %+v, %v", g, err)
	}
	// No CA: the system roots, nothing to resolve.
	if err := SaveGateway(data, SavedGateway{URL: "wss://gw.example:443"}); err != nil {
		t.Fatal(err)
	}
	if g, err := LoadGateway(data); err != nil || g.CAFile != "" {
		t.Fatalf("LoadGateway without CA = %+v, %v", g, err)
	}
}

// TestLoadGatewayRelativeCA: a gateway.json from an older kvasir holds
// the CA path as given. It is resolved against the current directory,
// else the data folder; when neither holds it, it comes back as saved.
func TestLoadGatewayRelativeCA(t *testing.T) {
	start, data, elsewhere := t.TempDir(), t.TempDir(), t.TempDir()
	old := []byte(`{"gateway_url":"wss://gw.example:443","ca_file":"tls/gateway.crt"}` + "\n")
	if err := os.WriteFile(filepath.Join(data, GatewayFile), old, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{start, data} {
		if err := os.MkdirAll(filepath.Join(dir, "tls"), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(start, "tls", "gateway.crt"), []byte("pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(elsewhere)
	if g, err := LoadGateway(data); err != nil || g.CAFile != "tls/gateway.crt" {
		t.Fatalf("no such file anywhere: %+v, %v", g, err)
	}
	t.Chdir(start)
	if g, err := LoadGateway(data); err != nil || g.CAFile != filepath.Join(start, "tls", "gateway.crt") {
		t.Fatalf("from the start directory: %+v, %v", g, err)
	}
	if err := os.WriteFile(filepath.Join(data, "tls", "gateway.crt"), []byte("pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Chdir(elsewhere)
	if g, err := LoadGateway(data); err != nil || g.CAFile != filepath.Join(data, "tls", "gateway.crt") {
		t.Fatalf("in the data folder: %+v, %v", g, err)
	}
}
