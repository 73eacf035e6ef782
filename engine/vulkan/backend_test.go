package vulkan

import (
	"errors"
	"testing"
)

func TestParseBackend(t *testing.T) {
	for _, c := range []struct {
		in, want string
		ok       bool
	}{{"", "auto", true}, {"auto", "auto", true}, {"CPU", "cpu", true}, {"vulkan", "vulkan:0", true},
		{"vulkan:2", "vulkan:2", true}, {"vulkan:-1", "", false}, {"vulkan:x", "", false}, {"cuda", "", false}} {
		b, err := ParseBackend(c.in)
		if (err == nil) != c.ok || (c.ok && b.String() != c.want) {
			t.Errorf("ParseBackend(%q) = %v, %v; want %q ok=%v", c.in, b, err, c.want, c.ok)
		}
	}
}

// TestResolve: "cpu" never asks for a device; "auto" takes a GPU only
// (on a machine whose only device is lavapipe it says why it uses the
// CPU); an explicit device out of range is an error.
func TestResolve(t *testing.T) {
	if _, ok, _, err := (Backend{Kind: "cpu"}).Resolve(); ok || err != nil {
		t.Fatalf("cpu: %v %v", ok, err)
	}
	devs, derr := Devices()
	dev, ok, reason, err := (Backend{Kind: "auto"}).Resolve()
	if err != nil {
		t.Fatalf("auto: %v", err)
	}
	if ok != (derr == nil && anyGPU(devs)) || (ok && !dev.Type.GPU()) || (!ok && reason == "") {
		t.Fatalf("auto: %v %v %q with devices %v (%v)", dev, ok, reason, devs, derr)
	}
	t.Logf("auto: ok %v %v %q", ok, dev, reason)
	_, _, _, err = (Backend{Kind: "vulkan", Index: 99}).Resolve()
	if !errors.Is(err, ErrNoDevice) && !errors.Is(err, ErrNotBuilt) && !errors.Is(err, ErrNoLoader) {
		t.Fatalf("vulkan:99: %v", err)
	}
}

func anyGPU(devs []Device) bool {
	for _, d := range devs {
		if d.Type.GPU() {
			return true
		}
	}
	return false
}
