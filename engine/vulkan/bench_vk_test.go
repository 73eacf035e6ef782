//go:build linux && cgo && !kvasir_novulkan

package vulkan

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/cputime"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// BenchmarkExperts compares the Vulkan Computer (on the first device:
// lavapipe on a machine without a GPU; "vulkan" with the kernels New
// picks, "vulkan-subgroup" with the subgroup kernels where those are not
// the pick) with expert.Local on one layer of
// Qwen3-30B-A3B's expert shape (d 2048, FFN 768) with 8 experts, for a
// decode step (1 row, top-8: every expert once) and a batch of 16 rows.
// rows/s counts (row, slot) pairs; weight-GB/s the expert bytes each call
// must read (each used expert's three matrices once); cpu-ms/op the
// process's CPU time per call (steadier than wall time on a loaded
// machine; on lavapipe the "device" is this process's threads).
func BenchmarkExperts(b *testing.B) {
	const nExpert, d, dff = 8, 2048, 768
	for _, typ := range []quant.Type{quant.Q4_K, quant.Q8_0} {
		rng := rand.New(rand.NewPCG(1, 2))
		l := randLayer(b, rng, nExpert, d, dff, typ, typ, typ)
		local, err := expert.NewLocal([]*expert.Layer{l}, 0)
		if err != nil {
			b.Fatal(err)
		}
		var gpu, gpuSub *Computer // auto kernels; subgroup kernels
		if dev, ok := benchDevice(b); ok {
			var err error
			if gpu, err = New(local, Options{Device: dev.Index}); err != nil {
				b.Logf("vulkan: %v", err)
				gpu = nil
			} else {
				b.Logf("device %v", gpu.Device())
			}
			if gpu != nil && gpu.rowKernels && dev.SubgroupArithmetic {
				if gpuSub, err = New(local, Options{Device: dev.Index, kernel: kernelSubgroup}); err != nil {
					gpuSub = nil
				}
			}
		}
		for _, n := range []int{1, 16} {
			const k = 8
			hidden, ids := randInput(rng, n, k, d, nExpert)
			out := make([]float32, n*k*d)
			used := map[int32]bool{}
			for _, e := range ids {
				used[e] = true
			}
			weightBytes := float64(len(used) * l.ExpertBytes())
			for _, side := range []struct {
				name string
				c    expert.Computer
			}{{"vulkan", gpu}, {"vulkan-subgroup", gpuSub}, {"cpu", local}} {
				if c, ok := side.c.(*Computer); ok && c == nil {
					continue
				}
				b.Run(fmt.Sprintf("%v/n=%d/%s", typ, n, side.name), func(b *testing.B) {
					cpu0 := cputime.Used()
					for b.Loop() {
						if err := side.c.ComputeExperts(context.Background(), 0, hidden, ids, n, k, out); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric((cputime.Used()-cpu0).Seconds()*1e3/float64(b.N), "cpu-ms/op")
					sec := b.Elapsed().Seconds() / float64(b.N)
					b.ReportMetric(float64(n*k)/sec, "rows/s")
					b.ReportMetric(weightBytes/sec/1e9, "weight-GB/s")
				})
			}
		}
		for _, g := range []*Computer{gpu, gpuSub} {
			if g != nil {
				g.Close()
			}
		}
	}
}

// benchDevice returns the device to benchmark on, as testDevice chooses
// it ($KVASIR_VULKAN_DEVICE, else the GPU "auto" takes, else the first
// device), or false without one (the CPU sides still run).
func benchDevice(b *testing.B) (Device, bool) {
	devs, err := Devices()
	if err != nil || len(devs) == 0 {
		b.Logf("no Vulkan device (%v): CPU only", err)
		return Device{}, false
	}
	return devs[testDevice(b)], true
}

// deviceBandwidth is the device's copy bandwidth (bytes read plus written
// per second), measured once per process: 256 MiB copied 20 times.
var deviceBandwidth = sync.OnceValues(func() (float64, error) {
	devs, err := Devices()
	if err != nil || len(devs) == 0 {
		return 0, fmt.Errorf("no device: %v", err)
	}
	idx := 0
	if v := os.Getenv("KVASIR_VULKAN_DEVICE"); v != "" {
		idx, _ = strconv.Atoi(v)
	} else if d, ok := Pick(devs); ok {
		idx = d.Index
	}
	c, err := Open(Options{Device: idx})
	if err != nil {
		return 0, err
	}
	defer c.Close()
	return c.copyBandwidth(256<<20, 20)
})

// BenchmarkDeviceBandwidth reports the device's memory bandwidth as a
// copy between two device-local buffers measures it (GB/s of bytes read
// plus written), the reference for BenchmarkExpertsBatch's bw-frac.
func BenchmarkDeviceBandwidth(b *testing.B) {
	if _, ok := benchDevice(b); !ok {
		b.Skip("no Vulkan device")
	}
	bw, err := deviceBandwidth()
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
	}
	b.ReportMetric(bw/1e9, "copy-GB/s")
}

// BenchmarkExpertsBatch measures Q4_K expert matmuls (gate, up and down
// all Q4_K) in batches of 64 and 256 rows with top-8 routing over
// $KVASIR_VK_BENCH_EXPERTS experts (default 128 on a GPU, 16 on a
// software driver, which runs the 64-row batch only) of Qwen3-30B-A3B's
// expert shape (d 2048, FFN 768), on the Vulkan device and on the CPU
// path. rows/s counts (row, slot) pairs;
// weight-GB/s the used experts' bytes per call (each read once);
// bw-frac that over the device's copy bandwidth (BenchmarkDeviceBandwidth;
// the goal on a real GPU: >= 0.5 at 64 rows and more).
func BenchmarkExpertsBatch(b *testing.B) {
	const d, dff, k = 2048, 768, 8
	dev, ok := benchDevice(b)
	nExpert := 16
	if ok && dev.Type.GPU() {
		nExpert = 128
	}
	if v := os.Getenv("KVASIR_VK_BENCH_EXPERTS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < k {
			b.Fatalf("KVASIR_VK_BENCH_EXPERTS=%q: want a number >= %d", v, k)
		}
		nExpert = n
	}
	rng := rand.New(rand.NewPCG(3, 4))
	l := randLayer(b, rng, nExpert, d, dff, quant.Q4_K, quant.Q4_K, quant.Q4_K)
	local, err := expert.NewLocal([]*expert.Layer{l}, 0)
	if err != nil {
		b.Fatal(err)
	}
	var gpu *Computer
	var bw float64
	if ok {
		if gpu, err = New(local, Options{Device: dev.Index}); err != nil {
			b.Fatalf("vulkan: %v", err)
		}
		defer gpu.Close()
		if st := gpu.Stats(); st.CPUExperts != 0 {
			b.Fatalf("%d experts left to the CPU: lower KVASIR_VK_BENCH_EXPERTS", st.CPUExperts)
		}
		if bw, err = deviceBandwidth(); err != nil {
			b.Logf("bandwidth: %v", err)
		}
		b.Logf("device %v; %d Q4_K experts (%d MiB); copy bandwidth %.1f GB/s", gpu.Device(), nExpert,
			nExpert*l.ExpertBytes()>>20, bw/1e9)
	}
	batches := []int{64, 256}
	if ok && !dev.Type.GPU() {
		batches = batches[:1] // a software driver takes half a minute for 256 rows
	}
	for _, n := range batches {
		hidden, ids := randInput(rng, n, k, d, nExpert)
		out := make([]float32, n*k*d)
		used := map[int32]bool{}
		for _, e := range ids {
			used[e] = true
		}
		weightBytes := float64(len(used) * l.ExpertBytes())
		for _, side := range []struct {
			name string
			c    expert.Computer
		}{{"vulkan", gpu}, {"cpu", local}} {
			if c, isGPU := side.c.(*Computer); isGPU && c == nil {
				continue
			}
			b.Run(fmt.Sprintf("Q4_K/e=%d/n=%d/%s", nExpert, n, side.name), func(b *testing.B) {
				for b.Loop() {
					if err := side.c.ComputeExperts(context.Background(), 0, hidden, ids, n, k, out); err != nil {
						b.Fatal(err)
					}
				}
				sec := b.Elapsed().Seconds() / float64(b.N)
				b.ReportMetric(float64(n*k)/sec, "rows/s")
				b.ReportMetric(weightBytes/sec/1e9, "weight-GB/s")
				if side.name == "vulkan" && bw > 0 {
					b.ReportMetric(weightBytes/sec/bw, "bw-frac")
				}
			})
		}
	}
}
