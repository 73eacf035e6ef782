package wallet

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Reconciliation threshold: the own count and the credited bytes may
// differ by ReconcileFraction of the larger plus ReconcileSlackBytes before
// the wallet flags a mismatch (framing differences, the crediting poll lag,
// the last second of a crash).
const (
	ReconcileFraction   = 0.01
	ReconcileSlackBytes = 64 << 10
)

// HistoryLimit is the number of newest events Summary returns.
const HistoryLimit = 100

// Event states in the history.
const (
	StateMetered  = "metered"  // the worker's own count for a session (estimate)
	StateCredited = "credited" // a verified gateway statement (pending KVR)
	StatePaid     = "paid"     // settled
)

// Event is one history line.
type Event struct {
	Time      time.Time `json:"time"`                // UTC; for metered: last update of the session
	State     string    `json:"state"`               // StateMetered, StateCredited or StatePaid
	Session   string    `json:"session,omitempty"`   // metered: session id
	Statement uint64    `json:"statement,omitempty"` // credited: statement number N
	Ledger    string    `json:"ledger,omitempty"`    // credited: ledger id range "(after, upto]"
	Bytes     uint64    `json:"bytes"`               // bytes of this event (0 for paid)
	Rejected  uint64    `json:"rejected_bytes,omitempty"`
	NKVR      uint64    `json:"nkvr"` // metered: estimate at the current rate
	Ref       string    `json:"ref,omitempty"`
}

// Reconcile compares the worker's own count with what the gateway
// accounted for: credited bytes plus the bytes its statements report as
// rejected (results the backbone refused: never paid, but not missing).
// A shortfall is a mismatch only when bytes counted more than the credit
// lag (Options.CreditLag) before the last statement fetch are still
// unaccounted for; younger ones are awaiting credit, and bytes counted
// after a fetch that is itself old are unconfirmed (the gateway was not
// asked), never a mismatch.
type Reconcile struct {
	Mismatch         bool   `json:"mismatch"`
	DiffBytes        int64  `json:"diff_bytes"`               // bytes_served - credited_bytes
	ThresholdBytes   uint64 `json:"threshold_bytes"`          // allowed |diff|
	AwaitingBytes    uint64 `json:"awaiting_bytes,omitempty"` // counted, neither credited nor rejected yet, not a mismatch
	CreditLagSeconds int64  `json:"credit_lag_s"`             // how long credits may take
	Explanation      string `json:"explanation"`
}

// Summary is the wallet as `kvasir wallet --json` prints it. All amounts
// are integers: nKVR (10^-9 KVR) and bytes.
type Summary struct {
	Address         string `json:"address"`
	Worker          string `json:"worker"`            // hex ed25519 public key
	Gateway         string `json:"gateway,omitempty"` // pinned gateway key (hex)
	MeteredNKVR     uint64 `json:"metered_nkvr"`      // own count x rate: an estimate
	CreditedNKVR    uint64 `json:"credited_nkvr"`     // confirmed by signed statements
	PaidNKVR        uint64 `json:"paid_nkvr"`         // settled
	PendingNKVR     uint64 `json:"pending_nkvr"`      // credited - paid
	BytesServed     uint64 `json:"bytes_served"`      // own count, both directions
	CreditedBytes   uint64 `json:"credited_bytes"`
	RejectedBytes   uint64 `json:"rejected_bytes"` // reported by the gateway, never paid
	RateNKVRPerByte uint64 `json:"rate_nkvr_per_byte"`
	Statements      uint64 `json:"statements"`
	// LastFetched is when statements were last received from the gateway
	// (zero: never): credits are known up to then.
	LastFetched time.Time `json:"last_fetched,omitzero"`
	Reconcile   Reconcile `json:"reconcile"`
	History     []Event   `json:"history"`
}

// Summary flushes pending counts and returns the wallet's state with the
// newest HistoryLimit events (Events gives any range, Groups the history
// grouped). The rate for the metered estimate is that of the newest
// statement, or walletapi.DefaultRateNKVRPerByte before any.
func (w *Wallet) Summary() (Summary, error) {
	if err := w.Flush(); err != nil {
		return Summary{}, err
	}
	now := w.now()
	s := Summary{Address: w.addr, Worker: w.worker}
	if gw, err := w.PinnedGateway(); err != nil {
		return Summary{}, err
	} else if gw != nil {
		s.Gateway = hex.EncodeToString(gw)
	}
	var cb, cn, rej, n, paid, served int64
	if err := w.db.QueryRow(`SELECT COALESCE(MAX(cum_bytes), 0), COALESCE(MAX(cum_nkvr), 0), COALESCE(SUM(rejected), 0),
		COUNT(*) FROM statements`).Scan(&cb, &cn, &rej, &n); err != nil {
		return Summary{}, fmt.Errorf("wallet: %w", err)
	}
	if err := w.db.QueryRow(`SELECT COALESCE(SUM(nkvr), 0) FROM payouts`).Scan(&paid); err != nil {
		return Summary{}, fmt.Errorf("wallet: %w", err)
	}
	if err := w.db.QueryRow(`SELECT COALESCE(SUM(bytes_in + bytes_out), 0) FROM sessions`).Scan(&served); err != nil {
		return Summary{}, fmt.Errorf("wallet: %w", err)
	}
	rate, err := w.rate()
	if err != nil {
		return Summary{}, err
	}
	s.RateNKVRPerByte = rate
	s.CreditedBytes, s.CreditedNKVR, s.RejectedBytes, s.Statements, s.PaidNKVR = uint64(cb), uint64(cn), uint64(rej), uint64(n), uint64(paid)
	s.PendingNKVR = s.CreditedNKVR - min(s.PaidNKVR, s.CreditedNKVR)
	s.BytesServed = uint64(served)
	if s.MeteredNKVR, err = walletapi.NKVR(s.BytesServed, s.RateNKVRPerByte); err != nil {
		return Summary{}, err
	}
	if s.History, err = w.Events(time.Time{}, time.Time{}, HistoryLimit); err != nil {
		return Summary{}, err
	}
	if s.LastFetched, err = w.LastFetched(); err != nil {
		return Summary{}, err
	}
	// What the gateway should have credited by its last answer: the bytes
	// counted a credit lag before it (or before now, if later).
	var settled uint64
	if !s.LastFetched.IsZero() {
		settled = min(w.servedBy(minTime(now, s.LastFetched).Add(-w.lag)), s.BytesServed)
	}
	s.Reconcile = reconcile(s.BytesServed, settled, s.CreditedBytes, s.RejectedBytes, w.lag, s.LastFetched, now)
	return s, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// threshold is the allowed difference between counts of b bytes: 1 % plus
// 64 KiB.
func threshold(b uint64) uint64 { return uint64(float64(b)*ReconcileFraction) + ReconcileSlackBytes }

// reconcile compares what the gateway accounted for (credited plus
// rejected bytes) with the own count: served in all, and settled, served
// at least lag before the last fetch (what the gateway should have
// credited by then). Fewer accounted for than settled beyond the threshold
// is a mismatch; fewer than served but not than settled is credit lag (or,
// after an old or no fetch, unconfirmed); more credited than served is a
// mismatch at once.
func reconcile(served, settled, credited, rejected uint64, lag time.Duration, fetched, now time.Time) Reconcile {
	accounted := credited + rejected
	r := Reconcile{DiffBytes: int64(served) - int64(credited), ThresholdBytes: threshold(max(served, credited)),
		CreditLagSeconds: int64(lag / time.Second)}
	fb := walletapi.FormatBytes
	switch {
	case credited > served+r.ThresholdBytes:
		r.Mismatch = true
		r.Explanation = fmt.Sprintf("the gateway has credited %s more than this computer counted: "+
			"this wallet file lost part of its own count (a new or restored file), or the same identity key also works on another computer", fb(credited-served))
	case settled > accounted+threshold(max(settled, accounted)):
		r.Mismatch = true
		r.ThresholdBytes = threshold(max(settled, accounted))
		r.AwaitingBytes = served - min(accounted, served)
		r.Explanation = fmt.Sprintf("%s that this computer counted more than %v before the last statement are neither credited nor "+
			"reported rejected by the gateway, although credits arrive within %v: the hub did not record them "+
			"(it restarted, or a session ended before it wrote its last bytes)", fb(settled-accounted), lag, lag)
	case served > accounted+r.ThresholdBytes:
		r.AwaitingBytes = served - accounted
		switch {
		case fetched.IsZero():
			r.Explanation = fmt.Sprintf("%s counted, not credited yet: no statement has been fetched from the gateway yet", fb(r.AwaitingBytes))
		case now.Sub(fetched) > lag:
			r.Explanation = fmt.Sprintf("%s counted, not credited yet: statements were last fetched %s, %v ago (is the gateway reachable?)",
				fb(r.AwaitingBytes), fetched.UTC().Format("2006-01-02 15:04Z"), now.Sub(fetched).Round(time.Second))
		default:
			r.Explanation = fmt.Sprintf("%s counted, not credited yet: credits follow the work by up to %v "+
				"(the hub holds them back while results can still be checked, the gateway credits, this wallet fetches)", fb(r.AwaitingBytes), lag)
		}
	default:
		r.Explanation = "own count and credits agree"
	}
	if rejected > 0 {
		r.Explanation += fmt.Sprintf("; %s of results were rejected by the backbone (late, unknown or malformed: never paid)", fb(rejected))
	}
	return r
}

// WriteJSON writes s as indented JSON (the `kvasir wallet --json` output:
// a Summary, with the grouped history beside it).
func WriteJSON(w io.Writer, s any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(s)
}

// PayoutNote says what is true of payouts in this version: none are made.
// The wallet keeps a paid state (RecordPayout) for when they are.
const PayoutNote = "kvasir does not pay out yet: credited KVR stay pending (in the gateway's signed statements and in this wallet) " +
	"until payouts exist; none has been made"

// ReconcileFlag is the one-word state of r for people: "ok", "awaiting
// credit" or "MISMATCH".
func ReconcileFlag(r Reconcile) string {
	switch {
	case r.Mismatch:
		return "MISMATCH"
	case r.AwaitingBytes > 0:
		return "awaiting credit"
	}
	return "ok"
}

// WriteText writes s for a person: KVR with 5 decimals, bytes in decimal
// units (walletapi.FormatBytes), and the newest history lines.
func WriteText(w io.Writer, s Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fb := walletapi.FormatBytes
	fmt.Fprintf(tw, "Address\t%s\n", s.Address)
	fmt.Fprintf(tw, "Estimate\t≈%s\t%s counted by this computer, at %d nKVR per byte (%s per MB)\n",
		walletapi.FormatKVR(s.MeteredNKVR), fb(s.BytesServed), s.RateNKVRPerByte, walletapi.FormatKVR(s.RateNKVRPerByte*1_000_000))
	fmt.Fprintf(tw, "Credited\t%s\t%s in %d statements signed by the gateway\n", walletapi.FormatKVR(s.CreditedNKVR), fb(s.CreditedBytes), s.Statements)
	fmt.Fprintf(tw, "Pending\t%s\tcredited, not paid out\n", walletapi.FormatKVR(s.PendingNKVR))
	if s.PaidNKVR > 0 {
		fmt.Fprintf(tw, "Paid out\t%s\t\n", walletapi.FormatKVR(s.PaidNKVR))
	} else {
		fmt.Fprintf(tw, "Paid out\t%s\t%s\n", walletapi.FormatKVR(0), PayoutNote)
	}
	if s.RejectedBytes > 0 {
		fmt.Fprintf(tw, "Rejected\t%s\tresults the backbone refused, never paid\n", fb(s.RejectedBytes))
	}
	if s.Gateway != "" {
		fmt.Fprintf(tw, "Gateway\t%s…\tpinned statement key\n", s.Gateway[:16])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "Reconcile: %s: %s\n", ReconcileFlag(s.Reconcile), s.Reconcile.Explanation)
	if len(s.History) == 0 {
		_, err := fmt.Fprintln(w, "History: none yet")
		return err
	}
	fmt.Fprintln(w, "History (newest first):")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for i, e := range s.History {
		if i == 20 {
			fmt.Fprintf(tw, "  … %d more (see --json)\n", len(s.History)-20)
			break
		}
		what := ""
		switch e.State {
		case StateMetered:
			what = "session " + e.Session
		case StateCredited:
			what = fmt.Sprintf("statement #%d, ledger %s", e.Statement, e.Ledger)
		case StatePaid:
			what = "ref " + e.Ref
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", e.Time.Format("2006-01-02 15:04:05Z"), e.State,
			walletapi.FormatKVR(e.NKVR), walletapi.FormatBytes(e.Bytes), what)
	}
	return tw.Flush()
}
