// Package ledger is the hub's append-only contribution ledger: per worker
// session, the bytes the hub bridged, split into creditable and rejected
// bytes. It keeps its rows in an SQLite file (the embedded default) or in
// a PostgreSQL database shared by several hubs (a postgres:// URL), behind
// one Store interface. See docs/accounting.md.
package ledger

import "time"

// Entry is one append-only ledger row: the bytes bridged for one worker
// session since the previous entry of that session (deltas, not totals).
//
// Creditable bytes are the WebSocket message bytes of DISPATCH frames the
// backbone sent (BytesOut, backbone -> worker) and of RESULT frames the
// backbone accepted (BytesIn, worker -> backbone). RejectedBytes are bytes the
// worker sent that the backbone did not accept (unknown request, wrong shape,
// late, malformed); they are recorded and never paid. Control traffic (HELLO,
// pings) is overhead: neither credited nor rejected.
type Entry struct {
	ID            int64     // assigned by the ledger on append, increasing
	SessionID     string    // hub-assigned session id, unique per bridged connection
	WorkerID      string    // hex ed25519 public key of the worker (32 bytes -> 64 hex chars)
	BytesIn       uint64    // creditable bytes worker -> backbone (accepted RESULT frames)
	BytesOut      uint64    // creditable bytes backbone -> worker (DISPATCH frames)
	RejectedBytes uint64    // bytes worker -> backbone not accepted; never credited
	Final         bool      // true on the session's last entry
	Time          time.Time // when the hub appended the entry (UTC)

	// Seq numbers a session's rows 1, 2, 3, ... (0: not numbered). It is
	// the idempotency key of an append on PostgreSQL, where a commit whose
	// acknowledgement was lost with the connection leaves the hub unsure
	// whether its rows are in: the hub sends the same rows again, and a row
	// whose (SessionID, Seq) is already recorded with the same contents is
	// not added twice (different contents: ErrConflict). The SQLite file
	// keeps it too (schema 2), so that a hub's spill file appended a second
	// time records nothing twice; rows of a schema-1 file read back as 0.
	Seq uint64
}
