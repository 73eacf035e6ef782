package worker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Downloads from a model source (protocol version 3, issue 12). When an
// ASSIGN names a source URL (the full GGUF on any static HTTP(S) host), the
// worker fetches each assigned expert's bytes from it with HTTP range
// requests instead of CHUNK_REQ: the expert file is the concatenation of
// the expert's byte ranges in that file (wire.Assigned.Ranges), read in
// order from the verified length of its partial file (slice.Store.Resume)
// and written chunk by chunk, each chunk checked against its SHA-256 from
// ASSIGN before it is written (slice.Store.WriteChunk, which also keeps the
// quota), the whole file against the expert's SHA-256 at Commit. The hashes
// are the backbone's (for a backbone-only file, those stored in it), never
// the server's.
//
// A response that is not 206 with the requested Content-Range, a short
// body, a stalled body (no byte for Config.SourceStall), a chunk whose hash
// differs and a 5xx are retried after a delay (Config.SourceRetry,
// doubling, at most 30 s), each attempt resuming after the last verified
// chunk; after Config.SourceAttempts failures in a row without progress, or
// a 4xx answer, the expert is skipped (its verified part stays for a later
// assignment) and the next one is fetched. A newer ASSIGN cancels the
// download in progress.

// errSourcePermanent marks a source failure that retrying cannot fix (a 4xx
// answer, a server that ignores Range).
type errSourcePermanent struct{ error }

func (e errSourcePermanent) Unwrap() error { return e.error }

// newSourceClient returns the HTTP client for model sources.
func newSourceClient(cfg Config) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: cfg.SourceRootCAs, MinVersion: tls.VersionTLS12}
	tr.ResponseHeaderTimeout = cfg.SourceStall
	return &http.Client{Transport: tr}
}

// fetchSource downloads expert e of a from the model source and announces
// it (HOLDINGS add) once committed. It returns a newer ASSIGN that arrived
// meanwhile (with errSuperseded), or nil when done or given up; other
// errors end the session.
func (w *Worker) fetchSource(ctx context.Context, a *wire.Assign, e wire.Assigned, ev <-chan dlEvent, send func([]byte) error) (*wire.Assign, error) {
	st := w.store
	l, x := int(e.Layer), int(e.Expert)
	src := a.Source
	if w.cfg.Source != "" {
		src = w.cfg.Source
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next *wire.Assign
	poll := func() bool {
		for {
			select {
			case m := <-ev:
				if m.assign != nil {
					next = m.assign
					cancel()
					return true
				}
			default:
				return next != nil
			}
		}
	}
	delay := w.cfg.SourceRetry
	fails := 0
	for {
		off, err := st.Resume(l, x, int(a.ChunkSize), e.Chunks)
		if err != nil {
			w.setErr("resume: " + err.Error())
			return nil, nil
		}
		w.progress(a)
		if off == int64(e.Size) {
			break
		}
		got, err := w.streamRanges(fctx, src, a, e, off, poll)
		if poll() {
			return next, errSuperseded
		}
		if ctx.Err() != nil {
			return nil, nil
		}
		if err == nil {
			continue
		}
		if errors.Is(err, slice.ErrQuota) {
			st.Abort(l, x)
			w.setErr(err.Error())
			return nil, nil
		}
		w.srcFails.Add(1)
		if got > 0 {
			fails, delay = 0, w.cfg.SourceRetry
		}
		fails++
		w.setErr(fmt.Sprintf("source: layer %d expert %d: %v", l, x, err))
		var perm errSourcePermanent
		if errors.As(err, &perm) || fails >= w.cfg.SourceAttempts {
			return nil, nil // skipped; its verified part stays
		}
		if newer, ok := backoff(ctx, ev, delay); !ok {
			return nil, nil
		} else if newer != nil {
			return newer, errSuperseded
		}
		delay = min(2*delay, 30*time.Second)
	}
	if err := st.Commit(l, x, e.SHA256); err != nil {
		w.setErr("commit: " + err.Error())
		return nil, nil
	}
	return nil, w.held(a, e, send)
}

// backoff waits delay before a retry. It returns a newer ASSIGN that
// arrived meanwhile (ending the wait), or ok false when ctx ended; another
// provisioning event ends the wait too.
func backoff(ctx context.Context, ev <-chan dlEvent, delay time.Duration) (newer *wire.Assign, ok bool) {
	t := time.NewTimer(delay)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return nil, false
	case m := <-ev:
		return m.assign, true
	case <-t.C:
		return nil, true
	}
}

// chunker cuts the bytes of one expert file, arriving in order from
// byte pos, into chunks of size chunk (the last one shorter, at size) and
// hands each complete chunk to put with its offset.
type chunker struct {
	buf         []byte
	pos         int64 // bytes of the expert file received (written or in buf)
	chunk, size int64
	put         func(data []byte, at int64) error
}

// add takes p; an error of put drops the incomplete chunk.
func (c *chunker) add(p []byte) error {
	for len(p) > 0 {
		k := min(len(p), int(c.chunk)-len(c.buf))
		c.buf = append(c.buf, p[:k]...)
		p = p[k:]
		c.pos += int64(k)
		if int64(len(c.buf)) == c.chunk || c.pos == c.size {
			err := c.put(c.buf, c.pos-int64(len(c.buf)))
			c.buf = c.buf[:0]
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// streamRanges fetches expert e's file from byte off (a chunk boundary) to
// its end from src, writing each complete chunk to the store; it returns
// the bytes written. poll is called between reads and reports a newer
// ASSIGN (the read is then abandoned).
func (w *Worker) streamRanges(ctx context.Context, src string, a *wire.Assign, e wire.Assigned, off int64, poll func() bool) (int64, error) {
	st := w.store
	l, x := int(e.Layer), int(e.Expert)
	var wrote int64
	c := &chunker{buf: make([]byte, 0, a.ChunkSize), pos: off, chunk: int64(a.ChunkSize), size: int64(e.Size),
		put: func(data []byte, at int64) error {
			if err := st.WriteChunk(l, x, at, data, e.Chunks[at/int64(a.ChunkSize)]); err != nil {
				return err
			}
			wrote += int64(len(data))
			w.dlDone.Add(uint64(len(data)))
			w.chunksGot.Add(1)
			return nil
		}}
	var rs int64 // start of the current range in the expert file
	for _, r := range e.Ranges {
		re := rs + int64(r.Len)
		if re > c.pos {
			from := r.Offset + uint64(c.pos-rs)
			if err := w.getRange(ctx, src, from, r.Offset+r.Len-1, c, poll); err != nil {
				return wrote, err
			}
		}
		rs = re
	}
	return wrote, nil
}

// getRange GETs bytes [from, to] of src into c, checking that the answer
// is 206 with exactly that Content-Range and a body that long, and that
// the body never stalls longer than Config.SourceStall.
func (w *Worker) getRange(ctx context.Context, src string, from, to uint64, c *chunker, poll func() bool) error {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, src, nil)
	if err != nil {
		return errSourcePermanent{err}
	}
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", from, to))
	req.Header.Set("Accept-Encoding", "identity")
	w.srcReqs.Add(1)
	resp, err := w.srcClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusPartialContent:
	case resp.StatusCode == http.StatusOK:
		return errSourcePermanent{fmt.Errorf("%s answered 200 to a range request: it does not serve byte ranges", host(src))}
	case resp.StatusCode >= 500:
		return fmt.Errorf("%s: %s", host(src), resp.Status)
	default:
		return errSourcePermanent{fmt.Errorf("%s: %s", host(src), resp.Status)}
	}
	if a, b, ok := contentRange(resp.Header.Get("Content-Range")); !ok || a != from || b != to {
		return fmt.Errorf("%s: Content-Range %q for bytes %d-%d", host(src), resp.Header.Get("Content-Range"), from, to)
	}
	stall := time.AfterFunc(w.cfg.SourceStall, cancel)
	defer stall.Stop()
	want := int64(to - from + 1)
	var got int64
	rb := make([]byte, 64<<10)
	for got < want {
		if poll() {
			return context.Canceled
		}
		n, err := resp.Body.Read(rb[:min(int64(len(rb)), want-got)])
		stall.Reset(w.cfg.SourceStall)
		got += int64(n)
		if perr := c.add(rb[:n]); perr != nil {
			return perr
		}
		if err == io.EOF && got < want {
			return fmt.Errorf("%s: short body: %d of %d bytes", host(src), got, want)
		}
		if err != nil && err != io.EOF {
			return fmt.Errorf("%s: reading the body: %w", host(src), err)
		}
	}
	return nil
}

// contentRange parses "bytes A-B/TOTAL" (TOTAL may be "*").
func contentRange(s string) (a, b uint64, ok bool) {
	rest, ok := strings.CutPrefix(s, "bytes ")
	if !ok {
		return 0, 0, false
	}
	span, _, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, 0, false
	}
	as, bs, ok := strings.Cut(span, "-")
	if !ok {
		return 0, 0, false
	}
	a, e1 := strconv.ParseUint(as, 10, 64)
	b, e2 := strconv.ParseUint(bs, 10, 64)
	return a, b, e1 == nil && e2 == nil && a <= b
}

// host returns the host of a URL for messages (never the path or query,
// which may hold a token).
func host(u string) string {
	rest := u
	if i := strings.Index(rest, "://"); i >= 0 {
		rest = rest[i+3:]
	}
	h, _, _ := strings.Cut(rest, "/")
	if i := strings.LastIndex(h, "@"); i >= 0 {
		h = h[i+1:]
	}
	return "source " + h
}
