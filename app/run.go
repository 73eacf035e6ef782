package app

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"fyne.io/fyne/v2"
	fyneapp "fyne.io/fyne/v2/app"

	"github.com/kvasir-ai/kvasir/app/autostart"
	"github.com/kvasir-ai/kvasir/app/instance"
	"github.com/kvasir-ai/kvasir/app/limits"
	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/wallet"
)

// AppID is the stable application ID (also in FyneApp.toml): it names the
// Preferences store and the desktop entry.
const AppID = "ai.kvasir.contributor"

// PollEvery is the window's one refresh period: worker stats, the chart,
// the wallet figures, the slice and the limits are read together, so the
// live estimate moves with the counters.
const PollEvery = 2 * time.Second

// QuitGrace bounds how long closing the window (without a tray) waits for
// the work in flight to finish before the app quits anyway.
const QuitGrace = 15 * time.Second

// Window is a running contributor window: the UI, its backend and the
// loop that feeds it. Made by NewWindow; Loop runs until stop is closed.
type Window struct {
	UI   *UI
	Win  fyne.Window
	ctl  *status.Control
	be   Backend
	gov  *limits.Governor
	tray *tray
	// Quit ends the app; NewWindow sets fyne.App.Quit (tests replace it).
	Quit func()

	stopped atomic.Bool // the app has stopped: widgets must not be touched
	trayOK  atomic.Bool // the tray host listed our icon: closing hides the window
	closing atomic.Bool // RequestClose is finishing the work, then quits
	// TrayStatus says whether closing the window hides it to the tray, and
	// if not, why ("" until the tray is confirmed or refused).
	trayStatus atomic.Value // string
	// Notify shows a desktop notification; NewWindow sets
	// fyne.App.SendNotification (tests replace it).
	Notify func(title, body string)
	// NotifyCredits: also notify of each new credit statement.
	NotifyCredits atomic.Bool

	seenBan      string // the ban reason last notified (Loop goroutine)
	seenStatedN  uint64 // statements seen (Loop goroutine)
	seenStatedOK bool
}

// NewWindow builds the main window over be (a *node.Manager in the app, a
// fake in tests) with the settings form bound to a's Preferences. onSave
// is called after the owner saved valid settings (nil: none). withTray
// installs the tray icon and menu when the platform has a tray that shows
// it (on Linux/BSD a StatusNotifier host on the session bus; TrayHost),
// then confirms the icon was registered (TrayRegistered): only then does
// closing the window hide it to the tray. Otherwise closing the window
// quits, after the work in flight (RequestClose).
func NewWindow(a fyne.App, be Backend, gov *limits.Governor, onSave func(Settings), withTray bool) *Window {
	ctl := status.NewControl(be)
	form := NewSettingsForm(a.Preferences(), func(s Settings) {
		if gov != nil {
			gov.SetLimits(s.Limits())
		}
		if onSave != nil {
			onSave(s)
		}
	})
	u := NewUI(a, be, ctl, form)
	w := a.NewWindow("kvasir — contributor")
	w.SetIcon(AppIcon)
	w.SetContent(u.Tabs)
	w.Resize(fyne.NewSize(900, 640))
	win := &Window{UI: u, Win: w, ctl: ctl, be: be, gov: gov, Quit: a.Quit,
		Notify: func(title, body string) { a.SendNotification(fyne.NewNotification(title, body)) }}
	win.NotifyCredits.Store(LoadSettings(a.Preferences()).NotifyCredits)
	form.OnSaveLocal = func(s Settings) { win.NotifyCredits.Store(s.NotifyCredits) }
	win.trayStatus.Store("")
	a.Lifecycle().SetOnStopped(func() { win.stopped.Store(true) })
	why := "no tray requested"
	if withTray {
		win.tray, why = newTray(a, w, ctl)
	}
	w.SetCloseIntercept(win.RequestClose)
	if win.tray != nil {
		u.mu.Lock()
		u.onState = func(s status.Snapshot, sum wallet.Summary) { win.tray.update(s, sum, ctl.UserPaused()) }
		u.mu.Unlock()
		go func() {
			ok, why := win.tray.confirm(10 * time.Second)
			win.trayOK.Store(ok)
			if ok {
				win.trayStatus.Store("closing the window hides it to the tray")
			} else {
				win.trayStatus.Store("no tray: " + why + "; closing the window quits")
				fyne.LogError("tray: "+why+"; closing the window quits instead of hiding", nil)
			}
		}()
	} else {
		win.trayStatus.Store("no tray: " + why + "; closing the window quits")
		if withTray {
			fyne.LogError("tray: "+why+"; closing the window quits instead of hiding", nil)
		}
		w.SetMaster()
	}
	return win
}

// TrayStatus says whether closing the window hides it to the tray, and if
// not, why; "" while the tray is being confirmed.
func (w *Window) TrayStatus() string { return w.trayStatus.Load().(string) }

// RequestClose is what closing the window does (its close intercept):
// with a confirmed tray icon it hides the window; otherwise it quits the
// app, first letting the work in flight finish (FinishThenPause, at most
// QuitGrace) when the worker is serving. Run on the Fyne goroutine.
func (w *Window) RequestClose() {
	if w.trayOK.Load() {
		w.Win.Hide()
		return
	}
	if !w.closing.CompareAndSwap(false, true) {
		return
	}
	// Without a tray, closing ends the contribution: say so where the
	// owner will see it after the window is gone.
	w.Notify("kvasir stopped contributing",
		"The window was closed and this desktop has no tray to keep kvasir running, so it no longer earns. "+
			"Start kvasir again to resume (Settings: \"Start kvasir when I log in\").")
	if w.be.Stats().State != status.Connected {
		w.Quit()
		return
	}
	w.ctl.FinishThenPause()
	w.UI.refreshState()
	w.UI.state.Text = "Finishing current work, then quitting…"
	w.UI.state.Refresh()
	go func() {
		deadline := time.Now().Add(QuitGrace)
		for w.be.Stats().State == status.Connected && time.Now().Before(deadline) {
			time.Sleep(100 * time.Millisecond)
		}
		fyne.Do(w.Quit)
	}()
}

// Show brings the window to the front (a second launch on the same data
// folder asks for it); any goroutine.
func (w *Window) Show() {
	fyne.Do(func() {
		w.Win.Show()
		w.Win.RequestFocus()
	})
}

// Loop checks the limits, polls the backend (stats, wallet, slice) every
// PollEvery and applies the readings on the Fyne goroutine with fyne.Do,
// and sends the notifications they call for (watch), until stop is
// closed.
func (w *Window) Loop(stop <-chan struct{}) {
	t := time.NewTicker(PollEvery)
	defer t.Stop()
	for {
		if w.gov != nil {
			w.ctl.SetLimit(w.gov.Check())
		}
		apply := w.UI.Poll(time.Now(), true)
		fyne.Do(func() {
			if !w.stopped.Load() { // after Quit, fyne.Do runs on this goroutine
				apply()
			}
		})
		w.UI.mu.Lock()
		snap, sum := w.UI.snap, w.UI.sum
		w.UI.mu.Unlock()
		w.watch(snap, sum)
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// watch sends the notifications a reading calls for: the worker's key was
// banned (once per reason), and, when NotifyCredits is on, a new credit
// statement. Run on the Loop goroutine.
func (w *Window) watch(s status.Snapshot, sum wallet.Summary) {
	why := s.LastError
	if !strings.Contains(why, "banned") {
		why = s.Reason
	}
	if strings.Contains(why, "banned") && why != w.seenBan {
		w.seenBan = why
		w.Notify("kvasir: this worker was banned", why)
	}
	if w.seenStatedOK && sum.Statements > w.seenStatedN && w.NotifyCredits.Load() {
		w.Notify("kvasir: new credit", fmt.Sprintf("The gateway credited this worker; %s credited in all.", status.FormatKVR(sum.CreditedNKVR)))
	}
	if sum.Address != "" {
		w.seenStatedN, w.seenStatedOK = sum.Statements, true
	}
}

// noticeWriter shows what is written to it (the key store's warning that
// the identity key is in a plain file) on the window's status tab, as
// well as on the terminal.
type noticeWriter struct {
	win *atomic.Pointer[Window]
}

func (n noticeWriter) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(p)), "kvasir: WARNING: "))
	if w := n.win.Load(); w != nil && msg != "" {
		fyne.Do(func() { w.UI.SetNotice("Identity key not in a keyring", msg) })
	}
	return len(p), nil
}

// applyAutostart writes or removes the login entry for s.StartAtLogin
// (package autostart), starting this executable with dataArgs.
func applyAutostart(s Settings, dataArgs []string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	if on, _ := autostart.Enabled(); on == s.StartAtLogin && !on {
		return nil
	}
	return autostart.Set(s.StartAtLogin, exe, dataArgs...)
}

// NodeConfig is the node configuration for settings s with the app's
// data folder data ("" = node.DefaultDataDir): what the owner left unset
// takes the first-run defaults (node.Config.WithDefaults: the public
// gateway, the slice folder in the data folder, provisioning within the
// quota).
func NodeConfig(s Settings, data string, warn io.Writer) (node.Config, error) {
	return node.Config{GatewayURL: s.GatewayURL, CAFile: s.CAFile, SliceDir: s.SliceDir, DataDir: data, Threads: s.Threads,
		CPULimit: s.CPULimit, QuotaBytes: s.QuotaBytes(), Backend: s.Backend, Warn: warn}.WithDefaults()
}

// StartNode starts cfg's node on mgr; when its compute device cannot be
// had (node.ErrBackend) it starts the node on the CPU instead and calls
// notice with a title and the reason, so that the owner keeps earning
// and learns why the GPU is not used; a start that works calls notice
// with an empty text (clearing an earlier notice). It returns the
// error of the start that failed last (nil when a node runs).
func StartNode(mgr *node.Manager, cfg node.Config, notice func(title, text string)) error {
	err := mgr.Start(cfg)
	if errors.Is(err, node.ErrBackend) {
		cfg.Backend = "cpu"
		if err2 := mgr.Start(cfg); err2 != nil {
			return err2
		}
		notice("Computing on the CPU", fmt.Sprintf("the chosen compute device cannot be used (%v). Choose another in Settings → Compute on.", err))
		return nil
	}
	if err == nil {
		notice("", "")
	}
	return err
}

// ExitRunning is Main's exit code when another instance holds the data
// folder (it was asked to show its window).
const ExitRunning = instance.ExitRunning

// Main runs the desktop app: `kvasir [--gateway URL] [--slice DIR] [--ca
// FILE] [--data DIR] [--threads N] [--cpu-limit PCT] [--backend
// auto|cpu|vulkan:N]`; flags override the saved settings for this run (and
// are saved). When the saved compute device cannot be had (a GPU removed,
// its driver gone), the worker starts on the CPU and the status tab says
// why. With nothing set it starts as a first run
// (NodeConfig). One instance runs per data folder: a second launch asks
// the first to show its window and returns ExitRunning. It returns the
// exit code.
func Main(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvasir", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gw := fs.String("gateway", "", "gateway URL, wss://HOST:PORT (default: saved setting, else the network's public gateway)")
	slice := fs.String("slice", "", "expert slice folder (default: saved setting, else DATA/slice)")
	ca := fs.String("ca", "", "PEM file of root CAs for the gateway (default: saved setting, else the system's)")
	threads := fs.Int("threads", -1, "compute threads (default: saved setting; 0 = all CPUs)")
	cpuLimit := fs.Int("cpu-limit", -1, "percent of this computer's CPU time kvasir may use, 1-100 (default: saved setting; 100 = no limit)")
	data := fs.String("data", "", "data folder for identity and wallet (default: user config dir/kvasir)")
	backend := fs.String("backend", "", "where experts are computed: auto, cpu or vulkan:N (default: saved setting, else auto: a GPU if there is one)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if os.Getenv("GOGC") == "" {
		// A tray app: collect twice as often for a smaller heap (measured
		// with scripts/measure-app.sh: about 14 MB less resident, no
		// visible CPU cost).
		debug.SetGCPercent(50)
	}
	dataDir, err := node.DataDir(*data)
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		return 1
	}
	var win atomic.Pointer[Window]
	lock, err := instance.Acquire(dataDir, func() {
		if w := win.Load(); w != nil {
			w.Show()
		}
	})
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		if errors.Is(err, instance.ErrRunning) {
			return ExitRunning
		}
		return 1
	}
	defer lock.Release()

	setSessionBus()
	a := fyneapp.NewWithID(AppID)
	a.SetIcon(AppIcon)
	s := LoadSettings(a.Preferences())
	if *gw != "" {
		s.GatewayURL = *gw
	}
	if *slice != "" {
		s.SliceDir = *slice
	}
	if *ca != "" {
		s.CAFile = *ca
	}
	if *threads >= 0 {
		s.Threads = *threads
	}
	if *cpuLimit != -1 { // given (0 and other values out of 1-100 are refused by Validate)
		s.CPULimit = *cpuLimit
	}
	if *backend != "" {
		s.Backend = *backend
	}
	if err := s.Validate(); err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		return 2
	}
	s.Save(a.Preferences())

	mgr := &node.Manager{}
	warn := io.MultiWriter(stderr, noticeWriter{&win})
	var cpuNotice atomic.Bool // the status tab shows StartNode's notice
	start := func(s Settings) {
		cfg, err := NodeConfig(s, dataDir, warn)
		if err == nil {
			err = StartNode(mgr, cfg, func(title, text string) {
				w := win.Load()
				if w == nil || (text == "" && !cpuNotice.Load()) {
					return // nothing of ours to clear (the notice may be the key store's)
				}
				cpuNotice.Store(text != "")
				fyne.Do(func() { w.UI.SetNotice(title, text) })
			})
		}
		if err != nil {
			fyne.LogError("starting the worker", err)
		}
	}
	var dataArgs []string
	if *data != "" {
		dataArgs = []string{"--data", dataDir}
	}
	gov := limits.NewGovernor(s.Limits(), limits.SysProbe{})
	running := s
	w := NewWindow(a, mgr, gov, func(s Settings) {
		if err := applyAutostart(s, dataArgs); err != nil {
			fyne.LogError("start at login", err)
		}
		// Only what a worker cannot change while it runs restarts it (a
		// new session): limits, start at login and notifications apply
		// as they are; the CPU limit is handed to the running worker.
		if NeedsRestart(running, s) {
			go start(s)
		} else if s.CPULimit != running.CPULimit {
			if err := mgr.SetCPULimit(s.CPULimit); err != nil {
				fyne.LogError("CPU limit", err)
			}
		}
		running = s
	}, true)
	win.Store(w)
	if err := applyAutostart(s, dataArgs); err != nil {
		fyne.LogError("start at login", err)
	}
	go start(s)
	stop := make(chan struct{})
	go w.Loop(stop)
	w.Win.ShowAndRun()
	close(stop)
	mgr.Stop()
	return 0
}

// setSessionBus names the D-Bus session bus for everything the app starts
// (Fyne's desktop integration, the keyring, the tray) when
// DBUS_SESSION_BUS_ADDRESS is empty on a desktop that uses D-Bus: the
// socket $XDG_RUNTIME_DIR/bus when there is one, else "disabled:", an
// address that connects nowhere. Without it godbus, asked for the session
// bus, launched one (dbus-launch), and every launch of the window without
// a session left a dbus-daemon running after the app quit.
func setSessionBus() {
	if !needsSessionBus() || os.Getenv("DBUS_SESSION_BUS_ADDRESS") != "" {
		return
	}
	os.Setenv("DBUS_SESSION_BUS_ADDRESS", sessionBusAddress(os.Getenv("XDG_RUNTIME_DIR")))
}

// sessionBusAddress is the session bus address for a session without
// DBUS_SESSION_BUS_ADDRESS: the runtime folder's bus socket, or
// "disabled:".
func sessionBusAddress(runtimeDir string) string {
	if runtimeDir != "" {
		p := filepath.Join(runtimeDir, "bus")
		if fi, err := os.Stat(p); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return "unix:path=" + p
		}
	}
	return "disabled:"
}
