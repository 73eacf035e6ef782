package worker

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/engine/idlespin"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// workerSession is one connection to the gateway, from HELLO until it
// fails or Run's context ends. Four goroutines serve it, each a method:
// readLoop (frames from the backbone), computeLoop (DISPATCHes in arrival
// order), pingLoop (pings and pause changes) and, with a slice directory,
// downloadLoop (assignments). The first error any of them posts on errc
// ends the session.
type workerSession struct {
	w  *Worker
	c  *websocket.Conn
	bc *wire.BatchConn // c's connection, batching each message's writes (nil: not batched)
	// sctx bounds the session's goroutines and computations; connection
	// reads and writes use cctx, which is not derived from Run's context,
	// because coder/websocket closes the connection without a close
	// handshake when a Read's context ends.
	sctx    context.Context
	cancel  context.CancelFunc // ends sctx
	cctx    context.Context
	ccancel context.CancelFunc // ends cctx

	wel   *wire.Welcome
	lim   *wire.Limits // what a frame from the backbone may hold (from WELCOME)
	errc  chan error   // why the session ends: the first error of a loop
	queue chan queued
	dl    chan dlEvent // provisioning frames, to the downloader
}

// session runs one connection until it fails or ctx ends; welcomed is when
// WELCOME arrived (zero if it did not).
func (w *Worker) session(ctx context.Context) (welcomed time.Time, err error) {
	err = w.runSession(ctx, &welcomed)
	return welcomed, err
}

// runSession is session's body; it sets *welcomed on WELCOME.
func (w *Worker) runSession(ctx context.Context, welcomed *time.Time) error {
	c, bc, err := w.dial(ctx)
	if err != nil {
		return err
	}
	defer c.CloseNow()
	c.SetReadLimit(wire.MaxMessage)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cctx, ccancel := context.WithCancel(context.Background())
	defer ccancel()
	s := &workerSession{w: w, c: c, bc: bc, sctx: sctx, cancel: cancel, cctx: cctx, ccancel: ccancel}
	hello, err := s.hello()
	if err != nil {
		return err
	}
	if err := s.welcome(); err != nil {
		return err
	}
	*welcomed = time.Now()
	w.mu.Lock()
	w.st.Session, w.st.ConnectedSince = s.wel.Session, *welcomed
	w.sentPause = false
	w.mu.Unlock()
	w.log.Info("worker: connected", "gateway", w.st.Gateway, "session", s.wel.Session, "accepted", s.wel.Accepted)

	s.errc = make(chan error, 4)
	s.queue = make(chan queued, 64)
	s.dl = make(chan dlEvent, 4*w.cfg.DownloadWindow+8)
	w.mu.Lock()
	w.sendNow = s.send
	w.mu.Unlock()
	defer func() { // before the HOLDINGS send below can fail: nil between sessions
		w.mu.Lock()
		w.sendNow = nil
		w.mu.Unlock()
	}()
	if w.store != nil {
		// Changes between HELLO and now (SetQuota, DeleteSlice) found no
		// session to announce them on: announce the difference.
		if upd := holdingsDiff(hello, w.store); upd != nil {
			if err := s.send(upd.Append(nil)); err != nil {
				return fmt.Errorf("HOLDINGS: %w", err)
			}
		}
	}
	dlDone := make(chan struct{})
	if w.store != nil {
		go s.downloadLoop(dlDone)
	} else {
		close(dlDone)
	}
	// The downloader writes into the slice directory: the session (and so
	// Run) returns only after it has stopped.
	defer func() { <-dlDone }()
	go s.pingLoop()
	go s.computeLoop()
	go s.readLoop()
	return s.wait(ctx)
}

// dial opens the WebSocket to the gateway, the upgrade signed with the
// worker's key; bc is its connection's batching layer (dialBatched), nil if
// the transport did not dial through it.
func (w *Worker) dial(ctx context.Context) (c *websocket.Conn, bc *wire.BatchConn, err error) {
	hdr := wire.SignUpgrade(w.cfg.Key, http.MethodGet, w.host, w.path, time.Now())
	slot := new(*wire.BatchConn)
	dctx, dcancel := context.WithTimeout(context.WithValue(ctx, batchSlot{}, slot), 15*time.Second)
	c, resp, err := websocket.Dial(dctx, w.url, &websocket.DialOptions{HTTPClient: w.client, HTTPHeader: hdr,
		CompressionMode: websocket.CompressionDisabled})
	dcancel()
	if err != nil {
		return nil, nil, dialError(resp, err)
	}
	return c, *slot, nil
}

// batchSlot is the context key under which dial asks the transport's dial
// functions for the connection they made (a **wire.BatchConn).
type batchSlot struct{}

// dialBatched is the worker transport's DialContext (ws://): a TCP
// connection with a batching layer (wire.BatchConn), which it also leaves
// in ctx's batchSlot.
func (w *Worker) dialBatched(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	bc := wire.NewBatchConn(c, nil)
	if slot, ok := ctx.Value(batchSlot{}).(**wire.BatchConn); ok {
		*slot = bc
	}
	return bc, nil
}

// dialBatchedTLS is the worker transport's DialTLSContext (wss://): TLS
// (w.cfg.CAFile read now, else w.cfg.RootCAs; TLS 1.2 at least, the
// handshake bounded by 10 s) between
// two batching layers, one above it, so that a WebSocket message reaches
// crypto/tls as one write (full records), and one below it, so that the
// records leave in one system call. The upper one goes in ctx's batchSlot.
func (w *Worker) dialBatchedTLS(ctx context.Context, network, addr string) (net.Conn, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	roots := w.cfg.RootCAs
	if w.cfg.CAFile != "" {
		if roots, err = LoadCAFile(w.cfg.CAFile); err != nil {
			return nil, fmt.Errorf("worker: CA file %s: %w", w.cfg.CAFile, err)
		}
	}
	var d net.Dialer
	raw, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	under := wire.NewBatchConn(raw, nil).BufferReads()
	tc := tls.Client(under, &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12, ServerName: host,
		NextProtos: []string{"http/1.1"}})
	hctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err = tc.HandshakeContext(hctx)
	cancel()
	if err != nil {
		raw.Close()
		return nil, err
	}
	bc := wire.NewBatchConn(tc, under)
	if slot, ok := ctx.Value(batchSlot{}).(**wire.BatchConn); ok {
		*slot = bc
	}
	return bc, nil
}

// send writes msg to the backbone and counts its bytes.
func (s *workerSession) send(msg []byte) error {
	write := func() error { return s.c.Write(s.cctx, websocket.MessageBinary, msg) }
	var err error
	if s.bc != nil {
		err = s.bc.Batch(write)
	} else {
		err = write()
	}
	if err != nil {
		return err
	}
	s.w.bout.Add(uint64(len(msg)))
	return nil
}

// hello sends HELLO and returns it (what the backbone is told the worker
// holds).
func (s *workerSession) hello() (*wire.Hello, error) {
	w := s.w
	hello := &wire.Hello{Key: w.cfg.Key.Public().(ed25519.PublicKey), ModelID: w.cfg.ModelID,
		Backend: w.cfg.Backend, Threads: uint16(min(w.cfg.Threads, 0xFFFF)), Holdings: w.cfg.Holdings}
	if w.store != nil {
		hello.Holdings, hello.Quota, hello.Speed = w.store.Holdings(), uint64(w.store.Quota()), w.cfg.Speed
		if id := w.store.ModelID(); id != "" {
			hello.ModelID = id
		}
	}
	if err := s.send(hello.Append(nil)); err != nil {
		return nil, fmt.Errorf("HELLO: %w", err)
	}
	return hello, nil
}

// welcome reads the backbone's answer to HELLO: a WELCOME sets s.wel and
// s.lim; a refusal of the HELLO itself is permanent (ErrRefused).
func (s *workerSession) welcome() error {
	rctx, rcancel := context.WithTimeout(s.sctx, 15*time.Second)
	_, msg, err := s.c.Read(rctx)
	rcancel()
	if err != nil {
		var ce websocket.CloseError
		if errors.As(err, &ce) && ce.Code == websocket.StatusPolicyViolation {
			// The backbone refused the HELLO itself: the same HELLO will be
			// refused again.
			return permanent{fmt.Errorf("refused by the backbone: %s", ce.Reason)}
		}
		return fmt.Errorf("waiting for WELCOME: %w", err)
	}
	s.w.bin.Add(uint64(len(msg)))
	f, err := wire.Decode(msg, nil)
	if err != nil {
		s.c.Close(websocket.StatusPolicyViolation, "bad WELCOME")
		if errors.Is(err, wire.ErrVersion) {
			return permanent{fmt.Errorf("WELCOME: %w", err)}
		}
		return fmt.Errorf("WELCOME: %w", err)
	}
	wel, ok := f.(*wire.Welcome)
	if !ok {
		if e, isErr := f.(*wire.Error); isErr {
			return e
		}
		return fmt.Errorf("expected WELCOME, got %s", f.Type())
	}
	s.wel = wel
	s.lim = &wire.Limits{D: int(wel.D), K: int(wel.K), NLayer: int(wel.NLayer), NExpert: int(wel.NExpert),
		Holds: s.w.holdsExpert, Floats: dispatchFloats.Get}
	return nil
}

// wait returns when a loop fails (its error) or ctx ends (nil, after a
// going-away close), having stopped the loops.
func (s *workerSession) wait(ctx context.Context) error {
	var serr error
	select {
	case serr = <-s.errc:
	case <-ctx.Done():
		s.cancel()
		s.c.Close(websocket.StatusGoingAway, "worker stopping")
	}
	s.cancel()
	s.ccancel()
	s.w.mu.Lock()
	s.w.busy = 0
	s.w.mu.Unlock()
	var ce websocket.CloseError
	if errors.As(serr, &ce) {
		return fmt.Errorf("closed by backbone: %d %s", ce.Code, ce.Reason)
	}
	return serr
}

// downloadLoop runs the downloader (Config.SliceDir) until the session
// ends; it closes done when it has stopped writing into the slice.
func (s *workerSession) downloadLoop(done chan<- struct{}) {
	defer close(done)
	if err := s.w.downloader(s.sctx, s.wel, s.dl, s.send); err != nil {
		s.errc <- fmt.Errorf("download: %w", err)
	}
}

// toDL hands a provisioning frame to the downloader.
func (s *workerSession) toDL(e dlEvent) error {
	if s.w.store == nil {
		return errors.New("provisioning frame but no SliceDir")
	}
	select {
	case s.dl <- e:
		return nil
	case <-s.sctx.Done():
		return s.sctx.Err()
	}
}

// pingLoop sends pings (the first at once, so the RTT is known from the
// start) and pause changes.
func (s *workerSession) pingLoop() {
	w := s.w
	t := time.NewTicker(w.cfg.PingInterval)
	defer t.Stop()
	if err := s.send((&wire.Ping{Time: time.Now().UnixNano()}).Append(nil)); err != nil {
		s.errc <- fmt.Errorf("PING: %w", err)
		return
	}
	for {
		if err := w.syncPause(s.send); err != nil {
			s.errc <- err
			return
		}
		select {
		case <-s.sctx.Done():
			return
		case <-w.kick:
		case now := <-t.C:
			if err := s.send((&wire.Ping{Time: now.UnixNano()}).Append(nil)); err != nil {
				s.errc <- fmt.Errorf("PING: %w", err)
				return
			}
		}
	}
}

// computeLoop computes DISPATCHes in arrival order. With
// Config.SpinWait it holds the idle spinners from an answer sent with
// nothing queued until the next request (or the session's end).
func (s *workerSession) computeLoop() {
	w := s.w
	var release func() // the spinners' hold, nil when not held
	defer func() {
		if release != nil {
			release()
		}
	}()
	for {
		select {
		case <-s.sctx.Done():
			return
		case q := <-s.queue:
			if release != nil {
				release()
				release = nil
			}
			d := q.d
			in := d.Size()
			w.dutyCheck() // the time since the last request was idle: it pays back
			err := w.serve(s.sctx, d, q.at, in, s.wel.Session, s.send)
			dispatchFloats.Put(d.Hidden) // serve keeps no part of the request
			dispatchFloats.Put(d.Weights)
			if err != nil {
				s.errc <- err
				return
			}
			w.dutyCheck()
			w.mu.Lock()
			w.busy--
			w.mu.Unlock()
			w.poke()
			if w.cfg.SpinWait > 0 && len(s.queue) == 0 {
				release = idlespin.Hold()
			}
		}
	}
}

// readLoop reads and handles the backbone's frames.
func (s *workerSession) readLoop() {
	var buf bytes.Buffer // one message at a time, its memory reused: handle keeps no part of it
	for {
		msg, err := s.readInto(&buf)
		if err != nil {
			s.errc <- fmt.Errorf("read: %w", err)
			return
		}
		at := time.Now()
		s.w.bin.Add(uint64(len(msg)))
		if err := s.handle(msg, at); err != nil {
			s.errc <- err
			return
		}
	}
}

// readInto reads one message into buf (reset first, so that its memory
// is reused) and returns its bytes, valid until the next call.
func (s *workerSession) readInto(buf *bytes.Buffer) ([]byte, error) {
	_, r, err := s.c.Reader(s.cctx)
	if err != nil {
		return nil, err
	}
	buf.Reset()
	if _, err := buf.ReadFrom(r); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// queued is a DISPATCH waiting for computeLoop and when its message was
// read whole (the start of the RESULT's queue time).
type queued struct {
	d  *wire.Dispatch
	at time.Time
}

// handle acts on one message from the backbone, read whole at at; an
// error ends the session.
func (s *workerSession) handle(msg []byte, at time.Time) error {
	w := s.w
	f, err := wire.Decode(msg, s.lim)
	if errors.Is(err, wire.ErrNotHeld) {
		_, req, _ := wire.PeekRequest(msg)
		return s.send((&wire.Error{Request: req, Code: wire.CodeNotHeld, Message: err.Error()}).Append(nil))
	}
	if err != nil {
		s.c.Close(websocket.StatusPolicyViolation, clipReason(err.Error()))
		return fmt.Errorf("bad frame from backbone: %w", err)
	}
	switch f := f.(type) {
	case *wire.Dispatch:
		w.mu.Lock()
		w.busy++
		w.mu.Unlock()
		select {
		case s.queue <- queued{f, at}:
		default:
			return errors.New("backbone overran the DISPATCH queue")
		}
	case *wire.Ping:
		return s.send((&wire.Pong{Time: f.Time}).Append(nil))
	case *wire.Pong:
		rtt := time.Since(time.Unix(0, f.Time))
		w.mu.Lock()
		w.st.RTT = rtt
		w.mu.Unlock()
	case *wire.Error:
		w.mu.Lock()
		w.st.LastError = f.Error()
		w.mu.Unlock()
		if f.Code == wire.CodeNotAssign && w.store != nil {
			return s.toDL(dlEvent{refuse: f})
		}
	case *wire.Assign:
		return s.toDL(dlEvent{assign: f})
	case *wire.Chunk:
		return s.toDL(dlEvent{chunk: f})
	default:
		s.c.Close(websocket.StatusPolicyViolation, "unexpected "+f.Type().String())
		return fmt.Errorf("unexpected %s from backbone", f.Type())
	}
	return nil
}

// ErrNoPEM is LoadCAFile's error for a file that holds no PEM
// certificate.
var ErrNoPEM = errors.New("no PEM certificate in the file")

// LoadCAFile reads the PEM certificates of path into a new pool (the
// gateway's self-signed certificate or its CA): the one reader of a --ca
// file (the worker at each dial, backbone worker, the app). Errors:
// os.ReadFile's (naming the path), or ErrNoPEM.
func LoadCAFile(path string) (*x509.CertPool, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return nil, ErrNoPEM
	}
	return pool, nil
}
