// Package worker is the dial-out expert worker used by the contributor app,
// the mobile API and the headless `backbone worker` command. It dials the
// gateway (wss), proves its identity at the upgrade (wire.SignUpgrade), sends
// HELLO with its holdings, computes every DISPATCH with its expert.Computer
// and answers RESULT, pings right after WELCOME and then every 20 s (so the
// round trip is known at once), and reconnects with exponential
// backoff and full jitter. It never opens a listening socket.
//
// Pausing keeps the connection: the worker sends PAUSE(1) and the backbone
// stops routing work to it (DISPATCHes already on the wire are answered with
// ERROR code CodePaused after Pause, or computed after FinishThenPause);
// Resume sends PAUSE(0).
//
// A CPU limit (Config.CPULimit, SetCPULimit) uses the same PAUSE frames for
// a duty cycle: the worker works at full speed, then rests long enough to
// keep its process's measured CPU time at the limit, computing at once the
// DISPATCHes already on their way (cpulimit.go).
package worker

import (
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/idlespin"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// State is the worker's connection state.
type State int

// Worker states.
const (
	StateOffline   State = iota // not running, or stopped
	StateDialing                // connecting or waiting to reconnect
	StateConnected              // session up and taking work
	StatePaused                 // session up, taking no work
)

// String returns the state's lower-case name.
func (s State) String() string {
	switch s {
	case StateDialing:
		return "dialing"
	case StateConnected:
		return "connected"
	case StatePaused:
		return "paused"
	}
	return "offline"
}

// Stats is a snapshot of the worker.
type Stats struct {
	State          State
	Reason         string        // why the worker is not earning; "" if connected and unpaused
	Gateway        string        // gateway host
	RTT            time.Duration // last PING round trip
	Rows           uint64        // rows computed (cumulative)
	Requests       uint64        // DISPATCHes answered with RESULT (cumulative)
	BytesIn        uint64        // WebSocket message bytes received (cumulative)
	BytesOut       uint64        // WebSocket message bytes sent (cumulative)
	Session        string        // hub session id of the current session
	ConnectedSince time.Time     // zero when not connected
	LastError      string        // last session or computation error
	// Request timings summed over the RESULTs sent (divide by Requests for
	// a mean): Queue from the DISPATCH read whole to the computation's
	// start (decode, waiting behind earlier requests, gathering rows; the
	// RESULT carries it), Compute the expert computation (carried too),
	// Encode the RESULT's encoding and Send its write to the connection.
	QueueTime, ComputeTime, EncodeTime, SendTime time.Duration

	// Slice and download progress (Config.SliceDir only; zero otherwise).
	// The Download fields describe the current assignment: bytes of its
	// experts held or verified in partial files / its total bytes, and its
	// experts held / assigned. They are 0/0 before the first ASSIGN.
	SliceBytes           int64  // bytes the quota counts: expert files + partial downloads
	Quota                int64  // the slice's disk quota, bytes
	Experts              int    // experts held (verified, served)
	BadExperts           int    // experts found missing, truncated or corrupt at start (deleted; fetched again if assigned)
	DownloadBytesDone    uint64 // assigned bytes held or verified so far
	DownloadBytesTotal   uint64 // assigned bytes
	DownloadExpertsDone  int    // assigned experts held
	DownloadExpertsTotal int    // assigned experts
	ChunkRequests        uint64 // CHUNK_REQs sent (cumulative)
	ChunksReceived       uint64 // CHUNKs (or chunks from a model source) verified and written (cumulative)
	SourceRequests       uint64 // HTTP range requests to a model source (cumulative)
	SourceFailures       uint64 // failed model source downloads: bad status, short or stalled body, a chunk with the wrong hash (cumulative)

	// CPU limit (Config.CPULimit, SetCPULimit; cpulimit.go): the limit in
	// force, percent of the machine's CPUs (0: none); whether the worker
	// rests now to stay within it (it has told the backbone PAUSE, yet
	// State stays StateConnected); the time it has rested in all,
	// including the rest in progress; and how many rests it took.
	CPULimit int
	Resting  bool
	RestTime time.Duration
	Rests    uint64
	// SpinCPU is the CPU time the process's idle spinners used
	// (Config.SpinWait, engine/idlespin; 0 when off): not counted against
	// the CPU limit.
	SpinCPU time.Duration
}

// Config configures a Worker.
type Config struct {
	GatewayURL string             // wss://host[:port][/v1/worker]; ws:// only for tests
	Key        ed25519.PrivateKey // the worker's identity (64 bytes)
	RootCAs    *x509.CertPool     // nil: the system roots
	Computer   expert.Computer    // computes the held experts
	Holdings   []wire.Holding     // (layer, expert, sha256 of the expert's bytes)
	ModelID    string             // model identity announced in HELLO
	Backend    string             // e.g. "cpu"
	Threads    int                // compute threads, for the backbone's information
	// CAFile, when set, is a PEM file of the gateway's root CAs (its
	// self-signed certificate or its CA), read again at every TLS dial
	// instead of RootCAs: a worker whose gateway changed its certificate
	// reconnects once the new file is copied in place, without a restart.
	// A dial while the file cannot be read or holds no certificate fails
	// naming the file, and is retried like any failed dial.
	CAFile string
	// CPULimit limits the process to this percent of the machine's CPU
	// time, 1-100 (0 or 100: no limit), by resting between requests (a
	// duty cycle, cpulimit.go); SetCPULimit changes it while it runs.
	CPULimit int
	// SpinWait, when > 0, keeps the machine's CPUs spinning at idle
	// priority (engine/idlespin: SCHED_IDLE, yielding to any other thread)
	// for up to this long after each answer while no request is queued,
	// so that the next request is read and computed on CPUs that never
	// halted (issue 19; a dedicated worker machine's choice, off by
	// default: a contributor's CPUs sleep between requests). Where the
	// build has no spinners (CGO_ENABLED=0, not Linux) New logs it and
	// the worker runs without. The spinners' CPU time is not counted
	// against CPULimit (from the end of each spinning episode: at most
	// SpinWait of it is counted for a while).
	SpinWait time.Duration
	// OnServed, if set, is called after each RESULT (or DIGEST) is sent
	// with the session id and that request's DISPATCH and RESULT message
	// sizes in bytes (for a DIGEST: the RESULT it stands for, as metered).
	OnServed func(session string, bytesIn, bytesOut uint64)

	// SliceDir, when set, makes the worker keep its experts in this slice
	// directory (engine/slice.Store; created if needed, may start empty):
	// it serves the verified experts, downloads what the backbone assigns
	// within Quota bytes, and announces changes. Computer and Holdings
	// must then be nil; ModelID defaults to the slice's.
	SliceDir string
	Quota    int64  // slice disk quota, bytes (SliceDir only); 0: take no assignment
	Speed    uint32 // download speed hint for the backbone, KiB/s; 0: unknown
	// DownloadWindow is the number of CHUNK_REQs kept in flight; default 4.
	DownloadWindow int
	// Accelerator, with SliceDir, computes the slice's experts on a device
	// (engine/vulkan's Computer): the store hands it every new set of
	// held experts (slice.Store.SetAccelerator); nil computes on the CPU.
	// Backend should then name the device ("vulkan:<device>"), so that
	// the backbone checks its results within its tolerance. The worker
	// does not close it; close it after Close.
	Accelerator slice.Accelerator
	// Source, when set, replaces the model source URL of an ASSIGN that
	// names one (e.g. a mirror of the model file near the worker); the
	// bytes are verified against the ASSIGN's hashes either way.
	Source string
	// SourceRootCAs are the CAs trusted for an https model source (nil:
	// the system roots).
	SourceRootCAs *x509.CertPool
	// SourceRetry is the delay before retrying a failed model source
	// download, doubling per failure up to 30 s; default 500 ms.
	SourceRetry time.Duration
	// SourceAttempts is how many source downloads of one expert may fail
	// in a row without progress before it is skipped; default 5.
	SourceAttempts int
	// SkipRetry is how long after an assignment left experts it could hold
	// undownloaded (skipped) it is applied again, doubling per pass up to
	// 10 minutes; default 15 s.
	SkipRetry time.Duration
	// SourceStall ends a source request that sends no byte (headers or
	// body) for this long; default 30 s.
	SourceStall time.Duration

	PingInterval time.Duration // default 20 s
	BackoffBase  time.Duration // first reconnect delay bound; default 250 ms
	BackoffMax   time.Duration // delay cap; default 30 s
	StableAfter  time.Duration // a session alive this long after WELCOME resets the backoff; default 10 s
	Logger       *slog.Logger
}

// ErrRefused is wrapped by the error a session ends with (Stats.LastError)
// when retrying soon cannot help: the backbone refused the HELLO (a
// policy-violation close before WELCOME: another model, another protocol
// version, holdings outside the model), or the gateway's certificate is
// signed by an authority the worker does not trust. Run then waits
// BackoffMax before each retry until a session is stable again.
var ErrRefused = errors.New("worker: refused")

// permanent marks err as ErrRefused without changing its message.
type permanent struct{ error }

func (p permanent) Unwrap() []error { return []error{p.error, ErrRefused} }

// Worker is one dial-out worker. Create with New, then Run.
type Worker struct {
	cfg    Config
	log    *slog.Logger
	client *http.Client
	url    string
	host   string // the gateway's host:port as dialled (the upgrade signature names it)
	path   string
	holds  map[uint64]struct{}
	store  *slice.Store // SliceDir's store, nil without

	mu                sync.Mutex
	sendNow           func([]byte) error // the current session's sender, nil between sessions
	badAtOpen         int
	dlBase, dlTotal   uint64 // progress of the current assignment (see Stats)
	expDone, expTotal int
	st                Stats
	paused            bool // the user's wish
	finish            bool // FinishThenPause requested
	sentPause         bool // what the current session last told the backbone
	busy              int  // DISPATCHes queued or computing
	kick              chan struct{}
	// CPU limit (cpulimit.go): the accounting, whether the worker rests
	// now (PAUSE sent while it does), since when, the timer that ends the
	// rest, and the rests' total time (ns) and count.
	duty      dutyCycle
	resting   bool
	restFrom  time.Time
	restTimer *time.Timer
	restNanos int64
	rests     uint64
	sendMu    sync.Mutex // orders PAUSE frames

	rows, reqs, bin, bout atomic.Uint64
	// Request timings (Stats), summed over the RESULTs sent.
	queueNanos, computeNanos, encodeNanos, sendNanos atomic.Int64
	dlDone, chunkReqs, chunksGot                     atomic.Uint64
	srcClient                                        *http.Client // model source downloads
	srcReqs, srcFails                                atomic.Uint64
	charged                                          atomic.Int64 // compute ns x threads, the CPU limit's measure where the OS has none
}

// New validates cfg and returns a Worker.
func New(cfg Config) (*Worker, error) {
	if len(cfg.Key) != ed25519.PrivateKeySize {
		return nil, errors.New("worker: Key must be a 64-byte ed25519 private key")
	}
	var store *slice.Store
	storeBad := 0
	if cfg.SliceDir != "" {
		if cfg.Computer != nil || cfg.Holdings != nil {
			return nil, errors.New("worker: SliceDir excludes Computer and Holdings")
		}
		st, bad, err := slice.OpenStore(cfg.SliceDir, max(cfg.Quota, 0), cfg.Threads)
		if err != nil {
			return nil, fmt.Errorf("worker: slice: %w", err)
		}
		store, cfg.Computer, storeBad = st, st, len(bad)
		if cfg.ModelID == "" {
			cfg.ModelID = st.ModelID()
		}
		lg := cfg.Logger
		if lg == nil {
			lg = slog.Default()
		}
		for _, b := range bad {
			lg.Warn("worker: expert deleted, to fetch again", "layer", b.Layer, "expert", b.Expert, "err", b.Err)
		}
		if cfg.Accelerator != nil {
			if err := st.SetAccelerator(cfg.Accelerator); err != nil {
				lg.Warn("worker: the device failed; computing on the CPU", "err", err)
			}
		}
	} else if cfg.Accelerator != nil {
		return nil, errors.New("worker: Accelerator needs SliceDir (pass a device's Computer as Computer instead)")
	}
	if cfg.Computer == nil {
		return nil, errors.New("worker: Computer required")
	}
	if cfg.DownloadWindow <= 0 {
		cfg.DownloadWindow = 4
	}
	if err := checkCPULimit(cfg.CPULimit); err != nil {
		if store != nil {
			store.Close()
		}
		return nil, err
	}
	u, err := url.Parse(cfg.GatewayURL)
	if err != nil || (u.Scheme != "wss" && u.Scheme != "ws") || u.Host == "" {
		if store != nil {
			store.Close()
		}
		return nil, fmt.Errorf("worker: gateway URL %q must be wss://host[:port]", cfg.GatewayURL)
	}
	if u.Path == "" || u.Path == "/" {
		u.Path = wire.WorkerPath
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.PingInterval, 20*time.Second)
	def(&cfg.BackoffBase, 250*time.Millisecond)
	def(&cfg.BackoffMax, 30*time.Second)
	def(&cfg.StableAfter, 10*time.Second)
	def(&cfg.SourceRetry, 500*time.Millisecond)
	def(&cfg.SourceStall, 30*time.Second)
	def(&cfg.SkipRetry, 15*time.Second)
	if cfg.SourceAttempts <= 0 {
		cfg.SourceAttempts = 5
	}
	if cfg.SpinWait > 0 {
		if err := idlespin.Start(runtime.GOMAXPROCS(0), cfg.SpinWait); err != nil {
			lg := cfg.Logger
			if lg == nil {
				lg = slog.Default()
			}
			lg.Warn("worker: CPUs not kept spinning between requests", "err", err)
			cfg.SpinWait = 0
		}
	}
	if cfg.Source != "" && !strings.HasPrefix(cfg.Source, "http://") && !strings.HasPrefix(cfg.Source, "https://") {
		if store != nil {
			store.Close()
		}
		return nil, fmt.Errorf("worker: model source %q must be an http:// or https:// URL", cfg.Source)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &Worker{cfg: cfg, log: cfg.Logger, url: u.String(), host: u.Host, path: u.Path,
		holds: map[uint64]struct{}{}, kick: make(chan struct{}, 1), store: store, badAtOpen: storeBad}
	for _, h := range cfg.Holdings {
		w.holds[uint64(h.Layer)<<32|uint64(h.Expert)] = struct{}{}
	}
	w.client = &http.Client{Transport: &http.Transport{
		DialContext:       w.dialBatched,
		DialTLSContext:    w.dialBatchedTLS,
		DisableKeepAlives: true,
	}}
	w.srcClient = newSourceClient(cfg)
	w.st.Gateway = u.Host
	w.duty.set(cfg.CPULimit, cores, time.Now(), w.cpuNow())
	w.st.CPULimit = w.duty.pct
	return w, nil
}

// Stats returns a snapshot of the worker's state and counters.
func (w *Worker) Stats() Stats {
	w.mu.Lock()
	s := w.st
	s.Resting, s.Rests, s.RestTime = w.resting, w.rests, time.Duration(w.restNanos)
	if w.resting {
		s.RestTime += time.Since(w.restFrom)
	}
	w.mu.Unlock()
	s.Rows, s.Requests, s.BytesIn, s.BytesOut = w.rows.Load(), w.reqs.Load(), w.bin.Load(), w.bout.Load()
	s.QueueTime, s.ComputeTime = time.Duration(w.queueNanos.Load()), time.Duration(w.computeNanos.Load())
	s.EncodeTime, s.SendTime = time.Duration(w.encodeNanos.Load()), time.Duration(w.sendNanos.Load())
	if w.cfg.SpinWait > 0 {
		s.SpinCPU = idlespin.Read().CPU
	}
	if w.store != nil {
		w.mu.Lock()
		s.BadExperts = w.badAtOpen
		s.DownloadBytesDone, s.DownloadBytesTotal = w.dlBase, w.dlTotal
		s.DownloadExpertsDone, s.DownloadExpertsTotal = w.expDone, w.expTotal
		w.mu.Unlock()
		s.DownloadBytesDone = min(s.DownloadBytesDone+w.dlDone.Load(), s.DownloadBytesTotal)
		s.SliceBytes, s.Quota, s.Experts = w.store.Used(), w.store.Quota(), len(w.store.Holdings())
		s.ChunkRequests, s.ChunksReceived = w.chunkReqs.Load(), w.chunksGot.Load()
		s.SourceRequests, s.SourceFailures = w.srcReqs.Load(), w.srcFails.Load()
	}
	return s
}

// Close releases the slice store of Config.SliceDir (unmapping its
// experts); call it after Run has returned. Without SliceDir it does
// nothing.
func (w *Worker) Close() error {
	if w.store == nil {
		return nil
	}
	return w.store.Close()
}

// Store returns the slice store of Config.SliceDir (nil without).
func (w *Worker) Store() *slice.Store { return w.store }

// holdsExpert reports whether the worker serves expert e of layer l.
func (w *Worker) holdsExpert(l, e int) bool {
	if w.store != nil {
		return w.store.Holds(l, e)
	}
	_, ok := w.holds[uint64(l)<<32|uint64(e)]
	return ok
}

// Pause stops taking work now: the backbone is told at once, and DISPATCHes
// still arriving are refused with ERROR CodePaused (the backbone computes
// them elsewhere). The connection stays up.
func (w *Worker) Pause() {
	w.mu.Lock()
	w.paused, w.finish = true, false
	w.mu.Unlock()
	w.poke()
}

// Resume takes work again.
func (w *Worker) Resume() {
	w.mu.Lock()
	w.paused, w.finish = false, false
	w.mu.Unlock()
	w.poke()
}

// FinishThenPause computes the DISPATCHes already received, then pauses.
func (w *Worker) FinishThenPause() {
	w.mu.Lock()
	if !w.paused {
		w.finish = true
	}
	w.mu.Unlock()
	w.poke()
}

func (w *Worker) poke() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

func (w *Worker) setState(s State, reason string) {
	w.mu.Lock()
	w.setStateLocked(s, reason)
	w.mu.Unlock()
}

// setStateLocked is setState with w.mu held.
func (w *Worker) setStateLocked(s State, reason string) {
	w.st.State, w.st.Reason = s, reason
	if s != StateConnected && s != StatePaused {
		w.st.ConnectedSince = time.Time{}
		w.st.Session = ""
	}
}

// Run dials the gateway, serves sessions and reconnects after each failure
// with exponential backoff and full jitter (delay uniform in [0, min(BackoffMax,
// BackoffBase*2^attempt)]; AWS architecture blog "Exponential Backoff And
// Jitter", 2015) until ctx is done. The attempt count resets only after a
// session that got WELCOME and stayed up StableAfter, so a gateway or hub
// answering at once (503 while the backbone is down) does not make it
// redial fast. After a permanent refusal (ErrRefused) it waits BackoffMax.
// It returns nil when ctx is canceled.
func (w *Worker) Run(ctx context.Context) error {
	attempt := 0
	defer w.setState(StateOffline, "stopped")
	defer func() { // a rest outlives no Run
		w.mu.Lock()
		if w.resting {
			w.endRestLocked(time.Now())
		}
		w.mu.Unlock()
	}()
	for {
		w.setState(StateDialing, "connecting")
		welcomed, err := w.session(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if !welcomed.IsZero() && time.Since(welcomed) >= w.cfg.StableAfter {
			attempt = 0
		}
		bound := w.cfg.BackoffMax
		if attempt < 30 {
			bound = min(bound, w.cfg.BackoffBase<<attempt)
		}
		delay := time.Duration(rand.Int64N(int64(bound) + 1))
		attempt++
		msg := "session ended"
		if err != nil {
			msg = err.Error()
		}
		reason := fmt.Sprintf("reconnecting in %v: %s", delay.Round(time.Millisecond), msg)
		if errors.Is(err, ErrRefused) {
			delay, attempt = w.cfg.BackoffMax, 30
			reason = fmt.Sprintf("refused: %s; retrying in %v (the backoff's longest: a refusal lasts until the worker or the backbone changes)", msg, delay.Round(time.Millisecond))
		}
		w.log.Warn("worker: disconnected", "err", msg, "retry_in", delay.Round(time.Millisecond))
		// The error and the reason change together: Stats never shows
		// this error with the previous attempt's reason.
		w.mu.Lock()
		w.st.LastError = msg
		w.setStateLocked(StateDialing, reason)
		w.mu.Unlock()
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// dialError describes a failed upgrade: the HTTP status and the first line
// of the body the gateway or hub sent (e.g. 503 "backbone unreachable"),
// or, for an untrusted gateway certificate, a hint at --ca (ErrRefused).
func dialError(resp *http.Response, err error) error {
	var ua x509.UnknownAuthorityError
	if errors.As(err, &ua) {
		return permanent{fmt.Errorf("dial: %w (pass --ca FILE with the gateway's certificate (or its CA))", err)}
	}
	if resp == nil {
		return fmt.Errorf("dial: %w", err)
	}
	var body string
	if resp.Body != nil {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512)) // coder/websocket keeps up to 1024 bytes
		body, _, _ = strings.Cut(strings.TrimSpace(strings.ToValidUTF8(string(b), "?")), "\n")
	}
	if body != "" {
		return fmt.Errorf("dial: %s: %s: %w", resp.Status, body, err)
	}
	return fmt.Errorf("dial: %s: %w", resp.Status, err)
}

// syncPause tells the backbone the pause state if it changed, turning a
// pending FinishThenPause into a pause once no DISPATCH is in progress.
// The backbone is told PAUSE 1 while the owner's pause or a CPU limit's
// rest holds; only the owner's makes the state StatePaused.
func (w *Worker) syncPause(send func([]byte) error) error {
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	w.mu.Lock()
	if w.finish && w.busy == 0 {
		w.paused, w.finish = true, false
	}
	want := w.paused || w.resting
	changed := want != w.sentPause
	w.sentPause = want
	if w.paused {
		w.st.State, w.st.Reason = StatePaused, "paused"
	} else {
		w.st.State, w.st.Reason = StateConnected, ""
	}
	w.mu.Unlock()
	if !changed {
		return nil
	}
	return send((&wire.Pause{Paused: want}).Append(nil))
}

// nonFinite handles a request whose outputs hold a non-finite value v: the
// experts it used are hashed again (slice.Store.Reverify, with a store)
// and those whose files changed are dropped and announced (HOLDINGS); the
// answer is an ERROR saying so.
func (w *Worker) nonFinite(d *wire.Dispatch, v float32) *wire.Error {
	msg := fmt.Sprintf("the outputs hold %v", v)
	if w.store != nil {
		var used []wire.Holding
		for _, id := range d.IDs {
			if id >= 0 {
				used = append(used, wire.Holding{Layer: d.Layer, Expert: uint32(id)})
			}
		}
		dropped, err := w.store.Reverify(used)
		if len(dropped) > 0 {
			w.announce(&wire.Holdings{Quota: uint64(w.store.Quota()), Drop: dropped})
		}
		msg += fmt.Sprintf("; %d expert files changed since they were verified and are dropped", len(dropped))
		if err != nil {
			msg += " (" + err.Error() + ")"
		}
		if len(dropped) == 0 && err == nil {
			msg += w.deviceFault(msg)
		}
	} else {
		msg += w.deviceFault(msg)
	}
	w.setErr("compute: " + msg)
	return &wire.Error{Request: d.Request, Code: wire.CodeInternal, Message: msg}
}

// deviceFault declares the worker's Computer faulty when it computes on a
// device (expert.Faulter): non-finite outputs whose expert files verify
// (or that no store can check) are the device's, and the CPU path answers
// the next requests. It returns what to add to the error message.
func (w *Worker) deviceFault(why string) string {
	f, ok := w.cfg.Computer.(expert.Faulter)
	if !ok || !f.Fault(errors.New("non-finite outputs: "+why)) {
		return ""
	}
	return "; the device is taken as faulty: the CPU computes from now on"
}

// serve computes one DISPATCH, read whole at at: its m requested (row,
// slot) pairs as a batch of m rows with k=1 (all N x K slots requested:
// its N rows with K slots, no gather), answered as RESULT in
// row-major (row, slot) order with the request's timing (wire.Timing). A
// DISPATCH_SUM (every slot requested) is answered with N rows instead, row
// r the weighted sum of its K outputs (expert.WeightedSum, or the
// Computer's own ComputeExpertsSum when it is an expert.SumComputer), and a
// DISPATCH_SUM_DIGEST with the DIGEST of that sum RESULT.
func (w *Worker) serve(ctx context.Context, d *wire.Dispatch, at time.Time, inBytes int, session string, send func([]byte) error) error {
	w.mu.Lock()
	paused := w.paused
	w.mu.Unlock()
	if paused {
		return send((&wire.Error{Request: d.Request, Code: wire.CodePaused, Message: "worker paused"}).Append(nil))
	}
	m := 0
	for _, id := range d.IDs {
		if id != -1 {
			m++
		}
	}
	if size := wire.ResultSize(m, d.D); size > wire.MaxMessage {
		// A backbone that does not split its requests (before issue 11):
		// the RESULT would be cut by every reader's limit and end the
		// session. Refusing the request keeps the session; the backbone
		// computes these pairs itself.
		return send((&wire.Error{Request: d.Request, Code: wire.CodeInternal,
			Message: fmt.Sprintf("RESULT of %d outputs would be %d bytes, above the %d-byte frame limit", m, size, wire.MaxMessage)}).Append(nil))
	}
	// Every slot requested (a DISPATCH_SUM always): the N rows as sent,
	// K slots each. Else the m requested pairs as m rows of one slot.
	// Batch invariance (expert.Computer) makes the outputs the same bits
	// either way, in the same (row, slot) order.
	xs, es, rows, k := d.Hidden, d.IDs, d.N, d.K
	if m != d.N*d.K {
		xs, es, rows, k = make([]float32, m*d.D), make([]int32, m), m, 1
		i := 0
		for r := 0; r < d.N; r++ {
			for s := 0; s < d.K; s++ {
				if id := d.IDs[r*d.K+s]; id != -1 {
					copy(xs[i*d.D:(i+1)*d.D], d.Hidden[r*d.D:(r+1)*d.D])
					es[i] = id
					i++
				}
			}
		}
	}
	// A DISPATCH_SUM to a Computer that sums its own outputs
	// (expert.SumComputer: the same bits as WeightedSum of its
	// ComputeExperts) skips the N x K x D outputs.
	sc, fused := w.cfg.Computer.(expert.SumComputer)
	fused = fused && d.Sum
	outLen := m * d.D
	if fused {
		outLen = d.N * d.D
	}
	outp := scratch.Get(outLen) // fully written by ComputeExperts (expert.Computer) or ComputeExpertsSum
	defer scratch.Put(outp)
	out := *outp
	t0 := time.Now()
	var err error
	if fused {
		err = sc.ComputeExpertsSum(ctx, int(d.Layer), d.Hidden, d.IDs, d.Weights, d.N, d.K, out)
	} else {
		err = w.cfg.Computer.ComputeExperts(ctx, int(d.Layer), xs, es, rows, k, out)
	}
	t1 := time.Now()
	th := w.cfg.Threads
	if th <= 0 || th > cores {
		th = cores // 0: all CPUs
	}
	w.charged.Add(int64(t1.Sub(t0)) * int64(th))
	if err != nil {
		w.mu.Lock()
		w.st.LastError = "compute: " + err.Error()
		w.mu.Unlock()
		return send((&wire.Error{Request: d.Request, Code: wire.CodeInternal, Message: err.Error()}).Append(nil))
	}
	var msg []byte
	// A DIGEST, and a sum's RESULT, are metered by the hub as the RESULT
	// of the m outputs they stand for (docs/accounting.md).
	served, what := uint64(wire.ResultSize(m, d.D)), "RESULT"
	rows = m
	if d.Sum {
		rows = d.N
	}
	if d.Sum && !fused {
		// The decoder checked that every slot is requested: out is
		// N x K x D in (row, slot) order.
		sump := scratch.Get(d.N * d.D)
		defer scratch.Put(sump)
		expert.WeightedSum(*sump, out, d.Weights, d.K, d.D)
		out = *sump
	}
	if i := expert.FirstNonFinite(out); i >= 0 {
		// An expert's weights give no NaN or Inf: its file changed under
		// the mapping (a disk error, an edit). Sent, the answer would end
		// the session (and, as a digest, count as a lie); re-checked, the
		// changed experts are dropped and fetched again (a quota slice) or
		// no longer served.
		return send(w.nonFinite(d, out[i]).Append(nil))
	}
	switch {
	case d.Digest:
		// A DISPATCH_SUM_DIGEST's DIGEST is that of the sum RESULT.
		msg, what = digestOf(d.Request, rows, d.D, out), "DIGEST"
	default:
		tm := wire.Timing{QueueMicros: wire.Micros(t0.Sub(at)), ComputeMicros: wire.Micros(t1.Sub(t0))}
		mp := msgScratch.Get(wire.ResultSize(rows, d.D))
		defer msgScratch.Put(mp)
		msg = (&wire.Result{Request: d.Request, M: rows, D: d.D, Out: out, Timing: tm}).Append((*mp)[:0])
	}
	t2 := time.Now()
	if err := send(msg); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	w.queueNanos.Add(int64(t0.Sub(at)))
	w.computeNanos.Add(int64(t1.Sub(t0)))
	w.encodeNanos.Add(int64(t2.Sub(t1)))
	w.sendNanos.Add(int64(time.Since(t2)))
	w.rows.Add(uint64(d.N))
	w.reqs.Add(1)
	if w.cfg.OnServed != nil {
		w.cfg.OnServed(session, uint64(inBytes), served)
	}
	return nil
}

// scratch holds serve's output buffers between requests: a
// RESULT of 256 rows x 8 slots of the 30B shape is 16 MiB of outputs,
// allocated and zeroed anew for every request otherwise. Each buffer is
// copied into the message (or hashed) before it goes back.
var scratch wire.SlicePool[float32]

// dispatchFloats holds the DISPATCH hidden rows and weights the sessions'
// decoder fills (wire.Limits.Floats) until serve is done with them: a
// 256-row request of the 30B shape is 2 MiB of floats, and copying into
// fresh memory ran at a third of the speed of reused memory here.
var dispatchFloats wire.FloatPool

// msgScratch holds serve's RESULT message buffers between requests: send
// writes a message whole before it returns.
var msgScratch wire.SlicePool[byte]

// digestOf answers a DISPATCH_DIGEST (quorum verification, protocol 4): the
// DIGEST of the RESULT carrying out (m rows of d). The hub meters an
// accepted DIGEST as the bytes of that RESULT (docs/accounting.md), so
// OnServed counts those.
func digestOf(req uint64, m, d int, out []float32) []byte {
	return (&wire.Digest{Request: req, M: m, D: d, Sum: wire.OutputsDigest(m, d, out)}).Append(nil)
}

func clipReason(s string) string {
	if len(s) > 120 {
		s = s[:120]
	}
	return strings.ToValidUTF8(s, "?")
}

// holdingsDiff returns the HOLDINGS that brings the backbone from what
// hello announced to st's state now, or nil when nothing changed.
func holdingsDiff(hello *wire.Hello, st *slice.Store) *wire.Holdings {
	now := st.Holdings()
	was := make(map[uint64]bool, len(hello.Holdings))
	for _, h := range hello.Holdings {
		was[hkey(int(h.Layer), int(h.Expert))] = true
	}
	upd := &wire.Holdings{Quota: uint64(st.Quota())}
	for _, h := range now {
		k := hkey(int(h.Layer), int(h.Expert))
		if !was[k] {
			upd.Add = append(upd.Add, h)
		}
		delete(was, k)
	}
	for k := range was {
		upd.Drop = append(upd.Drop, wire.Holding{Layer: uint16(k >> 32), Expert: uint32(k)})
	}
	if upd.Quota == hello.Quota && len(upd.Add) == 0 && len(upd.Drop) == 0 {
		return nil
	}
	return upd
}
