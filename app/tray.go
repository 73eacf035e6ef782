package app

import (
	"net"
	"os"
	"runtime"
	"strings"
	"time"

	"fyne.io/fyne/v2"
	"fyne.io/fyne/v2/driver/desktop"

	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/wallet"
)

// SessionBusReachable reports whether the D-Bus session bus named by addr
// (the DBUS_SESSION_BUS_ADDRESS syntax: "unix:path=/run/user/1000/bus",
// "unix:abstract=/tmp/dbus-x", "tcp:host=h,port=p"; several separated by
// ';') accepts a connection within timeout. Fyne's tray needs one on
// Linux: without a session bus, an app that set a tray menu panics on
// quit (fyne.io/systray), so the app sets no tray menu then.
func SessionBusReachable(addr string, timeout time.Duration) bool {
	for _, a := range strings.Split(addr, ";") {
		transport, params, ok := strings.Cut(a, ":")
		if !ok {
			continue
		}
		kv := map[string]string{}
		for _, p := range strings.Split(params, ",") {
			if k, v, ok := strings.Cut(p, "="); ok {
				kv[k] = v
			}
		}
		var network, target string
		switch {
		case transport == "unix" && kv["path"] != "":
			network, target = "unix", kv["path"]
		case transport == "unix" && kv["abstract"] != "":
			network, target = "unix", "@"+kv["abstract"]
		case transport == "tcp" && kv["host"] != "" && kv["port"] != "":
			network, target = "tcp", net.JoinHostPort(kv["host"], kv["port"])
		default:
			continue
		}
		c, err := net.DialTimeout(network, target, timeout)
		if err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// tray is the system tray icon and menu (desktop only).
type tray struct {
	desk    desktop.App
	menu    *fyne.Menu
	pending *fyne.MenuItem
	toggle  *fyne.MenuItem
	state   status.State
	label   string
	paused  bool
}

// newTray installs the tray icon and menu: pending KVR, Show, Pause or
// Resume, Quit. It returns nil when a uses no desktop driver or there is
// no session bus on Linux/BSD (see SessionBusReachable).
func newTray(a fyne.App, w fyne.Window, ctl *status.Control) *tray {
	desk, ok := a.(desktop.App)
	if !ok {
		return nil
	}
	if needsSessionBus() && !SessionBusReachable(os.Getenv("DBUS_SESSION_BUS_ADDRESS"), time.Second) {
		fyne.LogError("no D-Bus session bus: running without a tray icon", nil)
		return nil
	}
	t := &tray{desk: desk, state: -1}
	t.pending = fyne.NewMenuItem("Pending "+status.FormatKVR(0), nil)
	t.pending.Disabled = true
	t.toggle = fyne.NewMenuItem("Pause", func() {
		if ctl.UserPaused() {
			ctl.Resume()
		} else {
			ctl.Pause()
		}
	})
	show := fyne.NewMenuItem("Show", func() { w.Show(); w.RequestFocus() })
	quit := fyne.NewMenuItem("Quit", func() { a.Quit() })
	quit.IsQuit = true
	t.menu = fyne.NewMenu("kvasir", t.pending, fyne.NewMenuItemSeparator(), show, t.toggle, fyne.NewMenuItemSeparator(), quit)
	desk.SetSystemTrayIcon(stateIcons[status.Offline])
	desk.SetSystemTrayMenu(t.menu)
	return t
}

// update reflects the state in the icon and the menu labels; Fyne
// goroutine.
func (t *tray) update(s status.Snapshot, sum wallet.Summary, userPaused bool) {
	if s.State != t.state {
		t.state = s.State
		t.desk.SetSystemTrayIcon(stateIcons[s.State])
	}
	label := "Pending " + status.FormatKVR(sum.PendingNKVR)
	if label != t.label || userPaused != t.paused {
		t.label, t.paused = label, userPaused
		t.pending.Label = label
		t.toggle.Label = "Pause"
		if userPaused {
			t.toggle.Label = "Resume"
		}
		t.desk.SetSystemTrayMenu(t.menu)
	}
}

// needsSessionBus reports whether the tray goes through D-Bus
// (StatusNotifierItem) on this OS.
func needsSessionBus() bool {
	switch runtime.GOOS {
	case "linux", "freebsd", "openbsd", "netbsd", "dragonfly":
		return true
	}
	return false
}
