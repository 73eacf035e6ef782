package dispatch

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Row sums (wire 6, DISPATCH_SUM; expert.SumComputer).
//
// The model uses only each row's router-weighted sum of its k expert
// outputs. ComputeExpertsSum sends a row whose k experts one connected,
// unpaused worker holds all of to such a worker as a sum job: a
// DISPATCH_SUM carrying the rows' weights too, answered by a RESULT of one
// row of D floats per row (expert.WeightedSum of its k outputs) instead of
// k: upload bytes, TLS, the hub's copy and the backbone's decode shrink k
// times. The full holders of a row rotate by call and row (as pick rotates
// a pair's holders; by latency among them with Config.Hedge).
//
// A sum job lists all its rows' (row, slot) pairs in row-major order like
// any job, so that every path that handles pairs handles it unchanged:
// a failed sum job's pairs go to replicas (per-pair requests) or are
// recomputed locally, a checked one's reference is its pairs' local
// outputs. Pair outputs land in a per-call scratch buffer (n x k x D); a
// row answered by a sum job is written to the caller's out directly and
// marked, and every other row's sum is expert.WeightedSum of its pair
// outputs at the end of the call. The sums are the same bits either way.
//
// Verification: a checked sum job's reference is expert.WeightedSum of its
// pairs' local outputs, compared with the answer as a pair job's (bits for
// a CPU backend, else the tolerance per output row); a mismatch punishes
// exactly as for pairs and the reference pairs are used. Under quorum
// (quorum.go, wire 7) a row with two full CPU holders under different keys
// goes as a sum group: a DISPATCH_SUM to one, a DISPATCH_SUM_DIGEST to the
// other. What is not made a sum job: rows without a single full holder
// (per-pair as before; under quorum, without two), a checked request whose
// pairs the backbone cannot recompute (sendCrossChecked: twins and
// arbiters compare pair outputs), replicas after a failure, and everything
// with Config.NoRowSums.

var _ expert.SumComputer = (*Dispatcher)(nil)

// ComputeExpertsSum implements expert.SumComputer (see its contract): out[r]
// is expert.WeightedSum of row r's k expert outputs of layer with weights
// (n x k, the router's slot order), bit-identical to ComputeExperts
// followed by expert.WeightedSum. Rows whose experts one worker holds all
// of are sent to it as DISPATCH_SUM (above); the others take
// ComputeExperts' paths. Errors as ComputeExperts (ErrShape also for
// len(weights) != n*k or len(out) != n*D).
func (d *Dispatcher) ComputeExpertsSum(ctx context.Context, layer int, hidden []float32, ids []int32, weights []float32, n, k int, out []float32) error {
	D := d.cfg.Model.D
	if n < 0 || k != d.cfg.Model.K || layer < 0 || layer >= d.cfg.Model.NLayer ||
		len(hidden) != n*D || len(ids) != n*k || len(weights) != n*k || len(out) != n*D {
		return fmt.Errorf("%w: layer %d n %d k %d, len(hidden) %d len(ids) %d len(weights) %d len(out) %d (d %d)",
			ErrShape, layer, n, k, len(hidden), len(ids), len(weights), len(out), D)
	}
	if n == 0 {
		return nil
	}
	buf := getScratch(n * k * D)
	defer putScratch(buf)
	return d.compute(ctx, layer, hidden, ids, n, k, *buf, weights, out)
}

// scratch buffers for the pair outputs of sum calls (n x k x D floats).
var scratchPool sync.Pool

func getScratch(n int) *[]float32 {
	p, _ := scratchPool.Get().(*[]float32)
	if p == nil || cap(*p) < n {
		b := make([]float32, n)
		return &b
	}
	*p = (*p)[:n]
	return p
}

func putScratch(p *[]float32) { scratchPool.Put(p) }

// maxSumRows is the most rows one sum job carries: its DISPATCH_SUM fits
// wire.MaxMessage, and so does the RESULT of its rows x k pair outputs,
// which the worker holds in memory and the hub meters (so a worker never
// buffers more for a sum than for a DISPATCH). 0 when k outputs of width d
// do not fit one RESULT.
func maxSumRows(d, k int) int {
	return min((wire.MaxMessage-wire.DispatchSumSize(0, d, k))/(4*(d+2*k)), maxFramePairs(d)/k)
}

// sumsOn reports whether the call sends sum jobs.
func (cl *call) sumsOn() bool {
	d := cl.d
	return cl.sums != nil && !d.cfg.NoRowSums && maxSumRows(d.cfg.Model.D, cl.k) > 0
}

// fullHolder returns a connected, unpaused worker in idx holding all k
// experts of row r, rotating among such holders by call and row (pick);
// nil if there is none.
func (cl *call) fullHolder(idx map[uint64][]*conn, r int) *conn {
	k := cl.k
	var buf [8]*conn
	cands := buf[:0]
	for _, c := range idx[key(cl.layer, int(cl.ids[r*k]))] {
		all := true
		for s := 1; s < k && all; s++ {
			all = slices.Contains(idx[key(cl.layer, int(cl.ids[r*k+s]))], c)
		}
		if all {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return cl.d.pick(cands, r, cl.seq)
}

// rowPairs lists every (row, slot) pair of rows (ascending), row-major.
func (cl *call) rowPairs(rows []int32) []pair {
	ps := make([]pair, 0, len(rows)*cl.k)
	for _, r := range rows {
		for s := 0; s < cl.k; s++ {
			ps = append(ps, pair{r, int32(s)})
		}
	}
	return ps
}

// mergePairs merges two lists of pairs of distinct rows into one in
// row-major order.
func mergePairs(a, b []pair) []pair {
	ps := append(slices.Clip(a), b...)
	slices.SortFunc(ps, func(x, y pair) int {
		if x.r != y.r {
			return int(x.r - y.r)
		}
		return int(x.s - y.s)
	})
	return ps
}

// splitRows cuts rows (ascending) into runs of at most maxSumRows.
func (d *Dispatcher) splitRows(rows []int32) [][]int32 {
	m := maxSumRows(d.cfg.Model.D, d.cfg.Model.K)
	var out [][]int32
	for len(rows) > m {
		out = append(out, rows[:m])
		rows = rows[m:]
		d.splits.Add(1)
	}
	if len(rows) > 0 {
		out = append(out, rows)
	}
	return out
}

// sendSums sends c's full rows as sum jobs (split to fit a frame); check
// marks them for verification (their references are computed with the
// step's local batch: returned). The pairs of a job that cannot be sent go
// to *local (or wait for a holder).
func (cl *call) sendSums(c *conn, rows []int32, check bool, local *[]pair) (verify []*job) {
	d := cl.d
	for _, part := range d.splitRows(rows) {
		j := cl.newJob(c, cl.rowPairs(part), check)
		j.sum = true
		if err := cl.send(j); err != nil {
			cl.orphan(j.pairs, local)
			continue
		}
		cl.until = maxTime(cl.until, j.end)
		if j.check {
			verify = append(verify, j)
		}
	}
	return verify
}

// jobRows returns the rows of a sum job (its pairs hold every slot of each).
func (cl *call) jobRows(j *job) []int32 {
	rows := make([]int32, 0, len(j.pairs)/cl.k)
	for i := 0; i < len(j.pairs); i += cl.k {
		rows = append(rows, j.pairs[i].r)
	}
	return rows
}

// refSums returns a sum job's reference: expert.WeightedSum of its pairs'
// local outputs j.ref with its rows' weights (rows x D).
func (cl *call) refSums(j *job) []float32 { return cl.rowSums(cl.jobRows(j), j.ref) }

// rowSums returns expert.WeightedSum of rows' pair outputs pout (all k
// slots of each row, row-major: len(rows) x k x D) with their weights
// (len(rows) x D).
func (cl *call) rowSums(rows []int32, pout []float32) []float32 {
	D, k := cl.d.cfg.Model.D, cl.k
	w := make([]float32, 0, len(rows)*k)
	for _, r := range rows {
		w = append(w, cl.weights[int(r)*k:(int(r)+1)*k]...)
	}
	sums := make([]float32, len(rows)*D)
	expert.WeightedSum(sums, pout, w, k, D)
	return sums
}

// use places an answer the call uses: a sum job's rows into the caller's
// sums (marked done), any other job's pair outputs into out.
func (cl *call) use(j *job, out []float32) {
	if !j.sum {
		cl.scatter(j.pairs, out)
		return
	}
	D := cl.d.cfg.Model.D
	for i, r := range cl.jobRows(j) {
		copy(cl.sums[int(r)*D:(int(r)+1)*D], out[i*D:(i+1)*D])
		cl.summed[r] = true
	}
}

// finishSums computes the sum of every row no sum job answered from its
// pair outputs (the per-pair paths filled them in out).
func (cl *call) finishSums(n int) {
	D, k := cl.d.cfg.Model.D, cl.k
	for r := 0; r < n; r++ {
		if cl.summed != nil && cl.summed[r] {
			continue
		}
		expert.WeightedSum(cl.sums[r*D:(r+1)*D], cl.out[r*k*D:(r+1)*k*D], cl.weights[r*k:(r+1)*k], k, D)
	}
}
