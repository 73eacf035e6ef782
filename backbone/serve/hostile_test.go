//go:build linux

package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// The hostile-client suite (issue 22): TestHostileClients and the helpers
// below. Linux only: it reads /proc/self/status and sets socket buffers.

const (
	hostileSeed    = 22
	stormClients   = 200
	stormMaxTokens = 48
)

// hostilePrompts are the storm's prompts; every completed stream is
// compared with a greedy reference decode of its prompt.
var hostilePrompts = []string{
	"The capital of France is", "Once upon a time", "def main():", "1, 2, 3, 4,",
	"The swarm holds the experts", "In the beginning", "SELECT * FROM", "Dear operator,",
}

// rssBytes reads the process's resident set size (VmRSS).
func rssBytes(t *testing.T) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
			kb, err := strconv.ParseUint(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}

// settledMemory collects garbage, returns what it can to the OS and
// reports the resident set and the live heap.
func settledMemory(t *testing.T) (rss, heap uint64) {
	t.Helper()
	for range 3 {
		runtime.GC()
		debug.FreeOSMemory()
		time.Sleep(20 * time.Millisecond)
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return rssBytes(t), ms.HeapAlloc
}

// checkAPIError checks that b is exactly an OpenAI error body:
// {"error":{"message":non-empty string,"type":non-empty string,
// "param":string|null,"code":string|null}}; it returns the code.
func checkAPIError(b []byte) (string, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return "", fmt.Errorf("not JSON: %v: %.200q", err, b)
	}
	if len(top) != 1 || top["error"] == nil {
		return "", fmt.Errorf("not {\"error\":...}: %.200s", b)
	}
	var e map[string]json.RawMessage
	if err := json.Unmarshal(top["error"], &e); err != nil || len(e) != 4 {
		return "", fmt.Errorf("error object %v: %.200s", err, b)
	}
	var msg, typ string
	if json.Unmarshal(e["message"], &msg) != nil || msg == "" || json.Unmarshal(e["type"], &typ) != nil || typ == "" {
		return "", fmt.Errorf("message or type: %.200s", b)
	}
	var code string
	for _, k := range []string{"param", "code"} {
		raw, ok := e[k]
		if !ok {
			return "", fmt.Errorf("no %s: %.200s", k, b)
		}
		if string(raw) == "null" {
			continue
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", fmt.Errorf("%s is neither a string nor null: %.200s", k, b)
		}
		if k == "code" {
			code = s
		}
	}
	return code, nil
}

// sseAnswer is a streamed answer as checkSSE read it.
type sseAnswer struct {
	events   int    // data events but [DONE]
	text     string // text or delta content, concatenated
	finish   string // the last finish_reason
	usage    *usage
	errCode  string // the code of an error event
	done     bool   // ended with data: [DONE]
	complete bool   // every byte belonged to a whole event
}

// checkSSE checks a server-sent-event body: blank-line separated events
// of one "data: " line each, every payload a JSON chunk of object (or an
// OpenAI error), "[DONE]" only last and only right after a finish chunk
// or an error event. A body cut short (a client that left) may end in a
// partial event, which is ignored.
func checkSSE(b []byte, object string) (sseAnswer, error) {
	var a sseAnswer
	parts := strings.Split(string(b), "\n\n")
	a.complete = parts[len(parts)-1] == ""
	parts = parts[:len(parts)-1] // the last is empty or a partial event
	lastFinish := false
	for i, p := range parts {
		payload, ok := strings.CutPrefix(p, "data: ")
		if !ok || strings.Contains(payload, "\n") {
			return a, fmt.Errorf("event %d is not one data line: %.120q", i, p)
		}
		if a.done {
			return a, fmt.Errorf("event %d after [DONE]", i)
		}
		if payload == "[DONE]" {
			if !lastFinish && a.errCode == "" {
				return a, fmt.Errorf("[DONE] without a finish chunk or an error event before it")
			}
			a.done = true
			continue
		}
		if a.errCode != "" {
			return a, fmt.Errorf("event %d after an error event", i)
		}
		a.events++
		if strings.HasPrefix(payload, `{"error"`) {
			code, err := checkAPIError([]byte(payload))
			if err != nil {
				return a, fmt.Errorf("error event %d: %v", i, err)
			}
			a.errCode = code
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Model   string `json:"model"`
			Choices []struct {
				Text  *string `json:"text"`
				Delta *struct {
					Content *string `json:"content"`
				} `json:"delta"`
				Finish *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage `json:"usage"`
		}
		if err := json.Unmarshal([]byte(payload), &c); err != nil {
			return a, fmt.Errorf("event %d: %v: %.120q", i, err, payload)
		}
		if c.Object != object || c.ID == "" || c.Model != "tiny" {
			return a, fmt.Errorf("event %d: object %q id %q model %q, want %q", i, c.Object, c.ID, c.Model, object)
		}
		if c.Usage != nil {
			a.usage = c.Usage
		}
		lastFinish = lastFinish && len(c.Choices) == 0 // the usage chunk follows the finish chunk
		for _, ch := range c.Choices {
			if ch.Text != nil {
				a.text += *ch.Text
			}
			if ch.Delta != nil && ch.Delta.Content != nil {
				a.text += *ch.Delta.Content
			}
			lastFinish = ch.Finish != nil
			if ch.Finish != nil {
				a.finish = *ch.Finish
			}
		}
	}
	return a, nil
}

// rawPost opens a TCP connection to addr and writes a POST's head for
// path declaring n body bytes (n < 0: chunked), then body.
func rawPost(d *net.Dialer, addr, path string, n int, body string) (net.Conn, error) {
	c, err := d.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	head := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: kvasir\r\nContent-Type: application/json\r\n", path)
	if n >= 0 {
		head += fmt.Sprintf("Content-Length: %d\r\n\r\n", n)
	} else {
		head += "Transfer-Encoding: chunked\r\n\r\n"
	}
	if _, err := io.WriteString(c, head+body); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// slowNetIP is the loopback address the never-reading clients dial from.
// The server gives their connections a 16 KiB send buffer (its ConnState
// hook), as a thin link would hold, and the clients set a 4 KiB receive
// buffer: without that the kernel lets a loopback socket's send buffer
// grow to a few MB (net.ipv4.tcp_wmem), and generating that much takes
// the model longer than the write timeout the test is about.
var slowNetIP = net.IPv4(127, 0, 0, 2)

// smallRcvBuf dials from slowNetIP with a 4 KiB receive buffer.
var smallRcvBuf = &net.Dialer{LocalAddr: &net.TCPAddr{IP: slowNetIP}, Control: func(_, _ string, c syscall.RawConn) error {
	var serr error
	err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
	return errors.Join(err, serr)
}}

// gatedExperts computes with inner until closed; then every call waits
// for its context (the scheduler's, which Close ends), counted in waiting.
type gatedExperts struct {
	inner   expert.Computer
	closed  atomic.Bool
	waiting atomic.Int32
}

func (g *gatedExperts) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	if g.closed.Load() {
		g.waiting.Add(1)
		defer g.waiting.Add(-1)
		<-ctx.Done()
		return ctx.Err()
	}
	return g.inner.ComputeExperts(ctx, layer, hidden, ids, n, k, out)
}

// eogBias is a logit_bias that forbids every end-of-generation token, so
// a greedy stream runs to max_tokens.
func eogBias(tok *tokenizer.Tokenizer) map[string]int {
	b := map[string]int{}
	for id := range int32(tok.VocabSize()) {
		if tok.IsEOG(id) {
			b[strconv.Itoa(int(id))] = -100
		}
	}
	return b
}

// TestHostileClients runs the API as backbone serve ships it (every
// Config limit at its default, NewHTTPServer's http.Server, a Shutdown
// drain of DefaultShutdownDrain) over loopback TCP against hostile
// clients, all at once after a warm-up storm that sets the memory
// baseline:
//
//  1. slow clients: two stalled bodies and a trickling one (408
//     body_timeout after BodyTimeout), twenty connections stalled in
//     their headers (closed after ReadHeaderTimeout, no answer), two
//     streams never read (dropped after WriteTimeout: the server closes
//     the connection and the stream they find is cut, no [DONE]);
//  2. malformed, oversized and wrongly typed requests, each answered with
//     its status and an OpenAI error body, the 8 MB ones allocating at
//     most 8 bytes per body byte;
//  3. 200 concurrent streams (seeded), half of which leave: cancel after
//     some events, cancel at a random moment, reset the TCP connection
//     mid-stream, die while sending the body; every stream read to its
//     end is well-formed SSE ending in [DONE] whose text, finish and usage
//     equal a greedy reference decode;
//  4. SIGTERM mid-stream (testShutdownMidStream).
//
// Afterwards no goroutine is left (goleak), the live heap and the resident
// set are back to the baseline (tolerances below), and the server still
// answers exactly. The defaults make it wait about 45 s: the 30 s body and
// write timeouts, with the rest running meanwhile.
func TestHostileClients(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the default 30 s body and write timeouts")
	}
	m, tok := loadTiny(t)
	chat, chatErr := ChatTemplateFor(tok, "", "auto")
	if chatErr != nil {
		t.Fatal(chatErr)
	}
	// Reference decodes (the package's reference model, loaded once).
	type ref struct {
		completion, chat []int32 // prompt tokens
		compOut, chatOut []int32 // greedy continuation, stormMaxTokens tokens or up to an end of generation
	}
	refs := make([]ref, len(hostilePrompts))
	for i, p := range hostilePrompts {
		r := &refs[i]
		r.completion = tok.Tokenize(p, true, false)
		var err error
		if r.chat, err = chat.Apply([]Message{{Role: "user", Content: p}}); err != nil {
			t.Fatal(err)
		}
		r.compOut, r.chatOut = directGreedy(t, r.completion, stormMaxTokens), directGreedy(t, r.chat, stormMaxTokens)
	}
	m2, _ := loadTiny(t) // the instance the shutdown server decodes with
	gate := &gatedExperts{inner: m2.LocalExperts()}
	m2.SetExperts(gate)
	// The shutdown phase's model sees its requests' shapes once first (its
	// buffers, kept for the model's life, grow to them); the storm's model
	// sees them in the warm-up storm below.
	warmModel(t, m2, tok, chat)
	testStart := time.Now()
	phase := func(what string) { t.Logf("%6.1fs %s", time.Since(testStart).Seconds(), what) }

	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	// The server as backbone serve runs it: every limit at its default.
	reg := prometheus.NewRegistry()
	s, err := New(Config{Model: m, Tokenizer: tok, ModelID: "tiny", Chat: chat, Registry: reg, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTPServer(s.Handler())
	tr := &http.Transport{MaxIdleConnsPerHost: stormClients + 16}
	var connStates sync.Map // client address -> the server side's last http.ConnState
	var conns atomic.Int64  // server-side connections open
	hs.ConnState = func(c net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			conns.Add(1)
			if tc, ok := c.(*net.TCPConn); ok && tc.RemoteAddr().(*net.TCPAddr).IP.Equal(slowNetIP) {
				_ = tc.SetWriteBuffer(16 << 10)
			}
		case http.StateClosed, http.StateHijacked:
			conns.Add(-1)
		}
		connStates.Store(c.RemoteAddr().String(), st)
	}
	// noConns closes the client's idle connections and waits until the
	// server has closed its side of every connection (their buffers and
	// goroutines are gone) before memory is measured.
	noConns := func(what string) {
		t.Helper()
		tr.CloseIdleConnections()
		for deadline := time.Now().Add(10 * time.Second); conns.Load() != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the server still has %d connections", what, conns.Load())
			}
		}
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	addr := ln.Addr().String()
	base := "http://" + addr
	client := &http.Client{Transport: tr}
	defer tr.CloseIdleConnections()
	var dialer net.Dialer

	// storm runs stormClients concurrent streaming requests; with leave,
	// a seeded share of the clients leave mid-stream in four ways. It
	// returns how many completed, and fails the test on any answer that
	// is not well formed or whose text is not the reference's.
	storm := func(rng *rand.Rand, leave bool) (completed, left int) {
		type plan struct {
			prompt, maxTokens, mode, after int
			chat, usage, logprobs          bool
		}
		plans := make([]plan, stormClients)
		for i := range plans {
			p := plan{prompt: rng.IntN(len(hostilePrompts)), maxTokens: 1 + rng.IntN(stormMaxTokens), chat: rng.IntN(2) == 0,
				usage: rng.IntN(2) == 0, logprobs: rng.IntN(4) == 0, after: 1 + rng.IntN(6)}
			if leave {
				// 0 reads to the end (half), 1 cancels after some events,
				// 2 cancels at a random moment (before the headers or
				// after), 3 resets its TCP connection mid-stream, 4 dies
				// while sending its body.
				p.mode = []int{0, 0, 0, 0, 0, 1, 1, 2, 3, 4}[rng.IntN(10)]
				if p.mode == 2 {
					p.after = rng.IntN(40) // ms
				}
			}
			plans[i] = p
		}
		var wg sync.WaitGroup
		var nDone, nLeft atomic.Int64
		var mu sync.Mutex
		var failures []string
		fail := func(i int, format string, a ...any) {
			mu.Lock()
			defer mu.Unlock()
			failures = append(failures, fmt.Sprintf("client %d %+v: ", i, plans[i])+fmt.Sprintf(format, a...))
		}
		start := make(chan struct{})
		for i, p := range plans {
			wg.Go(func() {
				<-start
				r := refs[p.prompt]
				req := map[string]any{"model": "tiny", "max_tokens": p.maxTokens, "temperature": 0, "stream": true}
				if !leave {
					// The warm-up: every client a chat of stormMaxTokens
					// tokens (no end of generation), the longest
					// sequences the storm makes, so that every sequence
					// the scheduler keeps for reuse has the KV capacity
					// the storm will need (reserve: 64, then 128 positions).
					p.chat, p.maxTokens, p.usage = true, stormMaxTokens, true
					req["max_tokens"], req["logit_bias"] = stormMaxTokens, eogBias(tok)
				}
				path, object, prompt, out := "/v1/completions", "text_completion", r.completion, r.compOut
				if p.chat {
					path, object, prompt, out = "/v1/chat/completions", "chat.completion.chunk", r.chat, r.chatOut
					req["messages"] = []map[string]string{{"role": "user", "content": hostilePrompts[p.prompt]}}
					if p.logprobs {
						req["logprobs"], req["top_logprobs"] = true, 3
					}
				} else {
					req["prompt"] = hostilePrompts[p.prompt]
					if p.logprobs {
						req["logprobs"] = 3
					}
				}
				if p.usage {
					req["stream_options"] = map[string]bool{"include_usage": true}
				}
				body, _ := json.Marshal(req)
				switch p.mode {
				case 3, 4:
					nLeft.Add(1)
					n := len(body)
					if p.mode == 4 {
						body = body[:n/2]
					}
					c, err := rawPost(&dialer, addr, path, n, string(body))
					if err != nil {
						fail(i, "dial: %v", err)
						return
					}
					if p.mode == 3 {
						_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
						br := bufio.NewReader(c)
						line, err := br.ReadString('\n')
						if err != nil || line != "HTTP/1.1 200 OK\r\n" {
							fail(i, "status line %q: %v", line, err)
						}
						for range p.after * 2 { // a few lines of the stream
							if _, err := br.ReadString('\n'); err != nil {
								break
							}
						}
						_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
					}
					c.Close()
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				if p.mode == 2 {
					time.AfterFunc(time.Duration(p.after)*time.Millisecond, cancel)
				}
				hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+path, bytes.NewReader(body))
				hreq.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(hreq)
				if err != nil {
					if p.mode == 2 && errors.Is(err, context.Canceled) {
						nLeft.Add(1)
						return
					}
					fail(i, "request: %v", err)
					return
				}
				defer resp.Body.Close()
				if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
					b, _ := io.ReadAll(resp.Body)
					fail(i, "status %d %q: %.200s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
					return
				}
				var got []byte
				if p.mode == 1 {
					// Read whole events until after of them, then leave.
					br := bufio.NewReader(resp.Body)
					for n := 0; n < p.after; {
						line, err := br.ReadBytes('\n')
						got = append(got, line...)
						if err != nil {
							break
						}
						if bytes.Equal(line, []byte("\n")) {
							n++
						}
					}
					cancel()
					rest, _ := io.ReadAll(br) // what was already buffered, then the cancel's error
					got = append(got, rest...)
				} else {
					got, err = io.ReadAll(resp.Body)
					if err != nil && !(p.mode == 2 && errors.Is(err, context.Canceled)) {
						fail(i, "reading the stream: %v", err)
						return
					}
				}
				a, err := checkSSE(got, object)
				if err != nil {
					fail(i, "malformed stream: %v", err)
					return
				}
				if !a.done {
					if p.mode == 0 {
						fail(i, "the stream ended without [DONE] (%d events)", a.events)
					} else {
						nLeft.Add(1)
					}
					return
				}
				if !leave { // the warm-up: no end of generation, so no reference text
					if u := (usage{len(prompt), stormMaxTokens, len(prompt) + stormMaxTokens}); !a.complete || a.errCode != "" || a.finish != "length" || a.usage == nil || *a.usage != u {
						fail(i, "warm-up answer %+v, want %d tokens (usage %+v)", a, stormMaxTokens, u)
					}
					nDone.Add(1)
					return
				}
				// A whole answer: the reference's text, finish and usage.
				want := out[:min(p.maxTokens, len(out))]
				finish := "length"
				if len(want) < p.maxTokens || tok.IsEOG(want[len(want)-1]) {
					finish = "stop"
				}
				if !a.complete || a.errCode != "" || a.text != wantText(tok, want) || a.finish != finish {
					fail(i, "answer %+v, want text %q finish %q", a, wantText(tok, want), finish)
				}
				if u := (usage{len(prompt), len(want), len(prompt) + len(want)}); p.usage && (a.usage == nil || *a.usage != u) {
					fail(i, "usage %+v, want %+v", a.usage, u)
				}
				nDone.Add(1)
			})
		}
		close(start)
		wg.Wait()
		for i, f := range failures {
			if i == 10 {
				t.Errorf("... and %d more", len(failures)-10)
				break
			}
			t.Error(f)
		}
		return int(nDone.Load()), int(nLeft.Load())
	}
	idle := func(what string) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for st := s.Stats(); st.Active != 0 || st.Queued != 0; st = s.Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the scheduler still holds %+v", what, st)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// Warm-up: the same storm with every client reading to the end, so the
	// baseline holds what a storm leaves by design (the scheduler's pool
	// of up to MaxSeqs cleared sequences, the transport's idle connections).
	if done, _ := storm(rand.New(rand.NewPCG(hostileSeed, 0)), false); done != stormClients {
		t.Fatalf("warm-up: %d of %d streams completed", done, stormClients)
	}
	idle("warm-up")
	noConns("warm-up")
	rss0, heap0 := settledMemory(t)
	phase(fmt.Sprintf("baseline after the warm-up storm: RSS %.1f MiB, heap %.1f MiB", float64(rss0)/(1<<20), float64(heap0)/(1<<20)))

	// 1. Slow clients, on the default timeouts, while the rest goes on:
	// two bodies that stall and one that trickles a byte a second get 408
	// after BodyTimeout; twenty connections that stall in their headers
	// are closed after ReadHeaderTimeout without an answer; two streams
	// whose clients never read are dropped after WriteTimeout (they find a
	// cut stream, no [DONE], when they finally read).
	slowStart := time.Now()
	var slow sync.WaitGroup
	slowErr := func(format string, a ...any) { t.Errorf("slow client: "+format, a...) }
	for i := range 3 {
		slow.Go(func() {
			c, err := rawPost(&dialer, addr, "/v1/completions", 1000, `{"prompt":`)
			if err != nil {
				slowErr("%v", err)
				return
			}
			defer c.Close()
			if i == 2 { // trickle: a byte a second, never the whole body
				go func() {
					for range 40 {
						time.Sleep(time.Second)
						if _, err := c.Write([]byte(" ")); err != nil {
							return
						}
					}
				}()
			}
			_ = c.SetReadDeadline(time.Now().Add(DefaultBodyTimeout + 15*time.Second))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			el := time.Since(slowStart)
			if err != nil {
				slowErr("body %d: no answer after %v: %v", i, el, err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if code, err := checkAPIError(b); err != nil || resp.StatusCode != 408 || code != "body_timeout" || el < DefaultBodyTimeout-time.Second {
				slowErr("body %d: %d %s (%v) after %v", i, resp.StatusCode, b, err, el)
			}
		})
	}
	for i := range 20 {
		slow.Go(func() {
			c, err := dialer.Dial("tcp", addr)
			if err != nil {
				slowErr("%v", err)
				return
			}
			defer c.Close()
			if _, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: kvasir\r\n"); err != nil {
				slowErr("%v", err)
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(ReadHeaderTimeout + 15*time.Second))
			b, err := io.ReadAll(c)
			el := time.Since(slowStart)
			if err != nil || len(b) != 0 || el < ReadHeaderTimeout-time.Second {
				slowErr("header stall %d: %q %v after %v; want the connection closed after %v", i, b, err, el, ReadHeaderTimeout)
			}
		})
	}
	bias := eogBias(tok)
	for i := range 2 {
		slow.Go(func() {
			body, _ := json.Marshal(map[string]any{"model": "tiny", "messages": []map[string]string{{"role": "user", "content": "never read"}},
				"max_tokens": m.Params().Context - 64, "temperature": 0, "stream": true, "logprobs": true, "top_logprobs": MaxLogprobsChat,
				"logit_bias": bias})
			c, err := rawPost(smallRcvBuf, addr, "/v1/chat/completions", len(body), string(body))
			if err != nil {
				slowErr("%v", err)
				return
			}
			defer c.Close()
			// Wait, never reading, until the server is done with the
			// connection: it closes it after a write blocked WriteTimeout
			// (or leaves it idle, had the whole answer fit in the
			// sockets' buffers: then this client tested nothing).
			key := c.LocalAddr().String()
			var st any
			for deadline := slowStart.Add(DefaultWriteTimeout + 40*time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				if st, _ = connStates.Load(key); st == http.StateClosed || st == http.StateIdle {
					break
				}
			}
			el := time.Since(slowStart)
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			b, err := io.ReadAll(c)
			head, chunked, _ := bytes.Cut(b, []byte("\r\n\r\n"))
			a, serr := checkSSE(dechunk(chunked), "chat.completion.chunk")
			if st != http.StateClosed || el < DefaultWriteTimeout || !bytes.HasPrefix(head, []byte("HTTP/1.1 200 OK\r\n")) || serr != nil || a.done || a.events == 0 {
				slowErr("never-reading stream %d: server side %v after %v; %d bytes, %v, %+v, read %v; want it closed after the write timeout and a cut stream",
					i, st, el, len(b), serr, a, err)
			}
			t.Logf("never-reading stream %d: dropped after %v, %d bytes (%d events) sent", i, el.Round(time.Millisecond), len(b), a.events)
		})
	}

	// 2. Malformed, oversized and wrongly typed requests, one at a time:
	// each gets its status and an OpenAI error body; the oversized ones
	// allocate a bounded multiple of their body (not the tokenizer's ~13
	// bytes per byte, nor a token array's 8-16 bytes per digit pair).
	bigText := strings.Repeat("hello world ", (MaxBodyBytes-1024)/12)
	bigIDs := "[" + strings.Repeat("1,", (MaxBodyBytes-1024)/2) + "1]"
	bigChat := `{"messages":[` + strings.Repeat(`{"role":"user","content":""},`, (MaxBodyBytes-1024)/29) + `{"role":"user","content":""}]}`
	deep := `{"prompt":` + strings.Repeat("[", 200000) + strings.Repeat("]", 200000) + `}`
	cases := []struct {
		name, method, path, body string
		status                   int
		code                     string // "" = any code
		bounded                  bool   // allocation bounded by 8 x the body
	}{
		{"truncated JSON", "POST", "/v1/completions", `{"prompt":"x"`, 400, "invalid_json", false},
		{"not JSON", "POST", "/v1/completions", `prompt=x`, 400, "invalid_json", false},
		{"empty body", "POST", "/v1/chat/completions", ``, 400, "", false},
		{"two values", "POST", "/v1/completions", `{"prompt":"x"} {"prompt":"y"}`, 400, "invalid_json", false},
		{"null body", "POST", "/v1/completions", `null`, 400, "", false},
		{"NUL bytes", "POST", "/v1/completions", "{\"prompt\":\"a\x00b\"}", 400, "invalid_json", false},
		{"deep nesting", "POST", "/v1/completions", deep, 400, "", true},
		{"huge number", "POST", "/v1/completions", `{"prompt":"x","max_tokens":1e400}`, 400, "", false},
		{"negative max_tokens", "POST", "/v1/completions", `{"prompt":"x","max_tokens":-1}`, 400, "invalid_value", false},
		{"prompt number", "POST", "/v1/completions", `{"prompt":5}`, 400, "invalid_type", false},
		{"prompt token out of range", "POST", "/v1/completions", `{"prompt":[1,99999]}`, 400, "invalid_value", false},
		{"messages string", "POST", "/v1/chat/completions", `{"messages":"hi"}`, 400, "invalid_type", false},
		{"message number", "POST", "/v1/chat/completions", `{"messages":[5]}`, 400, "invalid_type", false},
		{"content image", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}}]}]}`, 400, "invalid_type", false},
		{"stop number", "POST", "/v1/completions", `{"prompt":"x","stop":5}`, 400, "invalid_type", false},
		{"stream string", "POST", "/v1/completions", `{"prompt":"x","stream":"yes"}`, 400, "invalid_type", false},
		{"max_tokens bool", "POST", "/v1/completions", `{"prompt":"x","max_tokens":true}`, 400, "invalid_type", false},
		{"logit_bias array", "POST", "/v1/completions", `{"prompt":"x","logit_bias":[1]}`, 400, "invalid_type", false},
		{"tools", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]}`, 400, "unsupported_parameter", false},
		{"wrong model", "POST", "/v1/completions", `{"model":"gpt-9","prompt":"x"}`, 404, "model_not_found", false},
		{"GET a POST endpoint", "GET", "/v1/completions", ``, 405, "method_not_allowed", false},
		{"unknown path", "POST", "/v1/engines/tiny/completions", `{}`, 404, "not_found", false},
		{"body over MaxBodyBytes", "POST", "/v1/completions", `{"prompt":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, 413, "body_too_large", true},
		{"8 MB prompt", "POST", "/v1/completions", `{"prompt":"` + bigText + `","max_tokens":1}`, 400, "context_length_exceeded", true},
		{"8 MB of token ids", "POST", "/v1/completions", `{"prompt":` + bigIDs + `,"max_tokens":1}`, 400, "context_length_exceeded", true},
		{"8 MB chat message", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + bigText + `"}]}`, 400, "context_length_exceeded", true},
		{"8 MB of empty messages", "POST", "/v1/chat/completions", bigChat, 400, "context_length_exceeded", true},
	}
	for _, c := range cases {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
		if c.method == "POST" {
			req.Header.Set("Content-Type", "application/json")
		}
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		el := time.Since(start)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Errorf("%s: reading the answer: %v", c.name, err)
			continue
		}
		code, err := checkAPIError(b)
		if err != nil || resp.StatusCode != c.status || resp.Header.Get("Content-Type") != "application/json" || (c.code != "" && code != c.code) {
			t.Errorf("%s: %d %q code %q (%v), want %d %q: %.300s", c.name, resp.StatusCode, resp.Header.Get("Content-Type"), code, err, c.status, c.code, b)
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		if c.bounded {
			t.Logf("%s: %d-byte body: %d %s in %v, %.1f MB allocated", c.name, len(c.body), resp.StatusCode, code, el.Round(time.Millisecond), float64(alloc)/1e6)
			if alloc > uint64(8*len(c.body)) {
				t.Errorf("%s: %d bytes allocated for a %d-byte body", c.name, alloc, len(c.body))
			}
		}
	}
	// A chunked body over MaxBodyBytes (no Content-Length to refuse early).
	if c, err := rawPost(&dialer, addr, "/v1/completions", -1, ""); err != nil {
		t.Fatal(err)
	} else {
		go func() {
			chunk := fmt.Sprintf("%x\r\n%s\r\n", 1<<20, strings.Repeat("a", 1<<20))
			for range MaxBodyBytes>>20 + 2 {
				if _, err := io.WriteString(c, chunk); err != nil {
					return
				}
			}
		}()
		_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("chunked oversized body: %v", err)
		} else {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if code, err := checkAPIError(b); err != nil || resp.StatusCode != 413 || code != "body_too_large" {
				t.Errorf("chunked oversized body: %d %s (%v)", resp.StatusCode, b, err)
			}
		}
		c.Close()
	}
	phase("malformed requests answered")

	// 3. The storm: 200 concurrent streams, a seeded share of them leaving.
	stormStart := time.Now()
	done, left := storm(rand.New(rand.NewPCG(hostileSeed, 1)), true)
	phase(fmt.Sprintf("storm: %d streams completed, %d clients left mid-way, in %v", done, left, time.Since(stormStart).Round(time.Millisecond)))
	if done < stormClients/3 || left < stormClients/5 || done+left != stormClients {
		t.Errorf("storm: %d completed + %d left of %d", done, left, stormClients)
	}
	// Only the two never-reading streams may still be generating.
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if st := s.Stats(); st.Active <= 2 && st.Queued == 0 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("after the storm: the scheduler still holds %+v", st)
		}
	}
	// The server still answers exactly.
	if resp, err := client.Post(base+"/v1/completions", "application/json", strings.NewReader(
		fmt.Sprintf(`{"prompt":%q,"max_tokens":8,"temperature":0}`, hostilePrompts[0]))); err != nil {
		t.Fatal(err)
	} else {
		var r completionResponse
		err := json.NewDecoder(resp.Body).Decode(&r)
		resp.Body.Close()
		if want := wantText(tok, refs[0].compOut[:8]); err != nil || len(r.Choices) != 1 || r.Choices[0].Text == nil || *r.Choices[0].Text != want {
			t.Errorf("after the storm: %+v (%v), want %q", r, err, want)
		}
	}

	// 4. SIGTERM mid-stream, on a second server (Shutdown with the drain
	// backbone serve gives it).
	testShutdownMidStream(t, m2, tok, chat, gate, bias)
	phase("shutdown mid-stream done")

	slow.Wait()
	phase("slow clients done")
	if el := time.Since(slowStart); el > DefaultWriteTimeout+45*time.Second {
		t.Errorf("slow clients took %v", el)
	}
	idle("after the slow clients")
	noConns("after the slow clients")
	rss1, heap1 := settledMemory(t)
	t.Logf("after everything: RSS %.1f MiB (baseline %.1f), heap %.1f MiB (baseline %.1f)",
		float64(rss1)/(1<<20), float64(rss0)/(1<<20), float64(heap1)/(1<<20), float64(heap0)/(1<<20))
	// Tolerances. The live heap, after the same warm-up shapes, holds the
	// same things (the model's buffers, up to MaxSeqs pooled sequences of
	// at most 128 positions each, the metric series), plus what the
	// runtime keeps for reuse (sync.Pools, timers) and the series the
	// hostile requests add (one per endpoint and status): 4 MiB. A stream
	// kept by mistake is more: a never-reading stream's sequence alone is
	// a 4 MiB KV cache (4,096 positions x 1 KiB), and its text and
	// logprobs more; a pinned 8 MB body more again. (This check found
	// such pins: TestLongSequenceNotPinned.) RSS also keeps the runtime's
	// metadata for the peak heap and free stacks of the ~450 goroutines
	// the storm and the slow clients ran, which FreeOSMemory need not
	// return at once: 16 MiB (seen: +3 to +9 MiB).
	if heap1 > heap0+4<<20 {
		t.Errorf("live heap %d bytes after the hostile clients, %d before", heap1, heap0)
	}
	if rss1 > rss0+16<<20 {
		t.Errorf("RSS %d bytes after the hostile clients, %d before", rss1, rss0)
	}
	if err := hs.Close(); err != nil {
		t.Error(err)
	}
	<-served
	s.Close()
	tr.CloseIdleConnections()
}

// warmModel runs on m, through a Server with the default limits, the
// shapes of testShutdownMidStream's steps: eight requests at once.
func warmModel(t *testing.T, m *model.Model, tok *tokenizer.Tokenizer, chat ChatTemplate) {
	s, err := New(Config{Model: m, Tokenizer: tok, ModelID: "tiny", Chat: chat, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			j := Job{Prompt: tok.Tokenize("stop me", true, false), MaxTokens: 16}
			if i%2 == 1 {
				p, err := chat.Apply([]Message{{Role: "user", Content: "stop me"}})
				if err != nil {
					t.Error(err)
					return
				}
				j.Prompt = p
			}
			st, err := s.Submit(context.Background(), j)
			if err != nil {
				t.Error(err)
				return
			}
			for d, err := st.Next(context.Background()); err == nil && !d.Done; d, err = st.Next(context.Background()) {
			}
		})
	}
	wg.Wait()
}

// dechunk undoes HTTP/1.1 chunked transfer coding on what arrived of a
// body, stopping at the first incomplete chunk.
func dechunk(b []byte) []byte {
	var out []byte
	for {
		line, rest, ok := bytes.Cut(b, []byte("\r\n"))
		if !ok {
			return out
		}
		n, err := strconv.ParseInt(string(line), 16, 64)
		if err != nil || n == 0 || int64(len(rest)) < n {
			return append(out, rest[:min(int64(len(rest)), max(n, 0))]...)
		}
		out = append(out, rest[:n]...)
		b = bytes.TrimPrefix(rest[n:], []byte("\r\n"))
	}
}

// testShutdownMidStream: four streams and one non-streamed request are
// generating (each stream has sent tokens) when the model's expert calls
// stop answering; three more requests wait in the queue. Shutdown with
// DefaultShutdownDrain: the queued ones get 503 shutting_down at once, a
// new connection is refused, and after the drain every stream ends with
// an error event (shutting_down) and [DONE], the non-streamed request
// with 503 shutting_down; Shutdown returns nil.
func testShutdownMidStream(t *testing.T, m *model.Model, tok *tokenizer.Tokenizer, chat ChatTemplate, gate *gatedExperts, bias map[string]int) {
	s, err := New(Config{Model: m, Tokenizer: tok, ModelID: "tiny", Chat: chat, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	defer s.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTPServer(s.Handler())
	go func() { _ = hs.Serve(ln) }()
	addr := ln.Addr().String()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}

	type answer struct {
		status int
		ctype  string
		body   []byte
		err    error
		at     time.Duration // since Shutdown began (negative: before)
	}
	var shutStart atomic.Pointer[time.Time]
	since := func() time.Duration {
		if p := shutStart.Load(); p != nil {
			return time.Since(*p)
		}
		return -1
	}
	type call struct {
		stream, chat bool
		first        chan struct{} // closed once a stream has sent three events, or the answer ended
		once         sync.Once
		out          chan answer
	}
	send := func(stream, chat bool) *call {
		c := &call{stream: stream, chat: chat, first: make(chan struct{}), out: make(chan answer, 1)}
		started := func() { c.once.Do(func() { close(c.first) }) }
		req := map[string]any{"model": "tiny", "max_tokens": m.Params().Context - 64, "temperature": 0, "stream": stream, "logit_bias": bias}
		path := "/v1/completions"
		if chat {
			path = "/v1/chat/completions"
			req["messages"] = []map[string]string{{"role": "user", "content": "stop me"}}
		} else {
			req["prompt"] = "stop me"
		}
		body, _ := json.Marshal(req)
		go func() {
			resp, err := client.Post("http://"+addr+path, "application/json", bytes.NewReader(body))
			if err != nil {
				started()
				c.out <- answer{err: err, at: since()}
				return
			}
			defer resp.Body.Close()
			var b []byte
			if stream && resp.StatusCode == 200 {
				br := bufio.NewReader(resp.Body)
				for events := 0; ; {
					line, err := br.ReadBytes('\n')
					b = append(b, line...)
					if bytes.Equal(line, []byte("\n")) {
						if events++; events == 3 {
							started()
						}
					}
					if err != nil {
						break
					}
				}
			} else {
				b, err = io.ReadAll(resp.Body)
			}
			started()
			c.out <- answer{status: resp.StatusCode, ctype: resp.Header.Get("Content-Type"), body: b, err: err, at: since()}
		}()
		return c
	}
	waitStats := func(what string, ok func(Stats) bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for st := s.Stats(); !ok(st); st = s.Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("shutdown: waiting for %s: %+v", what, st)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	var active []*call
	for i := range 4 {
		active = append(active, send(true, i == 3))
	}
	for _, c := range active {
		select {
		case <-c.first:
		case <-time.After(20 * time.Second):
			t.Fatal("shutdown: a stream sent no tokens in 20 s")
		}
	}
	whole := send(false, false)
	waitStats("five active", func(st Stats) bool { return st.Active == 5 })
	gate.closed.Store(true) // the next expert call waits until Close
	for deadline := time.Now().Add(10 * time.Second); gate.waiting.Load() == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("shutdown: the scheduler did not reach an expert call")
		}
	}
	queued := []*call{send(true, false), send(true, true), send(false, true)}
	waitStats("three queued", func(st Stats) bool { return st.Queued == 3 })

	now := time.Now()
	shutStart.Store(&now)
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), DefaultShutdownDrain)
		defer cancel()
		shut <- s.Shutdown(ctx, hs)
	}()
	for i, c := range queued {
		a := <-c.out
		code, err := checkAPIError(a.body)
		if a.err != nil || a.status != 503 || a.ctype != "application/json" || err != nil || code != "shutting_down" || a.at > 2*time.Second { // at once, not after the drain
			t.Errorf("shutdown: queued request %d: %d %q after %v: %s (%v %v)", i, a.status, a.ctype, a.at, a.body, a.err, err)
		}
	}
	for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			if !errors.Is(err, syscall.ECONNREFUSED) {
				t.Errorf("shutdown: a new connection: %v, want refused", err)
			}
			break
		}
		c.Close()
		if time.Now().After(deadline) {
			t.Error("shutdown: new connections still accepted 2 s after it began")
			break
		}
	}
	for i, c := range active {
		a := <-c.out
		object := "text_completion"
		if c.chat {
			object = "chat.completion.chunk"
		}
		sa, err := checkSSE(a.body, object)
		if a.err != nil || a.status != 200 || err != nil || !sa.done || !sa.complete || sa.errCode != "shutting_down" || sa.events < 3 ||
			a.at < DefaultShutdownDrain-500*time.Millisecond || a.at > DefaultShutdownDrain+ShutdownGrace {
			t.Errorf("shutdown: stream %d after %v: %d, %+v, %v %v; want a stream ending in a shutting_down event and [DONE] after the %v drain",
				i, a.at, a.status, sa, a.err, err, DefaultShutdownDrain)
		}
	}
	a := <-whole.out
	code, err := checkAPIError(a.body)
	if a.err != nil || a.status != 503 || err != nil || code != "shutting_down" || a.at < DefaultShutdownDrain-500*time.Millisecond {
		t.Errorf("shutdown: non-streamed request after %v: %d %s (%v %v)", a.at, a.status, a.body, a.err, err)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if el := since(); el > DefaultShutdownDrain+ShutdownGrace {
		t.Errorf("Shutdown took %v", el)
	}
}
