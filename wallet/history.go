package wallet

import (
	"database/sql"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// GroupBy chooses how Groups groups the history.
type GroupBy int

// Groupings of the history.
const (
	ByHour    GroupBy = iota // UTC clock hours
	ByDay                    // UTC days
	BySession                // one group per worker session, from its start to the next session's start
)

// String returns "hour", "day" or "session".
func (g GroupBy) String() string {
	switch g {
	case ByHour:
		return "hour"
	case ByDay:
		return "day"
	case BySession:
		return "session"
	}
	return fmt.Sprintf("GroupBy(%d)", int(g))
}

// Group sums the history events whose time falls in [From, To): the
// sessions counted (metered, by the time of their last count), the
// statements credited (by the gateway's time) and the payouts. Events with
// the same bounds give the lines inside it.
type Group struct {
	By      GroupBy   `json:"by"`
	From    time.Time `json:"from"`
	To      time.Time `json:"to,omitzero"`       // exclusive; zero (left out of JSON) for the newest session (open-ended)
	Session string    `json:"session,omitempty"` // BySession: the session id

	Sessions      int    `json:"sessions"`       // metered sessions
	MeteredBytes  uint64 `json:"metered_bytes"`  // own count
	MeteredNKVR   uint64 `json:"metered_nkvr"`   // own count at the current rate: an estimate
	Statements    int    `json:"statements"`     // credit statements
	CreditedBytes uint64 `json:"credited_bytes"` //
	CreditedNKVR  uint64 `json:"credited_nkvr"`  //
	RejectedBytes uint64 `json:"rejected_bytes"` // reported by the gateway, never paid
	Payouts       int    `json:"payouts"`        //
	PaidNKVR      uint64 `json:"paid_nkvr"`      //
}

// Events returns the history events with a time in [from, to), newest
// first: one metered event per session (at the time of its last count),
// one credited event per statement (at the gateway's time) and one paid
// event per payout. A zero from or to leaves that side open; limit <= 0
// returns them all (a CSV export keeps every row).
func (w *Wallet) Events(from, to time.Time, limit int) ([]Event, error) {
	if err := w.Flush(); err != nil {
		return nil, err
	}
	rate, err := w.rate()
	if err != nil {
		return nil, err
	}
	lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
	if !from.IsZero() {
		lo = from.UnixMilli()
	}
	if !to.IsZero() {
		hi = to.UnixMilli()
	}
	lim := int64(limit)
	if limit <= 0 {
		lim = -1 // SQLite: no limit
	}
	var out []Event
	err = w.each(`SELECT session, bytes_in + bytes_out, updated FROM sessions WHERE updated >= ? AND updated < ?
		ORDER BY updated DESC, session DESC LIMIT ?`, []any{lo, hi, lim}, func(r *sql.Rows) error {
		var sess string
		var b, upd int64
		if err := r.Scan(&sess, &b, &upd); err != nil {
			return err
		}
		est, _ := walletapi.NKVR(uint64(b), rate)
		out = append(out, Event{Time: time.UnixMilli(upd).UTC(), State: StateMetered, Session: sess, Bytes: uint64(b), NKVR: est})
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Newest by statement number: the primary key, no sort of the table
	// (statements are numbered in the order the gateway credits them).
	err = w.each(`SELECT n, bytes, rejected, nkvr, ledger_after, ledger_upto, time FROM statements WHERE time >= ? AND time < ?
		ORDER BY n DESC LIMIT ?`, []any{lo, hi, lim}, func(r *sql.Rows) error {
		var n, b, rej, k, la, lu, t int64
		if err := r.Scan(&n, &b, &rej, &k, &la, &lu, &t); err != nil {
			return err
		}
		out = append(out, Event{Time: time.UnixMilli(t).UTC(), State: StateCredited, Statement: uint64(n),
			Ledger: fmt.Sprintf("(%d, %d]", la, lu), Bytes: uint64(b), Rejected: uint64(rej), NKVR: uint64(k)})
		return nil
	})
	if err != nil {
		return nil, err
	}
	err = w.each(`SELECT nkvr, ref, time FROM payouts WHERE time >= ? AND time < ? ORDER BY time DESC, id DESC LIMIT ?`,
		[]any{lo, hi, lim}, func(r *sql.Rows) error {
			var k, t int64
			var ref string
			if err := r.Scan(&k, &ref, &t); err != nil {
				return err
			}
			out = append(out, Event{Time: time.UnixMilli(t).UTC(), State: StatePaid, NKVR: uint64(k), Ref: ref})
			return nil
		})
	if err != nil {
		return nil, err
	}
	slices.SortStableFunc(out, func(a, b Event) int { return b.Time.Compare(a.Time) })
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	if out == nil {
		out = []Event{}
	}
	return out, nil
}

// Groups returns the newest limit groups of the history (limit <= 0: 48),
// newest first; empty periods are left out. Metered amounts are priced at
// the current rate (see Summary).
func (w *Wallet) Groups(by GroupBy, limit int) ([]Group, error) {
	if limit <= 0 {
		limit = 48
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	rate, err := w.rate()
	if err != nil {
		return nil, err
	}
	var gs []Group
	switch by {
	case ByHour, ByDay:
		gs, err = w.periodGroups(by, limit)
	case BySession:
		gs, err = w.sessionGroups(limit)
	default:
		return nil, fmt.Errorf("wallet: unknown grouping %d", int(by))
	}
	if err != nil {
		return nil, err
	}
	for i := range gs {
		gs[i].MeteredNKVR, _ = walletapi.NKVR(gs[i].MeteredBytes, rate)
	}
	return gs, nil
}

// periodGroups groups by UTC hour or day in SQL, over the whole tables.
func (w *Wallet) periodGroups(by GroupBy, limit int) ([]Group, error) {
	size := int64(time.Hour / time.Millisecond)
	if by == ByDay {
		size *= 24
	}
	groups := map[int64]*Group{}
	get := func(k int64) *Group {
		g := groups[k]
		if g == nil {
			g = &Group{By: by, From: time.UnixMilli(k * size).UTC(), To: time.UnixMilli((k + 1) * size).UTC()}
			groups[k] = g
		}
		return g
	}
	err := w.each(`SELECT updated / ?, COUNT(*), SUM(bytes_in + bytes_out) FROM sessions GROUP BY 1`, []any{size},
		func(r *sql.Rows) error {
			var k, n, b int64
			if err := r.Scan(&k, &n, &b); err != nil {
				return err
			}
			g := get(k)
			g.Sessions, g.MeteredBytes = int(n), uint64(b)
			return nil
		})
	if err != nil {
		return nil, err
	}
	err = w.each(`SELECT time / ?, COUNT(*), SUM(bytes), SUM(nkvr), SUM(rejected) FROM statements GROUP BY 1`, []any{size},
		func(r *sql.Rows) error {
			var k, n, b, c, rej int64
			if err := r.Scan(&k, &n, &b, &c, &rej); err != nil {
				return err
			}
			g := get(k)
			g.Statements, g.CreditedBytes, g.CreditedNKVR, g.RejectedBytes = int(n), uint64(b), uint64(c), uint64(rej)
			return nil
		})
	if err != nil {
		return nil, err
	}
	err = w.each(`SELECT time / ?, COUNT(*), SUM(nkvr) FROM payouts GROUP BY 1`, []any{size}, func(r *sql.Rows) error {
		var k, n, c int64
		if err := r.Scan(&k, &n, &c); err != nil {
			return err
		}
		g := get(k)
		g.Payouts, g.PaidNKVR = int(n), uint64(c)
		return nil
	})
	if err != nil {
		return nil, err
	}
	keys := make([]int64, 0, len(groups))
	for k := range groups {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	slices.Reverse(keys)
	out := make([]Group, 0, min(limit, len(keys)))
	for _, k := range keys[:min(limit, len(keys))] {
		out = append(out, *groups[k])
	}
	return out, nil
}

// sessionGroups makes one group per session, newest first: the session's
// own count, and the statements and payouts timed from its start to the
// next session's start (credits follow the work, so a statement belongs to
// the session that was running or had just ended). Statements older than
// the oldest session are in no session group.
func (w *Wallet) sessionGroups(limit int) ([]Group, error) {
	var out []Group
	err := w.each(`SELECT session, started, bytes_in + bytes_out FROM sessions ORDER BY started DESC, session DESC LIMIT ?`,
		[]any{limit}, func(r *sql.Rows) error {
			var sess string
			var st, b int64
			if err := r.Scan(&sess, &st, &b); err != nil {
				return err
			}
			out = append(out, Group{By: BySession, Session: sess, From: time.UnixMilli(st).UTC(), Sessions: 1, MeteredBytes: uint64(b)})
			return nil
		})
	if err != nil {
		return nil, err
	}
	for i := range out {
		g := &out[i]
		hi := int64(math.MaxInt64)
		if i > 0 {
			g.To = out[i-1].From
			hi = g.To.UnixMilli()
		}
		lo := g.From.UnixMilli()
		var n, b, c, rej, pn, pc int64
		if err := w.db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(bytes), 0), COALESCE(SUM(nkvr), 0), COALESCE(SUM(rejected), 0)
			FROM statements WHERE time >= ? AND time < ?`, lo, hi).Scan(&n, &b, &c, &rej); err != nil {
			return nil, fmt.Errorf("wallet: %w", err)
		}
		if err := w.db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(nkvr), 0) FROM payouts WHERE time >= ? AND time < ?`, lo, hi).Scan(&pn, &pc); err != nil {
			return nil, fmt.Errorf("wallet: %w", err)
		}
		g.Statements, g.CreditedBytes, g.CreditedNKVR, g.RejectedBytes = int(n), uint64(b), uint64(c), uint64(rej)
		g.Payouts, g.PaidNKVR = int(pn), uint64(pc)
	}
	return out, nil
}

// rate is the newest statement's rate, or the default before any.
func (w *Wallet) rate() (uint64, error) {
	var r int64
	err := w.db.QueryRow(`SELECT rate FROM statements ORDER BY n DESC LIMIT 1`).Scan(&r)
	switch {
	case errors.Is(err, sql.ErrNoRows) || (err == nil && r <= 0):
		return walletapi.DefaultRateNKVRPerByte, nil
	case err != nil:
		return 0, fmt.Errorf("wallet: %w", err)
	}
	return uint64(r), nil
}

// each runs query and calls f for every row.
func (w *Wallet) each(query string, args []any, f func(*sql.Rows) error) error {
	rows, err := w.db.Query(query, args...)
	if err != nil {
		return fmt.Errorf("wallet: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		if err := f(rows); err != nil {
			return fmt.Errorf("wallet: %w", err)
		}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("wallet: %w", err)
	}
	return nil
}

// GroupLabel names a group for a person: "2026-05-01 12:00–13:00 UTC",
// "2026-05-01 UTC" or "session s1 from 2026-05-01 12:25:01 UTC".
func GroupLabel(g Group) string {
	switch g.By {
	case ByHour:
		return g.From.UTC().Format("2006-01-02 15:04") + "–" + g.To.UTC().Format("15:04") + " UTC"
	case ByDay:
		return g.From.UTC().Format("2006-01-02") + " UTC"
	}
	return "session " + g.Session + " from " + g.From.UTC().Format("2006-01-02 15:04:05") + " UTC"
}

// WriteGroups writes grouped history for a person, newest first: per
// group the credited KVR and statements, the metered estimate and
// sessions, and payouts.
func WriteGroups(w io.Writer, gs []Group) error {
	if len(gs) == 0 {
		_, err := fmt.Fprintln(w, "Grouped history: none yet")
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "History by %s (newest first):\n", gs[0].By)
	for _, g := range gs {
		fmt.Fprintf(tw, "  %s\tcredited %s in %s\tmetered ≈%s in %s", GroupLabel(g),
			walletapi.FormatKVR(g.CreditedNKVR), count(g.Statements, "statement"), walletapi.FormatKVR(g.MeteredNKVR), count(g.Sessions, "session"))
		if g.Payouts > 0 {
			fmt.Fprintf(tw, "\tpaid %s", walletapi.FormatKVR(g.PaidNKVR))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

// count is "1 statement", "2 statements".
func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
