package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
	"github.com/kvasir-ai/kvasir/wallet"
)

// TestNodeProvisionedVulkan: the app's default path (a provisioned node:
// an empty slice folder and a quota) with Backend "vulkan:0" computes the
// experts it downloads on that device (lavapipe here): the snapshot names
// the device, the device counts the pairs it computed, and the backbone
// sees "vulkan:<device>" in the HELLO and checks the results within its
// tolerance. A device that cannot be had is ErrBackend (and ErrConfig);
// Backend "cpu" reports the CPU.
func TestNodeProvisionedVulkan(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a loopback swarm")
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	open := func(url, ca, backend string) (*Node, error) {
		data := t.TempDir()
		return Open(Config{GatewayURL: url, CAFile: ca, SliceDir: filepath.Join(t.TempDir(), "slice"), QuotaBytes: 64 << 20,
			DataDir: data, Threads: 1, Backend: backend, KeyStore: wallet.FileStore{Dir: data}, StoreName: "file", Logger: quiet})
	}
	if _, err := open("wss://127.0.0.1:1", "", "vulkan:99"); !errors.Is(err, ErrBackend) || !errors.Is(err, ErrConfig) {
		t.Fatalf("vulkan:99: %v, want ErrBackend and ErrConfig", err)
	}
	n, err := open("wss://127.0.0.1:1", "", "cpu")
	if err != nil {
		t.Fatal(err)
	}
	if d := n.Stats().Device; d != "CPU" {
		t.Errorf("backend cpu: device %q", d)
	}
	if _, ok := n.DeviceStats(); ok {
		t.Errorf("backend cpu: device stats reported")
	}
	n.Close()

	devs, err := vulkan.Devices()
	if err != nil || len(devs) == 0 {
		t.Skipf("no Vulkan device (%v): install mesa-vulkan-drivers for lavapipe", err)
	}
	sw, err := swarmtest.Start(t.TempDir(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	n, err = open(sw.URL, sw.CAFile, "vulkan:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Run(ctx) }()
	defer func() { cancel(); <-done; n.Close() }()
	if want := devs[0].Name + " (Vulkan)"; n.Stats().Device != want {
		t.Fatalf("device %q, want %q", n.Stats().Device, want)
	}
	waitFor(t, "experts downloaded", 30*time.Second, func() bool { return n.Slice().Experts > 0 })
	sw.Load(4, 20*time.Millisecond)
	waitFor(t, "rows computed on the device and checked", 30*time.Second, func() bool {
		ds, _ := n.DeviceStats()
		return ds.GPUPairs > 0 && sw.Disp.Stats().Checks > 0
	})
	sw.StopLoad()
	ds, _ := n.DeviceStats()
	st := sw.Disp.Stats()
	backend := ""
	for _, w := range st.Workers {
		if w.Connected {
			backend = w.Backend
		}
	}
	if !strings.HasPrefix(backend, "vulkan:") || st.Mismatches != 0 || ds.Fault != "" {
		t.Fatalf("HELLO backend %q, mismatches %d, device %+v", backend, st.Mismatches, ds)
	}
	t.Logf("%s: HELLO backend %q; %d rows served, %d pairs on the device, %d checked", n.Stats().Device, backend,
		n.Stats().Rows, ds.GPUPairs, st.Checks)
}
