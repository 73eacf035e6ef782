package dispatch

import (
	"time"
)

// Replica choice and hedging (issue 19, Config.Hedge).
//
// Choice: each (layer, expert) pair goes to one of its holders whose
// recent latency (an exponentially weighted mean of its round trips, a
// hedged-away request counting with the time it had taken so far) is
// within 25 % + 0.5 ms of the fastest holder's, rotating among those as
// without Hedge (so equal holders share the load); a holder with no
// estimate yet, or none for hedgeProbe, is a candidate too (it is probed
// again).
//
// Hedging: a plain request (spot verification; not a replica, capacity
// twin, arbiter or quorum request) still unanswered hedgeDelay after it
// was sent (its holder's recent p95 latency plus its bytes at the holder's
// throughput) is sent again, the same pairs, to the fastest other holder
// that holds all of them. The first valid answer is used: a hedged
// request's answer is checked exactly as any other (chosen for a check
// when sent, the hedge of a checked request carries its reference and is
// checked too), and one that fails its check is punished and never used.
//
// Metering: both DISPATCHes are creditable to their workers (as every
// DISPATCH is: the hub meters it when it passes). The verdict of a hedged
// request's RESULT is held until the call decides: the answer used is
// ACCEPTED, the other one is REJECTED (the loser is not paid for a RESULT
// nobody used; if it had not answered yet, its request is given up and
// its RESULT arrives late, which is REJECTED too). No answer is paid
// twice and no two answers are paid for one use.

// hedgeProbe is how long a holder without a new latency sample stays out
// of the candidates before it is tried again.
const hedgeProbe = 2 * time.Second

// noteLatency folds one observed latency into c's estimate (1/8 weight).
func (c *conn) noteLatency(d time.Duration) {
	c.mu.Lock()
	if c.lat == 0 {
		c.lat = d
	} else {
		c.lat += (d - c.lat) / 8
	}
	c.latAt = time.Now()
	c.mu.Unlock()
}

// latency returns c's latency estimate and whether it is fresh (0, false
// without one).
func (c *conn) latency(now time.Time) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.lat, c.lat > 0 && now.Sub(c.latAt) < hedgeProbe
}

// pick chooses the holder of expert e among hs for call seq: rotation
// among all of them without Hedge, else among the fast ones (above).
func (d *Dispatcher) pick(hs []*conn, e int, seq uint64) *conn {
	if !d.cfg.Hedge || len(hs) == 1 {
		return hs[(uint64(e)+seq)%uint64(len(hs))]
	}
	now := time.Now()
	var lats [8]time.Duration
	var fresh [8]bool
	best := time.Duration(-1)
	for i, c := range hs {
		if i >= len(lats) {
			break
		}
		lats[i], fresh[i] = c.latency(now)
		if fresh[i] && (best < 0 || lats[i] < best) {
			best = lats[i]
		}
	}
	ok := func(i int) bool {
		return i >= len(lats) || !fresh[i] || best < 0 || lats[i] <= best+best/4+500*time.Microsecond
	}
	n := 0
	for i := range hs {
		if ok(i) {
			n++
		}
	}
	k := int((uint64(e) + seq) % uint64(n))
	for i, c := range hs {
		if ok(i) {
			if k == 0 {
				return c
			}
			k--
		}
	}
	return hs[0]
}

// hedgeDelay is how long a request of the given bytes (DISPATCH + RESULT)
// to c waits before it is hedged: the p95 of c's recent latencies (round
// trips less their bytes at the median throughput, as in deadline) plus
// the bytes at that throughput; 0 (never) with fewer than 8 samples.
func (c *conn) hedgeDelay(bytes int) time.Duration {
	ss := c.samples()
	if len(ss) < 8 {
		return 0
	}
	bw, lat := latencyModel(ss)
	return time.Duration(quantile(lat, 0.95)) + time.Duration(float64(bytes)/bw*1e9)
}

// markHedged flags j, while it is still pending, as hedged: its answer's
// verdict then waits for the call's decision (answer). False if j's
// answer is already in (no hedge is needed then).
func (c *conn) markHedged(j *job) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pending[j.req] != j {
		return false
	}
	j.hedged = true
	return true
}

// hedgeable reports whether j may be hedged now.
func (j *job) hedgeable() bool {
	return j.qa == nil && j.twin == nil && j.arb == nil && !j.replica && !j.hedged && j.sib == nil && !j.hedgeAt.IsZero()
}

// hedge sends j's pairs to the fastest other live holder of all of them
// (not one that failed in this call) as a hedged request; it reports
// whether one was sent. j is marked tried either way.
func (cl *call) hedge(j *job) bool {
	d := cl.d
	j.hedgeAt = time.Time{}
	d.mu.Lock()
	idx := d.index
	d.mu.Unlock()
	now := time.Now()
	var best *conn
	var bestLat time.Duration
	for _, c := range idx[key(cl.layer, int(cl.ids[int(j.pairs[0].r)*cl.k+int(j.pairs[0].s)]))] {
		if c == j.c || cl.failed[c] || c.isClosed() || !cl.holdsAll(c, j.pairs) {
			continue
		}
		lat, _ := c.latency(now)
		if best == nil || lat < bestLat {
			best, bestLat = c, lat
		}
	}
	if best == nil || !j.c.markHedged(j) {
		return false
	}
	hj := cl.newJob(best, j.pairs, j.ref != nil || best.chooseCheck())
	// best holds every pair's expert: a sum job's hedge is a sum job too.
	hj.ref, hj.sum, hj.hedged, hj.sib, j.sib = j.ref, j.sum, true, j, hj
	if err := cl.send(hj); err != nil {
		j.sib = nil
		return false
	}
	d.hedges.Add(1)
	return true
}

// holdsAll reports whether c holds the experts of every pair.
func (cl *call) holdsAll(c *conn, ps []pair) bool {
	cl.d.mu.Lock()
	holds := c.holds
	cl.d.mu.Unlock()
	for _, p := range ps {
		if _, ok := holds[key(cl.layer, int(cl.ids[int(p.r)*cl.k+int(p.s)]))]; !ok {
			return false
		}
	}
	return true
}

// resolveHedged handles the reply of a hedged request j (sib is the other
// of the two, nil once resolved). It returns done = true when the reply
// is fully handled here; false sends it down resolve's usual path (a
// valid answer used, or a failure of both).
func (cl *call) resolveHedged(j *job, rep reply) (done bool) {
	sib := j.sib
	if j.lost {
		// The other answer was used: this one is not (REJECTED, unpaid).
		if rep.err == nil {
			j.c.verdict(j, false)
			cl.d.hedgeLost.Add(1)
		}
		return true
	}
	if rep.err != nil && sib != nil && !sib.lost && !sib.resolved {
		// The other may still answer: wait for it.
		j.resolved = true
		cl.d.fails.Add(1)
		cl.failed[j.c] = true
		return true
	}
	return false
}

// settleHedge, once j's pairs are filled (by its answer, or by a
// reference replacing a failed check), gives up j's sibling: a pending
// one is expired (its RESULT will be late: REJECTED), one whose answer is
// in (or on its way) is marked lost and REJECTED when resolved.
func (cl *call) settleHedge(j *job) {
	j.resolved = true
	sib := j.sib
	if sib == nil || sib.resolved {
		return
	}
	if j.c != sib.c && sib != nil && j.hedgeWon() {
		cl.d.hedgeWins.Add(1)
	}
	if sib.c.take(sib.req, true) != nil {
		sib.dropped, sib.resolved = true, true
		sib.c.noteLatency(time.Since(sib.sent)) // at least this slow
		return
	}
	sib.lost = true
}

// hedgeWon reports whether j is the hedge (the second request) of its pair.
func (j *job) hedgeWon() bool { return j.sib != nil && j.sib.sent.Before(j.sent) }
