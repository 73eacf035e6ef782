//go:build linux && cgo && !kvasir_novulkan

package vulkan

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Tolerances per output row against expert.Local, which rounds the same
// activations but sums in another order: rows agree to about 1e-7
// relative, except where a SwiGLU output lies so close to a Q8 rounding
// boundary that the GPU's float rounding moves it to the neighbouring code
// (ggml's activation quantisation amplifies a last-bit difference into one
// code step: up to about 2.5e-3 relative in these small layers). Every row
// must be within maxRelL2 and minCosine except such rare flips, which must
// stay within the backbone's default tolerance (1/128) and be at most
// maxFlipRows of the rows (at least one).
const (
	maxRelL2    = 1.0 / 512
	minCosine   = 0.9999
	flipRelL2   = 1.0 / 128
	maxFlipRows = 0.02
)

// testDevice returns the index of the Vulkan device to test on, or skips:
// $KVASIR_VULKAN_DEVICE when set (scripts/gpu-check.sh sets it), else the
// GPU "auto" would take (Pick), else the first device (lavapipe on a
// machine without a GPU).
func testDevice(t testing.TB) int {
	t.Helper()
	devs, err := Devices()
	if err != nil {
		t.Skipf("no Vulkan: %v (install mesa-vulkan-drivers for lavapipe)", err)
	}
	if len(devs) == 0 {
		t.Skip("no Vulkan device (install mesa-vulkan-drivers for lavapipe)")
	}
	if v := os.Getenv("KVASIR_VULKAN_DEVICE"); v != "" {
		i, err := strconv.Atoi(v)
		if err != nil || i < 0 || i >= len(devs) {
			t.Fatalf("KVASIR_VULKAN_DEVICE=%q: want 0..%d", v, len(devs)-1)
		}
		return i
	}
	if d, ok := Pick(devs); ok {
		return d.Index
	}
	return devs[0].Index
}

// randLayer returns a layer of nExpert random experts with gate, up and
// down of the given types (weights N(0, 1/cols), quantised with
// quant.Quantize).
func randLayer(t testing.TB, rng *rand.Rand, nExpert, d, dff int, gt, ut, dt quant.Type) *expert.Layer {
	t.Helper()
	gen := func(typ quant.Type, rows, cols int) []byte {
		f := make([]float32, nExpert*rows*cols)
		sd := 1 / math.Sqrt(float64(cols))
		for i := range f {
			f[i] = float32(rng.NormFloat64() * sd)
		}
		rb, err := typ.RowBytes(cols)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, nExpert*rows*rb)
		if err := quant.Quantize(typ, f, b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	l, err := expert.StackedLayer(nExpert, d, dff, gt, gen(gt, dff, d), ut, gen(ut, dff, d), dt, gen(dt, d, dff))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// rowStats returns the relative L2 error and cosine of got against want.
func rowStats(got, want []float32) (rel, cos float64) {
	var dd, ww, gg, gw float64
	for i := range want {
		g, w := float64(got[i]), float64(want[i])
		dd += (g - w) * (g - w)
		ww += w * w
		gg += g * g
		gw += g * w
	}
	if ww == 0 {
		if gg == 0 {
			return 0, 1
		}
		return math.Inf(1), 0
	}
	return math.Sqrt(dd / ww), gw / math.Sqrt(gg*ww)
}

// compare runs both computers on hidden/ids and checks every output row,
// returning the worst relative L2 error and cosine.
func compare(t *testing.T, name string, gpu, cpu expert.Computer, layer, d int, hidden []float32, ids []int32, n, k int) (worstRel, worstCos float64) {
	t.Helper()
	want := make([]float32, n*k*d)
	got := make([]float32, n*k*d)
	if err := cpu.ComputeExperts(context.Background(), layer, hidden, ids, n, k, want); err != nil {
		t.Fatalf("%s: cpu: %v", name, err)
	}
	if err := gpu.ComputeExperts(context.Background(), layer, hidden, ids, n, k, got); err != nil {
		t.Fatalf("%s: gpu: %v", name, err)
	}
	worstCos = 1
	worstRow, flips := 0, 0
	for r := range n * k {
		rel, cos := rowStats(got[r*d:(r+1)*d], want[r*d:(r+1)*d])
		if rel > worstRel || math.IsNaN(rel) {
			worstRel, worstRow = rel, r
		}
		worstCos = min(worstCos, cos)
		if !(rel <= maxRelL2) {
			flips++
			t.Logf("%s: row %d (expert %d): rel L2 %.3g, cosine %.7f (an activation rounding flip?)", name, r, ids[r], rel, cos)
		}
	}
	t.Logf("%s: %d rows: worst rel L2 %.3g (row %d, expert %d), worst cosine %.7f", name, n*k, worstRel, worstRow, ids[worstRow], worstCos)
	// KVASIR_VULKAN_STRICT (scripts/gpu-check.sh --strict) allows no flip.
	allowed := max(1, maxFlipRows*float64(n*k))
	if os.Getenv("KVASIR_VULKAN_STRICT") != "" {
		allowed = 0
	}
	if !(worstRel <= flipRelL2) || !(worstCos >= minCosine) || float64(flips) > allowed {
		t.Errorf("%s: worst rel L2 %.3g (max %.3g; %d rows above %.3g), worst cosine %.7f (min %.5f)",
			name, worstRel, flipRelL2, flips, maxRelL2, worstCos, minCosine)
	}
	return worstRel, worstCos
}

func randInput(rng *rand.Rand, n, k, d, nExpert int) ([]float32, []int32) {
	hidden := make([]float32, n*d)
	for i := range hidden {
		hidden[i] = float32(rng.NormFloat64())
	}
	ids := make([]int32, n*k)
	for r := range n {
		perm := rng.Perm(nExpert)
		for s := range k {
			ids[r*k+s] = int32(perm[s])
		}
	}
	return hidden, ids
}

func newPair(t *testing.T, layers []*expert.Layer, opt Options) (*Computer, *expert.Local) {
	t.Helper()
	local, err := expert.NewLocal(layers, 2)
	if err != nil {
		t.Fatal(err)
	}
	opt.Logf = t.Logf
	c, err := New(local, opt)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, local
}

func TestDevicesList(t *testing.T) {
	devs, err := Devices()
	if err != nil {
		t.Skipf("no Vulkan: %v", err)
	}
	for _, d := range devs {
		t.Logf("%v", d)
		if d.Name == "" || d.MemoryBytes == 0 {
			t.Errorf("device %+v: empty name or memory", d)
		}
	}
}

// TestTypes checks every kernel type (gate, up and down of that type, and
// mixes as Q4_K_M files have them) against expert.Local, for single rows and
// batches that put more than one tile of rows on an expert.
func TestTypes(t *testing.T) {
	dev := testDevice(t)
	type cfg struct{ g, u, d quant.Type }
	var cfgs []cfg
	for _, ty := range kernelTypes {
		cfgs = append(cfgs, cfg{ty, ty, ty})
	}
	cfgs = append(cfgs, cfg{quant.Q4_K, quant.Q4_K, quant.Q6_K}, cfg{quant.Q5_K, quant.Q5_K, quant.Q6_K},
		cfg{quant.Q4_1, quant.Q5_K, quant.Q8_0}, cfg{quant.F16, quant.BF16, quant.Q5_1})
	const nExpert, d, dff = 6, 512, 512
	for i, c := range cfgs {
		for _, kern := range testKernels(t, dev) {
			name := fmt.Sprintf("%v-%v-%v/%s", c.g, c.u, c.d, kern.name)
			t.Run(name, func(t *testing.T) {
				rng := rand.New(rand.NewPCG(uint64(i), 7))
				l := randLayer(t, rng, nExpert, d, dff, c.g, c.u, c.d)
				gpu, cpu := newPair(t, []*expert.Layer{nil, l}, Options{Device: dev, kernel: kern.kind})
				if s := gpu.Stats(); s.ResidentExperts != nExpert {
					t.Fatalf("stats %+v: want %d resident experts", s, nExpert)
				}
				for _, nk := range [][2]int{{1, 2}, {5, 3}, {40, 4}} {
					hidden, ids := randInput(rng, nk[0], nk[1], d, nExpert)
					compare(t, fmt.Sprintf("%s n=%d k=%d", name, nk[0], nk[1]), gpu, cpu, 1, d, hidden, ids, nk[0], nk[1])
				}
				if s := gpu.Stats(); s.CPUPairs != 0 || s.GPUPairs == 0 || s.Fault != "" {
					t.Errorf("stats %+v: want all pairs on the GPU", s)
				}
			})
		}
	}
}

type testKernel struct {
	name string
	kind kernelKind
}

// testKernels returns the matvec kernel variants device dev can run: the
// row-per-lane kernels, and the subgroup ones where it has subgroup
// arithmetic (lavapipe has), so that both are checked on any driver.
func testKernels(t testing.TB, dev int) []testKernel {
	ks := []testKernel{{"row", kernelRow}}
	devs, _ := Devices()
	if dev < len(devs) && devs[dev].SubgroupArithmetic {
		ks = append(ks, testKernel{"subgroup", kernelSubgroup})
	} else {
		t.Logf("device %d has no subgroup arithmetic: the subgroup kernels are not tested", dev)
	}
	return ks
}

// fixtureDir is ../shared/fixtures seen from this package.
func fixtureDir(t testing.TB) string {
	t.Helper()
	for _, p := range []string{"../../../shared/fixtures", "../../shared/fixtures", os.Getenv("KVASIR_FIXTURES")} {
		if p == "" {
			continue
		}
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p
		}
	}
	t.Skip("fixtures (shared/fixtures) not found; set KVASIR_FIXTURES")
	return ""
}

// TestFixtures checks every layer of the llama.cpp-made qwen3moe and
// qwen35moe fixture models.
func TestFixtures(t *testing.T) {
	dev := testDevice(t)
	dir := fixtureDir(t)
	files := []string{"tiny-qwen3moe-F16.gguf", "tiny-qwen3moe-Q8_0.gguf", "tiny-qwen3moe-Q4_K_M.gguf",
		"qwen35moe/tiny-qwen35moe-F16.gguf", "qwen35moe/tiny-qwen35moe-Q4_K_M.gguf"}
	for _, name := range files {
		t.Run(filepath.Base(name), func(t *testing.T) {
			f, err := gguf.Open(filepath.Join(dir, name))
			if err != nil {
				t.Skipf("fixture: %v", err)
			}
			defer f.Close()
			var layers []*expert.Layer
			for blk := 0; ; blk++ {
				l, err := expert.FromGGUF(f, blk)
				if err != nil {
					if errors.Is(err, gguf.ErrNoTensor) {
						break
					}
					t.Fatal(err)
				}
				layers = append(layers, l)
			}
			if len(layers) == 0 {
				t.Fatal("no MoE layers")
			}
			for _, kern := range testKernels(t, dev) {
				gpu, cpu := newPair(t, layers, Options{Device: dev, kernel: kern.kind})
				st := gpu.Stats()
				t.Logf("%s kernels: %d layers; resident %d experts (%d bytes), CPU %d", kern.name, len(layers), st.ResidentExperts, st.ResidentBytes, st.CPUExperts)
				rng := rand.New(rand.NewPCG(3, 3))
				for li, l := range layers {
					hidden, ids := randInput(rng, 6, min(4, l.NExpert), l.DModel, l.NExpert)
					compare(t, fmt.Sprintf("%s: layer %d (%v/%v/%v)", kern.name, li, l.Gate.Type, l.Up.Type, l.Down.Type), gpu, cpu, li, l.DModel, hidden, ids, 6, min(4, l.NExpert))
				}
				gpu.Close()
			}
		})
	}
}

// TestQuota: with room for only some experts, the largest are left to the
// CPU, and mixed calls (some pairs on each side) are still right.
func TestQuota(t *testing.T) {
	dev := testDevice(t)
	rng := rand.New(rand.NewPCG(9, 9))
	const nExpert, d, dff = 4, 256, 256
	big := randLayer(t, rng, nExpert, d, dff, quant.F32, quant.F32, quant.F32)      // 768 KiB per expert
	small := randLayer(t, rng, nExpert, d, dff, quant.Q4_0, quant.Q4_0, quant.Q4_0) // 108 KiB per expert
	probe, _ := newPair(t, []*expert.Layer{big, small}, Options{Device: dev})
	bigB, smallB := probe.layers[0].expertBytes, probe.layers[1].expertBytes
	probe.Close()
	quota := 4*smallB + 2*bigB
	gpu, cpu := newPair(t, []*expert.Layer{big, small}, Options{Device: dev, MemoryBytes: quota})
	st := gpu.Stats()
	if st.ResidentExperts != 6 || st.CPUExperts != 2 || st.ResidentBytes > quota {
		t.Fatalf("stats %+v with quota %d: want 6 resident, 2 on the CPU", st, quota)
	}
	for e := range nExpert {
		if gpu.layers[1].buf[e] == nil {
			t.Errorf("small expert %d not resident", e)
		}
	}
	hidden, ids := randInput(rng, 8, 3, d, nExpert)
	compare(t, "big layer, mixed", gpu, cpu, 0, d, hidden, ids, 8, 3)
	compare(t, "small layer", gpu, cpu, 1, d, hidden, ids, 8, 3)
	st = gpu.Stats()
	if st.CPUPairs == 0 || st.GPUPairs == 0 {
		t.Errorf("stats %+v: want pairs on both sides", st)
	}
}

// sameAsCPU computes the n x k pairs with gpu and with cpu and fails t
// unless every output has the CPU's bits (gpu on its CPU path).
func sameAsCPU(t *testing.T, gpu, cpu expert.Computer, layer, d int, hidden []float32, ids []int32, n, k int) {
	t.Helper()
	want := make([]float32, n*k*d)
	got := make([]float32, n*k*d)
	if err := cpu.ComputeExperts(context.Background(), layer, hidden, ids, n, k, want); err != nil {
		t.Fatal(err)
	}
	if err := gpu.ComputeExperts(context.Background(), layer, hidden, ids, n, k, got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("element %d: %v, want the CPU's %v", i, got[i], want[i])
		}
	}
}

// TestFault: a failed submission turns the Computer to the CPU path, whose
// results are expert.Local's bits, for that call and all later ones.
func TestFault(t *testing.T) {
	dev := testDevice(t)
	rng := rand.New(rand.NewPCG(5, 5))
	const nExpert, d, dff = 4, 256, 256
	l := randLayer(t, rng, nExpert, d, dff, quant.Q8_0, quant.Q8_0, quant.Q8_0)
	gpu, cpu := newPair(t, []*expert.Layer{l}, Options{Device: dev})
	gpu.inject = func() error { return errors.New("VK_ERROR_DEVICE_LOST (injected)") }
	for range 2 {
		hidden, ids := randInput(rng, 3, 2, d, nExpert)
		sameAsCPU(t, gpu, cpu, 0, d, hidden, ids, 3, 2)
	}
	st := gpu.Stats()
	if !strings.Contains(st.Fault, "DEVICE_LOST") {
		t.Errorf("stats %+v: want the fault recorded", st)
	}
	// Errors of the CPU path come through.
	err := gpu.ComputeExperts(context.Background(), 0, make([]float32, d), []int32{9}, 1, 1, make([]float32, d))
	if !errors.Is(err, expert.ErrUnknownExpert) {
		t.Errorf("unknown expert: %v", err)
	}
}

// TestCancelled: a request whose context is already done is not
// submitted to the device: it returns the context's error and counts no
// pairs; the next request computes as before.
func TestCancelled(t *testing.T) {
	dev := testDevice(t)
	rng := rand.New(rand.NewPCG(6, 6))
	const nExpert, d, dff = 4, 256, 256
	l := randLayer(t, rng, nExpert, d, dff, quant.Q8_0, quant.Q8_0, quant.Q8_0)
	gpu, cpu := newPair(t, []*expert.Layer{l}, Options{Device: dev})
	hidden, ids := randInput(rng, 3, 2, d, nExpert)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	before := gpu.Stats()
	if err := gpu.ComputeExperts(ctx, 0, hidden, ids, 3, 2, make([]float32, 3*2*d)); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled request: %v, want context.Canceled", err)
	}
	if after := gpu.Stats(); after.GPUPairs != before.GPUPairs || after.CPUPairs != before.CPUPairs {
		t.Fatalf("a cancelled request computed pairs: %+v -> %+v", before, after)
	}
	compare(t, "after a cancelled request", gpu, cpu, 0, d, hidden, ids, 3, 2)
	if gpu.Stats().GPUPairs == before.GPUPairs {
		t.Fatalf("the next request ran no pair on the device: %+v", gpu.Stats())
	}
}

// TestNoLoader runs itself in a child process whose KVASIR_VULKAN_LIBRARY
// names a missing file: Devices and New fail with ErrNoLoader, and "auto"
// resolves to the CPU.
func TestNoLoader(t *testing.T) {
	if os.Getenv("KVASIR_VULKAN_NOLOADER_CHILD") == "1" {
		_, err := Devices()
		if !errors.Is(err, ErrNoLoader) {
			t.Fatalf("Devices: %v, want ErrNoLoader", err)
		}
		local, _ := expert.NewLocal(nil, 1)
		if _, err := New(local, Options{}); !errors.Is(err, ErrNoLoader) {
			t.Fatalf("New: %v, want ErrNoLoader", err)
		}
		if _, ok, reason, err := (Backend{Kind: "auto"}).Resolve(); ok || err != nil || reason == "" {
			t.Fatalf("auto: ok %v reason %q err %v", ok, reason, err)
		}
		if _, _, _, err := (Backend{Kind: "vulkan"}).Resolve(); !errors.Is(err, ErrNoLoader) {
			t.Fatalf("vulkan: %v", err)
		}
		fmt.Println("child ok:", err)
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestNoLoader$", "-test.v")
	cmd.Env = append(os.Environ(), "KVASIR_VULKAN_NOLOADER_CHILD=1", "KVASIR_VULKAN_LIBRARY=/nonexistent/libvulkan.so.1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "child ok") {
		t.Fatalf("child: %v\n%s", err, out)
	}
	t.Logf("%s", strings.TrimSpace(strings.Split(string(out), "child ok:")[1][:120]))
}

// TestFusedGateUp: a layer in the fused ffn_gate_up_exps layout
// (expert.StackedGateUpLayer, as qwen35moe files may carry it).
func TestFusedGateUp(t *testing.T) {
	dev := testDevice(t)
	rng := rand.New(rand.NewPCG(11, 11))
	const nExpert, d, dff = 4, 256, 512
	for _, ty := range []quant.Type{quant.Q4_K, quant.Q8_0} {
		src := randLayer(t, rng, nExpert, d, dff, ty, ty, quant.Q6_K)
		var gateUp, down []byte
		for e := range nExpert {
			gateUp = append(append(gateUp, src.Gate.Expert[e]...), src.Up.Expert[e]...)
			down = append(down, src.Down.Expert[e]...)
		}
		l, err := expert.StackedGateUpLayer(nExpert, d, dff, ty, gateUp, quant.Q6_K, down)
		if err != nil {
			t.Fatal(err)
		}
		gpu, cpu := newPair(t, []*expert.Layer{l}, Options{Device: dev})
		hidden, ids := randInput(rng, 7, 2, d, nExpert)
		compare(t, fmt.Sprintf("fused %v gate_up, Q6_K down", ty), gpu, cpu, 0, d, hidden, ids, 7, 2)
	}
}

// TestGenerated: engine/modelgen's tiny preset (qwen3moe, d 256, 8
// experts of FFN 256) generated with every matrix of each kernel type.
func TestGenerated(t *testing.T) {
	dev := testDevice(t)
	for _, ty := range kernelTypes {
		t.Run(ty.String(), func(t *testing.T) {
			f, err := modelgen.PresetFile("tiny", 2, ty)
			if err != nil {
				t.Fatal(err)
			}
			var layers []*expert.Layer
			for blk := range 2 {
				l, err := expert.FromGGUF(f, blk)
				if err != nil {
					t.Fatal(err)
				}
				layers = append(layers, l)
			}
			for _, kern := range testKernels(t, dev) {
				gpu, cpu := newPair(t, layers, Options{Device: dev, kernel: kern.kind})
				rng := rand.New(rand.NewPCG(uint64(ty), 1))
				for li, l := range layers {
					hidden, ids := randInput(rng, 9, 2, l.DModel, l.NExpert)
					compare(t, fmt.Sprintf("%s: layer %d (%v/%v/%v)", kern.name, li, l.Gate.Type, l.Up.Type, l.Down.Type), gpu, cpu, li, l.DModel, hidden, ids, 9, 2)
				}
				gpu.Close()
			}
		})
	}
}

// TestConcurrent: calls from several goroutines (a worker answers
// DISPATCHes concurrently) each get their own rows' results.
func TestConcurrent(t *testing.T) {
	dev := testDevice(t)
	rng := rand.New(rand.NewPCG(13, 13))
	const nExpert, d, dff = 4, 256, 256
	l := randLayer(t, rng, nExpert, d, dff, quant.Q8_0, quant.Q8_0, quant.Q8_0)
	gpu, cpu := newPair(t, []*expert.Layer{l}, Options{Device: dev})
	type job struct {
		hidden []float32
		ids    []int32
		want   []float32
	}
	var jobs []job
	for i := range 8 {
		n := 1 + i%3
		hidden, ids := randInput(rng, n, 2, d, nExpert)
		want := make([]float32, n*2*d)
		if err := cpu.ComputeExperts(context.Background(), 0, hidden, ids, n, 2, want); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, job{hidden, ids, want})
	}
	errs := make(chan error, len(jobs))
	for _, j := range jobs {
		go func() {
			n := len(j.ids) / 2
			got := make([]float32, len(j.want))
			if err := gpu.ComputeExperts(context.Background(), 0, j.hidden, j.ids, n, 2, got); err != nil {
				errs <- err
				return
			}
			for r := range n * 2 {
				if rel, _ := rowStats(got[r*d:(r+1)*d], j.want[r*d:(r+1)*d]); !(rel <= flipRelL2) {
					errs <- fmt.Errorf("row %d: rel L2 %.3g", r, rel)
					return
				}
			}
			errs <- nil
		}()
	}
	for range jobs {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
}

// subset returns a copy of l holding only the experts in keep (the
// others nil), as a worker's slice holds part of a layer.
func subset(l *expert.Layer, keep ...int) *expert.Layer {
	c := *l
	c.Gate.Expert = make([][]byte, l.NExpert)
	c.Up.Expert = make([][]byte, l.NExpert)
	c.Down.Expert = make([][]byte, l.NExpert)
	for _, e := range keep {
		c.Gate.Expert[e], c.Up.Expert[e], c.Down.Expert[e] = l.Gate.Expert[e], l.Up.Expert[e], l.Down.Expert[e]
	}
	return &c
}

// TestRebase: a Computer opened without experts takes a changing held set
// as engine/slice.Store hands it over: experts still held with the same
// identity stay on the device (nothing is uploaded again), new ones are
// uploaded within the quota (the rest on the CPU), dropped ones are
// released and their memory reused (no new memory block), an expert whose
// identity changed is uploaded again with its new weights, and every call
// agrees with the CPU path of the held set.
func TestRebase(t *testing.T) {
	dev := testDevice(t)
	rng := rand.New(rand.NewPCG(21, 21))
	const nExpert, d, dff = 6, 256, 256
	full := randLayer(t, rng, nExpert, d, dff, quant.Q8_0, quant.Q8_0, quant.Q8_0)
	other := randLayer(t, rng, nExpert, d, dff, quant.Q8_0, quant.Q8_0, quant.Q8_0)
	gpu, err := Open(Options{Device: dev, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer gpu.Close()
	if err := gpu.ComputeExperts(context.Background(), 0, make([]float32, d), []int32{0}, 1, 1, make([]float32, d)); !errors.Is(err, expert.ErrUnknownLayer) {
		t.Fatalf("no experts: %v, want ErrUnknownLayer", err)
	}
	ids := map[int][32]byte{}
	for e := range nExpert {
		ids[e] = [32]byte{byte(e + 1)}
	}
	sum := func(l, e int) ([32]byte, bool) { v, ok := ids[e]; return v, ok && l == 0 }
	step := func(name string, l *expert.Layer) (*expert.Local, Stats) {
		t.Helper()
		local, err := expert.NewLocal([]*expert.Layer{l}, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := gpu.Rebase(local, sum); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		held := []int32{}
		for e := range nExpert {
			if l.Held(e) {
				held = append(held, int32(e))
			}
		}
		const n = 6
		hidden, _ := randInput(rng, n, 1, d, nExpert)
		idx := make([]int32, n)
		for r := range idx {
			idx[r] = held[r%len(held)]
		}
		compare(t, name, gpu, local, 0, d, hidden, idx, n, 1)
		return local, gpu.Stats()
	}
	_, st := step("experts 0-2", subset(full, 0, 1, 2))
	eb := gpu.layers[0].expertBytes
	if st.ResidentExperts != 3 || st.CPUExperts != 0 || st.UploadedBytes != 3*eb {
		t.Fatalf("experts 0-2: %+v, want 3 resident, %d bytes uploaded", st, 3*eb)
	}
	gpu.quota = 4 * eb
	_, st = step("experts 0-4, room for 4", subset(full, 0, 1, 2, 3, 4))
	if st.ResidentExperts != 4 || st.CPUExperts != 1 || st.UploadedBytes != 4*eb || st.GPUPairs == 0 || st.CPUPairs == 0 {
		t.Fatalf("experts 0-4: %+v, want 4 resident (only one more uploaded), 1 on the CPU, pairs on both", st)
	}
	for e := range 3 {
		if gpu.layers[0].buf[e] == nil {
			t.Errorf("resident expert %d was displaced by a new one", e)
		}
	}
	blocks := gpu.blocks()
	_, st = step("experts 1, 4", subset(full, 1, 4))
	if st.ResidentExperts != 2 || st.CPUExperts != 0 || st.UploadedBytes != 5*eb || st.ResidentBytes != 2*eb {
		t.Fatalf("experts 1, 4: %+v, want 2 resident, expert 4 uploaded", st)
	}
	if b := gpu.blocks(); b != blocks {
		t.Fatalf("%d memory blocks after releasing experts, %d before: released memory not reused", b, blocks)
	}
	// Expert 1 changes (another model's weights under a new identity).
	changed := subset(full, 1, 4)
	changed.Gate.Expert[1], changed.Up.Expert[1], changed.Down.Expert[1] = other.Gate.Expert[1], other.Up.Expert[1], other.Down.Expert[1]
	ids[1] = [32]byte{99}
	_, st = step("expert 1 replaced", changed)
	if st.ResidentExperts != 2 || st.UploadedBytes != 6*eb {
		t.Fatalf("expert 1 replaced: %+v, want it uploaded again", st)
	}
	// Nothing held: calls fail as the CPU path's would, the memory is free.
	if err := gpu.Rebase(nil, sum); err != nil {
		t.Fatal(err)
	}
	if st := gpu.Stats(); st.ResidentExperts != 0 || st.ResidentBytes != 0 {
		t.Fatalf("nothing held: %+v", st)
	}
	if err := gpu.ComputeExperts(context.Background(), 0, make([]float32, d), []int32{1}, 1, 1, make([]float32, d)); !errors.Is(err, expert.ErrUnknownLayer) {
		t.Fatalf("nothing held: %v, want ErrUnknownLayer", err)
	}
}

// TestRebaseAfterFault: after a device fault Rebase swaps in the new
// experts without touching the device, and calls answer from the CPU
// path with its exact bits.
func TestRebaseAfterFault(t *testing.T) {
	dev := testDevice(t)
	rng := rand.New(rand.NewPCG(23, 23))
	const nExpert, d, dff = 4, 256, 256
	full := randLayer(t, rng, nExpert, d, dff, quant.Q4_K, quant.Q4_K, quant.Q6_K)
	gpu, err := Open(Options{Device: dev, Logf: t.Logf, InjectFault: func() error { return errors.New("VK_ERROR_DEVICE_LOST (injected)") }})
	if err != nil {
		t.Fatal(err)
	}
	defer gpu.Close()
	if got, want := Describe(gpu), gpu.Device().Name+" (Vulkan)"; got != want {
		t.Errorf("Describe before the fault: %q, want %q", got, want)
	}
	if got := Describe(nil); got != "CPU" {
		t.Errorf("Describe(nil) = %q", got)
	}
	for i, keep := range [][]int{{0, 1}, {1, 2, 3}} {
		local, err := expert.NewLocal([]*expert.Layer{subset(full, keep...)}, 2)
		if err != nil {
			t.Fatal(err)
		}
		if err := gpu.Rebase(local, nil); err != nil {
			t.Fatal(err)
		}
		hidden, _ := randInput(rng, 2, 1, d, nExpert)
		idx := []int32{int32(keep[0]), int32(keep[len(keep)-1])}
		want := make([]float32, 2*d)
		got := make([]float32, 2*d)
		if err := local.ComputeExperts(context.Background(), 0, hidden, idx, 2, 1, want); err != nil {
			t.Fatal(err)
		}
		if err := gpu.ComputeExperts(context.Background(), 0, hidden, idx, 2, 1, got); err != nil {
			t.Fatal(err)
		}
		for j := range want {
			if math.Float32bits(got[j]) != math.Float32bits(want[j]) {
				t.Fatalf("round %d element %d: %v, want the CPU's %v", i, j, got[j], want[j])
			}
		}
		st := gpu.Stats()
		if !strings.Contains(st.Fault, "DEVICE_LOST") {
			t.Fatalf("round %d: %+v, want the fault recorded", i, st)
		}
		if got, want := Describe(gpu), "CPU (the Vulkan device "+gpu.Device().Name+" failed: VK_ERROR_DEVICE_LOST (injected))"; got != want {
			t.Errorf("Describe after the fault: %q, want %q", got, want)
		}
		if i == 1 && (st.ResidentExperts != 0 || st.CPUExperts != 3) {
			t.Fatalf("after the fault: %+v, want every expert on the CPU", st)
		}
	}
}

// TestUploadOutOfMemory: an upload that fails for want of memory (the
// staging buffer's host allocation, as under a process memory limit)
// leaves that expert and the ones after it on the CPU, as a full device
// does: no error, no fault, the CPU's bits for them and the experts
// uploaded before still on the device. Any other upload error is a
// device error.
func TestUploadOutOfMemory(t *testing.T) {
	dev := testDevice(t)
	rng := rand.New(rand.NewPCG(6, 6))
	const nExpert, d, dff = 4, 256, 256
	l := randLayer(t, rng, nExpert, d, dff, quant.Q8_0, quant.Q8_0, quant.Q8_0)
	local, err := expert.NewLocal([]*expert.Layer{l}, 2)
	if err != nil {
		t.Fatal(err)
	}
	gpu, err := Open(Options{Device: dev, Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer gpu.Close()
	uploads := 0
	gpu.injectUpload = func() error {
		if uploads++; uploads >= 2 {
			return errors.New("vkAllocateMemory (host): VK_ERROR_OUT_OF_DEVICE_MEMORY (-2) (injected)")
		}
		return nil
	}
	if err := gpu.Rebase(local, nil); err != nil {
		t.Fatalf("Rebase with the second upload out of memory: %v", err)
	}
	if st := gpu.Stats(); st.ResidentExperts != 1 || st.CPUExperts != nExpert-1 || st.Fault != "" {
		t.Fatalf("stats %+v: want 1 expert on the device, %d on the CPU, no fault", st, nExpert-1)
	}
	// Experts 1..3 (the CPU's) give the CPU's bits.
	hidden, _ := randInput(rng, 2, 1, d, nExpert)
	sameAsCPU(t, gpu, local, 0, d, hidden, []int32{1, 3}, 2, 1)
	// Another upload error is the device's.
	gpu.injectUpload = func() error { return errors.New("VK_ERROR_DEVICE_LOST (injected)") }
	l2 := randLayer(t, rng, nExpert, d, dff, quant.Q8_0, quant.Q8_0, quant.Q8_0)
	local2, err := expert.NewLocal([]*expert.Layer{l2}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := gpu.Rebase(local2, nil); !errors.Is(err, ErrDevice) {
		t.Fatalf("Rebase with a lost device on upload: %v, want ErrDevice", err)
	}
}

// TestFaultDeclared: Fault (expert.Faulter, a worker's answer to NaN
// outputs from the device) turns the Computer to the CPU path for good:
// the CPU's bits, the reason in Stats, true returned.
func TestFaultDeclared(t *testing.T) {
	dev := testDevice(t)
	rng := rand.New(rand.NewPCG(8, 8))
	const nExpert, d, dff = 4, 256, 256
	l := randLayer(t, rng, nExpert, d, dff, quant.Q4_K, quant.Q4_K, quant.Q6_K)
	gpu, cpu := newPair(t, []*expert.Layer{l}, Options{Device: dev})
	var f expert.Faulter = gpu
	if !f.Fault(errors.New("non-finite outputs (test)")) {
		t.Fatal("Fault returned false")
	}
	hidden, ids := randInput(rng, 3, 2, d, nExpert)
	sameAsCPU(t, gpu, cpu, 0, d, hidden, ids, 3, 2)
	if st := gpu.Stats(); !strings.Contains(st.Fault, "non-finite outputs (test)") || st.GPUPairs != 0 {
		t.Errorf("stats %+v: want the fault recorded and no GPU pairs", st)
	}
}
