//go:build linux && cgo && !kvasir_novulkan

package vulkan

/*
#cgo linux LDFLAGS: -ldl
#include <stdlib.h>
#include "kv.h"
*/
import "C"

import (
	"context"
	"embed"
	"encoding/binary"
	"fmt"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

//go:generate sh gen.sh

//go:embed spv/*.spv
var spvFS embed.FS

// maxScratchBytes bounds one submission's scratch buffer; a larger call is
// cut into several submissions (well within every driver's
// maxStorageBufferRange of at least 128 MiB).
const maxScratchBytes = 96 << 20

// submitTimeout is how long a submission may run before the device is
// declared faulty.
const submitTimeout = 120 * time.Second

// blockBytes is the size of the device memory blocks expert buffers are
// placed in (one vkAllocateMemory per block, not per expert: drivers allow
// as few as 4096 allocations).
const blockBytes = 256 << 20

func cerr(buf *C.char) string { return C.GoString(buf) }

// Devices lists the Vulkan physical devices. Errors wrap ErrNoLoader (no
// loader library) or ErrNoDevice (instance creation or enumeration
// failed, e.g. no driver installed).
func Devices() ([]Device, error) {
	var errb [C.KV_ERRLEN]C.char
	if C.kv_load(&errb[0]) != 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoLoader, strings.TrimPrefix(cerr(&errb[0]), "no Vulkan loader: "))
	}
	var infos [64]C.kv_devinfo
	n := C.kv_devices(&infos[0], 64, &errb[0])
	if n < 0 {
		return nil, fmt.Errorf("%w: %s", ErrNoDevice, cerr(&errb[0]))
	}
	out := make([]Device, 0, int(n))
	for i := range int(n) {
		in := &infos[i]
		api := uint32(in.api)
		out = append(out, Device{Index: i, Name: C.GoString(&in.name[0]), Type: DeviceType(in._type),
			VendorID: uint32(in.vendor), DeviceID: uint32(in.device),
			APIVersion:  fmt.Sprintf("%d.%d.%d", api>>22&0x7f, api>>12&0x3ff, api&0xfff),
			MemoryBytes: uint64(in.local_bytes), SubgroupArithmetic: in.subgroup_arith != 0})
	}
	return out, nil
}

// Computer is an expert.Computer on one Vulkan device (see the package
// comment). It is safe for concurrent use; device work of concurrent calls
// is serialised, and Rebase waits for the calls in progress.
type Computer struct {
	dev   Device
	logf  func(string, ...any)
	quota uint64 // device memory bytes for expert weights
	// rw: ComputeExperts holds it for reading, Rebase for writing (local
	// and the resident set change only between calls).
	rw     sync.RWMutex
	local  *expert.Local // the CPU path and the experts held; nil: none
	mu     sync.Mutex    // guards everything below
	ctx    *C.kv_ctx
	layers []*gpuLayer // by layer number; nil: none resident
	fault  error       // set once the device failed: CPU only from then on
	stats  Stats
	cmds   []C.kv_cmd
	rowsA  []float32 // per input row activations rounded for gate (then up)
	rowsB  []float32
	sumsA  []float32 // their Q8_1 block sums s, when gate's activations are Q8_1
	sumsB  []float32
	// fault injection for tests: called before each submission.
	inject func() error
	// injectUpload (tests), if set, is called before each expert's
	// upload; an error it returns stands for kv_upload's.
	injectUpload func() error
	// rowKernels: the row-per-lane matvec kernels (64 rows per
	// workgroup) instead of the subgroup ones (8 rows per workgroup).
	rowKernels bool
}

var _ expert.Computer = (*Computer)(nil)

// gpuLayer is the device side of one layer.
type gpuLayer struct {
	l                   *expert.Layer
	buf                 []*C.kv_wbuf // by expert; nil: not resident
	sum                 [][32]byte   // by expert: the resident weights' identity (Rebase's sum)
	known               []bool       // by expert: sum is set
	gOff, uOff, dOff    uint32       // byte offsets of gate, up, down in an expert's buffer
	gRB, uRB, dRB       uint32       // row bytes
	gPipe, uPipe, dPipe int32
	gMode               uint32 // SwiGLU rounding mode for down's activation type
	sameAct             bool   // gate and up use the same activation type
	expertBytes         uint64
}

// swigluMode returns the rounding mode of shaders/swiglu.comp for down
// weights of type t.
func swigluMode(t quant.Type) uint32 {
	switch t.VecDotType() {
	case quant.F16:
		return 1
	case quant.BF16:
		return 2
	case quant.Q8_0:
		return 3
	case quant.Q8_K:
		return 4
	case quant.Q8_1:
		return 5
	}
	return 0
}

func align16(n int) int { return (n + 15) &^ 15 }

func align4(n int) int { return (n + 3) &^ 3 }

// New opens device opt.Device and uploads the weights of the experts that
// local holds (largest experts left out first when they exceed
// opt.MemoryBytes; experts of a type without a kernel are left out too);
// local computes whatever is not resident and every request after a device
// fault. Errors wrap ErrNoLoader, ErrNoDevice or ErrDevice; an upload that
// runs out of device memory is not an error (the remaining experts stay on
// the CPU; Stats and Logf say so).
func New(local *expert.Local, opt Options) (*Computer, error) {
	if local == nil {
		return nil, fmt.Errorf("vulkan: New needs an expert.Local")
	}
	c, err := Open(opt)
	if err != nil {
		return nil, err
	}
	if err := c.Rebase(local, nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Open opens device opt.Device (compiling the pipelines) with no experts:
// until Rebase gives it some, every call fails with
// expert.ErrUnknownLayer. Errors wrap ErrNoLoader, ErrNoDevice or
// ErrDevice.
func Open(opt Options) (*Computer, error) {
	devs, err := Devices()
	if err != nil {
		return nil, err
	}
	if opt.Device < 0 || opt.Device >= len(devs) {
		return nil, fmt.Errorf("%w: device %d asked for, %d found", ErrNoDevice, opt.Device, len(devs))
	}
	c := &Computer{dev: devs[opt.Device], logf: opt.Logf, inject: opt.InjectFault}
	if c.logf == nil {
		c.logf = func(string, ...any) {}
	}
	// Pipelines: one matvec per kernel type, then SwiGLU. CPU drivers
	// (lavapipe runs SIMD lanes of one core) get the row-per-lane kernels,
	// which read activations at addresses shared by all lanes; GPUs the
	// subgroup kernels, whose lanes read consecutive blocks of one row.
	kind := opt.kernel
	if kind == kernelAuto {
		kind = kernelSubgroup
		if c.dev.Type == TypeCPU || !c.dev.SubgroupArithmetic {
			kind = kernelRow
		}
	}
	if kind == kernelSubgroup && !c.dev.SubgroupArithmetic {
		return nil, fmt.Errorf("%w: %s has no subgroup arithmetic", ErrDevice, c.dev.Name)
	}
	c.rowKernels = kind == kernelRow
	prefix := "spv/matvec_"
	if c.rowKernels {
		prefix = "spv/matvec_row_"
	}
	names := make([]string, 0, len(kernelTypes)+1)
	for _, t := range kernelTypes {
		names = append(names, prefix+t.String()+".spv")
	}
	names = append(names, "spv/swiglu.spv")
	ptrs := make([]unsafe.Pointer, len(names))
	lens := make([]C.size_t, len(names))
	for i, nm := range names {
		b, err := spvFS.ReadFile(nm)
		if err != nil {
			return nil, fmt.Errorf("vulkan: %v", err)
		}
		ptrs[i] = C.CBytes(b) // SPIR-V needs 4-byte alignment: C memory is aligned
		lens[i] = C.size_t(len(b))
	}
	defer func() {
		for _, p := range ptrs {
			C.free(p)
		}
	}()
	var errb [C.KV_ERRLEN]C.char
	cptrs := (*unsafe.Pointer)(C.malloc(C.size_t(len(ptrs)) * C.size_t(unsafe.Sizeof(unsafe.Pointer(nil)))))
	defer C.free(unsafe.Pointer(cptrs))
	copy(unsafe.Slice(cptrs, len(ptrs)), ptrs)
	clens := (*C.size_t)(C.malloc(C.size_t(len(lens)) * C.size_t(unsafe.Sizeof(C.size_t(0)))))
	defer C.free(unsafe.Pointer(clens))
	copy(unsafe.Slice(clens, len(lens)), lens)
	c.ctx = C.kv_open(C.int(opt.Device), C.int(len(names)), cptrs, clens, &errb[0])
	if c.ctx == nil {
		return nil, fmt.Errorf("%w: %s: %s", ErrDevice, c.dev.Name, cerr(&errb[0]))
	}
	runtime.SetFinalizer(c, func(c *Computer) { c.Close() })
	c.quota = opt.MemoryBytes
	if c.quota == 0 {
		c.quota = uint64(C.kv_device_bytes(c.ctx)) / 4 * 3
	}
	return c, nil
}

// Rebase makes local the Computer's experts and CPU path (nil: none held;
// calls then fail with expert.ErrUnknownLayer) and brings device memory in
// line with it: a resident expert stays when local still holds it and sum
// (nil: none) gives it the same identity as when it was uploaded (an
// expert's SHA-256, as engine/slice.Store keeps them); the other resident
// experts are released and their memory reused, and the held experts that
// are not resident are uploaded within the memory quota, the largest left
// to the CPU first (among experts of one size, those already resident
// stay). It waits for the calls in progress and blocks new ones until it
// returns. After a device fault it only swaps local in (every call is
// computed by the CPU path). An upload failure other than running out of
// device memory is a device fault: the error (wrapping ErrDevice) is
// returned and the Computer answers from local from then on.
func (c *Computer) Rebase(local *expert.Local, sum func(layer, e int) ([32]byte, bool)) error {
	c.rw.Lock()
	defer c.rw.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.local = local
	c.stats.ResidentExperts, c.stats.CPUExperts, c.stats.ResidentBytes = 0, 0, 0
	if c.fault != nil || c.ctx == nil {
		// The device may be busy or gone: buffers stay until Close.
		c.layers = nil
		c.stats.CPUExperts = heldExperts(local)
		return nil
	}
	err := c.plan(local, sum)
	if err != nil {
		c.setFault(err)
		c.layers = nil
		c.stats.ResidentExperts, c.stats.ResidentBytes = 0, 0
		c.stats.CPUExperts = heldExperts(local)
		c.logf("%v; computing on the CPU from now on", c.fault)
		return c.fault
	}
	return nil
}

// heldExperts counts the experts local holds (0 for nil).
func heldExperts(local *expert.Local) int {
	if local == nil {
		return 0
	}
	n := 0
	for li := range local.NumLayers() {
		if l := local.Layer(li); l != nil {
			for e := range l.NExpert {
				if l.Held(e) {
					n++
				}
			}
		}
	}
	return n
}

// sameShape reports whether layers a and b have the same weight types and
// sizes (so that a's device buffers fit b's experts).
func sameShape(a, b *expert.Layer) bool {
	return a.Gate.Type == b.Gate.Type && a.Up.Type == b.Up.Type && a.Down.Type == b.Down.Type &&
		a.DModel == b.DModel && a.DFF == b.DFF && a.NExpert == b.NExpert
}

// release frees expert e's buffer of g, if resident. c.mu is held and the
// device idle.
func (c *Computer) release(g *gpuLayer, e int) {
	if g.buf[e] != nil {
		C.kv_release(c.ctx, g.buf[e])
		g.buf[e] = nil
		g.known[e] = false
	}
}

// plan chooses which of local's experts are resident (within c.quota),
// releases the others and uploads what is missing. c.mu is held and the
// device idle (every submission has been waited for).
func (c *Computer) plan(local *expert.Local, sum func(layer, e int) ([32]byte, bool)) error {
	old := c.layers
	c.layers = nil
	if local != nil {
		c.layers = make([]*gpuLayer, local.NumLayers())
	}
	// Carry over the device buffers of layers whose shape is unchanged;
	// release the rest.
	for li, og := range old {
		if og == nil {
			continue
		}
		if li < len(c.layers) {
			if l := local.Layer(li); l != nil && sameShape(og.l, l) {
				continue // taken over below
			}
		}
		for e := range og.buf {
			c.release(og, e)
		}
		old[li] = nil
	}
	type cand struct {
		layer, e int
		bytes    uint64
		resident bool
	}
	var cands []cand
	for li := range c.layers {
		l := local.Layer(li)
		if l == nil {
			continue
		}
		g := &gpuLayer{l: l, buf: make([]*C.kv_wbuf, l.NExpert), sum: make([][32]byte, l.NExpert), known: make([]bool, l.NExpert)}
		if li < len(old) && old[li] != nil {
			og := old[li]
			copy(g.buf, og.buf)
			copy(g.sum, og.sum)
			copy(g.known, og.known)
		}
		var okG, okU, okD bool
		var gp, up, dp int
		gp, okG = kernelIndex(l.Gate.Type)
		up, okU = kernelIndex(l.Up.Type)
		dp, okD = kernelIndex(l.Down.Type)
		held := 0
		for e := range l.NExpert {
			if l.Held(e) {
				held++
			}
		}
		if !okG || !okU || !okD || l.DModel%32 != 0 || l.DFF%max(32, l.Down.Type.VecDotType().BlockSize()) != 0 ||
			l.DModel > 65535 || l.DFF > 65535 {
			c.logf("vulkan: layer %d (gate %v, up %v, down %v, d %d, dff %d) has no GPU kernel: its %d experts run on the CPU",
				li, l.Gate.Type, l.Up.Type, l.Down.Type, l.DModel, l.DFF, held)
			c.stats.CPUExperts += held
			for e := range g.buf {
				c.release(g, e)
			}
			continue
		}
		grb, _ := l.Gate.Type.RowBytes(l.DModel)
		urb, _ := l.Up.Type.RowBytes(l.DModel)
		drb, _ := l.Down.Type.RowBytes(l.DFF)
		g.gRB, g.uRB, g.dRB = uint32(grb), uint32(urb), uint32(drb)
		g.gOff = 0
		g.uOff = uint32(align16(grb * l.DFF))
		g.dOff = g.uOff + uint32(align16(urb*l.DFF))
		g.expertBytes = uint64(g.dOff) + uint64(align16(drb*l.DModel))
		g.gPipe, g.uPipe, g.dPipe = int32(gp), int32(up), int32(dp)
		g.gMode = swigluMode(l.Down.Type)
		g.sameAct = l.Gate.Type.VecDotType() == l.Up.Type.VecDotType()
		c.layers[li] = g
		for e := range l.NExpert {
			if !l.Held(e) {
				c.release(g, e) // no longer held
				continue
			}
			if g.buf[e] != nil {
				// Still the same weights? Only a known identity says so.
				id, ok := [32]byte{}, false
				if sum != nil {
					id, ok = sum(li, e)
				}
				if !ok || !g.known[e] || id != g.sum[e] {
					c.release(g, e)
				}
			}
			cands = append(cands, cand{li, e, g.expertBytes, g.buf[e] != nil})
		}
	}
	// Largest first out: keep the smallest experts that fit; among equal
	// sizes the resident ones, so that a new expert does not displace one
	// already uploaded.
	sort.SliceStable(cands, func(i, j int) bool {
		a, b := cands[i], cands[j]
		if a.bytes != b.bytes {
			return a.bytes < b.bytes
		}
		return a.resident && !b.resident
	})
	var total uint64
	keep := 0
	for keep < len(cands) && total+cands[keep].bytes <= c.quota {
		total += cands[keep].bytes
		keep++
	}
	if keep < len(cands) {
		c.logf("vulkan: %d of %d experts fit in %d bytes of device memory; the other %d run on the CPU",
			keep, len(cands), c.quota, len(cands)-keep)
		c.stats.CPUExperts += len(cands) - keep
		for _, k := range cands[keep:] {
			c.release(c.layers[k.layer], k.e)
		}
	}
	kept := cands[:keep]
	sort.Slice(kept, func(i, j int) bool {
		if kept[i].layer != kept[j].layer {
			return kept[i].layer < kept[j].layer
		}
		return kept[i].e < kept[j].e
	})
	var errb [C.KV_ERRLEN]C.char
	var left uint64
	for _, k := range kept {
		if !k.resident {
			left += k.bytes
		}
	}
	// noRoom leaves kept[i:]'s experts not yet uploaded to the CPU: the
	// device (or the host memory an upload stages through) ran out, which
	// is not a fault.
	noRoom := func(i int, msg string) {
		rest := 0
		for _, k := range kept[i:] {
			if !k.resident {
				rest++
			}
		}
		c.logf("vulkan: memory ran out (%s); %d experts run on the CPU", msg, rest)
		c.stats.CPUExperts += rest
		for _, k := range kept[i:] {
			if k.resident {
				c.stats.ResidentExperts++
				c.stats.ResidentBytes += k.bytes
			}
		}
	}
	for i, k := range kept {
		g := c.layers[k.layer]
		if k.resident {
			c.stats.ResidentExperts++
			c.stats.ResidentBytes += k.bytes
			continue
		}
		hint := min(uint64(blockBytes), left)
		b := C.kv_weights(c.ctx, C.uint64_t(k.bytes), C.uint64_t(hint), &errb[0])
		if b == nil {
			msg := cerr(&errb[0])
			if outOfMemory(msg) {
				noRoom(i, msg)
				break
			}
			return fmt.Errorf("%w: %s", ErrDevice, msg)
		}
		g.buf[k.e] = b
		var uerr string
		if c.injectUpload != nil {
			if err := c.injectUpload(); err != nil {
				uerr = err.Error()
			}
		}
		l := g.l
		for _, part := range []struct {
			off  uint32
			data []byte
		}{{g.gOff, l.Gate.Expert[k.e]}, {g.uOff, l.Up.Expert[k.e]}, {g.dOff, l.Down.Expert[k.e]}} {
			if uerr != "" {
				break
			}
			if C.kv_upload(c.ctx, b, C.uint64_t(part.off), unsafe.Pointer(unsafe.SliceData(part.data)), C.uint64_t(len(part.data)), &errb[0]) != 0 {
				uerr = cerr(&errb[0])
			}
		}
		if uerr != "" {
			c.release(g, k.e)
			if outOfMemory(uerr) {
				noRoom(i, "upload: "+uerr)
				break
			}
			return fmt.Errorf("%w: upload: %s", ErrDevice, uerr)
		}
		c.stats.UploadedBytes += k.bytes
		g.known[k.e] = false
		if sum != nil {
			g.sum[k.e], g.known[k.e] = sum(k.layer, k.e)
		}
		c.stats.ResidentExperts++
		c.stats.ResidentBytes += k.bytes
		left -= k.bytes
	}
	if C.kv_flush(c.ctx, &errb[0]) != 0 {
		return fmt.Errorf("%w: upload: %s", ErrDevice, cerr(&errb[0]))
	}
	return nil
}

// outOfMemory reports whether a Vulkan error message is an allocation
// that failed for want of device or host memory.
func outOfMemory(msg string) bool {
	return strings.Contains(msg, "OUT_OF_DEVICE_MEMORY") || strings.Contains(msg, "OUT_OF_HOST_MEMORY")
}

// blocks returns the number of device memory blocks holding weights
// (tests: released memory is reused).
func (c *Computer) blocks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil {
		return 0
	}
	return int(C.kv_blocks(c.ctx))
}

// copyBandwidth measures the device's memory bandwidth the way copy
// benchmarks do: iters copies of bytes between two device-local buffers
// in one submission (after a warm-up of two), timed on the host; it
// returns bytes read plus bytes written per second.
func (c *Computer) copyBandwidth(bytes uint64, iters int) (float64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil || c.fault != nil {
		return 0, fmt.Errorf("%w: no device", ErrDevice)
	}
	var errb [C.KV_ERRLEN]C.char
	if C.kv_copy_bench(c.ctx, C.uint64_t(bytes), 2, &errb[0]) != 0 {
		return 0, fmt.Errorf("%w: %s", ErrDevice, cerr(&errb[0]))
	}
	t0 := time.Now()
	if C.kv_copy_bench(c.ctx, C.uint64_t(bytes), C.int(iters), &errb[0]) != 0 {
		return 0, fmt.Errorf("%w: %s", ErrDevice, cerr(&errb[0]))
	}
	return 2 * float64(bytes) * float64(iters) / time.Since(t0).Seconds(), nil
}

// Device returns the device the Computer runs on.
func (c *Computer) Device() Device { return c.dev }

// Stats returns a snapshot of the counters.
func (c *Computer) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	if c.fault != nil {
		s.Fault = c.fault.Error()
	}
	return s
}

// Close releases the device and its memory; the Computer must not be used
// afterwards. Close is idempotent.
func (c *Computer) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx != nil {
		C.kv_close(c.ctx)
		c.ctx = nil
	}
	if c.fault == nil {
		c.fault = fmt.Errorf("vulkan: closed")
	}
	return nil
}

// ComputeExperts implements expert.Computer: the pairs whose expert is
// resident run on the device, the others (and all of them after a device
// fault) on the CPU path, concurrently; same shapes and errors as
// expert.Local.
func (c *Computer) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	c.rw.RLock()
	defer c.rw.RUnlock()
	local := c.local
	if local == nil {
		return fmt.Errorf("%w: %d (no experts held)", expert.ErrUnknownLayer, layer)
	}
	l := local.Layer(layer)
	if l == nil || n <= 0 || k <= 0 || len(hidden) != n*l.DModel || len(ids) != n*k || len(out) != n*k*l.DModel {
		return local.ComputeExperts(ctx, layer, hidden, ids, n, k, out)
	}
	for _, e := range ids {
		if e < 0 || int(e) >= l.NExpert || !l.Held(int(e)) {
			return local.ComputeExperts(ctx, layer, hidden, ids, n, k, out) // its error
		}
	}
	var g *gpuLayer
	c.mu.Lock()
	if c.fault == nil && layer < len(c.layers) {
		g = c.layers[layer]
	}
	c.mu.Unlock()
	var gpu, cpu []int32 // pair indices
	for p, e := range ids {
		if g != nil && g.buf[e] != nil {
			gpu = append(gpu, int32(p))
		} else {
			cpu = append(cpu, int32(p))
		}
	}
	if len(gpu) == 0 {
		c.count(0, len(cpu))
		return local.ComputeExperts(ctx, layer, hidden, ids, n, k, out)
	}
	// A submission cannot be recalled once made: a request already
	// cancelled (its caller gone, the worker's link closed) is not
	// submitted at all.
	if err := ctx.Err(); err != nil {
		return err
	}
	d := l.DModel
	var wg sync.WaitGroup
	var cpuErr error
	if len(cpu) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cpuErr = c.cpuPairs(ctx, layer, hidden, ids, k, d, cpu, out)
		}()
	}
	err := c.gpuPairs(layer, g, hidden, ids, k, gpu, out)
	if err != nil {
		// A device fault: answer from the CPU path.
		c.logf("%v; computing on the CPU from now on", err)
		err = c.cpuPairs(ctx, layer, hidden, ids, k, d, gpu, out)
		c.count(0, len(gpu))
	}
	wg.Wait()
	c.count(0, len(cpu))
	if err != nil {
		return err
	}
	if cpuErr != nil {
		return cpuErr
	}
	return ctx.Err()
}

func (c *Computer) count(gpu, cpu int) {
	c.mu.Lock()
	c.stats.GPUPairs += uint64(gpu)
	c.stats.CPUPairs += uint64(cpu)
	c.mu.Unlock()
}

// cpuPairs computes the given pairs with the CPU path (one row per pair,
// k = 1: expert.Local is batch-invariant, so each result is what the full
// call would give) and scatters them into out. c.rw is held for reading.
func (c *Computer) cpuPairs(ctx context.Context, layer int, hidden []float32, ids []int32, k, d int, pairs []int32, out []float32) error {
	m := len(pairs)
	h := make([]float32, m*d)
	id := make([]int32, m)
	o := make([]float32, m*d)
	for i, p := range pairs {
		r := int(p) / k
		copy(h[i*d:(i+1)*d], hidden[r*d:(r+1)*d])
		id[i] = ids[p]
	}
	if err := c.local.ComputeExperts(ctx, layer, h, id, m, 1, o); err != nil {
		return err
	}
	for i, p := range pairs {
		copy(out[int(p)*d:(int(p)+1)*d], o[i*d:(i+1)*d])
	}
	return nil
}

// roundRows sets dst (n x d) to the rows of hidden rounded to weight type
// t's activation type (quant.ConvertActivation, then quant.Dequantize of
// the converted bytes), and for Q8_1 sums (n x d/32) to the blocks' s
// fields (fp16(d*sum(q)), which ggml's Q4_1 and Q5_1 dot products use).
func roundRows(t quant.Type, hidden []float32, n, d int, dst, sums []float32) error {
	vt := t.VecDotType()
	if vt == quant.F32 {
		copy(dst, hidden)
		return nil
	}
	ab, err := quant.ActivationBytes(t, d)
	if err != nil {
		return err
	}
	buf := make([]byte, ab)
	for r := range n {
		if err := quant.ConvertActivation(t, hidden[r*d:(r+1)*d], buf); err != nil {
			return err
		}
		if err := quant.Dequantize(vt, buf, dst[r*d:(r+1)*d]); err != nil {
			return err
		}
		if vt == quant.Q8_1 {
			for b := range d / 32 {
				sums[r*(d/32)+b] = quant.FP16ToFP32(binary.LittleEndian.Uint16(buf[36*b+2:]))
			}
		}
	}
	return nil
}

// gpuPairs computes the given pairs on the device. An error is a device
// fault (the Computer is then CPU-only) and out's rows of pairs are
// unspecified.
func (c *Computer) gpuPairs(layer int, g *gpuLayer, hidden []float32, ids []int32, k int, pairs []int32, out []float32) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fault != nil {
		return c.fault
	}
	l := g.l
	d, dff := l.DModel, l.DFF
	n := len(hidden) / d
	c.rowsA = growF(c.rowsA, n*d)
	c.sumsA = growF(c.sumsA, n*d/32)
	if err := roundRows(l.Gate.Type, hidden, n, d, c.rowsA, c.sumsA); err != nil {
		return c.setFault(err)
	}
	c.rowsB, c.sumsB = c.rowsA, c.sumsA
	if !g.sameAct {
		c.rowsB = make([]float32, n*d)
		c.sumsB = make([]float32, n*d/32)
		if err := roundRows(l.Up.Type, hidden, n, d, c.rowsB, c.sumsB); err != nil {
			return c.setFault(err)
		}
	}
	// Pairs per submission: scratch holds xg, xu (np x d each), their
	// block sums (np x d/32 each), tg, tu, h (np x dff each), h's block
	// sums (np x dff/32) and y (np x d).
	per := 4 * (3*d + 3*dff + d/16 + dff/32)
	chunk := max(1, maxScratchBytes/per)
	for lo := 0; lo < len(pairs); lo += chunk {
		part := pairs[lo:min(len(pairs), lo+chunk)]
		if err := c.submit(g, ids, k, part, out); err != nil {
			return c.setFault(err)
		}
		c.stats.GPUPairs += uint64(len(part))
	}
	return nil
}

// Fault implements expert.Faulter: from now on every pair is computed on
// the CPU, as after a failed submission; err says why (in Stats().Fault).
// Later calls change nothing. It returns true.
func (c *Computer) Fault(err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.fault == nil {
		c.setFault(err)
		c.logf("%v; computing on the CPU from now on", c.fault)
	}
	return true
}

func (c *Computer) setFault(err error) error {
	if c.fault == nil {
		// One "vulkan: device error" prefix, the device's name after it.
		msg := strings.TrimPrefix(err.Error(), ErrDevice.Error()+": ")
		c.fault = fmt.Errorf("%w: %s: %s", ErrDevice, c.dev.Name, msg)
	}
	return c.fault
}

func growF(s []float32, n int) []float32 {
	if cap(s) < n {
		return make([]float32, n)
	}
	return s[:n]
}

// submit records and runs one command buffer for pairs (all resident in
// g) and writes their outputs to out. c.mu is held.
func (c *Computer) submit(g *gpuLayer, ids []int32, k int, pairs []int32, out []float32) error {
	l := g.l
	d, dff := l.DModel, l.DFF
	np := len(pairs)
	// Group pairs by expert (counting sort, stable).
	count := make([]int32, l.NExpert+1)
	for _, p := range pairs {
		count[ids[p]+1]++
	}
	for e := 1; e <= l.NExpert; e++ {
		count[e] += count[e-1]
	}
	start := append([]int32(nil), count...)
	order := make([]int32, np)
	for _, p := range pairs {
		e := ids[p]
		order[count[e]] = p
		count[e]++
	}
	// Scratch layout (float indices).
	xg := 0
	xu := xg
	if !g.sameAct {
		xu = xg + np*d
	}
	sg := xu + np*d // Q8_1 block sums of xg, xu and h
	su := sg
	if !g.sameAct {
		su = sg + np*d/32
	}
	sh := su + np*d/32
	tg := align4(sh + np*dff/32) // matvec.comp reads activations as vec4
	tu := tg + np*dff
	hh := tu + np*dff
	y := hh + np*dff
	total := y + np*d
	nb := d / 32 // activation blocks of 32 per input row
	var errb [C.KV_ERRLEN]C.char
	sp := C.kv_scratch(c.ctx, C.uint64_t(4*total), &errb[0])
	if sp == nil {
		return fmt.Errorf("scratch buffer: %s", cerr(&errb[0]))
	}
	s := unsafe.Slice((*float32)(unsafe.Pointer(sp)), total)
	for q, p := range order {
		r := int(p) / k
		copy(s[xg+q*d:xg+(q+1)*d], c.rowsA[r*d:(r+1)*d])
		copy(s[sg+q*nb:sg+(q+1)*nb], c.sumsA[r*nb:(r+1)*nb])
		if !g.sameAct {
			copy(s[xu+q*d:xu+(q+1)*d], c.rowsB[r*d:(r+1)*d])
			copy(s[su+q*nb:su+(q+1)*nb], c.sumsB[r*nb:(r+1)*nb])
		}
	}
	c.cmds = c.cmds[:0]
	add := func(pipe int32, barrier bool, w *C.kv_wbuf, push [8]uint32, gx, gy int) {
		var cmd C.kv_cmd
		cmd.pipeline = C.int32_t(pipe)
		if barrier {
			cmd.barrier = 1
		}
		cmd.weights = w
		for i, v := range push {
			cmd.push[i] = C.uint32_t(v)
		}
		cmd.gx, cmd.gy, cmd.gz = C.uint32_t(gx), C.uint32_t(gy), 1
		c.cmds = append(c.cmds, cmd)
	}
	const tb = 8 // activation rows per workgroup (TB in matvec.comp)
	rpw := 8     // weight rows per workgroup (RPW in matvec.comp)
	if c.rowKernels {
		rpw = 64 // local_size_x
	}
	for e := range l.NExpert {
		q0, q1 := int(start[e]), int(start[e+1])
		if q0 == q1 {
			continue
		}
		cnt := q1 - q0
		w := g.buf[e]
		add(g.gPipe, false, w, [8]uint32{g.gOff, uint32(dff), uint32(d), g.gRB, uint32(xg + q0*d), uint32(tg + q0*dff), uint32(cnt), uint32(sg + q0*nb)}, (dff+rpw-1)/rpw, (cnt+tb-1)/tb)
		add(g.uPipe, false, w, [8]uint32{g.uOff, uint32(dff), uint32(d), g.uRB, uint32(xu + q0*d), uint32(tu + q0*dff), uint32(cnt), uint32(su + q0*nb)}, (dff+rpw-1)/rpw, (cnt+tb-1)/tb)
	}
	swiglu := int32(len(kernelTypes))
	for lo, first := 0, true; lo < np*dff; lo, first = lo+65535*256, false {
		m := min(np*dff-lo, 65535*256)
		add(swiglu, first, nil, [8]uint32{uint32(tg + lo), uint32(tu + lo), uint32(hh + lo), uint32(m), g.gMode, uint32(sh + lo/32)}, (m+255)/256, 1)
	}
	first := true
	for e := range l.NExpert {
		q0, q1 := int(start[e]), int(start[e+1])
		if q0 == q1 {
			continue
		}
		cnt := q1 - q0
		add(g.dPipe, first, g.buf[e], [8]uint32{g.dOff, uint32(d), uint32(dff), g.dRB, uint32(hh + q0*dff), uint32(y + q0*d), uint32(cnt), uint32(sh + q0*dff/32)}, (d+rpw-1)/rpw, (cnt+tb-1)/tb)
		first = false
	}
	if c.inject != nil {
		if err := c.inject(); err != nil {
			return err
		}
	}
	cmds := (*C.kv_cmd)(C.malloc(C.size_t(len(c.cmds)) * C.size_t(unsafe.Sizeof(C.kv_cmd{}))))
	defer C.free(unsafe.Pointer(cmds))
	copy(unsafe.Slice(cmds, len(c.cmds)), c.cmds)
	if C.kv_run(c.ctx, cmds, C.int(len(c.cmds)), C.uint64_t(submitTimeout.Nanoseconds()), &errb[0]) != 0 {
		return fmt.Errorf("%s", cerr(&errb[0]))
	}
	c.stats.Submissions++
	for q, p := range order {
		copy(out[int(p)*d:(int(p)+1)*d], s[y+q*d:y+(q+1)*d])
	}
	return nil
}
