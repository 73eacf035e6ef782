package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/backbone/gateway"
)

// gateName is the gateway's public name in the pebble test. autocert
// refuses names without a dot (so not "localhost"), and nothing resolves a
// made-up name here, so every process of the test runs in a private mount
// namespace (unshare -m) whose /etc/hosts maps gateName to 127.0.0.1: the
// system's own file is never touched.
const gateName = "gate.kvasir.test"

// nsWrap returns the command line that runs bin args... in a private mount
// namespace with hosts bind-mounted over /etc/hosts.
func nsWrap(hosts, bin string, args ...string) (string, []string) {
	return "unshare", append([]string{"-m", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hosts, bin}, args...)
}

// freePort returns a port that is free now, below Linux's ephemeral range
// (32768 and up), so that no role binding port 0 takes it before its user
// (the gateway, whose port pebble validates on) does.
func freePort(t *testing.T) int {
	t.Helper()
	for range 200 {
		port := 20000 + mrand.IntN(12000)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			ln.Close()
			return port
		}
	}
	t.Fatal("no free port in 20000..32000")
	return 0
}

// TestUpPebbleNetwork stands up Let's Encrypt's ACME test server (Debian's
// pebble) and, from one config file, `backbone up`: the backbone (serve),
// a hub and a gateway that obtains its certificate by ACME (TLS-ALPN-01).
// Two workers that trust only pebble's root (one by --ca, one without
// --ca: pebble's root is its whole system store) dial the gateway by its
// name, each serving half the layers: the API's greedy completion equals a
// local decode, every creditable byte in the ledger is the protocol's
// count, and the wallets credit exactly those bytes.
func TestUpPebbleNetwork(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: the pebble network test starts six processes")
	}
	if _, err := exec.LookPath("pebble"); err != nil {
		t.Skip("pebble (Let's Encrypt's ACME test server) is not installed: apt-get install pebble")
	}
	dir := t.TempDir()
	hosts := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n127.0.0.1 "+gateName+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin, args := nsWrap(hosts, "getent", "hosts", gateName)
	if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
		t.Skipf("needs root and unshare -m to map %s to 127.0.0.1 in a private /etc/hosts: %v %s", gateName, err, out)
	}
	log := newTestLog(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()

	// pebble: its own HTTPS certificate (self-signed, 127.0.0.1), and the
	// port it validates TLS-ALPN-01 on is the gateway's.
	pebTLS := filepath.Join(dir, "pebble-tls")
	pebCert, pebKey, err := gateway.WriteSelfSigned(pebTLS, "127.0.0.1", "localhost")
	if err != nil {
		t.Fatal(err)
	}
	dirPort, mgmtPort, httpPort, gwPort := freePort(t), freePort(t), freePort(t), freePort(t)
	pebCfg := filepath.Join(dir, "pebble.json")
	if err := os.WriteFile(pebCfg, fmt.Appendf(nil, `{"pebble": {"listenAddress": "127.0.0.1:%d", "managementListenAddress": "127.0.0.1:%d",
 "certificate": %q, "privateKey": %q, "httpPort": %d, "tlsPort": %d, "ocspResponderURL": "", "externalAccountBindingRequired": false}}`,
		dirPort, mgmtPort, pebCert, pebKey, httpPort, gwPort), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, args = nsWrap(hosts, "pebble", "-config", pebCfg)
	peb, err := demo.Start("pebble", log, []string{"PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0"}, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer peb.Stop(5 * time.Second)
	if _, err := peb.Await(ctx, regexp.MustCompile(`ACME directory available`)); err != nil {
		t.Fatal(err)
	}
	// The root pebble issues under (random per run): the only CA the workers trust.
	pebPEM, _ := os.ReadFile(pebCert)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pebPEM)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	var resp *http.Response
	for try := 0; ; try++ { // the management listener may come up a moment after the directory
		if resp, err = hc.Get(fmt.Sprintf("https://127.0.0.1:%d/roots/0", mgmtPort)); err == nil {
			break
		}
		if try == 50 {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	rootPEM, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	rootFile := filepath.Join(dir, "pebble-root.pem")
	if err := os.WriteFile(rootFile, rootPEM, 0o644); err != nil {
		t.Fatal(err)
	}

	// One config file for the whole network.
	cfgFile := filepath.Join(dir, "network.toml")
	cfg := fmt.Sprintf(`[serve]
http = "127.0.0.1:0"
dispatch-listen = "127.0.0.1:0"
wait-workers = 2
min-deadline = "3s"
ban-file = ""
threads = 1

[hub]
listen = "127.0.0.1:0"
ledger = %q
secret-file = %q
create-secret = true
settle = "0s"
settle-results = 0

[gateway]
listen = "127.0.0.1:%d"
acme-domain = %q
acme-cache = %q
acme-directory = "https://127.0.0.1:%d/dir"
acme-ca = %q
wallets = %q
rate-nkvr-per-byte = 7
credit-every = "200ms"
metrics-listen = "127.0.0.1:0"
`, filepath.Join(dir, "ledger.sqlite"), filepath.Join(dir, "hub-secret"), gwPort, gateName, filepath.Join(dir, "acme"),
		dirPort, pebCert, filepath.Join(dir, "wallets.sqlite"))
	if err := os.WriteFile(cfgFile, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	bin, args = nsWrap(hosts, backboneBin(t), "up", "--config", cfgFile, "--start-timeout", "2m", "--grace", "20s")
	upP, err := demo.Start("up", log, []string{asBackbone}, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	defer upP.Stop(30 * time.Second)
	if _, err := upP.Await(ctx, regexp.MustCompile(`up: network running`)); err != nil {
		t.Fatal(err)
	}
	if _, err := upP.Await(ctx, regexp.MustCompile(`ACME certificate for `+regexp.QuoteMeta(gateName)+` obtained`)); err != nil {
		t.Fatal(err)
	}
	m, err := upP.Await(ctx, regexp.MustCompile(`gateway: metrics on http://(\S+)/metrics`))
	if err != nil {
		t.Fatal(err)
	}
	gwMetrics := m[1]

	// Two workers, each half the layers, trusting only pebble's root: the
	// first given it with --ca, the second without --ca, pebble's root
	// being its whole system store (as Let's Encrypt's root is a real
	// machine's).
	gwURL := fmt.Sprintf("wss://%s:%d", gateName, gwPort)
	for i, layers := range []string{"0,2", "1,3"} {
		name := "worker" + strconv.Itoa(i+1)
		args := []string{"worker", "--gateway", gwURL, "--key", filepath.Join(dir, name+".key"), "--model-tiny", "--layers", layers, "--threads", "1"}
		env := []string{asBackbone, "SSL_CERT_FILE=" + rootFile, "SSL_CERT_DIR=/nonexistent"}
		if i == 0 {
			args = append(args, "--ca", rootFile)
			env[1] = "SSL_CERT_FILE=/nonexistent"
		}
		bin, args := nsWrap(hosts, backboneBin(t), args...)
		w, err := demo.Start(name, log, env, bin, args...)
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop(10 * time.Second)
	}
	m, err = upP.Await(ctx, regexp.MustCompile(`msg=serving http=(\S+)`))
	if err != nil {
		t.Fatal(err)
	}
	api := m[1]
	for _, u := range []string{"http://" + api + "/readyz", "http://" + gwMetrics + "/readyz"} {
		if code, body := httpGet(t, u); code != 200 {
			t.Errorf("%s: %d %s", u, code, body)
		}
	}
	// The gateway's readiness covers its wallets store and the hub's ledger.
	if _, body := httpGet(t, "http://"+gwMetrics+"/readyz"); !strings.Contains(body, `"wallets": "ok"`) || !strings.Contains(body, `"ledger": "ok"`) ||
		!strings.Contains(body, `"hub": "ok"`) || !strings.Contains(body, `"certificate": "ok"`) {
		t.Errorf("gateway /readyz lacks a check: %s", body)
	}

	// The swarm's greedy completion equals a local decode.
	const prompt, n = "The network decodes", 12
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": n, "temperature": 0})
	resp, err = http.Post("http://"+api+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	var comp struct {
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err := json.Unmarshal(raw, &comp); err != nil || len(comp.Choices) != 1 {
		t.Fatalf("completion %d: %v %s", resp.StatusCode, err, raw)
	}
	lm, err := loadGenModel("")
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	local, err := decode(ctx, lm, decodeOptions{prompt: prompt, maxTokens: n}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var wantText string // JSON carries each invalid UTF-8 byte as U+FFFD
	enc, _ := json.Marshal(local.Text)
	_ = json.Unmarshal(enc, &wantText)
	if comp.Choices[0].Text != wantText || comp.Usage.PromptTokens != len(local.PromptTokens) || comp.Usage.CompletionTokens != len(local.Tokens) {
		t.Fatalf("swarm %q (%d+%d tokens), local %q (%d+%d)", comp.Choices[0].Text, comp.Usage.PromptTokens, comp.Usage.CompletionTokens,
			local.Text, len(local.PromptTokens), len(local.Tokens))
	}

	// Metering: each worker's creditable bytes are the protocol's count
	// (docs/protocol.md: a worker holds every expert of its layers, so each
	// request is a DISPATCH_SUM, 24 + 4nd + 8nk, its RESULT credited as
	// 28 + 4nkd; one request per held layer per forward), credited x 7.
	p := lm.m.Params()
	rows := uint64(len(local.PromptTokens) + len(local.Tokens) - 1)
	forwards := uint64(len(local.Tokens))
	d, k := uint64(p.Embd), uint64(p.ExpertsUsed)
	wRows := rows * 2
	want := 52*forwards*2 + 4*wRows*(d+2*k) + 4*wRows*k*d
	var ledger ledgerJSON
	var wallets struct {
		Wallets []struct {
			Worker string `json:"worker"`
			Bytes  uint64 `json:"bytes"`
			NKVR   uint64 `json:"nkvr"`
		} `json:"wallets"`
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_ = json.Unmarshal(runBackbone(t, 30*time.Second, "ledger", "--db", filepath.Join(dir, "ledger.sqlite"), "--json"), &ledger)
		_ = json.Unmarshal(runBackbone(t, 30*time.Second, "wallets", "--db", filepath.Join(dir, "wallets.sqlite"), "--json"), &wallets)
		ok := len(ledger.Workers) == 2 && len(wallets.Wallets) == 2
		for i := 0; ok && i < 2; i++ {
			l, w := ledger.Workers[i], wallets.Wallets[i]
			ok = l.Bytes == want && l.RejectedBytes == 0 && w.Bytes == want && w.NKVR == 7*want
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("want %d creditable bytes per worker, credited x 7; ledger %+v, wallets %+v", want, ledger.Workers, wallets.Wallets)
		}
		time.Sleep(300 * time.Millisecond)
	}

	// SIGTERM: up stops gateway, hub and backbone in turn and exits 0.
	if err := upP.Stop(60 * time.Second); err != nil {
		t.Errorf("up exited with %v", err)
	}
	if _, err := upP.Await(ctx, regexp.MustCompile(`up: stopped`)); err != nil {
		t.Error(err)
	}
}

func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}
