package wallet

import (
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
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
//
// Statements carry no session ids, so the wallet checks each of its
// sessions at the first statement fetch made a credit lag
// (Options.CreditLag) or more after the session's last count: the bytes of
// that session and of every session counted before it, less everything
// accounted for by that fetch, is the shortfall of those sessions. A
// shortfall found so stays a mismatch (MismatchBytes) whatever newer
// sessions do: credits for newer work never fill an older gap. The counted
// bytes beyond the mismatch and the credits are awaiting credit
// (AwaitingBytes): younger than the lag, or counted after a fetch that is
// itself old (the gateway was not asked, so not a mismatch).
type Reconcile struct {
	// Mismatch is true when MismatchBytes > 0.
	Mismatch bool `json:"mismatch"`
	// DiffBytes is bytes_served - credited_bytes.
	DiffBytes int64 `json:"diff_bytes"`
	// ThresholdBytes is the difference allowed in the comparison that
	// decided: 1 % of the larger count plus 64 KiB.
	ThresholdBytes uint64 `json:"threshold_bytes"`
	// MismatchBytes are the bytes the mismatch is about: counted by
	// sessions older than the credit lag and neither credited nor rejected
	// by the gateway, or, when DiffBytes is negative, credited beyond the
	// own count. 0 when there is no mismatch.
	MismatchBytes uint64 `json:"mismatch_bytes,omitempty"`
	// MismatchSession names the newest session whose check found the
	// shortfall (the missing bytes belong to it or to older sessions), and
	// MismatchCounted is when it was last counted; empty when the shortfall
	// was found in a session still being counted, or there is none.
	MismatchSession string    `json:"mismatch_session,omitempty"`
	MismatchCounted time.Time `json:"mismatch_counted,omitzero"`
	// AwaitingBytes are counted bytes neither credited nor rejected yet
	// and not part of MismatchBytes: recent work (or work since an old
	// fetch). Never a mismatch.
	AwaitingBytes uint64 `json:"awaiting_bytes,omitempty"`
	// CreditLagSeconds is how long credits may take.
	CreditLagSeconds int64 `json:"credit_lag_s"`
	// Explanation says the state in words.
	Explanation string `json:"explanation"`
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
	// Reissued is set once the gateway reissued this worker's statements
	// (its wallets restored from an older backup): the wallet replaced its
	// own from that statement on by the gateway's current ones.
	Reissued  *Reissue  `json:"reissued,omitempty"`
	Reconcile Reconcile `json:"reconcile"`
	History   []Event   `json:"history"`
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
	r, err := w.Reissued()
	if err != nil {
		return Summary{}, err
	}
	s.Reissued = r
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
	// counted a credit lag before it (or before now, if later), over all
	// sessions (samples: also the part of a session still being counted)...
	var settled uint64
	var short shortfall
	if !s.LastFetched.IsZero() {
		decided := minTime(now, s.LastFetched)
		settled = min(w.servedBy(decided.Add(-w.lag)), s.BytesServed)
		// ... and per session, at the fetch that decided it, so that
		// credits for newer work do not hide an older shortfall.
		// The checks made at each fetch (exact) and, for sessions decided
		// before this wallet kept them, the same checks redone from the
		// statements' fetch times (a lower bound).
		if short, err = w.checkedShortfall(); err != nil {
			return Summary{}, err
		}
		redone, err := w.sessionShortfall(decided, s.LastFetched, s.CreditedBytes+s.RejectedBytes)
		if err != nil {
			return Summary{}, err
		}
		if redone.bytes > short.bytes {
			short = redone
		}
	}
	s.Reconcile = reconcile(s.BytesServed, settled, s.CreditedBytes, s.RejectedBytes, short, w.lag, s.LastFetched, now)
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

// shortfall is the largest shortfall a session check found
// (Wallet.sessionShortfall): bytes counted by session and the sessions
// counted before it, less what the gateway accounted for by the first
// fetch a credit lag after it; threshold is the difference allowed there.
type shortfall struct {
	bytes     uint64
	threshold uint64
	session   string
	counted   time.Time
}

// sessionShortfall checks each session last counted a credit lag or more
// before decided (the last fetch, or now if earlier): the bytes of the
// sessions counted up to it are compared with what the gateway accounted
// for (credited plus rejected) in the statements fetched by the first
// fetch at or after the session's last count plus the lag (the last fetch,
// lastFetched, with accountedAll, when no statement arrived since). A
// session still counted in that window does not count towards an older
// check: the comparison is a lower bound of what is missing. It returns
// the largest shortfall beyond the threshold (zero if none).
func (w *Wallet) sessionShortfall(decided, lastFetched time.Time, accountedAll uint64) (shortfall, error) {
	type fetch struct {
		t         int64 // unix ms
		accounted uint64
	}
	var fetches []fetch
	rows, err := w.db.Query(`SELECT fetched, MAX(cum_bytes), SUM(rejected) FROM statements GROUP BY fetched ORDER BY fetched`)
	if err != nil {
		return shortfall{}, fmt.Errorf("wallet: %w", err)
	}
	var rej uint64
	for rows.Next() {
		var t, cb, r int64
		if err := rows.Scan(&t, &cb, &r); err != nil {
			rows.Close()
			return shortfall{}, fmt.Errorf("wallet: %w", err)
		}
		rej += uint64(r)
		fetches = append(fetches, fetch{t: t, accounted: uint64(cb) + rej})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return shortfall{}, fmt.Errorf("wallet: %w", err)
	}
	fetches = append(fetches, fetch{t: lastFetched.UnixMilli(), accounted: accountedAll})

	rows, err = w.db.Query(`SELECT session, bytes_in + bytes_out, updated FROM sessions WHERE updated <= ? ORDER BY updated, session`,
		decided.Add(-w.lag).UnixMilli())
	if err != nil {
		return shortfall{}, fmt.Errorf("wallet: %w", err)
	}
	defer rows.Close()
	var best shortfall
	var settled uint64
	f := 0
	type sess struct {
		name    string
		bytes   uint64
		updated int64
	}
	var group []sess // sessions last counted at the same millisecond
	check := func() {
		if len(group) == 0 {
			return
		}
		for _, g := range group {
			settled += g.bytes
		}
		last := group[len(group)-1]
		group = group[:0]
		due := last.updated + w.lag.Milliseconds()
		for f < len(fetches)-1 && fetches[f].t < due {
			f++
		}
		acc := fetches[f].accounted
		th := threshold(max(settled, acc))
		if settled > acc+th && settled-acc > best.bytes {
			best = shortfall{bytes: settled - acc, threshold: th, session: last.name, counted: time.UnixMilli(last.updated)}
		}
	}
	for rows.Next() {
		var g sess
		var b int64
		if err := rows.Scan(&g.name, &b, &g.updated); err != nil {
			return shortfall{}, fmt.Errorf("wallet: %w", err)
		}
		g.bytes = uint64(b)
		if len(group) > 0 && group[0].updated != g.updated {
			check()
		}
		group = append(group, g)
	}
	if err := rows.Err(); err != nil {
		return shortfall{}, fmt.Errorf("wallet: %w", err)
	}
	check()
	return best, nil
}

// Meta keys of the session checks made at each fetch (checkSessions).
const (
	metaChecked = "checked_upto" // unix ms: sessions last counted up to here are checked
	metaShort   = "shortfall"    // JSON shortfallRecord: the largest shortfall found
)

// shortfallRecord is shortfall as kept in the meta table.
type shortfallRecord struct {
	Bytes     uint64 `json:"bytes"`
	Threshold uint64 `json:"threshold"`
	Session   string `json:"session"`
	CountedMS int64  `json:"counted_ms"`
}

// checkSessions runs, in the fetch transaction tx at now (unix ms) with
// cumBytes credited in all, the session checks this fetch decides: each
// session last counted a credit lag or more before now and after the
// previous fetch's cut is compared, with the sessions counted before it,
// with what the gateway has accounted for (credited plus rejected) now.
// The largest shortfall beyond the threshold is kept (metaShort), so that
// credits for later work, which later fetches bring, cannot hide it. A
// fetch that found no new statement decides as well as one that did.
func (w *Wallet) checkSessions(tx *sql.Tx, now int64, cumBytes uint64) error {
	cut := now - w.lag.Milliseconds()
	var prev int64 = -1 << 62
	var v string
	switch err := tx.QueryRow(`SELECT v FROM meta WHERE k = ?`, metaChecked).Scan(&v); {
	case err == nil:
		if prev, err = strconv.ParseInt(v, 10, 64); err != nil {
			return fmt.Errorf("%w: %s %q", ErrCorrupt, metaChecked, v)
		}
	case !errors.Is(err, sql.ErrNoRows):
		return err
	}
	if cut <= prev {
		return nil
	}
	var best shortfallRecord
	switch err := tx.QueryRow(`SELECT v FROM meta WHERE k = ?`, metaShort).Scan(&v); {
	case err == nil:
		if json.Unmarshal([]byte(v), &best) != nil {
			return fmt.Errorf("%w: %s %q", ErrCorrupt, metaShort, v)
		}
	case !errors.Is(err, sql.ErrNoRows):
		return err
	}
	var rej, before int64
	if err := tx.QueryRow(`SELECT COALESCE(SUM(rejected), 0) FROM statements`).Scan(&rej); err != nil {
		return err
	}
	if err := tx.QueryRow(`SELECT COALESCE(SUM(bytes_in + bytes_out), 0) FROM sessions WHERE updated <= ?`, prev).Scan(&before); err != nil {
		return err
	}
	accounted := cumBytes + uint64(rej)
	settled := uint64(before)
	found := false
	err := func() error {
		rows, err := tx.Query(`SELECT session, bytes_in + bytes_out, updated FROM sessions WHERE updated > ? AND updated <= ?
			ORDER BY updated, session`, prev, cut)
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var sess string
			var b, upd int64
			if err := rows.Scan(&sess, &b, &upd); err != nil {
				return err
			}
			settled += uint64(b)
			// Sessions counted at the same millisecond are checked once,
			// at the last of them (ordered by name): the check of an
			// earlier one would leave the others out, which only lowers it.
			th := threshold(max(settled, accounted))
			if settled > accounted+th && settled-accounted > best.Bytes {
				best, found = shortfallRecord{Bytes: settled - accounted, Threshold: th, Session: sess, CountedMS: upd}, true
			}
		}
		return rows.Err()
	}()
	if err != nil {
		return err
	}
	if found {
		b, _ := json.Marshal(best)
		if _, err := tx.Exec(`INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, metaShort, string(b)); err != nil {
			return err
		}
	}
	_, err = tx.Exec(`INSERT INTO meta (k, v) VALUES (?, ?) ON CONFLICT (k) DO UPDATE SET v = excluded.v`, metaChecked, strconv.FormatInt(cut, 10))
	return err
}

// checkedShortfall returns the shortfall kept by checkSessions (zero if
// none).
func (w *Wallet) checkedShortfall() (shortfall, error) {
	var v string
	err := w.db.QueryRow(`SELECT v FROM meta WHERE k = ?`, metaShort).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return shortfall{}, nil
	}
	if err != nil {
		return shortfall{}, fmt.Errorf("wallet: %w", err)
	}
	var r shortfallRecord
	if json.Unmarshal([]byte(v), &r) != nil {
		return shortfall{}, fmt.Errorf("%w: %s %q", ErrCorrupt, metaShort, v)
	}
	return shortfall{bytes: r.Bytes, threshold: r.Threshold, session: r.Session, counted: time.UnixMilli(r.CountedMS)}, nil
}

// reconcile compares what the gateway accounted for (credited plus
// rejected bytes) with the own count: served in all; settled, served at
// least lag before the last fetch (what the gateway should have credited
// by then); and short, the largest shortfall of the per-session checks.
// The larger of short and settled less accounted, beyond the threshold
// and at most served less accounted, is a mismatch (MismatchBytes); the
// rest of served less accounted, beyond the threshold, is awaiting credit
// (or, after an old or no fetch, unconfirmed). More credited than served
// is a mismatch at once.
func reconcile(served, settled, credited, rejected uint64, short shortfall, lag time.Duration, fetched, now time.Time) Reconcile {
	accounted := credited + rejected
	r := Reconcile{DiffBytes: int64(served) - int64(credited), ThresholdBytes: threshold(max(served, credited)),
		CreditLagSeconds: int64(lag / time.Second)}
	fb := walletapi.FormatBytes
	if th := threshold(max(settled, accounted)); settled > accounted+th && settled-accounted > short.bytes {
		// The whole count a lag before the last fetch (the part of a
		// session still being counted included) shows more.
		short = shortfall{bytes: settled - accounted, threshold: th}
	}
	gap := served - min(accounted, served)
	short.bytes = min(short.bytes, gap) // never more than is uncredited now
	switch {
	case credited > served+r.ThresholdBytes:
		r.Mismatch = true
		r.MismatchBytes = credited - served
		r.Explanation = fmt.Sprintf("the gateway has credited %s more than this computer counted: "+
			"this wallet file lost part of its own count (kvasir stopped without closing it: killed, a crash, power lost, a full disk; "+
			"or a new or restored file), or the same identity key also works on another computer", fb(credited-served))
	case short.bytes > short.threshold:
		r.Mismatch = true
		r.MismatchBytes = short.bytes
		r.MismatchSession, r.MismatchCounted = short.session, short.counted
		r.ThresholdBytes = short.threshold
		where := ""
		if short.session != "" {
			where = fmt.Sprintf(" (in session %s, last counted %s, or before it)", short.session, short.counted.UTC().Format("2006-01-02 15:04:05Z"))
		}
		r.Explanation = fmt.Sprintf("%s that this computer counted more than %v before a statement fetch%s are neither credited nor "+
			"reported rejected by the gateway, although credits arrive within %v: the hub did not record them "+
			"(it restarted, or a session ended before it wrote its last bytes)", fb(short.bytes), lag, where, lag)
		if rest := gap - short.bytes; rest > ReconcileSlackBytes {
			r.AwaitingBytes = rest
			r.Explanation += fmt.Sprintf("; besides, %s counted since are awaiting credit", fb(rest))
		}
	case served > accounted+r.ThresholdBytes:
		r.AwaitingBytes = gap
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
	fmt.Fprintf(tw, "Credited\t%s\t%s in %s signed by the gateway\n", walletapi.FormatKVR(s.CreditedNKVR), fb(s.CreditedBytes), count(int(s.Statements), "statement"))
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
	if r := s.Reissued; r != nil {
		fmt.Fprintf(tw, "Reissued\tfrom #%d\t%s: the gateway's statements from #%d on differed from the %d this wallet held (its wallets restored from an older backup?); the wallet took the gateway's current ones, and credits for the work after its backup come again as it catches up\n",
			r.From, r.At.UTC().Format("2006-01-02 15:04Z"), r.From, r.Had)
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
