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

// Reconcile compares the worker's own count with the credited bytes. A
// shortfall is a mismatch only when bytes served longer ago than the
// credit lag (Options.CreditLag) are still not credited; until then they
// are awaiting credit.
type Reconcile struct {
	Mismatch         bool   `json:"mismatch"`
	DiffBytes        int64  `json:"diff_bytes"`               // bytes_served - credited_bytes
	ThresholdBytes   uint64 `json:"threshold_bytes"`          // allowed |diff|
	AwaitingBytes    uint64 `json:"awaiting_bytes,omitempty"` // served within the credit lag, not credited yet
	CreditLagSeconds int64  `json:"credit_lag_s"`             // how long credits may take
	Explanation      string `json:"explanation"`
}

// Summary is the wallet as `kvasir wallet --json` prints it. All amounts
// are integers: nKVR (10^-9 KVR) and bytes.
type Summary struct {
	Address         string    `json:"address"`
	Worker          string    `json:"worker"`            // hex ed25519 public key
	Gateway         string    `json:"gateway,omitempty"` // pinned gateway key (hex)
	MeteredNKVR     uint64    `json:"metered_nkvr"`      // own count x rate: an estimate
	CreditedNKVR    uint64    `json:"credited_nkvr"`     // confirmed by signed statements
	PaidNKVR        uint64    `json:"paid_nkvr"`         // settled
	PendingNKVR     uint64    `json:"pending_nkvr"`      // credited - paid
	BytesServed     uint64    `json:"bytes_served"`      // own count, both directions
	CreditedBytes   uint64    `json:"credited_bytes"`
	RejectedBytes   uint64    `json:"rejected_bytes"` // reported by the gateway, never paid
	RateNKVRPerByte uint64    `json:"rate_nkvr_per_byte"`
	Statements      uint64    `json:"statements"`
	Reconcile       Reconcile `json:"reconcile"`
	History         []Event   `json:"history"`
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
	s.Reconcile = reconcile(s.BytesServed, min(w.servedBy(now.Add(-w.lag)), s.BytesServed), s.CreditedBytes, s.RejectedBytes, w.lag)
	return s, nil
}

// threshold is the allowed difference between counts of b bytes: 1 % plus
// 64 KiB.
func threshold(b uint64) uint64 { return uint64(float64(b)*ReconcileFraction) + ReconcileSlackBytes }

// reconcile compares the credited bytes with the own count: served in
// all, and settled, served at least lag ago (what the gateway should have
// credited by now). Fewer credited than settled beyond the threshold is a
// mismatch; fewer credited than served but not than settled is credit lag;
// more credited than served is a mismatch at once.
func reconcile(served, settled, credited, rejected uint64, lag time.Duration) Reconcile {
	r := Reconcile{DiffBytes: int64(served) - int64(credited), ThresholdBytes: threshold(max(served, credited)),
		CreditLagSeconds: int64(lag / time.Second)}
	switch {
	case credited > served+r.ThresholdBytes:
		r.Mismatch = true
		r.Explanation = fmt.Sprintf("the gateway has credited %d bytes more than this worker counted: "+
			"this wallet file may have lost its own count (new or restored file), or the same identity key serves from another machine", -r.DiffBytes)
	case settled > credited+threshold(max(settled, credited)):
		r.Mismatch = true
		r.ThresholdBytes = threshold(max(settled, credited))
		r.Explanation = fmt.Sprintf("the gateway has credited %d bytes fewer than this worker counted up to %v ago, "+
			"longer than credits take to arrive. "+
			"%d bytes were metered as rejected (results that were late, for an unknown request, or of the wrong shape); "+
			"otherwise sessions ended before the hub recorded them, or the worker counts frames the hub does not credit",
			settled-credited, lag, rejected)
	case served > credited+r.ThresholdBytes:
		r.AwaitingBytes = served - credited
		r.Explanation = fmt.Sprintf("%d bytes served in the last %v are not credited yet: credits follow the work by up to %v "+
			"(the hub settles, the gateway credits, the wallet fetches)", r.AwaitingBytes, lag, lag)
	default:
		r.Explanation = fmt.Sprintf("own count and credited bytes agree within %d bytes", r.ThresholdBytes)
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

// WriteText writes s for a person: KVR with 5 decimals, bytes as units
// (10^6 bytes), and the newest history lines.
func WriteText(w io.Writer, s Summary) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "Address\t%s\n", s.Address)
	fmt.Fprintf(tw, "Metered\t%s\t%s units served (own count, estimate at %d nKVR/byte)\n",
		walletapi.FormatKVR(s.MeteredNKVR), walletapi.FormatUnits(s.BytesServed), s.RateNKVRPerByte)
	fmt.Fprintf(tw, "Credited\t%s\t%s units in %d signed statements\n", walletapi.FormatKVR(s.CreditedNKVR), walletapi.FormatUnits(s.CreditedBytes), s.Statements)
	fmt.Fprintf(tw, "Paid\t%s\t\n", walletapi.FormatKVR(s.PaidNKVR))
	fmt.Fprintf(tw, "Pending\t%s\tcredited, not yet paid\n", walletapi.FormatKVR(s.PendingNKVR))
	if s.RejectedBytes > 0 {
		fmt.Fprintf(tw, "Rejected\t%s units\tnever paid\n", walletapi.FormatUnits(s.RejectedBytes))
	}
	if s.Gateway != "" {
		fmt.Fprintf(tw, "Gateway\t%s…\tpinned statement key\n", s.Gateway[:16])
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	flag := "ok"
	if s.Reconcile.Mismatch {
		flag = "MISMATCH"
	}
	fmt.Fprintf(w, "Reconcile: %s: %s\n", flag, s.Reconcile.Explanation)
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
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s units\t%s\n", e.Time.Format("2006-01-02 15:04:05Z"), e.State,
			walletapi.FormatKVR(e.NKVR), walletapi.FormatUnits(e.Bytes), what)
	}
	return tw.Flush()
}
