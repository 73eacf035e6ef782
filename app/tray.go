package app

import (
	"context"
	"fmt"
	"net"
	"os"
	"runtime"
	"strings"
	"time"

	"fyne.io/fyne/v2"
	"fyne.io/fyne/v2/driver/desktop"
	"github.com/godbus/dbus/v5"

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

// The StatusNotifierItem protocol's watcher on the session bus (KDE, the
// GNOME AppIndicator extension, XFCE, Cinnamon, waybar...): fyne.io/systray
// registers its item there, and a panel that shows tray icons registers
// itself there as a host.
const (
	sniWatcher     = "org.kde.StatusNotifierWatcher"
	sniWatcherPath = "/StatusNotifierWatcher"
)

// busConn is a private connection to a D-Bus bus whose calls time out.
type busConn struct {
	*dbus.Conn
	timeout time.Duration
}

// connectBus opens a private connection to the D-Bus bus at addr (the
// caller has checked that it accepts connections: SessionBusReachable).
func connectBus(addr string, timeout time.Duration) (busConn, error) {
	c, err := dbus.Connect(addr)
	return busConn{c, timeout}, err
}

// call calls method on the object at path of dest and stores the reply in
// ret.
func (c busConn) call(dest string, path dbus.ObjectPath, method string, ret any, args ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	return c.Object(dest, path).CallWithContext(ctx, method, 0, args...).Store(ret)
}

// property reads property name of interface iface at dest, path.
func (c busConn) property(dest string, path dbus.ObjectPath, iface, name string) (dbus.Variant, error) {
	var v dbus.Variant
	err := c.call(dest, path, "org.freedesktop.DBus.Properties.Get", &v, iface, name)
	return v, err
}

// TrayHost reports whether the session bus at addr has a tray: a
// StatusNotifierWatcher with a host (a panel that shows the icons)
// registered. A desktop with a session bus but no host (stock GNOME
// without the AppIndicator extension, MATE) has no visible tray, and an
// app that hid its window there would be lost. why says what is missing.
func TrayHost(addr string, timeout time.Duration) (ok bool, why string) {
	if !SessionBusReachable(addr, timeout) {
		return false, "no D-Bus session bus"
	}
	conn, err := connectBus(addr, timeout)
	if err != nil {
		return false, "the D-Bus session bus refused a connection: " + err.Error()
	}
	defer conn.Close()
	var has bool
	if err := conn.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus.NameHasOwner", &has, sniWatcher); err != nil || !has {
		return false, "no StatusNotifier watcher on the session bus (this desktop shows no tray icons)"
	}
	v, err := conn.property(sniWatcher, sniWatcherPath, sniWatcher, "IsStatusNotifierHostRegistered")
	if host, _ := v.Value().(bool); err != nil || !host {
		return false, "no StatusNotifier host: no panel shows tray icons"
	}
	return true, ""
}

// TrayRegistered reports whether the StatusNotifierWatcher on the bus at
// addr lists an item of process pid (the item fyne.io/systray registers
// for this app), asking the bus for the process of each item's owner.
func TrayRegistered(addr string, pid int, timeout time.Duration) (bool, error) {
	conn, err := connectBus(addr, timeout)
	if err != nil {
		return false, err
	}
	defer conn.Close()
	v, err := conn.property(sniWatcher, sniWatcherPath, sniWatcher, "RegisteredStatusNotifierItems")
	if err != nil {
		return false, err
	}
	items, _ := v.Value().([]string)
	for _, it := range items {
		// "busname/path", ":1.42" or "org.kde.StatusNotifierItem-PID-1"
		name, _, _ := strings.Cut(it, "/")
		var owner uint32
		if err := conn.call("org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus.GetConnectionUnixProcessID", &owner, name); err == nil && int(owner) == pid {
			return true, nil
		}
	}
	return false, nil
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
	bus     string // session bus address, "" where the tray needs none
}

// newTray installs the tray icon and menu: pending KVR, Show, Pause or
// Resume, Quit. It returns nil, and why, when a uses no desktop driver or,
// on Linux/BSD, when the session bus has no tray host (see TrayHost): the
// window then quits on close instead of hiding.
func newTray(a fyne.App, w fyne.Window, ctl *status.Control) (*tray, string) {
	desk, ok := a.(desktop.App)
	if !ok {
		return nil, "no desktop driver"
	}
	t := &tray{desk: desk, state: -1}
	if needsSessionBus() {
		t.bus = os.Getenv("DBUS_SESSION_BUS_ADDRESS")
		if ok, why := TrayHost(t.bus, time.Second); !ok {
			return nil, why
		}
	}
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
	return t, ""
}

// confirm waits up to timeout for the tray to list this process's item
// (Linux/BSD; elsewhere the platform's tray is always there) and reports
// whether it did.
func (t *tray) confirm(timeout time.Duration) (bool, string) {
	if t.bus == "" {
		return true, ""
	}
	deadline := time.Now().Add(timeout)
	var err error
	for {
		var ok bool
		if ok, err = TrayRegistered(t.bus, os.Getpid(), time.Second); ok {
			return true, ""
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(250 * time.Millisecond)
	}
	why := "the tray host did not list kvasir's icon"
	if err != nil {
		why = fmt.Sprintf("%s (%v)", why, err)
	}
	return false, why
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
