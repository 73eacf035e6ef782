package main

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
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/backbone/serve"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/model"
)

func init() {
	register("serve", "OpenAI-compatible HTTP API with continuous batching (experts local or over the swarm)", func(args []string) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return serveMain(ctx, args, os.Stderr, nil)
	})
}

// serveOptions are the parsed flags of backbone serve.
type serveOptions struct {
	modelPath, modelID, httpAddr, apiKey, chatTemplate string
	dispatchListen                                     string
	waitWorkers                                        int
	waitTimeout                                        time.Duration
	maxBatch, maxSeqs, queue, threads, lanes           int
	stateMemory                                        string // --max-state-memory as given
	// swarm holds --min-deadline and --provision (with --dispatch-listen).
	swarm *swarmFlags
	// requests, when > 0, ends serving after that many completed
	// completion requests (backbone demo --serve-requests, for tests).
	requests int
}

// addAPIFlags registers the flags of the HTTP API that serve and demo
// --serve share on fs, into o.
func addAPIFlags(fs *flag.FlagSet, o *serveOptions) {
	fs.StringVar(&o.apiKey, "api-key", os.Getenv("KVASIR_API_KEY"), "require 'Authorization: Bearer KEY' on /v1/ (default $KVASIR_API_KEY; empty: open)")
	fs.StringVar(&o.chatTemplate, "chat-template", "auto", "chat template: auto (from tokenizer.chat_template), chatml, none")
	fs.IntVar(&o.maxBatch, "max-batch", serve.DefaultMaxBatchRows, "token rows per forward step (prefill + decode)")
	fs.IntVar(&o.maxSeqs, "max-seqs", serve.DefaultMaxSeqs, "sequences decoded at once (at most --max-batch)")
	fs.IntVar(&o.queue, "queue", serve.DefaultQueueSize, "requests that may wait for a slot before 429")
	fs.StringVar(&o.stateMemory, "max-state-memory", "4GiB", "bytes of recurrent state (qwen35moe: per sequence, whatever its length) the sequences decoded at once may hold; lowers --max-seqs to fit (KiB/MiB/GiB suffix)")
	fs.IntVar(&o.lanes, "lanes", 1, "model instances decoding in turn, so one computes while another waits on its expert round trips")
}

// checkAPIFlags reports whether the flags addAPIFlags registered are in
// range.
func checkAPIFlags(o *serveOptions) error {
	if o.maxBatch < 1 || o.maxSeqs < 1 || o.queue < 0 || o.lanes < 1 || o.lanes > 16 {
		return errors.New("a non-positive --max-batch/--max-seqs, a negative --queue, or --lanes outside 1..16")
	}
	if n, err := run.ParseBytes(o.stateMemory); err != nil || n <= 0 {
		return fmt.Errorf("--max-state-memory %q: want a positive byte count with an optional KiB/MiB/GiB suffix", o.stateMemory)
	}
	return nil
}

// serveExperts is where a serving model's experts are computed.
type serveExperts struct {
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

// serveExpertsFor chooses where the experts of lm are computed: locally by
// default, or with --dispatch-listen through the dispatcher of
// run.StartSwarm (the one generate and demo use: workers must announce
// slice.ModelID of the model file, and each holding's hash must equal
// slice.HashExpert of the backbone's own expert), which accepts the hub's
// worker links and falls back to lm's local experts for whatever no worker
// holds or returns in time. It prints "serve: dispatch listening on
// HOST:PORT (model id ...)" to stderr before waiting up to --wait-timeout
// for --wait-workers. A backbone-only model needs --dispatch-listen
// (run.ErrNeedsSwarm otherwise): its experts are computed by workers only,
// and a step no worker can serve within --holder-wait answers 503.
func serveExpertsFor(ctx context.Context, lm *run.Model, o serveOptions, log *slog.Logger, stderr io.Writer) (*serveExperts, error) {
	if o.dispatchListen == "" {
		if err := lm.CheckLocal(); err != nil {
			return nil, err
		}
		return &serveExperts{Describe: "experts: local"}, nil
	}
	sc := o.swarm.config(o.dispatchListen, log)
	sc.Workers, sc.Listening = o.waitWorkers, announceListening(stderr, "serve", lm)
	wctx, cancel := context.WithTimeout(ctx, o.waitTimeout)
	d, err := run.StartSwarm(wctx, lm, sc)
	cancel()
	if err != nil {
		return nil, err
	}
	where := "local fallback"
	if bo := lm.BackboneOnly(); bo != nil {
		where = fmt.Sprintf("backbone-only: %d of %d experts here, the rest on workers", len(bo.Hot), bo.NLayer*bo.NExpert)
	}
	return &serveExperts{Computer: d, Stats: d.Stats, Coverage: d.Coverage, Close: d.Close, HolderWait: o.swarm.holderWait,
		Describe: fmt.Sprintf("experts: swarm, dispatch listener %s (model id %q), %s", d.Addr(), lm.ID(), where)}, nil
}

// serveMain runs backbone serve until ctx ends:
//
//	backbone serve [--model FILE] [--http 127.0.0.1:8080] [--dispatch-listen ADDR [--wait-workers N]
//	               [--min-deadline D] [--provision [--provision-rate BYTES]]]
//	               [--model-id ID] [--api-key KEY] [--chat-template auto|chatml|none]
//	               [--max-batch 512] [--max-seqs 512] [--queue 1024] [--threads N] [--lanes 1]
//
// --model-id is the name of the API (/v1/models, requests' "model");
// workers always announce the model file's slice.ModelID. ready, if set,
// is called with the bound HTTP address once it accepts requests. It
// returns the process exit code: 2 for bad flags, 1 for failures.
func serveMain(ctx context.Context, args []string, stderr io.Writer, ready func(httpAddr string)) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o serveOptions
	fs.StringVar(&o.modelPath, "model", "", "GGUF model file (default: the embedded tiny model)")
	fs.StringVar(&o.httpAddr, "http", "127.0.0.1:8080", "HTTP listen address of the API")
	fs.StringVar(&o.modelID, "model-id", "", "model name served by /v1/models and accepted in requests (default: general.name); workers announce the file's slice model id regardless")
	fs.StringVar(&o.dispatchListen, "dispatch-listen", "", "serve experts over the swarm: listen here for the hub's worker links (LAN address)")
	fs.IntVar(&o.waitWorkers, "wait-workers", 0, "with --dispatch-listen: wait for N workers before serving")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 5*time.Minute, "how long --wait-workers waits")
	fs.IntVar(&o.threads, "threads", 0, "goroutines for matrix products (0: all CPUs)")
	addAPIFlags(fs, &o)
	o.swarm = addSwarmFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := checkAPIFlags(&o); err != nil {
		fmt.Fprintln(stderr, "serve:", err)
		return 2
	}
	if fs.NArg() != 0 || o.waitWorkers < 0 {
		fmt.Fprintf(stderr, "serve: unexpected arguments %q or a negative --wait-workers %d\n", fs.Args(), o.waitWorkers)
		return 2
	}
	if err := o.swarm.check(); err != nil {
		fmt.Fprintln(stderr, "serve:", err)
		return 2
	}
	if o.waitWorkers > 0 && o.dispatchListen == "" {
		fmt.Fprintln(stderr, "serve: --wait-workers needs --dispatch-listen")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	fail := func(err error) int {
		fmt.Fprintln(stderr, "serve:", err)
		return 1
	}

	lm, err := run.Load(o.modelPath)
	if err != nil {
		return fail(err)
	}
	defer lm.Close()
	lm.Engine().SetThreads(o.threads)
	ex, err := serveExpertsFor(ctx, lm, o, log, stderr)
	if err != nil {
		return fail(err)
	}
	if ex.Close != nil {
		defer ex.Close()
	}
	if err := serveAPI(ctx, lm, ex, o, log, stderr, ready); err != nil {
		return fail(err)
	}
	return 0
}

// serveAPIName is the API's model name: --model-id, else general.name,
// else the model file's base name, else "kvasir".
func serveAPIName(lm *run.Model, o serveOptions) string {
	id := o.modelID
	if id == "" {
		id, _ = lm.File().String("general.name")
	}
	if id == "" && o.modelPath != "" {
		id = filepath.Base(o.modelPath)
	}
	return id
}

// serveAPI serves the OpenAI-compatible API (serve.Server) for lm on
// o.httpAddr with its experts computed by ex, until ctx ends or, with
// o.requests > 0, that many completion requests (POST /v1/completions or
// /v1/chat/completions, any status) have been answered; then it lets
// in-flight requests finish for up to 10 s and returns. It installs
// ex.Computer in lm's engine, loads o.lanes-1 more engine instances of
// lm's file for lanes, logs a "serving" line and calls ready (if set) with
// the bound address.
// Errors: a bad chat-template choice is only logged (chat completions then
// answer 400); listen, serve.New and metric registration errors are
// returned.
func serveAPI(ctx context.Context, lm *run.Model, ex *serveExperts, o serveOptions, log *slog.Logger, stderr io.Writer, ready func(httpAddr string)) error {
	f, m, tok := lm.File(), lm.Engine(), lm.Tokenizer()
	id := serveAPIName(lm, o)
	tmpl, _ := f.String("tokenizer.chat_template")
	chat, chatErr := serve.ChatTemplateFor(tok, tmpl, o.chatTemplate)
	if chatErr != nil {
		log.Warn("chat completions disabled", "err", chatErr)
	}
	if ex.Computer != nil {
		m.SetExperts(ex.Computer)
	}
	var lanes []*model.Model
	for range o.lanes - 1 {
		l, err := model.Load(f) // the same weights (views of f), its own buffers
		if err != nil {
			return err
		}
		l.SetThreads(o.threads)
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
	stateMemory, _ := run.ParseBytes(o.stateMemory) // checked by checkAPIFlags
	queue := o.queue
	if queue == 0 {
		queue = -1 // serve.Config: 0 means the default, negative means none
	}
	s, err := serve.New(serve.Config{Model: m, Lanes: lanes, Experts: ex.Computer, Tokenizer: tok, ModelID: id, Chat: chat, ChatErr: chatErr,
		APIKey: o.apiKey, MaxBatchRows: o.maxBatch, MaxSeqs: o.maxSeqs, QueueSize: queue, StateMemory: stateMemory,
		Registry: reg, Logger: log, Coverage: ex.Coverage, HolderRetryAfter: ex.HolderWait})
	if err != nil {
		return err
	}
	s.Start()
	defer s.Close()

	ln, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return err
	}
	handler := s.Handler()
	enough := make(chan struct{})
	if o.requests > 0 {
		handler = countCompletions(handler, o.requests, func() { close(enough) })
	}
	hs := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	p := m.Params()
	log.Info("serving", "http", ln.Addr().String(), "model", id, "layers", p.Layers, "experts", p.Experts,
		"context", p.Context, "chat", chat != nil, "max_batch", o.maxBatch, "max_seqs", o.maxSeqs, "queue", o.queue,
		"lanes", o.lanes, "where", ex.Describe)
	if ready != nil {
		ready(ln.Addr().String())
	}
	select {
	case <-ctx.Done():
	case <-enough:
	case err := <-served:
		return err
	}
	// Let in-flight requests finish for a while, then end the rest.
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		<-sctx.Done()
		s.Close() // ends the remaining streams so their handlers return
	}()
	if err := hs.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		log.Warn("shutdown", "err", err)
	}
	_ = hs.Close()
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
