package quant

import (
	"fmt"
	"math"
	"runtime"
	"sync"
)

// ParallelFor splits [0, n) into min(threads, n) contiguous chunks of
// near-equal size and calls fn(lo, hi) for each on its own goroutine (the
// calling goroutine runs the first), returning when all are done.
// threads <= 0 means runtime.GOMAXPROCS(0). n <= 0 calls nothing.
func ParallelFor(n, threads int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	threads = min(threads, n)
	if threads == 1 {
		fn(0, n)
		return
	}
	var wg sync.WaitGroup
	for t := 1; t < threads; t++ {
		lo, hi := n*t/threads, n*(t+1)/threads
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	fn(0, n/threads)
	wg.Wait()
}

// MatMul computes y = x . W^T: x is m x cols float32 (row-major), W is rows x
// cols of type weight (row r at bytes [r*RowBytes(cols), (r+1)*RowBytes(cols))),
// y is m x rows float32 (row-major). Each x row is converted once with
// ConvertActivation, then output rows are split over threads goroutines
// (<= 0: GOMAXPROCS). Every y element is one VecDot call, so the result is
// bit-identical for any m and any thread count. Errors: ErrUnknownType,
// ErrUnsupported, ErrSize (a length that does not match the shapes).
func MatMul(weight Type, w []byte, rows, cols int, x []float32, m int, y []float32, threads int) error {
	if m < 0 || rows < 0 || cols < 0 {
		return fmt.Errorf("%w: negative shape m=%d rows=%d cols=%d", ErrSize, m, rows, cols)
	}
	ab, err := ActivationBytes(weight, cols)
	if err != nil {
		return err
	}
	if m > 0 && cols > math.MaxInt/m || m > 0 && ab > math.MaxInt/m {
		return fmt.Errorf("%w: m=%d x cols=%d overflows", ErrSize, m, cols)
	}
	if len(x) != m*cols {
		return fmt.Errorf("%w: x has %d floats, want m*cols = %d*%d", ErrSize, len(x), m, cols)
	}
	xc := make([]byte, m*ab)
	for i := range m {
		if err := ConvertActivation(weight, x[i*cols:(i+1)*cols], xc[i*ab:(i+1)*ab]); err != nil {
			return err
		}
	}
	return MatMulConverted(weight, w, rows, cols, xc, m, y, threads)
}

// MatMulConverted is MatMul with x already converted: xc holds m rows of
// ActivationBytes(weight, cols) bytes each, as ConvertActivation writes
// them. Same shapes, order and errors. The K-quant kernels read the
// block_q8_K bsums (Q4_K/Q5_K always, as ggml-cpu's ggml_vec_dot_q4_K_q8_K
// does; Q6_K here, as its AVX2 ggml_vec_dot_q6_K_q8_K does), so bytes whose
// bsums do not match their codes may give other values than VecDot.
func MatMulConverted(weight Type, w []byte, rows, cols int, xc []byte, m int, y []float32, threads int) error {
	if m < 0 || rows < 0 || cols < 0 {
		return fmt.Errorf("%w: negative shape m=%d rows=%d cols=%d", ErrSize, m, rows, cols)
	}
	rb, err := weight.RowBytes(cols)
	if err != nil {
		return err
	}
	ab, err := ActivationBytes(weight, cols)
	if err != nil {
		return err
	}
	if rows > 0 && rb > math.MaxInt/rows || m > 0 && ab > math.MaxInt/m || m > 0 && rows > math.MaxInt/m {
		return fmt.Errorf("%w: shapes overflow (rows=%d cols=%d m=%d)", ErrSize, rows, cols, m)
	}
	if len(w) != rows*rb {
		return fmt.Errorf("%w: weights have %d bytes, %d x %d %s need %d", ErrSize, len(w), rows, cols, weight, rows*rb)
	}
	if len(xc) != m*ab {
		return fmt.Errorf("%w: converted activations have %d bytes, want %d x %d", ErrSize, len(xc), m, ab)
	}
	if len(y) != m*rows {
		return fmt.Errorf("%w: y has %d floats, want m*rows = %d*%d", ErrSize, len(y), m, rows)
	}
	if m == 0 || rows == 0 {
		return nil
	}
	if threads <= 0 {
		threads = runtime.GOMAXPROCS(0)
	}
	if threads == 1 || rows == 1 {
		matMulRows(weight, w, rb, cols, xc, ab, m, y, rows, 0, rows) // no goroutine, no allocation
		return nil
	}
	ParallelFor(rows, threads, func(lo, hi int) {
		matMulRows(weight, w, rb, cols, xc, ab, m, y, rows, lo, hi)
	})
	return nil
}

// rowTile is the weight rows matMulRows passes over before moving on, so
// that with several activation rows a tile of weights is reused from
// cache (64 rows of 4096 Q4_K columns: 144 KiB).
const rowTile = 64

// matMulRows computes output rows [lo, hi) of MatMulConverted: for each
// weight row (rb bytes) the m converted activation rows (ab bytes each).
// Groups of 4 activation rows go through vecDot4Rows (else vecDot4 per
// weight row) where the weight type has a 4-row kernel (same bits as
// vecDot, one pass over the weights); the other activation rows go through
// vecDotRows. Both take a tile of weight rows per call (same bits as
// vecDot per element, validated once per call).
func matMulRows(weight Type, w []byte, rb, cols int, xc []byte, ab, m int, y []float32, rows, lo, hi int) {
	if matMulRowsArch(weight, w, rb, cols, xc, ab, m, y, rows, lo, hi) {
		return
	}
	m4 := 0
	if m >= 4 && has4(weight, cols) {
		m4 = m &^ 3
	}
	tile := rowTile
	if m == 1 {
		tile = hi - lo // one activation row: nothing to reuse, one call
	}
	var out [4]float32
	for r0 := lo; r0 < hi; r0 += tile {
		r1 := min(r0+tile, hi)
		for i := 0; i < m4; i += 4 {
			x4 := xc[i*ab : (i+4)*ab]
			if vecDot4Rows(weight, w[r0*rb:r1*rb], rb, x4, ab, cols, y[i*rows+r0:], rows, r1-r0) {
				continue
			}
			for r := r0; r < r1; r++ {
				wr := w[r*rb : (r+1)*rb]
				if !vecDot4(weight, wr, x4, ab, cols, &out) {
					for j := range 4 {
						out[j] = vecDot(weight, wr, x4[j*ab:(j+1)*ab], cols)
					}
				}
				for j := range 4 {
					y[(i+j)*rows+r] = out[j]
				}
			}
		}
		for i := m4; i < m; i++ {
			vecDotRows(weight, w[r0*rb:r1*rb], rb, xc[i*ab:(i+1)*ab], cols, y[i*rows+r0:i*rows+r1])
		}
	}
}
