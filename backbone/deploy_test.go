package main

import (
	"encoding/json"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

const deployDir = "../assets/deploy"

// The systemd units pass systemd-analyze verify (with ExecStart pointing
// at this binary), without a warning.
func TestDeploySystemdUnits(t *testing.T) {
	sa, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze is not installed (Debian: systemd)")
	}
	units, _ := filepath.Glob(filepath.Join(deployDir, "systemd", "*.service"))
	if len(units) < 4 {
		t.Fatalf("units: %v", units)
	}
	dir := t.TempDir()
	var args []string
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "ExecStart=/usr/local/bin/backbone ") || !strings.Contains(string(b), "--config /etc/kvasir/network.toml") {
			t.Errorf("%s: ExecStart is not backbone ROLE --config /etc/kvasir/network.toml", u)
		}
		p := filepath.Join(dir, filepath.Base(u))
		if err := os.WriteFile(p, []byte(strings.ReplaceAll(string(b), "/usr/local/bin/backbone", backboneBin(t))), 0o644); err != nil {
			t.Fatal(err)
		}
		args = append(args, p)
	}
	out, err := exec.Command(sa, append([]string{"verify"}, args...)...).CombinedOutput()
	if err != nil || len(strings.TrimSpace(string(out))) > 0 {
		t.Fatalf("systemd-analyze verify: %v\n%s", err, out)
	}
}

// The example network.toml is accepted by every role (and up), key by key.
func TestDeployNetworkConfig(t *testing.T) {
	cfg := filepath.Join(deployDir, "network.toml")
	for _, role := range []string{"serve", "hub", "gateway"} {
		out := string(runBackbone(t, 60*time.Second, role, "--config", cfg, "--print-config"))
		if !strings.HasPrefix(out, "["+role+"]\n") {
			t.Errorf("%s --print-config:\n%s", role, out)
		}
	}
	out := string(runBackbone(t, 60*time.Second, "up", "--config", cfg, "--print-config"))
	for _, want := range []string{"[serve]\n", "[hub]\n", "[gateway]\n", `acme-domain = "gate.example.net"`, `grace = "1m0s"`,
		`dispatch-listen = "127.0.0.1:7002"`, `create-secret = true`} {
		if !strings.Contains(out, want) {
			t.Errorf("up --print-config lacks %q:\n%s", want, out)
		}
	}
	// The wiring up fills in is printed as up would run it: a gateway
	// without a hub key dials the hub's listen address, not its default.
	dir := t.TempDir()
	custom := filepath.Join(dir, "net.toml")
	toml := "[serve]\ndispatch-listen = \"127.0.0.1:27002\"\n[hub]\nlisten = \"127.0.0.1:27001\"\nsecret-file = \"" +
		filepath.Join(dir, "secret") + "\"\ncreate-secret = true\nledger = \"" + filepath.Join(dir, "l.sqlite") + "\"\n[gateway]\nlisten = \"127.0.0.1:28443\"\n"
	if err := os.WriteFile(custom, []byte(toml), 0o600); err != nil {
		t.Fatal(err)
	}
	out = string(runBackbone(t, 60*time.Second, "up", "--config", custom, "--print-config"))
	if !strings.Contains(out, `hub = "127.0.0.1:27001"`) || !strings.Contains(out, `backbone = "127.0.0.1:27002"`) {
		t.Errorf("up --print-config does not show up's wiring:\n%s", out)
	}
	// A typo in a role's table stops up before any role starts (the
	// backbone would load its model first), and --print-config prints
	// nothing of a configuration that is not good.
	bad := filepath.Join(dir, "bad.toml")
	if err := os.WriteFile(bad, []byte(strings.Replace(toml, "listen = \"127.0.0.1:27001\"", "lisen = \"127.0.0.1:27001\"", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, extra := range [][]string{nil, {"--print-config"}} {
		cmd := exec.Command(backboneBin(t), append([]string{"up", "--config", bad}, extra...)...)
		cmd.Env = append(os.Environ(), asBackbone)
		var stdout, stderr strings.Builder
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		start := time.Now()
		err := cmd.Run()
		// Exit 2 (a usage error, as a bad [up] key), the role's own words
		// first (it said "up: hub --print-config: exit status 2" and exited 1).
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 || !strings.HasPrefix(stderr.String(), "up: a role's settings are refused: [hub]: ") ||
			!strings.Contains(stderr.String(), "lisen") || stdout.Len() != 0 || strings.Contains(stderr.String(), "[serve]") {
			t.Errorf("up %v with a typo in [hub]: err %v, stdout %q, stderr %q", extra, err, stdout.String(), stderr.String())
		}
		if strings.Contains(stderr.String(), "dispatch listening") || time.Since(start) > 30*time.Second {
			t.Errorf("up %v started a role before finding the typo:\n%s", extra, stderr.String())
		}
	}
}

// The Grafana dashboard is valid JSON and every metric its queries name is
// one the code exports (named in backbone's Go sources: the collectors'
// names and their documented series lists).
func TestDeployDashboard(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(deployDir, "grafana", "kvasir-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatal(err)
	}
	known := exportedMetricNames(t)
	re := regexp.MustCompile(`kvasir_[a-z0-9_]+`)
	n := 0
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range re.FindAllString(tg.Expr, -1) {
				n++
				base := m
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					base = strings.TrimSuffix(base, suf)
				}
				if !known[m] && !known[base] {
					t.Errorf("panel %q: %s is not a metric the code exports", p.Title, m)
				}
			}
		}
	}
	for _, want := range []string{"kvasir_serve_generated_tokens_total", "kvasir_swarm_expert_replicas", "kvasir_gateway_credit_lag_seconds",
		"kvasir_swarm_check_mismatches_total", "kvasir_swarm_banned_workers", "kvasir_swarm_layer_holders", "kvasir_swarm_layer_min_holders"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("dashboard lacks %s", want)
		}
	}
	if n < 20 {
		t.Errorf("only %d metric references", n)
	}
}

// exportedMetricNames collects the metric names in backbone's non-test Go
// sources: full "kvasir_..." names (NewDesc, documented series lists), and
// Namespace/Subsystem/Name triples of the *Opts literals.
func exportedMetricNames(t *testing.T) map[string]bool {
	known := map[string]bool{}
	full := regexp.MustCompile(`kvasir_[a-z0-9_]+`)
	sub := regexp.MustCompile(`ns, sub\s*=\s*"kvasir", "([a-z]+)"`)
	name := regexp.MustCompile(`Name:\s*"([a-z0-9_]+)"`)
	prefixed := regexp.MustCompile(`"(kvasir_[a-z]+_)"\+name`)
	short := regexp.MustCompile(`d\("([a-z0-9_]+)"`)
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		s := string(b)
		for _, m := range full.FindAllString(s, -1) {
			known[m] = true
		}
		for _, sm := range sub.FindAllStringSubmatch(s, -1) {
			for _, nm := range name.FindAllStringSubmatch(s, -1) {
				known["kvasir_"+sm[1]+"_"+nm[1]] = true
			}
		}
		for _, pm := range prefixed.FindAllStringSubmatch(s, -1) {
			for _, nm := range short.FindAllStringSubmatch(s, -1) {
				known[pm[1]+nm[1]] = true
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		t.Fatal(err)
	}
	return known
}
