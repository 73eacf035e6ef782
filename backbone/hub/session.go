package hub

import (
	"context"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// SessionStats is a snapshot of one session's counts; bytes are whole
// WebSocket message bytes.
type SessionStats struct {
	ID, WorkerID    string
	Started         time.Time
	Ended           bool   // the session ended and its Final ledger row is appended (at once without a ledger)
	Reason          string // why it ended ("" while open)
	ToWorker        uint64 // all bytes backbone -> worker
	FromWorker      uint64 // all bytes worker -> backbone
	CreditOut       uint64 // DISPATCH (DISPATCH_DIGEST, DISPATCH_SUM, DISPATCH_SUM_DIGEST) bytes of requests whose answer was accepted (creditable; settled or not, never forfeited ones)
	CreditIn        uint64 // accepted RESULT bytes (creditable; settled or not, never forfeited ones; a DIGEST's or a sum's: the RESULT it stands for)
	Unsettled       uint64 // creditable bytes (of CreditOut + CreditIn) not yet settled into the ledger
	Rejected        uint64 // bytes never credited: worker bytes refused, late, malformed or never accepted, DISPATCH bytes of requests no accepted answer came for, and forfeited bytes
	Forfeited       uint64 // creditable bytes (included in Rejected) forfeited by a LinkForfeit
	ForfeitReason   string // the backbone's reason ("" without a forfeit)
	Pending         uint64 // DISPATCH and RESULT bytes awaiting the backbone's verdict on their request
	Messages        uint64 // messages bridged, both ways
	DispatchesSent  uint64 // DISPATCH messages to the worker
	ResultsReceived uint64 // RESULT messages from the worker
}

// pendingResult is a request's bytes awaiting the backbone's verdict: the
// DISPATCH that asked (out) and the answer (in: a RESULT, or a DIGEST as
// the RESULT it stands for); at is when the last of them passed.
type pendingResult struct {
	out, in uint64
	at      time.Time
	allow   int // the largest answer the DISPATCH allows: a RESULT of its n x k outputs (0: none seen)
}

// ControlMessageCap is the largest worker message the hub reads while the
// session has no request outstanding that a larger answer could be for: a
// HELLO or HOLDINGS of 110,000 holdings (38 bytes each; Qwen3.5-397B-A17B
// has 60 x 512 experts). A larger message is refused with 1009 before it
// is read in full, so a session costs the hub at most this much memory
// unless the backbone asked it for more.
const ControlMessageCap = 4 << 20

// answerCap is the largest worker message the session may send now: the
// largest answer allowed by a request outstanding (a DISPATCH not yet
// answered), or ControlMessageCap.
func (s *session) answerCap() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := ControlMessageCap
	for _, p := range s.pending {
		if p.in == 0 && p.allow > c {
			c = p.allow
		}
	}
	// A request given up on (the hold passed) may still be answered, late:
	// the answer is read and rejected, not taken as an attack.
	now := time.Now()
	for req, l := range s.late {
		if now.Sub(l.at) > lateKeep {
			delete(s.late, req)
		} else if l.allow > c {
			c = l.allow
		}
	}
	return c
}

// lateKeep is how long the answer a request given up on allows is still
// read (as the dispatcher remembers requests it gave up on: its
// expiredKeep); a late answer is rejected either way.
const lateKeep = 10 * time.Minute

// lateAllow is what a request given up on without an answer still allows
// (pendingResult.allow) and when it was given up.
type lateAllow struct {
	allow int
	at    time.Time
}

// sumRequest is a DISPATCH_SUM (digest: a DISPATCH_SUM_DIGEST) forwarded
// to the worker and not answered yet: its rows, width and slots (the
// RESULT answering it, or the DIGEST answering a DISPATCH_SUM_DIGEST, is
// metered as the RESULT of rows x k outputs, wire.SumCredit and
// wire.SumDigestCredit) and when it was forwarded.
type sumRequest struct {
	rows, d, k int
	digest     bool
	at         time.Time
}

// bucket is creditable bytes metered at about the same time, not yet
// settled: first and at are when the first and the last of them were
// metered (a bucket takes bytes for at most the session's merge period
// after first, so under steady work new buckets open and the old ones
// settle on time) and seq the session's RESULT count when the last of them
// was metered.
type bucket struct {
	first   time.Time
	at      time.Time
	seq     uint64
	out, in uint64
}

// session holds one bridged connection's counts.
type session struct {
	id, worker string
	started    time.Time
	cancel     context.CancelFunc
	merge      time.Duration // bytes metered within this of a bucket's first bytes join it

	mu                               sync.Mutex
	ended                            bool
	reason                           string
	toW, fromW, msgs, nDisp, nResult uint64
	lastResult                       time.Time // when the last RESULT arrived (session start before any)
	creditOut, creditIn, rejected    uint64
	pending                          map[uint64]pendingResult
	sums                             map[uint64]sumRequest // DISPATCH_SUMs and DISPATCH_SUM_DIGESTs forwarded, by request id, until answered or expired
	late                             map[uint64]lateAllow  // requests expired unanswered whose answer is larger than ControlMessageCap, for lateKeep
	unsettled                        []bucket              // oldest first
	settled                          struct{ out, in uint64 }
	forfeited                        bool
	forfeitReason                    string
	forfeitBytes                     uint64
	flushed                          counts        // in rows the ledger acknowledged
	queued                           counts        // in rows created (acknowledged, or the unacked one)
	unacked                          *ledger.Entry // the row in flight, sent again unchanged until acknowledged
	seq                              uint64        // rows created (ledger.Entry.Seq of the last)
	finalWritten                     bool
	retired                          bool // ended, and its final row appended (or there is no ledger)
}

// counts are cumulative ledger amounts of a session.
type counts struct{ creditIn, creditOut, rejected uint64 }

// creditLocked meters creditable bytes (out: DISPATCH, in: accepted
// RESULT) as unsettled, or as rejected once the session is forfeited;
// s.mu is held.
func (s *session) creditLocked(out, in uint64) {
	if s.forfeited {
		s.rejected += out + in
		s.forfeitBytes += out + in
		return
	}
	s.creditOut += out
	s.creditIn += in
	s.addUnsettledLocked(time.Now(), out, in)
}

// addUnsettledLocked adds creditable bytes metered at now to the newest
// bucket while that bucket's first bytes are younger than the merge period
// (never measured from its newest bytes: a bucket fed by steady work would
// then stay open, and never settle, for as long as the work lasts), else
// to a new bucket; s.mu is held.
func (s *session) addUnsettledLocked(now time.Time, out, in uint64) {
	if n := len(s.unsettled); n > 0 && now.Sub(s.unsettled[n-1].first) < s.merge {
		b := &s.unsettled[n-1]
		b.at, b.seq = now, s.nResult
		b.out += out
		b.in += in
		return
	}
	s.unsettled = append(s.unsettled, bucket{first: now, at: now, seq: s.nResult, out: out, in: in})
}

// settleLocked moves into the settled totals the unsettled buckets, oldest
// first, whose newest bytes are at least delay old and
// either followed by at least results RESULTs or, when the session has
// received no RESULT for delay (paused or idle: the results that would
// fill the window are not coming), with no further condition; all of them
// when all is set (the session ended, not forfeited). s.mu is held.
func (s *session) settleLocked(now time.Time, delay time.Duration, results int, all bool) {
	idle := now.Sub(s.lastResult) >= delay
	i := 0
	for ; i < len(s.unsettled); i++ {
		b := s.unsettled[i]
		if !all && (now.Sub(b.at) < delay || (!idle && s.nResult-b.seq < uint64(max(results, 0)))) {
			break
		}
		s.settled.out += b.out
		s.settled.in += b.in
	}
	s.unsettled = s.unsettled[i:]
}

// forfeit rejects every unsettled creditable byte of the session, and every
// later one; it returns the bytes it rejected now.
func (s *session) forfeit(reason string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n uint64
	for _, b := range s.unsettled {
		s.creditOut -= b.out
		s.creditIn -= b.in
		n += b.out + b.in
	}
	s.unsettled = nil
	s.rejected += n
	s.forfeitBytes += n
	if !s.forfeited {
		s.forfeited, s.forfeitReason = true, reason
	}
	return n
}

func (s *session) fromWorker(msg []byte, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fromW += uint64(n)
	s.msgs++
	if msg == nil {
		s.rejected += uint64(n)
		return
	}
	t, req, ok := wire.PeekRequest(msg)
	if t == wire.TypeDigest {
		// A DIGEST stands for the RESULT the worker computed: metered as
		// that RESULT's bytes (docs/accounting.md, "Quorum").
		var size int
		req, size, ok = wire.DigestCredit(msg)
		n = size
	}
	if sr, sum := s.sums[req]; sum && ok && (t == wire.TypeResult || t == wire.TypeDigest) {
		// The answer to a DISPATCH_SUM (a RESULT) or DISPATCH_SUM_DIGEST
		// (a DIGEST) stands for the RESULT of its rows x k outputs
		// (docs/accounting.md, "Row sums"); one of another shape or type
		// is metered as itself (a DIGEST as the RESULT it names) and
		// refused by the backbone.
		delete(s.sums, req)
		credit := wire.SumCredit
		if sr.digest {
			credit = wire.SumDigestCredit
		}
		if size, ok := credit(msg, sr.rows, sr.d, sr.k); ok && sr.digest == (t == wire.TypeDigest) {
			n = size
		}
	}
	if ok && (t == wire.TypeResult || t == wire.TypeDigest) {
		delete(s.late, req) // answered, late
	}
	switch {
	case ok && (t == wire.TypeResult || t == wire.TypeDigest):
		p := s.pending[req]
		p.in += uint64(n)
		p.at = time.Now()
		s.pending[req] = p
		s.nResult++
		s.lastResult = p.at
	case t == wire.TypeResult || t == wire.TypeDigest || t == wire.TypeDispatch || t == wire.TypeDispatchDigest ||
		t == wire.TypeDispatchSum || t == wire.TypeDispatchSumDigest:
		// a short RESULT or DIGEST, or a worker sending DISPATCH
		s.rejected += uint64(len(msg))
	default:
		if _, err := wire.Peek(msg); err != nil || !workerControl(t) {
			s.rejected += uint64(n) // garbage, or a frame only the backbone sends
		}
	}
}

// workerControl reports whether t is a control frame a worker may send: overhead,
// neither credited nor rejected (docs/accounting.md).
func workerControl(t wire.Type) bool {
	switch t {
	case wire.TypeHello, wire.TypeError, wire.TypePing, wire.TypePong, wire.TypePause,
		wire.TypeChunkReq, wire.TypeHoldings:
		return true
	}
	return false
}

func (s *session) toWorker(msg []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.toW += uint64(len(msg))
	s.msgs++
	t, req, ok := wire.PeekRequest(msg)
	switch t {
	case wire.TypeDispatchSum, wire.TypeDispatchSumDigest:
		if req, n, d, k, ok := wire.SumRequest(msg); ok {
			if s.sums == nil {
				s.sums = map[uint64]sumRequest{}
			}
			s.sums[req] = sumRequest{rows: n, d: d, k: k, digest: t == wire.TypeDispatchSumDigest, at: time.Now()}
		}
		fallthrough
	case wire.TypeDispatch, wire.TypeDispatchDigest:
		// Held with the request until the backbone's verdict on its
		// answer: a DISPATCH is paid only when the worker answered it
		// acceptably (a worker that answers ERROR, or nothing, earns
		// nothing; docs/accounting.md).
		s.nDisp++
		if !ok {
			s.rejected += uint64(len(msg))
			return
		}
		p := s.pending[req]
		p.out += uint64(len(msg))
		p.at = time.Now()
		if n, d, k, ok := wire.DispatchShape(msg); ok {
			p.allow = max(p.allow, int(min(uint64(wire.ResultSize(0, 0))+4*uint64(n)*uint64(k)*uint64(d), wire.MaxMessage)))
		}
		s.pending[req] = p
	}
}

func (s *session) verdict(req uint64, accepted bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.pending[req]
	if !ok {
		return
	}
	delete(s.pending, req)
	if accepted {
		s.creditLocked(p.out, p.in)
	} else {
		s.rejected += p.out + p.in
	}
}

// expire rejects the pending requests whose last bytes (a DISPATCH with no
// answer, or an answer with no verdict) passed before cutoff, and forgets the
// DISPATCH_SUMs forwarded before it (an answer still to come is late: the
// backbone refuses it, and it is metered as itself).
func (s *session) expire(cutoff time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for req, p := range s.pending {
		if p.at.Before(cutoff) {
			s.rejected += p.out + p.in
			delete(s.pending, req)
			if p.in == 0 && p.allow > ControlMessageCap {
				if s.late == nil {
					s.late = map[uint64]lateAllow{}
				}
				s.late[req] = lateAllow{allow: p.allow, at: time.Now()}
			}
		}
	}
	for req, sr := range s.sums {
		if sr.at.Before(cutoff) {
			delete(s.sums, req)
		}
	}
}

func (s *session) end(reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ended, s.reason = true, reason
	for req, p := range s.pending {
		s.rejected += p.out + p.in
		delete(s.pending, req)
	}
	s.sums = nil
}

func (s *session) snapshot() SessionStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	var pend, unsettled uint64
	for _, p := range s.pending {
		pend += p.out + p.in
	}
	for _, b := range s.unsettled {
		unsettled += b.out + b.in
	}
	return SessionStats{ID: s.id, WorkerID: s.worker, Started: s.started, Ended: s.retired, Reason: s.reason,
		ToWorker: s.toW, FromWorker: s.fromW, CreditOut: s.creditOut, CreditIn: s.creditIn, Unsettled: unsettled,
		Rejected: s.rejected, Forfeited: s.forfeitBytes, ForfeitReason: s.forfeitReason, Pending: pend,
		Messages: s.msgs, DispatchesSent: s.nDisp, ResultsReceived: s.nResult}
}
