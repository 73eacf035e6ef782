package workerrole

import (
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
)

// lastInt returns the value of the last "name=N" in text, or -1.
func lastInt(text, name string) int {
	m := regexp.MustCompile(name+`=([0-9]+)`).FindAllStringSubmatch(text, -1)
	if len(m) == 0 {
		return -1
	}
	v, _ := strconv.Atoi(m[len(m)-1][1])
	return v
}

// TestQuotaWorkerVulkan runs `backbone worker --quota 64MB --backend
// vulkan:0` (Run) against a loopback swarm with a real hub and TLS
// gateway (swarmtest): the worker starts from an empty folder, downloads
// the experts the backbone assigns, hands them to the device as they
// arrive, declares "vulkan:<device>" in its HELLO (so the backbone checks
// its results within its tolerance: checked, none mismatched), and its
// status line counts rows computed on the device.
func TestQuotaWorkerVulkan(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a loopback swarm")
	}
	devs, err := vulkan.Devices()
	if err != nil || len(devs) == 0 {
		t.Skipf("no Vulkan device (%v): install mesa-vulkan-drivers for lavapipe", err)
	}
	sw, err := swarmtest.Start(t.TempDir(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	dir := t.TempDir()
	log := &swarmtest.SyncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Gateway: sw.URL, CAFile: sw.CAFile, KeyFile: filepath.Join(dir, "worker.key"),
			Slice: filepath.Join(dir, "slice"), Quota: 64 << 20, Threads: 1, Backend: "vulkan:0", Log: log,
			StatusEvery: 100 * time.Millisecond})
	}()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	worker := func() (dispatch.WorkerStats, bool) {
		for _, w := range sw.Disp.Stats().Workers {
			if w.Connected {
				return w, true
			}
		}
		return dispatch.WorkerStats{}, false
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		if w, ok := worker(); ok && w.Holdings > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no experts downloaded; log:\n%s", log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sw.Load(4, 20*time.Millisecond)
	for lastInt(log.String(), "device_pairs") <= 0 || sw.Disp.Stats().Checks == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no rows computed on the device, or none checked (checks %d); log:\n%s", sw.Disp.Stats().Checks, log)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sw.StopLoad()
	w, _ := worker()
	want := vulkan.BackendName(devs[0])
	st := sw.Disp.Stats()
	if w.Backend != want || st.Checks == 0 || st.Mismatches != 0 || st.Caught != 0 {
		t.Fatalf("backend %q (want %q), checks %d, mismatches %d, caught %d; log:\n%s", w.Backend, want, st.Checks,
			st.Mismatches, st.Caught, log)
	}
	if !strings.Contains(log.String(), "backend "+want) {
		t.Errorf("the start line does not name the backend; log:\n%s", log)
	}
	t.Logf("HELLO backend %q, %d experts held, %d results checked within the tolerance; last status: device_pairs=%d cpu_pairs=%d",
		w.Backend, w.Holdings, st.Checks, lastInt(log.String(), "device_pairs"), lastInt(log.String(), "cpu_pairs"))
}
