package quant

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/cputime"
)

// reportCPU adds "GB/s_per_cpu": bytes per CPU-second of this process
// since cpu0 (all goroutines together). Wall-clock GB/s suffers when other
// jobs share the cores; this shows what the kernels do with the CPU they
// get (x2 for both cores of an idle 2-core machine).
func reportCPU(b *testing.B, bytes float64, cpu0 time.Duration) {
	if c := cputime.Used() - cpu0; c > 0 && cpu0 > 0 {
		b.ReportMetric(bytes/c.Seconds()/1e9, "GB/s_per_cpu")
	}
}

// benchWorkingSet is the bytes of weights a matvec benchmark cycles
// through: several times any last-level cache, so the weights stream from
// memory as in a real decode (the fixtures README's llama.cpp figures are
// memory-bound too).
const benchWorkingSet = 128 << 20

// BenchmarkMemBandwidth measures the machine's memory bandwidth on a 64 MiB
// buffer: "copy" (copy(), reported as bytes copied/s and read+write/s) and
// "read" (DotF32 of a buffer with itself: bytes read/s), on 1 and 2
// goroutines (each on its own half).
func BenchmarkMemBandwidth(b *testing.B) {
	const size = 64 << 20
	src, dst := make([]byte, size), make([]byte, size)
	f := make([]float32, size/4)
	for i := range src { // touch every page before timing
		src[i], dst[i] = byte(i), byte(i)
	}
	for i := range f {
		f[i] = float32(i & 255)
	}
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprintf("copy/threads=%d", th), func(b *testing.B) {
			b.SetBytes(size)
			cpu0 := cputime.Used()
			for b.Loop() {
				ParallelFor(size, th, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
			}
			reportCPU(b, float64(size)*float64(b.N), cpu0)
			s := b.Elapsed().Seconds()
			b.ReportMetric(float64(size)*float64(b.N)/s/1e9, "GB/s")
			b.ReportMetric(2*float64(size)*float64(b.N)/s/1e9, "rw_GB/s")
		})
		b.Run(fmt.Sprintf("read/threads=%d", th), func(b *testing.B) {
			b.SetBytes(size)
			cpu0 := cputime.Used()
			for b.Loop() {
				ParallelFor(len(f), th, func(lo, hi int) { _ = DotF32(f[lo:hi], f[lo:hi]) })
			}
			reportCPU(b, float64(size)*float64(b.N), cpu0)
			b.ReportMetric(float64(size)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}

// BenchmarkMatVec runs MatMul (weights rows x cols, m activation rows, both
// cores) per weight type, cycling through copies of the weight matrix
// totalling benchWorkingSet bytes, and reports the effective GB/s of weight
// bytes read (rows*RowBytes(cols) per call / time). Activation conversion
// is included (MatMul converts x each call, as the model does).
func BenchmarkMatVec(b *testing.B) {
	for _, typ := range weightTypes {
		b.Run(typ.String(), func(b *testing.B) {
			const cols = 2048
			x := randomRows(3, 8*cols)
			rb, _ := typ.RowBytes(cols)
			one := make([]byte, 2048*rb)
			if err := Quantize(typ, randomRows(4, 2048*cols), one); err != nil {
				b.Fatal(err)
			}
			for _, rows := range []int{2048, 768} {
				mat := one[:rows*rb]
				var ws [][]byte // filled on first use (skipped sub-benchmarks cost nothing)
				for _, m := range []int{1, 8} {
					b.Run(fmt.Sprintf("%dx%d/m=%d", rows, cols, m), func(b *testing.B) {
						if ws == nil {
							ws = make([][]byte, max(1, benchWorkingSet/len(mat)))
							for i := range ws {
								ws[i] = append([]byte(nil), mat...)
							}
						}
						y := make([]float32, m*rows)
						b.SetBytes(int64(len(mat)))
						i := 0
						cpu0 := cputime.Used()
						for b.Loop() {
							if err := MatMul(typ, ws[i], rows, cols, x[:m*cols], m, y, 0); err != nil {
								b.Fatal(err)
							}
							i = (i + 1) % len(ws)
						}
						reportCPU(b, float64(len(mat))*float64(b.N), cpu0)
						b.ReportMetric(float64(len(mat))*float64(b.N)/b.Elapsed().Seconds()/1e9, "weight_GB/s")
					})
				}
			}
		})
	}
}

// BenchmarkVecDot measures one kernel on one goroutine with a cached row
// (n = 4096): compute speed without memory traffic, in weight bytes/s.
func BenchmarkVecDot(b *testing.B) {
	const n = 4096
	for _, typ := range weightTypes {
		b.Run(typ.String(), func(b *testing.B) {
			rb, _ := typ.RowBytes(n)
			w := make([]byte, rb)
			if err := Quantize(typ, randomRows(5, n), w); err != nil {
				b.Fatal(err)
			}
			ab, _ := ActivationBytes(typ, n)
			a := make([]byte, ab)
			if err := ConvertActivation(typ, randomRows(6, n), a); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(rb))
			var s float32
			for b.Loop() {
				s += VecDot(typ, w, a, n)
			}
			_ = s
		})
	}
}
