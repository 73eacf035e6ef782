// Package workerrole is the headless worker of `backbone worker` (servers
// and GPU boxes; it never links Fyne): it loads the identity key and the
// gateway's CA, opens the experts to serve (engine/slice.Load of a slice
// directory or GGUF file, or the embedded tiny model) or a provisioned
// slice folder with a quota, runs the dial-out engine/worker until its
// context ends, and prints a status line every StatusEvery. The command in
// backbone/cmd_worker.go parses the flags into a Config and calls Run.
package workerrole

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// Config is a worker's configuration (the flags of `backbone worker`).
type Config struct {
	// Gateway is the gateway's URL, wss://host:port.
	Gateway string
	// Slice is the experts to serve: a slice directory or a GGUF file
	// (slice.Load); with Quota > 0, the folder the worker keeps its
	// downloaded slice in (may be empty or missing).
	Slice string
	// Tiny serves the experts of the embedded tiny model instead of Slice.
	Tiny bool
	// Layers restricts what is served to these layers (nil: all).
	Layers []int
	// CAFile is a PEM CA certificate to trust for the gateway ("": the
	// system roots).
	CAFile string
	// KeyFile is the ed25519 identity key file (created if missing).
	KeyFile string
	// Threads are the compute threads.
	Threads int
	// ModelID, when set, is announced instead of the slice's model id.
	ModelID string
	// Quota > 0 makes a provisioned worker (engine/worker Config.SliceDir
	// and Quota): the backbone assigns experts, the worker downloads them.
	Quota int64
	// Source is, with Quota, the http(s) URL of the full model GGUF to
	// download the assigned experts from instead of the one the backbone
	// names.
	Source string
	// Log receives the start line, warnings and status lines (nil:
	// os.Stderr).
	Log io.Writer
	// StatusEvery is the status line period (0: 10 s).
	StatusEvery time.Duration
	// Backend is where the experts are computed: "" or "auto" (a GPU
	// through Vulkan if there is one, else the CPU), "cpu", "vulkan" or
	// "vulkan:N" (engine/vulkan.ParseBackend), for a Quota worker too (its
	// experts go to the device as they download).
	Backend string
	// CPULimit limits the process to this percent of the machine's CPU
	// time (1-100; 0 or 100: no limit), by pausing between requests
	// (engine/worker Config.CPULimit).
	CPULimit int
	// SpinWait keeps the CPUs spinning between requests (engine/worker
	// Config.SpinWait); 0: off.
	SpinWait time.Duration
}

// Error is a failure of Run: what led to it (a flag with its value, e.g.
// "--ca FILE", or "") and the error, printed by the command after one
// "worker: " prefix.
type Error struct {
	What string
	Err  error
}

// Error returns What and the error's text without its own "worker: "
// prefix (engine/worker's errors carry one).
func (e *Error) Error() string {
	msg := strings.TrimPrefix(e.Err.Error(), "worker: ")
	if e.What != "" {
		msg = e.What + ": " + msg
	}
	return msg
}

// Unwrap returns the error.
func (e *Error) Unwrap() error { return e.Err }

// DefaultKeyFile is the identity key's default path:
// os.UserConfigDir()/kvasir/worker.key, or kvasir-worker.key without a
// user config folder.
func DefaultKeyFile() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "kvasir-worker.key"
	}
	return filepath.Join(dir, "kvasir", "worker.key")
}

// LoadCA reads the PEM certificates of path (nil pool for ""): the
// gateway's self-signed certificate or its CA. Errors: the file's, or one
// saying it holds no PEM certificate.
func LoadCA(path string) (*x509.CertPool, error) {
	if path == "" {
		return nil, nil
	}
	return worker.LoadCAFile(path)
}

// LoadTiny serves the experts of the given layers (nil: all) of the
// embedded default model (engine/demomodel, run.OpenFile("")), as views
// into its in-memory GGUF, with their hashes and slice.ModelID. Errors are
// run.OpenFile's and slice.LoadFile's.
func LoadTiny(layers []int, threads int) (*slice.Served, error) {
	f, err := run.OpenFile("")
	if err != nil {
		return nil, err
	}
	return slice.LoadFile(f, layers, threads)
}

// Run runs the worker of c until ctx ends. Errors, all *Error: the CA
// file (one that does not exist yet is only logged: every dial reads it
// again), the key file, the slice and worker.New's; once the worker runs,
// Run returns nil when ctx ends.
func Run(ctx context.Context, c Config) error {
	if c.Log == nil {
		c.Log = os.Stderr
	}
	if c.StatusEvery <= 0 {
		c.StatusEvery = 10 * time.Second
	}
	if strings.HasPrefix(strings.ToLower(c.Gateway), "ws://") {
		// engine/worker takes ws:// for tests; against a real gateway
		// (TLS only) it fails with a bare EOF.
		return &Error{"--gateway " + c.Gateway, errors.New("want wss://host[:port]: the gateway speaks TLS only")}
	}
	pool, err := LoadCA(c.CAFile)
	if errors.Is(err, fs.ErrNotExist) {
		// Every dial reads the file again (worker.Config.CAFile): a worker
		// started before its gateway first wrote its self-signed
		// certificate connects once the file is there.
		fmt.Fprintf(c.Log, "worker: --ca %s does not exist yet; every dial reads it again\n", c.CAFile)
	} else if err != nil {
		return &Error{"--ca " + c.CAFile, err}
	}
	key, err := worker.LoadOrCreateKeyFile(c.KeyFile)
	if err != nil {
		return &Error{"--key " + c.KeyFile, err}
	}
	if c.Quota > 0 {
		dev, backend, acc, err := openQuotaBackend(c.Backend, c.Log)
		if err != nil {
			return &Error{"", err}
		}
		if dev != nil {
			defer dev.Close() // after w.Close (deferred below), which empties the device
		}
		w, err := worker.New(worker.Config{GatewayURL: c.Gateway, Key: key, RootCAs: pool, CAFile: c.CAFile, SliceDir: c.Slice, Quota: c.Quota, CPULimit: c.CPULimit, SpinWait: c.SpinWait,
			Source: c.Source, Backend: backend, Threads: c.Threads, Accelerator: acc})
		if err != nil {
			if rest, ok := strings.CutPrefix(err.Error(), "worker: slice: "); ok {
				err = fmt.Errorf("--slice %s: %s", c.Slice, rest)
			}
			return &Error{"", err}
		}
		defer w.Close()
		st := w.Stats()
		fmt.Fprintf(c.Log, "worker: slice %s: %d experts, %d of %d quota bytes used, %d bad experts deleted; backend %s, key %x, gateway %s\n",
			c.Slice, st.Experts, st.SliceBytes, st.Quota, st.BadExperts, backend, key.Public(), c.Gateway)
		go every(ctx, c.StatusEvery, func() {
			s := w.Stats()
			fmt.Fprintf(c.Log, "worker: %s %s experts=%d download=%d/%d bytes %d/%d experts slice=%d/%d rows=%d%s source_requests=%d source_failures=%d\n",
				s.State, s.Reason, s.Experts, s.DownloadBytesDone, s.DownloadBytesTotal, s.DownloadExpertsDone,
				s.DownloadExpertsTotal, s.SliceBytes, s.Quota, s.Rows, deviceStatus(dev), s.SourceRequests, s.SourceFailures)
		})
		_ = w.Run(ctx)
		return nil
	}
	var sl *slice.Served
	if c.Tiny {
		sl, err = LoadTiny(c.Layers, c.Threads)
	} else if sl, err = slice.Load(c.Slice, c.Layers, c.Threads); err != nil {
		err = fmt.Errorf("--slice %s: %w", c.Slice, err)
	}
	if err != nil {
		return &Error{"", err}
	}
	defer sl.Close()
	for _, b := range sl.Bad {
		fmt.Fprintf(c.Log, "worker: not serving layer %d expert %d: %v\n", b.Layer, b.Expert, b.Err)
	}
	if len(sl.Holdings) == 0 && len(c.Layers) > 0 && len(sl.Bad) == 0 {
		// A typo in --layers would otherwise connect a worker that serves
		// nothing (accepted=0) and say nothing about why.
		return &Error{"", fmt.Errorf("--layers %v: the slice holds no expert of these layers", c.Layers)}
	}
	if c.ModelID != "" {
		sl.ModelID = c.ModelID
	}
	comp, backend, closeDev, err := applyBackend(c.Backend, sl.Computer, c.Log)
	if err != nil {
		return &Error{"", err}
	}
	defer closeDev()
	w, err := worker.New(worker.Config{GatewayURL: c.Gateway, Key: key, RootCAs: pool, CAFile: c.CAFile, Computer: comp, CPULimit: c.CPULimit, SpinWait: c.SpinWait,
		Holdings: sl.Holdings, ModelID: sl.ModelID, Backend: backend, Threads: c.Threads})
	if err != nil {
		return &Error{"", err}
	}
	fmt.Fprintf(c.Log, "worker: %d experts of model %q, backend %s, key %x, gateway %s\n",
		len(sl.Holdings), sl.ModelID, backend, key.Public(), c.Gateway)
	dev, _ := comp.(*vulkan.Computer)
	go every(ctx, c.StatusEvery, func() {
		s := w.Stats()
		fmt.Fprintf(c.Log, "worker: %s %s rows=%d%s requests=%d in=%d out=%d rtt=%v\n",
			s.State, s.Reason, s.Rows, deviceStatus(dev), s.Requests, s.BytesIn, s.BytesOut, s.RTT.Round(time.Millisecond))
	})
	_ = w.Run(ctx)
	return nil
}

// every calls f each period until ctx ends (the status lines).
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
