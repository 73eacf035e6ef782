package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/backbone/serve"
	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

func init() {
	register("demo", "a loopback swarm (hub, TLS gateway, worker processes) decoding the embedded tiny model", func(args []string) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return demoMain(ctx, args, os.Stdout, os.Stderr)
	})
}

// demoMain implements
//
//	backbone demo [--prompt P] [--max-tokens 32] [--workers 2] [--json] [--dir DIR] [--verbose]
//	              [--min-deadline D] [--provision [--provision-rate BYTES]] [--capacity]
//	              [--serve [--http 127.0.0.1:8080] [--api-key KEY] [--serve-requests N]]
//
// On loopback it writes the embedded tiny model to a temporary directory,
// cuts one slice per worker (layer l goes to worker l mod --workers),
// starts a hub (with a ledger), a gateway (self-signed TLS, crediting) and
// the workers as child processes of this binary, and a dispatcher here;
// decodes the prompt with local experts, then with every expert over the
// swarm; stops the workers, waits for the hub's final ledger rows and the
// gateway's crediting, and prints the text, whether the tokens (and
// logits) equal the local decode, tok/s of both, bytes and credited KVR per
// worker. With --provision the workers start with an empty slice folder
// and a quota instead, and download the experts the dispatcher assigns
// them before the decode. With --capacity (implies --provision) the
// backbone loads a backbone-only file of the model (no routed expert here)
// and the workers, with a quota for two copies of every expert between
// them, download theirs from a loopback HTTP server of the full file (the
// model source) before the decode; the local reference decode runs on the
// full file. With --serve there is no decode: the swarm
// serves the OpenAI-compatible API (demo.Serve). The demo itself is
// backbone/demo (Run, Serve, Print); this parses its flags. Every child is stopped
// before it returns, also on ctx's end (Ctrl-C). Exit code: 0, 1 on
// failure or if the tokens differ, 2 on bad usage.
func demoMain(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o demo.Options
	var asJSON, serveAPI bool
	fs.StringVar(&o.Prompt, "prompt", demomodel.DefaultPrompt, "prompt text")
	fs.IntVar(&o.MaxTokens, "max-tokens", 32, "tokens to generate")
	fs.IntVar(&o.Workers, "workers", 2, "worker processes; layer l is served by worker l mod N (--verify quorum: every worker serves every layer)")
	fs.IntVar(&o.WorkerThreads, "worker-threads", 1, "compute threads per worker")
	fs.IntVar(&o.Threads, "threads", 0, "backbone goroutines for matrix products (0: all CPUs)")
	fs.Uint64Var(&o.Rate, "rate-nkvr-per-byte", walletapi.DefaultRateNKVRPerByte, "the gateway's price in nKVR per creditable byte")
	fs.StringVar(&o.Dir, "dir", "", "keep the demo's files (model, slices, ledger, wallets, keys, logs) in DIR, new or empty (default: a temporary directory, removed)")
	fs.BoolVar(&o.Verbose, "verbose", false, "copy the children's logs to stderr")
	fs.BoolVar(&asJSON, "json", false, "print one JSON object")
	fs.DurationVar(&o.Timeout, "timeout", 3*time.Minute, "give up after this long")
	o.Swarm = run.AddSwarmFlags(fs)
	fs.BoolVar(&serveAPI, "serve", false, "instead of one decode: serve the OpenAI-compatible API over the swarm until Ctrl-C")
	fs.BoolVar(&o.Capacity, "capacity", false, "the backbone loads a backbone-only file (no routed experts) and the workers download theirs from a loopback HTTP model source: every expert remote, replicated twice, verified by replica comparison")
	o.API = run.APIOptions{ChatTemplate: "auto", MaxBatch: serve.DefaultMaxBatchRows, MaxSeqs: serve.DefaultMaxSeqs,
		Queue: serve.DefaultQueueSize}
	fs.StringVar(&o.API.HTTPAddr, "http", "127.0.0.1:8080", "with --serve: HTTP listen address of the API (port 0: any free port)")
	fs.StringVar(&o.API.APIKey, "api-key", os.Getenv("KVASIR_API_KEY"), "with --serve: require 'Authorization: Bearer KEY' on /v1/ (default $KVASIR_API_KEY; empty: open)")
	fs.IntVar(&o.API.Requests, "serve-requests", 0, "with --serve: stop after this many completion requests (0: serve until interrupted)")
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	bad := ""
	switch {
	case fs.NArg() != 0:
		bad = fmt.Sprintf("unexpected arguments %q", fs.Args())
	case o.MaxTokens < 1:
		bad = fmt.Sprintf("--max-tokens %d: want >= 1", o.MaxTokens)
	case o.Workers < 1:
		bad = fmt.Sprintf("--workers %d: want >= 1", o.Workers)
	case o.Rate == 0:
		bad = "--rate-nkvr-per-byte 0: want >= 1"
	case o.API.Requests < 0:
		bad = fmt.Sprintf("--serve-requests %d: want >= 0", o.API.Requests)
	}
	if bad != "" {
		fmt.Fprintln(stderr, "demo:", bad)
		return 2
	}
	if err := o.Swarm.Check(); err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 2
	}
	if o.Capacity {
		o.Swarm.Provision = true
	}
	if serveAPI {
		if err := demo.Serve(ctx, o, stdout, stderr); err != nil {
			fmt.Fprintln(stderr, "demo:", err)
			return 1
		}
		return 0
	}
	res, err := demo.Run(ctx, o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "demo:", err)
		return 1
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(stderr, "demo:", err)
			return 1
		}
	} else {
		demo.Print(stdout, res)
	}
	if !res.TokensEqual {
		return 1
	}
	return 0
}
