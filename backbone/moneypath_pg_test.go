package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/credit"
	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore/pgtest"
)

// TestSwarmPostgresTwoHubsTwoGateways: the money path scaled out over
// real processes. A model cut into two slices, `backbone generate
// --dispatch-listen` as the backbone, two hubs appending to one PostgreSQL
// ledger, two TLS gateways (one per hub) crediting one PostgreSQL wallets
// store, and two workers, one behind each gateway. The greedy tokens and
// logits equal a local decode's; each worker's creditable bytes in the
// ledger are exactly the DISPATCH and RESULT bytes its requests make
// (docs/protocol.md), none rejected; the shared wallets credit each
// exactly 7 nKVR per byte; across both gateways every ledger row was
// credited by exactly one of them; and the hubs' metrics add up to the
// ledger.
func TestSwarmPostgresTwoHubsTwoGateways(t *testing.T) {
	dsn := pgtest.DSN(t)
	log := newTestLog(t)
	dir := t.TempDir()
	model := filepath.Join(dir, "gen.gguf")
	runBackbone(t, 60*time.Second, "genmodel", "--preset", "tiny", "--type", "Q4_K_M", "--seed", "7", "--out", model)
	s0, s1 := filepath.Join(dir, "even"), filepath.Join(dir, "odd")
	runBackbone(t, 60*time.Second, "slice", "--model", model, "--layers", "0,2", "--out", s0)
	runBackbone(t, 60*time.Second, "slice", "--model", model, "--layers", "1,3", "--out", s1)
	const n = 12
	args := []string{"generate", "--model", model, "--prompt", "Several hubs, one ledger", "--max-tokens", fmt.Sprint(n),
		"--temperature", "0", "--json", "--threads", "1"}
	var local generateResult
	if err := json.Unmarshal(runBackbone(t, 60*time.Second, args...), &local); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := func(name string, args ...string) *demo.Proc {
		t.Helper()
		p, err := demo.Start(name, log, []string{asBackbone}, backboneBin(t), args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(5 * time.Second) })
		return p
	}
	await := func(p *demo.Proc, re string) string {
		t.Helper()
		m, err := p.Await(ctx, regexp.MustCompile(re))
		if err != nil {
			t.Fatalf("%v\n%s", err, p.Tail(20))
		}
		return m[1]
	}
	gen := start("generate", append(args, "--dispatch-listen", "127.0.0.1:0", "--wait-workers", "2", "--wait-timeout", "90s",
		"--min-deadline", "3s")...)
	backbone := await(gen, `^generate: dispatch listening on (\S+) `)
	var secret [32]byte
	_, _ = rand.Read(secret[:])
	secretFile := filepath.Join(dir, "hub-secret")
	if err := os.WriteFile(secretFile, []byte(hex.EncodeToString(secret[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var hubs, gwMetrics []string
	var workers []*demo.Proc
	for i, slice := range []string{s0, s1} {
		h := start(fmt.Sprintf("hub-%d", i), "hub", "--listen", "127.0.0.1:0", "--backbone", backbone, "--secret-file", secretFile, "--ledger", dsn)
		hubAddr := await(h, `^hub: listening on (\S+),`)
		hubs = append(hubs, hubAddr)
		tlsDir := filepath.Join(dir, fmt.Sprintf("tls-%d", i))
		g := start(fmt.Sprintf("gateway-%d", i), "gateway", "--listen", "127.0.0.1:0", "--hub", hubAddr, "--secret-file", secretFile,
			"--self-signed-out", tlsDir, "--wallets", dsn, "--credit-every", "100ms", "--metrics-listen", "127.0.0.1:0")
		gwMetrics = append(gwMetrics, await(g, `^gateway: metrics on http://(\S+)/metrics`))
		gwAddr := await(g, `^gateway: listening on (\S+) \(TLS\)`)
		workers = append(workers, start(fmt.Sprintf("worker-%d", i), "worker", "--gateway", "wss://"+gwAddr,
			"--ca", filepath.Join(tlsDir, "gateway.crt"), "--key", filepath.Join(dir, fmt.Sprintf("worker-%d.key", i)),
			"--slice", slice, "--threads", "1"))
	}
	line, err := gen.Await(ctx, jsonLine)
	if err != nil {
		t.Fatalf("%v\n%s", err, gen.Tail(20))
	}
	<-gen.Done()
	var swarm generateResult
	if err := json.Unmarshal([]byte(line[0]), &swarm); err != nil {
		t.Fatal(err)
	}
	if len(local.Tokens) == 0 || !slices.Equal(swarm.Tokens, local.Tokens) || swarm.LogitsSHA256 != local.LogitsSHA256 {
		t.Errorf("swarm tokens %v (logits %s), local %v (%s)", swarm.Tokens, swarm.LogitsSHA256, local.Tokens, local.LogitsSHA256)
	}
	for _, w := range workers {
		_ = w.Stop(5 * time.Second)
	}

	// Wait for the final row of each worker's session and for the shared
	// cursor to reach the last row.
	l, err := ledger.OpenReadOnly(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	w, err := credit.OpenReadOnly(dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	var rows []ledger.Entry
	for {
		rows, err = l.Since(0, ledger.MaxLimit)
		if err != nil {
			t.Fatal(err)
		}
		final := map[string]bool{}
		for _, e := range rows {
			final[e.SessionID] = final[e.SessionID] || e.Final
		}
		missing := 0
		for _, sw := range swarm.Workers { // the hub session ids the backbone saw
			if !final[sw.Session] {
				missing++
			}
		}
		cur, _ := w.Cursor()
		if len(rows) > 0 && missing == 0 && cur == rows[len(rows)-1].ID {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("%d sessions without a final row, cursor %d, %d rows", missing, cur, len(rows))
		}
		time.Sleep(100 * time.Millisecond)
	}

	lm, err := loadGenModel(model)
	if err != nil {
		t.Fatal(err)
	}
	p := lm.m.Params()
	lm.Close()
	prows := uint64(len(local.PromptTokens) + len(local.Tokens) - 1) // rows through each layer
	forwards := uint64(len(local.Tokens))                            // prefill + one per token but the last
	d, k := uint64(p.Embd), uint64(p.ExpertsUsed)
	wRows := 2 * prows // each worker holds two of the four layers
	// Each worker holds every expert of its layers: DISPATCH_SUMs (row
	// sums) of 24 + 4nd + 8nk bytes, their RESULTs credited as 28 + 4nkd.
	want := 2*52*forwards + 4*wRows*(d+2*k) + 4*wRows*k*d
	tot, err := l.Totals()
	if err != nil {
		t.Fatal(err)
	}
	ws, err := w.Wallets()
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, sw := range swarm.Workers {
		ids[sw.ID] = true
	}
	if len(tot) != 2 || len(ws) != 2 || len(ids) != 2 {
		t.Fatalf("ledger %+v, wallets %+v, generate's workers %+v: want 2 each", tot, ws, swarm.Workers)
	}
	var ledgerBytes uint64
	for i := range tot {
		if !ids[tot[i].ID] || tot[i].Bytes != want || tot[i].RejectedBytes != 0 {
			t.Errorf("ledger %+v: want %d creditable bytes, none rejected", tot[i], want)
		}
		if ws[i].Worker != tot[i].ID || ws[i].Bytes != want || ws[i].NKVR != 7*want {
			t.Errorf("wallet %+v: want %d bytes, %d nKVR", ws[i], want, 7*want)
		}
		ledgerBytes += tot[i].Bytes
	}
	// Each row was credited by exactly one gateway; the hubs appended
	// what the ledger holds.
	var creditedRows, hubBytes float64
	for _, m := range gwMetrics {
		creditedRows += scrapeMetric(t, "http://"+m+"/metrics", "kvasir_gateway_credit_rows_total")
	}
	for _, h := range hubs {
		hubBytes += scrapeMetric(t, "http://"+h+"/metrics", `kvasir_hub_ledger_bytes_total{kind="creditable"}`)
	}
	if int(creditedRows) != len(rows) || uint64(hubBytes) != ledgerBytes {
		t.Errorf("gateways credited %v rows of %d; hubs appended %v creditable bytes, ledger holds %d", creditedRows, len(rows), hubBytes, ledgerBytes)
	}
	var lj ledgerJSON
	if err := json.Unmarshal(runBackbone(t, 30*time.Second, "ledger", "--db", dsn, "--json"), &lj); err != nil {
		t.Fatal(err)
	}
	if len(lj.Workers) != 2 || lj.Workers[0].Bytes != want || lj.Workers[1].Bytes != want {
		t.Errorf("backbone ledger --db postgres://...: %+v", lj)
	}
	var wj struct {
		Cursor  int64           `json:"cursor"`
		Wallets []credit.Wallet `json:"wallets"`
	}
	if err := json.Unmarshal(runBackbone(t, 30*time.Second, "wallets", "--db", dsn, "--json"), &wj); err != nil {
		t.Fatal(err)
	}
	if wj.Cursor != rows[len(rows)-1].ID || len(wj.Wallets) != 2 || wj.Wallets[0].NKVR != 7*want {
		t.Errorf("backbone wallets --db postgres://...: %+v", wj)
	}
	t.Logf("%d tokens equal; %d ledger rows from 2 hubs, %d creditable bytes per worker, credited %v rows across 2 gateways",
		len(swarm.Tokens), len(rows), want, creditedRows)
}

// scrapeMetric returns the value of the series named exactly series (with
// its labels) at url.
func scrapeMetric(t *testing.T, url, series string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return f
		}
	}
	t.Fatalf("%s: no series %s", url, series)
	return 0
}
