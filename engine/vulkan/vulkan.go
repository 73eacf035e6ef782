// Package vulkan computes a worker's MoE experts on a GPU through Vulkan
// compute: an expert.Computer whose expert weights live in device memory and
// whose gate, up, SwiGLU and down steps run as SPIR-V compute shaders, one
// queue submission per ComputeExperts call.
//
// # Build and loading
//
// The implementation is built on linux (and android) with cgo unless the
// kvasir_novulkan tag is set; it needs the Vulkan headers (Debian:
// libvulkan-dev) at build time but links no Vulkan library: the system
// loader libvulkan.so.1 (or the file KVASIR_VULKAN_LIBRARY names) is opened
// with dlopen when a device is first asked for, so a machine without a
// loader or a GPU runs the same binary and gets ErrNoLoader or ErrNoDevice,
// and the worker computes on the CPU. Other builds (CGO_ENABLED=0, windows,
// darwin, ios, the nogui headless binary without cgo) get ErrNotBuilt.
//
// # Numerics
//
// The GPU dequantises each weight block exactly as ggml's dequantize_row_*
// (ggml/src/ggml-quants.c; engine/quant/dequant.go mirrors it) and multiplies
// it with float32 activations that are already rounded to the weight type's
// ggml vec_dot_type (Q8_0, Q8_1, Q8_K, F16, BF16 or F32), as
// engine/quant.ConvertActivation rounds them for the CPU: the input rows
// on the host with engine/quant itself, the SwiGLU output on the GPU
// (shaders/swiglu.comp). Each product therefore equals ggml-cpu's integer
// block dot product up to float32 summation order, and results agree with
// expert.Local within a tolerance, not bit for bit: about 1e-7 relative per
// output row, except in the rare row where a SwiGLU output lies within a
// float32 rounding of a Q8 rounding boundary and lands on the neighbouring
// code (one code step: up to a few 1e-3 relative in small layers). The tests
// hold every row to relative L2 error <= 1/512 and cosine >= 0.9999 except
// such flips (at most 2 % of rows, each within 1/128). A worker on this
// backend declares a "vulkan:<device>" backend in its HELLO, so the
// backbone checks its results within --check-tolerance (default 1/128).
//
// # Kernels
//
// shaders/matvec.comp is compiled per weight type in two variants: one
// subgroup per weight row, whose lanes take consecutive blocks and sum with
// subgroupAdd (GPUs with Vulkan 1.1 subgroup arithmetic), and one lane per
// weight row (CPU drivers such as lavapipe, whose SIMD lanes then share
// every activation load, and devices without subgroup arithmetic). Each
// call records, in one command buffer: gate and up of every used expert,
// a barrier, shaders/swiglu.comp over all pairs, a barrier, down of every
// used expert; rows are grouped by expert as expert.Local groups them.
// gen.sh (go generate) compiles the SPIR-V in spv/ with glslc.
//
// # Memory and faults
//
// New uploads the held experts' weights once, within Options.MemoryBytes of
// device memory; the experts that do not fit (the largest are left out
// first) are computed by the CPU path (expert.Local) in the same call, in
// parallel with the GPU. A device fault (lost device, a submission that
// fails or times out) turns the Computer to the CPU path for good: every
// request is still answered from expert.Local, never with a wrong result.
package vulkan

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Errors of this package; returned errors wrap them.
var (
	// ErrNotBuilt: this binary was built without the Vulkan backend (no cgo,
	// not linux, or the kvasir_novulkan tag).
	ErrNotBuilt = errors.New("vulkan: backend not built in (needs linux and cgo, without the kvasir_novulkan tag)")
	// ErrNoLoader: the Vulkan loader (libvulkan.so.1) could not be loaded.
	ErrNoLoader = errors.New("vulkan: no Vulkan loader")
	// ErrNoDevice: no (suitable) Vulkan device, or its index is out of range.
	ErrNoDevice = errors.New("vulkan: no Vulkan device")
	// ErrDevice: the device failed (creation, memory, submission, lost
	// device or timeout).
	ErrDevice = errors.New("vulkan: device error")
)

// DeviceType is a Vulkan physical device type (VkPhysicalDeviceType).
type DeviceType int

// Device types.
const (
	TypeOther      DeviceType = 0
	TypeIntegrated DeviceType = 1
	TypeDiscrete   DeviceType = 2
	TypeVirtual    DeviceType = 3
	TypeCPU        DeviceType = 4 // a software driver such as Mesa's lavapipe (llvmpipe)
)

// String returns "discrete", "integrated", "virtual", "cpu" or "other".
func (t DeviceType) String() string {
	switch t {
	case TypeIntegrated:
		return "integrated"
	case TypeDiscrete:
		return "discrete"
	case TypeVirtual:
		return "virtual"
	case TypeCPU:
		return "cpu"
	}
	return "other"
}

// GPU reports whether the type is real graphics hardware (discrete,
// integrated or virtual), the kind the "auto" backend picks.
func (t DeviceType) GPU() bool { return t == TypeIntegrated || t == TypeDiscrete || t == TypeVirtual }

// Device describes one Vulkan physical device.
type Device struct {
	Index       int        // position in vkEnumeratePhysicalDevices order (the N of --backend vulkan:N)
	Name        string     // deviceName, e.g. "llvmpipe (LLVM 15.0.6, 256 bits)"
	Type        DeviceType // discrete, integrated, cpu, ...
	VendorID    uint32
	DeviceID    uint32
	APIVersion  string // e.g. "1.3.238"
	MemoryBytes uint64 // size of the largest device-local memory heap
	// SubgroupArithmetic: the device has Vulkan 1.1 subgroup arithmetic in
	// compute shaders (the subgroup matvec kernels need it).
	SubgroupArithmetic bool
}

// String returns a one-line description: "0: NAME (discrete, 8.0 GiB, Vulkan 1.3.238)".
func (d Device) String() string {
	return fmt.Sprintf("%d: %s (%s, %.1f GiB, Vulkan %s)", d.Index, d.Name, d.Type, float64(d.MemoryBytes)/(1<<30), d.APIVersion)
}

// Options configure New.
type Options struct {
	// Device is the index of the device to use (Devices order).
	Device int
	// MemoryBytes bounds the device memory taken by expert weights; 0: 3/4
	// of the device's largest device-local heap.
	MemoryBytes uint64
	// Logf, if set, receives one line per notable event (experts left to
	// the CPU and why, device faults).
	Logf func(format string, args ...any)
	// InjectFault, if set, is called before each queue submission; an
	// error it returns is taken as a device fault (as a lost device
	// would be). For fault tests of the layers above (a worker answering
	// from the CPU path); nil in use.
	InjectFault func() error

	// kernel forces the matvec kernels (tests): kernelAuto picks the
	// row-per-lane kernels for CPU drivers and devices without subgroup
	// arithmetic, the subgroup kernels otherwise.
	kernel kernelKind
}

// kernelKind is a matvec kernel variant (shaders/matvec.comp).
type kernelKind int

const (
	kernelAuto     kernelKind = iota
	kernelSubgroup            // spv/matvec_<T>.spv: a subgroup per row, subgroupAdd
	kernelRow                 // spv/matvec_row_<T>.spv: a lane per row
)

// Supported reports whether weights of type t have a GPU kernel (the
// others are computed per expert by the CPU path).
func Supported(t quant.Type) bool {
	_, ok := kernelIndex(t)
	return ok
}

// kernelTypes lists the weight types with a matvec kernel, in pipeline
// order (spv/matvec_<TYPE>.spv); the SwiGLU kernel comes after them.
var kernelTypes = []quant.Type{quant.F32, quant.F16, quant.BF16, quant.Q8_0, quant.Q4_0, quant.Q4_1,
	quant.Q5_0, quant.Q5_1, quant.Q4_K, quant.Q5_K, quant.Q6_K}

func kernelIndex(t quant.Type) (int, bool) {
	for i, k := range kernelTypes {
		if k == t {
			return i, true
		}
	}
	return 0, false
}

// Backend is a parsed --backend value: "auto", "cpu", "vulkan" (device 0)
// or "vulkan:N".
type Backend struct {
	Kind  string // "auto", "cpu" or "vulkan"
	Index int    // the device for "vulkan"
}

// ParseBackend parses a --backend value ("" means "auto").
func ParseBackend(s string) (Backend, error) {
	switch s = strings.TrimSpace(strings.ToLower(s)); {
	case s == "" || s == "auto":
		return Backend{Kind: "auto"}, nil
	case s == "cpu":
		return Backend{Kind: "cpu"}, nil
	case s == "vulkan":
		return Backend{Kind: "vulkan"}, nil
	case strings.HasPrefix(s, "vulkan:"):
		i, err := strconv.Atoi(strings.TrimPrefix(s, "vulkan:"))
		if err != nil || i < 0 {
			return Backend{}, fmt.Errorf("bad backend %q: want auto, cpu, vulkan or vulkan:N", s)
		}
		return Backend{Kind: "vulkan", Index: i}, nil
	}
	return Backend{}, fmt.Errorf("bad backend %q: want auto, cpu, vulkan or vulkan:N", s)
}

// String returns the canonical form ("auto", "cpu", "vulkan:N").
func (b Backend) String() string {
	if b.Kind == "vulkan" {
		return fmt.Sprintf("vulkan:%d", b.Index)
	}
	return b.Kind
}

// Resolve chooses the device for b: for "vulkan" the device b.Index, for
// "auto" the first discrete GPU, else the first integrated or virtual one
// (a software driver such as lavapipe only when asked for explicitly), for
// "cpu" none. ok is false when the CPU is to be used; reason then says
// why (for a log line). An explicit "vulkan" that cannot be had is an error
// (wrapping ErrNotBuilt, ErrNoLoader or ErrNoDevice).
func (b Backend) Resolve() (dev Device, ok bool, reason string, err error) {
	if b.Kind == "cpu" {
		return Device{}, false, "backend cpu", nil
	}
	devs, derr := Devices()
	return b.resolve(devs, derr)
}

// resolve is Resolve over the device list devs (or the error derr that
// listing them gave).
func (b Backend) resolve(devs []Device, derr error) (dev Device, ok bool, reason string, err error) {
	if b.Kind == "cpu" {
		return Device{}, false, "backend cpu", nil
	}
	if b.Kind == "vulkan" {
		if derr != nil {
			return Device{}, false, "", derr
		}
		if b.Index >= len(devs) {
			return Device{}, false, "", fmt.Errorf("%w: device %d asked for, %d found", ErrNoDevice, b.Index, len(devs))
		}
		return devs[b.Index], true, "", nil
	}
	if derr != nil {
		return Device{}, false, derr.Error(), nil
	}
	if d, ok := Pick(devs); ok {
		return d, true, "", nil
	}
	return Device{}, false, fmt.Sprintf("no GPU among %d Vulkan devices (software drivers need --backend vulkan:N)", len(devs)), nil
}

// Pick is the "auto" backend's rule: the first discrete GPU of devs, else
// the first integrated one, else the first virtual one; false when devs
// holds none (only software drivers such as lavapipe, or nothing).
func Pick(devs []Device) (Device, bool) {
	for _, want := range []DeviceType{TypeDiscrete, TypeIntegrated, TypeVirtual} {
		for _, d := range devs {
			if d.Type == want {
				return d, true
			}
		}
	}
	return Device{}, false
}

// BackendName returns the HELLO backend string of a worker computing on
// dev: "vulkan:" and the device name (never "cpu...", so the backbone
// checks the results within its tolerance).
func BackendName(dev Device) string { return "vulkan:" + dev.Name }

// Stats counts what a Computer did.
type Stats struct {
	ResidentExperts int    // experts whose weights are in device memory
	CPUExperts      int    // held experts left to the CPU path (no room, no kernel)
	ResidentBytes   uint64 // weight bytes in device memory
	UploadedBytes   uint64 // weight bytes copied to the device (cumulative: Rebase uploads only what is new)
	GPUPairs        uint64 // (row, slot) pairs computed on the device (cumulative)
	CPUPairs        uint64 // pairs computed by the CPU path (cumulative)
	Submissions     uint64 // queue submissions of ComputeExperts (cumulative)
	Fault           string // the device fault that turned the Computer to the CPU; "" if none
}

// OpenBackend applies a --backend value (ParseBackend) for a worker whose
// experts come later (engine/slice.Store hands them over with Rebase): it
// opens the chosen device with no experts (Open; memBytes:
// Options.MemoryBytes) and returns it with its HELLO backend name
// (BackendName). For "cpu", or "auto" without a usable GPU or on any
// Vulkan error, it returns nil and "" and says through logf why the CPU
// computes. An explicit "vulkan[:N]" that cannot be had is an error
// (wrapping ErrNotBuilt, ErrNoLoader, ErrNoDevice or ErrDevice); so is a
// malformed value. logf may be nil.
func OpenBackend(backend string, memBytes uint64, logf func(string, ...any)) (*Computer, string, error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	b, err := ParseBackend(backend)
	if err != nil {
		return nil, "", err
	}
	dev, ok, reason, err := b.Resolve()
	if err != nil {
		return nil, "", err
	}
	if !ok {
		logf("backend %s: computing on the CPU (%s)", b, reason)
		return nil, "", nil
	}
	c, err := Open(Options{Device: dev.Index, MemoryBytes: memBytes, Logf: logf})
	if err != nil {
		if b.Kind == "vulkan" {
			return nil, "", err
		}
		logf("backend auto: computing on the CPU (%v)", err)
		return nil, "", nil
	}
	logf("backend %s: %s", b, dev)
	return c, BackendName(dev), nil
}

// Wrap applies a --backend value to a worker's CPU Computer. For "cpu", or
// "auto" without a usable GPU, it returns local itself and name ""
// (the caller keeps its CPU backend name) and logs why through logf;
// otherwise a Vulkan Computer over local (memBytes: Options.MemoryBytes),
// its HELLO backend name (BackendName) and its Close. An explicit
// "vulkan[:N]" that cannot be had is an error; "auto" falls back to the
// CPU on any Vulkan error. logf may be nil.
func Wrap(backend string, local *expert.Local, memBytes uint64, logf func(string, ...any)) (comp expert.Computer, name string, closeFn func() error, err error) {
	if logf == nil {
		logf = func(string, ...any) {}
	}
	noop := func() error { return nil }
	c, name, err := OpenBackend(backend, memBytes, logf)
	if err != nil {
		return nil, "", nil, err
	}
	if c == nil {
		return local, "", noop, nil
	}
	if err := c.Rebase(local, nil); err != nil {
		c.Close()
		if b, _ := ParseBackend(backend); b.Kind == "vulkan" {
			return nil, "", nil, err
		}
		logf("backend auto: computing on the CPU (%v)", err)
		return local, "", noop, nil
	}
	st := c.Stats()
	logf("%d experts (%d MiB) on the device, %d on the CPU", st.ResidentExperts, st.ResidentBytes>>20, st.CPUExperts)
	return c, name, c.Close, nil
}

// Describe says in words where a worker computes, for people (the app's
// status): "CPU" for a nil Computer, else the device's name and
// "(Vulkan)", and after a device fault "CPU (the Vulkan device failed:
// ...)".
func Describe(c *Computer) string {
	if c == nil {
		return "CPU"
	}
	if f := c.Stats().Fault; f != "" {
		name := c.Device().Name
		f = strings.TrimPrefix(f, ErrDevice.Error()+": "+name+": ")
		return "CPU (the Vulkan device " + name + " failed: " + f + ")"
	}
	return c.Device().Name + " (Vulkan)"
}
