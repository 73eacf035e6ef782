package quant

import (
	"fmt"
	"testing"
)

// BenchmarkMatVecCached runs MatMul on one goroutine over a small weight
// matrix that stays in cache (rows x 256, the fixture model's width: one
// K-quant block per row), so per-row call overhead shows, as in the
// fixture decode (tied Q6_K head 50257 x 256, m = 1) and its prefill.
// Reported in ns per weight row and activation row, wall and CPU (the
// CPU figure is steadier on a shared machine).
func BenchmarkMatVecCached(b *testing.B) {
	const rows, cols = 4096, 256
	for _, typ := range []Type{Q4_K, Q6_K, Q8_0, F16} {
		rb, _ := typ.RowBytes(cols)
		w := make([]byte, rows*rb)
		if err := Quantize(typ, randomRows(7, rows*cols), w); err != nil {
			b.Fatal(err)
		}
		for _, m := range []int{1, 8} {
			b.Run(fmt.Sprintf("%s/m=%d", typ, m), func(b *testing.B) {
				x := randomRows(8, m*cols)
				ab, _ := ActivationBytes(typ, cols)
				xc := make([]byte, m*ab)
				for i := range m {
					if err := ConvertActivation(typ, x[i*cols:(i+1)*cols], xc[i*ab:(i+1)*ab]); err != nil {
						b.Fatal(err)
					}
				}
				y := make([]float32, m*rows)
				b.SetBytes(int64(len(w)))
				cpu0 := processCPU()
				for b.Loop() {
					if err := MatMulConverted(typ, w, rows, cols, xc, m, y, 1); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/rows/float64(m), "ns/row/m")
				if c := processCPU() - cpu0; cpu0 > 0 {
					b.ReportMetric(float64(c.Nanoseconds())/float64(b.N)/rows/float64(m), "cpu-ns/row/m")
				}
			})
		}
	}
}

// BenchmarkDotF32 measures DotF32 on short cached vectors (attention head
// sizes).
func BenchmarkDotF32(b *testing.B) {
	for _, n := range []int{64, 128, 100, 2048} {
		b.Run(fmt.Sprintf("n=%d", n), func(b *testing.B) {
			x, y := randomRows(9, n), randomRows(10, n)
			var s float32
			for b.Loop() {
				s += DotF32(x, y)
			}
			_ = s
		})
	}
}

// BenchmarkDotF32Rows compares DotF32Rows with a loop of DotF32 calls over
// 64 strided rows (an attention score pass), in ns per row.
func BenchmarkDotF32Rows(b *testing.B) {
	for _, n := range []int{64, 100} {
		const rows, stride = 64, 256
		x, m := randomRows(11, n), randomRows(12, (rows-1)*stride+n)
		out := make([]float32, rows)
		b.Run(fmt.Sprintf("rows/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				if err := DotF32Rows(x, m, stride, out); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/rows, "ns/row")
		})
		b.Run(fmt.Sprintf("loop/n=%d", n), func(b *testing.B) {
			for b.Loop() {
				for j := range out {
					out[j] = DotF32(x, m[j*stride:j*stride+n])
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/rows, "ns/row")
		})
	}
}
