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

// TestAutoRule holds "auto" to its rule on made-up device lists: a
// discrete GPU before an integrated one before a virtual one, whatever
// their order; a software driver (lavapipe) never, even when it is the
// only device; no devices or no loader: the CPU with a reason. An
// explicit "vulkan:N" takes device N whatever its kind.
func TestAutoRule(t *testing.T) {
	lavapipe := Device{Index: 0, Name: "llvmpipe (LLVM 15.0.6, 256 bits)", Type: TypeCPU}
	igpu := Device{Index: 1, Name: "Intel(R) UHD Graphics 620", Type: TypeIntegrated}
	dgpu := Device{Index: 2, Name: "NVIDIA H200", Type: TypeDiscrete}
	vgpu := Device{Index: 3, Name: "Virtio-GPU Venus", Type: TypeVirtual}
	auto := Backend{Kind: "auto"}
	for _, c := range []struct {
		name string
		devs []Device
		derr error
		want string // device name; "" = the CPU
	}{
		{"lavapipe only", []Device{lavapipe}, nil, ""},
		{"lavapipe and an integrated GPU", []Device{lavapipe, igpu}, nil, igpu.Name},
		{"discrete after integrated", []Device{lavapipe, igpu, dgpu}, nil, dgpu.Name},
		{"virtual GPU", []Device{lavapipe, vgpu}, nil, vgpu.Name},
		{"integrated before virtual", []Device{vgpu, igpu}, nil, igpu.Name},
		{"no devices", nil, nil, ""},
		{"no loader", nil, ErrNoLoader, ""},
	} {
		dev, ok, reason, err := auto.resolve(c.devs, c.derr)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		got := ""
		if ok {
			got = dev.Name
		}
		if got != c.want || (!ok && reason == "") {
			t.Errorf("%s: auto took %q (reason %q), want %q", c.name, got, reason, c.want)
		}
	}
	if dev, ok, _, err := (Backend{Kind: "vulkan", Index: 0}).resolve([]Device{lavapipe, dgpu}, nil); !ok || err != nil || dev.Name != lavapipe.Name {
		t.Errorf("vulkan:0 = %v %v %v, want lavapipe", dev, ok, err)
	}
	if _, _, _, err := (Backend{Kind: "vulkan", Index: 2}).resolve([]Device{lavapipe}, nil); !errors.Is(err, ErrNoDevice) {
		t.Errorf("vulkan:2 of 1 device: %v, want ErrNoDevice", err)
	}
	if _, _, _, err := (Backend{Kind: "vulkan"}).resolve(nil, ErrNoLoader); !errors.Is(err, ErrNoLoader) {
		t.Errorf("vulkan without a loader: %v, want ErrNoLoader", err)
	}
}
