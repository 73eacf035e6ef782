package hub

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/ledger"
)

// Meter receives the ledger rows of every session: a delta at most every
// FlushEvery while the session has new settled or rejected bytes, and a
// Final row at the first flush after the session ends. Each row carries
// its session's row number (ledger.Entry.Seq). A failed append is logged
// and the same rows are sent again, unchanged, at the next flush (so that
// a ledger that did record them, its answer lost, records them once);
// bytes metered meanwhile go into the session's next row.
type Meter interface {
	Append(e ledger.Entry) error
}

// BatchMeter is a Meter that records many rows in one transaction
// (*ledger.Ledger is one). The hub then appends the rows of all its
// sessions with one AppendAll per flush: hundreds of sessions cost one
// transaction per FlushEvery.
type BatchMeter interface {
	Meter
	AppendAll(ctx context.Context, es []ledger.Entry) error
}

// Config configures a Hub. Zero durations take the defaults noted.
type Config struct {
	Listen      string                  // host:port, loopback or private unless AllowPublic ("127.0.0.1:0" picks a port)
	Backbone    string                  // host:port of the backbone's dispatch listener
	Secret      []byte                  // shared gateway secret, >= 16 bytes
	Meter       Meter                   // may be nil: counts are still kept (Sessions)
	AllowPublic bool                    // allow a public listen address
	Extra       map[string]http.Handler // more handlers by path pattern (http.ServeMux syntax)

	MaxSkew     time.Duration // gateway timestamp window; default DefaultMaxSkew
	IdleTimeout time.Duration // close a session after this long without a worker message; default 75 s (> the 20 s ping)
	ResultHold  time.Duration // how long a RESULT waits for LinkAccepted before it is rejected; default 60 s
	FlushEvery  time.Duration // ledger flush period; default 1 s
	DialTimeout time.Duration // backbone dial timeout; default 5 s
	Logger      *slog.Logger  // default slog.Default()

	// Registry receives the hub's Prometheus metrics, served on
	// MetricsPath; nil: the hub makes its own registry.
	Registry *prometheus.Registry

	// SettleDelay and SettleResults hold creditable bytes back from the
	// ledger until they are settled: at least SettleDelay old (from their
	// metering; under steady work bytes settle SettleDelay after they were
	// metered, give or take FlushEvery) and followed by at least
	// SettleResults RESULT messages of the same session, or by SettleDelay
	// without a RESULT (paused or idle), or the session ended without a
	// forfeit. Until then a LinkForfeit rejects
	// them. Zero values hold nothing back (bytes settle at the next flush);
	// the hub command uses DefaultSettleDelay and DefaultSettleResults.
	// SettleDelay must exceed the backbone's longest verdict delay (its
	// request deadline plus one local recomputation, dispatch.Config
	// MaxDeadline: 5 s by default).
	SettleDelay   time.Duration
	SettleResults int
	// DrainTimeout bounds how long the hub keeps reading the backbone link
	// for verdicts after the worker's side of a session ended; default 10 s.
	DrainTimeout time.Duration
	// CloseRetry bounds how long Close keeps trying to append the last
	// ledger rows while the ledger refuses them (disk full, database
	// down); default 20 s. Rows still not appended then go to SpillFile.
	CloseRetry time.Duration
	// SpillFile keeps the ledger rows Close could not append (JSON, one
	// row per line; ""= none: Close then reports what was lost). Start
	// appends the rows of an existing SpillFile before anything else and
	// removes it; a ledger that refuses them fails Start, so nothing
	// metered is lost while the file waits. A SpillFile whose folder is
	// missing or may not be written fails Start too.
	SpillFile string
}

// Settling defaults of the hub command (docs/accounting.md derives them:
// with the dispatcher's defaults, probation 32 and a check rate of 1 in 20,
// a window of 128 results makes every lie cost more in expectation than it
// saves, and leaves a worker that stops computing after its probation an
// expected 0.15 results' pay per identity).
const (
	// DefaultSettleDelay is the hub command's --settle: creditable bytes
	// are at least this old before they reach the ledger.
	DefaultSettleDelay = 30 * time.Second
	// DefaultSettleResults is the hub command's --settle-results: and
	// followed by at least this many RESULTs of their session.
	DefaultSettleResults = 128
)
