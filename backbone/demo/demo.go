package demo

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/worker"
	"github.com/kvasir-ai/kvasir/wallet"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Options configure the demo (the flags of backbone demo).
type Options struct {
	Prompt        string        // the prompt decoded
	MaxTokens     int           // tokens to generate
	Workers       int           // worker processes; layer l is served by worker l mod Workers
	WorkerThreads int           // compute threads per worker
	Threads       int           // backbone goroutines for matrix products (0: all CPUs)
	Rate          uint64        // the gateway's price, nKVR per creditable byte
	Dir           string        // keep the files here, new or empty ("": a temporary directory, removed)
	Verbose       bool          // copy the children's logs to stderr (else DIR/swarm.log)
	Timeout       time.Duration // give up after this long
	// Swarm holds --min-deadline, --provision and --provision-rate.
	Swarm *run.SwarmFlags
	// API holds the API's options for Serve (--http, --serve-requests,
	// --api-key).
	API run.APIOptions
	// Capacity: the backbone runs a backbone-only file and the workers
	// download their experts from a loopback HTTP model source (implies
	// Swarm.Provision).
	Capacity bool
}

// Result is the --json output of backbone demo.
type Result struct {
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
	ExpertsRemote   uint64   `json:"experts_remote"`
	ExpertsLocal    uint64   `json:"experts_local"`
	Verify          string   `json:"verify"` // the verification policy (--verify)
	RateNKVRPerByte uint64   `json:"rate_nkvr_per_byte"`
	LedgerLastID    int64    `json:"ledger_last_id"` // the gateway credited up to this ledger row
	Workers         []Worker `json:"workers"`
	Dir             string   `json:"dir,omitempty"` // with --dir: where the files are kept
	// Capacity is set with --capacity.
	Capacity *Capacity `json:"capacity,omitempty"`
}

// Capacity is what `demo --capacity` ran: a backbone-only file beside
// the full model, workers provisioned from a loopback HTTP source, and the
// swarm's coverage and checks.
type Capacity struct {
	FullBytes      int64             `json:"full_bytes"`         // the full GGUF (served by the HTTP source)
	BackboneBytes  int64             `json:"backbone_bytes"`     // the backbone-only GGUF the backbone loaded
	ExpertBytes    int64             `json:"expert_bytes"`       // every routed expert, bytes
	LocalExperts   int               `json:"local_experts"`      // experts the backbone holds (0: all remote)
	SourceURL      string            `json:"source_url"`         // the loopback model source
	SourceRequests int64             `json:"source_requests"`    // HTTP range requests it answered
	SourceBytes    int64             `json:"source_bytes"`       // body bytes it sent
	Coverage       dispatch.Coverage `json:"coverage"`           // replicas per expert after provisioning
	CrossChecks    uint64            `json:"cross_checks"`       // results verified by replica comparison
	Unverified     uint64            `json:"unverified_outputs"` // outputs chosen for a check nothing could check
}

// Worker is one worker process of the demo: the dispatcher's view of
// its session(s), what the hub's ledger metered for it, and what the
// gateway credited.
type Worker struct {
	Name    string `json:"name"`
	Pid     int    `json:"pid"`
	Layers  []int  `json:"layers"`
	ID      string `json:"id"`      // hex ed25519 public key
	Address string `json:"address"` // wallet address of the key
	// Sessions are the dispatcher's statistics of the worker's sessions.
	Sessions []run.WorkerJSON `json:"sessions"`
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

// fullSwarm is a running demo swarm: the tiny model with a dispatcher in
// this process, and hub, gateway and worker processes.
type fullSwarm struct {
	lm      *run.Model
	full    *run.Model // with --capacity: the full model (the local reference)
	src     *modelSource
	capRes  *Capacity
	d       *dispatch.Dispatcher
	sw      *Swarm
	names   []string // worker names
	layers  [][]int  // per worker
	keys    []string // per worker, hex public key
	workers []*Proc
}

// Experts returns the running swarm's expert.Computer: the dispatcher,
// which sends each MoE layer's rows to the worker processes and computes
// locally what none delivers. `backbone demo --serve` (Serve) serves
// the API with it.
func (s *fullSwarm) Experts() expert.Computer { return s.d }

// startFull prepares dir (model file, one slice and one key per
// worker) and starts the dispatcher, hub, gateway and workers, waiting
// until every worker is connected with all its experts accepted.
func startFull(ctx context.Context, o Options, dir string, log io.Writer) (_ *fullSwarm, err error) {
	s := &fullSwarm{}
	defer func() {
		if err != nil {
			s.Close()
		}
	}()
	data, err := demomodel.Bytes()
	if err != nil {
		return nil, err
	}
	modelPath := filepath.Join(dir, "model.gguf")
	if err := os.WriteFile(modelPath, data, 0o644); err != nil {
		return nil, err
	}
	if o.Capacity {
		if err := s.startCapacity(modelPath, dir); err != nil {
			return nil, err
		}
		o.Swarm.ModelSource = s.src.url
	} else if s.lm, err = run.Load(modelPath); err != nil {
		return nil, err
	}
	s.lm.Engine().SetThreads(o.Threads)
	p := s.lm.Engine().Params()
	if o.Workers > p.ExpertLayers {
		return nil, fmt.Errorf("--workers %d: the model has only %d layers", o.Workers, p.ExpertLayers)
	}
	for i := 0; i < o.Workers; i++ {
		name := fmt.Sprintf("worker-%d", i)
		var ls []int
		if !o.Swarm.Provision {
			first, step := i, o.Workers
			if o.Swarm.Verify == dispatch.VerifyQuorum { // two holders of every expert: each worker holds every layer
				first, step = 0, 1
			}
			for l := first; l < p.ExpertLayers; l += step {
				ls = append(ls, l)
			}
			if _, err := slice.Cut(s.lm.File(), ls, nil, filepath.Join(dir, "slice-"+strconv.Itoa(i))); err != nil {
				return nil, fmt.Errorf("cutting %s's slice: %w", name, err)
			}
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
	// No wait here: the workers need the dispatcher's address first.
	if s.d, err = run.StartSwarm(ctx, s.lm, o.Swarm.Config("127.0.0.1:0", quiet)); err != nil {
		return nil, err
	}
	// The children are this very binary (under `go run` a temporary one),
	// so the demo needs nothing but itself.
	bin, err := os.Executable()
	if err != nil {
		return nil, err
	}
	s.sw, err = StartSwarm(ctx, Config{Bin: bin, Dir: dir, Backbone: s.d.Addr(),
		RateNKVRPerByte: o.Rate, Log: log})
	if err != nil {
		return nil, err
	}
	var quota int64
	if o.Capacity {
		quota = capacityQuota(s.lm, o.Workers)
	} else if o.Swarm.Provision {
		if quota, err = provisionQuota(s.lm, o.Workers); err != nil {
			return nil, err
		}
	}
	for i, name := range s.names {
		extra := []string{"--threads", strconv.Itoa(o.WorkerThreads)}
		if o.Swarm.Provision {
			// An empty slice folder and a quota of about its share of
			// the experts: the dispatcher assigns them and the worker
			// downloads them (docs/protocol.md, provisioning).
			extra = append(extra, "--quota", strconv.FormatInt(quota, 10))
		}
		w, err := s.sw.AddWorker(name, filepath.Join(dir, "slice-"+strconv.Itoa(i)), extra...)
		if err != nil {
			return nil, err
		}
		s.workers = append(s.workers, w)
	}
	if err := s.d.WaitWorkers(ctx, o.Workers); err != nil {
		tails := ""
		for _, w := range s.workers {
			tails += fmt.Sprintf("\n%s:\n%s", w.Name, w.Tail(10))
		}
		return nil, fmt.Errorf("waiting for %d workers: %w%s", o.Workers, err, tails)
	}
	if o.Swarm.Provision {
		want := p.ExpertLayers * p.Experts
		if o.Capacity {
			want *= min(2, o.Workers) // dispatch's default Replicas: every expert twice
		}
		if err := waitProvisioned(ctx, s.d, want); err != nil {
			return nil, err
		}
		return s, nil
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

// provisionQuota is the --quota, bytes, of each of n provisioned demo workers:
// an n-th of the model's expert bytes (slice.Catalog sizes) plus the
// largest expert and 64 KiB of slack, so that the experts are shared out
// between the workers (the dispatcher gives each expert to the worker with
// the most free quota) and all of them fit.
func provisionQuota(lm *run.Model, n int) (int64, error) {
	cat, err := slice.NewCatalog(lm.File())
	if err != nil {
		return 0, err
	}
	h := cat.Header()
	var total, largest int64
	for l := 0; l < h.NLayer; l++ {
		for e := 0; e < h.NExpert; e++ {
			total += cat.Size(l, e)
			largest = max(largest, cat.Size(l, e))
		}
	}
	return (total+int64(n)-1)/int64(n) + largest + 64<<10, nil
}

// waitProvisioned waits until the connected workers of d hold (accepted
// holdings, summed over workers) at least n experts and each holds some,
// polling every 50 ms until ctx ends. Before any routing the dispatcher
// assigns each expert to one worker (dispatch/provision.go: replicas are
// only made of routed experts), so n = layers x experts means every expert
// is held.
func waitProvisioned(ctx context.Context, d *dispatch.Dispatcher, n int) error {
	for {
		held, idle := 0, 0
		for _, w := range d.Stats().Workers {
			if w.Connected {
				held += w.Holdings
				if w.Holdings == 0 {
					idle++
				}
			}
		}
		if held >= n && idle == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the workers to download %d experts (%d held): %w", n, held, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Close stops the children and the dispatcher; safe on a partly started
// swarm and more than once.
func (s *fullSwarm) Close() {
	if s.sw != nil {
		s.sw.Close()
	}
	if s.d != nil {
		s.d.Close()
	}
	if s.src != nil {
		s.src.Close()
	}
	if s.lm != nil {
		s.lm.Close()
	}
	if s.full != nil {
		s.full.Close()
	}
}

// startCapacity prepares `demo --capacity`: the HTTP model source serving
// modelPath on loopback, the backbone-only file dir/backbone.gguf naming it,
// s.lm over that file and s.full over the full one (the reference).
func (s *fullSwarm) startCapacity(modelPath, dir string) (err error) {
	if s.src, err = serveModelSource(modelPath); err != nil {
		return err
	}
	if s.full, err = run.Load(modelPath); err != nil {
		return err
	}
	st, err := os.Stat(modelPath)
	if err != nil {
		return err
	}
	bpath := filepath.Join(dir, "backbone.gguf")
	bo, err := slice.WriteBackboneOnly(s.full.File(), bpath, slice.BackboneOptions{SourceURL: s.src.url, SourceSize: st.Size()})
	if err != nil {
		return err
	}
	bst, err := os.Stat(bpath)
	if err != nil {
		return err
	}
	if s.lm, err = run.Load(bpath); err != nil {
		return err
	}
	s.capRes = &Capacity{FullBytes: st.Size(), BackboneBytes: bst.Size(), ExpertBytes: bo.Bytes(),
		LocalExperts: len(bo.Hot), SourceURL: s.src.url}
	return nil
}

// capacityQuota is each of n capacity-demo workers' quota: room for two
// copies of every expert across the workers (dispatch's default Replicas),
// plus one expert and 64 KiB of slack; with one worker, one copy.
func capacityQuota(lm *run.Model, n int) int64 {
	bo := lm.BackboneOnly()
	copies := int64(min(2, n))
	var largest int64
	for i := range bo.Layers {
		largest = max(largest, bo.Layers[i].ExpertBytes())
	}
	return (copies*bo.Bytes()+int64(n)-1)/int64(n) + largest + 64<<10
}

// modelSource is the capacity demo's model source: the full GGUF served by
// a loopback HTTP server with range support (http.ServeContent), counting
// requests and body bytes.
type modelSource struct {
	url      string
	srv      *http.Server
	requests atomic.Int64
	bytes    atomic.Int64
}

// serveModelSource serves path at http://127.0.0.1:PORT/model.gguf.
func serveModelSource(path string) (*modelSource, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	m := &modelSource{url: "http://" + ln.Addr().String() + "/model.gguf"}
	m.srv = &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/model.gguf" {
			http.NotFound(w, r)
			return
		}
		f, err := os.Open(path)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		defer f.Close()
		m.requests.Add(1)
		http.ServeContent(&countingWriter{ResponseWriter: w, n: &m.bytes}, r, "model.gguf", time.Time{}, f)
	})}
	go m.srv.Serve(ln)
	return m, nil
}

// Close stops the server.
func (m *modelSource) Close() error { return m.srv.Close() }

// countingWriter counts the body bytes written.
type countingWriter struct {
	http.ResponseWriter
	n *atomic.Int64
}

// Write writes p and counts what was written.
func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.ResponseWriter.Write(p)
	c.n.Add(int64(n))
	return n, err
}

// prepareDir prepares the demo's directory: --dir (new or empty) or a new
// temporary one, and the children's log (stderr with --verbose, else
// DIR/swarm.log). cleanup closes the log and removes a temporary
// directory.
func prepareDir(o Options, stderr io.Writer) (dir string, log io.Writer, cleanup func(), err error) {
	var undo []func()
	cleanup = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	dir = o.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kvasir-demo-"); err != nil {
			return "", nil, nil, err
		}
		undo = append(undo, func() { os.RemoveAll(dir) })
	} else {
		// A used directory would add its old ledger rows and credits to
		// this run's report.
		if ents, err := os.ReadDir(dir); err == nil && len(ents) > 0 {
			return "", nil, nil, fmt.Errorf("--dir %s is not empty", dir)
		}
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", nil, nil, err
		}
	}
	log = stderr
	if !o.Verbose {
		lf, err := os.Create(filepath.Join(dir, "swarm.log"))
		if err != nil {
			cleanup()
			return "", nil, nil, err
		}
		undo = append(undo, func() { lf.Close() })
		log = lf
	}
	return dir, log, cleanup, nil
}

// Run runs the whole demo and returns its result: on loopback it writes
// the embedded tiny model to the demo's directory, cuts one slice per
// worker (layer l goes to worker l mod Workers) or, with Swarm.Provision,
// gives each worker an empty folder and a quota; starts a hub (with a
// ledger), a gateway (self-signed TLS, crediting) and the workers as child
// processes of this binary (os.Executable, which must be the backbone
// command), and a dispatcher here; decodes the prompt with local experts,
// then with every expert over the swarm; stops the workers, waits for the
// hub's final ledger rows and the gateway's crediting, and reports what
// each worker did and was credited. With Capacity the backbone loads a
// backbone-only file of the model and the workers download their experts
// from a loopback HTTP server of the full file. Every child is stopped
// before it returns, also when ctx ends.
func Run(ctx context.Context, o Options, stderr io.Writer) (_ *Result, err error) {
	ctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	dir, log, cleanup, err := prepareDir(o, stderr)
	if err != nil {
		return nil, err
	}
	defer cleanup()
	s, err := startFull(ctx, o, dir, log)
	if err != nil {
		return nil, err
	}
	defer s.Close()

	opts := run.DecodeOptions{Prompt: o.Prompt, MaxTokens: o.MaxTokens}
	eng := s.lm.Engine()
	eng.SetExperts(nil)
	ref := s.lm
	if s.full != nil {
		ref = s.full // the backbone-only file cannot decode alone
		ref.Engine().SetThreads(o.Threads)
	}
	local, err := run.Decode(ctx, ref, opts, io.Discard)
	if err != nil {
		return nil, fmt.Errorf("local decode: %w", err)
	}
	eng.SetExperts(s.Experts())
	swarm, err := run.Decode(ctx, s.lm, opts, io.Discard)
	eng.SetExperts(nil)
	if err != nil {
		return nil, fmt.Errorf("swarm decode: %w", err)
	}
	st := s.d.Stats()
	res := &Result{ModelID: s.lm.ID(), Prompt: o.Prompt, Text: swarm.Text, Tokens: swarm.Tokens,
		LocalTokens: local.Tokens, TokensEqual: slices.Equal(swarm.Tokens, local.Tokens),
		LogitsEqual: swarm.LogitsSHA256 == local.LogitsSHA256, LocalTokS: local.DecodeTokS,
		SwarmTokS: swarm.DecodeTokS, ExpertsRemote: st.ExpertsRemote, ExpertsLocal: st.ExpertsLocal,
		RateNKVRPerByte: o.Rate, Verify: string(st.Verify)}
	if o.Dir != "" {
		res.Dir = o.Dir
	}
	if c := s.capRes; c != nil {
		c.SourceRequests, c.SourceBytes = s.src.requests.Load(), s.src.bytes.Load()
		c.Coverage, c.CrossChecks, c.Unverified = s.d.Coverage(), st.CrossChecks, st.Unverified
		res.Capacity = c
	}

	// End the sessions so that the hub writes their final rows, then wait
	// for the gateway to credit up to the last one. The dispatcher closes
	// its links first: each link carries the verdicts (LinkAccepted) of its
	// RESULTs before its end, so the hub has them all when the session
	// ends; a worker's own close could reach the hub first over the other
	// socket, and the hub would count the last RESULT as rejected.
	var sessions []string
	for _, w := range st.Workers {
		sessions = append(sessions, w.Session)
	}
	s.d.Close()
	s.sw.StopWorkers(5 * time.Second)
	settled, err := s.sw.Settle(ctx, sessions)
	if err != nil {
		return nil, err
	}
	res.LedgerLastID = settled.LastID
	for i, name := range s.names {
		dw := Worker{Name: name, Pid: s.workers[i].Pid(), Layers: s.layers[i], ID: s.keys[i],
			Address: wallet.AddressOfHex(s.keys[i]), Sessions: []run.WorkerJSON{}}
		for _, w := range run.WorkersJSON(s.d.Stats()) {
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

// Serve is `backbone demo --serve`: it starts the demo swarm (within
// --timeout), then serves the OpenAI-compatible API (run.ServeAPI) on --http
// with every MoE layer computed over the swarm, printing the API's URL and
// a curl command to stdout, until ctx ends (Ctrl-C) or --serve-requests
// completion requests were answered. It then prints the expert counts,
// stops the children and returns.
func Serve(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	dir, log, cleanup, err := prepareDir(o, stderr)
	if err != nil {
		return err
	}
	defer cleanup()
	sctx, cancel := context.WithTimeout(ctx, o.Timeout)
	s, err := startFull(sctx, o, dir, log)
	cancel()
	if err != nil {
		return err
	}
	defer s.Close()
	o.API.Threads = o.Threads
	ex := &run.APIExperts{Computer: s.Experts(), Stats: s.d.Stats, Coverage: s.d.Coverage, HolderWait: o.Swarm.HolderWait,
		Describe: fmt.Sprintf("experts: demo swarm of %d worker processes through TLS gateway and hub", len(s.workers))}
	apiLog := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	name := run.APIName(s.lm, o.API)
	ready := func(addr string) {
		fmt.Fprintf(stdout, "kvasir demo: loopback swarm (hub, TLS gateway, %d worker processes), model %s\n", len(s.workers), name)
		fmt.Fprintf(stdout, "API: http://%s/v1 (OpenAI-compatible; metrics at http://%s/metrics)\n", addr, addr)
		fmt.Fprintf(stdout, "try: %s\n", Curl(addr, name, o.API.APIKey != ""))
		if o.API.Requests > 0 {
			fmt.Fprintf(stdout, "serving %d completion requests, then stopping\n", o.API.Requests)
		} else {
			fmt.Fprintln(stdout, "serving until Ctrl-C")
		}
	}
	if err := run.ServeAPI(ctx, s.lm, ex, o.API, apiLog, ready); err != nil {
		return err
	}
	st := s.d.Stats()
	fmt.Fprintf(stdout, "experts: %d computed by workers, %d locally; stopping the swarm\n", st.ExpertsRemote, st.ExpertsLocal)
	return nil
}

// Curl is a ready-to-paste curl command streaming a chat completion
// from the API at addr; with a key it sends $KVASIR_API_KEY.
func Curl(addr, model string, key bool) string {
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": 32,
		"messages": []map[string]string{{"role": "user", "content": "Tell me about the swarm."}}})
	auth := ""
	if key {
		auth = ` -H "Authorization: Bearer $KVASIR_API_KEY"`
	}
	return fmt.Sprintf("curl -N http://%s/v1/chat/completions -H 'Content-Type: application/json'%s -d '%s'", addr, auth,
		strings.ReplaceAll(string(body), "'", `'\''`))
}

// Print writes the demo's result for a person.
func Print(w io.Writer, r *Result) {
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
	if !r.LogitsEqual {
		// A GPU worker's answers are checked within a tolerance, not to
		// the bit: name them, so that the "NO" has its reason.
		var gpus []string
		for _, x := range r.Workers {
			for _, s := range x.Sessions {
				if s.Tolerance > 0 {
					gpus = append(gpus, x.Name+" ("+s.Backend+")")
				}
			}
		}
		if len(gpus) > 0 {
			fmt.Fprintf(w, "         (non-CPU workers, checked within a tolerance rather than to the bit: %s)\n", strings.Join(gpus, ", "))
		}
	}
	fmt.Fprintf(w, "experts: %d computed by workers, %d locally\n", r.ExpertsRemote, r.ExpertsLocal)
	if c := r.Capacity; c != nil {
		fmt.Fprintf(w, "capacity: the backbone loaded a %d-byte backbone-only file (full model %d bytes, experts %d bytes, %d held here)\n",
			c.BackboneBytes, c.FullBytes, c.ExpertBytes, c.LocalExperts)
		fmt.Fprintf(w, "          workers downloaded their experts from %s (%d range requests, %d bytes), verified against the file's hashes\n",
			c.SourceURL, c.SourceRequests, c.SourceBytes)
		fmt.Fprintf(w, "          coverage: %d of %d experts held, replicas %v (index: holders), fewest %d; %d results cross-checked between replicas\n",
			c.Coverage.Covered, c.Coverage.Experts, c.Coverage.ByReplicas, c.Coverage.MinReplicas, c.CrossChecks)
	}
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
		held := "layers " + strings.Join(ls, ",")
		if len(ls) == 0 {
			held = "provisioned"
		}
		fmt.Fprintf(w, "%s (pid %d, %s, %s): rows %d, bytes in %d out %d", x.Name, x.Pid,
			held, x.Address, x.Rows, x.BytesIn, x.BytesOut)
		for _, s := range x.Sessions {
			fmt.Fprintf(w, ", %s, rtt p50 %.2f ms p99 %.2f ms", s.Backend, s.RTTp50ms, s.RTTp99ms)
		}
		fmt.Fprintf(w, "\n    ledger %d creditable bytes (%s MB, %d rejected) -> credited %s (%d nKVR at %d nKVR/byte)\n",
			x.LedgerBytes, walletapi.FormatUnits(x.LedgerBytes), x.RejectedBytes, x.CreditedKVR, x.CreditedNKVR, r.RateNKVRPerByte)
	}
	if r.Dir != "" {
		fmt.Fprintf(w, "files:   %s (backbone ledger --db %s; backbone wallets --db %s)\n", r.Dir,
			filepath.Join(r.Dir, "ledger.sqlite"), filepath.Join(r.Dir, "wallets.sqlite"))
	}
}
