package app

import (
	"flag"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"fyne.io/fyne/v2"
	fyneapp "fyne.io/fyne/v2/app"

	"github.com/kvasir-ai/kvasir/app/limits"
	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/wallet"
)

// AppID is the stable application ID (also in FyneApp.toml): it names the
// Preferences store and the desktop entry.
const AppID = "ai.kvasir.contributor"

// Refresh periods of the window.
const (
	statsEvery  = time.Second     // worker stats and the chart
	walletEvery = 5 * time.Second // wallet summary, slice and limits
)

// Window is a running contributor window: the UI, its backend and the
// loop that feeds it. Made by NewWindow; Loop runs until stop is closed.
type Window struct {
	UI   *UI
	Win  fyne.Window
	ctl  *status.Control
	gov  *limits.Governor
	tray *tray

	stopped atomic.Bool // the app has stopped: widgets must not be touched
}

// NewWindow builds the main window over be (a *node.Manager in the app, a
// fake in tests) with the settings form bound to a's Preferences. onSave
// is called after the owner saved valid settings (nil: none). withTray
// installs the tray icon and menu when the platform has one; closing the
// window then hides it to the tray.
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
	win := &Window{UI: u, Win: w, ctl: ctl, gov: gov}
	a.Lifecycle().SetOnStopped(func() { win.stopped.Store(true) })
	if withTray {
		win.tray = newTray(a, w, ctl)
	}
	if win.tray != nil {
		w.SetCloseIntercept(w.Hide)
		u.mu.Lock()
		u.onState = func(s status.Snapshot, sum wallet.Summary) { win.tray.update(s, sum, ctl.UserPaused()) }
		u.mu.Unlock()
	} else {
		w.SetMaster()
	}
	return win
}

// Loop polls the backend every second (the wallet, slice and limits every
// five) and applies the readings on the Fyne goroutine with fyne.Do, until
// stop is closed.
func (w *Window) Loop(stop <-chan struct{}) {
	t := time.NewTicker(statsEvery)
	defer t.Stop()
	for i := 0; ; i++ {
		full := i%int(walletEvery/statsEvery) == 0
		if full && w.gov != nil {
			w.ctl.SetLimit(w.gov.Check())
		}
		apply := w.UI.Poll(time.Now(), full)
		fyne.Do(func() {
			if !w.stopped.Load() { // after Quit, fyne.Do runs on this goroutine
				apply()
			}
		})
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// Main runs the desktop app: `kvasir [--gateway URL] [--slice DIR] [--ca
// FILE] [--data DIR] [--threads N]`; flags override the saved settings for
// this run (and are saved). It returns the exit code.
func Main(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvasir", flag.ContinueOnError)
	fs.SetOutput(stderr)
	gw := fs.String("gateway", "", "gateway URL, wss://HOST:PORT (default: saved setting)")
	slice := fs.String("slice", "", "expert slice folder (default: saved setting)")
	ca := fs.String("ca", "", "PEM file of root CAs for the gateway (default: saved setting)")
	threads := fs.Int("threads", -1, "compute threads (default: saved setting; 0 = all CPUs)")
	data := fs.String("data", "", "data folder for identity and wallet (default: user config dir/kvasir)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
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
	if err := s.Validate(); err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		return 2
	}
	s.Save(a.Preferences())

	mgr := &node.Manager{}
	start := func(s Settings) {
		err := mgr.Start(node.Config{GatewayURL: s.GatewayURL, CAFile: s.CAFile, SliceDir: s.SliceDir, DataDir: *data,
			Threads: s.Threads, QuotaBytes: s.QuotaBytes(), Warn: stderr})
		if err != nil {
			fyne.LogError("starting the worker", err)
		}
	}
	gov := limits.NewGovernor(s.Limits(), limits.SysProbe{})
	w := NewWindow(a, mgr, gov, func(s Settings) { go start(s) }, true)
	go start(s)
	stop := make(chan struct{})
	go w.Loop(stop)
	w.Win.ShowAndRun()
	close(stop)
	mgr.Stop()
	return 0
}
