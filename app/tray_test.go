package app

import (
	"net"
	"path/filepath"
	"testing"
	"time"
)

func TestSessionBusReachable(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "bus")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	host, port, _ := net.SplitHostPort(tcp.Addr().String())
	cases := []struct {
		addr string
		want bool
	}{
		{"", false},
		{"garbage", false},
		{"unix:path=" + sock, true},
		{"unix:path=" + sock + ",guid=0123", true},
		{"unix:path=/nonexistent/bus", false},
		{"unix:path=/nonexistent/bus;unix:path=" + sock, true}, // second address works
		{"tcp:host=" + host + ",port=" + port, true},
		{"tcp:host=" + host, false},
		{"launchd:env=X", false},
	}
	for _, c := range cases {
		if got := SessionBusReachable(c.addr, time.Second); got != c.want {
			t.Errorf("SessionBusReachable(%q) = %v, want %v", c.addr, got, c.want)
		}
	}
}

// Without DBUS_SESSION_BUS_ADDRESS the app names the runtime folder's bus
// socket, or "disabled:" when there is none (godbus would otherwise launch a
// session bus that outlives the app).
func TestSessionBusAddress(t *testing.T) {
	dir := t.TempDir()
	if got := sessionBusAddress(dir); got != "disabled:" {
		t.Fatalf("no socket: %q", got)
	}
	if got := sessionBusAddress(""); got != "disabled:" {
		t.Fatalf("no runtime folder: %q", got)
	}
	p := filepath.Join(dir, "bus")
	ln, err := net.Listen("unix", p)
	if err != nil {
		t.Skip(err)
	}
	defer ln.Close()
	if got := sessionBusAddress(dir); got != "unix:path="+p {
		t.Fatalf("with a socket: %q", got)
	}
}
