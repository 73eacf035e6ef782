package swarmtest

import (
	"io"
	"net"
	"testing"
	"time"
)

// testLink is what the tests need of a Link and a ProcLink.
type testLink interface {
	Addr() string
	Conns() int64
	RTTp50() time.Duration
	Close() error
}

// TestLinkDelaysAndRelays: bytes arrive intact and in order, each
// direction oneWay late (a round trip of at least 2 x oneWay), the holds
// the link records say so, and Close ends a relayed connection; for a
// Link in this process and one in a child process (ProcLink).
func TestLinkDelaysAndRelays(t *testing.T) {
	t.Run("in-process", func(t *testing.T) {
		testLinkDelaysAndRelays(t, func(target string, oneWay time.Duration) (testLink, error) { return NewLink(target, oneWay) })
	})
	t.Run("process", func(t *testing.T) {
		testLinkDelaysAndRelays(t, func(target string, oneWay time.Duration) (testLink, error) {
			return NewProcLink(target, oneWay)
		})
	})
}

func testLinkDelaysAndRelays(t *testing.T, newLink func(string, time.Duration) (testLink, error)) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = io.Copy(c, c) // echo
	}()
	const oneWay = 5 * time.Millisecond
	l, err := newLink(ln.Addr().String(), oneWay)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", l.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	msg := make([]byte, 300<<10) // more than one read's chunk
	for i := range msg {
		msg[i] = byte(i * 7)
	}
	got := make([]byte, len(msg))
	for range 3 {
		t0 := time.Now()
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadFull(c, got); err != nil {
			t.Fatal(err)
		}
		if rtt := time.Since(t0); rtt < 2*oneWay {
			t.Fatalf("round trip %v < 2 x %v", rtt, oneWay)
		}
		for i := range got {
			if got[i] != msg[i] {
				t.Fatalf("byte %d: %d, want %d", i, got[i], msg[i])
			}
		}
	}
	if l.Conns() != 1 {
		t.Fatalf("conns %d, want 1", l.Conns())
	}
	if h := l.RTTp50(); h < 2*oneWay {
		t.Fatalf("recorded round trip %v < 2 x %v", h, oneWay)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(got[:1]); err == nil {
		t.Fatal("read after Close: want the connection ended")
	}
}
