package dispatch

import (
	"bufio"
	"net"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// TestDispatchBeforeChunk: with a CHUNK (low priority) and a DISPATCH (high
// priority) both waiting for the link, the DISPATCH is written first, and
// the CHUNK right after it.
func TestDispatchBeforeChunk(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	c := &conn{link: a, bw: bufio.NewWriterSize(a, 64<<10)}
	chunk := (&wire.Chunk{Layer: 1, Expert: 2, Data: make([]byte, 100)}).Append(nil)
	disp := (&wire.Ping{Time: 7}).Append(nil) // any high-priority message
	c.wmu.Lock()                              // a write in progress
	lowDone := make(chan error, 1)
	go func() { lowDone <- c.sendLow(chunk) }()
	time.Sleep(20 * time.Millisecond) // the CHUNK is waiting first
	highDone := make(chan error, 1)
	go func() { highDone <- c.sendData(disp, time.Second) }()
	for c.urgent.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	c.wmu.Unlock()
	r := bufio.NewReader(b)
	var got []wire.Type
	for i := 0; i < 2; i++ {
		kind, p, err := wire.ReadLink(r)
		if err != nil || kind != wire.LinkData {
			t.Fatalf("read %d: kind %d err %v", i, kind, err)
		}
		typ, _ := wire.Peek(p)
		got = append(got, typ)
	}
	if err := <-highDone; err != nil {
		t.Fatal(err)
	}
	if err := <-lowDone; err != nil {
		t.Fatal(err)
	}
	if got[0] != wire.TypePing || got[1] != wire.TypeChunk {
		t.Fatalf("order %v, want [PING CHUNK]", got)
	}
}
