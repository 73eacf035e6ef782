package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"github.com/kvasir-ai/kvasir/backbone/config"
	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/backbone/workerrole"
)

func init() {
	register("worker", "headless expert worker: dials the gateway and serves a slice (no GUI)", runWorker)
}

// runWorker: backbone worker --gateway wss://HOST:PORT --slice PATH
// (or --model-tiny) [--layers 0,1] [--ca C] [--key FILE] [--threads N] [--model-id ID]
// [--quota BYTES [--model-source URL]]; the worker is backbone/workerrole.
func runWorker(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	gw := fs.String("gateway", "", "gateway URL (wss://host:port)")
	slice := fs.String("slice", "", "the experts to serve: a slice directory (backbone slice) or a GGUF file")
	layersFlag := fs.String("layers", "", "comma-separated layers to serve (default: all in the slice)")
	caFile := fs.String("ca", "", "PEM CA certificate to trust for the gateway (default: system roots)")
	keyFile := fs.String("key", workerrole.DefaultKeyFile(), "ed25519 identity key file (0600, created if missing)")
	threads := fs.Int("threads", runtime.NumCPU(), "compute threads (0: all CPUs)")
	modelID := fs.String("model-id", "", "model id announced to the backbone (default: the slice's model id, engine/slice.ModelID)")
	modelTiny := fs.Bool("model-tiny", false, "serve the experts of the embedded tiny model (the default model of backbone generate and demo) instead of --slice")
	quotaFlag := fs.String("quota", "", "with a --slice directory (may be empty or missing): disk quota for downloaded experts, bytes with an optional KiB/MiB/GiB/TiB or KB/MB/GB/TB suffix (e.g. 4GB); the backbone assigns experts and the worker downloads them (issue 6)")
	source := fs.String("model-source", "", "with --quota: http(s) URL of the full model GGUF to download assigned experts from instead of the one the backbone names (a mirror); bytes are verified against the backbone's hashes either way")
	backend := fs.String("backend", "auto", workerrole.BackendFlagHelp)
	cpuLimit := fs.Int("cpu-limit", 0, "limit the worker to this percent of the machine's CPU time, 0-100 (0, the default, or 100: no limit); it pauses between requests, answering every request it took")
	spinWait := fs.Duration("spin-wait", 0, "keep every CPU spinning at idle priority (SCHED_IDLE: it yields to any other thread) for up to this long after each answer, so that the next request is computed on CPUs that never halted (issue 19: a dedicated worker machine's choice, for WAN round trips of a few ms or more; a LAN's sub-ms ones ran slower with spinning); 0: off, the CPUs sleep between requests. Linux builds with cgo only")
	if err := config.Parse(fs, "worker", args, os.Stdout); err != nil {
		if errors.Is(err, config.ErrPrinted) || errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *spinWait < 0 {
		fmt.Fprintf(os.Stderr, "worker: --spin-wait %v: want >= 0 (0: off)\n", *spinWait)
		return 2
	}
	if *threads < 0 {
		fmt.Fprintf(os.Stderr, "worker: --threads %d: want >= 0 (0 = all CPUs)\n", *threads)
		return 2
	} else if *threads == 0 {
		*threads = runtime.NumCPU()
	}
	if *cpuLimit < 0 || *cpuLimit > 100 {
		fmt.Fprintf(os.Stderr, "worker: --cpu-limit %d: want a percent from 0 to 100 (0 or 100: no limit)\n", *cpuLimit)
		return 2
	}
	c := workerrole.Config{Gateway: *gw, Slice: *slice, Tiny: *modelTiny, CAFile: *caFile, KeyFile: *keyFile,
		Threads: *threads, ModelID: *modelID, Source: *source, Backend: *backend, CPULimit: *cpuLimit, SpinWait: *spinWait}
	if *quotaFlag != "" {
		quota, err := run.ParseBytes(*quotaFlag)
		switch {
		case err != nil:
			fmt.Fprintln(os.Stderr, "worker: --quota:", err)
			return 2
		case *gw == "" || *slice == "":
			fmt.Fprintln(os.Stderr, "worker: --quota needs --gateway and a --slice directory (may be empty or missing)")
			return 2
		case strings.TrimSpace(*layersFlag) != "":
			fmt.Fprintln(os.Stderr, "worker: --layers does not apply with --quota: the backbone assigns the experts a quota worker holds")
			return 2
		}
		c.Quota, c.Tiny, c.ModelID = quota, false, ""
	} else {
		if *source != "" {
			fmt.Fprintln(os.Stderr, "worker: --model-source needs --quota")
			return 2
		}
		if *gw == "" || (*slice == "") == !*modelTiny {
			what := "--gateway and one of --slice or --model-tiny are required"
			if *slice != "" && *modelTiny {
				what = "--slice and --model-tiny exclude each other: give one"
			}
			fmt.Fprintln(os.Stderr, "worker: "+what)
			return 2
		}
		for _, f := range strings.Split(*layersFlag, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			l, err := strconv.Atoi(f)
			if err != nil || l < 0 {
				fmt.Fprintf(os.Stderr, "worker: bad layer %q\n", f)
				return 2
			}
			c.Layers = append(c.Layers, l)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := workerrole.Run(ctx, c); err != nil {
		fmt.Fprintln(os.Stderr, "worker: "+err.Error()) // a *workerrole.Error: one "worker: " prefix
		return 1
	}
	return 0
}
