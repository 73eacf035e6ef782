package serve

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/model"
)

// apiErrorBody is the error shape of every 4xx/5xx.
type apiErrorBody struct {
	Error struct {
		Message string  `json:"message"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// TestTypedErrors: wrong field types name the field (invalid_type),
// unknown and unsupported fields are 400 naming the field, bad values of
// the new fields are invalid_value.
func TestTypedErrors(t *testing.T) {
	srv := newTestServer(t, nil)
	cases := []struct {
		name, path, body string
		code, param      string
	}{
		{"max_tokens string", "/v1/completions", `{"prompt":"x","max_tokens":"5"}`, "invalid_type", "max_tokens"},
		{"max_tokens fraction", "/v1/completions", `{"prompt":"x","max_tokens":5.5}`, "invalid_type", "max_tokens"},
		{"temperature string", "/v1/completions", `{"prompt":"x","temperature":"hot"}`, "invalid_type", "temperature"},
		{"stream number", "/v1/completions", `{"prompt":"x","stream":1}`, "invalid_type", "stream"},
		{"body array", "/v1/completions", `[1,2]`, "invalid_type", ""},
		{"chat role number", "/v1/chat/completions", `{"messages":[{"role":5,"content":"x"}]}`, "invalid_type", "messages.role"},
		{"tools", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[]}`, "unsupported_parameter", "tools"},
		{"response_format", "/v1/completions", `{"prompt":"x","response_format":{"type":"json_object"}}`, "unsupported_parameter", "response_format"},
		{"unknown", "/v1/completions", `{"prompt":"x","frobnicate":1}`, "unsupported_parameter", "frobnicate"},
		{"presence_penalty", "/v1/completions", `{"prompt":"x","presence_penalty":0.5}`, "unsupported_value", "presence_penalty"},
		{"logprobs 6", "/v1/completions", `{"prompt":"x","logprobs":6}`, "invalid_value", "logprobs"},
		{"chat logprobs int", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"logprobs":3}`, "invalid_type", "logprobs"},
		{"top_logprobs alone", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"top_logprobs":2}`, "invalid_value", "top_logprobs"},
		{"top_logprobs 21", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":21}`, "invalid_value", "top_logprobs"},
		{"logit_bias key", "/v1/completions", `{"prompt":"x","logit_bias":{"abc":1}}`, "invalid_value", "logit_bias"},
		{"logit_bias vocab", "/v1/completions", `{"prompt":"x","logit_bias":{"99999":1}}`, "invalid_value", "logit_bias"},
		{"logit_bias value", "/v1/completions", `{"prompt":"x","logit_bias":{"5":101}}`, "invalid_value", "logit_bias"},
		{"prompt [null]", "/v1/completions", `{"prompt":[null]}`, "invalid_type", "prompt"},
		{"prompt ids mixed", "/v1/completions", `{"prompt":[1,"a"]}`, "invalid_type", "prompt"},
		{"prompt ids fraction", "/v1/completions", `{"prompt":[[1,2.5]]}`, "invalid_type", "prompt"},
		{"two id prompts", "/v1/completions", `{"prompt":[[1],[2]]}`, "unsupported_value", "prompt"},
		{"ids past the context", "/v1/completions", `{"prompt":[` + strings.Repeat("1,", 4096) + `1]}`, "context_length_exceeded", "prompt"},
		{"messages object", "/v1/chat/completions", `{"messages":{"role":"user","content":"x"}}`, "invalid_type", "messages"},
		{"message number", "/v1/chat/completions", `{"messages":[5]}`, "invalid_type", "messages"},
		{"message tool_calls", "/v1/chat/completions", `{"messages":[{"role":"assistant","content":"x","tool_calls":[]}]}`, "unsupported_parameter", "tool_calls"},
		{"message unknown field", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x","mood":"\"]}"}]}`, "unsupported_parameter", "mood"},
		{"messages past the context", "/v1/chat/completions", `{"messages":[` + strings.Repeat(`{"role":"user","content":""},`, 4095) + `{"role":"user","content":""}]}`, "context_length_exceeded", "messages"},
	}
	for _, c := range cases {
		resp, body := srv.post(t, c.path, c.body)
		var e apiErrorBody
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != 400 {
			t.Errorf("%s: status %d body %s", c.name, resp.StatusCode, body)
			continue
		}
		if e.Error.Code == nil || *e.Error.Code != c.code {
			t.Errorf("%s: code in %s, want %q", c.name, body, c.code)
		}
		if (c.param == "") != (e.Error.Param == nil) || (c.param != "" && *e.Error.Param != c.param) {
			t.Errorf("%s: param in %s, want %q", c.name, body, c.param)
		}
		if strings.Contains(e.Error.Message, "Go") || strings.Contains(e.Error.Message, "json: cannot") {
			t.Errorf("%s: a Go message: %s", c.name, e.Error.Message)
		}
	}
}

// TestMessageFieldNames: field names match exactly, escapes in them
// decoded. A name that matches a field only case-insensitively is refused
// (encoding/json would accept it, and a later "CONTENT" overwrote
// "content": a different answer), in a message, at the top level and in
// stream_options. 4,095 messages (one short of the 4,096-token context)
// pass the count and fail only on their tokens, naming messages.
func TestMessageFieldNames(t *testing.T) {
	srv := newTestServer(t, nil)
	resp, body := srv.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi","n\u0061me":"x"}],"m\u0061x_tokens":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	for _, c := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"messages":[{"ROLE":"user","content":"hi"}],"max_tokens":2}`, "ROLE"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"Who is the king?","CONTENT":"Hi"}],"max_tokens":2}`, "CONTENT"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"Max_Tokens":2}`, "Max_Tokens"},
		{"/v1/completions", `{"prompt":"Hi","Prompt":"x","max_tokens":1}`, "Prompt"},
		{"/v1/completions", `{"PROMPT":"Hi","max_tokens":1}`, "PROMPT"},
		{"/v1/completions", `{"prompt":"Hi","max_tokens":1,"stream":true,"stream_options":{"Include_Usage":true}}`, "Include_Usage"},
	} {
		resp, body := srv.post(t, c.path, c.body)
		var e apiErrorBody
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != 400 || e.Error.Code == nil ||
			*e.Error.Code != "unsupported_parameter" || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%s: %d %s, want 400 unsupported_parameter naming %s", c.body, resp.StatusCode, body, c.param)
		}
	}
	resp, body = srv.post(t, "/v1/chat/completions", `{"messages":[`+strings.Repeat(`{"role":"user","content":""},`, 4094)+`{"role":"user","content":""}]}`)
	var e apiErrorBody
	if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != 400 || *e.Error.Code != "context_length_exceeded" || *e.Error.Param != "messages" {
		t.Fatalf("4,095 messages: %d %.300s", resp.StatusCode, body)
	}
}

// TestLenientIntegers: max_tokens 5.0 counts as 5; the fields clients send
// by default (user, zero penalties, metadata) are accepted.
func TestLenientIntegers(t *testing.T) {
	srv := newTestServer(t, nil)
	resp, body := srv.post(t, "/v1/completions",
		`{"prompt":"hello","max_tokens":5.0,"temperature":0,"user":"u1","presence_penalty":0,"frequency_penalty":0.0,"metadata":{"a":"b"}}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var r completionResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	want := directGreedy(t, srv.tok.Tokenize("hello", true, false), 5)
	if r.Usage.CompletionTokens != len(want) {
		t.Fatalf("completion_tokens %d, want %d (greedy reference)", r.Usage.CompletionTokens, len(want))
	}
}

// refLogprobs decodes prompt greedily for n tokens on the reference model
// and returns, per step, the token and the float64 log-softmax of its
// logits row (an independent computation of what the API reports).
func refLogprobs(tb testing.TB, prompt []int32, n int) ([]int32, [][]float64) {
	tb.Helper()
	refModel.once.Do(func() { refModel.m, refModel.tok = loadTiny(tb) })
	refModel.mu.Lock()
	defer refModel.mu.Unlock()
	m := refModel.m
	p := m.Params()
	seq := m.NewSequence()
	rows := make([]model.Row, len(prompt))
	for i, t := range prompt {
		rows[i] = model.Row{Seq: seq, Token: t, Pos: i, Logits: i == len(prompt)-1}
	}
	logits := make([]float32, p.Vocab)
	if err := m.Forward(context.Background(), rows, logits); err != nil {
		tb.Fatal(err)
	}
	var toks []int32
	var lps [][]float64
	for len(toks) < n {
		mx := math.Inf(-1)
		for _, x := range logits {
			mx = math.Max(mx, float64(x))
		}
		var z float64
		for _, x := range logits {
			z += math.Exp(float64(x) - mx)
		}
		row := make([]float64, len(logits))
		for i, x := range logits {
			row[i] = float64(x) - mx - math.Log(z)
		}
		t := model.Greedy(logits)
		toks, lps = append(toks, t), append(lps, row)
		if err := m.Forward(context.Background(), []model.Row{{Seq: seq, Token: t, Pos: seq.Len(), Logits: true}}, logits); err != nil {
			tb.Fatal(err)
		}
	}
	return toks, lps
}

// TestLogprobsCompletions: greedy tokens' log-probabilities and top
// alternatives equal an independent log-softmax of the reference decode's
// logits; streamed logprobs equal the non-streamed ones.
func TestLogprobsCompletions(t *testing.T) {
	srv := newTestServer(t, nil)
	prompt := srv.tok.Tokenize("hello", true, false)
	const n = 6
	toks, ref := refLogprobs(t, prompt, n)
	for _, tk := range toks {
		if srv.tok.IsEOG(tk) {
			t.Skip("the reference decode ends early; pick another prompt")
		}
	}
	resp, body := srv.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":"hello","max_tokens":%d,"temperature":0,"logprobs":3}`, n))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var r struct {
		Choices []struct {
			Text     string `json:"text"`
			Logprobs struct {
				Tokens        []string             `json:"tokens"`
				TokenLogprobs []float64            `json:"token_logprobs"`
				TopLogprobs   []map[string]float64 `json:"top_logprobs"`
				TextOffset    []int                `json:"text_offset"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	lp := r.Choices[0].Logprobs
	if len(lp.Tokens) != n || len(lp.TokenLogprobs) != n || len(lp.TopLogprobs) != n || len(lp.TextOffset) != n {
		t.Fatalf("logprobs lengths %d %d %d %d, want %d", len(lp.Tokens), len(lp.TokenLogprobs), len(lp.TopLogprobs), len(lp.TextOffset), n)
	}
	joined := ""
	for i := range n {
		if want := ref[i][toks[i]]; math.Abs(lp.TokenLogprobs[i]-want) > 1e-9 {
			t.Errorf("token %d: logprob %v, reference %v", i, lp.TokenLogprobs[i], want)
		}
		piece := srv.tok.Decode([]int32{toks[i]})
		if want := tokenText(piece); lp.Tokens[i] != want {
			t.Errorf("token %d: %q, reference %q", i, lp.Tokens[i], want)
		}
		if lp.TextOffset[i] != len(joined) {
			t.Errorf("token %d: text_offset %d, want %d", i, lp.TextOffset[i], len(joined))
		}
		joined += piece
		// Greedy: the chosen token is the most likely alternative.
		if v, ok := lp.TopLogprobs[i][lp.Tokens[i]]; !ok || v != lp.TokenLogprobs[i] {
			t.Errorf("token %d: top_logprobs %v lacks the greedy token %q at %v", i, lp.TopLogprobs[i], lp.Tokens[i], lp.TokenLogprobs[i])
		}
		var mass float64
		for _, v := range lp.TopLogprobs[i] {
			mass += math.Exp(v)
		}
		if mass > 1+1e-9 || len(lp.TopLogprobs[i]) == 0 || len(lp.TopLogprobs[i]) > 3 {
			t.Errorf("token %d: top_logprobs %v (mass %v)", i, lp.TopLogprobs[i], mass)
		}
	}
	if want := strings.ToValidUTF8(joined, "\uFFFD"); want != r.Choices[0].Text {
		t.Errorf("tokens join to %q, text %q", want, r.Choices[0].Text)
	}

	// Streamed: the same values, chunk by chunk.
	sresp, err := http.Post(srv.ts.URL+"/v1/completions", "application/json", strings.NewReader(
		fmt.Sprintf(`{"prompt":"hello","max_tokens":%d,"temperature":0,"logprobs":3,"stream":true}`, n)))
	if err != nil {
		t.Fatal(err)
	}
	defer sresp.Body.Close()
	events, err := sseEvents(sresp.Body)
	if err != nil {
		t.Fatal(err)
	}
	var got []float64
	for _, e := range events {
		if e == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Logprobs *struct {
					TokenLogprobs []float64 `json:"token_logprobs"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			t.Fatal(err)
		}
		for _, ch := range c.Choices {
			if ch.Logprobs != nil {
				got = append(got, ch.Logprobs.TokenLogprobs...)
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(lp.TokenLogprobs) {
		t.Errorf("streamed logprobs %v, non-streamed %v", got, lp.TokenLogprobs)
	}
}

// TestLogprobsChat: chat's logprobs: true with top_logprobs 2 gives one
// content entry per completion token, each with two alternatives, the
// token's bytes and the reference log-probability.
func TestLogprobsChat(t *testing.T) {
	srv := newTestServer(t, nil)
	resp, body := srv.post(t, "/v1/chat/completions",
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"temperature":0,"logprobs":true,"top_logprobs":2}`)
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, body)
	}
	var r struct {
		Choices []struct {
			Message  struct{ Content string } `json:"message"`
			Logprobs struct {
				Content []struct {
					Token       string  `json:"token"`
					Logprob     float64 `json:"logprob"`
					Bytes       []int   `json:"bytes"`
					TopLogprobs []struct {
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	c := r.Choices[0].Logprobs.Content
	var raw []byte
	for i, e := range c {
		if len(e.TopLogprobs) != 2 || e.TopLogprobs[0].Logprob < e.TopLogprobs[1].Logprob || e.TopLogprobs[0].Logprob != e.Logprob {
			t.Errorf("entry %d: %+v", i, e)
		}
		for _, b := range e.Bytes {
			raw = append(raw, byte(b))
		}
	}
	if string(raw) != r.Choices[0].Message.Content {
		t.Errorf("bytes join to %q, content %q", raw, r.Choices[0].Message.Content)
	}
	if len(c) != r.Usage.CompletionTokens && len(c) != r.Usage.CompletionTokens-1 { // an end-of-turn token has no entry
		t.Errorf("%d entries for %d completion tokens", len(c), r.Usage.CompletionTokens)
	}
}

// TestLogitBias: a -100 bias on the greedy first token changes it; a +100
// bias on one token makes every greedy token that token.
func TestLogitBias(t *testing.T) {
	srv := newTestServer(t, nil)
	prompt := srv.tok.Tokenize("hello", true, false)
	ref := directGreedy(t, prompt, 1)
	first := func(body string) string {
		resp, b := srv.post(t, "/v1/completions", body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, b)
		}
		var r struct {
			Choices []struct {
				Logprobs struct {
					Tokens []string `json:"tokens"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &r); err != nil || len(r.Choices[0].Logprobs.Tokens) != 1 {
			t.Fatalf("%v: %s", err, b)
		}
		return r.Choices[0].Logprobs.Tokens[0]
	}
	if got := first(`{"prompt":"hello","max_tokens":1,"temperature":0,"logprobs":0}`); got != tokenText(srv.tok.Decode(ref[:1])) {
		t.Fatalf("unbiased first token %q, reference %q", got, srv.tok.Decode(ref[:1]))
	}
	banned := first(fmt.Sprintf(`{"prompt":"hello","max_tokens":1,"temperature":0,"logprobs":0,"logit_bias":{"%d":-100}}`, ref[0]))
	if banned == tokenText(srv.tok.Decode(ref[:1])) {
		t.Errorf("a -100 bias on token %d left it the greedy choice", ref[0])
	}
	const forced = 300 // a plain byte-level token of the tiny vocabulary
	resp, b := srv.post(t, "/v1/completions", fmt.Sprintf(`{"prompt":"hello","max_tokens":4,"temperature":0,"logit_bias":{"%d":100},"logprobs":0}`, forced))
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	var r struct {
		Choices []struct {
			Logprobs struct {
				Tokens []string `json:"tokens"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	want := tokenText(srv.tok.Decode([]int32{forced}))
	if len(r.Choices[0].Logprobs.Tokens) != 4 {
		t.Fatalf("tokens %q", r.Choices[0].Logprobs.Tokens)
	}
	for i, tk := range r.Choices[0].Logprobs.Tokens {
		if tk != want {
			t.Errorf("token %d is %q, want the +100-biased %q", i, tk, want)
		}
	}
}

// TestHugePromptBounded: a prompt of almost MaxBodyBytes is refused as
// longer than the context without being tokenized: the request allocates
// a small multiple of the body, not the tokenizer's ~13 bytes per byte.
func TestHugePromptBounded(t *testing.T) {
	srv := newTestServer(t, nil)
	prompt := strings.Repeat("hello world ", (MaxBodyBytes-1024)/12)
	body := `{"prompt":"` + prompt + `","max_tokens":1}`
	chat := `{"messages":[{"role":"user","content":"` + prompt + `"}],"max_tokens":1}`
	for _, c := range []struct{ path, body string }{{"/v1/completions", body}, {"/v1/chat/completions", chat}} {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		resp, b := srv.post(t, c.path, c.body)
		runtime.ReadMemStats(&after)
		var e apiErrorBody
		if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != 400 || *e.Error.Code != "context_length_exceeded" {
			t.Fatalf("%s: status %d: %.300s", c.path, resp.StatusCode, b)
		}
		alloc := after.TotalAlloc - before.TotalAlloc
		t.Logf("%s: %d-byte body refused, %.1f MB allocated in the process meanwhile", c.path, len(c.body), float64(alloc)/1e6)
		if alloc > uint64(8*len(c.body)) {
			t.Errorf("%s: %d bytes allocated for a %d-byte body (tokenized?)", c.path, alloc, len(c.body))
		}
	}
}

// TestParseSlotsDefaults, on the default ParseSlots and ParseWait:
//   - clients that stall after their headers, or trickle a small body,
//     hold no slot: more of them than slots, and a request still gets its
//     answer at once (before, four such connections locked every client
//     out: each waited 10 s and got 429);
//   - bodies over freeBody take a slot to be read, one per client address:
//     a second from the same address is refused at once; from as many
//     addresses as slots they fill the slots, and the next request waits
//     ParseWait and gets 429 with Retry-After, not an unbounded number of
//     bodies in memory.
func TestParseSlotsDefaults(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the 10 s default parse wait")
	}
	t.Parallel()
	srv := newTestServer(t, nil)
	slots := cap(srv.s.parse)
	if slots != defaultParseSlots(runtime.GOMAXPROCS(0)) {
		t.Fatalf("%d parse slots, want the default %d", slots, defaultParseSlots(runtime.GOMAXPROCS(0)))
	}
	addr := strings.TrimPrefix(srv.ts.URL, "http://")
	stall := func(from string, length, send int) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		fmt.Fprintf(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n{%s", length, strings.Repeat(" ", send))
		return c
	}
	for range 2 * slots {
		stall("127.0.0.1", 100, 4)
	}
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	if resp, b := srv.post(t, "/v1/completions", `{"prompt":"hello","max_tokens":2}`); resp.StatusCode != 200 || time.Since(start) > 5*time.Second {
		t.Fatalf("behind %d stalled small bodies: status %d after %v: %s", 2*slots, resp.StatusCode, time.Since(start), b)
	}
	if n := len(srv.s.parse); n != 0 {
		t.Fatalf("stalled small bodies hold %d parse slots", n)
	}

	// Large bodies, each from its own loopback address.
	for i := range slots {
		stall(fmt.Sprintf("127.0.0.%d", 2+i), 1<<20, freeBody+1000)
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(srv.s.parse) < slots {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d slots taken by large bodies", len(srv.s.parse), slots)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// A second large body from an address that holds one: refused at once.
	c := stall("127.0.0.2", 1<<20, freeBody+1000)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || !strings.Contains(line, "429") {
		t.Fatalf("a second large body from one address: %q, %v", line, err)
	}
	start = time.Now()
	resp, b := srv.post(t, "/v1/completions", `{"prompt":"hello","max_tokens":2}`)
	waited := time.Since(start)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("status %d (Retry-After %q): %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	if waited < DefaultParseWait-time.Second {
		t.Errorf("refused after %v, before the parse wait", waited)
	}
}

// TestCancelledCounted499: a streamed request whose client leaves is
// counted under code 499, not 200.
func TestCancelledCounted499(t *testing.T) {
	var slow *slowExperts
	srv := newTestServer(t, func(c *Config) {
		slow = &slowExperts{inner: c.Model.LocalExperts(), delay: 2 * time.Millisecond}
		c.Model.SetExperts(slow)
	})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.ts.URL+"/v1/completions", strings.NewReader(
		`{"prompt":"hello","max_tokens":4000,"temperature":0,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 64)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for gatherValue(t, srv.reg, "kvasir_serve_http_requests_total", "code", "499", "endpoint", "completions") != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no 499 counted: 200s %v", gatherValue(t, srv.reg, "kvasir_serve_http_requests_total", "code", "200", "endpoint", "completions"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if v := gatherValue(t, srv.reg, "go_goroutines"); v <= 0 {
		t.Errorf("go_goroutines %v: no Go collector", v)
	}
}

// TestShutdownDrains: Shutdown with a short drain: a streaming request
// still generating ends with an error event (shutting_down) and [DONE], a
// non-streamed one gets 503 shutting_down, a queued one 503 at once, and a
// new request is refused.
func TestShutdownDrains(t *testing.T) {
	var slow *slowExperts
	m, tok := loadTiny(t)
	slow = &slowExperts{inner: m.LocalExperts(), delay: 5 * time.Millisecond}
	m.SetExperts(slow)
	chat, chatErr := ChatTemplateFor(tok, "", "auto")
	s, err := New(Config{Model: m, Tokenizer: tok, ModelID: "tiny", Chat: chat, ChatErr: chatErr, Logger: quiet, MaxSeqs: 2, MaxBatchRows: 64})
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler()}
	go hs.Serve(ln)
	url := "http://" + ln.Addr().String() + "/v1/completions"
	long := `{"prompt":"hello","max_tokens":4000,"temperature":0%s}`
	stream, err := http.Post(url, "application/json", strings.NewReader(fmt.Sprintf(long, `,"stream":true`)))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	br := bufio.NewReader(stream.Body)
	if _, err := br.ReadString('\n'); err != nil { // generating
		t.Fatal(err)
	}
	type answer struct {
		status int
		body   string
	}
	post := func() chan answer {
		ch := make(chan answer, 1)
		go func() {
			r, err := http.Post(url, "application/json", strings.NewReader(fmt.Sprintf(long, "")))
			if err != nil {
				ch <- answer{0, err.Error()}
				return
			}
			defer r.Body.Close()
			var sb strings.Builder
			_, _ = bufio.NewReader(r.Body).WriteTo(&sb)
			ch <- answer{r.StatusCode, sb.String()}
		}()
		return ch
	}
	wait := func(active, queued int) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for st := s.Stats(); st.Active < active || st.Queued < queued; st = s.Stats() {
			if time.Now().After(deadline) {
				t.Fatalf("stats %+v", st)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	whole := post() // the second slot: generating
	wait(2, 0)
	queued := post() // no slot: queued
	wait(2, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(ctx, hs) }()
	select {
	case a := <-queued:
		if a.status != 503 || !strings.Contains(a.body, "shutting_down") {
			t.Errorf("queued request: %d %s", a.status, a.body)
		}
	case <-time.After(200 * time.Millisecond):
		a := <-queued
		t.Errorf("the queued request was not refused at once: later %d %s", a.status, a.body)
	}
	rest, err := sseEvents(br)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(rest); n < 2 || rest[n-1] != "[DONE]" || !strings.Contains(rest[n-2], "shutting_down") {
		t.Errorf("stream ended with %q", rest[max(0, len(rest)-2):])
	}
	if a := <-whole; a.status != 503 || !strings.Contains(a.body, "shutting_down") {
		t.Errorf("non-streamed request: %d %s", a.status, a.body)
	}
	if err := <-shut; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}

// TestAPIKeyScheme: with an API key, the Authorization scheme's name is
// matched case-insensitively (RFC 9110 section 11.1), the token exactly;
// another scheme, a wrong token or none is 401.
func TestAPIKeyScheme(t *testing.T) {
	srv := newTestServer(t, func(c *Config) { c.APIKey = "sekret" })
	for _, c := range []struct {
		auth string
		want int
	}{
		{"Bearer sekret", 200}, {"bearer sekret", 200}, {"BEARER sekret", 200},
		{"Bearer Sekret", 401}, {"Basic sekret", 401}, {"Bearer", 401}, {"sekret", 401}, {"", 401},
	} {
		req, _ := http.NewRequest("GET", srv.ts.URL+"/v1/models", nil)
		if c.auth != "" {
			req.Header.Set("Authorization", c.auth)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("Authorization %q: %d, want %d", c.auth, resp.StatusCode, c.want)
		}
	}
}

// TestDefaultValuedFields: fields some clients send on every request are
// accepted at the values that ask for nothing (best_of 1, suffix null or
// "", store false, service_tier auto or default,
// stream_options.continuous_usage_stats false) and refused, naming them,
// at any other value.
func TestDefaultValuedFields(t *testing.T) {
	srv := newTestServer(t, nil)
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", `{"prompt":"Hi","max_tokens":1,"best_of":1,"suffix":null,"store":false,"service_tier":"auto"}`},
		{"/v1/completions", `{"prompt":"Hi","max_tokens":1,"suffix":"","service_tier":"default","stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":false}}`},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1,"store":false,"service_tier":null}`},
	} {
		if resp, body := srv.post(t, c.path, c.body); resp.StatusCode != 200 {
			t.Errorf("%s: %d %s, want 200", c.body, resp.StatusCode, body)
		}
	}
	for _, c := range []struct{ path, body, param string }{
		{"/v1/completions", `{"prompt":"Hi","max_tokens":1,"best_of":2}`, "best_of"},
		{"/v1/completions", `{"prompt":"Hi","max_tokens":1,"suffix":"x"}`, "suffix"},
		{"/v1/completions", `{"prompt":"Hi","max_tokens":1,"store":true}`, "store"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"service_tier":"flex"}`, "service_tier"},
		{"/v1/completions", `{"prompt":"Hi","stream":true,"stream_options":{"continuous_usage_stats":true}}`, "stream_options.continuous_usage_stats"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"best_of":1}`, "best_of"},
	} {
		resp, body := srv.post(t, c.path, c.body)
		var e apiErrorBody
		if err := json.Unmarshal(body, &e); err != nil || resp.StatusCode != 400 || e.Error.Param == nil || *e.Error.Param != c.param {
			t.Errorf("%s: %d %s, want 400 naming %s", c.body, resp.StatusCode, body, c.param)
		}
	}
}
