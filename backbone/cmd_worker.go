package main

import (
	"context"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/wire"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

func init() {
	register("worker", "headless expert worker: dials the gateway and serves a slice (no GUI)", runWorker)
}

// workerSlice is what the worker command serves.
type workerSlice struct {
	Computer expert.Computer
	Holdings []wire.Holding
	ModelID  string
	Close    func() error
}

// loadWorkerSlice opens what --slice names, restricted to layers (nil: all):
// a slice directory (engine/slice.Open, every expert's hash verified; layers
// not in the list are dropped from the holdings) or a GGUF file
// (slice.FromGGUF, views into the mapped file). It is the one place to swap
// the loader.
var loadWorkerSlice = func(path string, layers []int, threads int) (*workerSlice, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var s *slice.Slice
	var f *gguf.File
	if st.IsDir() {
		if s, err = slice.Open(path); err != nil {
			return nil, err
		}
		for _, b := range s.Bad() {
			fmt.Fprintf(os.Stderr, "worker: not serving layer %d expert %d: %v\n", b.Layer, b.Expert, b.Err)
		}
	} else {
		if f, err = gguf.Open(path); err != nil {
			return nil, err
		}
		if s, err = slice.FromGGUF(f, layers, nil); err != nil {
			f.Close()
			return nil, err
		}
	}
	comp, err := s.Computer(threads)
	if err != nil {
		s.Close()
		return nil, err
	}
	keep := map[int]bool{}
	for _, l := range layers {
		keep[l] = true
	}
	var hs []wire.Holding
	for _, h := range s.Holdings() {
		if len(layers) == 0 || keep[int(h.Layer)] {
			hs = append(hs, h)
		}
	}
	closeFn := func() error {
		err := s.Close()
		if f != nil {
			if cerr := f.Close(); err == nil {
				err = cerr
			}
		}
		return err
	}
	return &workerSlice{Computer: comp, Holdings: hs, ModelID: s.ModelID(), Close: closeFn}, nil
}

// loadTinySlice serves the experts of the given layers (nil: all) of the
// embedded tiny model (engine/modelgen.Tiny, the bytes `backbone genmodel
// --preset tiny` writes), as views into its in-memory GGUF, with their
// hashes and slice.ModelID.
func loadTinySlice(layers []int, threads int) (*workerSlice, error) {
	f, err := run.OpenFile("")
	if err != nil {
		return nil, err
	}
	s, err := slice.FromGGUF(f, layers, nil)
	if err != nil {
		f.Close()
		return nil, err
	}
	comp, err := s.Computer(threads)
	if err != nil {
		s.Close()
		f.Close()
		return nil, err
	}
	return &workerSlice{Computer: comp, Holdings: s.Holdings(), ModelID: s.ModelID(),
		Close: func() error { return errors.Join(s.Close(), f.Close()) }}, nil
}

// runWorker: backbone worker --gateway wss://HOST:PORT --slice PATH
// (or --model-tiny) [--layers 0,1] [--ca C] [--key FILE] [--threads N] [--model-id ID].
func runWorker(args []string) int {
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	gw := fs.String("gateway", "", "gateway URL (wss://host:port)")
	slice := fs.String("slice", "", "the experts to serve: a slice directory (backbone slice) or a GGUF file")
	layersFlag := fs.String("layers", "", "comma-separated layers to serve (default: all in the slice)")
	caFile := fs.String("ca", "", "PEM CA certificate to trust for the gateway (default: system roots)")
	keyFile := fs.String("key", defaultKeyFile(), "ed25519 identity key file (0600, created if missing)")
	threads := fs.Int("threads", runtime.NumCPU(), "compute threads")
	modelID := fs.String("model-id", "", "model id announced to the backbone (default: the slice's model id, engine/slice.ModelID)")
	modelTiny := fs.Bool("model-tiny", false, "serve the experts of the embedded tiny model (the default model of backbone generate and demo) instead of --slice")
	quotaFlag := fs.String("quota", "", "with a --slice directory (may be empty or missing): disk quota for downloaded experts, bytes with optional KiB/MiB/GiB suffix; the backbone assigns experts and the worker downloads them (issue 6)")
	backend := fs.String("backend", "auto", backendFlagHelp)
	source := fs.String("model-source", "", "with --quota: http(s) URL of the full model GGUF to download assigned experts from instead of the one the backbone names (a mirror); bytes are verified against the backbone's hashes either way")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *quotaFlag != "" {
		warnQuotaBackend(*backend)
		return runSliceWorker(*gw, *slice, *quotaFlag, *caFile, *keyFile, *source, *threads)
	}
	if *source != "" {
		fmt.Fprintln(os.Stderr, "worker: --model-source needs --quota")
		return 2
	}
	if *gw == "" || (*slice == "") == !*modelTiny {
		fmt.Fprintln(os.Stderr, "worker: --gateway and one of --slice or --model-tiny are required")
		return 2
	}
	var layers []int
	for _, f := range strings.Split(*layersFlag, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		l, err := strconv.Atoi(f)
		if err != nil || l < 0 {
			fmt.Fprintf(os.Stderr, "worker: bad layer %q\n", f)
			return 2
		}
		layers = append(layers, l)
	}
	pool, err := loadCA(*caFile)
	if err != nil {
		workerErr("--ca "+*caFile, err)
		return 1
	}
	key, err := worker.LoadOrCreateKeyFile(*keyFile)
	if err != nil {
		workerErr("--key "+*keyFile, err)
		return 1
	}
	var sl *workerSlice
	if *modelTiny {
		sl, err = loadTinySlice(layers, *threads)
	} else if sl, err = loadWorkerSlice(*slice, layers, *threads); err != nil {
		err = fmt.Errorf("--slice %s: %w", *slice, err)
	}
	if err != nil {
		workerErr("", err)
		return 1
	}
	if sl.Close != nil {
		defer sl.Close()
	}
	if *modelID != "" {
		sl.ModelID = *modelID
	}
	backendName, closeDev, err := applyBackend(*backend, sl)
	if err != nil {
		workerErr("", err)
		return 1
	}
	defer closeDev()
	w, err := worker.New(worker.Config{GatewayURL: *gw, Key: key, RootCAs: pool, Computer: sl.Computer,
		Holdings: sl.Holdings, ModelID: sl.ModelID, Backend: backendName, Threads: *threads})
	if err != nil {
		workerErr("", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "worker: %d experts of model %q, key %x, gateway %s\n",
		len(sl.Holdings), sl.ModelID, key.Public(), *gw)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go every(ctx, 10*time.Second, func() {
		s := w.Stats()
		fmt.Fprintf(os.Stderr, "worker: %s %s rows=%d requests=%d in=%d out=%d rtt=%v\n",
			s.State, s.Reason, s.Rows, s.Requests, s.BytesIn, s.BytesOut, s.RTT.Round(time.Millisecond))
	})
	_ = w.Run(ctx)
	return 0
}

// loadCA reads the PEM certificates of --ca path (nil pool for ""): the
// gateway's self-signed certificate or its CA. Errors: the file's, or one
// saying it holds no PEM certificate.
func loadCA(path string) (*x509.CertPool, error) {
	if path == "" {
		return nil, nil
	}
	pem, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, errors.New("no PEM certificate in the file")
	}
	return pool, nil
}

// workerErr prints err on stderr with exactly one "worker: " prefix (the
// engine/worker errors carry their own), after what ("--ca FILE") if set.
func workerErr(what string, err error) {
	msg := strings.TrimPrefix(err.Error(), "worker: ")
	if what != "" {
		msg = what + ": " + msg
	}
	fmt.Fprintln(os.Stderr, "worker: "+msg)
}

func defaultKeyFile() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "kvasir-worker.key"
	}
	return filepath.Join(dir, "kvasir", "worker.key")
}

// parseBytes parses a byte count with an optional KiB, MiB or GiB suffix
// (powers of 1024), e.g. "64MiB".
func parseBytes(s string) (int64, error) {
	mult := int64(1)
	for _, u := range []struct {
		suf string
		m   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}} {
		if strings.HasSuffix(s, u.suf) {
			s, mult = strings.TrimSuffix(s, u.suf), u.m
			break
		}
	}
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("bad byte count %q", s)
	}
	return v * mult, nil
}

// runSliceWorker: backbone worker --gateway URL --slice DIR --quota 64MiB:
// a worker that keeps a downloaded slice in DIR (engine/worker
// Config.SliceDir), starting from an empty or missing folder.
func runSliceWorker(gw, dir, quotaFlag, caFile, keyFile, source string, threads int) int {
	quota, err := parseBytes(quotaFlag)
	if err != nil || gw == "" || dir == "" {
		fmt.Fprintln(os.Stderr, "worker: --quota needs --gateway, a --slice directory and a byte count:", err)
		return 2
	}
	pool, err := loadCA(caFile)
	if err != nil {
		workerErr("--ca "+caFile, err)
		return 1
	}
	key, err := worker.LoadOrCreateKeyFile(keyFile)
	if err != nil {
		workerErr("--key "+keyFile, err)
		return 1
	}
	w, err := worker.New(worker.Config{GatewayURL: gw, Key: key, RootCAs: pool, SliceDir: dir, Quota: quota,
		Source: source, Backend: "cpu-" + runtime.GOARCH, Threads: threads})
	if err != nil {
		if strings.HasPrefix(err.Error(), "worker: slice: ") {
			err = fmt.Errorf("--slice %s: %s", dir, strings.TrimPrefix(err.Error(), "worker: slice: "))
		}
		workerErr("", err)
		return 1
	}
	defer w.Close()
	st := w.Stats()
	fmt.Fprintf(os.Stderr, "worker: slice %s: %d experts, %d of %d quota bytes used, %d bad experts deleted; key %x, gateway %s\n",
		dir, st.Experts, st.SliceBytes, st.Quota, st.BadExperts, key.Public(), gw)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go every(ctx, 10*time.Second, func() {
		s := w.Stats()
		fmt.Fprintf(os.Stderr, "worker: %s %s experts=%d download=%d/%d bytes %d/%d experts slice=%d/%d rows=%d source_requests=%d source_failures=%d\n",
			s.State, s.Reason, s.Experts, s.DownloadBytesDone, s.DownloadBytesTotal, s.DownloadExpertsDone,
			s.DownloadExpertsTotal, s.SliceBytes, s.Quota, s.Rows, s.SourceRequests, s.SourceFailures)
	})
	_ = w.Run(ctx)
	return 0
}

// every calls f each period until ctx ends (the workers' status lines).
func every(ctx context.Context, period time.Duration, f func()) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f()
		}
	}
}
