package dispatch

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Verification (docs/accounting.md, "Verification and forfeit").
//
// Which results are checked is decided when the request is sent, before the
// worker could know anything about it: every request while the session has
// passed fewer than Probation checks, then each with probability CheckRate
// (math/rand/v2's global generator, seeded from the OS per process). The
// DISPATCH of a checked request is the same frame as any other, and the
// worker sees nothing of the verdict (it travels to the hub only), so the
// only thing it can observe is timing after it has answered: a checked step
// may end later, which tells it nothing about the next draw.
//
// A checked result is compared with Fallback's outputs for the same pairs:
// bit for bit for a CPU backend (expert.Local is bit-identical on every
// architecture), within Tolerance per output row for any other declared
// backend. The RESULT's verdict (LinkAccepted or LinkRejected) is sent
// once the comparison is done; the hub meters nothing before it.

// isCPUBackend reports whether a HELLO backend is held to exact bits: "cpu"
// or "cpu-<anything>" (the backbone worker sends "cpu-" + GOARCH, the app
// and mobile "cpu").
func isCPUBackend(b string) bool { return b == "cpu" || strings.HasPrefix(b, "cpu-") }

// chooseCheck draws whether the next request to c is checked.
func (c *conn) chooseCheck() bool {
	if c.passed.Load() < uint64(c.d.cfg.Probation) {
		return true
	}
	p := c.d.cfg.CheckRate
	return p > 0 && (p >= 1 || rand.Float64() < p)
}

// compare checks a worker's outputs against the reference (both n x d):
// bit for bit when c's tolerance is 0, else per row of d within it. It
// returns "" when they agree, else what differs.
func (c *conn) compare(got, ref []float32, d int) string {
	if len(got) != len(ref) {
		return fmt.Sprintf("%d outputs, want %d", len(got), len(ref))
	}
	if c.tol == 0 {
		for i := range got {
			if math.Float32bits(got[i]) != math.Float32bits(ref[i]) {
				return fmt.Sprintf("output %d is %#08x, recomputed %#08x", i, math.Float32bits(got[i]), math.Float32bits(ref[i]))
			}
		}
		return ""
	}
	for r := 0; r*d < len(got); r++ {
		var diff, norm float64
		for i := r * d; i < (r+1)*d; i++ {
			x, y := float64(got[i]), float64(ref[i])
			diff += (x - y) * (x - y)
			norm += y * y
		}
		if !(math.Sqrt(diff) <= c.tol*math.Sqrt(norm)) { // also catches NaN
			return fmt.Sprintf("row %d is off by %.3g relative (tolerance %.3g)", r, math.Sqrt(diff/norm), c.tol)
		}
	}
	return ""
}

// verdict tells the hub whether j's RESULT is creditable and, for a checked
// request, ends the wait of a session that is closing (verifying).
func (c *conn) verdict(j *job, accepted bool) {
	kind := wire.LinkRejected
	if accepted {
		kind = wire.LinkAccepted
	}
	c.sendCtl(kind, wire.AppendLinkRequest(nil, j.req))
	c.verified(j)
}

// verified ends, for a checked or hedged request, the wait of a closing
// session for its verdict (and for a FORFEIT that follows it).
func (c *conn) verified(j *job) {
	if j.check || j.hedged {
		c.verifying.Add(-1)
	}
}

// punish handles a worker caught cheating (a result that failed its check,
// or a RESULT for a request it was never sent): the hub forfeits the
// session's unsettled bytes, the key is banned for BanFor (durably when
// there is a ban file) and the session is closed, and so is every other
// session of the same key, with the same forfeit. A session is punished
// once; later calls do nothing. reason is short (it
// travels in the WebSocket close frame, at most 123 bytes with the ban);
// detail goes to the log and the ban record.
func (c *conn) punish(reason, detail string) {
	if !c.punished.CompareAndSwap(false, true) {
		return // caught already (another of its results in the same step)
	}
	d := c.d
	now := time.Now()
	until := now.Add(d.cfg.BanFor)
	d.caught.Add(1)
	why := reason + ": " + detail
	if err := d.bans.Add(c.worker, now, until, why); err != nil {
		d.log.Error("dispatch: ban not saved", "worker", short(c.worker), "err", err)
	}
	d.log.Warn("dispatch: worker caught", "session", c.session, "worker", short(c.worker), "why", why,
		"banned_until", until.UTC().Format(time.RFC3339))
	closing := fmt.Sprintf("%s: uncredited bytes forfeited, key banned for %v", reason, d.cfg.BanFor)
	c.sendCtl(wire.LinkForfeit, wire.AppendLinkForfeit(nil, why))
	c.close(wire.CodeBadResult, closing)
	// The same key's other sessions (another connection of the same
	// worker) share the ban and the forfeit.
	d.mu.Lock()
	var others []*conn
	for _, o := range d.workers {
		if o.worker == c.worker && o != c {
			others = append(others, o)
		}
	}
	d.mu.Unlock()
	for _, o := range others {
		o.sendCtl(wire.LinkForfeit, wire.AppendLinkForfeit(nil, "another session of this key: "+why))
		o.close(wire.CodeBadResult, closing)
	}
}

// Bans returns the dispatcher's ban list.
func (d *Dispatcher) Bans() *Bans { return d.bans }
