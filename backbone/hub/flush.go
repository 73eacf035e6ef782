package hub

import (
	"context"
	"fmt"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
)

// flushLoop, every FlushEvery until Close, rejects the RESULTs held past
// ResultHold and appends the rows due (flushAll).
func (h *Hub) flushLoop() {
	t := time.NewTicker(h.cfg.FlushEvery)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case now := <-t.C:
			h.mu.Lock()
			open := make([]*session, 0, len(h.sessions))
			for _, s := range h.sessions {
				open = append(open, s)
			}
			h.mu.Unlock()
			for _, s := range open {
				s.expire(now.Add(-h.cfg.ResultHold))
			}
			_, _ = h.flushAll(now)
		}
	}
}

// flushAll appends one row for every session that has one due (new
// settled or rejected bytes, a final row, or a row a failed append left
// unacknowledged) in one AppendAll when the Meter is a BatchMeter, and
// retires the sessions whose final row is in. It returns the rows it
// tried and the append error.
func (h *Hub) flushAll(now time.Time) (int, error) {
	if h.cfg.Meter == nil {
		return 0, nil
	}
	h.flushMu.Lock()
	defer h.flushMu.Unlock()
	sessions := h.live()
	var rows []ledger.Entry
	var owners []*session
	for _, s := range sessions {
		if e, ok := s.nextRow(now, h.cfg.SettleDelay, h.cfg.SettleResults); ok {
			rows = append(rows, e)
			owners = append(owners, s)
		}
	}
	if len(rows) == 0 {
		return 0, nil
	}
	var err error
	if bm, ok := h.cfg.Meter.(BatchMeter); ok {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t0 := time.Now()
		err = bm.AppendAll(ctx, rows)
		cancel()
		h.met.appended(len(rows), time.Since(t0), err)
		for _, s := range owners {
			s.acked(err == nil)
		}
	} else {
		for i, s := range owners {
			t0 := time.Now()
			e := h.cfg.Meter.Append(rows[i])
			h.met.appended(1, time.Since(t0), e)
			s.acked(e == nil)
			if e != nil && err == nil {
				err = e
			}
		}
	}
	if err != nil {
		h.appendErr.Store(&appendFailure{err: err, rows: len(rows)})
		h.log.Error("hub: ledger append failed; the rows will be sent again", "rows", len(rows), "err", err)
	} else {
		h.appendErr.Store(nil)
		var cred, rej uint64
		for _, e := range rows {
			cred += e.BytesIn + e.BytesOut
			rej += e.RejectedBytes
		}
		h.met.ledgerBytes.WithLabelValues("creditable").Add(float64(cred))
		h.met.ledgerBytes.WithLabelValues("rejected").Add(float64(rej))
	}
	h.mu.Lock()
	for _, s := range owners {
		if s.done() {
			if _, ok := h.finishing[s.id]; ok {
				delete(h.finishing, s.id)
				h.endedLocked(s)
			}
		}
	}
	h.mu.Unlock()
	return len(rows), err
}

// nextRow returns the session's row due at this flush: the row a failed
// append left unacknowledged (unchanged, so a ledger that recorded it
// records it once), else the delta of settled and rejected bytes since the
// last row (the final row once the session ended). ok is false when
// nothing is due.
func (s *session) nextRow(now time.Time, delay time.Duration, results int) (ledger.Entry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.finalWritten {
		return ledger.Entry{}, false
	}
	if s.unacked != nil {
		return *s.unacked, true
	}
	final := s.ended
	s.settleLocked(now, delay, results, final)
	e := ledger.Entry{SessionID: s.id, WorkerID: s.worker,
		BytesIn:       s.settled.in - s.flushed.creditIn,
		BytesOut:      s.settled.out - s.flushed.creditOut,
		RejectedBytes: s.rejected - s.flushed.rejected,
		Final:         final, Time: now.UTC()}
	if !final && e.BytesIn == 0 && e.BytesOut == 0 && e.RejectedBytes == 0 {
		return ledger.Entry{}, false
	}
	s.seq++
	e.Seq = s.seq
	s.unacked = &e
	s.queued.creditIn, s.queued.creditOut, s.queued.rejected = s.settled.in, s.settled.out, s.rejected
	return e, true
}

// acked records the outcome of appending the session's unacknowledged
// row.
func (s *session) acked(ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !ok || s.unacked == nil {
		return
	}
	s.flushed = s.queued
	s.finalWritten = s.unacked.Final
	s.unacked = nil
}

// done reports whether the session's final row is in the ledger.
func (s *session) done() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.finalWritten
}

// appendFailure is the last flush's append error and the rows it held up.
type appendFailure struct {
	err  error
	rows int
}

// LedgerError is the error of the last ledger append when it failed (the
// rows wait in memory and are sent again at the next flush), nil once an
// append succeeds; the hub command's /readyz reports it, so that a ledger
// that refuses every append (a full disk, a read-only database) does not
// leave the hub ready.
func (h *Hub) LedgerError() error {
	f := h.appendErr.Load()
	if f == nil {
		return nil
	}
	return fmt.Errorf("the last ledger append failed (%d rows waiting): %w", f.rows, f.err)
}
