package expert

import (
	"context"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Local computes experts in-process from the Layers it holds. It is the
// backbone's default Computer and the worker's expert function.
//
// Every output element out[r][s][i] is one dot product (quant.VecDot's, run
// through quant.MatMulConverted) over the row's
// activation converted exactly as ggml-cpu converts it (the gate/up input to
// gate's vec_dot_type, the SwiGLU product to down's), so results are
// bit-identical whatever n, the other rows, the grouping of rows by expert and
// the number of goroutines. Rows are grouped by expert only so that each
// weight row is read once per call.
//
// A Local is safe for concurrent use.
type Local struct {
	layers  []*Layer
	threads int
	pool    sync.Pool // *scratch
}

var _ Computer = (*Local)(nil)

// NewLocal returns a Computer over layers, indexed by layer number (nil
// entries: layers not held). threads <= 0 means runtime.GOMAXPROCS(0).
// Each non-nil layer is validated; errors wrap ErrShape or ErrType.
//
// When the held expert weights take at most 3/4 of the machine's memory,
// NewLocal also maps their pages in (Linux: madvise MADV_POPULATE_READ, as
// llama.cpp maps its model with MAP_POPULATE), reading them from disk where
// they are not cached yet, so that no token pays page faults.
func NewLocal(layers []*Layer, threads int) (*Local, error) {
	var total uint64
	for i, l := range layers {
		if l == nil {
			continue
		}
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		for e := range l.NExpert {
			if l.Held(e) {
				total += uint64(len(l.Gate.Expert[e]) + len(l.Up.Expert[e]) + len(l.Down.Expert[e]))
			}
		}
	}
	if ram := physicalMemory(); ram > 0 && total <= ram/4*3 {
		for _, l := range layers {
			if l != nil {
				prefaultLayer(l)
			}
		}
	}
	return &Local{layers: layers, threads: threads}, nil
}

// prefaultLayer prefaults the held experts' weights of l, one call per
// run of slices that follow each other in memory (a stacked GGUF tensor's
// experts).
func prefaultLayer(l *Layer) {
	var start, end uintptr // the current run
	for _, p := range []*Proj{&l.Gate, &l.Up, &l.Down} {
		for _, b := range p.Expert {
			if len(b) == 0 {
				continue
			}
			at := uintptr(unsafe.Pointer(&b[0]))
			if end > start && at == end {
				end += uintptr(len(b))
				continue
			}
			prefault(start, int(end-start))
			start, end = at, at+uintptr(len(b))
		}
	}
	prefault(start, int(end-start))
}

// Layer returns layer i, or nil when it is not held.
func (c *Local) Layer(i int) *Layer {
	if i < 0 || i >= len(c.layers) {
		return nil
	}
	return c.layers[i]
}

// NumLayers returns the number of layer slots (held or not).
func (c *Local) NumLayers() int { return len(c.layers) }

// Threads returns the number of goroutines a call uses.
func (c *Local) Threads() int {
	if c.threads <= 0 {
		return runtime.GOMAXPROCS(0)
	}
	return c.threads
}

// scratch is one call's working memory, pooled between calls.
type scratch struct {
	xg, xu, hc []byte
	xgs, xus   []byte    // converted rows in grouped (order) order
	tg, tu, td []float32 // unit-private MatMulConverted outputs (gate, up, down)
	count      []int32
	start      []int32
	order      []int32 // pair indices (r*k+s) grouped by expert, ascending within a group
	units      []unit
	claimed    []atomic.Bool  // per phase-1 unit: taken by a goroutine
	left       []atomic.Int32 // per active expert: phase-1 units not done
	doneMu     sync.Mutex     // with done: await blocks until a left reaches 0
	done       *sync.Cond
	active     []int32    // experts with at least one pair
	mu         sync.Mutex // guards err
	err        error      // first error of the call's parallel phases
}

// fail records the first error of a call in s.err.
func (s *scratch) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

// unit is a slice [lo, hi) of one expert's output rows (or of pairs in the
// activation phase, where e is unused).
type unit struct{ e, lo, hi int32 }

func grow[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
}

// ComputeExperts implements Computer. hidden is n x DModel float32, ids is
// n x k int32, out is n x k x DModel float32. Errors wrap ErrUnknownLayer,
// ErrUnknownExpert or ErrShape, or are ctx.Err().
func (c *Local) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	threads := c.Threads()
	return c.ComputeExpertsWith(ctx, func(n int, fn func(worker, unit int)) { parallel(n, threads, fn) }, threads,
		layer, hidden, ids, n, k, out)
}

// Runner runs fn(worker, unit) for every unit in [0, n), on goroutines
// numbered worker in [0, threads), and returns when every call has
// returned; units may run in any order and concurrently.
type Runner func(n int, fn func(worker, unit int))

// minParallelConvert is the batch (rows) from which the input rows are
// converted in parallel.
const minParallelConvert = 32

// minParallelMACs is the smallest phase (multiply-adds, or activations for
// the SwiGLU phase times 64) handed to the Runner; smaller phases run on
// the caller: a few microseconds of work do not pay for waking a goroutine.
const minParallelMACs = 1 << 18

// ComputeExpertsWith is ComputeExperts with its parallel phases run by run
// over threads goroutines (for example a model's helper goroutines, so
// that a decode step starts no goroutine of its own). threads only sets how
// the work is cut; results are bit-identical whatever run and threads are.
// Same shapes and errors as ComputeExperts.
func (c *Local) ComputeExpertsWith(ctx context.Context, run Runner, threads int, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	threads = max(1, threads)
	if err := ctx.Err(); err != nil {
		return err
	}
	l := c.Layer(layer)
	if l == nil {
		return fmt.Errorf("%w: %d", ErrUnknownLayer, layer)
	}
	d, dff := l.DModel, l.DFF
	if n < 0 || k <= 0 || len(hidden) != n*d || len(ids) != n*k || len(out) != n*k*d {
		return fmt.Errorf("%w: n %d, k %d, d %d: hidden %d, ids %d, out %d", ErrShape, n, k, d, len(hidden), len(ids), len(out))
	}
	if n == 0 {
		return nil
	}
	for _, e := range ids {
		if !l.Held(int(e)) {
			return fmt.Errorf("%w: layer %d expert %d", ErrUnknownExpert, layer, e)
		}
	}
	s, _ := c.pool.Get().(*scratch)
	if s == nil {
		s = new(scratch)
		s.done = sync.NewCond(&s.doneMu)
	}
	defer c.pool.Put(s)

	gT, uT, dT := l.Gate.Type, l.Up.Type, l.Down.Type
	gab, err := quant.ActivationBytes(gT, d)
	if err != nil {
		return err
	}
	uab, err := quant.ActivationBytes(uT, d)
	if err != nil {
		return err
	}
	hab, err := quant.ActivationBytes(dT, dff)
	if err != nil {
		return err
	}
	grb, _ := gT.RowBytes(d)
	urb, _ := uT.RowBytes(d)
	drb, _ := dT.RowBytes(dff)

	// Convert every input row once per activation type (row ranges in
	// parallel for a large batch: rows convert independently).
	s.err = nil
	convert := func(t quant.Type, dst []byte, ab int) error {
		units := 1
		if threads > 1 && n >= minParallelConvert {
			units = min(n, 4*threads)
		}
		if units == 1 {
			return quant.ConvertActivation(t, hidden, dst)
		}
		run(units, func(_, u int) {
			lo, hi := n*u/units, n*(u+1)/units
			if err := quant.ConvertActivation(t, hidden[lo*d:hi*d], dst[lo*ab:hi*ab]); err != nil {
				s.fail(err)
			}
		})
		return s.err
	}
	s.xg = grow(s.xg, n*gab)
	if err := convert(gT, s.xg, gab); err != nil {
		return err
	}
	xu := s.xg
	if uT.VecDotType() != gT.VecDotType() {
		s.xu = grow(s.xu, n*uab)
		if err := convert(uT, s.xu, uab); err != nil {
			return err
		}
		xu = s.xu
	}

	// Group the n*k (row, slot) pairs by expert (counting sort; stable, so
	// pairs stay in ascending order within an expert).
	np := n * k
	s.count = grow(s.count, l.NExpert)
	clear(s.count)
	for _, e := range ids {
		s.count[e]++
	}
	s.start = grow(s.start, l.NExpert+1)
	s.active = s.active[:0]
	var acc int32
	for e, cnt := range s.count {
		s.start[e] = acc
		acc += cnt
		if cnt > 0 {
			s.active = append(s.active, int32(e))
		}
	}
	s.start[l.NExpert] = acc
	s.order = grow(s.order, np)
	fill := s.count // reuse as a cursor
	copy(fill, s.start[:l.NExpert])
	for p, e := range ids {
		s.order[fill[e]] = int32(p)
		fill[e]++
	}

	// Activations in grouped order: pair q = order[...] of expert e sits at
	// q in [start[e], start[e+1]), so each expert's rows are contiguous.
	// (In parallel pair ranges for a large batch.) One row whose experts
	// are distinct (a decode step) needs no copies: every expert reads
	// that row (acts).
	one := n == 1 && len(s.active) == np
	s.xgs = grow(s.xgs, np*gab)
	xus := s.xgs
	if uT.VecDotType() != gT.VecDotType() {
		s.xus = grow(s.xus, np*uab)
		xus = s.xus
	}
	// acts returns expert pairs [q0, q1)'s gate and up activations.
	acts := func(q0, q1 int) (ag, au []byte) {
		if one {
			return s.xg[:gab], xu[:uab]
		}
		return s.xgs[q0*gab : q1*gab], xus[q0*uab : q1*uab]
	}
	gather := func(lo, hi int) {
		for q := lo; q < hi; q++ {
			r := int(s.order[q]) / k
			copy(s.xgs[q*gab:(q+1)*gab], s.xg[r*gab:(r+1)*gab])
			if uT.VecDotType() != gT.VecDotType() {
				copy(s.xus[q*uab:(q+1)*uab], xu[r*uab:(r+1)*uab])
			}
		}
	}
	if units := min(np, 4*threads); threads > 1 && n >= minParallelConvert {
		run(units, func(_, u int) { gather(np*u/units, np*(u+1)/units) })
	} else if !one {
		gather(0, np)
	}

	// Phase 1: gate and up projections, units over (expert, DFF row range),
	// each one quant.MatMulConverted (weight row outer, rows inner) into a
	// unit-private region of tg/tu; then, still in the unit, h = silu(gate)
	// * up of its rows and their conversion for down, straight into hc.
	// Unit row ranges are whole activation blocks of down's vec_dot_type
	// (256 for Q8_K), so converting a range writes exactly the bytes that
	// converting the whole row would.
	//
	// Phase 2: down projection, units over (expert, DModel row range),
	// scattered to out[p*d + i] for pair p = order[q].
	//
	// Both phases run as one region (one barrier per call instead of two,
	// and no thread idles while the other finishes the gate/up tail): its
	// first len(units1) units are phase 1's, the rest phase 2's. A phase-2
	// unit needs its expert's whole h, so it first runs the expert's
	// phase-1 units that no goroutine has claimed yet, then waits for the
	// claimed ones to finish (a unit is claimed only by the goroutine that
	// then computes it, so they are under way): any order of units works.
	//
	// With at least two experts per goroutine (a decode step's top-8 on 2
	// or 3 threads) every unit is a whole expert's matrix: each kernel call
	// starts its row streams cold (about 0.5-1 us of memory latency before
	// they flow, quant's BenchmarkKernelSplit), so fewer, longer calls
	// read the same bytes in less CPU time. With fewer experts they are cut
	// into row ranges so that every goroutine has work.
	blk := dT.VecDotType().BlockSize()
	bb := hab / (dff / blk) // bytes of one converted block
	t1, t2 := 6*threads, 16*threads
	if len(s.active) >= 2*threads {
		t1, t2 = len(s.active), len(s.active) // whole experts
	}
	s.units = splitUnits(s.units[:0], s.active, dff, blk, t1)
	n1 := len(s.units)
	s.units = splitUnits(s.units, s.active, d, 1, t2)
	c1, c2 := n1/len(s.active), (len(s.units)-n1)/len(s.active) // units per expert
	s.claimed = grow(s.claimed, n1)
	for i := range s.claimed {
		s.claimed[i].Store(false)
	}
	s.left = grow(s.left, len(s.active))
	for i := range s.left {
		s.left[i].Store(int32(c1))
	}
	s.tg = grow(s.tg, np*dff)
	s.tu = grow(s.tu, np*dff)
	s.td = grow(s.td, np*d)
	s.hc = grow(s.hc, np*hab)
	s.err = nil
	fail := s.fail
	gateUp := func(ui int) {
		un := s.units[ui]
		defer s.finish(ui / c1)
		q0, q1 := int(s.start[un.e]), int(s.start[un.e+1])
		cnt, lo, hi := q1-q0, int(un.lo), int(un.hi)
		w := hi - lo
		reg := q0*dff + cnt*lo
		tg, tu := s.tg[reg:reg+cnt*w], s.tu[reg:reg+cnt*w]
		ag, au := acts(q0, q1)
		if err := quant.MatMulConverted(gT, l.Gate.Expert[un.e][lo*grb:hi*grb], w, d, ag, cnt, tg, 1); err != nil {
			fail(err)
			return
		}
		if err := quant.MatMulConverted(uT, l.Up.Expert[un.e][lo*urb:hi*urb], w, d, au, cnt, tu, 1); err != nil {
			fail(err)
			return
		}
		for i := range cnt {
			g := tg[i*w : (i+1)*w]
			SwiGLU(g, g, tu[i*w:(i+1)*w])
			h := s.hc[(q0+i)*hab+lo/blk*bb : (q0+i)*hab+hi/blk*bb]
			if err := quant.ConvertActivation(dT, g, h); err != nil {
				fail(err)
				return
			}
		}
	}
	down := func(ui int) {
		un := s.units[ui]
		q0, q1 := int(s.start[un.e]), int(s.start[un.e+1])
		cnt, lo, hi := q1-q0, int(un.lo), int(un.hi)
		w := hi - lo
		reg := q0*d + cnt*lo
		td := s.td[reg : reg+cnt*w]
		if err := quant.MatMulConverted(dT, l.Down.Expert[un.e][lo*drb:hi*drb], w, dff, s.hc[q0*hab:q1*hab], cnt, td, 1); err != nil {
			fail(err)
			return
		}
		for i := range cnt {
			p := int(s.order[q0+i])
			copy(out[p*d+lo:p*d+hi], td[i*w:(i+1)*w])
		}
	}
	run = pick(3*np*dff*d, threads, run)
	run(len(s.units), func(_, ui int) {
		if ui < n1 {
			if s.claimed[ui].CompareAndSwap(false, true) {
				gateUp(ui)
			}
			return
		}
		a := (ui - n1) / c2 // the expert's place in active
		for u := a * c1; u < (a+1)*c1; u++ {
			if s.claimed[u].CompareAndSwap(false, true) {
				gateUp(u)
			}
		}
		s.await(a)
		down(ui)
	})
	if s.err != nil {
		return s.err
	}
	return ctx.Err()
}

// awaitSpin bounds how long await spins (yielding) before it blocks:
// about the time a gate/up unit takes, so that a goroutine waiting for a
// descheduled one on a loaded machine gives its core back.
const awaitSpin = 100 * time.Microsecond

// finish marks one phase-1 unit of active expert a done, waking the
// goroutines await blocks when it was the last.
func (s *scratch) finish(a int) {
	if s.left[a].Add(-1) == 0 {
		s.doneMu.Lock()
		s.done.Broadcast()
		s.doneMu.Unlock()
	}
}

// await returns when every phase-1 unit of active expert a is done: it
// spins (yielding) for up to awaitSpin, then blocks.
func (s *scratch) await(a int) {
	var t0 time.Time
	for i := 0; s.left[a].Load() > 0; i++ {
		if i%16 == 0 {
			if i == 0 {
				t0 = time.Now()
			} else if time.Since(t0) > awaitSpin {
				s.doneMu.Lock()
				for s.left[a].Load() > 0 {
					s.done.Wait()
				}
				s.doneMu.Unlock()
				return
			}
		}
		runtime.Gosched()
	}
}

// pick returns run for a phase of the given work (multiply-adds) when
// there are threads to share it, else serial.
func pick(work, threads int, run Runner) Runner {
	if threads > 1 && work >= minParallelMACs {
		return run
	}
	return serial
}

// splitUnits cuts each active expert's rows output rows into ranges of a
// multiple of align rows (align divides rows) so that there are about
// target units in all (at least 16 rows each, when align allows).
func splitUnits(dst []unit, active []int32, rows, align, target int) []unit {
	per := 1
	if len(active) > 0 {
		per = (target + len(active) - 1) / len(active)
	}
	per = max(1, min(per, rows/max(16, align)))
	step := (rows + per - 1) / per
	step = (step + align - 1) / align * align
	for _, e := range active {
		for lo := 0; lo < rows; lo += step {
			dst = append(dst, unit{e: e, lo: int32(lo), hi: int32(min(rows, lo+step))})
		}
	}
	return dst
}

// serial calls fn(0, u) for u in [0, n) in order (a Runner on the caller).
func serial(n int, fn func(worker, unit int)) {
	for u := range n {
		fn(0, u)
	}
}

// parallel runs fn over [0, n) on up to threads goroutines (worker
// numbers in [0, threads)), handing out units in order from a shared
// counter. With one thread or one unit it runs inline.
func parallel(n, threads int, fn func(worker, unit int)) {
	if threads <= 1 || n <= 1 {
		serial(n, fn)
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	w := min(threads, n)
	wg.Add(w - 1)
	work := func(worker int) {
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			fn(worker, i)
		}
	}
	for wk := 1; wk < w; wk++ {
		go func() { defer wg.Done(); work(wk) }()
	}
	work(0)
	wg.Wait()
}

// SwiGLU sets dst[i] = silu(gate[i]) * up[i] with silu(x) = x / (1 + e^-x),
// in float32 as ggml_vec_swiglu_f32 (ggml/src/ggml-cpu/vec.h) computes it;
// e^-x is evaluated in float64 (math.Exp) and rounded, so results can
// differ from ggml's vectorised expf in the last bit. dst may alias gate or
// up (element by element). On the AVX-512 kernel path the elements go 8 at
// a time through swigluAVX512, which computes math.Exp's float64 steps
// exactly (same bits).
func SwiGLU(dst, gate, up []float32) {
	n := len(gate)
	if n == 0 {
		return
	}
	_ = dst[n-1]
	_ = up[n-1]
	for i := 0; i < n; {
		i += swigluFast(dst[i:n], gate[i:n], up[i:n])
		end := min(n, i+8) // a group the kernel declined, or the tail
		for ; i < end; i++ {
			x := gate[i]
			e := float32(math.Exp(float64(-x)))
			dst[i] = x / (1 + e) * up[i]
		}
	}
}

// SiLU sets dst[i] = silu(x[i]) = x[i] / (1 + e^-x[i]) in float32 as
// ggml_silu_f32 (ggml-cpu/vec.h), with e^-x evaluated in float64
// (math.Exp) and rounded, as SwiGLU does: SiLU(dst, x) gives the bits of
// SwiGLU(dst, x, ones). dst may alias x (element by element). On the
// AVX-512 kernel path the elements go 8 at a time through siluAVX512 (the
// SwiGLU kernel without the multiply: same bits).
func SiLU(dst, x []float32) {
	n := len(x)
	if n == 0 {
		return
	}
	_ = dst[n-1]
	for i := 0; i < n; {
		i += siluFast(dst[i:n], x[i:n])
		end := min(n, i+8) // a group the kernel declined, or the tail
		for ; i < end; i++ {
			v := x[i]
			dst[i] = v / (1 + float32(math.Exp(float64(-v))))
		}
	}
}

// ExpShifted sets dst[i] = float32(math.Exp(float64(src[i] - m))) for i <
// len(src), the difference rounded to float32 first (the exponentials of
// a softmax with its maximum m subtracted, ggml_soft_max; model.softmax).
// dst must hold len(src) floats and may alias src (element by element).
// On the AVX-512 kernel path the elements go 8 at a time through
// expShiftedAVX512 (SwiGLU's exponential of m - src[i], which is exactly
// -(src[i] - m): same bits).
func ExpShifted(dst, src []float32, m float32) {
	n := len(src)
	if n == 0 {
		return
	}
	_ = dst[n-1]
	for i := 0; i < n; {
		i += expShiftedFast(dst[i:n], src[i:n], m)
		end := min(n, i+8) // a group the kernel declined, or the tail
		for ; i < end; i++ {
			dst[i] = float32(math.Exp(float64(src[i] - m)))
		}
	}
}

// GateSigmoid sets dst[i] = dst[i] * sigmoid(gate[i]) for i < len(gate),
// sigmoid(x) = 1 / (1 + e^-x) in float32 as ggml's op_sigmoid
// (ggml-cpu/unary-ops.cpp) followed by ggml_mul computes it, e^-x
// evaluated in float64 (math.Exp) and rounded, as SiLU does (a gated
// attention's output gate, llama.cpp src/models/qwen35moe.cpp
// build_layer_attn). dst must hold len(gate) floats. On the AVX-512 kernel
// path the elements go 8 at a time through gateSigmoidAVX512 (SiLU's
// exponential, then 1 / (1 + e) and the product: same bits).
func GateSigmoid(dst, gate []float32) {
	n := len(gate)
	if n == 0 {
		return
	}
	_ = dst[n-1]
	for i := 0; i < n; {
		i += gateSigmoidFast(dst[i:n], gate[i:n])
		end := min(n, i+8) // a group the kernel declined, or the tail
		for ; i < end; i++ {
			dst[i] *= 1 / (1 + float32(math.Exp(float64(-gate[i]))))
		}
	}
}
