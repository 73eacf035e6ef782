package mobile

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/wallet"
)

type zeroComputer struct{}

func (zeroComputer) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	clear(out)
	return nil
}

func statsOf(t *testing.T) stats {
	t.Helper()
	var s stats
	if err := json.Unmarshal([]byte(StatsJSON()), &s); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestStartStopModes(t *testing.T) {
	loadSlice = func(dir string, threads int) (*node.Slice, error) {
		if dir != "/slice" {
			return nil, fmt.Errorf("no slice at %q", dir)
		}
		return &node.Slice{Computer: zeroComputer{}, ModelID: "m", Backend: "cpu"}, nil
	}
	seed := NewKeySeed()
	if len(seed) != 64 {
		t.Fatalf("seed %q", seed)
	}
	raw, _ := hex.DecodeString(seed)
	want := wallet.Address(ed25519.NewKeyFromSeed(raw).Public().(ed25519.PublicKey))
	if a, err := AddressOf(seed); err != nil || a != want {
		t.Errorf("AddressOf %q %v, want %q", a, err, want)
	}
	data := t.TempDir()
	cfg := func(gw, slice, mode, key string) string {
		b, _ := json.Marshal(config{DataDir: data, GatewayURL: gw, SliceDir: slice, Mode: mode, KeySeedHex: key})
		return string(b)
	}
	bad := []string{
		"{", cfg("ws://127.0.0.1:1", "/slice", "background", seed), cfg("ws://127.0.0.1:1", "/slice", "", "abcd"),
		cfg("http://127.0.0.1:1", "/slice", "", seed), cfg("ws://127.0.0.1:1", "/nope", "", seed),
		`{"data_dir":"` + data + `","gateway_url":"ws://127.0.0.1:1","slice_dir":"/slice","key_seed_hex":"` + seed + `","ca_pem":"junk"}`,
		`{"gateway_url":"ws://127.0.0.1:1","slice_dir":"/slice","key_seed_hex":"` + seed + `"}`, // no data_dir
		`{"data_dir":"` + data + `","gateway_url":"ws://127.0.0.1:1","slice_dir":"/slice","key_seed_hex":"` + seed + `","cpu_limit":101}`,
	}
	for _, c := range bad {
		if err := Start(c); !errors.Is(err, ErrConfig) {
			t.Errorf("Start(%s) = %v, want ErrConfig", c, err)
		}
	}
	if s := statsOf(t); s.Running || s.State != "offline" {
		t.Errorf("not running: %+v", s)
	}

	// Port 1 on loopback refuses: the worker keeps redialling.
	if err := Start(cfg("ws://127.0.0.1:1", "/slice", ModeForeground, seed)); err != nil {
		t.Fatal(err)
	}
	defer Stop()
	if err := Start(cfg("ws://127.0.0.1:1", "/slice", ModeForeground, seed)); !errors.Is(err, ErrRunning) {
		t.Errorf("second Start: %v", err)
	}
	s := statsOf(t)
	if !s.Running || s.Mode != ModeForeground || s.Address != want || s.Gateway != "127.0.0.1:1" || s.State == "paused" || s.CPULimit != 0 {
		t.Errorf("running: %+v", s)
	}
	SetForeground(false)
	if s := statsOf(t); s.State != "paused" || s.Reason != ReasonBackground {
		t.Errorf("background: %+v", s)
	}
	SetForeground(true)
	Pause()
	if s := statsOf(t); s.State != "paused" || !strings.Contains(s.Reason, "by you") {
		t.Errorf("paused: %+v", s)
	}
	Resume()
	if s := statsOf(t); s.State == "paused" {
		t.Errorf("resumed: %+v", s)
	}
	Stop()
	if s := statsOf(t); s.Running {
		t.Errorf("stopped: %+v", s)
	}
	// The run opened its SQLite wallet in data_dir (the pure-Go driver
	// when built without cgo, as for phones).
	js, err := WalletJSON(data, seed)
	var sum wallet.Summary
	if err != nil || json.Unmarshal([]byte(js), &sum) != nil || sum.Address != want || sum.History == nil {
		t.Errorf("wallet after stop: %s %v", js, err)
	}
	if _, err := os.Stat(filepath.Join(data, "wallet.db")); err != nil {
		t.Error(err)
	}

	// Charging mode waits for the charger; cpu_limit reaches the worker.
	limited := `{"data_dir":"` + data + `","gateway_url":"ws://127.0.0.1:1","slice_dir":"/slice","key_seed_hex":"` + seed + `","mode":"charging","cpu_limit":40}`
	if err := Start(limited); err != nil {
		t.Fatal(err)
	}
	if s := statsOf(t); s.CPULimit != 40 {
		t.Errorf("cpu_limit 40: stats %+v", s)
	}
	if s := statsOf(t); s.State != "paused" || s.Reason != ReasonNotCharging {
		t.Errorf("charging mode, unplugged: %+v", s)
	}
	SetCharging(true)
	if s := statsOf(t); s.State == "paused" {
		t.Errorf("charging: %+v", s)
	}
}

// TestMobileInSwarm runs the bindable API against a loopback swarm with an
// empty slice folder and a quota: it downloads its assignment, serves load,
// and StatsJSON reports rows, rates and the bytes it served. The counts and
// credits are in the SQLite wallet in data_dir: they survive a restart,
// WalletJSON, HistoryJSON and EventsJSON read them while the worker is
// stopped, and the desktop's wallet package opens the same file.
func TestMobileInSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a loopback swarm")
	}
	// Without settling: this test needs credits within seconds while the
	// worker works. Its twin on the hub's defaults is app/node's
	// TestTwoWorkersCreditedWhileWorking (the same node and wallet code).
	sw, err := swarmtest.StartWith(t.TempDir(), swarmtest.Options{CreditEvery: 200 * time.Millisecond, NoSettle: true})
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	ca, err := os.ReadFile(sw.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	data, seed := t.TempDir(), NewKeySeed()
	cfg, _ := json.Marshal(map[string]any{"data_dir": data, "gateway_url": sw.URL, "ca_pem": string(ca), "slice_dir": filepath.Join(t.TempDir(), "s"),
		"key_seed_hex": seed, "threads": 1, "quota_bytes": 64 << 20, "mode": ModeCharging, "sync_every_s": 1})
	if err := Start(string(cfg)); err != nil {
		t.Fatal(err)
	}
	defer Stop()
	SetCharging(true)
	sw.Load(16, 20*time.Millisecond)
	deadline := time.Now().Add(30 * time.Second)
	var s stats
	for {
		s = statsOf(t)
		if s.Rows > 0 && s.BytesServed > 0 && s.DownloadBytesTotal > 0 && s.DownloadBytesDone == s.DownloadBytesTotal && s.RowsPerSec > 0 &&
			s.CreditedNKVR > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no work served and credited: %+v", s)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if s.State != "connected" || s.MeteredNKVR != 7*s.BytesServed || s.WalletError != "" {
		t.Errorf("stats %+v", s)
	}
	t.Logf("%s", StatsJSON())
	sw.StopLoad()
	Stop()

	// Stopped: the wallet is on disk, not in memory.
	js, err := WalletJSON(data, seed)
	if err != nil {
		t.Fatal(err)
	}
	var sum wallet.Summary
	if err := json.Unmarshal([]byte(js), &sum); err != nil {
		t.Fatal(err)
	}
	addr, _ := AddressOf(seed)
	if sum.Address != addr || sum.BytesServed < s.BytesServed || sum.CreditedNKVR < s.CreditedNKVR || len(sum.History) == 0 {
		t.Fatalf("wallet after stop %+v, stats were %+v", sum, s)
	}
	hj, err := HistoryJSON(data, seed, "session", 0)
	if err != nil {
		t.Fatal(err)
	}
	var groups []wallet.Group
	if err := json.Unmarshal([]byte(hj), &groups); err != nil || len(groups) == 0 || groups[0].Statements == 0 || groups[0].Session == "" {
		t.Fatalf("history %s: %v", hj, err)
	}
	ej, err := EventsJSON(data, seed, 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var events []wallet.Event
	if err := json.Unmarshal([]byte(ej), &events); err != nil || len(events) != int(sum.Statements)+len(groups) {
		t.Fatalf("%d events for %d statements and %d sessions: %v", len(events), sum.Statements, len(groups), err)
	}
	if _, err := WalletJSON(data, NewKeySeed()); !errors.Is(err, wallet.ErrIdentityUnavailable) {
		t.Errorf("another seed on the same folder: %v", err)
	}
	if _, err := HistoryJSON(data, seed, "week", 0); !errors.Is(err, ErrConfig) {
		t.Errorf("group by week: %v", err)
	}
	// The desktop's wallet package opens the same file for the same key.
	raw, _ := hex.DecodeString(seed)
	w, err := wallet.Open(filepath.Join(data, "wallet.db"), wallet.NewIdentity(ed25519.NewKeyFromSeed(raw)), wallet.Options{})
	if err != nil {
		t.Fatal(err)
	}
	desk, err := w.Summary()
	w.Close()
	if err != nil || desk.BytesServed != sum.BytesServed || desk.CreditedNKVR != sum.CreditedNKVR {
		t.Fatalf("desktop reads %+v, %v; mobile read %+v", desk, err, sum)
	}

	// A restart continues the same wallet.
	if err := Start(string(cfg)); err != nil {
		t.Fatal(err)
	}
	if s2 := statsOf(t); s2.BytesServed != sum.BytesServed || s2.CreditedNKVR != sum.CreditedNKVR {
		t.Errorf("after a restart: %+v, wallet had %d bytes, %d nKVR credited", s2, sum.BytesServed, sum.CreditedNKVR)
	}
}
