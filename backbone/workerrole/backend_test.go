package workerrole

import (
	"context"
	"io"
	"math"
	"runtime"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
)

// TestApplyBackend: --backend cpu keeps the CPU experts and the "cpu-GOARCH"
// name; --backend vulkan:0 (lavapipe on a machine without a GPU) puts them
// on the device, declares "vulkan:<device>" and computes what the CPU does
// within the tolerance; a bad value is an error.
func TestApplyBackend(t *testing.T) {
	sl, err := LoadTiny(nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	local := sl.Computer
	comp, name, closeDev, err := applyBackend("cpu", local, io.Discard)
	if err != nil || name != "cpu-"+runtime.GOARCH || comp != expert.Computer(local) {
		t.Fatalf("cpu: %q %v", name, err)
	}
	closeDev()
	if _, _, _, err := applyBackend("gpu", local, io.Discard); err == nil {
		t.Fatal("--backend gpu accepted")
	}
	if devs, err := vulkan.Devices(); err != nil || len(devs) == 0 {
		t.Skipf("no Vulkan device (%v)", err)
	}
	comp, name, closeDev, err = applyBackend("vulkan:0", local, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer closeDev()
	if !strings.HasPrefix(name, "vulkan:") || comp == expert.Computer(local) {
		t.Fatalf("vulkan:0: name %q, computer %T", name, comp)
	}
	l := local.Layer(0)
	d, k := l.DModel, 2
	hidden := make([]float32, 3*d)
	for i := range hidden {
		hidden[i] = float32(math.Sin(float64(i)))
	}
	ids := []int32{0, 1, 2, 3, 4, 5}
	want := make([]float32, 3*k*d)
	got := make([]float32, 3*k*d)
	if err := local.ComputeExperts(context.Background(), 0, hidden, ids, 3, k, want); err != nil {
		t.Fatal(err)
	}
	if err := comp.ComputeExperts(context.Background(), 0, hidden, ids, 3, k, got); err != nil {
		t.Fatal(err)
	}
	var diff, norm float64
	for i := range want {
		diff += float64(got[i]-want[i]) * float64(got[i]-want[i])
		norm += float64(want[i]) * float64(want[i])
	}
	if rel := math.Sqrt(diff / norm); !(rel < 1.0/512) {
		t.Fatalf("%s: relative error %.3g", name, rel)
	}
	t.Logf("%s: relative error vs CPU %.3g", name, math.Sqrt(diff/norm))
}
