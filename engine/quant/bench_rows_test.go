package quant

import (
	"fmt"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/cputime"
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
				cpu0 := cputime.Used()
				for b.Loop() {
					if err := MatMulConverted(typ, w, rows, cols, xc, m, y, 1); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/rows/float64(m), "ns/row/m")
				if c := cputime.Used() - cpu0; cpu0 > 0 {
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

// BenchmarkKernel measures the row kernels alone, per weight type and SIMD
// path, on one goroutine: "cached" runs MatMulConverted over a 256 x 2048
// matrix that stays in the core's L2, "stream" over 768 MiB of copies of a
// 2048 x 2048 one (weights from memory, as in a decode of a real model).
// m = 1 is the matrix x vector of a decode, m = 4 and 16 the batched
// kernels. weight_GB/s counts each weight byte once per call; ns/blk is
// per (weight block, activation row).
func BenchmarkKernel(b *testing.B) {
	const cols = 2048
	for _, typ := range []Type{Q4_K, Q6_K, Q8_0} {
		rb, _ := typ.RowBytes(cols)
		ab, _ := ActivationBytes(typ, cols)
		one := make([]byte, 2048*rb)
		if err := Quantize(typ, randomRows(31, 2048*cols), one); err != nil {
			b.Fatal(err)
		}
		var stream [][]byte
		for _, path := range simdPaths() {
			for _, kind := range []string{"cached", "stream"} {
				for _, m := range []int{1, 4, 16} {
					b.Run(fmt.Sprintf("%s/%s/%s/m=%d", typ, path, kind, m), func(b *testing.B) {
						old, _ := SetSIMDPath(path)
						defer SetSIMDPath(old)
						rows := 256
						mats := [][]byte{one[:rows*rb]}
						if kind == "stream" {
							rows = 2048
							if stream == nil {
								for range (768 << 20) / len(one) {
									stream = append(stream, append([]byte(nil), one...))
								}
							}
							mats = stream
						}
						xc := make([]byte, m*ab)
						for i := range m {
							if err := ConvertActivation(typ, randomRows(uint64(32+i), cols), xc[i*ab:(i+1)*ab]); err != nil {
								b.Fatal(err)
							}
						}
						y := make([]float32, m*rows)
						i := 0
						cpu0 := cputime.Used()
						for b.Loop() {
							if err := MatMulConverted(typ, mats[i], rows, cols, xc, m, y, 1); err != nil {
								b.Fatal(err)
							}
							i = (i + 1) % len(mats)
						}
						blks := float64(b.N) * float64(rows*m*(cols/typ.BlockSize()))
						s := b.Elapsed().Seconds() / float64(b.N)
						b.ReportMetric(float64(rows*rb)/s/1e9, "weight_GB/s")
						b.ReportMetric(b.Elapsed().Seconds()*1e9/blks, "ns/blk")
						if c := cputime.Used() - cpu0; cpu0 > 0 {
							b.ReportMetric(float64(c.Nanoseconds())/blks, "cpu-ns/blk")
						}
					})
				}
			}
		}
	}
}

// BenchmarkKernelShapes measures the Q4_K matrix x vector (m = 1, one
// goroutine, MatMulConverted) per weight shape, weights streamed from
// memory (copies of the matrix filling benchWorkingSet bytes): a dense
// projection (2048 x 2048) against the Qwen3.5-35B-A3B routed expert's
// matrices and the units expert.Local cuts them into (gate/up 512 x 2048
// and halves of it, down 2048 x 512 and quarters of it). cpu-ns/KB is the
// CPU time per KiB of weights (steady on a shared machine): an expert
// shape costing more per byte than the dense one shows per-call or
// per-row overhead.
func BenchmarkKernelShapes(b *testing.B) {
	for _, sh := range []struct{ rows, cols int }{{2048, 2048}, {512, 2048}, {256, 2048}, {2048, 512}, {512, 512}} {
		b.Run(fmt.Sprintf("Q4_K/%dx%d", sh.rows, sh.cols), func(b *testing.B) {
			ws, one, xc := q4KStream(b, sh.rows, sh.cols, 41)
			y := make([]float32, sh.rows)
			i := 0
			cpu0 := cputime.Used()
			for b.Loop() {
				if err := MatMulConverted(Q4_K, ws[i:i+len(one)], sh.rows, sh.cols, xc, 1, y, 1); err != nil {
					b.Fatal(err)
				}
				if i += len(one); i == len(ws) {
					i = 0
				}
			}
			kb := float64(b.N) * float64(len(one)) / 1024
			b.ReportMetric(float64(b.N)*float64(len(one))/b.Elapsed().Seconds()/1e9, "weight_GB/s")
			if c := cputime.Used() - cpu0; cpu0 > 0 {
				b.ReportMetric(float64(c.Nanoseconds())/kb, "cpu-ns/KB")
			}
		})
	}
}

// BenchmarkKernelSplit runs the same Q4_K matrix x vector (m = 1, one
// goroutine, weights streamed from memory) as one MatMulConverted call
// and as calls over equal row ranges, as expert.Local cuts an expert's
// matrices into units: the difference per KiB is what a call's start
// costs (cold row streams, activation reordering, call overhead).
func BenchmarkKernelSplit(b *testing.B) {
	for _, sh := range []struct{ rows, cols int }{{2048, 2048}, {2048, 512}} {
		ws, one, xc := q4KStream(b, sh.rows, sh.cols, 43)
		rb := len(one) / sh.rows
		y := make([]float32, sh.rows)
		for _, calls := range []int{1, 4, 16} {
			b.Run(fmt.Sprintf("Q4_K/%dx%d/calls=%d", sh.rows, sh.cols, calls), func(b *testing.B) {
				step := sh.rows / calls
				i := 0
				cpu0 := cputime.Used()
				for b.Loop() {
					w := ws[i : i+len(one)]
					for r := 0; r < sh.rows; r += step {
						if err := MatMulConverted(Q4_K, w[r*rb:(r+step)*rb], step, sh.cols, xc, 1, y[r:r+step], 1); err != nil {
							b.Fatal(err)
						}
					}
					if i += len(one); i == len(ws) {
						i = 0
					}
				}
				kb := float64(b.N) * float64(len(one)) / 1024
				b.ReportMetric(float64(b.N)*float64(len(one))/b.Elapsed().Seconds()/1e9, "weight_GB/s")
				if c := cputime.Used() - cpu0; cpu0 > 0 {
					b.ReportMetric(float64(c.Nanoseconds())/kb, "cpu-ns/KB")
				}
			})
		}
	}
}

// q4KStream returns copies of one random rows x cols Q4_K matrix (one, its
// bytes) filling benchWorkingSet, so that cycling through ws streams the
// weights from memory, and a converted random activation row for it;
// seed and seed+1 draw them.
func q4KStream(b *testing.B, rows, cols int, seed uint64) (ws, one, xc []byte) {
	return streamCopies(b, Q4_K, rows, cols, benchWorkingSet, seed)
}

// streamCopies is q4KStream for any weight type and size bytes of copies.
func streamCopies(b *testing.B, typ Type, rows, cols, size int, seed uint64) (ws, one, xc []byte) {
	rb, err := typ.RowBytes(cols)
	if err != nil {
		b.Fatal(err)
	}
	ab, err := ActivationBytes(typ, cols)
	if err != nil {
		b.Fatal(err)
	}
	one = make([]byte, rows*rb)
	if err := Quantize(typ, randomRows(seed, rows*cols), one); err != nil {
		b.Fatal(err)
	}
	ws = make([]byte, size/len(one)*len(one))
	for i := 0; i < len(ws); i += len(one) {
		copy(ws[i:], one)
	}
	xc = make([]byte, ab)
	if err := ConvertActivation(typ, randomRows(seed+1, cols), xc); err != nil {
		b.Fatal(err)
	}
	return ws, one, xc
}

// BenchmarkStream is the ceiling a decode's matrix x vector can
// reach: each of 1 or 2 goroutines streams its own 256 MiB of copies of
// one matrix (m = 1, MatMulConverted per copy, back to back, no barrier
// between calls), in the shapes of the Qwen3.5-35B-A3B decode (a 2048 x
// 2048 Q4_K projection, a routed expert's 512 x 2048 gate or up and 2048 x
// 512 down, the 256 x 2048 F32 router), beside "read", DotF32 of each
// goroutine's 256 MiB of F32 with itself (as BenchmarkMemBandwidth's read).
// GB/s is the bytes of all goroutines per second of wall time. A decode
// step reads the same bytes in ~100 regions per token with serial steps
// between them; measured in the same minute (the host's bandwidth moves),
// its GB/s over this one's is what the step's structure costs
// (docs/BENCHMARKS-by-hand.md, decode round 5).
func BenchmarkStream(b *testing.B) {
	const region = 256 << 20
	for _, sh := range []struct {
		name       string
		typ        Type
		rows, cols int
	}{{"read", F32, 0, 0}, {"Q4_K/2048x2048", Q4_K, 2048, 2048}, {"Q4_K/512x2048", Q4_K, 512, 2048},
		{"Q4_K/2048x512", Q4_K, 2048, 512}, {"F32/256x2048", F32, 256, 2048}} {
		for _, th := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/threads=%d", sh.name, th), func(b *testing.B) {
				type stream struct {
					w    []byte    // copies of the matrix
					f    []float32 // "read": the buffer
					one  int       // bytes of one matrix
					xc   []byte
					y    []float32
					done int
					err  error
				}
				ss := make([]stream, th)
				for t := range ss {
					s := &ss[t]
					if sh.rows == 0 {
						s.f = make([]float32, region/4)
						for i := range s.f {
							s.f[i] = float32(i & 255)
						}
						continue
					}
					w, one, xc := streamCopies(b, sh.typ, sh.rows, sh.cols, region, uint64(51+2*t))
					s.w, s.one, s.xc, s.y = w, len(one), xc, make([]float32, sh.rows)
				}
				var bytes float64
				for b.Loop() {
					ParallelFor(th, th, func(lo, hi int) {
						for t := lo; t < hi; t++ {
							s := &ss[t]
							if s.f != nil {
								for c := 0; c < len(s.f); c += 1 << 20 {
									_ = DotF32(s.f[c:c+1<<20], s.f[c:c+1<<20])
								}
								s.done += 4 * len(s.f)
								continue
							}
							for i := 0; i+s.one <= len(s.w); i += s.one {
								if s.err = MatMulConverted(sh.typ, s.w[i:i+s.one], sh.rows, sh.cols, s.xc, 1, s.y, 1); s.err != nil {
									return
								}
								s.done += s.one
							}
						}
					})
				}
				for _, s := range ss {
					if s.err != nil {
						b.Fatal(s.err)
					}
					bytes += float64(s.done)
				}
				b.ReportMetric(bytes/b.Elapsed().Seconds()/1e9, "GB/s")
			})
		}
	}
}
