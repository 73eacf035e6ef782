package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/config"
	"github.com/kvasir-ai/kvasir/backbone/run"
)

func init() {
	register("serve", "OpenAI-compatible HTTP API with continuous batching (experts local or over the swarm)", func(args []string) int {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		go func() { <-ctx.Done(); stop() }() // a second signal ends the process at once
		return serveMain(ctx, args, os.Stderr, nil)
	})
}

// serveMain runs backbone serve until ctx ends:
//
//	backbone serve [--model FILE] [--http 127.0.0.1:8080] [--dispatch-listen ADDR [--wait-workers N]
//	               [--min-deadline D] [--provision [--provision-rate BYTES]]]
//	               [--model-id ID] [--api-key KEY] [--chat-template auto|chatml|none]
//	               [--max-batch 512] [--max-seqs 512] [--queue 1024] [--threads N] [--lanes 0]
//
// --model-id is the name of the API (/v1/models, requests' "model");
// workers always announce the model file's slice.ModelID. ready, if set,
// is called with the bound HTTP address once it accepts requests. It
// returns the process exit code: 2 for bad flags, 1 for failures.
func serveMain(ctx context.Context, args []string, stderr io.Writer, ready func(httpAddr string)) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o run.APIOptions
	so := run.SwarmOptions{Command: "serve"}
	fs.StringVar(&o.ModelPath, "model", "", "GGUF model file (default: the embedded tiny model)")
	resident := run.AddResidentFlag(fs)
	fs.StringVar(&o.HTTPAddr, "http", "127.0.0.1:8080", "HTTP listen address of the API")
	fs.StringVar(&o.ModelID, "model-id", "", "model name served by /v1/models and accepted in requests (default: general.name); workers announce the file's slice model id regardless")
	fs.StringVar(&so.Listen, "dispatch-listen", "", "serve experts over the swarm: listen here for the hub's worker links (LAN address)")
	fs.IntVar(&so.Workers, "wait-workers", 0, "with --dispatch-listen: wait for N workers before serving")
	fs.DurationVar(&so.Wait, "wait-timeout", 5*time.Minute, "how long --wait-workers waits")
	fs.IntVar(&o.Threads, "threads", 0, "goroutines for matrix products (0: all CPUs)")
	run.AddAPIFlags(fs, &o)
	so.Flags = run.AddSwarmFlags(fs)
	if err := config.Parse(fs, "serve", args, os.Stdout); err != nil {
		if errors.Is(err, config.ErrPrinted) || errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if err := o.Check(); err != nil {
		fmt.Fprintln(stderr, "serve:", err)
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "serve: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if so.Workers < 0 {
		fmt.Fprintf(stderr, "serve: --wait-workers %d: want >= 0\n", so.Workers)
		return 2
	}
	if err := so.Flags.Check(); err != nil {
		fmt.Fprintln(stderr, "serve:", err)
		return 2
	}
	if err := run.CheckResident(*resident); err != nil {
		fmt.Fprintln(stderr, "serve:", err)
		return 2
	}
	if so.Workers > 0 && so.Listen == "" {
		fmt.Fprintln(stderr, "serve: --wait-workers needs --dispatch-listen")
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	if n := runtime.GOMAXPROCS(0); o.Threads > n {
		log.Warn("serve: --threads is more than the CPUs this process may use: the goroutines take turns and decoding slows down (0 = all CPUs)",
			"threads", o.Threads, "cpus", n)
	}
	fail := func(err error) int {
		fmt.Fprintln(stderr, "serve:", err)
		return 1
	}

	// Bind the API's address first: a busy port fails now, not after the
	// model has loaded and the workers have come.
	if msg := run.OpenAPINote(o.HTTPAddr, o.APIKey); msg != "" {
		log.Warn(msg, "http", o.HTTPAddr)
	}
	ln, err := net.Listen("tcp", o.HTTPAddr)
	if err != nil {
		return fail(err)
	}
	defer ln.Close()
	o.Listener = ln
	lm, err := run.Load(o.ModelPath)
	if err != nil {
		return fail(err)
	}
	defer lm.Close()
	if _, err := lm.Resident(*resident, log); err != nil {
		return fail(err)
	}
	lm.Engine().SetThreads(o.Threads)
	ex, err := run.ServeExperts(ctx, lm, so, log, stderr)
	if err != nil {
		return fail(err)
	}
	if ex.Close != nil {
		defer ex.Close()
	}
	if err := run.ServeAPI(ctx, lm, ex, o, log, ready); err != nil {
		return fail(err)
	}
	return 0
}
