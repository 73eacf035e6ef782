// Package expert holds a layer's expert slice and the pure expert function
//
//	(hidden [n x d] float32, ids [n x k] int32) -> out [n x k x d] float32
//
// that the backbone computes locally and workers compute remotely. It is the
// seam between the model and the swarm: anything that implements Computer can
// stand in for the local experts without changing what is computed.
package expert

import (
	"context"
	"fmt"
	"math"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Computer computes the SwiGLU experts of one MoE layer:
//
//	out[r][s] = down_e( silu(gate_e(x_r)) * up_e(x_r) ),  e = ids[r*k+s]
//
// for every row r in [0, n) and slot s in [0, k). hidden is n x d float32
// row-major (the ffn_norm output), ids is n x k int32 row-major, out is
// n x k x d float32 row-major and is fully overwritten on success.
//
// Implementations must be batch-invariant: a row's outputs are bit-identical
// whatever the other rows are and whatever n is. Errors: an unknown layer or
// expert id, mismatched slice lengths, or (for remote implementations) a
// failed or late request; on error out's contents are unspecified.
type Computer interface {
	ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error
}

// Delegator is implemented by a Computer that computes some calls with
// another Computer in full, such as a swarm dispatcher whose Fallback
// computes the layers no worker holds (backbone/dispatch). A caller holding
// that very Computer (its own experts) may then compute the call itself, on
// its own threads and without the delegator's per-pair bookkeeping; the
// outputs are the same bits by Computer's batch-invariance contract.
type Delegator interface {
	// Delegate reports whether a call on layer with ids (n x k expert ids,
	// row-major) made now would compute every (row, slot) pair with own.
	// True counts the call in the delegator's statistics as if it had been
	// made, and the caller must then compute it with own; false (also for
	// invalid ids) leaves the call to ComputeExperts.
	Delegate(layer int, ids []int32, own Computer) bool
}

// LayerDelegator is implemented by a Delegator that can tell before a
// call's expert ids are known that its calls on a layer will be delegated,
// such as a swarm dispatcher none of whose workers holds any expert of the
// layer (backbone/dispatch). A caller uses it to plan work that can share
// its threads' regions with its own experts only (the model's shared
// expert); Delegate stays the decision, and a plan it overrules still
// gives the same bits, only in more regions.
type LayerDelegator interface {
	Delegator
	// DelegatesLayer reports whether a call on layer made now would be
	// delegated to own whatever its ids (false for an invalid layer).
	DelegatesLayer(layer int, own Computer) bool
}

// Faulter is implemented by a Computer that may compute on a device and
// fall back to the CPU path (engine/vulkan): Fault declares the device
// faulty, err saying why, and every later call computes on the CPU, as
// after a failed submission. It reports whether there was a device to
// declare so (true also when it already was). A worker calls it when
// outputs hold a NaN or Inf that no expert file explains (the files
// verify): a device's bug, which the CPU path does not share.
type Faulter interface {
	Fault(err error) bool
}

// SumComputer is implemented by a Computer that can return each row's
// router-weighted sum over its k slots instead of the k outputs, such as a
// swarm dispatcher whose workers then send d floats per row instead of
// k x d (backbone/dispatch, wire DISPATCH_SUM).
type SumComputer interface {
	// ComputeExpertsSum computes, for every row r in [0, n),
	//
	//	out[r] = WeightedSum over s in [0, k) of weights[r*k+s] * expert_{ids[r*k+s]}(hidden[r])
	//
	// exactly as WeightedSum sums the outputs Computer.ComputeExperts
	// would return: hidden is n x d float32 row-major, ids and weights are
	// n x k row-major (the router's slot order), out is n x d and fully
	// overwritten on success. Batch-invariant as Computer: a row's sum is
	// bit-identical whatever the other rows are and whatever n is. Errors
	// as ComputeExperts; on error out's contents are unspecified.
	ComputeExpertsSum(ctx context.Context, layer int, hidden []float32, ids []int32, weights []float32, n, k int, out []float32) error
}

// WeightedSum sums each row's k expert outputs weighted by the router:
//
//	dst[r*d+j] = float32(w[r*k]*outs[(r*k)*d+j]) + float32(w[r*k+1]*outs[(r*k+1)*d+j]) + ... + float32(w[r*k+k-1]*outs[(r*k+k-1)*d+j])
//
// for r in [0, n), n = len(dst)/d, j in [0, d): every product is rounded to
// float32 before it is added (no fused multiply-add on any architecture)
// and the slots are added in order, left to right, in float32. This is
// llama.cpp's order (src/llama-graph.cpp build_moe_ffn at commit 3f545bec:
// experts = ggml_mul(experts, weights), then moe_out = ggml_add of the
// slot views in slot order), and the one definition the model, the worker
// and the dispatcher use, so that a sum computed anywhere has the same
// bits. outs is n x k x d and w is n x k, row-major; d and k must be > 0
// and the slices hold at least what n needs (else WeightedSum panics, as
// an index out of range does).
func WeightedSum(dst, outs, w []float32, k, d int) {
	n := len(dst) / d
	outs, w = outs[:n*k*d], w[:n*k]
	for r := range n {
		x := dst[r*d : (r+1)*d]
		o := outs[r*k*d : (r+1)*k*d]
		ws := w[r*k : (r+1)*k]
		quant.ScaleF32(x, o[:d], ws[0]) // the loops' bits, in AVX-512 where there is
		for s := 1; s < k; s++ {
			quant.ScaleAddF32(x, o[s*d:(s+1)*d], ws[s])
		}
	}
}

// ComputeSum computes the weighted sums of SumComputer.ComputeExpertsSum
// with c: by c's own ComputeExpertsSum when it implements SumComputer, else
// by ComputeExperts into a temporary n x k x d buffer and WeightedSum. The
// arguments, shapes and errors are ComputeExpertsSum's.
func ComputeSum(ctx context.Context, c Computer, layer int, hidden []float32, ids []int32, weights []float32, n, k int, out []float32) error {
	if sc, ok := c.(SumComputer); ok {
		return sc.ComputeExpertsSum(ctx, layer, hidden, ids, weights, n, k, out)
	}
	if n == 0 {
		return nil
	}
	if n < 0 || k <= 0 || len(out) == 0 || len(out)%n != 0 || len(weights) != n*k {
		return fmt.Errorf("expert: sum of %d rows x %d slots: %d weights, %d outputs", n, k, len(weights), len(out))
	}
	d := len(out) / n
	tmp := make([]float32, n*k*d)
	if err := c.ComputeExperts(ctx, layer, hidden, ids, n, k, tmp); err != nil {
		return err
	}
	WeightedSum(out, tmp, weights, k, d)
	return nil
}

// FirstNonFinite returns the index of the first NaN or ±Inf in v, or -1:
// an expert output, a row sum or a hidden state that no finite weights
// give. The dispatcher refuses such a RESULT, a worker does not send one
// (it re-checks its expert files), and the model fails a Forward whose
// final hidden state holds one.
func FirstNonFinite(v []float32) int {
	for i, x := range v {
		if math.Float32bits(x)&0x7f800000 == 0x7f800000 {
			return i
		}
	}
	return -1
}
