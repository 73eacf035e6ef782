package dispatch

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/engine/idlespin"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// pair is one (row, slot) of a call.
type pair struct{ r, s int32 }

// job is one request of a call to one worker: one DISPATCH frame.
type job struct {
	c       *conn
	req     uint64
	nrows   int           // distinct rows in the DISPATCH
	bytes   int           // DISPATCH message bytes
	pairs   []pair        // in row-major (row, slot) order = RESULT order
	sum     bool          // a DISPATCH_SUM (sum.go): pairs are all slots of nrows rows, the RESULT one row of D per row
	done    chan reply    // receives exactly one reply once the request leaves pending
	wake    chan struct{} // the call's: poked after each reply
	sent    time.Time     // when the DISPATCH was written
	encode  time.Duration // building the DISPATCH message
	write   atomic.Int64  // ns writing it to the hub link (lock, write, flush): set after it is pending
	end     time.Time     // its deadline
	check   bool          // the result is verified before it is used
	ref     []float32     // the local outputs of pairs (len(pairs) x D) once computed; nil before
	replica bool          // a failover request: if it fails too, the pairs go local
	// Replica comparison (capacity.go): twin is the same request sent to
	// another holder; rep keeps this job's reply until the twin's is in.
	// arb marks an arbiter request deciding a dispute.
	twin *job
	rep  *reply
	arb  *arbPart
	// Quorum (quorum.go): the ask this job answers for and the indices of
	// its pairs in the group; digest: sent as DISPATCH_DIGEST; wantSum:
	// the reader hashes its RESULT payload (wire.ResultDigest).
	qa      *ask
	qi      []int
	digest  bool
	wantSum bool
	// Hedging (hedge.go): hedgeAt is when to hedge (zero: never, or
	// done); sib the other request of a hedged pair; hedged: the verdict
	// of the answer waits for the call (set under c.mu while pending);
	// lost: the sibling's answer was used; dropped: given up, no reply
	// comes; resolved: its reply was handled.
	hedgeAt                         time.Time
	sib                             *job
	hedged, lost, dropped, resolved bool
}

// reply is a worker's answer to a job, or why there is none.
type reply struct {
	out    []float32 // len(pairs) x D on success (nrows x D for a sum job; nil for a DIGEST)
	at     time.Time // when the session's reader had the answer whole
	sum    [32]byte  // a DIGEST's, or the RESULT payload's digest when the job wanted it
	hasSum bool
	err    error
}

// deliver hands j its reply (exactly once) and wakes the waiting call.
func (j *job) deliver(rep reply) {
	j.done <- rep
	select {
	case j.wake <- struct{}{}:
	default:
	}
}

// call is the state of one ComputeExperts.
type call struct {
	d      *Dispatcher
	ctx    context.Context
	layer  int
	hidden []float32
	ids    []int32
	k      int
	out    []float32 // n x k x D pair outputs (the caller's, or scratch for a sum call)
	seq    uint64
	wake   chan struct{}
	live   []*job         // requests awaiting their reply
	failed map[*conn]bool // workers that failed a request of this call: no replica work for them
	retry  []pair         // pairs left to recompute locally
	until  time.Time      // the step's deadline: the latest deadline of its first requests
	nLocal int            // outputs computed locally and used
	// Capacity (capacity.go): pairs waiting for a holder, since when, the
	// twins whose reply waits for the other's, and the open disputes.
	missing   []waiting
	waitStart time.Time
	held      []*job
	disputes  []*dispute
	groups    []*qgroup // quorum requests (quorum.go)
	// Row sums (sum.go): the caller's n x D out and n x k weights of a
	// ComputeExpertsSum call (nil otherwise), and the rows a sum job
	// answered (their pair outputs in out are not used).
	sums, weights []float32
	summed        []bool
	// used holds the outputs of the replies the call took, from d.outs,
	// given back when the call ends (recycle).
	used [][]float32
}

// recycle gives the outputs of the replies the call took back to
// d.outs: the call copied what it used into out (or sums) and keeps none.
func (cl *call) recycle() {
	for _, o := range cl.used {
		cl.d.outs.Put(o)
	}
	cl.used = nil
}

// ComputeExperts implements expert.Computer (see its contract): out[r][s] is
// the output of expert ids[r*k+s] of layer on row r. k must equal the model's
// K. Each pair goes to a connected, unpaused worker holding that expert (the
// replica rotates per call), or to Fallback when none does; the pairs of a
// worker that fails, is late or is refused go to another holder while the
// step's deadline allows, else to Fallback. Results chosen for verification
// are compared with Fallback's outputs before use (verify.go). Errors:
// ErrShape (wrapped) for bad arguments, ctx.Err(), or Fallback's error.
func (d *Dispatcher) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	D := d.cfg.Model.D
	if n < 0 || k != d.cfg.Model.K || layer < 0 || layer >= d.cfg.Model.NLayer ||
		len(hidden) != n*D || len(ids) != n*k || len(out) != n*k*D {
		return fmt.Errorf("%w: layer %d n %d k %d, len(hidden) %d len(ids) %d len(out) %d (d %d)",
			ErrShape, layer, n, k, len(hidden), len(ids), len(out), D)
	}
	if n == 0 {
		return nil
	}
	return d.compute(ctx, layer, hidden, ids, n, k, out, nil, nil)
}

// compute is ComputeExperts after its shape checks, and with sums (n x D)
// and weights (n x k) ComputeExpertsSum's (sum.go): every row's weighted
// sum goes to sums, out being the pair outputs' scratch.
func (d *Dispatcher) compute(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out, weights, sums []float32) error {
	D := d.cfg.Model.D
	for _, e := range ids {
		if e < 0 || int(e) >= d.cfg.Model.NExpert {
			return fmt.Errorf("%w: expert id %d", ErrShape, e)
		}
	}
	d.rows[layer].Add(uint64(n))
	for _, e := range ids {
		d.usage[layer*d.cfg.Model.NExpert+int(e)].Add(1)
	}
	cl := &call{d: d, ctx: ctx, layer: layer, hidden: hidden, ids: ids, k: k, out: out, sums: sums, weights: weights,
		seq: d.calls.Add(1), wake: make(chan struct{}, 1), failed: map[*conn]bool{}}
	defer cl.recycle()
	d.mu.Lock()
	idx := d.index
	d.mu.Unlock()

	var local []pair
	byConn := map[*conn][]pair{}
	var sumRows map[*conn][]int32 // rows each full holder gets as sum jobs
	var order []*conn
	seen := func(c *conn) {
		if byConn[c] == nil && sumRows[c] == nil {
			order = append(order, c)
		}
	}
	sumsOn := cl.sumsOn()
	if sumsOn {
		sumRows, cl.summed = map[*conn][]int32{}, make([]bool, n)
	}
	for r := 0; r < n && !d.quorum(); r++ {
		if sumsOn {
			if c := cl.fullHolder(idx, r); c != nil {
				seen(c)
				sumRows[c] = append(sumRows[c], int32(r))
				continue
			}
		}
		for s := 0; s < k; s++ {
			e := int(ids[r*k+s])
			hs := idx[key(layer, e)]
			if len(hs) == 0 {
				if d.localOK(layer, e) {
					local = append(local, pair{int32(r), int32(s)})
				} else {
					cl.wait(waiting{pairs: []pair{{int32(r), int32(s)}}})
				}
				continue
			}
			c := d.pick(hs, e, cl.seq)
			seen(c)
			byConn[c] = append(byConn[c], pair{int32(r), int32(s)})
		}
	}
	if d.spin && (len(order) > 0 || d.quorum() && len(idx) > 0) {
		// Requests go out: keep the CPUs from halting while the workers
		// compute, when recent calls waited long enough for that to pay
		// (Config.SpinMinWait). Woken now, the spinners are up before the
		// first answer is due.
		if d.waitEWMA.Load() >= int64(d.cfg.SpinMinWait) {
			defer idlespin.Hold()()
		}
		defer d.noteWait(time.Now())
	}
	var verify []*job // first requests chosen for a check: their references are computed now
	var audits []*qgroup
	if d.quorum() {
		local, audits = cl.startQuorum(idx)
	}
	for _, c := range order {
		check := c.chooseCheck()
		ps, rows := byConn[c], sumRows[c]
		if len(rows) > 0 && check && !cl.allLocal(cl.rowPairs(rows)) {
			// Its check needs a twin (capacity.go), which compares
			// pair outputs: no sums for this worker in this call.
			ps, rows = mergePairs(ps, cl.rowPairs(rows)), nil
		}
		verify = append(verify, cl.sendSums(c, rows, check, &local)...)
		if len(ps) == 0 {
			continue
		}
		if check && !cl.allLocal(ps) {
			verify = append(verify, cl.sendCrossChecked(c, ps, &local)...)
			continue
		}
		for _, part := range d.splitPairs(ps) {
			j := cl.newJob(c, part, check)
			if err := cl.send(j); err != nil {
				cl.orphan(part, &local)
				continue
			}
			cl.until = maxTime(cl.until, j.end)
			if j.check {
				verify = append(verify, j)
			}
		}
	}
	// Compute locally while the workers compute: the unheld pairs and the
	// references of the checked requests, in one batch.
	batch := local
	if len(verify) > 0 || len(audits) > 0 {
		batch = append([]pair(nil), local...)
		for _, j := range verify {
			batch = append(batch, j.pairs...)
		}
		for _, g := range audits {
			batch = append(batch, g.pairs...)
		}
	}
	if len(batch) > 0 {
		t0 := time.Now()
		tmp, err := d.computePairs(ctx, layer, hidden, ids, k, batch)
		if err != nil {
			cl.abandon()
			return err
		}
		if nv := len(batch) - len(local); nv > 0 {
			d.checkNanos.Add(int64(time.Since(t0)) * int64(nv) / int64(len(batch)))
		}
		cl.scatter(local, tmp[:len(local)*D])
		cl.nLocal += len(local)
		off := len(local) * D
		for _, j := range verify {
			j.ref = tmp[off : off+len(j.pairs)*D]
			off += len(j.pairs) * D
		}
		for _, g := range audits {
			g.auditRef = tmp[off : off+len(g.pairs)*D]
			off += len(g.pairs) * D
			if g.rows != nil {
				g.auditRef = cl.rowSums(g.rows, g.auditRef)
			}
		}
	}
	for {
		if err := cl.waitAll(); err != nil {
			cl.abandon()
			return err
		}
		if len(cl.retry) > 0 {
			tmp, err := d.computePairs(ctx, layer, hidden, ids, k, cl.retry)
			if err != nil {
				cl.abandon()
				return err
			}
			cl.scatter(cl.retry, tmp)
			cl.nLocal += len(cl.retry)
			cl.retry = nil
		}
		if len(cl.missing) == 0 {
			break
		}
		if err := cl.awaitHolders(); err != nil {
			cl.abandon()
			return err
		}
	}
	if !cl.waitStart.IsZero() {
		d.holderWaitNanos.Add(int64(time.Since(cl.waitStart)))
	}
	d.local.Add(uint64(cl.nLocal))
	if sums != nil {
		cl.finishSums(n)
	}
	return nil
}

// noteWait adds the wait of a call that sent its first request at t0 to
// the dispatcher's moving average (Config.SpinMinWait).
func (d *Dispatcher) noteWait(t0 time.Time) {
	w := int64(time.Since(t0))
	for {
		old := d.waitEWMA.Load()
		if d.waitEWMA.CompareAndSwap(old, old+(w-old)/8) {
			return
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (cl *call) newJob(c *conn, pairs []pair, check bool) *job {
	return &job{c: c, pairs: pairs, check: check, done: make(chan reply, 1), wake: cl.wake}
}

// scatter copies outputs (len(pairs) x D, in pairs' order) into out.
func (cl *call) scatter(pairs []pair, outs []float32) {
	D := cl.d.cfg.Model.D
	for i, p := range pairs {
		copy(cl.out[(int(p.r)*cl.k+int(p.s))*D:][:D], outs[i*D:(i+1)*D])
	}
}

// msgPool holds DISPATCH message buffers between sends: sendData writes a
// message whole before it returns, and nothing keeps it.
var msgPool wire.SlicePool[byte]

// send writes j's DISPATCH, registers it as pending and adds it to the live
// requests; its deadline is the worker's adaptive one, cut to the step's
// deadline for a replica request.
func (cl *call) send(j *job) error {
	d := cl.d
	D := d.cfg.Model.D
	rows := make([]int32, 0, len(j.pairs))
	for _, p := range j.pairs {
		if len(rows) == 0 || rows[len(rows)-1] != p.r {
			rows = append(rows, p.r)
		}
	}
	j.req = d.reqs.Add(1)
	t0 := time.Now()
	hdr := &wire.Dispatch{Request: j.req, Layer: uint16(cl.layer), N: len(rows), D: D, K: cl.k, Digest: j.digest, Sum: j.sum}
	mp := msgPool.Get(hdr.Size())
	defer msgPool.Put(mp)
	msg := hdr.Append((*mp)[:0]) // the header: the rows' hidden, ids (and weights) follow
	for _, r := range rows {
		msg = wire.AppendFloats(msg, cl.hidden[int(r)*D:(int(r)+1)*D])
	}
	pi := 0
	for _, r := range rows {
		for s := 0; s < cl.k; s++ {
			id := int32(-1)
			if pi < len(j.pairs) && j.pairs[pi].r == r && int(j.pairs[pi].s) == s {
				id = cl.ids[int(r)*cl.k+s]
				pi++
			}
			msg = append(msg, byte(id), byte(id>>8), byte(id>>16), byte(id>>24))
		}
	}
	answer := wire.ResultSize(len(j.pairs), D)
	if j.sum {
		for _, r := range rows {
			msg = wire.AppendFloats(msg, cl.weights[int(r)*cl.k:(int(r)+1)*cl.k])
		}
		answer = wire.ResultSize(len(rows), D)
	}
	j.bytes = len(msg)
	if j.digest {
		answer = wire.DigestSize
	}
	deadline := j.c.deadline(d.cfg, len(msg)+answer)
	j.nrows = len(rows)
	j.sent = time.Now()
	j.encode = j.sent.Sub(t0)
	j.end = j.sent.Add(deadline)
	if j.replica && j.end.After(cl.until) {
		j.end = cl.until
	}
	if !j.c.addPending(j) {
		return ErrClosed
	}
	if err := j.c.sendData(msg, deadline); err != nil {
		j.c.take(j.req, false)
		j.c.close(wire.CodeShutdown, "link write failed: "+err.Error())
		return err
	}
	j.write.Store(int64(time.Since(j.sent)))
	j.c.reqsSent.Add(1)
	if j.sum {
		d.sumReqs.Add(1)
		d.sumRows.Add(uint64(j.nrows))
	}
	if d.cfg.Hedge && j.qa == nil && j.twin == nil && j.arb == nil && !j.replica && !j.hedged {
		if hd := j.c.hedgeDelay(len(msg) + answer); hd > 0 {
			j.hedgeAt = j.sent.Add(hd)
		}
	}
	cl.live = append(cl.live, j)
	return nil
}

// waitAll resolves every live request: by its reply, or at its deadline.
// Resolving may send replica requests, which it then waits for too. Only
// ctx's end (or a local computation's failure) is an error.
func (cl *call) waitAll() error {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for len(cl.live) > 0 {
		now := time.Now()
		var next time.Time
		progress := false
		pending := cl.live
		cl.live = nil
		for i, j := range pending {
			if j.dropped {
				continue // a hedged request given up: no reply comes
			}
			var rep reply
			select {
			case rep = <-j.done:
			default:
				if now.Before(j.end) {
					if j.hedgeable() && !now.Before(j.hedgeAt) && cl.hedge(j) {
						progress = true
					}
					cl.live = append(cl.live, j)
					if next.IsZero() || j.end.Before(next) {
						next = j.end
					}
					if j.hedgeable() && j.hedgeAt.Before(next) {
						next = j.hedgeAt
					}
					continue
				}
				if j.c.take(j.req, true) != nil {
					j.c.timeouts.Add(1)
					j.c.stall()
					rep = reply{err: fmt.Errorf("request %d: deadline exceeded", j.req)}
				} else {
					rep = <-j.done // the reader took it first; its reply is on the way
				}
			}
			progress = true
			if rep.out != nil {
				cl.used = append(cl.used, rep.out)
			}
			if !rep.at.IsZero() {
				cl.d.addWake(time.Since(rep.at))
			}
			if err := cl.resolve(j, rep); err != nil {
				cl.live = append(cl.live, pending[i+1:]...)
				return err
			}
		}
		if progress || len(cl.live) == 0 {
			continue
		}
		t.Reset(time.Until(next))
		select {
		case <-cl.wake:
		case <-t.C:
		case <-cl.ctx.Done():
			return cl.ctx.Err()
		}
	}
	return nil
}

// resolve uses j's reply: a verified or unchecked result is scattered into
// out; a result that fails its check is replaced by the reference and the
// worker is punished; a failure goes to a replica, or to the reference, or
// to the local retry.
func (cl *call) resolve(j *job, rep reply) error {
	d := cl.d
	switch {
	case j.qa != nil:
		return cl.resolveQuorum(j, rep)
	case j.twin != nil:
		cl.resolveTwin(j, rep)
		return nil
	case j.arb != nil:
		cl.resolveArbiter(j, rep)
		return nil
	case j.hedged && cl.resolveHedged(j, rep):
		return nil
	}
	if rep.err == nil && j.check && j.ref == nil && !cl.allLocal(j.pairs) {
		// Chosen for a check that nothing can make: no local copy and no
		// second holder took it. Used unverified (counted).
		j.c.verdict(j, true)
		d.unverified.Add(uint64(len(j.pairs)))
	} else if rep.err == nil && j.check {
		if j.ref == nil { // a replica request chosen for a check: its reference now
			t0 := time.Now()
			ref, err := d.computePairs(cl.ctx, cl.layer, cl.hidden, cl.ids, cl.k, j.pairs)
			d.checkNanos.Add(int64(time.Since(t0)))
			if err != nil {
				j.c.verdict(j, true) // unverified, unused: the worker did the work asked
				return err
			}
			j.ref = ref
		}
		d.checks.Add(1)
		d.checkPairs.Add(uint64(len(j.pairs)))
		j.c.checks.Add(1)
		ref := j.ref
		if j.sum {
			ref = cl.refSums(j)
		}
		if why := j.c.compare(rep.out, ref, d.cfg.Model.D); why != "" {
			d.mismatches.Add(1)
			j.c.mismatches.Add(1)
			cl.scatter(j.pairs, j.ref)
			cl.nLocal += len(j.pairs)
			if j.hedged {
				cl.settleHedge(j)
			}
			j.c.sendCtl(wire.LinkRejected, wire.AppendLinkRequest(nil, j.req))
			j.c.punish(fmt.Sprintf("verification failed (request %d)", j.req), why)
			j.c.verified(j) // after the FORFEIT: a draining session closes its link only now
			return nil
		}
		j.c.passed.Add(1)
		j.c.verdict(j, true)
	}
	if rep.err == nil {
		cl.use(j, rep.out)
		d.remote.Add(uint64(len(j.pairs)))
		if j.replica {
			d.replicaPairs.Add(uint64(len(j.pairs)))
		}
		if j.hedged {
			if !j.check {
				j.c.verdict(j, true) // held by answer until now
			}
			cl.settleHedge(j)
		}
		return nil
	}
	j.resolved = true
	d.fails.Add(1)
	cl.failed[j.c] = true
	d.log.Debug("dispatch: request failed", "worker", short(j.c.worker), "req", j.req, "replica", j.replica, "err", rep.err)
	left, leftRef := j.pairs, j.ref
	if !j.replica {
		left, leftRef = cl.failover(j)
	}
	if leftRef != nil {
		cl.scatter(left, leftRef)
		cl.nLocal += len(left)
	} else {
		cl.orphan(left, nil)
	}
	return nil
}

// failover sends j's pairs to other connected workers holding their
// experts (replica requests, with the step's remaining time as deadline)
// and returns the pairs no replica took, with their reference outputs when
// j has them. A replica request of a checked j carries j's reference: it
// is checked for free.
func (cl *call) failover(j *job) ([]pair, []float32) {
	d := cl.d
	D := d.cfg.Model.D
	if !time.Now().Before(cl.until) {
		return j.pairs, j.ref
	}
	d.mu.Lock()
	idx := d.index
	d.mu.Unlock()
	type part struct {
		pairs []pair
		ref   []float32
	}
	byConn := map[*conn]*part{}
	var order []*conn
	var left []pair
	var leftRef []float32
	for i, p := range j.pairs {
		e := int(cl.ids[int(p.r)*cl.k+int(p.s)])
		var cands []*conn
		for _, c := range idx[key(cl.layer, e)] {
			if c != j.c && !cl.failed[c] && !c.isClosed() {
				cands = append(cands, c)
			}
		}
		if len(cands) == 0 {
			left = append(left, p)
			if j.ref != nil {
				leftRef = append(leftRef, j.ref[i*D:(i+1)*D]...)
			}
			continue
		}
		c := cands[(uint64(e)+cl.seq)%uint64(len(cands))]
		pt := byConn[c]
		if pt == nil {
			pt = &part{}
			byConn[c] = pt
			order = append(order, c)
		}
		pt.pairs = append(pt.pairs, p)
		if j.ref != nil {
			pt.ref = append(pt.ref, j.ref[i*D:(i+1)*D]...)
		}
	}
	for _, c := range order {
		pt := byConn[c]
		off := 0
		for _, ps := range d.splitPairs(pt.pairs) {
			var ref []float32
			if pt.ref != nil {
				ref = pt.ref[off*D : (off+len(ps))*D]
			}
			off += len(ps)
			rj := cl.newJob(c, ps, ref != nil || c.chooseCheck())
			rj.ref, rj.replica = ref, true
			if err := cl.send(rj); err != nil {
				left = append(left, ps...)
				if j.ref != nil {
					leftRef = append(leftRef, ref...)
				}
				continue
			}
			d.failovers.Add(1)
		}
	}
	if j.ref == nil {
		leftRef = nil
	}
	return left, leftRef
}

// abandon gives up the live requests of a failed call: they expire (a later
// RESULT is late), and a checked result that already arrived gets its
// verdict unverified (it was asked for, and is not used).
func (cl *call) abandon() {
	for _, j := range cl.held {
		if j.rep != nil && j.rep.err == nil {
			j.c.verdict(j, true) // its twin never answered: unverified, unused
		}
	}
	cl.held = nil
	cl.abandonGroups()
	for _, dp := range slices.Clone(cl.disputes) {
		cl.finalize(dp)
	}
	for _, j := range cl.live {
		if j.dropped || j.c.take(j.req, true) != nil {
			continue
		}
		go func(j *job) { // its reply is in done or on the way
			if rep := <-j.done; rep.err == nil && (j.check || j.hedged) {
				j.c.verdict(j, true)
			}
		}(j)
	}
	cl.live = nil
}

// computePairs computes pairs with Fallback and returns their m x D
// outputs, m = len(pairs), in pairs' order. A row all of whose k slots
// appear consecutively in slot order (every row of a sum job, or of a
// request that took whole rows) is computed as one row with its k ids, so
// its hidden row is gathered and converted once, not k times; the other
// pairs go as one batch of rows with k = 1 (row i is hidden row
// pairs[i].r, its expert ids[r*k+s]). Batch invariance (expert.Computer's
// contract) makes each output bit-identical to computing the full call.
func (d *Dispatcher) computePairs(ctx context.Context, layer int, hidden []float32, ids []int32, k int, pairs []pair) ([]float32, error) {
	m, D := len(pairs), d.cfg.Model.D
	if m == 0 {
		return nil, nil
	}
	var whole, single []int // first pair index of each whole row; indices of the other pairs
	for i := 0; i < m; {
		j := i + 1
		for j < m && pairs[j].r == pairs[i].r {
			j++
		}
		ok := j-i == k
		for s := 0; ok && s < k; s++ {
			ok = pairs[i+s].s == int32(s)
		}
		if ok {
			whole = append(whole, i)
		} else {
			for q := i; q < j; q++ {
				single = append(single, q)
			}
		}
		i = j
	}
	out := make([]float32, m*D)
	compute := func(idx []int, kk int) error {
		n := len(idx)
		if n == 0 {
			return nil
		}
		xs, es := make([]float32, n*D), make([]int32, n*kk)
		for i, q := range idx {
			r := int(pairs[q].r)
			copy(xs[i*D:(i+1)*D], hidden[r*D:])
			if kk == k {
				copy(es[i*k:(i+1)*k], ids[r*k:(r+1)*k])
			} else {
				es[i] = ids[r*k+int(pairs[q].s)]
			}
		}
		dst := out // every pair in whole rows, in order: compute in place
		if len(whole)*k != m || kk != k {
			dst = make([]float32, n*kk*D)
		}
		if err := d.cfg.Fallback.ComputeExperts(ctx, layer, xs, es, n, kk, dst); err != nil {
			return fmt.Errorf("dispatch: local fallback: %w", err)
		}
		if &dst[0] != &out[0] {
			for i, q := range idx {
				copy(out[q*D:(q+kk)*D], dst[i*kk*D:(i+1)*kk*D])
			}
		}
		return nil
	}
	if err := compute(whole, k); err != nil {
		return nil, err
	}
	if err := compute(single, 1); err != nil {
		return nil, err
	}
	return out, nil
}

// maxFramePairs is the most (row, slot) outputs one RESULT of width d
// carries within wire.MaxMessage.
func maxFramePairs(d int) int { return (wire.MaxMessage - wire.ResultSize(0, d)) / (4 * d) }

// maxFrameRows is the most rows one DISPATCH of width d and k slots carries
// within wire.MaxMessage.
func maxFrameRows(d, k int) int {
	return (wire.MaxMessage - wire.DispatchSize(0, d, k)) / (4 * (d + k))
}

// splitPairs cuts pairs (row-major) into consecutive runs, as long as
// possible, whose DISPATCH and RESULT each fit in wire.MaxMessage; a row
// whose slots straddle a cut appears in both frames with its other slots
// at -1. One run (pairs itself) is the common case.
func (d *Dispatcher) splitPairs(pairs []pair) [][]pair {
	mp, mr := maxFramePairs(d.cfg.Model.D), maxFrameRows(d.cfg.Model.D, d.cfg.Model.K)
	if len(pairs) <= min(mp, mr) { // rows <= pairs
		return [][]pair{pairs}
	}
	var out [][]pair
	start, rows := 0, 0
	for i, p := range pairs {
		newRow := i == start || pairs[i-1].r != p.r
		if i-start == mp || (newRow && rows == mr) {
			out = append(out, pairs[start:i])
			start, rows, newRow = i, 0, true
		}
		if newRow {
			rows++
		}
	}
	out = append(out, pairs[start:])
	d.splits.Add(uint64(len(out) - 1))
	return out
}
