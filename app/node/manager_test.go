package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/worker"
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

// TestManagerCPULimitLive: the CPU limit of Config reaches the worker and
// shows in Stats; SetCPULimit changes it on the running node (the same
// node: no restart, no new session) and refuses a limit outside 1-100.
func TestManagerCPULimitLive(t *testing.T) {
	data := t.TempDir()
	cfg := Config{GatewayURL: "wss://127.0.0.1:9", SliceDir: "unused", DataDir: data, Threads: 1, CPULimit: 50,
		KeyStore: wallet.FileStore{Dir: data}, StoreName: "file",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		LoadSlice: func(string, int) (*Slice, error) {
			return &Slice{Computer: zeroComputer{}, ModelID: "m", Backend: "cpu"}, nil
		}}
	m := &Manager{}
	if err := m.Start(cfg); err != nil {
		t.Fatal(err)
	}
	defer m.Stop()
	n := m.Node()
	if got := m.Stats(); got.CPULimit != 50 || got.CPULimitLine() != "limited to 50% CPU" {
		t.Fatalf("CPULimit %d (%q), want 50", got.CPULimit, got.CPULimitLine())
	}
	if err := m.SetCPULimit(25); err != nil || m.Stats().CPULimit != 25 || m.Node() != n {
		t.Fatalf("SetCPULimit(25): %v, limit %d, same node %v", err, m.Stats().CPULimit, m.Node() == n)
	}
	if err := m.SetCPULimit(101); !errors.Is(err, worker.ErrCPULimit) || m.Stats().CPULimit != 25 {
		t.Fatalf("SetCPULimit(101): %v, limit %d", err, m.Stats().CPULimit)
	}
	if err := m.SetCPULimit(100); err != nil || m.Stats().CPULimit != 0 || m.Stats().CPULimitLine() != "" {
		t.Fatalf("SetCPULimit(100): %v, limit %d", err, m.Stats().CPULimit)
	}
	cfg.CPULimit = 150
	if _, err := Open(cfg); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "CPU limit") {
		t.Fatalf("Open with CPULimit 150: %v", err)
	}
}
