package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Path is where the hub serves the ledger to the gateway.
const Path = "/v1/ledger"

// MaxPageBytes bounds a ledger page body read by Client, in bytes.
const MaxPageBytes = 8 << 20

// ErrPage: a ledger page from the hub that is malformed, oversized, or
// breaks the ordering contract (ids strictly increasing, all > after, at
// most limit entries, every entry valid).
var ErrPage = errors.New("ledger: bad page")

// wireEntry is an Entry as JSON on GET /v1/ledger.
type wireEntry struct {
	ID            int64  `json:"id"`
	SessionID     string `json:"session"`
	WorkerID      string `json:"worker"`
	BytesIn       uint64 `json:"bytes_in"`
	BytesOut      uint64 `json:"bytes_out"`
	RejectedBytes uint64 `json:"rejected_bytes"`
	Final         bool   `json:"final"`
	TimeUnixNano  int64  `json:"time_ns"`
	Seq           uint64 `json:"seq,omitempty"` // the row's number in its session (Entry.Seq), 0: absent (unnumbered, or a schema-1 SQLite row)
}

// Page is the JSON body of GET /v1/ledger?after=ID&limit=N:
// {"entries":[{"id":..,"session":..,"worker":..,"bytes_in":..,"bytes_out":..,
// "rejected_bytes":..,"final":..,"time_ns":..[,"seq":..]}, ...]}.
type Page struct {
	Entries []wireEntry `json:"entries"`
}

// Handler serves GET /v1/ledger?after=ID&limit=N from r as a Page. Requests
// for which authorize returns false get 401 (the hub passes a check of the
// gateway's shared-secret signature, hub.Authorized); a nil authorize
// refuses everything. Bad parameters get 400; other methods 405.
func Handler(r Reader, authorize func(*http.Request) bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet {
			w.Header().Set("Allow", "GET")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		if authorize == nil || !authorize(req) {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		q := req.URL.Query()
		after, err := strconv.ParseInt(q.Get("after"), 10, 64)
		if q.Get("after") == "" {
			after, err = 0, nil
		}
		if err != nil || after < 0 {
			http.Error(w, "after: want a non-negative integer", http.StatusBadRequest)
			return
		}
		limit := DefaultLimit
		if s := q.Get("limit"); s != "" {
			limit, err = strconv.Atoi(s)
			if err != nil || limit < 1 || limit > MaxLimit {
				http.Error(w, fmt.Sprintf("limit: want 1..%d", MaxLimit), http.StatusBadRequest)
				return
			}
		}
		es, err := r.Read(req.Context(), after, limit)
		if err != nil {
			http.Error(w, "ledger unavailable", http.StatusServiceUnavailable)
			return
		}
		p := Page{Entries: make([]wireEntry, 0, len(es))}
		for _, e := range es {
			p.Entries = append(p.Entries, wireEntry{e.ID, e.SessionID, e.WorkerID, e.BytesIn, e.BytesOut, e.RejectedBytes, e.Final, e.Time.UnixNano(), e.Seq})
		}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(p)
	})
}

// DecodePage parses a Page body of at most MaxPageBytes from rd and checks
// it against the request (after, limit): at most limit entries, ids strictly
// increasing and > after, each entry passing Validate. Errors wrap ErrPage.
func DecodePage(rd io.Reader, after int64, limit int) ([]Entry, error) {
	body, err := io.ReadAll(io.LimitReader(rd, MaxPageBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPage, err)
	}
	if len(body) > MaxPageBytes {
		return nil, fmt.Errorf("%w: body exceeds %d bytes", ErrPage, MaxPageBytes)
	}
	var p Page
	if err := json.Unmarshal(body, &p); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrPage, err)
	}
	if len(p.Entries) > clampLimit(limit) {
		return nil, fmt.Errorf("%w: %d entries, asked for at most %d", ErrPage, len(p.Entries), clampLimit(limit))
	}
	out := make([]Entry, 0, len(p.Entries))
	prev := after
	for _, w := range p.Entries {
		if w.ID <= prev {
			return nil, fmt.Errorf("%w: id %d after %d", ErrPage, w.ID, prev)
		}
		prev = w.ID
		e := Entry{ID: w.ID, SessionID: w.SessionID, WorkerID: w.WorkerID, BytesIn: w.BytesIn, BytesOut: w.BytesOut,
			RejectedBytes: w.RejectedBytes, Final: w.Final, Time: time.Unix(0, w.TimeUnixNano).UTC(), Seq: w.Seq}
		if err := Validate(e); err != nil {
			return nil, fmt.Errorf("%w: id %d: %v", ErrPage, w.ID, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// Client reads a hub's ledger over HTTP(S); it implements Reader for the
// gateway's crediting.
type Client struct {
	BaseURL string                    // hub base URL, e.g. "http://10.0.0.2:7070"
	HTTP    *http.Client              // nil: a client with a 30 s timeout
	Sign    func(*http.Request) error // adds the gateway's credentials (hub shared-secret auth); may be nil
}

var _ Reader = (*Client)(nil)

// Read implements Reader with GET BaseURL/v1/ledger?after=ID&limit=N.
// Errors: transport errors, a non-200 status, or ErrPage.
func (c *Client) Read(ctx context.Context, afterID int64, limit int) ([]Entry, error) {
	limit = clampLimit(limit)
	u := strings.TrimRight(c.BaseURL, "/") + Path + "?" + url.Values{
		"after": {strconv.FormatInt(afterID, 10)}, "limit": {strconv.Itoa(limit)}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	if c.Sign != nil {
		if err := c.Sign(req); err != nil {
			return nil, fmt.Errorf("ledger: sign request: %w", err)
		}
	}
	hc := c.HTTP
	if hc == nil {
		hc = &http.Client{Timeout: 30 * time.Second}
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, fmt.Errorf("ledger: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("ledger: GET %s: %s: %s", Path, resp.Status, strings.TrimSpace(string(msg)))
	}
	return DecodePage(resp.Body, afterID, limit)
}
