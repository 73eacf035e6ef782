package dispatch

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Quorum verification (issue 20, docs/accounting.md "Quorum").
//
// Under Config.Verify = VerifyQuorum no worker's answer is used unless a
// second holder under another key agrees with it. Every request of a call
// goes to two holders of its experts, drawn at random per (call, expert)
// among the connected holders, the second under a different key: the first
// (A) answers with a RESULT; the second (B) gets the same pairs as a
// DISPATCH_DIGEST and answers with the DIGEST of the RESULT it would have
// sent when both declare a CPU backend (bit-exact: upload bytes stay about
// 1x), else with a RESULT too (compared within the looser tolerance per
// output row). The outputs are used only when the two agree.
//
// Each such request is a group of asks (an ask: one opinion on all of the
// group's pairs, from one worker or, for later asks, from several holders
// each taking the pairs of the experts it holds). A group is decided by
// the first full opinion that another opinion agrees with (bits, digest or
// tolerance), or by the backbone's own computation of the pairs when it can
// compute them (Fallback; Config.LocalHeld): at once when the opinions
// disagree, when one of the two fails or is late, or when only one holder
// (key) holds an expert. A backbone that cannot compute the pairs asks a
// further holder (a full RESULT to arbitrate a disagreement, a digest to
// confirm a lone answer) and, with no holder left, waits up to HolderWait
// and then fails the call (*MissingError): an unconfirmed output is never
// used. Once a group is decided every opinion is judged against the
// decision: one that differs from it (from two agreeing opinions, or from
// the backbone's own outputs) is a lie, handled like a failed spot check
// (LinkRejected, LinkForfeit, close, ban); the others are accepted
// (LinkAccepted: creditable, a DIGEST as the RESULT it stands for).
//
// Row sums (wire 7, sum.go): in a ComputeExpertsSum call (row sums on), a
// row whose k experts two CPU holders under different keys both hold all
// of goes in a sum group instead: its A gets a DISPATCH_SUM and answers
// with the row's weighted sum, its B a DISPATCH_SUM_DIGEST and answers
// with the DIGEST of that sum RESULT, the pair (A, B) drawn at random per
// row among the row's full CPU holders. A sum group's opinions are row
// sums (rows x D) and everything above holds with sums for outputs: two
// agree by digest (the reader hashes A's RESULT payload), the backbone
// decides with expert.WeightedSum of its own (Fallback) outputs of the
// rows' pairs, audits compare with those sums, and further opinions come
// from further full CPU holders (a sum RESULT to arbitrate, a sum digest
// to confirm a lone answer). A row the backbone cannot compute, with two
// full holder keys only, goes per pair when every one of its pairs has a
// third holder key (the pairs' disagreements could be decided, the sum's
// not); other rows without two full CPU holder keys take the per-pair path
// above too.

// VerifyMode is the verification policy (Config.Verify).
type VerifyMode string

const (
	// VerifySpot is probation plus random spot checks against the
	// backbone's own computation (verify.go): it bounds corruption and
	// takes the liar's pay, but an unchecked wrong answer is used.
	VerifySpot VerifyMode = "spot"
	// VerifyQuorum uses an answer only when two holders under different
	// keys agree on it (or the backbone computed it): no single dishonest
	// worker can change an output. Worker compute is 2x.
	VerifyQuorum VerifyMode = "quorum"
)

// ParseVerifyMode parses "spot" or "quorum" ("" is spot).
func ParseVerifyMode(s string) (VerifyMode, error) {
	switch VerifyMode(s) {
	case "", VerifySpot:
		return VerifySpot, nil
	case VerifyQuorum:
		return VerifyQuorum, nil
	}
	return "", fmt.Errorf("dispatch: verification policy %q: want spot or quorum", s)
}

// Verify returns the dispatcher's verification policy.
func (d *Dispatcher) Verify() VerifyMode { return d.cfg.Verify }

func (d *Dispatcher) quorum() bool { return d.cfg.Verify == VerifyQuorum }

// qgroup is one quorum request: the pairs and the opinions asked on them.
type qgroup struct {
	pairs   []pair
	rows    []int32 // a sum group's rows (ascending; pairs are all their slots): opinions are row sums; nil for pairs
	asks    []*ask
	keys    map[string]bool // worker keys asked already: every opinion comes from other keys
	open    int             // asks not complete
	decided bool
	win     *ask      // the decisive full opinion; nil when decided by ref
	ref     []float32 // the backbone's outputs when it decided
	waiting bool      // queued in call.missing for a holder
	dispute bool      // two complete opinions disagreed
	// audit: drawn (CheckRate) for a comparison of the agreed outputs with
	// the backbone's own, computed in the step's local batch (auditRef).
	audit    bool
	auditRef []float32
}

// noOpinion reports whether every ask of g that went to worker key id
// failed (no job of id answered in time): id has given g no opinion.
func (g *qgroup) noOpinion(id string) bool {
	for _, a := range g.asks {
		for _, j := range a.jobs {
			if j.c.worker == id && !a.failed {
				return false
			}
		}
	}
	return true
}

// ask is one opinion on all of a group's pairs: a DIGEST from one worker,
// or RESULTs from one or more workers (jobs), each for the pairs at its
// indices in the group.
type ask struct {
	g      *qgroup
	jobs   []*job
	digest bool
	left   int  // jobs not answered
	failed bool // a job failed: no opinion
	done   bool // every job answered
	out    []float32
	sum    [32]byte // DIGEST's, or the RESULT payload digest of a full opinion
	hasSum bool
	exact  bool    // every worker is a CPU backend
	tol    float64 // the loosest tolerance of its workers
}

// draw picks, for expert e, a random holder A and a random holder B under
// another key (nil when none) from idx, skipping closed sessions.
func (cl *call) draw(idx map[uint64][]*conn, e int) (a, b *conn) {
	var hs []*conn
	for _, c := range idx[key(cl.layer, e)] {
		if !c.isClosed() {
			hs = append(hs, c)
		}
	}
	if len(hs) == 0 {
		return nil, nil
	}
	a = hs[rand.IntN(len(hs))]
	var bs []*conn
	for _, c := range hs {
		if c.worker != a.worker {
			bs = append(bs, c)
		}
	}
	if len(bs) > 0 {
		b = bs[rand.IntN(len(bs))]
	}
	return a, b
}

// startQuorum routes a call under quorum: each request to two holders (see
// the top of the file). Pairs with fewer than two holder keys are
// returned as local when Fallback computes them; the others start a
// group that asks for more holders, or waits for them.
func (cl *call) startQuorum(idx map[uint64][]*conn) (local []pair, audits []*qgroup) {
	d := cl.d
	type duo struct{ a, b *conn }
	draws := map[int]duo{}
	by := map[duo][]pair{}
	var order []duo
	var orphans []pair
	sumBy := map[duo][]int32{} // rows of sum groups, by their pair of full holders
	var sumOrder []duo
	sums := cl.sumsOn()
	n := len(cl.ids) / cl.k
	for r := 0; r < n; r++ {
		if sums {
			if a, b := cl.sumDuo(idx, r); a != nil {
				dw := duo{a, b}
				if sumBy[dw] == nil {
					sumOrder = append(sumOrder, dw)
				}
				sumBy[dw] = append(sumBy[dw], int32(r))
				continue
			}
		}
		for s := 0; s < cl.k; s++ {
			p := pair{int32(r), int32(s)}
			e := cl.expert(p)
			dw, ok := draws[e]
			if !ok {
				dw.a, dw.b = cl.draw(idx, e)
				draws[e] = dw
			}
			switch {
			case dw.b == nil && d.localOK(cl.layer, e):
				local = append(local, p)
			case dw.a == nil:
				orphans = append(orphans, p)
			default:
				if by[dw] == nil {
					order = append(order, dw)
				}
				by[dw] = append(by[dw], p)
			}
		}
	}
	// Every first holder's request goes out before any second holder's: a
	// worker that is A of one request and B of another computes and uploads
	// its RESULT first, and its digest while that RESULT is on the way.
	type start struct {
		g  *qgroup
		dw duo
	}
	var starts []start
	for _, dw := range sumOrder {
		for _, part := range d.splitRows(sumBy[dw]) {
			g := cl.newGroup(cl.rowPairs(part))
			g.rows = part
			if p := d.cfg.CheckRate; p > 0 && cl.allLocal(g.pairs) && (p >= 1 || rand.Float64() < p) {
				g.audit = true
				audits = append(audits, g)
				d.quorumAudits.Add(1)
			}
			cl.sendAsk(g, []*conn{dw.a}, [][]int{seq(len(part))}, false)
			starts = append(starts, start{g, dw})
		}
	}
	for _, dw := range order {
		for _, part := range d.splitPairs(by[dw]) {
			g := cl.newGroup(part)
			if p := d.cfg.CheckRate; dw.b != nil && p > 0 && cl.allLocal(part) && (p >= 1 || rand.Float64() < p) {
				g.audit = true
				audits = append(audits, g)
				d.quorumAudits.Add(1)
			}
			cl.sendAsk(g, []*conn{dw.a}, [][]int{seq(len(part))}, false)
			starts = append(starts, start{g, dw})
		}
	}
	for _, st := range starts {
		if b := st.dw.b; b != nil {
			cl.sendAsk(st.g, []*conn{b}, [][]int{seq(st.g.units())}, st.dw.a.tol == 0 && b.tol == 0)
			d.quorumReqs.Add(1)
		}
		cl.advance(st.g)
	}
	if len(orphans) > 0 {
		cl.advance(cl.newGroup(orphans))
	}
	return local, audits
}

// sumDuo draws, for row r, a random CPU holder A of all its k experts and
// a random one B under another key; nil, nil when the row has no two such
// keys, or only two while Fallback cannot compute every pair of the row
// and every pair has a third holder key (a disagreement on the sum could
// not be decided, on the pairs it could).
func (cl *call) sumDuo(idx map[uint64][]*conn, r int) (a, b *conn) {
	k := cl.k
	var buf [8]*conn
	cands := buf[:0]
	keys := 0
	for _, c := range idx[key(cl.layer, int(cl.ids[r*k]))] {
		if c.tol != 0 || c.isClosed() {
			continue
		}
		all := true
		for s := 1; s < k && all; s++ {
			all = slices.Contains(idx[key(cl.layer, int(cl.ids[r*k+s]))], c)
		}
		if !all {
			continue
		}
		if !slices.ContainsFunc(cands, func(x *conn) bool { return x.worker == c.worker }) {
			keys++
		}
		cands = append(cands, c)
	}
	if keys < 2 {
		return nil, nil
	}
	if keys < 3 && !cl.rowLocal(r) && cl.pairsArbitrable(idx, r) {
		return nil, nil
	}
	a = cands[rand.IntN(len(cands))]
	var bs [8]*conn
	others := bs[:0]
	for _, c := range cands {
		if c.worker != a.worker {
			others = append(others, c)
		}
	}
	return a, others[rand.IntN(len(others))]
}

// rowLocal reports whether Fallback computes every pair of row r.
func (cl *call) rowLocal(r int) bool {
	for s := 0; s < cl.k; s++ {
		if !cl.d.localOK(cl.layer, int(cl.ids[r*cl.k+s])) {
			return false
		}
	}
	return true
}

// pairsArbitrable reports whether every expert of row r has connected
// holders under three keys or more (a third opinion on each pair exists).
func (cl *call) pairsArbitrable(idx map[uint64][]*conn, r int) bool {
	for s := 0; s < cl.k; s++ {
		var keys [3]string
		n := 0
		for _, c := range idx[key(cl.layer, int(cl.ids[r*cl.k+s]))] {
			if n < 3 && !c.isClosed() && !slices.Contains(keys[:n], c.worker) {
				keys[n] = c.worker
				n++
			}
		}
		if n < 3 {
			return false
		}
	}
	return true
}

// units is the number of output rows of one of g's full opinions: its
// pairs, or its rows for a sum group.
func (g *qgroup) units() int {
	if g.rows != nil {
		return len(g.rows)
	}
	return len(g.pairs)
}

// useGroup places g's decided outputs out (g.units() x D): a sum group's
// row sums into the caller's sums (marked done), pair outputs into out.
func (cl *call) useGroup(g *qgroup, out []float32) {
	if g.rows == nil {
		cl.scatter(g.pairs, out)
		return
	}
	D := cl.d.cfg.Model.D
	for i, r := range g.rows {
		copy(cl.sums[int(r)*D:(int(r)+1)*D], out[i*D:(i+1)*D])
		cl.summed[r] = true
	}
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

func (cl *call) newGroup(ps []pair) *qgroup {
	g := &qgroup{pairs: ps, keys: map[string]bool{}}
	cl.groups = append(cl.groups, g)
	return g
}

// sendAsk asks workers cs (one for a digest) for the group's pairs at
// indices idx[i] each (a sum group: for the sums of its rows at indices
// idx[i], one worker); a request that cannot be sent fails at once (its
// ask then gives no opinion).
func (cl *call) sendAsk(g *qgroup, cs []*conn, idx [][]int, digest bool) {
	D := cl.d.cfg.Model.D
	a := &ask{g: g, digest: digest, exact: true}
	if !digest {
		a.out = make([]float32, g.units()*D)
	}
	g.asks = append(g.asks, a)
	g.open++
	a.left = len(cs)
	for i, c := range cs {
		var ps []pair
		if g.rows != nil {
			rows := make([]int32, len(idx[i]))
			for n, k := range idx[i] {
				rows[n] = g.rows[k]
			}
			ps = cl.rowPairs(rows)
		} else {
			ps = make([]pair, len(idx[i]))
			for n, k := range idx[i] {
				ps[n] = g.pairs[k]
			}
		}
		g.keys[c.worker] = true
		a.exact = a.exact && c.tol == 0
		a.tol = max(a.tol, c.tol)
		j := cl.newJob(c, ps, true)
		j.qa, j.qi, j.digest, j.sum = a, idx[i], digest, g.rows != nil
		j.wantSum = !digest && len(cs) == 1 && c.tol == 0
		a.jobs = append(a.jobs, j)
		if err := cl.send(j); err != nil {
			j.done <- reply{err: err}
			cl.live = append(cl.live, j)
			continue
		}
		cl.until = maxTime(cl.until, j.end)
	}
}

// resolveQuorum takes one reply of a quorum job.
func (cl *call) resolveQuorum(j *job, rep reply) error {
	d := cl.d
	D := d.cfg.Model.D
	a := j.qa
	g := a.g
	a.left--
	if rep.err != nil {
		d.fails.Add(1)
		cl.failed[j.c] = true
		a.failed = true
		d.log.Debug("dispatch: quorum request failed", "worker", short(j.c.worker), "req", j.req, "err", rep.err)
	} else {
		j.rep = &rep
		if a.digest {
			d.digests.Add(1)
			j.c.digests.Add(1)
		} else {
			for n, i := range j.qi {
				copy(a.out[i*D:(i+1)*D], rep.out[n*D:(n+1)*D])
			}
		}
		if rep.hasSum && len(a.jobs) == 1 {
			a.sum, a.hasSum = rep.sum, true
		}
	}
	if a.left > 0 {
		return nil
	}
	g.open--
	if a.failed {
		for _, x := range a.jobs { // answered, unused, unverified: the work was asked for
			if x.rep != nil && x.rep.err == nil {
				x.c.verdict(x, true)
				d.unverified.Add(uint64(len(x.pairs)))
			}
		}
	} else {
		a.done = true
		if g.decided {
			cl.judge(g, a) // a late opinion: judged against the decision
			return nil
		}
	}
	if g.decided {
		return nil
	}
	return cl.advance(g)
}

// advance decides g if two opinions agree; otherwise it waits for the
// asks out while they can still decide, decides with the backbone's own
// outputs when it can compute them, or asks further holders (or waits for
// one).
func (cl *call) advance(g *qgroup) error {
	if g.decided || cl.tryDecide(g) {
		return nil
	}
	ops, full := 0, false
	for _, a := range g.asks {
		if a.done || (!a.failed && a.left > 0) {
			full = full || !a.digest
		}
		if a.done {
			ops++
		}
	}
	if g.open > 0 && full && ops+g.open >= 2 {
		return nil // the answers out can still decide
	}
	if cl.allLocal(g.pairs) {
		return cl.decideLocal(g)
	}
	if g.open > 0 || g.waiting {
		return nil
	}
	d := cl.d
	d.mu.Lock()
	idx := d.index
	d.mu.Unlock()
	if !cl.askMore(g, idx, false) {
		g.waiting = true
		cl.wait(waiting{pairs: g.pairs, q: g})
	}
	return nil
}

// askMore asks one more opinion on g from holders under keys not asked
// yet: a digest from one CPU holder of every pair's expert when the only
// opinion is an exact full one, else full RESULTs from as few holders as
// cover the pairs. It reports whether it sent one.
func (cl *call) askMore(g *qgroup, idx map[uint64][]*conn, allowFailed bool) bool {
	d := cl.d
	skip := func(x *conn) bool {
		if !allowFailed {
			return g.keys[x.worker] || cl.failed[x]
		}
		// A key whose every ask of g failed (late, refused) gave no
		// opinion: with no other key left it is asked again.
		return g.keys[x.worker] && !g.noOpinion(x.worker)
	}
	var done []*ask
	for _, a := range g.asks {
		if a.done {
			done = append(done, a)
		}
	}
	if g.rows != nil {
		// A sum group asks one full CPU holder of every row: the digest
		// of its sums to confirm a lone exact answer, else its sums.
		x := cl.holderOfAll(idx, g.pairs, func(x *conn) bool { return skip(x) || x.tol != 0 })
		if x == nil {
			return false
		}
		cl.sendAsk(g, []*conn{x}, [][]int{seq(len(g.rows))}, len(done) == 1 && !done[0].digest && done[0].exact)
		d.quorumAsks.Add(1)
		return true
	}
	if len(done) == 1 && !done[0].digest && done[0].exact {
		if x := cl.holderOfAll(idx, g.pairs, func(x *conn) bool { return skip(x) || x.tol != 0 }); x != nil {
			cl.sendAsk(g, []*conn{x}, [][]int{seq(len(g.pairs))}, true)
			d.quorumAsks.Add(1)
			return true
		}
	}
	order, _, byIdx, left, _ := cl.group(idx, g.pairs, seq(len(g.pairs)), skip)
	if len(left) > 0 || len(order) == 0 {
		return false
	}
	parts := make([][]int, len(order))
	for i, x := range order {
		parts[i] = byIdx[x]
	}
	cl.sendAsk(g, order, parts, false)
	d.quorumAsks.Add(1)
	return true
}

// holderOfAll returns a random connected holder of every pair's expert for
// which skip is false; nil if none.
func (cl *call) holderOfAll(idx map[uint64][]*conn, ps []pair, skip func(*conn) bool) *conn {
	var cands []*conn
	for _, c := range idx[key(cl.layer, cl.expert(ps[0]))] {
		if skip(c) || c.isClosed() {
			continue
		}
		all := true
		for _, p := range ps[1:] {
			if !slices.Contains(idx[key(cl.layer, cl.expert(p))], c) {
				all = false
				break
			}
		}
		if all {
			cands = append(cands, c)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	return cands[rand.IntN(len(cands))]
}

// sumOf returns the digest of a full opinion: the SHA-256 of the bytes
// m u32 | d u32 | out a RESULT of its outputs carries after the request id.
func (cl *call) sumOf(a *ask) [32]byte {
	if !a.hasSum {
		a.sum, a.hasSum = payloadSum(a.out, cl.d.cfg.Model.D), true
	}
	return a.sum
}

// payloadSum is wire.ResultDigest of a RESULT carrying out (rows of d).
func payloadSum(out []float32, d int) [32]byte { return wire.OutputsDigest(len(out)/d, d, out) }

// agree reports whether opinion o agrees with the full opinion f: a digest
// equals the digest of f's outputs (f exact), full outputs agree per row
// within the looser tolerance (bits when both are exact).
func (cl *call) agree(f, o *ask) bool {
	if o.digest {
		return f.exact && o.sum == cl.sumOf(f)
	}
	if f.exact && o.exact && f.hasSum && o.hasSum {
		return f.sum == o.sum
	}
	D := cl.d.cfg.Model.D
	tol := max(f.tol, o.tol)
	for i := 0; i*D < len(f.out); i++ {
		if !rowsAgree(f.out[i*D:(i+1)*D], o.out[i*D:(i+1)*D], tol) {
			return false
		}
	}
	return true
}

// tryDecide decides g by the first full opinion another one agrees with,
// exact (CPU) opinions first: a GPU's answer that agrees within the
// tolerance with a CPU holder's confirms it, and the CPU's bits are used.
func (cl *call) tryDecide(g *qgroup) bool {
	var done []*ask
	for _, a := range g.asks {
		if a.done {
			done = append(done, a)
		}
	}
	slices.SortStableFunc(done, func(a, b *ask) int {
		switch {
		case a.exact && !b.exact:
			return -1
		case b.exact && !a.exact:
			return 1
		}
		return 0
	})
	for _, f := range done {
		if f.digest {
			continue
		}
		for _, o := range done {
			if o != f && cl.agree(f, o) {
				d := cl.d
				if g.auditRef != nil && !cl.matches(f, g.auditRef) {
					// Two holders agree on outputs that are not the
					// backbone's: colluders, caught by the audit.
					d.log.Warn("dispatch: quorum audit: agreeing holders differ from the backbone's outputs", "layer", cl.layer, "pairs", len(g.pairs))
					cl.decideRef(g, g.auditRef)
					return true
				}
				g.decided, g.win = true, f
				cl.useGroup(g, f.out)
				d.remote.Add(uint64(len(g.pairs)))
				d.quorumAgreed.Add(1)
				for _, a := range done {
					cl.judge(g, a)
				}
				return true
			}
		}
	}
	if len(done) >= 2 && !g.dispute {
		g.dispute = true
		cl.d.quorumDisputes.Add(1)
		cl.d.log.Warn("dispatch: quorum holders disagree", "layer", cl.layer, "pairs", len(g.pairs), "opinions", len(done))
	}
	return false
}

// decideLocal decides g with the backbone's own outputs for its pairs
// (a sum group: their sums).
func (cl *call) decideLocal(g *qgroup) error {
	d := cl.d
	if g.auditRef != nil {
		cl.decideRef(g, g.auditRef)
		return nil
	}
	t0 := time.Now()
	ref, err := d.computePairs(cl.ctx, cl.layer, cl.hidden, cl.ids, cl.k, g.pairs)
	if err != nil {
		return err
	}
	if g.rows != nil {
		ref = cl.rowSums(g.rows, ref)
	}
	d.checkNanos.Add(int64(time.Since(t0)))
	cl.decideRef(g, ref)
	return nil
}

// matches reports whether the full opinion f agrees with the backbone's
// outputs ref row by row (within f's tolerance; bits for CPU backends).
func (cl *call) matches(f *ask, ref []float32) bool {
	D := cl.d.cfg.Model.D
	for i := 0; i*D < len(ref); i++ {
		if !rowsAgree(f.out[i*D:(i+1)*D], ref[i*D:(i+1)*D], f.tol) {
			return false
		}
	}
	return true
}

// decideRef decides g with the backbone's outputs ref (g.units() x D) and
// judges the opinions in.
func (cl *call) decideRef(g *qgroup, ref []float32) {
	d := cl.d
	g.decided, g.ref = true, ref
	cl.useGroup(g, ref)
	cl.nLocal += len(g.pairs)
	d.quorumLocal.Add(1)
	for _, a := range g.asks {
		if a.done {
			cl.judge(g, a)
		}
	}
}

// judge gives the jobs of a complete opinion a their verdicts against g's
// decision: those that agree are accepted, those that differ are caught.
func (cl *call) judge(g *qgroup, a *ask) {
	d := cl.d
	D := d.cfg.Model.D
	if a == g.win {
		for _, x := range a.jobs {
			cl.pass(x)
		}
		return
	}
	want := g.ref
	if want == nil {
		want = g.win.out
	}
	if a.digest {
		x := a.jobs[0]
		var sum [32]byte
		if g.win != nil {
			sum = cl.sumOf(g.win)
		} else {
			sum = payloadSum(want, D)
		}
		if a.sum == sum {
			cl.pass(x)
		} else {
			cl.caught(x, fmt.Sprintf("its DIGEST %x differs from the agreed outputs' %x", a.sum[:6], sum[:6]))
		}
		return
	}
	for _, x := range a.jobs {
		var why string
		for n, i := range x.qi {
			got, ref := x.rep.out[n*D:(n+1)*D], want[i*D:(i+1)*D]
			tol := x.c.tol
			if g.win != nil {
				tol = max(tol, g.win.tol)
			}
			if !rowsAgree(got, ref, tol) {
				why = fmt.Sprintf("output row %d differs from the agreed outputs", n)
				break
			}
		}
		if why == "" {
			cl.pass(x)
		} else {
			cl.caught(x, why)
		}
	}
}

// pass accepts a quorum job's answer.
func (cl *call) pass(x *job) {
	cl.d.checks.Add(1)
	cl.d.checkPairs.Add(uint64(len(x.pairs)))
	x.c.checks.Add(1)
	x.c.passed.Add(1)
	x.c.verdict(x, true)
}

// caught handles a quorum job whose answer differs from the decision.
func (cl *call) caught(x *job, why string) {
	d := cl.d
	d.checks.Add(1)
	d.checkPairs.Add(uint64(len(x.pairs)))
	d.mismatches.Add(1)
	x.c.checks.Add(1)
	x.c.mismatches.Add(1)
	x.c.sendCtl(wire.LinkRejected, wire.AppendLinkRequest(nil, x.req))
	x.c.punish(fmt.Sprintf("verification failed (request %d)", x.req), "quorum: "+why)
	x.c.verified(x)
}

// abandonGroups gives the answered jobs of undecided groups their verdicts
// when the call fails: accepted (unused) unless opinions disagreed, then
// rejected, nobody banned.
func (cl *call) abandonGroups() {
	for _, g := range cl.groups {
		if g.decided {
			continue
		}
		for _, a := range g.asks {
			if !a.done {
				continue
			}
			for _, x := range a.jobs {
				x.c.verdict(x, !g.dispute)
			}
		}
	}
	cl.groups = nil
}
