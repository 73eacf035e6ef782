//go:build linux && cgo && !kvasir_novulkan

package vulkan

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

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
		if devs, err := Devices(); err == nil && len(devs) > 0 {
			if gpu, err = New(local, Options{Device: devs[0].Index}); err != nil {
				b.Logf("vulkan: %v", err)
				gpu = nil
			} else {
				b.Logf("device %v", gpu.Device())
			}
			if gpu != nil && gpu.rowKernels && devs[0].SubgroupArithmetic {
				if gpuSub, err = New(local, Options{Device: devs[0].Index, kernel: kernelSubgroup}); err != nil {
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
					cpu0 := cpuTime()
					for b.Loop() {
						if err := side.c.ComputeExperts(context.Background(), 0, hidden, ids, n, k, out); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric((cpuTime()-cpu0).Seconds()*1e3/float64(b.N), "cpu-ms/op")
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

// cpuTime returns the process's user + system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
