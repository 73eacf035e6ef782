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
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/serve"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
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
}

// serveExperts is where a serving model's experts are computed.
type serveExperts struct {
	// Computer replaces the model's local experts; nil keeps them.
	Computer expert.Computer
	// Stats, when set, feeds the swarm metrics (serve.NewSwarmCollector).
	Stats func() dispatch.Stats
	// Close releases what Computer holds (listeners, sessions); may be nil.
	Close func() error
	// Describe is a one-line summary for the log.
	Describe string
}

// serveExpertsFor chooses where the experts of m are computed: locally by
// default, or with --dispatch-listen through a dispatch.Dispatcher that
// accepts the hub's worker links (and falls back to m's local experts for
// whatever no worker holds or returns in time). It is the one place the
// swarm is wired; backbone demo may replace it.
var serveExpertsFor = func(ctx context.Context, m *model.Model, id string, o serveOptions, log *slog.Logger) (*serveExperts, error) {
	if o.dispatchListen == "" {
		return &serveExperts{Describe: "experts: local"}, nil
	}
	p := m.Params()
	d, err := dispatch.New(dispatch.Config{Listen: o.dispatchListen, Fallback: m.LocalExperts(), Logger: log,
		Model: dispatch.Model{ID: id, D: p.Embd, K: p.ExpertsUsed, NLayer: p.Layers, NExpert: p.Experts}})
	if err != nil {
		return nil, err
	}
	if err := d.Start(); err != nil {
		return nil, err
	}
	if o.waitWorkers > 0 {
		wctx, cancel := context.WithTimeout(ctx, o.waitTimeout)
		err := d.WaitWorkers(wctx, o.waitWorkers)
		cancel()
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("waiting for %d workers: %w", o.waitWorkers, err)
		}
	}
	return &serveExperts{Computer: d, Stats: d.Stats, Close: d.Close,
		Describe: fmt.Sprintf("experts: swarm, dispatch listener %s (model id %q), local fallback", d.Addr(), id)}, nil
}

// serveMain runs backbone serve until ctx ends:
//
//	backbone serve [--model FILE] [--http 127.0.0.1:8080] [--dispatch-listen ADDR [--wait-workers N]]
//	               [--model-id ID] [--api-key KEY] [--chat-template auto|chatml|none]
//	               [--max-batch 512] [--max-seqs 512] [--queue 1024] [--threads N] [--lanes 1]
//
// ready, if set, is called with the bound HTTP address once it accepts
// requests. It returns the process exit code: 2 for bad flags, 1 for
// failures.
func serveMain(ctx context.Context, args []string, stderr io.Writer, ready func(httpAddr string)) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o serveOptions
	fs.StringVar(&o.modelPath, "model", "", "GGUF model file (default: the embedded tiny model)")
	fs.StringVar(&o.httpAddr, "http", "127.0.0.1:8080", "HTTP listen address of the API")
	fs.StringVar(&o.modelID, "model-id", "", "model id served by /v1/models and announced by workers (default: general.name)")
	fs.StringVar(&o.apiKey, "api-key", os.Getenv("KVASIR_API_KEY"), "require 'Authorization: Bearer KEY' on /v1/ (default $KVASIR_API_KEY; empty: open)")
	fs.StringVar(&o.chatTemplate, "chat-template", "auto", "chat template: auto (from tokenizer.chat_template), chatml, none")
	fs.StringVar(&o.dispatchListen, "dispatch-listen", "", "serve experts over the swarm: listen here for the hub's worker links (LAN address)")
	fs.IntVar(&o.waitWorkers, "wait-workers", 0, "with --dispatch-listen: wait for N workers before serving")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", 5*time.Minute, "how long --wait-workers waits")
	fs.IntVar(&o.maxBatch, "max-batch", serve.DefaultMaxBatchRows, "token rows per forward step (prefill + decode)")
	fs.IntVar(&o.maxSeqs, "max-seqs", serve.DefaultMaxSeqs, "sequences decoded at once (at most --max-batch)")
	fs.IntVar(&o.queue, "queue", serve.DefaultQueueSize, "requests that may wait for a slot before 429")
	fs.IntVar(&o.threads, "threads", 0, "goroutines for matrix products (0: all CPUs)")
	fs.IntVar(&o.lanes, "lanes", 1, "model instances decoding in turn, so one computes while another waits on its expert round trips")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 || o.maxBatch < 1 || o.maxSeqs < 1 || o.queue < 0 || o.waitWorkers < 0 || o.lanes < 1 || o.lanes > 16 {
		fmt.Fprintln(stderr, "serve: unexpected arguments, a non-positive --max-batch/--max-seqs, a negative --queue/--wait-workers, or --lanes outside 1..16")
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

	f, err := serveOpenModel(o.modelPath)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	m, err := model.Load(f)
	if err != nil {
		return fail(err)
	}
	m.SetThreads(o.threads)
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return fail(err)
	}
	id := o.modelID
	if id == "" {
		id, _ = f.String("general.name")
	}
	if id == "" && o.modelPath != "" {
		id = filepath.Base(o.modelPath)
	}
	tmpl, _ := f.String("tokenizer.chat_template")
	chat, chatErr := serve.ChatTemplateFor(tok, tmpl, o.chatTemplate)
	if chatErr != nil {
		log.Warn("chat completions disabled", "err", chatErr)
	}

	ex, err := serveExpertsFor(ctx, m, id, o, log)
	if err != nil {
		return fail(err)
	}
	if ex.Close != nil {
		defer ex.Close()
	}
	if ex.Computer != nil {
		m.SetExperts(ex.Computer)
	}
	var lanes []*model.Model
	for range o.lanes - 1 {
		lm, err := model.Load(f) // the same weights (views of f), its own buffers
		if err != nil {
			return fail(err)
		}
		lm.SetThreads(o.threads)
		lanes = append(lanes, lm)
	}
	reg := prometheus.NewRegistry()
	if ex.Stats != nil {
		if err := reg.Register(serve.NewSwarmCollector(ex.Stats)); err != nil {
			return fail(err)
		}
	}
	queue := o.queue
	if queue == 0 {
		queue = -1 // serve.Config: 0 means the default, negative means none
	}
	s, err := serve.New(serve.Config{Model: m, Lanes: lanes, Experts: ex.Computer, Tokenizer: tok, ModelID: id, Chat: chat, ChatErr: chatErr,
		APIKey: o.apiKey, MaxBatchRows: o.maxBatch, MaxSeqs: o.maxSeqs, QueueSize: queue,
		Registry: reg, Logger: log})
	if err != nil {
		return fail(err)
	}
	s.Start()
	defer s.Close()

	ln, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return fail(err)
	}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
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
	case err := <-served:
		return fail(err)
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
	return 0
}

// serveOpenModel opens path, or the embedded tiny model when path is "".
func serveOpenModel(path string) (*gguf.File, error) {
	if path != "" {
		return gguf.Open(path)
	}
	data, err := modelgen.Tiny()
	if err != nil {
		return nil, err
	}
	return gguf.Parse(data)
}
