package dispatch

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Capacity (issue 12): a backbone that cannot compute every expert
// (Config.LocalHeld, e.g. a backbone-only model file holding at most a few
// hot experts) uses workers as the only source of the other pairs' outputs.
//
// Verification by replica comparison. A request chosen for a check whose
// pairs the backbone cannot recompute is sent twice: to the chosen worker
// and, pair by pair, to another connected holder (its twin request, same
// pairs). Equal outputs (bit for bit between CPU backends, else within the
// looser of the two workers' tolerances per output row) pass both. Pairs
// that differ are a dispute: they go to a third holder (an arbiter
// request); the worker whose outputs differ from the two that agree is
// caught (LinkRejected, LinkForfeit, closed and banned, as for a local
// check), the others pass. A dispute no holder can decide (no third holder
// connected within HolderWait, or three different answers) fails the call;
// both parties' RESULTs are then rejected (never credited) and nobody is
// banned. Pairs of a checked request that no second holder can take are
// used unverified (Stats.Unverified).
//
// Waiting for a holder. Pairs that no connected worker holds, whose holders
// all failed in this call, or whose dispute needs a third holder wait: the
// call sends them as soon as a holder connects or announces them (a worker
// that failed in this call is asked again after 200 ms), and after
// HolderWait fails with a *MissingError, which wraps ErrNoHolder. A wrong
// or substituted output is never used.

// ErrNoHolder is wrapped by the *MissingError of a call that waited
// Config.HolderWait for a worker holding an expert it needs.
var ErrNoHolder = errors.New("dispatch: no worker holds an expert the step needs")

// MissingError is the error of a ComputeExperts call that could not get
// every output: pairs of Experts of Layer had no usable holder for Waited.
type MissingError struct {
	Layer    int           // the call's MoE layer
	Experts  []int         // experts of Layer left without an output, ascending
	Pairs    int           // (row, slot) pairs left without an output
	Disputed int           // of them, pairs two holders disagreed on with no third to decide
	Waited   time.Duration // how long the call waited for holders
}

// Error says which experts, how many pairs and how long it waited.
func (e *MissingError) Error() string {
	ex := ""
	if len(e.Experts) > 0 {
		ex = fmt.Sprintf(" (first: expert %d)", e.Experts[0])
	}
	msg := fmt.Sprintf("dispatch: no connected worker holds %d expert(s) of layer %d%s needed by %d (row, slot) pairs; waited %v",
		len(e.Experts), e.Layer, ex, e.Pairs, e.Waited.Round(time.Millisecond))
	if e.Disputed > 0 {
		msg += fmt.Sprintf("; %d of the pairs are disputed (two holders returned different outputs and no third could decide)", e.Disputed)
	}
	return msg
}

// Unwrap returns ErrNoHolder.
func (e *MissingError) Unwrap() error { return ErrNoHolder }

// waiting is a set of a call's pairs waiting for a holder.
type waiting struct {
	pairs []pair
	not   []*conn  // workers not to ask (a dispute's parties and failed arbiters)
	disp  *dispute // the pairs are a dispute's: the answer is an arbiter's
	idx   []int    // with disp: the pairs' indices in the disputed jobs
	q     *qgroup  // the pairs are a quorum group's: it needs another holder
}

// dispute is a twin request whose outputs differ from its twin's.
type dispute struct {
	a, b         *job    // the twins (same pairs, both answered)
	tried        []*conn // arbiters that failed or disagreed with both
	open         int     // arbiter requests out, plus 1 while pairs wait for an arbiter
	aLied, bLied bool
	done         bool
}

// arbPart marks an arbiter request: which dispute, and the indices of its
// pairs in the disputed jobs.
type arbPart struct {
	disp *dispute
	idx  []int
}

// localOK reports whether Fallback can compute expert e of layer.
func (d *Dispatcher) localOK(layer, e int) bool {
	return d.cfg.LocalHeld == nil || d.cfg.LocalHeld(layer, e)
}

// allLocal reports whether Fallback can compute every pair of ps.
func (cl *call) allLocal(ps []pair) bool {
	if cl.d.cfg.LocalHeld == nil {
		return true
	}
	for _, p := range ps {
		if !cl.d.localOK(cl.layer, cl.expert(p)) {
			return false
		}
	}
	return true
}

// expert returns the expert id of pair p.
func (cl *call) expert(p pair) int { return int(cl.ids[int(p.r)*cl.k+int(p.s)]) }

// wait queues w for a holder.
func (cl *call) wait(w waiting) {
	if cl.waitStart.IsZero() {
		cl.waitStart = time.Now()
		cl.d.holderWaits.Add(1)
	}
	cl.missing = append(cl.missing, w)
}

// orphan routes pairs that lost their request: those Fallback computes to
// *local (nil: the retry list), the others wait for a holder.
func (cl *call) orphan(ps []pair, local *[]pair) {
	var w []pair
	for _, p := range ps {
		switch {
		case !cl.d.localOK(cl.layer, cl.expert(p)):
			w = append(w, p)
		case local != nil:
			*local = append(*local, p)
		default:
			cl.retry = append(cl.retry, p)
		}
	}
	if len(w) > 0 {
		cl.wait(waiting{pairs: w})
	}
}

// pick returns a holder of expert e in idx for which skip is false, rotating
// by call and expert as the first routing does; nil if none.
func (cl *call) pick(idx map[uint64][]*conn, e int, skip func(*conn) bool) *conn {
	var cands []*conn
	for _, c := range idx[key(cl.layer, e)] {
		if !skip(c) && !c.isClosed() {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return cands[(uint64(e)+cl.seq)%uint64(len(cands))]
}

// group assigns each pair (with its index) to a holder chosen by pick;
// pairs without one are returned as left.
func (cl *call) group(idx map[uint64][]*conn, ps []pair, is []int, skip func(*conn) bool) (order []*conn, by map[*conn][]pair, byIdx map[*conn][]int, left []pair, leftIdx []int) {
	by, byIdx = map[*conn][]pair{}, map[*conn][]int{}
	for n, p := range ps {
		c := cl.pick(idx, cl.expert(p), skip)
		if c == nil {
			left = append(left, p)
			if is != nil {
				leftIdx = append(leftIdx, is[n])
			}
			continue
		}
		if by[c] == nil {
			order = append(order, c)
		}
		by[c] = append(by[c], p)
		if is != nil {
			byIdx[c] = append(byIdx[c], is[n])
		}
	}
	return order, by, byIdx, left, leftIdx
}

// sendCrossChecked sends c's pairs ps of a request chosen for a check when
// some of them cannot be recomputed locally: pairs the backbone computes are
// checked against its reference as usual (returned, their references are
// computed with the step's local batch), the others go with a twin request
// to a second holder, or unverified when none is connected.
func (cl *call) sendCrossChecked(c *conn, ps []pair, local *[]pair) []*job {
	d := cl.d
	d.mu.Lock()
	idx := d.index
	d.mu.Unlock()
	var refd, remote []pair
	for _, p := range ps {
		if d.localOK(cl.layer, cl.expert(p)) {
			refd = append(refd, p)
		} else {
			remote = append(remote, p)
		}
	}
	var verify []*job
	for _, part := range d.splitPairs(refd) {
		if len(part) == 0 {
			continue
		}
		j := cl.newJob(c, part, true)
		if err := cl.send(j); err != nil {
			cl.orphan(part, local)
			continue
		}
		cl.until = maxTime(cl.until, j.end)
		verify = append(verify, j)
	}
	order, by, _, unver, _ := cl.group(idx, remote, nil, func(x *conn) bool { return x == c || cl.failed[x] })
	for _, part := range d.splitPairs(unver) {
		if len(part) == 0 {
			continue
		}
		j := cl.newJob(c, part, false)
		if err := cl.send(j); err != nil {
			cl.orphan(part, local)
			continue
		}
		cl.until = maxTime(cl.until, j.end)
		d.unverified.Add(uint64(len(part)))
	}
	for _, t := range order {
		for _, part := range d.splitPairs(by[t]) {
			j, jt := cl.newJob(c, part, true), cl.newJob(t, part, true)
			j.twin, jt.twin = jt, j
			if err := cl.send(j); err != nil {
				cl.orphan(part, local)
				continue
			}
			cl.until = maxTime(cl.until, j.end)
			if err := cl.send(jt); err != nil {
				j.twin = nil // checked with no reference: used unverified
				continue
			}
			cl.until = maxTime(cl.until, jt.end)
			d.crossChecks.Add(1)
		}
	}
	return verify
}

// rowsAgree compares two output rows: bit for bit when tol is 0, else
// ||x - y||_2 <= tol * max(||x||_2, ||y||_2).
func rowsAgree(x, y []float32, tol float64) bool {
	if tol == 0 {
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				return false
			}
		}
		return true
	}
	var diff, nx, ny float64
	for i := range x {
		a, b := float64(x[i]), float64(y[i])
		diff += (a - b) * (a - b)
		nx += a * a
		ny += b * b
	}
	return math.Sqrt(diff) <= tol*math.Sqrt(max(nx, ny)) // false for NaN
}

// unhold removes j from the twins waiting for their partner.
func (cl *call) unhold(j *job) {
	if i := slices.Index(cl.held, j); i >= 0 {
		cl.held = slices.Delete(cl.held, i, i+1)
	}
}

// resolveTwin takes the reply of one of two twin requests; once both are
// in it compares them (see the comment at the top).
func (cl *call) resolveTwin(j *job, rep reply) {
	d := cl.d
	D := d.cfg.Model.D
	j.rep = &rep
	t := j.twin
	if t.rep == nil {
		cl.held = append(cl.held, j)
		return
	}
	cl.unhold(t)
	a, b := t, j
	ra, rb := *a.rep, *b.rep
	switch {
	case ra.err == nil && rb.err == nil:
		tol := max(a.c.tol, b.c.tol)
		d.checks.Add(1)
		d.checkPairs.Add(uint64(len(a.pairs)))
		a.c.checks.Add(1)
		b.c.checks.Add(1)
		var diff []int
		for i, p := range a.pairs {
			x, y := ra.out[i*D:(i+1)*D], rb.out[i*D:(i+1)*D]
			if rowsAgree(x, y, tol) {
				cl.scatter([]pair{p}, x)
				d.remote.Add(1)
			} else {
				diff = append(diff, i)
			}
		}
		if len(diff) == 0 {
			a.c.passed.Add(1)
			b.c.passed.Add(1)
			a.c.verdict(a, true)
			b.c.verdict(b, true)
			return
		}
		dp := &dispute{a: a, b: b}
		cl.disputes = append(cl.disputes, dp)
		d.disputes.Add(1)
		d.log.Warn("dispatch: replicas disagree", "layer", cl.layer, "pairs", len(diff),
			"worker_a", short(a.c.worker), "req_a", a.req, "worker_b", short(b.c.worker), "req_b", b.req)
		cl.arbitrate(dp, diff)
	case ra.err == nil || rb.err == nil:
		ok, bad := a, b
		if ra.err != nil {
			ok, bad = b, a
		}
		ok.c.verdict(ok, true)
		d.unverified.Add(uint64(len(ok.pairs)))
		cl.scatter(ok.pairs, ok.rep.out)
		d.remote.Add(uint64(len(ok.pairs)))
		d.fails.Add(1)
		cl.failed[bad.c] = true
	default:
		d.fails.Add(2)
		cl.failed[a.c], cl.failed[b.c] = true, true
		left, _ := cl.failover(a)
		cl.orphan(left, nil)
	}
}

// arbitrate sends the disputed pairs idx of dp to holders other than its
// parties and tried arbiters; pairs no holder can take wait for one.
func (cl *call) arbitrate(dp *dispute, idx []int) {
	d := cl.d
	d.mu.Lock()
	index := d.index
	d.mu.Unlock()
	not := append([]*conn{dp.a.c, dp.b.c}, dp.tried...)
	ps := make([]pair, len(idx))
	for n, i := range idx {
		ps[n] = dp.a.pairs[i]
	}
	order, by, byIdx, left, leftIdx := cl.group(index, ps, idx, func(x *conn) bool { return slices.Contains(not, x) || cl.failed[x] })
	for _, x := range order {
		all, allIdx := by[x], byIdx[x]
		off := 0
		for _, part := range d.splitPairs(all) {
			pi := allIdx[off : off+len(part)]
			off += len(part)
			if !cl.sendArbiter(x, dp, part, pi) {
				left, leftIdx = append(left, part...), append(leftIdx, pi...)
			}
		}
	}
	if len(left) > 0 {
		dp.open++
		cl.wait(waiting{pairs: left, not: not, disp: dp, idx: leftIdx})
	}
}

// sendArbiter sends one arbiter request of dp to x; false if it could not
// be sent.
func (cl *call) sendArbiter(x *conn, dp *dispute, ps []pair, idx []int) bool {
	j := cl.newJob(x, ps, true)
	j.arb = &arbPart{disp: dp, idx: idx}
	if err := cl.send(j); err != nil {
		return false
	}
	dp.open++
	return true
}

// resolveArbiter takes an arbiter's reply: per pair, the twin it agrees
// with is right and the other lied; pairs it agrees with neither on go to
// another arbiter.
func (cl *call) resolveArbiter(j *job, rep reply) {
	d := cl.d
	D := d.cfg.Model.D
	dp := j.arb.disp
	dp.open--
	a, b := dp.a, dp.b
	if rep.err != nil {
		d.fails.Add(1)
		cl.failed[j.c] = true
		dp.tried = append(dp.tried, j.c)
		cl.arbitrate(dp, j.arb.idx)
	} else {
		d.checks.Add(1)
		d.checkPairs.Add(uint64(len(j.pairs)))
		j.c.checks.Add(1)
		var undecided []int
		for k, i := range j.arb.idx {
			x := rep.out[k*D : (k+1)*D]
			ya, yb := a.rep.out[i*D:(i+1)*D], b.rep.out[i*D:(i+1)*D]
			eqA, eqB := rowsAgree(x, ya, max(j.c.tol, a.c.tol)), rowsAgree(x, yb, max(j.c.tol, b.c.tol))
			switch {
			case eqA && !eqB:
				dp.bLied = true
				cl.scatter([]pair{a.pairs[i]}, ya)
			case eqB && !eqA:
				dp.aLied = true
				cl.scatter([]pair{a.pairs[i]}, yb)
			case eqA && eqB:
				cl.scatter([]pair{a.pairs[i]}, ya)
			default:
				undecided = append(undecided, i)
				continue
			}
			d.remote.Add(1)
		}
		if len(undecided) == 0 {
			j.c.passed.Add(1)
			j.c.verdict(j, true)
		} else {
			j.c.verdict(j, false) // agrees with neither: not used, not credited
			dp.tried = append(dp.tried, j.c)
			cl.arbitrate(dp, undecided)
		}
	}
	if dp.open == 0 {
		cl.finalize(dp)
	}
}

// finalize gives a dispute's parties their verdicts: a party whose outputs
// differ from an agreeing majority is caught; with no majority (the call
// failed first) both RESULTs are rejected and nobody is punished.
func (cl *call) finalize(dp *dispute) {
	if dp.done {
		return
	}
	dp.done = true
	if i := slices.Index(cl.disputes, dp); i >= 0 {
		cl.disputes = slices.Delete(cl.disputes, i, i+1)
	}
	d := cl.d
	decided := dp.aLied || dp.bLied
	for _, x := range []struct {
		j    *job
		lied bool
	}{{dp.a, dp.aLied}, {dp.b, dp.bLied}} {
		c := x.j.c
		switch {
		case x.lied:
			d.mismatches.Add(1)
			c.mismatches.Add(1)
			c.sendCtl(wire.LinkRejected, wire.AppendLinkRequest(nil, x.j.req))
			c.punish(fmt.Sprintf("verification failed (request %d)", x.j.req), "outputs differ from two other holders' (replica comparison)")
			c.verified(x.j)
		case decided:
			c.passed.Add(1)
			c.verdict(x.j, true)
		default:
			c.verdict(x.j, false)
		}
	}
}

// awaitHolders sends the waiting pairs to holders as soon as there are
// any; it returns nil once it sent some (or none wait), or a *MissingError
// HolderWait after the call's first pair started waiting.
func (cl *call) awaitHolders() error {
	d := cl.d
	deadline := cl.waitStart.Add(d.cfg.HolderWait)
	allowFailed := false
	for {
		d.mu.Lock()
		idx, ch := d.index, d.changed
		d.mu.Unlock()
		pending := cl.missing
		cl.missing = nil
		sent := false
		for _, w := range pending {
			if w.disp != nil && w.disp.done {
				continue
			}
			if w.q != nil {
				if w.q.decided {
					continue
				}
				if cl.askMore(w.q, idx, allowFailed) {
					w.q.waiting, sent = false, true
				} else {
					cl.missing = append(cl.missing, w)
				}
				continue
			}
			rest, ok := cl.resend(idx, w, allowFailed)
			sent = sent || ok
			if len(rest.pairs) > 0 {
				cl.missing = append(cl.missing, rest)
			} else if w.disp != nil {
				w.disp.open-- // no longer waiting; its arbiters are out
			}
		}
		if sent || len(cl.missing) == 0 {
			return nil
		}
		now := time.Now()
		if !now.Before(deadline) {
			return cl.missingError()
		}
		wait := deadline.Sub(now)
		if !allowFailed {
			wait = min(wait, 200*time.Millisecond)
		}
		t := time.NewTimer(wait)
		select {
		case <-ch:
		case <-t.C:
			allowFailed = true
		case <-cl.ctx.Done():
			t.Stop()
			return cl.ctx.Err()
		case <-d.stop:
			t.Stop()
			return ErrClosed
		}
		t.Stop()
	}
}

// resend sends w's pairs that have a holder now (a worker that failed in
// this call only with allowFailed) and returns the rest.
func (cl *call) resend(idx map[uint64][]*conn, w waiting, allowFailed bool) (waiting, bool) {
	d := cl.d
	skip := func(x *conn) bool { return slices.Contains(w.not, x) || (!allowFailed && cl.failed[x]) }
	order, by, byIdx, left, leftIdx := cl.group(idx, w.pairs, w.idx, skip)
	sent := false
	for _, x := range order {
		all, allIdx := by[x], byIdx[x]
		off := 0
		for _, part := range d.splitPairs(all) {
			var pi []int
			if w.disp != nil {
				pi = allIdx[off : off+len(part)]
			}
			off += len(part)
			if w.disp != nil {
				if !cl.sendArbiter(x, w.disp, part, pi) {
					left, leftIdx = append(left, part...), append(leftIdx, pi...)
					continue
				}
			} else {
				j := cl.newJob(x, part, false)
				if err := cl.send(j); err != nil {
					left = append(left, part...)
					continue
				}
				cl.until = maxTime(cl.until, j.end)
				d.unverified.Add(uint64(len(part)))
			}
			sent = true
		}
	}
	return waiting{pairs: left, not: w.not, disp: w.disp, idx: leftIdx}, sent
}

// missingError describes the pairs still waiting.
func (cl *call) missingError() error {
	d := cl.d
	d.noHolder.Add(1)
	e := &MissingError{Layer: cl.layer, Waited: time.Since(cl.waitStart)}
	d.holderWaitNanos.Add(int64(e.Waited))
	seen := map[int]bool{}
	for _, w := range cl.missing {
		e.Pairs += len(w.pairs)
		if w.disp != nil {
			e.Disputed += len(w.pairs)
		}
		for _, p := range w.pairs {
			if x := cl.expert(p); !seen[x] {
				seen[x] = true
				e.Experts = append(e.Experts, x)
			}
		}
	}
	slices.Sort(e.Experts)
	d.log.Warn("dispatch: step failed", "err", e.Error())
	return e
}

// Coverage is, for every routed (layer, expert) pair of the model, whether
// the backbone computes it and how many connected, unpaused workers hold
// it (accepted holdings).
type Coverage struct {
	Experts int // layers x experts per layer
	Local   int // pairs the backbone computes itself (Config.LocalHeld; all without it)
	Covered int // pairs local or held by at least one worker
	Missing int // pairs neither local nor held: a step routing to one waits HolderWait, then fails
	// ByReplicas[n] is the number of pairs held by exactly n workers (distinct keys)
	// (local ones included), n = 0 .. the most holders of any pair.
	ByReplicas []int
	// MinReplicas is the fewest workers holding a pair the backbone
	// cannot compute; -1 when it computes every pair.
	MinReplicas int
	// Verify is the verification policy (Config.Verify): under quorum a
	// pair needs two holders (keys) for a worker's output to be used.
	Verify VerifyMode
	// Layers[l] is layer l's share (l = 0 .. NLayer-1, the layer index
	// the workers' holdings and --layers use). The holder gauges
	// (kvasir_swarm_layer_*) and the backbone's /readyz read these.
	Layers []LayerCoverage
}

// LayerCoverage is one layer's part of Coverage. Workers are counted by
// distinct key, connected and unpaused: a worker that leaves, pauses or
// is banned (its sessions closed) stops counting at once.
type LayerCoverage struct {
	Holders int // workers holding at least one expert of the layer
	Held    int // experts of the layer held by at least one worker
	Local   int // experts of the layer the backbone computes itself
	Missing int // experts neither local nor held
	// MinHolders is the fewest workers holding any one expert of the
	// layer, local experts included (0 when one is held by none): every
	// expert of the layer has at least this many holders.
	MinHolders int
}

// Coverage returns which experts are covered now, and by how many workers.
func (d *Dispatcher) Coverage() Coverage {
	m := d.cfg.Model
	d.mu.Lock()
	idx := d.index
	d.mu.Unlock()
	cv := Coverage{Experts: m.NLayer * m.NExpert, MinReplicas: -1, Verify: d.cfg.Verify, Layers: make([]LayerCoverage, m.NLayer)}
	holders := map[string]struct{}{}
	for l := 0; l < m.NLayer; l++ {
		lc := &cv.Layers[l]
		lc.MinHolders = -1
		clear(holders)
		for e := 0; e < m.NExpert; e++ {
			cs := idx[key(l, e)]
			for _, c := range cs {
				holders[c.worker] = struct{}{}
			}
			n := distinctWorkers(cs)
			for len(cv.ByReplicas) <= n {
				cv.ByReplicas = append(cv.ByReplicas, 0)
			}
			cv.ByReplicas[n]++
			if n > 0 {
				lc.Held++
			}
			if lc.MinHolders < 0 || n < lc.MinHolders {
				lc.MinHolders = n
			}
			local := d.localOK(l, e)
			switch {
			case local:
				cv.Local++
				lc.Local++
				cv.Covered++
			case n > 0:
				cv.Covered++
			default:
				cv.Missing++
				lc.Missing++
			}
			if !local && (cv.MinReplicas < 0 || n < cv.MinReplicas) {
				cv.MinReplicas = n
			}
		}
		lc.Holders = len(holders)
		lc.MinHolders = max(lc.MinHolders, 0) // a model without experts
	}
	return cv
}

// distinctWorkers counts the distinct worker keys among cs: two sessions
// under one key (the same worker connected twice) are one replica, as
// quorum verification and readiness must see them.
func distinctWorkers(cs []*conn) int {
	switch len(cs) {
	case 0, 1:
		return len(cs)
	}
	seen := make(map[string]struct{}, len(cs))
	for _, c := range cs {
		seen[c.worker] = struct{}{}
	}
	return len(seen)
}

// DelegatesLayer implements expert.LayerDelegator: it reports whether
// Delegate would now return true for any call on layer with own, i.e. own
// is Fallback, no connected, unpaused worker holds any expert of the layer
// and Fallback holds them all. It counts nothing.
func (d *Dispatcher) DelegatesLayer(layer int, own expert.Computer) bool {
	if own == nil || own != d.cfg.Fallback {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	return layer >= 0 && layer < len(d.layerFree) && d.layerFree[layer]
}

// Delegate implements expert.Delegator: it reports whether a call on layer
// with ids would compute every pair with Fallback, own being Fallback itself
// — no connected, unpaused worker holds any of the experts and Fallback
// holds them all (under quorum too: a pair without holders has no second
// opinion to ask). The model then runs the layer on its own helper threads
// instead of through computePairs. True counts the call, its rows, its
// expert usage and its local outputs in Stats as ComputeExperts would.
func (d *Dispatcher) Delegate(layer int, ids []int32, own expert.Computer) bool {
	K, NE := d.cfg.Model.K, d.cfg.Model.NExpert
	if own == nil || own != d.cfg.Fallback || layer < 0 || layer >= d.cfg.Model.NLayer ||
		len(ids) == 0 || len(ids)%K != 0 {
		return false
	}
	d.mu.Lock()
	idx := d.index
	d.mu.Unlock()
	for _, e := range ids {
		if e < 0 || int(e) >= NE || len(idx[key(layer, int(e))]) > 0 || !d.localOK(layer, int(e)) {
			return false
		}
	}
	d.calls.Add(1)
	d.rows[layer].Add(uint64(len(ids) / K))
	for _, e := range ids {
		d.usage[layer*NE+int(e)].Add(1)
	}
	d.local.Add(uint64(len(ids)))
	return true
}
