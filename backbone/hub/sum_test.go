package hub

import (
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// TestSumMetering: the RESULT answering a DISPATCH_SUM is metered as the
// RESULT of the rows x k outputs summed in it (wire.SumCredit), as a
// DIGEST is metered as the RESULT it stands for; a RESULT of another shape
// for a sum request, or one for a request the hub saw no DISPATCH_SUM
// for, is metered as itself; the settled ledger holds exactly that.
// Sizes worked from the layouts (wire 6): DISPATCH_SUM of 2 rows, d 3,
// k 2: 24 + 4*2*3 + 4*2*2 + 4*2*2 = 80 bytes; its RESULT of 2 rows:
// 28 + 24 = 52 bytes, metered as the RESULT of 4 outputs: 28 + 48 = 76.
func TestSumMetering(t *testing.T) {
	r := newRig(t, func(c *Config) { c.SettleDelay = time.Hour })
	sum := func(req uint64) []byte {
		return (&wire.Dispatch{Request: req, Layer: 0, N: 2, D: 3, K: 2, Hidden: make([]float32, 6), IDs: []int32{0, 1, 1, 0},
			Sum: true, Weights: []float32{0.5, 0.5, 0.25, 0.75}}).Append(nil)
	}
	rows := func(req uint64, m int) []byte {
		return (&wire.Result{Request: req, M: m, D: 3, Out: make([]float32, m*3)}).Append(nil)
	}
	if len(sum(1)) != 80 || len(rows(1, 2)) != 52 {
		t.Fatalf("sizes %d %d", len(sum(1)), len(rows(1, 2)))
	}
	r.toWorker(t, sum(1))
	r.toWorker(t, sum(2))
	r.toBackbone(t, rows(1, 2)) // the sum's answer: 76
	r.toBackbone(t, rows(2, 1)) // one row short: 40, as itself
	r.toBackbone(t, rows(1, 2)) // a second answer: the sum is answered, 52 as itself
	r.toBackbone(t, rows(3, 2)) // no DISPATCH_SUM 3: 52 as itself
	rigWait(t, "pending", func() bool { return r.session(t).Pending == 2*80+76+40+52+52 })
	r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, 1))
	r.send(t, wire.LinkRejected, wire.AppendLinkRequest(nil, 2))
	r.send(t, wire.LinkRejected, wire.AppendLinkRequest(nil, 3))
	rigWait(t, "verdicts", func() bool { return r.session(t).Pending == 0 })
	// The first verdict for request 1 took both of its RESULTs' bytes
	// (pending is per request id): 76 + 52 accepted. The backbone
	// rejects a second answer as made-up work; the hub only meters.
	// Request 2's DISPATCH is paid only with an accepted answer: rejected.
	if s := r.session(t); s.CreditIn != 76+52 || s.CreditOut != 80 || s.Rejected != 80+40+52 || s.DispatchesSent != 2 {
		t.Fatalf("session %+v", s)
	}
	r.link.Close()
	rigWait(t, "the final row", func() bool { _, _, _, f := r.ledgerSums(t); return f })
	if in, out, rej, _ := r.ledgerSums(t); in != 76+52 || out != 80 || rej != 80+40+52 {
		t.Fatalf("ledger in %d out %d rejected %d", in, out, rej)
	}
}

// TestSumDigestMetering: the DIGEST answering a DISPATCH_SUM_DIGEST is
// metered as the RESULT of the rows x k outputs it stands for, as the sum
// RESULT it is the digest of (wire.SumDigestCredit); a DIGEST of another
// shape, a RESULT answering a DISPATCH_SUM_DIGEST, and a DIGEST answering
// a DISPATCH_SUM are metered as themselves (a DIGEST as the RESULT it
// names, DigestCredit); the settled ledger holds exactly that. Sizes worked
// from the layouts (wire 7): DISPATCH_SUM_DIGEST of 2 rows, d 3, k 2: 80
// bytes, as a DISPATCH_SUM; its DIGEST of 2 rows (52 bytes on the wire)
// names a sum RESULT of 28 + 24 = 52 bytes and is metered as the RESULT of
// 4 outputs: 28 + 48 = 76; a DIGEST of 1 row names 28 + 12 = 40.
func TestSumDigestMetering(t *testing.T) {
	r := newRig(t, func(c *Config) { c.SettleDelay = time.Hour })
	disp := func(req uint64, digest bool) []byte {
		return (&wire.Dispatch{Request: req, Layer: 0, N: 2, D: 3, K: 2, Hidden: make([]float32, 6), IDs: []int32{0, 1, 1, 0},
			Sum: true, Digest: digest, Weights: []float32{0.5, 0.5, 0.25, 0.75}}).Append(nil)
	}
	digest := func(req uint64, m int) []byte { return (&wire.Digest{Request: req, M: m, D: 3}).Append(nil) }
	rows := func(req uint64, m int) []byte {
		return (&wire.Result{Request: req, M: m, D: 3, Out: make([]float32, m*3)}).Append(nil)
	}
	if len(disp(1, true)) != 80 || len(digest(1, 2)) != wire.DigestSize {
		t.Fatalf("sizes %d %d", len(disp(1, true)), len(digest(1, 2)))
	}
	r.toWorker(t, disp(1, true))
	r.toWorker(t, disp(2, true))
	r.toWorker(t, disp(3, true))
	r.toWorker(t, disp(4, false))
	r.toBackbone(t, digest(1, 2)) // the sum digest's answer: 76
	r.toBackbone(t, digest(2, 1)) // one row short: the RESULT it names, 40
	r.toBackbone(t, rows(3, 2))   // a RESULT for a digest request: 52 as itself
	r.toBackbone(t, digest(4, 2)) // a DIGEST for a DISPATCH_SUM: 52, the RESULT it names
	rigWait(t, "pending", func() bool { return r.session(t).Pending == 4*80+76+40+52+52 })
	r.send(t, wire.LinkAccepted, wire.AppendLinkRequest(nil, 1))
	for req := uint64(2); req <= 4; req++ {
		r.send(t, wire.LinkRejected, wire.AppendLinkRequest(nil, req))
	}
	rigWait(t, "verdicts", func() bool { return r.session(t).Pending == 0 })
	if s := r.session(t); s.CreditIn != 76 || s.CreditOut != 80 || s.Rejected != 3*80+40+52+52 || s.DispatchesSent != 4 {
		t.Fatalf("session %+v", s)
	}
	r.link.Close()
	rigWait(t, "the final row", func() bool { _, _, _, f := r.ledgerSums(t); return f })
	if in, out, rej, _ := r.ledgerSums(t); in != 76 || out != 80 || rej != 3*80+40+52+52 {
		t.Fatalf("ledger in %d out %d rejected %d", in, out, rej)
	}
}
