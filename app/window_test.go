package app

import (
	"bufio"
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fyne.io/fyne/v2"
	"fyne.io/fyne/v2/test"
	"github.com/godbus/dbus/v5"
	"github.com/godbus/dbus/v5/prop"

	"github.com/kvasir-ai/kvasir/app/instance"
	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/wallet"
)

// hideSpy counts Hide calls on a window.
type hideSpy struct {
	fyne.Window
	hidden atomic.Int32
}

func (h *hideSpy) Hide() { h.hidden.Add(1); h.Window.Hide() }

// TestCloseWithoutTrayQuits: with no tray (here: no desktop driver; on a
// desktop, no StatusNotifier host), closing the window quits the app, not
// hides it, after the work in flight: the worker is told to finish then
// pause, and the app quits once it has. With a confirmed tray icon,
// closing hides the window and the app keeps running.
func TestCloseWithoutTrayQuits(t *testing.T) {
	a := test.NewTempApp(t)
	be := &fakeBackend{snap: status.Snapshot{State: status.Connected}}
	win := NewWindow(a, be, nil, nil, true)
	win.UI.background = func(f func()) { f() }
	spy := &hideSpy{Window: win.Win}
	win.Win = spy
	var quits atomic.Int32
	win.Quit = func() { quits.Add(1) }
	if got := win.TrayStatus(); got != "no tray: no desktop driver; closing the window quits" {
		t.Errorf("tray status %q", got)
	}
	win.RequestClose()
	if quits.Load() != 0 || win.UI.state.Text != "Finishing current work, then quitting…" || strings.Join(be.calls, " ") != "finish" {
		t.Fatalf("closing while connected: quits %d, state %q, calls %v", quits.Load(), win.UI.state.Text, be.calls)
	}
	win.RequestClose() // a second click while finishing changes nothing
	time.Sleep(300 * time.Millisecond)
	if quits.Load() != 0 {
		t.Fatal("quit before the work in flight finished")
	}
	be.mu.Lock()
	be.snap.State = status.Paused // the worker finished and paused
	be.mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for quits.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if quits.Load() != 1 || spy.hidden.Load() != 0 {
		t.Fatalf("after the work finished: %d quits, %d hides", quits.Load(), spy.hidden.Load())
	}

	// Offline: nothing in flight, quits at once.
	win2 := NewWindow(a, &fakeBackend{snap: status.Snapshot{State: status.Dialing}}, nil, nil, false)
	var quits2 atomic.Int32
	win2.Quit = func() { quits2.Add(1) }
	win2.RequestClose()
	if quits2.Load() != 1 {
		t.Errorf("offline close: %d quits", quits2.Load())
	}

	// A confirmed tray icon: the window hides, the app runs on.
	win3 := NewWindow(a, be, nil, nil, false)
	spy3 := &hideSpy{Window: win3.Win}
	win3.Win = spy3
	win3.Quit = func() { t.Error("quit with a tray") }
	win3.trayOK.Store(true)
	win3.RequestClose()
	if spy3.hidden.Load() != 1 {
		t.Errorf("tray close: %d hides", spy3.hidden.Load())
	}
}

// fakeWatcher is a StatusNotifierWatcher on a test bus: the D-Bus object
// a tray host (KDE's plasmashell, the GNOME AppIndicator extension)
// provides.
type fakeWatcher struct {
	mu    sync.Mutex
	props *prop.Properties
	items []string
}

func (f *fakeWatcher) RegisterStatusNotifierItem(sender dbus.Sender, service string) *dbus.Error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if strings.HasPrefix(service, "/") {
		service = string(sender) + service
	}
	f.items = append(f.items, service)
	f.props.SetMust(sniWatcher, "RegisteredStatusNotifierItems", append([]string{}, f.items...))
	return nil
}

// startBus runs a private dbus-daemon and returns its address.
func startBus(t *testing.T) string {
	t.Helper()
	daemon, err := exec.LookPath("dbus-daemon")
	if err != nil {
		t.Skip("no dbus-daemon (apt-get install dbus): the tray check needs a real session bus")
	}
	addr := "unix:path=" + filepath.Join(t.TempDir(), "bus")
	cmd := exec.Command(daemon, "--session", "--nofork", "--nopidfile", "--address="+addr, "--print-address=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		t.Fatalf("dbus-daemon: %v", err)
	}
	return addr
}

// TestTrayHostOnRealBus runs a real D-Bus session bus: without a
// StatusNotifierWatcher (a desktop with a session bus but no tray host,
// as fyne-io/fyne#5182 replays) there is no tray; a watcher without a
// host is no tray either; with a host there is, and TrayRegistered finds
// an item only once this process registered one.
func TestTrayHostOnRealBus(t *testing.T) {
	addr := startBus(t)
	if ok, why := TrayHost(addr, time.Second); ok || !strings.Contains(why, "no StatusNotifier watcher") {
		t.Fatalf("bare bus: %v %q", ok, why)
	}
	conn, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	w := &fakeWatcher{}
	if err := conn.Export(w, sniWatcherPath, sniWatcher); err != nil {
		t.Fatal(err)
	}
	w.props, err = prop.Export(conn, sniWatcherPath, prop.Map{sniWatcher: {
		"IsStatusNotifierHostRegistered": {Value: false, Emit: prop.EmitTrue},
		"RegisteredStatusNotifierItems":  {Value: []string{}, Emit: prop.EmitTrue},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := conn.RequestName(sniWatcher, dbus.NameFlagDoNotQueue); err != nil || r != dbus.RequestNameReplyPrimaryOwner {
		t.Fatalf("RequestName: %v %v", r, err)
	}
	if ok, why := TrayHost(addr, time.Second); ok || !strings.Contains(why, "no StatusNotifier host") {
		t.Fatalf("watcher without a host: %v %q", ok, why)
	}
	w.props.SetMust(sniWatcher, "IsStatusNotifierHostRegistered", true)
	if ok, why := TrayHost(addr, time.Second); !ok {
		t.Fatalf("watcher with a host: %q", why)
	}
	if ok, err := TrayRegistered(addr, os.Getpid(), time.Second); ok || err != nil {
		t.Fatalf("before registering: %v %v", ok, err)
	}
	// An item registered the way fyne.io/systray does it.
	item, err := dbus.Connect(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer item.Close()
	if call := item.Object(sniWatcher, sniWatcherPath).Call(sniWatcher+".RegisterStatusNotifierItem", 0, "/StatusNotifierItem"); call.Err != nil {
		t.Fatal(call.Err)
	}
	if ok, err := TrayRegistered(addr, os.Getpid(), time.Second); !ok || err != nil {
		t.Fatalf("after registering: %v %v", ok, err)
	}
	if ok, _ := TrayRegistered(addr, os.Getpid()+1, time.Second); ok {
		t.Fatal("another process's item counted as ours")
	}
}

// TestNodeConfigFirstRun: settings never saved give a node configuration
// that needs nothing from the owner: the default gateway (pointed at a
// loopback address here), the slice folder in the data folder and
// provisioning within the default 4 GiB.
func TestNodeConfigFirstRun(t *testing.T) {
	cfgHome := t.TempDir()
	t.Setenv("XDG_CONFIG_HOME", cfgHome)
	t.Setenv(node.EnvDefaultGateway, "wss://127.0.0.1:8443")
	a := test.NewTempApp(t)
	s := LoadSettings(a.Preferences())
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	cfg, err := NodeConfig(s, "", nil)
	data := filepath.Join(cfgHome, "kvasir")
	if err != nil || cfg.GatewayURL != "wss://127.0.0.1:8443" || cfg.DataDir != data || cfg.SliceDir != filepath.Join(data, "slice") ||
		cfg.QuotaBytes != 4_000_000_000 || cfg.CAFile != "" {
		t.Fatalf("first run: %+v %v", cfg, err)
	}
	f := NewSettingsForm(a.Preferences(), nil)
	if f.gateway.PlaceHolder != "wss://127.0.0.1:8443 (default)" || f.gateway.Text != "" || f.quota.Text != "4" {
		t.Errorf("form: gateway %q/%q, quota %q", f.gateway.Text, f.gateway.PlaceHolder, f.quota.Text)
	}
}

// TestMainSecondInstance: with the data folder held by a running
// instance, Main asks it to show its window and returns ExitRunning with
// a message, before opening any window.
func TestMainSecondInstance(t *testing.T) {
	dir := t.TempDir()
	var shown atomic.Int32
	l, err := instance.Acquire(dir, func() { shown.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release()
	var stderr bytes.Buffer
	if code := Main([]string{"--data", dir}, &stderr); code != ExitRunning {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stderr.String(), "kvasir is already running for the data folder "+dir) ||
		!strings.Contains(stderr.String(), "its window was brought to the front") || shown.Load() != 1 {
		t.Errorf("stderr %q, shown %d", stderr.String(), shown.Load())
	}
}

// TestHistoryGrouped: the wallet tab lists the history in groups (here
// two hours), each with its credited KVR, statement count and estimate;
// opening a group shows its rows.
func TestHistoryGrouped(t *testing.T) {
	u, be, _ := newTestUI(t)
	be.sum = sampleSummary()
	be.sum.History = append(be.sum.History, wallet.Event{Time: t0.Add(-30 * time.Minute), State: wallet.StateCredited, Statement: 0,
		Bytes: 1000, NKVR: 7000})
	u.Tabs.SelectIndex(1)
	u.Poll(time.Time{}, true)()
	roots := u.historyChildren("")
	if len(roots) != 2 {
		t.Fatalf("groups %v", roots)
	}
	want := "2026-11-29 12:00–13:00 UTC · credited 0.00895 KVR (1 statement) · estimate 0.00910 KVR (1 session)"
	if got := u.historyText(roots[0]); got != want {
		t.Errorf("group line %q\nwant %q", got, want)
	}
	if got := u.historyText(roots[1]); got != "2026-11-29 11:00–12:00 UTC · credited 0.00001 KVR (1 statement) · estimate 0.00000 KVR (0 sessions)" {
		t.Errorf("older group %q", got)
	}
	if kids := u.historyChildren(roots[0]); len(kids) != 1 || u.historyText(kids[0]) != "loading…" {
		t.Errorf("closed group children %v", kids)
	}
	u.history.OpenBranch(roots[0])
	kids := u.historyChildren(roots[0])
	if len(kids) != 2 || u.historyText(kids[0]) != historyLine(be.sum.History[0]) {
		t.Errorf("open group rows %v %q", kids, u.historyText(kids[0]))
	}
}
