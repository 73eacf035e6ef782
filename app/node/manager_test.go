package node

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/wallet"
)

// zeroComputer is an expert.Computer that writes zeros.
type zeroComputer struct{}

func (zeroComputer) ComputeExperts(_ context.Context, _ int, _ []float32, _ []int32, _, _ int, out []float32) error {
	clear(out)
	return nil
}

// TestManagerOverlappingStarts starts a second node while the first is
// still loading its slice: once both Starts returned exactly one slice is
// open (the first node was stopped and closed, not left running), and Stop
// closes it.
func TestManagerOverlappingStarts(t *testing.T) {
	var open, loads atomic.Int32
	gate := make(chan struct{})
	data := t.TempDir()
	cfg := Config{GatewayURL: "wss://127.0.0.1:9", SliceDir: "unused", DataDir: data, Threads: 1,
		KeyStore: wallet.FileStore{Dir: data}, StoreName: "file",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		LoadSlice: func(string, int) (*Slice, error) {
			loads.Add(1)
			<-gate
			open.Add(1)
			return &Slice{Computer: zeroComputer{}, ModelID: "m", Backend: "cpu",
				Close: func() error { open.Add(-1); return nil }}, nil
		}}
	m := &Manager{}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = m.Start(cfg) }()
	for loads.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	go func() { defer wg.Done(); _ = m.Start(cfg) }()
	time.Sleep(100 * time.Millisecond) // let the second Start reach its lock (or, unserialized, the loader)
	close(gate)
	wg.Wait()
	if got := open.Load(); got != 1 || loads.Load() != 2 {
		t.Errorf("after two overlapping Starts: %d slices open, %d loads; want 1 open of 2 loads", got, loads.Load())
	}
	m.Stop()
	if got := open.Load(); got != 0 {
		t.Errorf("after Stop: %d slices open, want 0", got)
	}
}
