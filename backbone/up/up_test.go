package up

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// Up passes each role only the wiring the file leaves out.
func TestArgsWiring(t *testing.T) {
	p := filepath.Join(t.TempDir(), "n.toml")
	if err := os.WriteFile(p, []byte("[hub]\nbackbone = \"10.0.0.9:7002\"\nsecret-file = \"/s\"\n[gateway]\nlisten = \":443\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tb, err := Tables(p)
	if err != nil {
		t.Fatal(err)
	}
	n := Network{Dispatch: "127.0.0.1:5555", Hub: "127.0.0.1:7001"}
	for role, want := range map[string][]string{
		RoleServe:   {"serve", "--config", p, "--dispatch-listen", "10.0.0.9:7002"},
		RoleHub:     {"hub", "--config", p}, // its backbone is in the file
		RoleGateway: {"gateway", "--config", p, "--hub", "127.0.0.1:7001", "--secret-file", "/s"},
	} {
		if got := Args(p, role, tb, n); !slices.Equal(got, want) {
			t.Errorf("%s: %q, want %q", role, got, want)
		}
	}
	// Nothing in the file: the defaults and the addresses the roles got.
	if err := os.WriteFile(p, []byte("[serve]\nhttp = \"127.0.0.1:0\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tb, _ = Tables(p)
	if got := Args(p, RoleServe, tb, Network{}); !slices.Equal(got, []string{"serve", "--config", p, "--dispatch-listen", "127.0.0.1:7002"}) {
		t.Errorf("serve: %q", got)
	}
	if got := Args(p, RoleHub, tb, n); !slices.Equal(got, []string{"hub", "--config", p, "--backbone", "127.0.0.1:5555"}) {
		t.Errorf("hub: %q", got)
	}
}
