package headless

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/app/instance"
	"github.com/kvasir-ai/kvasir/app/limits"
	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/wallet"
)

type fakeSource struct {
	mu   sync.Mutex
	snap status.Snapshot
}

func (f *fakeSource) Stats() status.Snapshot { f.mu.Lock(); defer f.mu.Unlock(); return f.snap }
func (f *fakeSource) Pause()                 {}
func (f *fakeSource) Resume()                {}
func (f *fakeSource) FinishThenPause()       {}

type hotProbe struct{ c float64 }

func (h hotProbe) OnBattery() (bool, error)                  { return false, limits.ErrUnsupported }
func (h hotProbe) CPUTempC() (float64, error)                { return h.c, nil }
func (h hotProbe) CPUTimes() (uint64, uint64, uint64, error) { return 0, 0, 0, limits.ErrUnsupported }

// syncWriter signals each line written.
type syncWriter struct {
	mu    sync.Mutex
	buf   bytes.Buffer
	lines chan struct{}
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	n, err := w.buf.Write(p)
	w.mu.Unlock()
	w.lines <- struct{}{}
	return n, err
}

func TestRunPrintsStatusLines(t *testing.T) {
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	now := t0
	var clockMu sync.Mutex
	src := &fakeSource{snap: status.Snapshot{State: status.Connected, Gateway: "127.0.0.1:8443", RTT: 2 * time.Millisecond}}
	ctl := status.NewControl(src)
	gov := limits.NewGovernor(limits.Limits{MaxTempC: 85}, hotProbe{c: 91})
	ticks := make(chan time.Time)
	out := &syncWriter{lines: make(chan struct{}, 8)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- Run(ctx, Options{Source: ctl, Out: out, Interval: 5 * time.Second,
			Wallet: func() (wallet.Summary, error) {
				return wallet.Summary{PendingNKVR: 8_945_664, MeteredNKVR: 9_100_000}, nil
			},
			Now:  func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now },
			Tick: func(time.Duration) <-chan time.Time { return ticks }})
	}()
	step := func(rows, bytes uint64) {
		src.mu.Lock()
		src.snap.Rows, src.snap.BytesOut = rows, bytes
		src.mu.Unlock()
		clockMu.Lock()
		now = now.Add(5 * time.Second)
		clockMu.Unlock()
		ticks <- now
		<-out.lines
	}
	first := func() { // a tick at the start time: Run has taken its baseline
		ticks <- now
		<-out.lines
		out.mu.Lock()
		out.buf.Reset()
		out.mu.Unlock()
	}
	first()
	step(12345, 1_277_952)
	cancel()
	if err := <-done; err != context.Canceled {
		t.Fatalf("Run: %v", err)
	}
	want := "12:00:05 connected gw=127.0.0.1:8443 rtt=2.0 ms 2469.0 rows/s 0.26 MB/s earned≈0.00910 KVR pending=0.00895 KVR\n"
	if out.buf.String() != want {
		t.Errorf("got %q\nwant %q", out.buf.String(), want)
	}

	// Second run with the temperature limit: paused, with the reason.
	out.buf.Reset()
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		done <- Run(ctx, Options{Source: ctl, Out: out, Governor: gov, Limit: ctl.SetLimit,
			Now:  func() time.Time { clockMu.Lock(); defer clockMu.Unlock(); return now },
			Tick: func(time.Duration) <-chan time.Time { return ticks }})
	}()
	first()
	step(12345+2469*5, 1_277_952)
	cancel()
	<-done
	want = "12:00:10 paused gw=127.0.0.1:8443 rtt=2.0 ms 2469.0 rows/s 0.00 MB/s earned≈0.00000 KVR pending=0.00000 KVR (paused by a limit: CPU at 91.0 °C (limit 85 °C, resumes at 75 °C))\n"
	if out.buf.String() != want {
		t.Errorf("got %q\nwant %q", out.buf.String(), want)
	}
}

// A wallet that cannot be read (a full disk, a read-only folder) shows
// its last figures and why, not 0 KVR as if nothing had been earned.
func TestRunWalletError(t *testing.T) {
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	src := &fakeSource{snap: status.Snapshot{State: status.Connected, Gateway: "g:1", RTT: time.Millisecond}}
	ticks := make(chan time.Time)
	out := &syncWriter{lines: make(chan struct{}, 8)}
	calls := 0
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- Run(ctx, Options{Source: src, Out: out, Interval: 5 * time.Second,
			Wallet: func() (wallet.Summary, error) {
				if calls++; calls > 1 {
					return wallet.Summary{}, errors.New("database or disk is full")
				}
				return wallet.Summary{PendingNKVR: 8_945_664, MeteredNKVR: 9_100_000}, nil
			},
			Now:  func() time.Time { return now },
			Tick: func(time.Duration) <-chan time.Time { return ticks }})
	}()
	for range 2 {
		ticks <- now
		<-out.lines
	}
	cancel()
	<-done
	lines := strings.Split(strings.TrimSpace(out.buf.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], "earned≈0.00910 KVR pending=0.00895 KVR [wallet: database or disk is full]") {
		t.Fatalf("lines:\n%s", out.buf.String())
	}
}

func TestUsage(t *testing.T) {
	var o, e bytes.Buffer
	if code := Main([]string{"--headless", "--quota", "lots"}, &o, &e); code != 2 || !strings.Contains(e.String(), "want a positive byte count") {
		t.Errorf("bad quota: %d %q", code, e.String())
	}
	e.Reset()
	if code := Main([]string{"--headless", "--bogus"}, &o, &e); code != 2 {
		t.Errorf("bad flag: %d", code)
	}
	for _, bad := range []string{"0", "101", "-5"} {
		e.Reset()
		if code := Main([]string{"--headless", "--cpu-limit", bad}, &o, &e); code != 2 || !strings.Contains(e.String(), "--cpu-limit "+bad+": want a percent from 1 to 100") {
			t.Errorf("--cpu-limit %s: %d %q", bad, code, e.String())
		}
	}
	for _, bad := range [][]string{{"--interval", "0"}, {"--interval", "-1s"}, {"--sync", "0"}, {"--sync", "-5s"},
		{"--threads", "-5"}, {"--threads", "100000"}, {"--max-temp", "-1"}, {"--max-temp", "80", "--resume-temp", "85"},
		{"--duration", "-1s"}, {"--quota", "1.5"}} {
		e.Reset()
		if code := Main(append([]string{"--headless"}, bad...), &o, &e); code != 2 || !strings.Contains(e.String(), bad[0]) {
			t.Errorf("%v: %d %q, want refused naming the flag", bad, code, e.String())
		}
	}
	e.Reset()
	if code := Main([]string{"wallet", "--by", "week"}, &o, &e); code != 2 || !strings.Contains(e.String(), "want hour, day or session") {
		t.Errorf("bad grouping: %d %q", code, e.String())
	}
	// Bad gateway URLs and backends are usage errors like the other flags.
	for _, bad := range [][]string{{"--gateway", "http://example"}, {"--gateway", "wss://127.0.0.1:99999"}, {"--backend", "gpu"}} {
		e.Reset()
		if code := Main(append([]string{"--headless", "--data", t.TempDir()}, bad...), &o, &e); code != 2 {
			t.Errorf("%v: exit %d %q, want 2", bad, code, e.String())
		}
	}
	e.Reset()
	if code := Main([]string{"wallet", "--no-fetch", "extra"}, &o, &e); code != 2 || !strings.Contains(e.String(), `unexpected arguments ["extra"]`) {
		t.Errorf("wallet extra: %d %q", code, e.String())
	}
	file := filepath.Join(t.TempDir(), "wallet.db")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	e.Reset()
	if code := Main([]string{"wallet", "--no-fetch", "--data", file}, &o, &e); code != 1 || !strings.Contains(e.String(), "is a file, not a folder") || strings.Count(e.String(), "\n") != 1 {
		t.Errorf("wallet --data FILE: %d %q", code, e.String())
	}
}

// TestHeadlessWithoutSlice runs the real node (SQLite wallet, file key
// store) with a slice folder but no slice loader: it says why it cannot
// serve and exits 1 (it ran offline for ever, then exited 0, which a
// supervisor took for a working worker), and the wallet command prints the
// same identity.
func TestHeadlessWithoutSlice(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a real wallet")
	}
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent") // keyring unavailable: file store
	data := t.TempDir()
	var o, e bytes.Buffer
	code := Main([]string{"--headless", "--gateway", "wss://127.0.0.1:1", "--slice", t.TempDir(), "--data", data,
		"--interval", "100ms", "--duration", "350ms"}, &o, &e)
	if code != 1 || !strings.Contains(e.String(), "kvasir: cannot serve: no slice: slice: bad manifest: ") {
		t.Fatalf("exit %d, stderr %s", code, e.String())
	}
	lines := strings.Split(strings.TrimSpace(o.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "kvasir worker kvr1") {
		t.Fatalf("output:\n%s", o.String())
	}
	addr := strings.TrimPrefix(lines[0], "kvasir worker ")
	// No slice loaded: nothing is put on a device.
	if lines[1] != "gateway: wss://127.0.0.1:1" || lines[3] != "compute: CPU" {
		t.Errorf("lines %q", lines[1:4])
	}
	e.Reset()

	o.Reset()
	if code := Main([]string{"wallet", "--json", "--data", data}, &o, &e); code != 0 {
		t.Fatalf("wallet exit %d: %s", code, e.String())
	}
	var s wallet.Summary
	if err := json.Unmarshal(o.Bytes(), &s); err != nil {
		t.Fatalf("wallet JSON: %v\n%s", err, o.String())
	}
	if s.Address != addr || s.PendingNKVR != 0 || s.History == nil {
		t.Errorf("wallet %+v, want address %s", s, addr)
	}
	o.Reset()
	if code := Main([]string{"wallet", "--data", data}, &o, &e); code != 0 || !strings.Contains(o.String(), addr) || !strings.Contains(o.String(), "\nAddress ") ||
		!strings.HasPrefix(o.String(), "Statements: not fetched") {
		t.Errorf("wallet text %d:\n%s", code, o.String())
	}
	if strings.Contains(e.String(), "held no identity") {
		t.Errorf("a folder with a wallet called new: %s", e.String())
	}
	o.Reset()
	if code := Main([]string{"wallet", "--data", data, "--no-fetch"}, &o, &e); code != 0 || !strings.HasPrefix(o.String(), "Statements: not fetched (--no-fetch)") {
		t.Errorf("wallet --no-fetch %d:\n%s", code, o.String())
	}
	// An existing folder without an identity (another user's default
	// folder, a forgotten --data): a new wallet, and it says so.
	o.Reset()
	e.Reset()
	if code := Main([]string{"wallet", "--data", t.TempDir()}, &o, &e); code != 0 || !strings.Contains(e.String(), "held no identity: a new one was made there") {
		t.Errorf("wallet on an empty folder %d: stderr %q", code, e.String())
	}
}

// TestHeadlessInSwarm runs `kvasir --headless` (Main, as the binary does)
// against a loopback swarm whose hub runs on its defaults (settle 30 s),
// with load: the status lines show the worker connected with non-zero
// rows/s and MB/s. After it stopped, `kvasir wallet --json` with no
// gateway flag fetches the statements from the gateway the worker used
// (saved in the data folder) and then holds exactly the hub's ledger
// bytes for this worker x 7 nKVR: the session's end settled what the hub
// held. (TestTwoWorkersCreditedWhileWorking in app/node checks credits
// arriving while the worker works.)
func TestHeadlessInSwarm(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a loopback swarm")
	}
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent")
	sw, err := swarmtest.Start(t.TempDir(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	sw.Load(16, 20*time.Millisecond)
	data := t.TempDir()
	var o, e bytes.Buffer
	code := Main([]string{"--headless", "--gateway", sw.URL, "--ca", sw.CAFile, "--slice", sw.SliceDir, "--data", data,
		"--threads", "1", "--cpu-limit", "90", "--interval", "500ms", "--duration", "4s"}, &o, &e)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, e.String())
	}
	t.Logf("output:\n%s", o.String())
	var earning bool
	for _, l := range strings.Split(o.String(), "\n") {
		f := strings.Fields(l)
		// 15:04:05 connected gw=… rtt=… ms|— R rows/s M MB/s earned≈E KVR pending=P KVR
		if len(f) < 9 || f[1] != "connected" {
			continue
		}
		// The worker pings right after WELCOME: the RTT is known on the
		// first connected line, not after the 20 s ping interval.
		if f[3] == "rtt=—" {
			t.Errorf("connected line without an RTT: %q", l)
		}
		if i := slices.Index(f, "rows/s"); i >= 1 && f[i-1] != "0.0" && f[i+1] != "0.00" {
			earning = true
		}
		// --cpu-limit reached the worker (one thread of this machine's
		// cores stays under 90 %: it is shown, and the worker earns).
		if !slices.Contains(f, "cpu-limit=90%") {
			t.Errorf("connected line without the CPU limit: %q", l)
		}
	}
	if !earning {
		t.Errorf("no line shows the worker earning")
	}

	// The hub writes a session's last rows at its next flush after the
	// session ended (every second on its defaults) and the gateway credits
	// them at its next poll: ask the wallet until it equals the ledger.
	var s wallet.Summary
	var tot []ledger.WorkerTotal
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		o.Reset()
		e.Reset()
		if code := Main([]string{"wallet", "--json", "--data", data}, &o, &e); code != 0 {
			t.Fatalf("wallet: %d %s", code, e.String())
		}
		s = wallet.Summary{}
		if err := json.Unmarshal(o.Bytes(), &s); err != nil {
			t.Fatal(err)
		}
		var err error
		if tot, err = sw.Ledger.Totals(); err != nil || len(tot) > 1 {
			t.Fatalf("ledger totals %v %v", tot, err)
		}
		if len(tot) == 1 && tot[0].Bytes > 0 && s.CreditedBytes == tot[0].Bytes {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wallet never equalled the ledger: wallet %+v, ledger %v", s, tot)
		}
	}
	if !strings.Contains(o.String(), `"fetch": {`) || !strings.Contains(o.String(), `"gateway": "`+sw.URL+`"`) || strings.Contains(e.String(), "could not fetch") {
		t.Errorf("the wallet did not fetch from the saved gateway:\n%s\n%s", o.String(), e.String())
	}
	// Credited = the ledger's creditable bytes, at 7 nKVR per byte. The own
	// count and the hub's count differ at most by what was in flight at
	// the stop (a DISPATCH received but not answered, a RESULT the hub
	// rejected): within the rejected bytes plus 64 KiB. TestNodeInSwarm
	// checks them equal once the worker is quiet.
	diff := int64(s.BytesServed) - int64(tot[0].Bytes)
	if s.CreditedBytes != tot[0].Bytes || s.CreditedNKVR != 7*tot[0].Bytes || s.Reconcile.Mismatch ||
		max(diff, -diff) > int64(tot[0].RejectedBytes)+64<<10 {
		t.Errorf("wallet credited %d bytes / %d nKVR, own count %d (%s); ledger %d bytes", s.CreditedBytes, s.CreditedNKVR, s.BytesServed,
			s.Reconcile.Explanation, tot[0].Bytes)
	}
	// The text form says where it fetched from, in KVR and decimal bytes.
	o.Reset()
	if code := Main([]string{"wallet", "--data", data}, &o, &e); code != 0 || !strings.HasPrefix(o.String(), "Statements: fetched from "+sw.URL+", 0 new\n") ||
		strings.Contains(o.String(), "units") || strings.Contains(o.String(), "iB") || !strings.Contains(o.String(), " MB ") {
		t.Errorf("wallet text %d:\n%s", code, o.String())
	}
}

// TestWalletSavedCAUnreadable: a gateway.json whose CA file cannot be
// read (saved relative by an older kvasir, run from another directory)
// does not stop `kvasir wallet`: it warns, says it could not fetch and
// reports the wallet's figures of the last fetch, exit 0. A bad --ca given
// on the command line is still an error.
func TestWalletSavedCAUnreadable(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a real wallet")
	}
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent") // keyring unavailable: file store
	data := t.TempDir()
	t.Chdir(t.TempDir())
	saved := `{"gateway_url":"wss://127.0.0.1:1","ca_file":"tls/gateway.crt"}` + "\n"
	if err := os.WriteFile(filepath.Join(data, node.GatewayFile), []byte(saved), 0o600); err != nil {
		t.Fatal(err)
	}
	var o, e bytes.Buffer
	if code := Main([]string{"wallet", "--data", data}, &o, &e); code != 0 ||
		!strings.HasPrefix(o.String(), "Statements: could not fetch from wss://127.0.0.1:1; figures as of the last fetch\n") ||
		!strings.Contains(o.String(), "\nAddress ") || !strings.Contains(o.String(), "Reconcile: ") ||
		!strings.Contains(e.String(), "kvasir: warning: cannot fetch statements from the saved gateway wss://127.0.0.1:1") ||
		!strings.Contains(e.String(), "CA file: open tls/gateway.crt") {
		t.Fatalf("wallet text %d:\n%s\nstderr:\n%s", code, o.String(), e.String())
	}
	o.Reset()
	e.Reset()
	if code := Main([]string{"wallet", "--json", "--data", data}, &o, &e); code != 0 {
		t.Fatalf("wallet --json %d: %s", code, e.String())
	}
	var out struct {
		wallet.Summary
		Fetch struct {
			Gateway, Error string
		}
	}
	if err := json.Unmarshal(o.Bytes(), &out); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(out.Address, "kvr1") || out.Fetch.Gateway != "wss://127.0.0.1:1" || !strings.Contains(out.Fetch.Error, "CA file") {
		t.Fatalf("wallet JSON %+v", out)
	}
	e.Reset()
	if code := Main([]string{"wallet", "--data", data, "--gateway", "wss://127.0.0.1:1", "--ca", "missing.crt"}, &o, &e); code != 1 ||
		!strings.Contains(e.String(), "CA file") {
		t.Fatalf("bad --ca: exit %d, %s", code, e.String())
	}
	// A --data folder that does not exist (a typo) is an error, not a new
	// identity and an empty wallet.
	e.Reset()
	typo := data + "-typo"
	if code := Main([]string{"wallet", "--data", typo}, &o, &e); code != 1 || !strings.Contains(e.String(), "no data folder "+typo) {
		t.Fatalf("missing --data folder: exit %d, %s", code, e.String())
	}
	if _, err := os.Stat(typo); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the mistyped folder was created: %v", err)
	}
}

// TestParseBytes: the app's --quota reads counts as the backbone's flags
// do (engine/bytesize, tested there), its errors wrapping ErrBytes.
func TestParseBytes(t *testing.T) {
	good := map[string]uint64{"64MiB": 64 << 20, "4GB": 4e9, "1.5GiB": 1610612736}
	for in, want := range good {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1", "12 apples", "4194305TiB"} {
		if _, err := ParseBytes(in); !errors.Is(err, ErrBytes) {
			t.Errorf("ParseBytes(%q) = %v, want ErrBytes", in, err)
		}
	}
}

// firstRunChild is set in the environment of TestFirstRun's child: the
// test binary then runs `kvasir --headless` with no other flag, as a first
// run on a new machine does.
const firstRunChild = "KVASIR_HEADLESS_FIRST_RUN"

// TestFirstRun starts `kvasir --headless` with nothing configured on a
// machine whose user config folder is empty: the default gateway
// ($KVASIR_DEFAULT_GATEWAY, pointed at a loopback swarm's TLS gateway),
// trusted through the system roots (SSL_CERT_FILE holds the swarm's
// certificate, standing in for a public CA; no --ca), the slice folder in
// the data folder and provisioning on: the worker dials out, downloads the
// experts the backbone assigns, serves load, and its wallet counts it. It
// runs in a child process, so that the system roots are read with
// SSL_CERT_FILE set.
func TestFirstRun(t *testing.T) {
	if os.Getenv(firstRunChild) == "1" {
		os.Exit(Main([]string{"--headless", "--interval", "500ms", "--duration", "8s"}, os.Stdout, os.Stderr))
	}
	if testing.Short() {
		t.Skip("starts a loopback swarm")
	}
	sw, err := swarmtest.Start(t.TempDir(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	sw.Load(16, 20*time.Millisecond)
	cfgHome := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestFirstRun$")
	cmd.Env = append(os.Environ(), firstRunChild+"=1", node.EnvDefaultGateway+"="+sw.URL, "SSL_CERT_FILE="+sw.CAFile,
		"SSL_CERT_DIR="+t.TempDir(), "XDG_CONFIG_HOME="+cfgHome, "HOME="+t.TempDir(), "DBUS_SESSION_BUS_ADDRESS=unix:path=/nonexistent")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	t.Logf("first run:\n%s", out)
	if err != nil {
		t.Fatalf("exit: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 3 || lines[1] != "gateway: "+sw.URL {
		t.Fatalf("no gateway line")
	}
	// The download itself may finish between two status lines (the
	// embedded model's experts are small); the slice folder below shows it.
	var earning bool
	for _, l := range lines {
		if f := strings.Fields(l); len(f) > 6 && f[1] == "connected" && !strings.Contains(l, " 0.0 rows/s") {
			earning = true
		}
	}
	if !earning {
		t.Errorf("the first run did not earn")
	}
	data := filepath.Join(cfgHome, "kvasir")
	if ents, err := os.ReadDir(filepath.Join(data, "slice")); err != nil || len(ents) < 2 {
		t.Errorf("slice folder in the data folder: %d entries, %v", len(ents), err)
	}
	w, err := os.Stat(filepath.Join(data, "wallet.db"))
	if err != nil || w.Size() == 0 {
		t.Fatalf("wallet: %v", err)
	}
	if last := lines[len(lines)-1]; !strings.HasPrefix(last, "stopped: served ") || strings.HasPrefix(last, "stopped: served 0 ") {
		t.Errorf("last line %q", last)
	}
}

// TestHeadlessOneInstance: `kvasir --headless` on a data folder another
// instance holds (the GUI's or a headless one's instance.Acquire) refuses
// to start a second worker on the same identity and wallet: exit
// instance.ExitRunning, the folder named, nothing written to stdout; once
// the first lets go, it starts.
func TestHeadlessOneInstance(t *testing.T) {
	if testing.Short() {
		t.Skip("opens a real wallet")
	}
	t.Setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/nonexistent") // keyring unavailable: file store
	data := t.TempDir()
	first, err := instance.Acquire(data, nil)
	if err != nil {
		t.Fatal(err)
	}
	// A quota worker (an empty slice folder it would fill): it runs.
	args := []string{"--headless", "--gateway", "wss://127.0.0.1:1", "--slice", t.TempDir(), "--quota", "64MiB", "--data", data,
		"--interval", "100ms", "--duration", "150ms"}
	var o, e bytes.Buffer
	if code := Main(args, &o, &e); code != instance.ExitRunning || o.Len() != 0 ||
		!strings.Contains(e.String(), "already running") || !strings.Contains(e.String(), data) ||
		!strings.Contains(e.String(), "a headless worker without a window") || strings.Contains(e.String(), "brought to the front") {
		t.Fatalf("second instance: exit %d, stdout %q, stderr %q", code, o.String(), e.String())
	}
	first.Release()
	o.Reset()
	e.Reset()
	if code := Main(args, &o, &e); code != 0 || !strings.HasPrefix(o.String(), "kvasir worker kvr1") {
		t.Fatalf("after release: exit %d, stdout %q, stderr %q", code, o.String(), e.String())
	}
}
