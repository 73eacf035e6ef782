package worker

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// modelSource is a loopback HTTP server of a model file with range
// support (http.ServeContent), which can be told to lie.
type modelSource struct {
	data   []byte
	url    string
	n      atomic.Int64
	mu     sync.Mutex
	ranges []string // Range header of each request
	// lie, if set, may answer request n (from 1) itself: it returns true
	// when it did.
	lie func(n int64, w http.ResponseWriter, r *http.Request) bool
}

func newModelSource(t *testing.T, data []byte) *modelSource {
	t.Helper()
	s := &modelSource{data: data}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: s, ErrorLog: nil}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	s.url = "http://" + ln.Addr().String() + "/models/full.gguf"
	return s
}

func (s *modelSource) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := s.n.Add(1)
	s.mu.Lock()
	s.ranges = append(s.ranges, r.Header.Get("Range"))
	lie := s.lie
	s.mu.Unlock()
	if lie != nil && lie(n, w, r) {
		return
	}
	http.ServeContent(w, r, "full.gguf", time.Time{}, bytes.NewReader(s.data))
}

func (s *modelSource) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ranges...)
}

// flipWriter flips the first byte of the body.
type flipWriter struct {
	http.ResponseWriter
	done bool
}

func (f *flipWriter) Write(p []byte) (int, error) {
	if !f.done && len(p) > 0 {
		f.done = true
		q := bytes.Clone(p)
		q[0] ^= 0x40
		return f.ResponseWriter.Write(q)
	}
	return f.ResponseWriter.Write(p)
}

// cutWriter sends at most left body bytes, then drops the connection.
type cutWriter struct {
	http.ResponseWriter
	left int
}

func (c *cutWriter) Write(p []byte) (int, error) {
	if len(p) > c.left {
		c.ResponseWriter.Write(p[:c.left])
		c.ResponseWriter.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}
	c.left -= len(p)
	return c.ResponseWriter.Write(p)
}

// sourceFixture is the tiny model, its catalog and a worker with an empty
// slice directory that downloads from a model source.
type sourceFixture struct {
	full []byte
	cat  *slice.Catalog
	src  *modelSource
	dir  string
}

func newSourceFixture(t *testing.T) *sourceFixture {
	t.Helper()
	data, err := modelgen.Tiny()
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	cat, err := slice.NewCatalog(f)
	if err != nil {
		t.Fatal(err)
	}
	return &sourceFixture{full: data, cat: cat, src: newModelSource(t, data), dir: t.TempDir()}
}

// worker opens a worker on the fixture's slice directory (no session).
func (fx *sourceFixture) worker(t *testing.T, quota int64, mod func(*Config)) *Worker {
	t.Helper()
	_, key, _ := ed25519.GenerateKey(nil)
	cfg := Config{GatewayURL: "wss://127.0.0.1:9", Key: key, SliceDir: fx.dir, Quota: quota, Logger: quiet,
		SourceRetry: 5 * time.Millisecond, SourceStall: 5 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	w, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	return w
}

const srcChunk = 16 << 10

// assign is the ASSIGN the backbone sends for keys ((layer, expert) pairs)
// with the model source url.
func (fx *sourceFixture) assign(url string, keys ...[2]int) (*wire.Welcome, *wire.Assign) {
	h := fx.cat.Header()
	a := &wire.Assign{ModelID: h.ModelID, Arch: h.Architecture, DFF: uint32(h.DFF), ChunkSize: srcChunk, Source: url}
	seen := map[int]bool{}
	for _, k := range keys {
		l, e := k[0], k[1]
		if !seen[l] {
			seen[l] = true
			g, u, d, _ := h.Layers[l].Types()
			a.Layers = append(a.Layers, wire.LayerTypes{Layer: uint16(l), Gate: uint32(g), Up: uint32(u), Down: uint32(d)})
		}
		s, _ := fx.cat.Sums(l, e, srcChunk)
		x := wire.Assigned{Layer: uint16(l), Expert: uint32(e), Size: uint64(fx.cat.Size(l, e)), SHA256: s.SHA256, Chunks: s.Chunks}
		for _, r := range fx.cat.Ranges(l, e) {
			x.Ranges = append(x.Ranges, wire.Range{Offset: r.Offset, Len: r.Len})
		}
		a.Experts = append(a.Experts, x)
	}
	return &wire.Welcome{D: uint32(h.DModel), K: 2, NLayer: uint16(h.NLayer), NExpert: uint32(h.NExpert)}, a
}

// apply runs the downloader on a and returns the HOLDINGS it sent.
func apply(t *testing.T, w *Worker, wel *wire.Welcome, a *wire.Assign) []*wire.Holdings {
	t.Helper()
	var sent []*wire.Holdings
	send := func(msg []byte) error {
		f, err := wire.Decode(msg, nil)
		if err != nil {
			t.Fatalf("the worker sent a bad frame: %v", err)
		}
		if h, ok := f.(*wire.Holdings); ok {
			sent = append(sent, h)
		}
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	next, err := w.applyAssign(ctx, wel, a, make(chan dlEvent), send)
	if next != nil || err != nil {
		t.Fatalf("applyAssign: %v %v", next, err)
	}
	return sent
}

// added lists the experts HOLDINGS announced.
func added(hs []*wire.Holdings) map[[2]int][32]byte {
	out := map[[2]int][32]byte{}
	for _, h := range hs {
		for _, x := range h.Add {
			out[[2]int{int(x.Layer), int(x.Expert)}] = x.SHA256
		}
	}
	return out
}

// checkHeld verifies the slice directory holds exactly keys, each file
// with the catalog's hash, within quota.
func (fx *sourceFixture) checkHeld(t *testing.T, w *Worker, keys ...[2]int) {
	t.Helper()
	st := w.Store()
	if got := len(st.Holdings()); got != len(keys) {
		t.Errorf("%d experts held, want %d", got, len(keys))
	}
	for _, k := range keys {
		b, err := os.ReadFile(slice.ExpertPath(fx.dir, k[0], k[1]))
		want, _ := fx.cat.Hash(k[0], k[1])
		if err != nil || sha256.Sum256(b) != want || !st.Holds(k[0], k[1]) {
			t.Errorf("expert %v: held %v, file hash wrong or missing (%v)", k, st.Holds(k[0], k[1]), err)
		}
	}
	if st.Used() > st.Quota() {
		t.Errorf("used %d > quota %d", st.Used(), st.Quota())
	}
}

// TestSourceDownload: a worker with an empty slice folder fetches its
// assigned experts from a loopback HTTP server by byte ranges (three per
// expert, cut into chunks across range boundaries), verifies and commits
// them, and announces each with its hash.
func TestSourceDownload(t *testing.T) {
	fx := newSourceFixture(t)
	keys := [][2]int{{0, 1}, {2, 7}, {3, 0}}
	w := fx.worker(t, 1<<30, nil)
	wel, a := fx.assign(fx.src.url, keys...)
	hs := apply(t, w, wel, a)
	fx.checkHeld(t, w, keys...)
	got := added(hs)
	for _, k := range keys {
		want, _ := fx.cat.Hash(k[0], k[1])
		if got[k] != want {
			t.Errorf("HOLDINGS for %v: %x, want %x", k, got[k], want)
		}
	}
	if n := len(fx.src.requests()); n != 3*len(keys) {
		t.Errorf("%d range requests, want %d (one per range)", n, 3*len(keys))
	}
	st := w.Stats()
	if st.SourceRequests != uint64(3*len(keys)) || st.SourceFailures != 0 || st.DownloadExpertsDone != 3 {
		t.Errorf("stats %+v", st)
	}
	// An override (a mirror) is used instead of the ASSIGN's URL.
	fx2 := newSourceFixture(t)
	mirror := newModelSource(t, fx2.full)
	w2 := fx2.worker(t, 1<<30, func(c *Config) { c.Source = mirror.url })
	wel, a = fx2.assign("http://127.0.0.1:1/nowhere", [2]int{1, 1})
	apply(t, w2, wel, a)
	fx2.checkHeld(t, w2, [2]int{1, 1})
	if len(mirror.requests()) != 3 {
		t.Errorf("the mirror saw %d requests", len(mirror.requests()))
	}
}

// TestSourceLies: wrong bytes, short bodies and 500s are retried (resuming
// after the last verified chunk); a server that keeps lying or ignores
// Range gets the expert skipped; nothing unverified is ever held.
func TestSourceLies(t *testing.T) {
	cases := []struct {
		name      string
		lie       func(n int64, w http.ResponseWriter, r *http.Request) bool
		held      bool
		minFails  uint64
		checkReqs func(t *testing.T, reqs []string)
	}{
		{"wrong bytes once", func(n int64, w http.ResponseWriter, r *http.Request) bool {
			if n == 2 { // the up range
				return serveWith(&flipWriter{ResponseWriter: w}, r)
			}
			return false
		}, true, 1, nil},
		{"short body", func(n int64, w http.ResponseWriter, r *http.Request) bool {
			if n == 1 {
				return serveWith(&cutWriter{ResponseWriter: w, left: 2*srcChunk + 100}, r)
			}
			return false
		}, true, 1, func(t *testing.T, reqs []string) {
			// The retry starts after the two verified chunks, not at 0.
			first, second := rangeStart(t, reqs[0]), rangeStart(t, reqs[1])
			if second != first+2*srcChunk {
				t.Errorf("retry asked %s after %s: want a resume at +%d", reqs[1], reqs[0], 2*srcChunk)
			}
		}},
		{"500 twice", func(n int64, w http.ResponseWriter, r *http.Request) bool {
			if n <= 2 {
				http.Error(w, "overloaded", http.StatusInternalServerError)
				return true
			}
			return false
		}, true, 2, nil},
		{"wrong Content-Range", func(n int64, w http.ResponseWriter, r *http.Request) bool {
			if n == 1 {
				w.Header().Set("Content-Range", "bytes 0-9/100")
				w.WriteHeader(http.StatusPartialContent)
				w.Write(make([]byte, 10))
				return true
			}
			return false
		}, true, 1, nil},
		{"always wrong bytes", func(n int64, w http.ResponseWriter, r *http.Request) bool {
			return serveWith(&flipWriter{ResponseWriter: w}, r)
		}, false, 5, nil},
		{"ignores Range", func(n int64, w http.ResponseWriter, r *http.Request) bool {
			r.Header.Del("Range")
			return serveWith(w, r)
		}, false, 1, nil},
		{"404", func(n int64, w http.ResponseWriter, r *http.Request) bool {
			http.NotFound(w, r)
			return true
		}, false, 1, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			fx := newSourceFixture(t)
			fx.src.lie = c.lie
			w := fx.worker(t, 1<<30, nil)
			key := [2]int{1, 4}
			wel, a := fx.assign(fx.src.url, key)
			hs := apply(t, w, wel, a)
			if c.held {
				fx.checkHeld(t, w, key)
				if len(added(hs)) != 1 {
					t.Errorf("HOLDINGS %v", hs)
				}
			} else {
				fx.checkHeld(t, w)
				if len(added(hs)) != 0 {
					t.Errorf("an unverified expert was announced: %v", hs)
				}
			}
			if st := w.Stats(); st.SourceFailures < c.minFails || (!c.held && st.LastError == "") {
				t.Errorf("failures %d (want >= %d), last error %q", st.SourceFailures, c.minFails, st.LastError)
			}
			if c.checkReqs != nil {
				c.checkReqs(t, fx.src.requests())
			}
			ents, _ := os.ReadDir(filepath.Join(fx.dir, "L001"))
			for _, e := range ents {
				if !c.held && !strings.HasSuffix(e.Name(), ".part") {
					t.Errorf("unexpected file %s", e.Name())
				}
			}
		})
	}
}

func serveWith(w http.ResponseWriter, r *http.Request) bool {
	data, _ := modelgen.Tiny()
	http.ServeContent(w, r, "full.gguf", time.Time{}, bytes.NewReader(data))
	return true
}

func rangeStart(t *testing.T, h string) uint64 {
	t.Helper()
	var a, b uint64
	if _, err := fmt.Sscanf(h, "bytes=%d-%d", &a, &b); err != nil {
		t.Fatalf("Range %q: %v", h, err)
	}
	return a
}

// TestSourceResumeAndQuota: a download cut off and given up resumes, in a
// new worker on the same folder, from its verified partial file; an
// assignment larger than the quota fetches only what fits.
func TestSourceResumeAndQuota(t *testing.T) {
	fx := newSourceFixture(t)
	key := [2]int{2, 2}
	fx.src.lie = func(n int64, w http.ResponseWriter, r *http.Request) bool {
		return serveWith(&cutWriter{ResponseWriter: w, left: 3*srcChunk + 5}, r)
	}
	w := fx.worker(t, 1<<30, func(c *Config) { c.SourceAttempts = 1 })
	wel, a := fx.assign(fx.src.url, key)
	apply(t, w, wel, a)
	if w.Store().Holds(2, 2) || w.Store().Partial(2, 2) != 3*srcChunk {
		t.Fatalf("after the cut: held %v, partial %d", w.Store().Holds(2, 2), w.Store().Partial(2, 2))
	}
	w.Close()
	fx.src.lie = nil
	before := len(fx.src.requests())
	w2 := fx.worker(t, 1<<30, nil)
	apply(t, w2, wel, a)
	fx.checkHeld(t, w2, key)
	reqs := fx.src.requests()[before:]
	if len(reqs) == 0 || rangeStart(t, reqs[0]) != a.Experts[0].Ranges[0].Offset+3*srcChunk {
		t.Errorf("after a restart the download asked %v, want a resume at chunk 3", reqs)
	}

	// Quota for two experts and a bit: the third is not fetched.
	fx3 := newSourceFixture(t)
	size := fx3.cat.Size(0, 0)
	w3 := fx3.worker(t, 2*size+100, nil)
	keys := [][2]int{{0, 0}, {0, 1}, {0, 2}}
	wel, a = fx3.assign(fx3.src.url, keys...)
	apply(t, w3, wel, a)
	fx3.checkHeld(t, w3, keys[:2]...)
	if w3.Store().Used() != 2*size {
		t.Errorf("used %d, want %d", w3.Store().Used(), 2*size)
	}
}

// TestSourceOutageRetried, on the worker's defaults: an expert skipped
// while the model source was down (503 to all SourceAttempts, 5, of its
// downloads) is downloaded once the source is back, SkipRetry (15 s)
// after the pass that skipped it, with no new ASSIGN. Before, it stayed
// missing until the worker restarted.
func TestSourceOutageRetried(t *testing.T) {
	fx := newSourceFixture(t)
	var down atomic.Bool
	down.Store(true)
	fx.src.lie = func(n int64, w http.ResponseWriter, r *http.Request) bool {
		if down.Load() {
			http.Error(w, "down for maintenance", http.StatusServiceUnavailable)
			return true
		}
		return false
	}
	w := fx.worker(t, 1<<30, nil)
	key := [2]int{1, 1}
	wel, a := fx.assign(fx.src.url, key)
	ev := make(chan dlEvent, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.downloader(ctx, wel, ev, func([]byte) error { return nil }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("downloader: %v", err)
		}
	}()
	t0 := time.Now()
	ev <- dlEvent{assign: a}
	for len(fx.src.requests()) < 5 { // the default SourceAttempts, 0.5+1+2+4 s of backoff apart
		if time.Since(t0) > 30*time.Second {
			t.Fatalf("%d source requests", len(fx.src.requests()))
		}
		time.Sleep(5 * time.Millisecond)
	}
	skipped := time.Now()
	time.Sleep(200 * time.Millisecond)
	if w.Store().Holds(key[0], key[1]) {
		t.Fatal("held while the source was down")
	}
	down.Store(false)
	for !w.Store().Holds(key[0], key[1]) {
		if time.Since(t0) > 60*time.Second {
			t.Fatalf("not downloaded %v after the source came back", time.Since(t0))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if el := time.Since(skipped); el < 14*time.Second {
		t.Errorf("retried %v after the skip, before SkipRetry's 15 s", el)
	}
	fx.checkHeld(t, w, key)
}
