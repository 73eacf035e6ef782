package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

func init() {
	register("generate", "decode a prompt on a GGUF model (default: the embedded tiny model), experts local or over the swarm", func(args []string) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return generateMainContext(ctx, args, os.Stdout, os.Stderr)
	})
}

// generateResult is the --json output of generate.
type generateResult struct {
	PromptTokens []int32 `json:"prompt_tokens"`
	Tokens       []int32 `json:"tokens"`
	Text         string  `json:"text"`          // decoded tokens; invalid UTF-8 bytes become U+FFFD
	PrefillTokS  float64 `json:"prefill_tok_s"` // prompt tokens / prefill seconds
	DecodeTokS   float64 `json:"decode_tok_s"`  // single-token forward passes / their seconds
	// LogitsSHA256 is the hex SHA-256 over every logits vector the decode
	// computed (prefill's last row, then each step's; vocab float32 each,
	// little-endian): equal hashes mean bit-identical logits.
	LogitsSHA256 string `json:"logits_sha256"`
	// MaxStepMs is the longest single-token forward pass, ms (a stall shows
	// here).
	MaxStepMs float64 `json:"max_step_ms"`

	// With --dispatch-listen only (swarm decode):
	ExpertsRemote *uint64      `json:"experts_remote,omitempty"` // (row, slot) expert outputs computed by workers
	ExpertsLocal  *uint64      `json:"experts_local,omitempty"`  // (row, slot) outputs computed here (unheld, failed or late)
	Workers       []workerJSON `json:"workers,omitempty"`        // one entry per worker session, live ones first
}

// workerJSON is one worker session in generate's and demo's JSON, from the
// dispatcher's dispatch.WorkerStats. Bytes are whole messages of the session
// (control frames included), as the backbone counted them.
type workerJSON struct {
	ID        string  `json:"id"`      // hex ed25519 public key
	Session   string  `json:"session"` // hub session id
	Connected bool    `json:"connected"`
	Reason    string  `json:"reason,omitempty"` // why an ended session ended
	Holdings  int     `json:"holdings"`         // (layer, expert) pairs accepted
	Requests  uint64  `json:"requests"`         // DISPATCH frames sent
	Rows      uint64  `json:"rows"`             // hidden rows in accepted RESULTs
	Pairs     uint64  `json:"pairs"`            // (row, slot) outputs accepted
	Timeouts  uint64  `json:"timeouts"`         // requests past their deadline
	BytesIn   uint64  `json:"bytes_in"`         // worker -> backbone
	BytesOut  uint64  `json:"bytes_out"`        // backbone -> worker
	RTTp50ms  float64 `json:"rtt_p50_ms"`
	RTTp99ms  float64 `json:"rtt_p99_ms"`
}

func workersJSON(st dispatch.Stats) []workerJSON {
	out := make([]workerJSON, 0, len(st.Workers))
	for _, w := range st.Workers {
		out = append(out, workerJSON{ID: w.ID, Session: w.Session, Connected: w.Connected, Reason: w.Reason,
			Holdings: w.Holdings, Requests: w.Requests, Rows: w.Rows, Pairs: w.Pairs, Timeouts: w.Timeouts,
			BytesIn: w.BytesIn, BytesOut: w.BytesOut, RTTp50ms: w.RTTp50ms, RTTp99ms: w.RTTp99ms})
	}
	return out
}

// generateMain is generateMainContext without cancellation.
func generateMain(args []string, stdout, stderr io.Writer) int {
	return generateMainContext(context.Background(), args, stdout, stderr)
}

// generateMainContext implements
//
//	backbone generate [--model FILE] --prompt TEXT --max-tokens N --temperature 0
//	                  [--top-k K --top-p P --seed S --threads T] [--json]
//	                  [--dispatch-listen ADDR --wait-workers N --wait-timeout 2m --min-deadline D
//	                   --provision --provision-rate BYTES]
//
// writing text (or the JSON object) to stdout and diagnostics to stderr; it
// returns the exit code (2: bad usage, 1: failure). With --dispatch-listen
// the experts are computed by the swarm: a dispatcher listens on ADDR for
// the hub's worker links (it prints "generate: dispatch listening on
// HOST:PORT" to stderr; port 0 picks one), the decode starts once
// --wait-workers workers are connected, and whatever no worker holds is
// computed locally. With --provision, workers that announce a quota are
// assigned experts and download them from the model file (swarmFlags).
func generateMainContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modelPath := fs.String("model", "", "GGUF model file (default: the embedded tiny model)")
	prompt := fs.String("prompt", "The capital of France is", "prompt text")
	maxTokens := fs.Int("max-tokens", 32, "tokens to generate")
	temp := fs.Float64("temperature", 0, "sampling temperature; 0 = greedy")
	topK := fs.Int("top-k", 0, "keep the K most likely tokens (0: all)")
	topP := fs.Float64("top-p", 1, "nucleus sampling threshold (1: off)")
	seed := fs.Uint64("seed", 0, "sampling seed")
	threads := fs.Int("threads", 0, "goroutines for matrix products (0: all CPUs)")
	special := fs.Bool("special", false, "parse special-token text (e.g. <|im_start|>) in the prompt")
	asJSON := fs.Bool("json", false, "print one JSON object instead of streaming text")
	dispatchListen := fs.String("dispatch-listen", "", "compute experts over the swarm: listen here (LAN host:port) for the hub's worker links")
	waitWorkers := fs.Int("wait-workers", 0, "with --dispatch-listen: wait for N workers before decoding")
	waitTimeout := fs.Duration("wait-timeout", 2*time.Minute, "how long --wait-workers waits")
	sf := addSwarmFlags(fs)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if err := sf.check(); err != nil {
		fmt.Fprintln(stderr, "generate:", err)
		return 2
	}
	var bad string
	switch {
	case fs.NArg() != 0:
		bad = fmt.Sprintf("unexpected arguments %q (quote the prompt: --prompt \"...\")", fs.Args())
	case *maxTokens < 0:
		bad = fmt.Sprintf("--max-tokens %d: want >= 0", *maxTokens)
	case *waitWorkers < 0:
		bad = fmt.Sprintf("--wait-workers %d: want >= 0", *waitWorkers)
	case !(*temp >= 0) || math.IsInf(*temp, 0):
		bad = fmt.Sprintf("--temperature %v: want a finite value >= 0 (0 = greedy)", *temp)
	case !(*topP > 0 && *topP <= 1):
		bad = fmt.Sprintf("--top-p %v: want 0 < p <= 1", *topP)
	case *topK < 0:
		bad = fmt.Sprintf("--top-k %d: want >= 0 (0 = all)", *topK)
	case *threads < 0:
		bad = fmt.Sprintf("--threads %d: want >= 0 (0 = all CPUs)", *threads)
	}
	if bad != "" {
		fmt.Fprintln(stderr, "generate:", bad)
		return 2
	}
	if *waitWorkers > 0 && *dispatchListen == "" {
		fmt.Fprintln(stderr, "generate: --wait-workers needs --dispatch-listen")
		return 2
	}
	out := stdout
	if *asJSON {
		out = io.Discard
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "generate:", err)
		return 1
	}
	lm, err := loadGenModel(*modelPath)
	if err != nil {
		return fail(err)
	}
	defer lm.Close()
	lm.m.SetThreads(*threads)
	var d *dispatch.Dispatcher
	if *dispatchListen != "" {
		log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		if d, err = startSwarm(ctx, "generate", lm, *dispatchListen, sf, *waitWorkers, *waitTimeout, log, stderr); err != nil {
			return fail(err)
		}
		defer d.Close()
		lm.m.SetExperts(d)
	}
	res, err := decode(ctx, lm, decodeOptions{prompt: *prompt, maxTokens: *maxTokens, special: *special,
		sampler: model.SamplerOptions{Temperature: float32(*temp), TopK: *topK, TopP: float32(*topP), Seed: *seed}}, out)
	if err != nil {
		return fail(err)
	}
	if d != nil {
		st := d.Stats()
		res.ExpertsRemote, res.ExpertsLocal, res.Workers = &st.ExpertsRemote, &st.ExpertsLocal, workersJSON(st)
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return fail(err)
		}
		return 0
	}
	fmt.Fprintf(stdout, "\n\nprefill: %d tokens, %.1f tok/s; decode: %d tokens, %.1f tok/s\n",
		len(res.PromptTokens), res.PrefillTokS, len(res.Tokens), res.DecodeTokS)
	if d != nil {
		fmt.Fprintf(stdout, "experts: %d remote, %d local\n", *res.ExpertsRemote, *res.ExpertsLocal)
		for _, w := range res.Workers {
			fmt.Fprintf(stdout, "worker %.16s… rows %d, bytes in %d out %d, rtt p50 %.2f ms p99 %.2f ms\n",
				w.ID, w.Rows, w.BytesIn, w.BytesOut, w.RTTp50ms, w.RTTp99ms)
		}
	}
	return 0
}

// loadedModel is a model ready to decode, with what the swarm needs to
// know about it.
type loadedModel struct {
	f   *gguf.File
	m   *model.Model
	tok *tokenizer.Tokenizer
	id  string // slice.ModelID(f): what workers announce in HELLO
}

func (l *loadedModel) Close() error { return l.f.Close() }

// loadGenModel opens path (mapped), or the embedded tiny model when path
// is "", and loads model and tokenizer.
func loadGenModel(path string) (*loadedModel, error) {
	f, err := openModelFile(path)
	if err != nil {
		return nil, err
	}
	lm, err := loadGenModelFile(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return lm, nil
}

// openModelFile opens the GGUF file at path (mapped), or parses the
// embedded tiny model (engine/modelgen.Tiny) when path is "". Errors are
// those of gguf.Open, gguf.Parse or modelgen.Tiny.
func openModelFile(path string) (*gguf.File, error) {
	if path != "" {
		return gguf.Open(path)
	}
	data, err := modelgen.Tiny()
	if err != nil {
		return nil, err
	}
	return gguf.Parse(data)
}

// loadGenModelFile loads model and tokenizer from the open file f, which
// the result's Close closes (on error the caller still owns f).
func loadGenModelFile(f *gguf.File) (*loadedModel, error) {
	m, err := model.Load(f)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, err
	}
	id, _ := slice.ModelID(f)
	return &loadedModel{f: f, m: m, tok: tok, id: id}, nil
}

// startDispatcher starts a dispatch.Dispatcher for lm on listen: it accepts
// workers announcing lm's model id (slice.ModelID), uses a holding only if
// its hash equals the SHA-256 of lm's own expert bytes (slice.HashExpert,
// computed once per expert on first use), and computes locally with lm's
// experts whatever no worker delivers. tune, if set, may change the config
// (deadlines) before New. The caller installs it with lm.m.SetExperts and
// closes it.
func startDispatcher(lm *loadedModel, listen string, log *slog.Logger, tune func(*dispatch.Config)) (*dispatch.Dispatcher, error) {
	p := lm.m.Params()
	local := lm.m.LocalExperts()
	var mu sync.Mutex
	hashes := map[[2]int][32]byte{}
	cfg := dispatch.Config{Listen: listen, Fallback: local, Logger: log,
		Model: dispatch.Model{ID: lm.id, D: p.Embd, K: p.ExpertsUsed, NLayer: p.Layers, NExpert: p.Experts},
		ExpertHash: func(l, e int) ([32]byte, bool) {
			if l < 0 || l >= local.NumLayers() {
				return [32]byte{}, false
			}
			mu.Lock()
			defer mu.Unlock()
			if h, ok := hashes[[2]int{l, e}]; ok {
				return h, true
			}
			h, ok := slice.HashExpert(local.Layer(l), e)
			if ok {
				hashes[[2]int{l, e}] = h
			}
			return h, ok
		}}
	if tune != nil {
		tune(&cfg)
	}
	d, err := dispatch.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := d.Start(); err != nil {
		return nil, err
	}
	return d, nil
}

// startSwarm starts the dispatcher of --dispatch-listen for lm
// (startDispatcher with sf's tune), prints "CMD: dispatch listening on
// HOST:PORT (model id ...)" to stderr and, for wait > 0, waits up to
// timeout for that many workers. Errors: those of sf.tune and
// startDispatcher, or "waiting for N workers" wrapping WaitWorkers'; on
// error nothing is left running. The caller closes the dispatcher.
func startSwarm(ctx context.Context, cmd string, lm *loadedModel, listen string, sf *swarmFlags, wait int,
	timeout time.Duration, log *slog.Logger, stderr io.Writer) (*dispatch.Dispatcher, error) {
	tune, err := sf.tune(lm)
	if err != nil {
		return nil, err
	}
	d, err := startDispatcher(lm, listen, log, tune)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(stderr, "%s: dispatch listening on %s (model id %q)\n", cmd, d.Addr(), lm.id)
	if wait > 0 {
		wctx, cancel := context.WithTimeout(ctx, timeout)
		err := d.WaitWorkers(wctx, wait)
		cancel()
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("waiting for %d workers: %w", wait, err)
		}
	}
	return d, nil
}

// minDeadlineTune returns a startDispatcher tune that sets
// dispatch.Config.MinDeadline to d (and MaxDeadline to at least d); nil for
// d <= 0 (the defaults).
func minDeadlineTune(d time.Duration) func(*dispatch.Config) {
	if d <= 0 {
		return nil
	}
	return func(c *dispatch.Config) {
		c.MinDeadline = d
		c.MaxDeadline = max(c.MaxDeadline, d, 5*time.Second)
	}
}

// swarmFlags are the dispatcher flags that generate, serve and demo share:
// the deadline floor and provisioning (issue 6).
type swarmFlags struct {
	minDeadline time.Duration
	provision   bool
	rate        string // --provision-rate as given
	rateBytes   int64  // parsed by check: bytes/s, 0 unlimited
}

// addSwarmFlags registers --min-deadline, --provision and --provision-rate
// on fs.
func addSwarmFlags(fs *flag.FlagSet) *swarmFlags {
	sf := &swarmFlags{}
	fs.DurationVar(&sf.minDeadline, "min-deadline", 0, "with a swarm: lower bound of a worker request's adaptive deadline (0: dispatch's 50 ms; raise it on a loaded machine to keep slow answers remote)")
	fs.BoolVar(&sf.provision, "provision", false, "with a swarm: provision workers started with --quota (and an empty --slice dir): assign them experts and send the experts' bytes from the model file")
	fs.StringVar(&sf.rate, "provision-rate", "0", "with --provision: bytes/s of expert data sent to one worker, with optional KiB/MiB/GiB suffix (0: unlimited)")
	return sf
}

// check validates the parsed flags; the error names the bad flag.
func (sf *swarmFlags) check() error {
	n, err := parseBytes(sf.rate)
	if err != nil {
		return fmt.Errorf("--provision-rate: %w", err)
	}
	sf.rateBytes = n
	return nil
}

// tune returns the startDispatcher config change the flags ask for (nil:
// none): MinDeadline as minDeadlineTune, and with --provision a
// dispatch.Config.Catalog over lm's model file (slice.NewCatalog; lm.f must
// stay open while the dispatcher runs) with RateLimit --provision-rate.
// Errors are those of slice.NewCatalog.
func (sf *swarmFlags) tune(lm *loadedModel) (func(*dispatch.Config), error) {
	dl := minDeadlineTune(sf.minDeadline)
	if !sf.provision {
		return dl, nil
	}
	cat, err := slice.NewCatalog(lm.f)
	if err != nil {
		return nil, fmt.Errorf("provisioning catalog: %w", err)
	}
	rate := float64(sf.rateBytes)
	return func(c *dispatch.Config) {
		if dl != nil {
			dl(c)
		}
		c.Catalog, c.RateLimit = cat, rate
	}, nil
}

// decodeOptions are the per-decode settings of decode.
type decodeOptions struct {
	prompt    string
	maxTokens int
	special   bool
	sampler   model.SamplerOptions
	// onToken, if set, is called after each sampled token (i counts from 0)
	// before the next forward pass.
	onToken func(i int, tok int32)
}

// decode prefills the prompt in one batch on a new sequence of lm, then
// samples and feeds back one token at a time until maxTokens, an
// end-of-generation token or the context length, streaming complete UTF-8
// text to out. The model's experts are whatever lm.m has installed.
func decode(ctx context.Context, lm *loadedModel, o decodeOptions, out io.Writer) (*generateResult, error) {
	m, tok := lm.m, lm.tok
	res := &generateResult{PromptTokens: tok.Tokenize(o.prompt, true, o.special), Tokens: []int32{}}
	if len(res.PromptTokens) == 0 {
		return nil, errors.New("the prompt encodes to no tokens")
	}
	h := sha256.New()
	res.LogitsSHA256 = hex.EncodeToString(h.Sum(nil))
	if o.maxTokens == 0 {
		return res, nil
	}
	vocab := m.Params().Vocab
	logits := make([]float32, vocab)
	raw := make([]byte, 4*vocab)
	hashLogits := func() {
		for i, v := range logits {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
		}
		h.Write(raw)
	}
	seq := m.NewSequence()
	rows := make([]model.Row, len(res.PromptTokens))
	for i, t := range res.PromptTokens {
		rows[i] = model.Row{Seq: seq, Token: t, Pos: i, Logits: i == len(rows)-1}
	}
	start := time.Now()
	if err := m.Forward(ctx, rows, logits); err != nil {
		return nil, err
	}
	res.PrefillTokS = float64(len(rows)) / time.Since(start).Seconds()
	hashLogits()

	sampler := model.NewSampler(o.sampler)
	dec := tok.NewDecoder(false)
	decodeSteps := 0
	var decodeTime, maxStep time.Duration
	for {
		next := sampler.Sample(logits)
		res.Tokens = append(res.Tokens, next)
		if _, err := io.WriteString(out, dec.Add(next)); err != nil {
			return nil, err
		}
		if o.onToken != nil {
			o.onToken(len(res.Tokens)-1, next)
		}
		if len(res.Tokens) >= o.maxTokens || tok.IsEOG(next) || seq.Len() >= m.Params().Context {
			break
		}
		row := []model.Row{{Seq: seq, Token: next, Pos: seq.Len(), Logits: true}}
		t0 := time.Now()
		if err := m.Forward(ctx, row, logits); err != nil {
			return nil, err
		}
		step := time.Since(t0)
		decodeTime += step
		maxStep = max(maxStep, step)
		decodeSteps++
		hashLogits()
	}
	if _, err := io.WriteString(out, dec.Flush()); err != nil {
		return nil, err
	}
	res.Text = tok.Decode(res.Tokens)
	res.LogitsSHA256 = hex.EncodeToString(h.Sum(nil))
	res.MaxStepMs = float64(maxStep) / 1e6
	if decodeSteps > 0 {
		res.DecodeTokS = float64(decodeSteps) / decodeTime.Seconds()
	}
	return res, nil
}
