package run

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/health"
	"github.com/kvasir-ai/kvasir/backbone/serve"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/model"
)

// APIOptions are the options of the OpenAI-compatible API (ServeAPI) that
// backbone serve and demo --serve share.
type APIOptions struct {
	// ModelPath is the model file (its base name is the API's model name
	// when neither ModelID nor general.name gives one).
	ModelPath string
	// ModelID is the API's model name (--model-id; "": general.name).
	ModelID string
	// HTTPAddr is the API's listen address (--http).
	HTTPAddr string
	// APIKey, when set, is required as "Authorization: Bearer KEY" on /v1/.
	APIKey string
	// ChatTemplate is auto, chatml or none (--chat-template).
	ChatTemplate string
	// MaxBatch, MaxSeqs and Queue are --max-batch, --max-seqs and --queue
	// (serve.Config's MaxBatchRows, MaxSeqs, QueueSize; Queue 0: none).
	MaxBatch, MaxSeqs, Queue int
	// Threads are the goroutines for matrix products (0: all CPUs).
	Threads int
	// Lanes are the model instances decoding in turn (1..16; 0: AutoLanes).
	Lanes int
	// StateMemory is --max-state-memory as given (ParseBytes).
	StateMemory string
	// ReadyHolders is --ready-holders: /readyz reports ready only once every
	// expert pair is held by at least this many workers (0: once no pair
	// is missing, i.e. computed locally or held by a worker).
	ReadyHolders int
	// Requests, when > 0, ends serving after that many answered
	// completion requests (backbone demo --serve-requests, for tests).
	Requests int
	// Listener, when set, is where ServeAPI serves instead of listening on
	// HTTPAddr: backbone serve binds it before loading the model, so that a
	// busy or refused address fails at once, not after minutes of loading
	// and waiting for workers. ServeAPI closes it.
	Listener net.Listener
}

// SwarmOptions say where ServeExperts computes the experts: locally with
// an empty Listen, else over a swarm whose dispatcher listens there.
type SwarmOptions struct {
	Listen  string        // --dispatch-listen ("": local experts)
	Workers int           // --wait-workers: workers to wait for
	Wait    time.Duration // --wait-timeout: how long to wait for them
	Flags   *SwarmFlags   // the shared swarm flags
	Command string        // the command's name in the "dispatch listening" line
}

// AddAPIFlags registers the flags of the HTTP API that serve and demo
// --serve share on fs, into o.
func AddAPIFlags(fs *flag.FlagSet, o *APIOptions) {
	fs.StringVar(&o.APIKey, "api-key", os.Getenv("KVASIR_API_KEY"), "require 'Authorization: Bearer KEY' on /v1/ (default $KVASIR_API_KEY; empty: open)")
	fs.StringVar(&o.ChatTemplate, "chat-template", "auto", "chat template: auto (from tokenizer.chat_template), chatml, none")
	fs.IntVar(&o.MaxBatch, "max-batch", serve.DefaultMaxBatchRows, "token rows per forward step (prefill + decode)")
	fs.IntVar(&o.MaxSeqs, "max-seqs", serve.DefaultMaxSeqs, "sequences decoded at once (at most --max-batch)")
	fs.IntVar(&o.Queue, "queue", serve.DefaultQueueSize, "requests that may wait for a slot before 429")
	fs.StringVar(&o.StateMemory, "max-state-memory", "4GiB", "bytes of recurrent state (qwen35moe: per sequence, whatever its length) the sequences decoded at once may hold; lowers --max-seqs to fit (KiB/MiB/GiB suffix)")
	fs.IntVar(&o.Lanes, "lanes", 0, "model instances decoding in turn, so one computes while another waits on its expert round trips (0: auto, 2 with a swarm and 1 without)")
	fs.IntVar(&o.ReadyHolders, "ready-holders", 0, "with a swarm: /readyz reports ready once every expert is held by at least this many workers (0: once none is missing)")
}

// OpenAPINote returns a warning for an API served on addr with no key
// (key ""): anyone who can reach addr may use it. "" when a key is set or
// addr's host is a loopback address or localhost (this machine only).
func OpenAPINote(addr, key string) string {
	if key != "" {
		return ""
	}
	host, _, err := net.SplitHostPort(addr)
	if err == nil {
		if ip := net.ParseIP(strings.Trim(host, "[]")); host == "localhost" || (ip != nil && ip.IsLoopback()) {
			return ""
		}
	}
	return "serve: the API is open: no --api-key (or KVASIR_API_KEY) is set, and it listens beyond this machine; anyone who can reach it may use it"
}

// AutoLanes is --lanes 0: two lanes when the experts are computed over a
// swarm (one lane computes attention, router and shared expert while the
// other's experts are away: the two-batch overlap of the round trip), one
// when they are local (nothing to overlap; a second lane would only split
// the batch). A lane costs its own activation buffers (a few MB at the
// default --max-batch), not a copy of the weights.
func AutoLanes(lanes int, swarm bool) int {
	switch {
	case lanes > 0:
		return lanes
	case swarm:
		return 2
	default:
		return 1
	}
}

// Check reports whether the options AddAPIFlags registers are in range.
func (o *APIOptions) Check() error {
	switch {
	case o.MaxBatch < 1:
		return fmt.Errorf("--max-batch %d: want >= 1", o.MaxBatch)
	case o.MaxSeqs < 1:
		return fmt.Errorf("--max-seqs %d: want >= 1", o.MaxSeqs)
	case o.Queue < 0:
		return fmt.Errorf("--queue %d: want >= 0", o.Queue)
	case o.Lanes < 0 || o.Lanes > 16:
		return fmt.Errorf("--lanes %d: want 0 (automatic) to 16", o.Lanes)
	case o.ReadyHolders < 0:
		return fmt.Errorf("--ready-holders %d: want >= 0", o.ReadyHolders)
	case o.Threads < 0:
		return fmt.Errorf("--threads %d: want >= 0 (0: all CPUs)", o.Threads)
	}
	switch o.ChatTemplate {
	case "", "auto", "chatml", "none":
	default:
		return fmt.Errorf("--chat-template %q: want auto, chatml or none", o.ChatTemplate)
	}
	if n, err := ParseBytes(o.StateMemory); err != nil || n <= 0 {
		return fmt.Errorf("--max-state-memory %q: want a positive byte count with an optional KiB/MiB/GiB suffix", o.StateMemory)
	}
	return nil
}

// APIExperts is where a serving model's experts are computed.
type APIExperts struct {
	// Computer replaces the model's local experts; nil keeps them.
	Computer expert.Computer
	// Stats, when set, feeds the swarm metrics (serve.NewSwarmCollector).
	Stats func() dispatch.Stats
	// Coverage, when set, feeds /v1/models, the coverage metrics
	// (serve.NewCoverageCollector) and the 503 of a missing holder.
	Coverage func() dispatch.Coverage
	// HolderWait is the swarm's holder wait, the Retry-After of that 503
	// (0: serve's default).
	HolderWait time.Duration
	// Close releases what Computer holds (listeners, sessions); may be nil.
	Close func() error
	// Describe is a one-line summary for the log.
	Describe string
}

// ServeExperts chooses where the experts of lm are computed: locally by
// default, or with o.Listen (--dispatch-listen) through the dispatcher of
// StartSwarm (the one generate and demo use: workers must announce
// slice.ModelID of the model file, and each holding's hash must equal
// slice.HashExpert of the backbone's own expert), which accepts the hub's
// worker links and falls back to lm's local experts for whatever no worker
// holds or returns in time. It prints "COMMAND: dispatch listening on
// HOST:PORT (model id ...)" to stderr before waiting up to o.Wait for
// o.Workers. A backbone-only model needs --dispatch-listen
// (ErrNeedsSwarm otherwise): its experts are computed by workers only,
// and a step no worker can serve within --holder-wait answers 503.
func ServeExperts(ctx context.Context, lm *Model, o SwarmOptions, log *slog.Logger, stderr io.Writer) (*APIExperts, error) {
	if o.Listen == "" {
		if err := lm.CheckLocal(); err != nil {
			return nil, err
		}
		return &APIExperts{Describe: "experts: local"}, nil
	}
	sc := o.Flags.Config(o.Listen, log)
	sc.Workers, sc.Listening = o.Workers, AnnounceListening(stderr, o.Command, lm)
	wctx, cancel := context.WithTimeout(ctx, o.Wait)
	d, err := StartSwarm(wctx, lm, sc)
	cancel()
	if err != nil {
		return nil, err
	}
	where := "local fallback"
	if bo := lm.BackboneOnly(); bo != nil {
		where = fmt.Sprintf("backbone-only: %d of %d experts here, the rest on workers", len(bo.Hot), bo.NLayer*bo.NExpert)
	}
	return &APIExperts{Computer: d, Stats: d.Stats, Coverage: d.Coverage, Close: d.Close, HolderWait: o.Flags.HolderWait,
		Describe: fmt.Sprintf("experts: swarm, dispatch listener %s (model id %q), %s", d.Addr(), lm.ID(), where)}, nil
}

// APIName is the API's model name: --model-id, else general.name,
// else the model file's base name, else "kvasir".
func APIName(lm *Model, o APIOptions) string {
	id := o.ModelID
	if id == "" {
		id, _ = lm.File().String("general.name")
	}
	if id == "" && o.ModelPath != "" {
		id = filepath.Base(o.ModelPath)
	}
	return id
}

// ServeAPI serves the OpenAI-compatible API (serve.Server) for lm on
// o.HTTPAddr with its experts computed by ex, until ctx ends or, with
// o.Requests > 0, that many completion requests (POST /v1/completions or
// /v1/chat/completions, any status) have been answered; then it lets
// in-flight requests finish for up to serve.DefaultShutdownDrain (10 s),
// ends the rest (serve.Server.Shutdown) and returns. The HTTP server is
// serve.NewHTTPServer's. It installs
// ex.Computer in lm's engine, loads AutoLanes(o.Lanes)-1 more engine instances of
// lm's file for lanes, logs a "serving" line and calls ready (if set) with
// the bound address.
// Errors: a bad chat-template choice is only logged (chat completions then
// answer 400); listen, serve.New and metric registration errors are
// returned.
func ServeAPI(ctx context.Context, lm *Model, ex *APIExperts, o APIOptions, log *slog.Logger, ready func(httpAddr string)) error {
	if o.Listener != nil {
		defer o.Listener.Close() // also on the errors before serving
	}
	f, m, tok := lm.File(), lm.Engine(), lm.Tokenizer()
	id := APIName(lm, o)
	tmpl, _ := f.String("tokenizer.chat_template")
	chat, chatErr := serve.ChatTemplateFor(tok, tmpl, o.ChatTemplate)
	if chatErr != nil {
		log.Warn("chat completions disabled", "err", chatErr)
	}
	if ex.Computer != nil {
		m.SetExperts(ex.Computer)
	}
	nLanes := AutoLanes(o.Lanes, ex.Computer != nil)
	var lanes []*model.Model
	for range nLanes - 1 {
		l, err := model.Load(f) // the same weights (views of f), its own buffers
		if err != nil {
			return err
		}
		l.SetThreads(o.Threads)
		lanes = append(lanes, l)
	}
	reg := prometheus.NewRegistry()
	if ex.Stats != nil {
		if err := reg.Register(serve.NewSwarmCollector(ex.Stats)); err != nil {
			return err
		}
	}
	if ex.Coverage != nil {
		if err := reg.Register(serve.NewCoverageCollector(ex.Coverage)); err != nil {
			return err
		}
	}
	stateMemory, _ := ParseBytes(o.StateMemory) // checked by Check
	queue := o.Queue
	if queue == 0 {
		queue = -1 // serve.Config: 0 means the default, negative means none
	}
	s, err := serve.New(serve.Config{Model: m, Lanes: lanes, Experts: ex.Computer, Tokenizer: tok, ModelID: id, Chat: chat, ChatErr: chatErr,
		APIKey: o.APIKey, MaxBatchRows: o.MaxBatch, MaxSeqs: o.MaxSeqs, QueueSize: queue, StateMemory: stateMemory,
		Registry: reg, Logger: log, Coverage: ex.Coverage, HolderRetryAfter: ex.HolderWait})
	if err != nil {
		return err
	}
	s.Start()
	defer s.Close()

	ln := o.Listener
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", o.HTTPAddr); err != nil {
			return err
		}
	}
	handler := withHealth(ctx, s.Handler(), ex, o.ReadyHolders)
	enough := make(chan struct{})
	if o.Requests > 0 {
		handler = countCompletions(handler, o.Requests, func() { close(enough) })
	}
	hs := serve.NewHTTPServer(handler)
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	p := m.Params()
	maxBatch, maxSeqs := s.Limits() // effective: --max-seqs is capped at --max-batch and by --max-state-memory
	log.Info("serving", "http", ln.Addr().String(), "model", id, "layers", p.Layers, "experts", p.Experts,
		"context", p.Context, "chat", chat != nil, "max_batch", maxBatch, "max_seqs", maxSeqs, "queue", o.Queue,
		"lanes", nLanes, "where", ex.Describe)
	if ready != nil {
		ready(ln.Addr().String())
	}
	why := "signal"
	select {
	case <-ctx.Done():
	case <-enough:
		why = "--serve-requests answered"
	case err := <-served:
		return err
	}
	// Let in-flight requests finish for a while, then end the rest
	// (serve.Server.Shutdown: error event and [DONE], or 503).
	st := s.Stats()
	log.Info("shutting down: no new requests; active generations run on, then end", "why", why,
		"active", st.Active, "queued_refused", st.Queued, "drain", serve.DefaultShutdownDrain)
	t0 := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), serve.DefaultShutdownDrain)
	defer cancel()
	err = s.Shutdown(sctx, hs)
	if err != nil {
		log.Warn("shutdown", "err", err)
	}
	log.Info("stopped", "took", time.Since(t0).Round(time.Millisecond), "drained", sctx.Err() == nil)
	return nil
}

// withHealth serves /healthz and /readyz (backbone/health) in front of
// the API h: ready while ctx (serving) lasts, with the model loaded (it is,
// once the API serves) and, with a swarm, no expert missing and every one
// held by at least holders workers.
func withHealth(ctx context.Context, h http.Handler, ex *APIExperts, holders int) http.Handler {
	checks := []health.Check{
		{Name: "model", Fn: func(context.Context) error { return nil }},
		{Name: "serving", Fn: func(context.Context) error {
			if ctx.Err() != nil {
				return errors.New("shutting down")
			}
			return nil
		}},
	}
	if ex.Coverage != nil {
		checks = append(checks, health.Check{Name: "coverage", Fn: func(context.Context) error {
			return coverageReady(ex.Coverage(), holders)
		}})
	}
	mux := http.NewServeMux()
	health.Mount(mux, checks...)
	mux.Handle("/", h)
	return mux
}

// coverageReady is nil when no expert pair of cv is missing and every
// pair is held by at least holders workers. It reads cv.Layers, the
// numbers the kvasir_swarm_layer_* gauges export, and names the layers
// that fall short.
func coverageReady(cv dispatch.Coverage, holders int) error {
	var missing, short []string
	nMissing := 0
	for l, lc := range cv.Layers {
		if lc.Missing > 0 {
			nMissing += lc.Missing
			missing = append(missing, fmt.Sprintf("%d (%d)", l, lc.Missing))
		}
		if lc.MinHolders < holders {
			short = append(short, fmt.Sprintf("%d (fewest %d, %d workers in the layer)", l, lc.MinHolders, lc.Holders))
		}
	}
	if nMissing > 0 {
		return fmt.Errorf("%d of %d experts held by no worker and not computed here; layers (missing): %s",
			nMissing, cv.Experts, strings.Join(missing, ", "))
	}
	if len(short) > 0 {
		return fmt.Errorf("experts held by fewer than the %d workers --ready-holders asks in %d of %d layers: %s",
			holders, len(short), len(cv.Layers), strings.Join(short, ", "))
	}
	return nil
}

// countCompletions wraps h: once n requests to POST /v1/completions or
// /v1/chat/completions have been answered (the handler returned, whatever
// the status), it calls done, once.
func countCompletions(h http.Handler, n int, done func()) http.Handler {
	var mu sync.Mutex
	count := 0
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		if r.Method != http.MethodPost || (r.URL.Path != "/v1/completions" && r.URL.Path != "/v1/chat/completions") {
			return
		}
		mu.Lock()
		count++
		if count == n {
			done()
		}
		mu.Unlock()
	})
}
