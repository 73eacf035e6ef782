// Package serve is the backbone as a service: an OpenAI-compatible HTTP API
// (/v1/completions, /v1/chat/completions with server-sent-event streaming,
// /v1/models, /metrics) in front of a continuous-batching scheduler.
//
// One goroutine owns the model. At every step boundary it admits queued
// requests (up to Config.MaxSeqs sequences), drops the finished and the
// cancelled, and runs one model.Forward over a batch of at most
// Config.MaxBatchRows rows: one decode row per sequence that is generating,
// then prefill rows of sequences still reading their prompt, chunked to
// fill the batch. All rows share each layer's expert call, so with the swarm
// one round trip per layer serves every request in the batch. Because the
// engine's kernels are batch-invariant, a request's tokens do not depend on
// what else is in the batch.
//
// Backpressure: at most Config.QueueSize requests wait for a slot; past
// that Submit fails with ErrQueueFull (HTTP 429 with Retry-After). A
// request whose context ends (client disconnect) leaves at the next step.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"runtime"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/spec"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// Sentinel errors; returned errors wrap one of them.
var (
	// ErrQueueFull: Config.QueueSize requests are already waiting.
	ErrQueueFull = errors.New("serve: queue full")
	// ErrClosed: the server is closed or closing.
	ErrClosed = errors.New("serve: server closed")
	// ErrPrompt: the prompt is empty, longer than the context, or holds a
	// token outside the vocabulary.
	ErrPrompt = errors.New("serve: invalid prompt")
	// ErrParams: invalid generation parameters (max tokens < 1, bad
	// temperature or top_p).
	ErrParams = errors.New("serve: invalid parameters")
)

// Defaults for zero Config fields.
const (
	DefaultMaxBatchRows = 512
	DefaultMaxSeqs      = 512
	DefaultQueueSize    = 1024
	// DefaultStateMemory bounds the recurrent state of the sequences
	// decoded at once (models with Gated DeltaNet layers hold
	// model.StateBytes per sequence whatever its length): 4 GiB.
	DefaultStateMemory = 4 << 30
)

// Config configures a Server. Model and Tokenizer are required.
type Config struct {
	Model     *model.Model         // the model; the Server's scheduler is its only user while running
	Tokenizer *tokenizer.Tokenizer // the model's tokenizer
	// Lanes are more instances of the same model (model.Load on the same
	// file: the weights are shared views, each instance has its own
	// buffers). With lanes, the sequences are split between Model and the
	// lanes, each decoded by its own goroutine, and the lanes take turns
	// on the CPU: a lane holds the compute baton except while its expert
	// call is out (the swarm round trip), so one lane computes while
	// another waits. The server installs Experts on every instance.
	Lanes []*model.Model
	// Experts computes the experts of every instance when Lanes is set
	// (nil: each instance's own local experts); without lanes it is
	// ignored and Model keeps what SetExperts gave it.
	Experts expert.Computer
	// ModelID is the name served by /v1/models and accepted in requests'
	// "model" field; default "kvasir".
	ModelID string
	// Chat applies chat messages for /v1/chat/completions; nil disables that
	// endpoint (it answers 400 with ChatErr's message).
	Chat    ChatTemplate
	ChatErr error // why Chat is nil (from ChatTemplateFor), for the 400 message

	// APIKey, when not empty, is required on /v1/ requests as
	// "Authorization: Bearer <APIKey>" (401 otherwise); /metrics and
	// /health stay open.
	APIKey string

	MaxBatchRows int // rows per Forward step (prefill + decode); default 512 (per lane)
	MaxSeqs      int // sequences decoded at once; default 512, at most MaxBatchRows (split evenly between lanes)
	QueueSize    int // requests waiting beyond MaxSeqs before 429; default 1024 (negative: 0)
	// StateMemory bounds MaxSeqs x Model.StateBytes() (bytes of recurrent
	// state, all lanes together) for models with recurrent layers: MaxSeqs
	// is lowered to fit, at least 1 per lane. Default DefaultStateMemory.
	StateMemory int64
	// RetryAfter is the Retry-After of a 429, rounded up to whole seconds;
	// default 1 s.
	RetryAfter time.Duration
	// HolderRetryAfter is the Retry-After of a 503 for a step that found
	// no worker holding an expert it needs (dispatch.ErrNoHolder), rounded
	// up to whole seconds; default 30 s.
	HolderRetryAfter time.Duration
	// Coverage, when set (a swarm), reports which experts workers hold:
	// /v1/models shows it and a 503 for a missing holder counts the
	// experts no worker holds.
	Coverage func() dispatch.Coverage
	// Registry receives the server's metrics (and /metrics serves it when it
	// is also a prometheus.Gatherer); default a new prometheus.Registry.
	Registry prometheus.Registerer
	Logger   *slog.Logger

	// BodyTimeout bounds reading a request body (408 after it); default
	// DefaultBodyTimeout.
	BodyTimeout time.Duration
	// WriteTimeout bounds each write of a response (a non-streamed body,
	// one event of a stream); a client that does not read is dropped and
	// its generation cancelled. Default DefaultWriteTimeout.
	WriteTimeout time.Duration
	// ParseSlots bounds the requests whose bodies are parsed at once (its
	// tokens <= the context), or read when over 64 KiB (<= MaxBodyBytes,
	// one per client address); default max(4, 2 x GOMAXPROCS). A request
	// waits ParseWait (default DefaultParseWait) for a slot, then gets 429.
	// A body of at most 64 KiB is read before its slot is taken.
	ParseSlots int
	ParseWait  time.Duration
}

// Server is the scheduler plus the HTTP API. Create with New, then Start;
// Close stops it.
type Server struct {
	cfg     Config
	created int64 // unix seconds of New: the model object's "created"
	lanes   []*lane
	p       model.Params
	tok     *tokenizer.Tokenizer
	met     *metrics
	gather  prometheus.Gatherer
	log     *slog.Logger

	parse chan struct{} // ParseSlots tokens

	largeMu sync.Mutex
	large   map[string]bool // client addresses reading a body over freeBody

	mu       sync.Mutex
	queue    []*Stream
	active   int // sequences admitted and not yet released, all lanes
	closed   bool
	draining bool // Drain: no new requests, the queue ended; active ones run on
	started  bool
	stop     chan struct{}
	done     chan struct{}
	running  sync.WaitGroup // lane goroutines
}

// lane is one model instance and the goroutine that decodes its share of
// the sequences.
type lane struct {
	m        *model.Model
	wake     chan struct{} // cap 1: work arrived
	maxSeqs  int
	active   int // guarded by Server.mu
	baton    *baton
	experts  expert.Computer // *batonExperts or *batonSumExperts; nil without lanes
	holdsCPU bool            // this lane holds the baton (lane goroutine only)
}

// New validates cfg and returns a stopped Server. Errors: a missing model or
// tokenizer, a tokenizer vocabulary larger than the model's, or metric
// registration failures (a Registry that already holds these metrics).
func New(cfg Config) (*Server, error) {
	if cfg.Model == nil || cfg.Tokenizer == nil {
		return nil, errors.New("serve: Config.Model and Config.Tokenizer are required")
	}
	p := cfg.Model.Params()
	for i, lm := range cfg.Lanes {
		if lm == nil || lm == cfg.Model || lm.Params() != p {
			return nil, fmt.Errorf("serve: lane %d is nil, the primary model itself, or another model", i)
		}
	}
	if cfg.Tokenizer.VocabSize() > p.Vocab {
		return nil, fmt.Errorf("serve: tokenizer has %d tokens, the model %d", cfg.Tokenizer.VocabSize(), p.Vocab)
	}
	if cfg.ModelID == "" {
		cfg.ModelID = "kvasir"
	}
	if cfg.MaxBatchRows <= 0 {
		cfg.MaxBatchRows = DefaultMaxBatchRows
	}
	if cfg.MaxSeqs <= 0 {
		cfg.MaxSeqs = DefaultMaxSeqs
	}
	cfg.MaxSeqs = min(cfg.MaxSeqs, cfg.MaxBatchRows) // so prefill always gets a row (see loop)
	if cfg.StateMemory <= 0 {
		cfg.StateMemory = DefaultStateMemory
	}
	if sb := cfg.Model.StateBytes(); sb > 0 && int64(cfg.MaxSeqs)*sb > cfg.StateMemory {
		n := max(int(cfg.StateMemory/sb), 1+len(cfg.Lanes))
		if cfg.Logger != nil {
			cfg.Logger.Info("serve: recurrent state bounds the concurrent sequences", "max_seqs", n,
				"requested", cfg.MaxSeqs, "state_bytes_per_seq", sb, "state_memory", cfg.StateMemory)
		}
		cfg.MaxSeqs = n
	}
	if cfg.QueueSize == 0 {
		cfg.QueueSize = DefaultQueueSize
	} else if cfg.QueueSize < 0 {
		cfg.QueueSize = 0
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = time.Second
	}
	if cfg.HolderRetryAfter <= 0 {
		cfg.HolderRetryAfter = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.BodyTimeout, DefaultBodyTimeout)
	def(&cfg.WriteTimeout, DefaultWriteTimeout)
	def(&cfg.ParseWait, DefaultParseWait)
	if cfg.ParseSlots <= 0 {
		cfg.ParseSlots = defaultParseSlots(runtime.GOMAXPROCS(0))
	}
	s := &Server{cfg: cfg, created: time.Now().Unix(), p: p, tok: cfg.Tokenizer, log: cfg.Logger, stop: make(chan struct{}), done: make(chan struct{}),
		parse: make(chan struct{}, cfg.ParseSlots), large: map[string]bool{}}
	models := append([]*model.Model{cfg.Model}, cfg.Lanes...)
	per := (cfg.MaxSeqs + len(models) - 1) / len(models)
	var b *baton
	if len(models) > 1 {
		b = &baton{ch: make(chan struct{}, 1)}
	}
	for _, m := range models {
		l := &lane{m: m, wake: make(chan struct{}, 1), maxSeqs: per, baton: b}
		if b != nil {
			inner := cfg.Experts
			if inner == nil {
				inner = m.LocalExperts()
			}
			l.experts = newBatonExperts(inner, l)
			m.SetExperts(l.experts)
		}
		s.lanes = append(s.lanes, l)
	}
	if cfg.Registry == nil {
		r := prometheus.NewRegistry()
		cfg.Registry, s.cfg.Registry = r, r
	}
	if g, ok := cfg.Registry.(prometheus.Gatherer); ok {
		s.gather = g
	}
	var err error
	if s.met, err = newMetrics(cfg.Registry); err != nil {
		return nil, fmt.Errorf("serve: metrics: %w", err)
	}
	return s, nil
}

// Limits returns the effective MaxBatchRows and MaxSeqs: Config's after
// defaults, MaxSeqs capped at MaxBatchRows and bounded by StateMemory.
func (s *Server) Limits() (maxBatchRows, maxSeqs int) { return s.cfg.MaxBatchRows, s.cfg.MaxSeqs }

// Start launches the scheduler goroutine. Calling it twice, or after
// Close, does nothing.
func (s *Server) Start() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.started || s.closed {
		return
	}
	s.started = true
	s.running.Add(len(s.lanes))
	for _, l := range s.lanes {
		go s.loop(l)
	}
	go func() {
		s.running.Wait()
		close(s.done)
	}()
}

// Close stops the scheduler after its current step, ends every queued and
// active request with ErrClosed, and waits for the scheduler to exit.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.done
		return nil
	}
	s.closed = true
	started := s.started
	queued := s.queue
	s.queue = nil
	s.mu.Unlock()
	close(s.stop)
	for _, st := range queued {
		st.finish(FinishError, ErrClosed)
	}
	if started {
		<-s.done
	} else {
		close(s.done)
	}
	return nil
}

// Drain stops taking requests (Submit returns ErrClosed: 503
// shutting_down) and ends the queued ones with ErrClosed; the sequences
// being decoded run on until they finish or Close ends them.
func (s *Server) Drain() {
	s.mu.Lock()
	s.draining = true
	queued := s.queue
	s.queue = nil
	s.met.queueDepth.Set(0)
	s.mu.Unlock()
	for _, st := range queued {
		st.finish(FinishError, ErrClosed)
	}
}

// ShutdownGrace bounds how long Shutdown waits, after ending the remaining
// generations, for their handlers to write the last event or the 503.
const ShutdownGrace = 5 * time.Second

// DefaultShutdownDrain is how long backbone serve lets active generations
// run on after SIGTERM (Shutdown's ctx) before it ends them.
const DefaultShutdownDrain = 10 * time.Second

// Timeouts of the http.Server the API runs on (NewHTTPServer).
const (
	// ReadHeaderTimeout bounds reading a request's headers; a client that
	// stalls in them is disconnected without an answer.
	ReadHeaderTimeout = 10 * time.Second
	// IdleTimeout closes a keep-alive connection idle this long.
	IdleTimeout = 2 * time.Minute
)

// NewHTTPServer returns the http.Server backbone serve runs h on:
// ReadHeaderTimeout and IdleTimeout set, no whole-request read or write
// timeout (a stream may last minutes; the Server bounds each body read
// with Config.BodyTimeout and each write with Config.WriteTimeout).
func NewHTTPServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: ReadHeaderTimeout, IdleTimeout: IdleTimeout}
}

// Shutdown is the drain a SIGTERM starts (docs/serve.md, "Shutdown"): the
// listener closes, queued requests get 503 shutting_down at once, active
// generations run on until ctx ends; then the rest end: a stream with an
// error event (shutting_down) and [DONE], a non-streamed request with 503.
// It returns once every handler returned (at most ShutdownGrace after
// ctx), closing hs, and Closes s.
func (s *Server) Shutdown(ctx context.Context, hs *http.Server) error {
	s.Drain()
	done := make(chan error, 1)
	go func() { done <- hs.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		s.Close()
		return err
	case <-ctx.Done():
	}
	s.Close()
	t := time.NewTimer(ShutdownGrace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return hs.Close()
	}
}

// Stats is a snapshot of the scheduler's load.
type Stats struct {
	Queued int // requests waiting for a slot
	Active int // sequences admitted (prefilling or decoding)
}

// Stats returns the current load.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Queued: len(s.queue), Active: s.active}
}

// Job is one generation request.
type Job struct {
	Prompt    []int32              // prompt tokens: 1 .. Context tokens, each in [0, Vocab)
	MaxTokens int                  // tokens to generate at most (>= 1); generation also ends at the context length
	Sampler   model.SamplerOptions // Temperature 0: greedy
	Stop      []string             // stop strings (trimmed from the output, as OpenAI does); "" entries are ignored
	// Logprobs asks for each sampled token's log-probability
	// (Delta.Logprobs) with its TopLogprobs most likely alternatives.
	Logprobs    bool
	TopLogprobs int
	// LogitBias is added to the logits of these token ids before sampling
	// (not to the reported log-probabilities).
	LogitBias map[int32]float32
	// Draft speculates (package spec; "" or spec.ModeNone: no drafts):
	// each step verifies the request's next token and up to DraftMax
	// drafted ones in one forward. The tokens are the same as without
	// (each row sampled in order with the request's sampler; greedy and
	// seeded sampling alike). spec.ModeNGram, or spec.ModeMTP on a model
	// with an MTP head (model.Model.MTPErr nil); ErrParams otherwise. MTP
	// drafts run the head once per draft token and request, before the
	// step (its expert calls are round trips of their own over a swarm).
	Draft spec.Mode
	// DraftMax is the most drafts per step (<= 0: spec.DefaultMax); a
	// step's drafts also fit its row budget, leaving every other active
	// request at least one row.
	DraftMax int
}

// Submit queues j and returns its Stream. The request leaves the batch when
// it finishes, when ctx ends, or when the Stream is cancelled. Errors wrap
// ErrPrompt or ErrParams (j is invalid), ErrQueueFull (QueueSize requests
// already wait) or ErrClosed.
func (s *Server) Submit(ctx context.Context, j Job) (*Stream, error) {
	if err := s.check(j); err != nil {
		return nil, err
	}
	st := newStream(ctx, j)
	s.mu.Lock()
	gone := s.pruneQueueLocked()
	defer finishGone(s, gone)
	switch {
	case s.closed || s.draining:
		s.mu.Unlock()
		return nil, ErrClosed
	case len(s.queue) >= s.cfg.QueueSize+max(0, s.cfg.MaxSeqs-s.active):
		// Requests that will take a free slot at the next step do not wait;
		// QueueSize more may wait behind them.
		s.mu.Unlock()
		s.met.rejected.Inc()
		return nil, fmt.Errorf("%w: %d requests waiting", ErrQueueFull, s.cfg.QueueSize)
	}
	s.queue = append(s.queue, st)
	s.met.queueDepth.Set(float64(len(s.queue)))
	// A client that leaves while its request waits gives its place back
	// at once, not when a slot would have taken it: requests nobody waits
	// for must not fill the queue and turn new ones away with 429.
	st.unqueue = context.AfterFunc(ctx, func() {
		s.mu.Lock()
		gone := s.pruneQueueLocked()
		s.mu.Unlock()
		finishGone(s, gone)
	})
	s.mu.Unlock()
	s.poke()
	return st, nil
}

// pruneQueueLocked takes the queued requests whose context ended or that
// were cancelled out of the queue and returns them (s.mu held).
func (s *Server) pruneQueueLocked() []*Stream {
	var gone []*Stream
	kept := s.queue[:0]
	for _, st := range s.queue {
		if st.isCancelled() != nil {
			gone = append(gone, st)
		} else {
			kept = append(kept, st)
		}
	}
	clear(s.queue[len(kept):])
	s.queue = kept
	if len(gone) > 0 {
		s.met.queueDepth.Set(float64(len(s.queue)))
	}
	return gone
}

// finishGone ends requests pruneQueueLocked took out of the queue (s.mu
// not held), as the scheduler ends a cancelled active one.
func finishGone(s *Server, gone []*Stream) {
	for _, st := range gone {
		st.stopUnqueue()
		st.finishText("", FinishCancelled, st.isCancelled())
		s.met.finished.WithLabelValues(FinishCancelled).Inc()
	}
}

func (s *Server) check(j Job) error {
	switch {
	case len(j.Prompt) == 0:
		return fmt.Errorf("%w: no prompt tokens", ErrPrompt)
	case len(j.Prompt) > s.p.Context:
		return fmt.Errorf("%w: the prompt has %d tokens; the model's context is %d", ErrPrompt, len(j.Prompt), s.p.Context)
	case j.MaxTokens < 1:
		return fmt.Errorf("%w: max tokens %d < 1", ErrParams, j.MaxTokens)
	case j.Sampler.Temperature < 0 || j.Sampler.Temperature != j.Sampler.Temperature:
		return fmt.Errorf("%w: temperature %v", ErrParams, j.Sampler.Temperature)
	case j.Sampler.TopP < 0 || j.Sampler.TopP != j.Sampler.TopP:
		return fmt.Errorf("%w: top_p %v", ErrParams, j.Sampler.TopP)
	case j.Draft != "" && j.Draft != spec.ModeNone && j.Draft != spec.ModeNGram && j.Draft != spec.ModeMTP:
		return fmt.Errorf("%w: draft %q: want none, ngram or mtp", ErrParams, j.Draft)
	case j.Draft == spec.ModeMTP && s.cfg.Model.MTPErr() != nil:
		return fmt.Errorf("%w: draft mtp: %w (use ngram)", ErrParams, s.cfg.Model.MTPErr())
	}
	for i, t := range j.Prompt {
		if t < 0 || int(t) >= s.p.Vocab {
			return fmt.Errorf("%w: prompt token %d is %d, outside the vocabulary of %d", ErrPrompt, i, t, s.p.Vocab)
		}
	}
	return nil
}

func (s *Server) poke() {
	for _, l := range s.lanes {
		select {
		case l.wake <- struct{}{}:
		default:
		}
	}
}

// Finish reasons, as in the OpenAI API, plus the two ways a request ends
// without a result.
const (
	FinishStop      = "stop"      // an end-of-generation token or a stop string
	FinishLength    = "length"    // MaxTokens reached or the context is full
	FinishCancelled = "cancelled" // the request's context ended or Cancel was called
	FinishError     = "error"     // the forward pass failed or the server closed
)

// Delta is what a Stream delivers: text generated since the last Delta
// (valid UTF-8, stop strings trimmed) and, on the last one, Done with the
// finish reason and counts.
type Delta struct {
	Text   string
	Tokens []int32 // tokens sampled since the last Delta (including an end-of-generation token)
	// Logprobs holds, when the Job asked (Job.Logprobs), one entry per
	// sampled token since the last Delta but end-of-generation tokens.
	Logprobs         []TokenLogprob
	Done             bool
	Finish           string // one of the Finish constants when Done
	Err              error  // set when Finish is FinishError or FinishCancelled
	PromptTokens     int
	CompletionTokens int // tokens sampled in all
}

// Stream is the output of one submitted Job. The scheduler never blocks on
// it: output accumulates until read. Next and Cancel may be called from any
// goroutine, Next by one goroutine at a time.
type Stream struct {
	ctx    context.Context
	job    Job
	notify chan struct{} // cap 1

	mu        sync.Mutex
	text      []byte
	tokens    []int32
	logprobs  []TokenLogprob
	generated int
	done      bool
	reason    string
	err       error
	cancelled bool

	// unqueue stops the context.AfterFunc that takes the request out of
	// the queue when its context ends (Submit); called once it leaves the
	// queue. nil before Submit queues it.
	unqueue func() bool
}

// stopUnqueue stops st's queue watch (once it has left the queue).
func (st *Stream) stopUnqueue() {
	if st.unqueue != nil {
		st.unqueue()
	}
}

func newStream(ctx context.Context, j Job) *Stream {
	return &Stream{ctx: ctx, job: j, notify: make(chan struct{}, 1)}
}

// Next blocks until the stream has new text or tokens, or has ended, and
// returns them. Once the Delta with Done has been returned, further calls
// return it again with no text or tokens. It returns ctx's error if ctx
// ends first (the request keeps running; call Cancel to stop it).
func (st *Stream) Next(ctx context.Context) (Delta, error) {
	for {
		st.mu.Lock()
		if len(st.text) > 0 || len(st.tokens) > 0 || st.done {
			d := Delta{Text: string(st.text), Tokens: st.tokens, Logprobs: st.logprobs, Done: st.done, Finish: st.reason,
				Err: st.err, PromptTokens: len(st.job.Prompt), CompletionTokens: st.generated}
			st.text, st.tokens, st.logprobs = st.text[:0], nil, nil
			st.mu.Unlock()
			return d, nil
		}
		st.mu.Unlock()
		select {
		case <-st.notify:
		case <-ctx.Done():
			return Delta{}, ctx.Err()
		}
	}
}

// Cancel asks the scheduler to drop the request at the next step boundary.
func (st *Stream) Cancel() {
	st.mu.Lock()
	st.cancelled = true
	st.mu.Unlock()
}

func (st *Stream) isCancelled() error {
	st.mu.Lock()
	c := st.cancelled
	st.mu.Unlock()
	if c {
		return context.Canceled
	}
	return st.ctx.Err()
}

// emit appends scheduler output (lp: the token's log-probabilities, or
// nil) and wakes the reader.
func (st *Stream) emit(text string, tok int32, lp *TokenLogprob) {
	st.mu.Lock()
	st.text = append(st.text, text...)
	st.tokens = append(st.tokens, tok)
	if lp != nil {
		st.logprobs = append(st.logprobs, *lp)
	}
	st.generated++
	st.mu.Unlock()
	st.signal()
}

func (st *Stream) finish(reason string, err error) {
	st.finishText("", reason, err)
}

func (st *Stream) finishText(text, reason string, err error) {
	st.mu.Lock()
	if !st.done {
		st.text = append(st.text, text...)
		st.done, st.reason, st.err = true, reason, err
	}
	st.mu.Unlock()
	st.signal()
}

func (st *Stream) signal() {
	select {
	case st.notify <- struct{}{}:
	default:
	}
}
