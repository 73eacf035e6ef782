// Package expert holds a layer's expert slice and the pure expert function
//
//	(hidden [n x d] float32, ids [n x k] int32) -> out [n x k x d] float32
//
// that the backbone computes locally and workers compute remotely. It is the
// seam between the model and the swarm: anything that implements Computer can
// stand in for the local experts without changing what is computed.
package expert

import "context"

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
