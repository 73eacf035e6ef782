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
