package dispatch_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/wire"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// The trust tests' worker processes (this test binary re-executed with
// KVASIR_TEST_CHILD_TRUST=1). The environment says what each one is:
//
//	KVASIR_GATEWAY, KVASIR_CA  where to connect, the gateway's certificate
//	KVASIR_KEY                 hex ed25519 seed (the same key across restarts)
//	KVASIR_MODEL               "fake:D,K,NLAYER,NEXPERT" (fakeExperts) or "fixture:NAME" (a ../shared/fixtures GGUF)
//	KVASIR_LAYERS              layers held, "0,1,2"
//	KVASIR_DELAY               sleep per computation (time.ParseDuration)
//	KVASIR_BACKEND             HELLO backend (default "cpu-test": exact bits)
//	KVASIR_LIE                 "" honest; "always"; "after:N:every:M": honest for N results, then each M-th result is
//	                           scaled by 1.01 (finite, plausible, wrong); "after:N:every:M:one": the same, but only
//	                           its first float is changed, by 0.1 %
//	KVASIR_SPLIT               "1": a hand-driven client that answers every DISPATCH_DIGEST with the correct DIGEST
//	                           and every DISPATCH with a RESULT whose first float is 0.1 % off (quorum)
//	KVASIR_FORGE               "1": a hand-driven client that answers its first DISPATCH honestly and then sends a
//	                           RESULT for a request it was never sent
//
// It prints CONNECTED at each WELCOME, COMPUTING before each computation,
// LIE after each corrupted result, REFUSED <reason> when the backbone
// refuses it, and CLOSED <code> <reason> when a forging client is closed.
func trustChild() int {
	pem, err := os.ReadFile(os.Getenv("KVASIR_CA"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	seed, err := hex.DecodeString(os.Getenv("KVASIR_KEY"))
	if err != nil || len(seed) != ed25519.SeedSize {
		fmt.Fprintln(os.Stderr, "KVASIR_KEY: want 64 hex digits")
		return 1
	}
	key := ed25519.NewKeyFromSeed(seed)
	var layers []int
	for _, f := range strings.Split(os.Getenv("KVASIR_LAYERS"), ",") {
		var l int
		fmt.Sscan(f, &l)
		layers = append(layers, l)
	}
	delay, _ := time.ParseDuration(os.Getenv("KVASIR_DELAY"))
	var out sync.Mutex
	say := func(format string, a ...any) {
		out.Lock()
		fmt.Printf(format+"\n", a...)
		out.Unlock()
	}
	var comp expert.Computer
	var hs []wire.Holding
	modelID := ""
	spec := os.Getenv("KVASIR_MODEL")
	switch {
	case strings.HasPrefix(spec, "fake:"):
		var m dispatch.Model
		fmt.Sscanf(spec, "fake:%d,%d,%d,%d", &m.D, &m.K, &m.NLayer, &m.NExpert)
		comp = &fakeExperts{d: m.D, nExpert: m.NExpert, holds: holdsLayers(layers...)}
		hs, modelID = holdings(m, layers...), "fake-moe"
	case strings.HasPrefix(spec, "fixture:"):
		name := strings.TrimPrefix(spec, "fixture:")
		f, err := gguf.Open(filepath.Join(fixtures, name))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		mm, err := model.Load(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		wl := mm.LocalExperts()
		comp, hs, modelID = wl, worker.HoldingsOf(wl, layers), name
	default:
		fmt.Fprintln(os.Stderr, "KVASIR_MODEL:", spec)
		return 1
	}
	lc := &lyingComputer{inner: comp, delay: delay, say: say}
	if mode := os.Getenv("KVASIR_LIE"); mode == "always" {
		lc.every = 1
	} else if mode != "" {
		if _, err := fmt.Sscanf(mode, "after:%d:every:%d", &lc.after, &lc.every); err != nil {
			fmt.Fprintln(os.Stderr, "KVASIR_LIE:", err)
			return 1
		}
		lc.one = strings.HasSuffix(mode, ":one")
	}
	backend := os.Getenv("KVASIR_BACKEND")
	if backend == "" {
		backend = "cpu-test"
	}
	if os.Getenv("KVASIR_FORGE") == "1" {
		return forge(key, pool, hs, modelID, lc, say)
	}
	if os.Getenv("KVASIR_SPLIT") == "1" {
		return splitLiar(key, pool, hs, modelID, lc, say)
	}
	w, err := worker.New(worker.Config{GatewayURL: os.Getenv("KVASIR_GATEWAY"), Key: key, RootCAs: pool,
		Computer: lc, Holdings: hs, ModelID: modelID, Backend: backend, Threads: 1, Logger: quiet,
		BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		session, refusal := "", ""
		for {
			st := w.Stats()
			if st.State == worker.StateConnected && st.Session != session {
				session = st.Session
				say("CONNECTED")
			}
			if strings.Contains(st.LastError, "refused") && st.LastError != refusal {
				refusal = st.LastError
				say("REFUSED %s", refusal)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	_ = w.Run(context.Background())
	return 0
}

// lyingComputer computes with inner and then corrupts the results its mode
// says: none (every = 0), or after `after` honest results each every-th one.
type lyingComputer struct {
	inner        expert.Computer
	delay        time.Duration
	after, every int64
	one          bool // change only out[0], by 0.1 %
	n            atomic.Int64
	say          func(string, ...any)
}

func (l *lyingComputer) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	l.say("COMPUTING")
	if l.delay > 0 {
		time.Sleep(l.delay)
	}
	if err := l.inner.ComputeExperts(ctx, layer, hidden, ids, n, k, out); err != nil {
		return err
	}
	i := l.n.Add(1) // 1-based result number
	if l.every > 0 && i > l.after && (i-l.after)%l.every == 0 {
		if l.one {
			out[0] *= 1.001
		} else {
			for j := range out {
				out[j] *= 1.01
			}
		}
		l.say("LIE")
	}
	return nil
}

// handDriven is a hand-driven worker (forge, splitLiar): it dials the
// gateway with key, says HELLO with hs, prints CONNECTED at WELCOME, and
// for each DISPATCH computes the pairs it asks for with comp into a
// RESULT (per pair, in the request's order) that answer sends as it
// likes; when the connection ends it prints CLOSED <code> <reason> and
// returns 0 (1 on any other error).
func handDriven(key ed25519.PrivateKey, pool *x509.CertPool, hs []wire.Holding, modelID string, comp expert.Computer, say func(string, ...any),
	answer func(ctx context.Context, c *websocket.Conn, f *wire.Dispatch, res *wire.Result)) int {
	u := os.Getenv("KVASIR_GATEWAY") + wire.WorkerPath
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	ctx := context.Background()
	c, _, err := websocket.Dial(ctx, u, &websocket.DialOptions{HTTPClient: client,
		HTTPHeader: wire.SignUpgrade(key, "GET", "127.0.0.1", wire.WorkerPath, time.Now())})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	c.SetReadLimit(wire.MaxMessage)
	hello := &wire.Hello{Key: key.Public().(ed25519.PublicKey), ModelID: modelID, Backend: "cpu-test", Holdings: hs}
	if err := c.Write(ctx, websocket.MessageBinary, hello.Append(nil)); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	var lim *wire.Limits
	for {
		_, msg, err := c.Read(ctx)
		if err != nil {
			var ce websocket.CloseError
			if errors.As(err, &ce) {
				say("CLOSED %d %s", ce.Code, ce.Reason)
			} else {
				say("CLOSED 0 %v", err)
			}
			return 0
		}
		f, err := wire.Decode(msg, lim)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		switch f := f.(type) {
		case *wire.Welcome:
			lim = &wire.Limits{D: int(f.D), K: int(f.K), NLayer: int(f.NLayer), NExpert: int(f.NExpert)}
			say("CONNECTED")
		case *wire.Dispatch:
			var xs []float32
			var es []int32
			for r := 0; r < f.N; r++ {
				for s := 0; s < f.K; s++ {
					if id := f.IDs[r*f.K+s]; id != -1 {
						xs = append(xs, f.Hidden[r*f.D:(r+1)*f.D]...)
						es = append(es, id)
					}
				}
			}
			res := &wire.Result{Request: f.Request, M: len(es), D: f.D, Out: make([]float32, len(es)*f.D)}
			if err := comp.ComputeExperts(ctx, int(f.Layer), xs, es, len(es), 1, res.Out); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			answer(ctx, c, f, res)
		}
	}
}

// forge is a hand-driven worker that answers the first DISPATCH honestly
// and follows it with a RESULT for a request id it was never sent.
func forge(key ed25519.PrivateKey, pool *x509.CertPool, hs []wire.Holding, modelID string, comp expert.Computer, say func(string, ...any)) int {
	forged := false
	return handDriven(key, pool, hs, modelID, comp, say, func(ctx context.Context, c *websocket.Conn, _ *wire.Dispatch, res *wire.Result) {
		_ = c.Write(ctx, websocket.MessageBinary, res.Append(nil))
		if !forged {
			forged = true
			res.Request += 1000
			_ = c.Write(ctx, websocket.MessageBinary, res.Append(nil))
			say("FORGED %d", res.Request)
		}
	})
}

// trustProc is a running trust child and what it has said.
type trustProc struct {
	cmd                        *exec.Cmd
	connected, computing, lies atomic.Int64
	mu                         sync.Mutex
	lines                      []string // REFUSED, CLOSED and FORGED lines
	conn                       chan struct{}
}

// startTrustChild runs a trust child for the stack with env (KVASIR_...
// settings beyond the gateway and CA) and waits for its first WELCOME
// unless wait is false.
func (s *stack) startTrustChild(t *testing.T, env map[string]string, wait bool) *trustProc {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KVASIR_TEST_CHILD_TRUST=1", "KVASIR_CA="+s.caFile, "KVASIR_GATEWAY="+s.url)
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &trustProc{cmd: cmd, conn: make(chan struct{}, 64)}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			switch l := sc.Text(); {
			case l == "CONNECTED":
				p.connected.Add(1)
				select {
				case p.conn <- struct{}{}:
				default:
				}
			case l == "COMPUTING":
				p.computing.Add(1)
			case l == "LIE":
				p.lies.Add(1)
			default:
				p.mu.Lock()
				p.lines = append(p.lines, l)
				p.mu.Unlock()
			}
		}
	}()
	if wait {
		select {
		case <-p.conn:
		case <-time.After(30 * time.Second):
			t.Fatal("trust child did not connect")
		}
	}
	return p
}

// said returns the first line the child printed that starts with prefix.
func (p *trustProc) said(prefix string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.lines {
		if strings.HasPrefix(l, prefix) {
			return l, true
		}
	}
	return "", false
}

// fakeSpec is the KVASIR_MODEL of a trust child computing fakeExperts of
// m's shapes.
func fakeSpec(m dispatch.Model) string {
	return fmt.Sprintf("fake:%d,%d,%d,%d", m.D, m.K, m.NLayer, m.NExpert)
}

// childEnv is the environment of a trust child with key (a hex seed,
// newKey) computing model (KVASIR_MODEL) over layers 0-3, with kv, in
// pairs, adding or replacing KVASIR_... settings.
func childEnv(key, model string, kv ...string) map[string]string {
	env := map[string]string{"KVASIR_KEY": key, "KVASIR_MODEL": model, "KVASIR_LAYERS": "0,1,2,3"}
	for i := 0; i+1 < len(kv); i += 2 {
		env[kv[i]] = kv[i+1]
	}
	return env
}

// killWhenComputing SIGKILLs p's process as soon as it starts a
// computation (without waiting for that).
func killWhenComputing(p *trustProc) {
	go func() {
		for p.computing.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}()
}

// killedReplicaStack is a stack (deadline maxDL, every result checked in
// the default probation) with two worker processes holding every expert
// of m: slow takes 30 s per computation and is SIGKILLed as soon as it
// starts one (killWhenComputing), fast answers at once. It returns the
// stack, fast and fast's worker id.
func killedReplicaStack(t *testing.T, m dispatch.Model, maxDL time.Duration) (*stack, *trustProc, string) {
	t.Helper()
	s := newStack(t, m, 0, func(c *dispatch.Config) { c.MaxDeadline = maxDL; c.Probation, c.CheckRate = 0, 0 })
	slowKey, _ := newKey()
	fastKey, fastID := newKey()
	slow := s.startTrustChild(t, childEnv(slowKey, fakeSpec(m), "KVASIR_DELAY", "30s"), true)
	fast := s.startTrustChild(t, childEnv(fastKey, fakeSpec(m), "KVASIR_DELAY", "0s"), true)
	s.waitWorkers(t, 2)
	killWhenComputing(slow)
	return s, fast, fastID
}

// newKey returns a fresh ed25519 seed in hex and the worker id (hex public
// key) it gives.
func newKey() (seedHex, id string) {
	_, priv, _ := ed25519.GenerateKey(nil)
	return hex.EncodeToString(priv.Seed()), hex.EncodeToString(priv.Public().(ed25519.PublicKey))
}

// splitLiar is a hand-driven worker (protocol 7) that answers every
// DISPATCH_DIGEST (and DISPATCH_SUM_DIGEST) honestly, with the DIGEST of
// the correct RESULT (sum RESULT), and every DISPATCH (DISPATCH_SUM) with
// a RESULT whose first float is 0.1 % off: under quorum its digests
// confirm honest answers while its own answers are wrong.
func splitLiar(key ed25519.PrivateKey, pool *x509.CertPool, hs []wire.Holding, modelID string, comp expert.Computer, say func(string, ...any)) int {
	return handDriven(key, pool, hs, modelID, comp, say, func(ctx context.Context, c *websocket.Conn, f *wire.Dispatch, res *wire.Result) {
		if f.Sum { // every slot requested: the rows' weighted sums
			sums := make([]float32, f.N*f.D)
			expert.WeightedSum(sums, res.Out, f.Weights, f.K, f.D)
			res.M, res.Out = f.N, sums
		}
		out := res.Append(nil)
		if f.Digest {
			out = (&wire.Digest{Request: f.Request, M: res.M, D: res.D, Sum: wire.ResultDigest(out)}).Append(nil)
		} else {
			res.Out[0] *= 1.001
			out = res.Append(nil)
			say("LIE")
		}
		_ = c.Write(ctx, websocket.MessageBinary, out)
	})
}
