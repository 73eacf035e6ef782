package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/config"
	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/spec"
)

func init() {
	register("generate", "decode a prompt on a GGUF model (default: the embedded tiny model), experts local or over the swarm", func(args []string) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return generateMainContext(ctx, args, os.Stdout, os.Stderr)
	})
}

// generateResult is the --json output of generate: the decode's
// run.Result (prompt_tokens, tokens, text, prefill_tok_s, decode_tok_s,
// logits_sha256, max_step_ms), the process's memory, then the swarm's
// counts.
type generateResult struct {
	run.Result

	// RSSBytes and PeakRSSBytes are the process's resident set size at the
	// end of the decode and its peak (Linux /proc; 0 elsewhere): the
	// backbone's memory, mapped model pages included.
	RSSBytes     int64 `json:"rss_bytes"`
	PeakRSSBytes int64 `json:"peak_rss_bytes"`
	// Resident is how the weights were kept in memory (--resident): mode
	// (mmap, lock, copy) and bytes made resident.
	Resident struct {
		Mode  string `json:"mode"`
		Bytes uint64 `json:"bytes"`
	} `json:"resident"`

	// With --dispatch-listen only (swarm decode):
	ExpertsRemote *uint64          `json:"experts_remote,omitempty"` // (row, slot) expert outputs computed by workers
	ExpertsLocal  *uint64          `json:"experts_local,omitempty"`  // (row, slot) outputs computed here (unheld, failed or late)
	Workers       []run.WorkerJSON `json:"workers,omitempty"`        // one entry per worker session, live ones first
	Verify        string           `json:"verify,omitempty"`         // the verification policy (--verify)
	SumRequests   *uint64          `json:"sum_requests,omitempty"`   // DISPATCH_SUMs sent (--row-sums): rows answered with their weighted sum
	SumRows       *uint64          `json:"sum_rows,omitempty"`       // rows in them
	// SpinThreads and SpinCPUSeconds: the threads that kept the CPUs
	// spinning while steps waited for workers (--spin-wait; 0 when off)
	// and their CPU time, seconds (SCHED_IDLE: time nothing else wanted).
	SpinThreads    *int     `json:"spin_threads,omitempty"`
	SpinCPUSeconds *float64 `json:"spin_cpu_seconds,omitempty"`
}

// generateMain is generateMainContext without cancellation.
func generateMain(args []string, stdout, stderr io.Writer) int {
	return generateMainContext(context.Background(), args, stdout, stderr)
}

// generateMainContext implements
//
//	backbone generate [--model FILE] --prompt TEXT --max-tokens N --temperature 0
//	                  [--top-k K --top-p P --seed S --threads T] [--json]
//	                  [--draft none|ngram|mtp --draft-max K]
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
// assigned experts and download them from the model file (run.SwarmFlags).
// A backbone-only --model (backbone slice --backbone-only) needs
// --dispatch-listen: its experts are computed only by workers, and a step
// that finds no worker holding an expert waits --holder-wait, then fails
// the decode with an error naming the layer and experts (exit 1).
// --draft speculates (package spec): each forward verifies up to
// --draft-max drafted tokens, with the same output as without; --json
// reports drafted_tokens, accepted_tokens and decode_forwards.
// Loading, the swarm and the decode loop are package run's (backbone/run).
func generateMainContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modelPath := fs.String("model", "", "GGUF model file (default: the embedded tiny model)")
	resident := run.AddResidentFlag(fs)
	prompt := fs.String("prompt", demomodel.DefaultPrompt, "prompt text")
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
	draftFlag := fs.String("draft", "none", "speculative drafts verified per forward: none, ngram (prompt lookup) or mtp (the model's multi-token-prediction head); the output is the same")
	draftMax := fs.Int("draft-max", spec.DefaultMax, "with --draft: most draft tokens per forward")
	sf := run.AddSwarmFlags(fs)
	if err := config.Parse(fs, "generate", args, stdout); err != nil {
		if errors.Is(err, config.ErrPrinted) || errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := sf.Check(); err != nil {
		fmt.Fprintln(stderr, "generate:", err)
		return 2
	}
	draft, derr := spec.ParseMode(*draftFlag)
	var bad string
	switch {
	case derr != nil:
		bad = "--draft: " + derr.Error()
	case *draftMax < 1 || *draftMax > spec.MaxMax:
		bad = fmt.Sprintf("--draft-max %d: want 1 to %d", *draftMax, spec.MaxMax)
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
	case run.CheckResident(*resident) != nil:
		bad = run.CheckResident(*resident).Error()
	}
	if bad != "" {
		fmt.Fprintln(stderr, "generate:", bad)
		return 2
	}
	if *waitWorkers > 0 && *dispatchListen == "" {
		fmt.Fprintln(stderr, "generate: --wait-workers needs --dispatch-listen")
		return 2
	}
	// Flags that would do nothing: say so rather than ignore them.
	fs.Visit(func(f *flag.Flag) {
		switch {
		case f.Name == "draft-max" && (draft == "" || draft == spec.ModeNone):
			fmt.Fprintln(stderr, "generate: warning: --draft-max has no effect without --draft ngram or mtp")
		case f.Name == "verify" && *dispatchListen == "":
			fmt.Fprintln(stderr, "generate: warning: --verify has no effect without a swarm (--dispatch-listen): every expert is computed here")
		case f.Name == "threads" && *threads > runtime.GOMAXPROCS(0):
			fmt.Fprintf(stderr, "generate: warning: --threads %d is more than the %d CPUs this process may use: the goroutines take turns and the decode slows down (0 = all CPUs)\n",
				*threads, runtime.GOMAXPROCS(0))
		}
	})
	out := stdout
	if *asJSON {
		out = io.Discard
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "generate:", err)
		return 1
	}
	lm, err := run.Load(*modelPath)
	if err != nil {
		return fail(err)
	}
	defer lm.Close()
	rr, err := lm.Resident(*resident, slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})))
	if err != nil {
		return fail(err)
	}
	lm.Engine().SetThreads(*threads)
	if *dispatchListen == "" {
		if err := lm.CheckLocal(); err != nil {
			return fail(err)
		}
	}
	var d *dispatch.Dispatcher
	if *dispatchListen != "" {
		log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		sc := sf.Config(*dispatchListen, log)
		sc.Workers, sc.Listening = *waitWorkers, run.AnnounceListening(stderr, "generate", lm)
		wctx, cancel := context.WithTimeout(ctx, *waitTimeout)
		d, err = run.StartSwarm(wctx, lm, sc)
		cancel()
		if err != nil {
			return fail(err)
		}
		defer d.Close()
		lm.Engine().SetExperts(d)
	}
	dr, err := run.Decode(ctx, lm, run.DecodeOptions{Prompt: *prompt, MaxTokens: *maxTokens, Special: *special,
		Sampler: model.SamplerOptions{Temperature: float32(*temp), TopK: *topK, TopP: model.TopP32(*topP), Seed: *seed},
		Draft:   draft, DraftMax: *draftMax}, out)
	if err != nil {
		return fail(err)
	}
	res := &generateResult{Result: *dr}
	res.RSSBytes, res.PeakRSSBytes = run.ProcessRSS()
	res.Resident.Mode, res.Resident.Bytes = string(rr.Mode), rr.Bytes
	if d != nil {
		st := d.Stats()
		res.ExpertsRemote, res.ExpertsLocal, res.Workers, res.Verify = &st.ExpertsRemote, &st.ExpertsLocal, run.WorkersJSON(st), string(st.Verify)
		res.SumRequests, res.SumRows = &st.SumRequests, &st.SumRows
		spinSecs := st.SpinCPU.Seconds()
		res.SpinThreads, res.SpinCPUSeconds = &st.SpinThreads, &spinSecs
	}
	if *asJSON {
		if err := json.NewEncoder(stdout).Encode(res); err != nil {
			return fail(err)
		}
		return 0
	}
	fmt.Fprintf(stdout, "\n\nprefill: %d tokens, %.1f tok/s; decode: %d tokens, %.1f tok/s\n",
		len(res.PromptTokens), res.PrefillTokS, len(res.Tokens), res.DecodeTokS)
	if res.Finish == "context" {
		fmt.Fprintf(stdout, "stopped at the model's context length (%d positions, the prompt included)\n", len(res.PromptTokens)+len(res.Tokens)-1)
	}
	if res.Draft != spec.ModeNone {
		fmt.Fprintf(stdout, "drafts (%s): %d drafted, %d accepted (%.0f%%), %d forwards\n",
			res.Draft, res.Drafted, res.Accepted, 100*res.AcceptRate(), res.Forwards)
	}
	if d != nil {
		fmt.Fprintf(stdout, "experts: %d remote, %d local (verify: %s)\n", *res.ExpertsRemote, *res.ExpertsLocal, res.Verify)
		for _, w := range res.Workers {
			fmt.Fprintf(stdout, "worker %.16s… rows %d, bytes in %d out %d, rtt p50 %.2f ms p99 %.2f ms\n",
				w.ID, w.Rows, w.BytesIn, w.BytesOut, w.RTTp50ms, w.RTTp99ms)
		}
	}
	return 0
}
