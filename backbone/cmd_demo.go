package main

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/worker"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

func init() {
	register("demo", "a loopback swarm (hub, TLS gateway, worker processes) decoding the embedded tiny model", func(args []string) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return demoMain(ctx, args, os.Stdout, os.Stderr)
	})
}

// demoOptions are the flags of backbone demo.
type demoOptions struct {
	prompt        string
	maxTokens     int
	workers       int
	workerThreads int
	threads       int
	rate          uint64
	dir           string
	verbose, json bool
	timeout       time.Duration
	minDeadline   time.Duration
}

// demoResult is the --json output of backbone demo.
type demoResult struct {
	ModelID     string  `json:"model_id"`
	Prompt      string  `json:"prompt"`
	Text        string  `json:"text"`         // the swarm decode's text (invalid UTF-8 bytes as U+FFFD)
	Tokens      []int32 `json:"tokens"`       // the swarm decode's tokens
	LocalTokens []int32 `json:"local_tokens"` // the same prompt decoded with local experts
	TokensEqual bool    `json:"tokens_equal"`
	LogitsEqual bool    `json:"logits_equal"` // every logits vector bit-identical (SHA-256 over all of them)
	LocalTokS   float64 `json:"local_tok_s"`  // decode tokens/s with local experts
	SwarmTokS   float64 `json:"swarm_tok_s"`  // decode tokens/s with every expert over the swarm
	// ExpertsRemote and ExpertsLocal count the swarm decode's (row, slot)
	// expert outputs computed by workers and here.
	ExpertsRemote   uint64       `json:"experts_remote"`
	ExpertsLocal    uint64       `json:"experts_local"`
	RateNKVRPerByte uint64       `json:"rate_nkvr_per_byte"`
	LedgerLastID    int64        `json:"ledger_last_id"` // the gateway credited up to this ledger row
	Workers         []demoWorker `json:"workers"`
	Dir             string       `json:"dir,omitempty"` // with --dir: where the files are kept
}

// demoWorker is one worker process of the demo: the dispatcher's view of
// its session(s), what the hub's ledger metered for it, and what the
// gateway credited.
type demoWorker struct {
	Name    string `json:"name"`
	Pid     int    `json:"pid"`
	Layers  []int  `json:"layers"`
	ID      string `json:"id"`      // hex ed25519 public key
	Address string `json:"address"` // wallet address of the key
	// Sessions are the dispatcher's statistics of the worker's sessions.
	Sessions []workerJSON `json:"sessions"`
	// Rows, BytesIn and BytesOut sum Sessions.
	Rows     uint64 `json:"rows"`
	BytesIn  uint64 `json:"bytes_in"`
	BytesOut uint64 `json:"bytes_out"`
	// LedgerBytes are the creditable bytes in the hub's ledger, and
	// RejectedBytes the rejected ones (docs/accounting.md).
	LedgerBytes   uint64 `json:"ledger_bytes"`
	RejectedBytes uint64 `json:"rejected_bytes"`
	// CreditedBytes and CreditedNKVR are the gateway's wallet of the worker
	// after its crediting pass; CreditedKVR is walletapi.FormatKVR of it.
	CreditedBytes uint64 `json:"credited_bytes"`
	CreditedNKVR  uint64 `json:"credited_nkvr"`
	CreditedKVR   string `json:"credited_kvr"`
}

// demoMain implements
//
//	backbone demo [--prompt P] [--max-tokens 32] [--workers 2] [--json] [--dir DIR] [--verbose]
//
// On loopback it writes the embedded tiny model to a temporary directory,
// cuts one slice per worker (layer l goes to worker l mod --workers),
// starts a hub (with a ledger), a gateway (self-signed TLS, crediting) and
// the workers as child processes of this binary, and a dispatcher here;
// decodes the prompt with local experts, then with every expert over the
// swarm; stops the workers, waits for the hub's final ledger rows and the
// gateway's crediting, and prints the text, whether the tokens (and
// logits) equal the local decode, tok/s of both, bytes and credited KVR per
// worker. Every child is stopped before it returns, also on ctx's end
// (Ctrl-C). Exit code: 0, 1 on failure or if the tokens differ, 2 on bad
// usage.
func demoMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o demoOptions
	fs.StringVar(&o.prompt, "prompt", "Once upon a time, in a swarm of experts,", "prompt text")
	fs.IntVar(&o.maxTokens, "max-tokens", 32, "tokens to generate")
	fs.IntVar(&o.workers, "workers", 2, "worker processes; layer l is served by worker l mod N")
	fs.IntVar(&o.workerThreads, "worker-threads", 1, "compute threads per worker")
	fs.IntVar(&o.threads, "threads", 0, "backbone goroutines for matrix products (0: all CPUs)")
	fs.Uint64Var(&o.rate, "rate-nkvr-per-byte", walletapi.DefaultRateNKVRPerByte, "the gateway's price in nKVR per creditable byte")
	fs.StringVar(&o.dir, "dir", "", "keep the demo's files (model, slices, ledger, wallets, keys, logs) in DIR, new or empty (default: a temporary directory, removed)")
	fs.BoolVar(&o.verbose, "verbose", false, "copy the children's logs to stderr")
	fs.BoolVar(&o.json, "json", false, "print one JSON object")
	fs.DurationVar(&o.timeout, "timeout", 3*time.Minute, "give up after this long")
	fs.DurationVar(&o.minDeadline, "min-deadline", 0, "lower bound of a worker request's adaptive deadline (0: dispatch's 50 ms; raise it on a loaded machine to keep slow answers remote)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 || o.maxTokens < 1 || o.workers < 1 || o.rate == 0 {
		fmt.Fprintln(stderr, "demo: unexpected arguments, or --max-tokens, --workers or --rate-nkvr-per-byte below 1")
		fs.Usage()
		return 2
	}
	res, err := runDemo(ctx, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(stderr, "demo:", err)
			return 1
		}
	} else {
		printDemo(stdout, res)
	}
	if !res.TokensEqual {
		return 1
	}
	return 0
}

// demoSwarm is a running demo swarm: the tiny model with a dispatcher in
// this process, and hub, gateway and worker processes.
type demoSwarm struct {
	lm      *loadedModel
	d       *dispatch.Dispatcher
	sw      *demo.Swarm
	names   []string // worker names
	layers  [][]int  // per worker
	keys    []string // per worker, hex public key
	workers []*demo.Proc
}

// Experts returns the running swarm's expert.Computer: the dispatcher,
// which sends each MoE layer's rows to the worker processes and computes
// locally what none delivers. It is the hook for `backbone demo --serve`
// (to come): start the swarm with startDemoSwarm, install Experts() in the
// served model(s) with Model.SetExperts (as serveExpertsFor does with its
// own dispatcher), serve until interrupted, then Close.
func (s *demoSwarm) Experts() expert.Computer { return s.d }

// startDemoSwarm prepares dir (model file, one slice and one key per
// worker) and starts the dispatcher, hub, gateway and workers, waiting
// until every worker is connected with all its experts accepted.
func startDemoSwarm(ctx context.Context, o demoOptions, dir string, log io.Writer) (_ *demoSwarm, err error) {
	s := &demoSwarm{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	data, err := modelgen.Tiny()
	if err != nil {
		return nil, err
	}
	modelPath := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(modelPath, data, 0o644); err != nil {
		return nil, err
	}
	if s.lm, err = loadGenModel(modelPath); err != nil {
		return nil, err
	}
	s.lm.m.SetThreads(o.threads)
	p := s.lm.m.Params()
	if o.workers > p.Layers {
		return nil, fmt.Errorf("--workers %d: the model has only %d layers", o.workers, p.Layers)
	}
	for i := 0; i < o.workers; i++ {
		var ls []int
		for l := i; l < p.Layers; l += o.workers {
			ls = append(ls, l)
		}
		name := fmt.Sprintf("worker-%d", i)
		if _, err := slice.Cut(s.lm.f, ls, nil, filepath.Join(dir, "slice-"+strconv.Itoa(i))); err != nil {
			return nil, fmt.Errorf("cutting %s's slice: %w", name, err)
		}
		key, err := worker.LoadOrCreateKeyFile(filepath.Join(dir, name+".key"))
		if err != nil {
			return nil, err
		}
		s.names = append(s.names, name)
		s.layers = append(s.layers, ls)
		s.keys = append(s.keys, hex.EncodeToString(key.Public().(ed25519.PublicKey)))
	}
	quiet := slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if s.d, err = startDispatcher(s.lm, "127.0.0.1:0", quiet, minDeadlineTune(o.minDeadline)); err != nil {
		return nil, err
	}
	// The children are this very binary (under `go run` a temporary one),
	// so the demo needs nothing but itself.
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s.sw, err = demo.StartSwarm(ctx, demo.Config{Bin: bin, Dir: dir, Backbone: s.d.Addr(),
		RateNKVRPerByte: o.rate, Log: log})
	if err != nil {
		return nil, err
	}
	for i, name := range s.names {
		w, err := s.sw.AddWorker(name, filepath.Join(dir, "slice-"+strconv.Itoa(i)), "--threads", strconv.Itoa(o.workerThreads))
		if err != nil {
			return nil, err
		}
		s.workers = append(s.workers, w)
	}
	if err := s.d.WaitWorkers(ctx, o.workers); err != nil {
		tails := ""
		for _, w := range s.workers {
			tails += fmt.Sprintf("\n%s:\n%s", w.Name, w.Tail(10))
		}
		return nil, fmt.Errorf("waiting for %d workers: %w%s", o.workers, err, tails)
	}
	for _, w := range s.d.Stats().Workers {
		for i, k := range s.keys {
			if want := p.Experts * len(s.layers[i]); k == w.ID && w.Holdings != want {
				return nil, fmt.Errorf("%s: the dispatcher accepted %d of its %d experts", s.names[i], w.Holdings, want)
			}
		}
	}
	return s, nil
}

// Close stops the children and the dispatcher; safe on a partly started
// swarm and more than once.
func (s *demoSwarm) Close() {
	if s.sw != nil {
		s.sw.Close()
	}
	if s.d != nil {
		s.d.Close()
	}
	if s.lm != nil {
		s.lm.Close()
	}
}

// runDemo runs the whole demo and returns its result.
func runDemo(ctx context.Context, o demoOptions, stderr io.Writer) (_ *demoResult, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	dir := o.dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kvasir-demo-"); err != nil {
			return nil, err
		}
		defer os.RemoveAll(dir)
	} else {
		// A used directory would add its old ledger rows and credits to
		// this run's report.
		if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
			return nil, fmt.Errorf("--dir %s is not empty", dir)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
	}
	var log io.Writer = stderr
	if !o.verbose {
		lf, err := os.Create(filepath.Join(dir, "swarm.log"))
		if err != nil {
			return nil, err
		}
		defer lf.Close()
		log = lf
	}
	s, err := startDemoSwarm(ctx, o, dir, log)
	if err != nil {
		return nil, err
	}
	defer s.Close()

	opts := decodeOptions{prompt: o.prompt, maxTokens: o.maxTokens}
	s.lm.m.SetExperts(nil)
	local, err := decode(ctx, s.lm, opts, io.Discard)
	if err != nil {
		return nil, fmt.Errorf("local decode: %w", err)
	}
	s.lm.m.SetExperts(s.Experts())
	swarm, err := decode(ctx, s.lm, opts, io.Discard)
	s.lm.m.SetExperts(nil)
	if err != nil {
		return nil, fmt.Errorf("swarm decode: %w", err)
	}
	st := s.d.Stats()
	res := &demoResult{ModelID: s.lm.id, Prompt: o.prompt, Text: swarm.Text, Tokens: swarm.Tokens,
		LocalTokens: local.Tokens, TokensEqual: equalTokens(swarm.Tokens, local.Tokens),
		LogitsEqual: swarm.LogitsSHA256 == local.LogitsSHA256, LocalTokS: local.DecodeTokS,
		SwarmTokS: swarm.DecodeTokS, ExpertsRemote: st.ExpertsRemote, ExpertsLocal: st.ExpertsLocal,
		RateNKVRPerByte: o.rate}
	if o.dir != "" {
		res.Dir = o.dir
	}

	// End the sessions so that the hub writes their final rows, then wait
	// for the gateway to credit up to the last one.
	var sessions []string
	for _, w := range st.Workers {
		sessions = append(sessions, w.Session)
	}
	s.sw.StopWorkers(5 * time.Second)
	settled, err := s.sw.Settle(ctx, sessions)
	if err != nil {
		return nil, err
	}
	res.LedgerLastID = settled.LastID
	for i, name := range s.names {
		dw := demoWorker{Name: name, Pid: s.workers[i].Pid(), Layers: s.layers[i], ID: s.keys[i],
			Address: addressOf(s.keys[i]), Sessions: []workerJSON{}}
		for _, w := range workersJSON(s.d.Stats()) {
			if w.ID == dw.ID {
				dw.Sessions = append(dw.Sessions, w)
				dw.Rows += w.Rows
				dw.BytesIn += w.BytesIn
				dw.BytesOut += w.BytesOut
			}
		}
		for _, t := range settled.Ledger {
			if t.ID == dw.ID {
				dw.LedgerBytes, dw.RejectedBytes = t.Bytes, t.RejectedBytes
			}
		}
		for _, w := range settled.Wallets {
			if w.Worker == dw.ID {
				dw.CreditedBytes, dw.CreditedNKVR = w.Bytes, w.NKVR
			}
		}
		dw.CreditedKVR = walletapi.FormatKVR(dw.CreditedNKVR)
		res.Workers = append(res.Workers, dw)
	}
	return res, nil
}

func equalTokens(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// printDemo writes the demo's result for a person.
func printDemo(w io.Writer, r *demoResult) {
	yes := func(b bool) string {
		if b {
			return "yes"
		}
		return "NO"
	}
	fmt.Fprintf(w, "kvasir demo: loopback swarm (hub, TLS gateway, %d worker processes), model %s\n", len(r.Workers), r.ModelID)
	fmt.Fprintf(w, "prompt:  %q\n", r.Prompt)
	fmt.Fprintf(w, "text:    %q\n", r.Text)
	fmt.Fprintf(w, "tokens equal to a local decode: %s (%d tokens; logits bit-identical: %s)\n",
		yes(r.TokensEqual), len(r.Tokens), yes(r.LogitsEqual))
	fmt.Fprintf(w, "experts: %d computed by workers, %d locally\n", r.ExpertsRemote, r.ExpertsLocal)
	ratio := 0.0
	if r.LocalTokS > 0 {
		ratio = r.SwarmTokS / r.LocalTokS
	}
	fmt.Fprintf(w, "decode:  local %.1f tok/s, swarm %.1f tok/s (%.2fx; each MoE layer is a loopback round trip through gateway and hub)\n",
		r.LocalTokS, r.SwarmTokS, ratio)
	for _, x := range r.Workers {
		ls := make([]string, len(x.Layers))
		for i, l := range x.Layers {
			ls[i] = strconv.Itoa(l)
		}
		fmt.Fprintf(w, "%s (pid %d, layers %s, %s): rows %d, bytes in %d out %d", x.Name, x.Pid,
			strings.Join(ls, ","), x.Address, x.Rows, x.BytesIn, x.BytesOut)
		for _, s := range x.Sessions {
			fmt.Fprintf(w, ", rtt p50 %.2f ms p99 %.2f ms", s.RTTp50ms, s.RTTp99ms)
		}
		fmt.Fprintf(w, "\n    ledger %d creditable bytes (%s units, %d rejected) -> credited %s (%d nKVR at %d nKVR/byte)\n",
			x.LedgerBytes, walletapi.FormatUnits(x.LedgerBytes), x.RejectedBytes, x.CreditedKVR, x.CreditedNKVR, r.RateNKVRPerByte)
	}
	if r.Dir != "" {
		fmt.Fprintf(w, "files:   %s (backbone ledger --db %s; backbone wallets --db %s)\n", r.Dir,
			filepath.Join(r.Dir, "ledger.sqlite"), filepath.Join(r.Dir, "wallets.sqlite"))
	}
}
