package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/gateway"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// tinyLocal loads an independent instance of the embedded tiny model.
func tinyLocal(t *testing.T) (*model.Model, *tokenizer.Tokenizer) {
	t.Helper()
	data, err := demomodel.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		t.Fatal(err)
	}
	return m, tok
}

// localGreedyText decodes prompt greedily on the local model (whole prompt,
// then token by token) and returns the text a client sees.
func localGreedyText(t *testing.T, prompt string, n int) string {
	t.Helper()
	m, tok := tinyLocal(t)
	ids := tok.Tokenize(prompt, true, false)
	seq := m.NewSequence()
	rows := make([]model.Row, len(ids))
	for i, id := range ids {
		rows[i] = model.Row{Seq: seq, Token: id, Pos: i, Logits: i == len(ids)-1}
	}
	logits := make([]float32, m.Params().Vocab)
	if err := m.Forward(context.Background(), rows, logits); err != nil {
		t.Fatal(err)
	}
	var text []byte
	for i := 0; ; i++ {
		next := model.Greedy(logits)
		text = append(text, tok.Piece(next)...)
		if i+1 >= n || tok.IsEOG(next) {
			return tokenizer.ToValidUTF8(text)
		}
		if err := m.Forward(context.Background(), []model.Row{{Seq: seq, Token: next, Pos: seq.Len(), Logits: true}}, logits); err != nil {
			t.Fatal(err)
		}
	}
}

// startServe runs serveMain in the background and returns its HTTP address;
// the cleanup cancels it and checks it exits 0.
func startServe(t *testing.T, args ...string) string {
	t.Helper()
	addr, _ := startServeLogs(t, args...)
	return addr
}

// startServeLogs is startServe that also returns serve's log (stderr).
func startServeLogs(t *testing.T, args ...string) (string, *swarmtest.SyncBuffer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan string, 1)
	code := make(chan int, 1)
	logs := &swarmtest.SyncBuffer{}
	go func() {
		code <- serveMain(ctx, append([]string{"--http", "127.0.0.1:0"}, args...), logs, func(a string) { addr <- a })
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case c := <-code:
			if c != 0 {
				t.Errorf("serve exited %d: %s", c, logs.String())
			}
		case <-time.After(30 * time.Second):
			t.Errorf("serve did not stop")
		}
	})
	select {
	case a := <-addr:
		return a, logs
	case c := <-code:
		code <- c // for the cleanup
		t.Fatalf("serve exited %d: %s", c, logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("serve not ready: %s", logs.String())
	}
	return "", logs
}

// streamCompletion streams a greedy completion and returns its text.
func streamCompletion(t *testing.T, addr, prompt string, n int, header ...string) (string, int) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": n, "temperature": 0, "stream": true})
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/completions", bytes.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return string(b), resp.StatusCode
	}
	var text strings.Builder
	sc := bufio.NewScanner(resp.Body)
	done := false
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			done = true
			break
		}
		var c struct {
			Choices []struct {
				Text string `json:"text"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(line), &c); err != nil {
			t.Fatalf("chunk %q: %v", line, err)
		}
		for _, ch := range c.Choices {
			text.WriteString(ch.Text)
		}
	}
	if !done {
		t.Fatalf("stream ended without [DONE] (%v)", sc.Err())
	}
	return text.String(), 200
}

func getMetrics(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestServeCommandLocal(t *testing.T) {
	const prompt = "Once upon a time"
	addr := startServe(t, "--api-key", "sekret", "--threads", "1")
	got, code := streamCompletion(t, addr, prompt, 12, "Authorization", "Bearer sekret")
	if code != 200 {
		t.Fatalf("%d %s", code, got)
	}
	if want := localGreedyText(t, prompt, 12); got != want {
		t.Errorf("served %q, local decode %q", got, want)
	}
	if body, code := streamCompletion(t, addr, prompt, 2, "Authorization", "Bearer wrong"); code != 401 || !strings.Contains(body, "invalid_api_key") {
		t.Errorf("wrong key: %d %s", code, body)
	}
	resp, err := http.Get("http://" + addr + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("models without a key: %d, want 401", resp.StatusCode)
	}
	if m := getMetrics(t, addr); !strings.Contains(m, "kvasir_serve_generated_tokens_total 12") {
		t.Errorf("metrics after 12 tokens:\n%s", m)
	}
}

func TestServeCommandFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		flag string // the flag the error names
	}{{[]string{"extra"}, "extra"}, {[]string{"--max-batch", "0"}, "--max-batch"}, {[]string{"--max-seqs", "0"}, "--max-seqs"},
		{[]string{"--wait-workers", "1"}, "--wait-workers"}, {[]string{"--queue", "-1"}, "--queue"}, {[]string{"--lanes", "-1"}, "--lanes"},
		{[]string{"--lanes", "17"}, "--lanes"}, {[]string{"--threads", "-2"}, "--threads"}, {[]string{"--ready-holders", "-1"}, "--ready-holders"},
		{[]string{"--chat-template", "jinja"}, "--chat-template"},
		{[]string{"--provision-rate", "fast"}, "provision-rate"}, {[]string{"--provision-rate", "-1"}, "provision-rate"}} {
		var errb bytes.Buffer
		if c := serveMain(context.Background(), tc.args, &errb, nil); c != 2 || !strings.Contains(errb.String(), tc.flag) {
			t.Errorf("serve %v: exit %d, want 2 and an error naming %s (%s)", tc.args, c, tc.flag, errb.String())
		}
	}
	var errb bytes.Buffer
	if c := serveMain(context.Background(), []string{"--model", "/nonexistent.gguf"}, &errb, nil); c != 1 {
		t.Errorf("missing model: exit %d, want 1", c)
	}
	// The API's address is bound before the model loads: a busy port is
	// the error even when the model would fail too (or take minutes).
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	errb.Reset()
	if c := serveMain(context.Background(), []string{"--model", "/nonexistent.gguf", "--http", busy.Addr().String()}, &errb, nil); c != 1 ||
		!strings.Contains(errb.String(), "address already in use") {
		t.Errorf("busy port: exit %d, want 1 and the bind error first (%s)", c, errb.String())
	}
}

// TestServeSwarmAllRemote: the API served over a swarm on loopback
// (dispatcher <- hub <- TLS gateway <- worker holding every expert): a
// streamed greedy completion equals the local decode, and every expert
// output was computed by the worker.
func TestServeSwarmAllRemote(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// serve binds its dispatch listener first (port 0: no port is
	// reserved and given back, which another process could take), then
	// hub, gateway and worker come up behind it.
	addr, logs := startServeLogs(t, "--dispatch-listen", "127.0.0.1:0", "--lanes", "2", "--min-deadline", "3s")
	m := regexp.MustCompile(`serve: dispatch listening on (\S+) `).FindStringSubmatch(logs.String())
	if m == nil {
		t.Fatalf("no dispatch address in serve's log:\n%s", logs.String())
	}
	dispatchAddr := m[1]

	secret := []byte("0123456789abcdef0123456789abcdef")
	h, err := hub.New(hub.Config{Listen: "127.0.0.1:0", Backbone: dispatchAddr, Secret: secret, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	srvTLS, pool := loopbackTLS(t)
	g, err := gateway.New(gateway.Config{Listen: "127.0.0.1:0", HubURL: h.Addr(), Secret: secret,
		TLSConfig: srvTLS, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })

	lm, err := loadGenModel("")
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	local := lm.m.LocalExperts()
	_, key, _ := ed25519.GenerateKey(nil)
	w, err := worker.New(worker.Config{GatewayURL: "wss://" + g.Addr(), Key: key, RootCAs: pool, Computer: local,
		Holdings: worker.HoldingsOf(local, nil), ModelID: lm.id, Backend: "cpu", Threads: 1,
		Logger: quiet, BackoffBase: 20 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	wdone := make(chan struct{})
	go func() { defer close(wdone); _ = w.Run(wctx) }()
	t.Cleanup(func() { wcancel(); <-wdone })

	p := lm.m.Params()
	deadline := time.Now().Add(30 * time.Second)
	for metricSum(getMetrics(t, addr), "kvasir_swarm_worker_holdings") != float64(p.Layers*p.Experts) {
		if time.Now().After(deadline) {
			t.Fatalf("the worker did not connect with all %d experts:\n%s", p.Layers*p.Experts, grepLines(getMetrics(t, addr), "kvasir_swarm_"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	const prompt = "The swarm computes"
	got, code := streamCompletion(t, addr, prompt, 10)
	if code != 200 {
		t.Fatalf("%d %s", code, got)
	}
	if want := localGreedyText(t, prompt, 10); got != want {
		t.Errorf("swarm %q, local decode %q", got, want)
	}
	met := getMetrics(t, addr)
	if !strings.Contains(met, `kvasir_swarm_expert_outputs_total{where="local"} 0`) ||
		strings.Contains(met, `kvasir_swarm_expert_outputs_total{where="remote"} 0`) ||
		!strings.Contains(met, "kvasir_swarm_worker_round_trips_total{") {
		t.Errorf("swarm metrics:\n%s", grepLines(met, "kvasir_swarm_"))
	}
}

func grepLines(s, prefix string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
