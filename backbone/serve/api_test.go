package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

const testPrompt = "The capital of France is"

// wantText is the text a client sees for tokens: the pieces of the non-EOG
// tokens, invalid UTF-8 replaced.
func wantText(tok *tokenizer.Tokenizer, toks []int32) string {
	var b []byte
	for _, t := range toks {
		b = append(b, tok.Piece(t)...)
	}
	return tokenizer.ToValidUTF8(b)
}

type completionResponse struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index   int     `json:"index"`
		Text    *string `json:"text"`
		Message *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Finish string `json:"finish_reason"`
	} `json:"choices"`
	Usage usage `json:"usage"`
}

func TestCompletionMatchesDirectDecode(t *testing.T) {
	srv := newTestServer(t, nil)
	prompt := srv.tok.Tokenize(testPrompt, true, false)
	want := directGreedy(t, prompt, 20)
	resp, body := srv.post(t, "/v1/completions", jsonBody(t, map[string]any{
		"model": "tiny", "prompt": testPrompt, "max_tokens": 20, "temperature": 0}))
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("status %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	var r completionResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	if r.Object != "text_completion" || r.Model != "tiny" || !strings.HasPrefix(r.ID, "cmpl-") || len(r.Choices) != 1 {
		t.Fatalf("response %s", body)
	}
	if got := *r.Choices[0].Text; got != wantText(srv.tok, want) {
		t.Errorf("text %q, want %q", got, wantText(srv.tok, want))
	}
	if r.Usage != (usage{len(prompt), len(want), len(prompt) + len(want)}) {
		t.Errorf("usage %+v, want %d + %d", r.Usage, len(prompt), len(want))
	}
	if fr := r.Choices[0].Finish; fr != "length" && !srv.tok.IsEOG(want[len(want)-1]) {
		t.Errorf("finish_reason %q, want length", fr)
	}

	// The same prompt as token ids gives the same completion.
	ids := make([]int, len(prompt))
	for i, x := range prompt {
		ids[i] = int(x)
	}
	_, body2 := srv.post(t, "/v1/completions", jsonBody(t, map[string]any{"prompt": ids, "max_tokens": 20, "temperature": 0}))
	var r2 completionResponse
	if err := json.Unmarshal(body2, &r2); err != nil || r2.Choices[0].Text == nil || *r2.Choices[0].Text != *r.Choices[0].Text {
		t.Errorf("token-id prompt: %s (err %v)", body2, err)
	}
}

// TestStreamGoClient streams with a net/http client and an SSE parser.
// Each expert call takes a millisecond (a token tens of them), so the
// tokens are produced more slowly than the client reads them even on a
// loaded machine: a stream that arrives in fewer than 3 events was not
// streamed token by token (rather than coalesced by a busy writer).
func TestStreamGoClient(t *testing.T) {
	srv := newTestServer(t, func(c *Config) {
		c.Model.SetExperts(&slowExperts{inner: c.Model.LocalExperts(), delay: time.Millisecond})
	})
	prompt := srv.tok.Tokenize(testPrompt, true, false)
	want := directGreedy(t, prompt, 24)
	req, _ := http.NewRequest("POST", srv.ts.URL+"/v1/completions", strings.NewReader(jsonBody(t, map[string]any{
		"model": "tiny", "prompt": testPrompt, "max_tokens": 24, "temperature": 0, "stream": true,
		"stream_options": map[string]any{"include_usage": true}})))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	events, err := sseEvents(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	got, err := collectStream(events)
	if err != nil {
		t.Fatal(err)
	}
	if !got.done || got.text != wantText(srv.tok, want) {
		t.Errorf("stream text %q (done %v), want %q", got.text, got.done, wantText(srv.tok, want))
	}
	if got.chunks < 3 {
		t.Errorf("%d chunks: not streamed token by token", got.chunks)
	}
	if got.usage == nil || *got.usage != (usage{len(prompt), len(want), len(prompt) + len(want)}) {
		t.Errorf("usage %+v, want %d + %d", got.usage, len(prompt), len(want))
	}
	if got.finish == "" {
		t.Error("no finish_reason chunk")
	}
}

// TestStreamCurl streams with curl (an independent HTTP and SSE client).
func TestStreamCurl(t *testing.T) {
	curl, err := exec.LookPath("curl")
	if err != nil {
		t.Skip("curl not installed")
	}
	srv := newTestServer(t, nil)
	want := directGreedy(t, srv.tok.Tokenize(testPrompt, true, false), 16)
	body := jsonBody(t, map[string]any{"model": "tiny", "prompt": testPrompt, "max_tokens": 16, "temperature": 0, "stream": true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, curl, "-sS", "-N", "--fail-with-body", "-H", "Content-Type: application/json",
		"-d", body, srv.ts.URL+"/v1/completions").Output()
	if err != nil {
		t.Fatalf("curl: %v\n%s", err, out)
	}
	events, err := sseEvents(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	got, err := collectStream(events)
	if err != nil {
		t.Fatal(err)
	}
	if !got.done || got.text != wantText(srv.tok, want) {
		t.Errorf("curl stream %q (done %v), want %q", got.text, got.done, wantText(srv.tok, want))
	}

	// Chat through curl too, non-streaming.
	out, err = exec.CommandContext(ctx, curl, "-sS", "--fail-with-body", "-H", "Content-Type: application/json", "-d",
		`{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":4,"temperature":0}`,
		srv.ts.URL+"/v1/chat/completions").Output()
	if err != nil {
		t.Fatalf("curl chat: %v\n%s", err, out)
	}
	var r completionResponse
	if err := json.Unmarshal(out, &r); err != nil || r.Object != "chat.completion" || r.Choices[0].Message == nil {
		t.Fatalf("chat via curl: %s (%v)", out, err)
	}
}

func TestChatCompletion(t *testing.T) {
	srv := newTestServer(t, nil)
	msgs := []map[string]any{
		{"role": "system", "content": "You are terse."},
		{"role": "user", "content": []map[string]any{{"type": "text", "text": "Name a "}, {"type": "text", "text": "city."}}},
	}
	// The prompt is the ChatML rendering, tokenized with special tokens.
	rendered := "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nName a city.<|im_end|>\n<|im_start|>assistant\n"
	prompt := srv.tok.Tokenize(rendered, true, true)
	want := directGreedy(t, prompt, 12)
	for _, stream := range []bool{false, true} {
		resp, body := srv.post(t, "/v1/chat/completions", jsonBody(t, map[string]any{
			"model": "tiny", "messages": msgs, "max_completion_tokens": 12, "temperature": 0, "stream": stream}))
		if resp.StatusCode != 200 {
			t.Fatalf("stream=%v: %d %s", stream, resp.StatusCode, body)
		}
		if !stream {
			var r completionResponse
			if err := json.Unmarshal(body, &r); err != nil {
				t.Fatal(err)
			}
			m := r.Choices[0].Message
			if r.Object != "chat.completion" || !strings.HasPrefix(r.ID, "chatcmpl-") || m == nil || m.Role != "assistant" {
				t.Fatalf("response %s", body)
			}
			if m.Content != wantText(srv.tok, want) {
				t.Errorf("content %q, want %q", m.Content, wantText(srv.tok, want))
			}
			if r.Usage.PromptTokens != len(prompt) || r.Usage.CompletionTokens != len(want) {
				t.Errorf("usage %+v, want %d + %d", r.Usage, len(prompt), len(want))
			}
			continue
		}
		events, err := sseEvents(bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(events[0], `"role":"assistant"`) || !strings.Contains(events[0], `"chat.completion.chunk"`) {
			t.Errorf("first chunk %s", events[0])
		}
		got, err := collectStream(events)
		if err != nil {
			t.Fatal(err)
		}
		if !got.done || got.text != wantText(srv.tok, want) {
			t.Errorf("streamed content %q, want %q", got.text, wantText(srv.tok, want))
		}
	}
}

// TestStopStrings: the text ends before the first occurrence of a stop
// string, with finish_reason "stop", streamed or not.
func TestStopStrings(t *testing.T) {
	srv := newTestServer(t, nil)
	prompt := srv.tok.Tokenize(testPrompt, true, false)
	full := wantText(srv.tok, directGreedy(t, prompt, 30))
	// A stop string from the middle of the greedy text, and one that never occurs.
	r := []rune(full)
	if len(r) < 12 {
		t.Skipf("greedy text too short: %q", full)
	}
	stop := string(r[6:9])
	cut := full[:strings.Index(full, stop)]
	for _, stream := range []bool{false, true} {
		resp, body := srv.post(t, "/v1/completions", jsonBody(t, map[string]any{"prompt": testPrompt, "max_tokens": 30,
			"temperature": 0, "stop": []string{"\x00never\x00", stop}, "stream": stream}))
		if resp.StatusCode != 200 {
			t.Fatalf("%d %s", resp.StatusCode, body)
		}
		var text, finish string
		if stream {
			events, err := sseEvents(bytes.NewReader(body))
			if err != nil {
				t.Fatal(err)
			}
			got, err := collectStream(events)
			if err != nil {
				t.Fatal(err)
			}
			text, finish = got.text, got.finish
		} else {
			var cr completionResponse
			if err := json.Unmarshal(body, &cr); err != nil {
				t.Fatal(err)
			}
			text, finish = *cr.Choices[0].Text, cr.Choices[0].Finish
		}
		if text != cut || finish != "stop" {
			t.Errorf("stream=%v stop %q: text %q finish %q; want %q, stop", stream, stop, text, finish, cut)
		}
	}
	// stop as a single string.
	_, body := srv.post(t, "/v1/completions", jsonBody(t, map[string]any{"prompt": testPrompt, "max_tokens": 30,
		"temperature": 0, "stop": stop}))
	var cr completionResponse
	if err := json.Unmarshal(body, &cr); err != nil || *cr.Choices[0].Text != cut {
		t.Errorf("stop as a string: %s", body)
	}
}

func TestModels(t *testing.T) {
	before := time.Now().Unix()
	srv := newTestServer(t, nil)
	resp, err := http.Get(srv.ts.URL + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID      string `json:"id"`
			Object  string `json:"object"`
			Created int64  `json:"created"` // when the server loaded it, unix seconds
		} `json:"data"`
	}
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if err != nil || list.Object != "list" || len(list.Data) != 1 || list.Data[0].ID != "tiny" || list.Data[0].Object != "model" {
		t.Fatalf("models: %+v (%v)", list, err)
	}
	if c := list.Data[0].Created; c < before || c > time.Now().Unix() {
		t.Errorf("created %d, want the server's start (%d..now)", c, before)
	}
	for path, code := range map[string]int{"/v1/models/tiny": 200, "/v1/models/gpt-4": 404} {
		resp, err := http.Get(srv.ts.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != code {
			t.Errorf("GET %s: %d, want %d", path, resp.StatusCode, code)
		}
	}
}

// TestErrorShapes: every error is {"error":{"message","type","param","code"}}
// with the right status.
func TestErrorShapes(t *testing.T) {
	srv := newTestServer(t, nil)
	long := strings.Repeat("hello world ", 3000) // > 4096 tokens
	cases := []struct {
		name, method, path, body string
		status                   int
		code, param              string
	}{
		{"bad json", "POST", "/v1/completions", `{"prompt": "x",`, 400, "invalid_json", ""},
		{"trailing data", "POST", "/v1/completions", `{"prompt": "x"} {}`, 400, "invalid_json", ""},
		{"wrong type", "POST", "/v1/completions", `{"prompt": 5}`, 400, "invalid_type", "prompt"},
		{"null body", "POST", "/v1/completions", ` null `, 400, "invalid_type", ""},
		{"null chat body", "POST", "/v1/chat/completions", `null`, 400, "invalid_type", ""},
		{"no prompt", "POST", "/v1/completions", `{"model":"tiny"}`, 400, "missing_required_parameter", "prompt"},
		{"two prompts", "POST", "/v1/completions", `{"prompt":["a","b"]}`, 400, "unsupported_value", "prompt"},
		{"token out of vocab", "POST", "/v1/completions", `{"prompt":[1,99999]}`, 400, "invalid_value", "prompt"},
		{"unknown model", "POST", "/v1/completions", `{"model":"gpt-4","prompt":"x"}`, 404, "model_not_found", "model"},
		{"unknown model chat", "POST", "/v1/chat/completions", `{"model":"gpt-4","messages":[{"role":"user","content":"x"}]}`, 404, "model_not_found", "model"},
		{"prompt too long", "POST", "/v1/completions", jsonBody(t, map[string]any{"prompt": long}), 400, "context_length_exceeded", "prompt"},
		{"max_tokens 0", "POST", "/v1/completions", `{"prompt":"x","max_tokens":0}`, 400, "invalid_value", "max_tokens"},
		{"temperature", "POST", "/v1/completions", `{"prompt":"x","temperature":2.5}`, 400, "invalid_value", "temperature"},
		{"top_p", "POST", "/v1/completions", `{"prompt":"x","top_p":0}`, 400, "invalid_value", "top_p"},
		{"n", "POST", "/v1/completions", `{"prompt":"x","n":2}`, 400, "unsupported_value", "n"},
		{"stop type", "POST", "/v1/completions", `{"prompt":"x","stop":5}`, 400, "invalid_type", "stop"},
		{"no messages", "POST", "/v1/chat/completions", `{"messages":[]}`, 400, "missing_required_parameter", "messages"},
		{"image part", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`, 400, "invalid_type", "messages[0].content"},
		{"empty role", "POST", "/v1/chat/completions", `{"messages":[{"role":"","content":"x"}]}`, 400, "invalid_value", "messages[0].role"},
		{"unknown role", "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"},{"role":"wizard","content":"x"}]}`, 400, "invalid_value", "messages[1].role"},
		{"GET completions", "GET", "/v1/completions", ``, 405, "method_not_allowed", ""},
		{"unknown path", "GET", "/v2/nothing", ``, 404, "not_found", ""},
		{"too large", "POST", "/v1/completions", `{"prompt":"` + strings.Repeat("a", MaxBodyBytes) + `"}`, 413, "body_too_large", ""},
	}
	for _, c := range cases {
		req, _ := http.NewRequest(c.method, srv.ts.URL+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var e struct {
			Error *struct {
				Message *string `json:"message"`
				Type    *string `json:"type"`
				Param   *string `json:"param"`
				Code    *string `json:"code"`
			} `json:"error"`
		}
		raw := new(bytes.Buffer)
		_, _ = raw.ReadFrom(resp.Body)
		resp.Body.Close()
		if err := json.Unmarshal(raw.Bytes(), &e); err != nil || e.Error == nil {
			t.Errorf("%s: body %s is not an error object (%v)", c.name, raw, err)
			continue
		}
		if resp.StatusCode != c.status || e.Error.Message == nil || *e.Error.Message == "" || e.Error.Type == nil ||
			e.Error.Code == nil || *e.Error.Code != c.code {
			t.Errorf("%s: %d %s; want %d code %q", c.name, resp.StatusCode, raw, c.status, c.code)
		}
		if (c.param == "" && e.Error.Param != nil) || (c.param != "" && (e.Error.Param == nil || *e.Error.Param != c.param)) {
			t.Errorf("%s: param in %s, want %q", c.name, raw, c.param)
		}
		if !bytes.Contains(raw.Bytes(), []byte(`"param":`)) || !bytes.Contains(raw.Bytes(), []byte(`"code":`)) {
			t.Errorf("%s: %s lacks param or code keys", c.name, raw)
		}
	}
}

// TestChatTemplateUnsupported: a server without a usable template answers
// chat requests with a 400 that says why.
func TestChatTemplateUnsupported(t *testing.T) {
	m, tok := loadTiny(t)
	_, chatErr := ChatTemplateFor(tok, "{% for m in messages %}<|start_header_id|>{{ m.role }}{% endfor %}", "auto")
	srv := newTestServer(t, func(c *Config) { c.Model, c.Tokenizer, c.Chat, c.ChatErr = m, tok, nil, chatErr })
	resp, body := srv.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}]}`)
	if resp.StatusCode != 400 || !strings.Contains(string(body), "unsupported_chat_template") || !strings.Contains(string(body), "not ChatML") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

// TestQueueFull429: with one slot and a queue of one, a third request gets
// 429 with Retry-After while the first is held inside its forward pass;
// the two accepted ones then complete.
func TestQueueFull429(t *testing.T) {
	gate := make(chan struct{})
	var slow *slowExperts
	srv := newTestServer(t, func(c *Config) {
		c.MaxSeqs, c.QueueSize, c.RetryAfter = 1, 1, 1500*time.Millisecond
		slow = &slowExperts{inner: c.Model.LocalExperts(), gate: gate}
		c.Model.SetExperts(slow)
	})
	body := `{"prompt":"hello","max_tokens":2,"temperature":0}`
	type result struct {
		code int
		body []byte
	}
	results := make(chan result, 2)
	send := func() {
		resp, err := http.Post(srv.ts.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			results <- result{-1, []byte(err.Error())}
			return
		}
		b := new(bytes.Buffer)
		_, _ = b.ReadFrom(resp.Body)
		resp.Body.Close()
		results <- result{resp.StatusCode, b.Bytes()}
	}
	waitStats := func(want Stats) {
		deadline := time.Now().Add(10 * time.Second)
		for srv.s.Stats() != want {
			if time.Now().After(deadline) {
				t.Fatalf("stats %+v, want %+v", srv.s.Stats(), want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	go send()
	waitStats(Stats{Active: 1})
	go send()
	waitStats(Stats{Active: 1, Queued: 1})
	resp, b := srv.post(t, "/v1/completions", body)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "2" || !strings.Contains(string(b), `"code":"queue_full"`) {
		t.Fatalf("third request: %d Retry-After %q %s", resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
	if v := gatherValue(t, srv.reg, "kvasir_serve_requests_rejected_total"); v != 1 {
		t.Errorf("rejected_total %v, want 1", v)
	}
	if v := gatherValue(t, srv.reg, "kvasir_serve_queue_depth"); v != 1 {
		t.Errorf("queue_depth %v, want 1", v)
	}
	close(gate)
	for range 2 {
		r := <-results
		if r.code != 200 {
			t.Errorf("accepted request: %d %s", r.code, r.body)
		}
	}
}

// TestDisconnectCancels: a streaming client that goes away mid-generation
// frees its slot at the next step; the generation stops long before
// max_tokens.
func TestDisconnectCancels(t *testing.T) {
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
	if _, err := resp.Body.Read(buf); err != nil { // the first chunk arrived: generating
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for srv.s.Stats().Active != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the request is still active 10 s after the client left")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if v := gatherValue(t, srv.reg, "kvasir_serve_requests_finished_total", "reason", "cancelled"); v != 1 {
		t.Errorf("finished{cancelled} = %v, want 1", v)
	}
	if g := gatherValue(t, srv.reg, "kvasir_serve_generated_tokens_total"); g >= 4000 {
		t.Errorf("%v tokens generated for a client that left", g)
	}
}

func TestMetricsEndpoint(t *testing.T) {
	srv := newTestServer(t, nil)
	resp, body := srv.post(t, "/v1/completions", `{"prompt":"hello","max_tokens":5,"temperature":0}`)
	if resp.StatusCode != 200 {
		t.Fatal(string(body))
	}
	var r completionResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatal(err)
	}
	mresp, err := http.Get(srv.ts.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	text := new(bytes.Buffer)
	_, _ = text.ReadFrom(mresp.Body)
	mresp.Body.Close()
	for _, path := range []string{"/metrics", "/health"} {
		resp, _ := srv.post(t, path, "{}")
		if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
			t.Errorf("POST %s: status %d, Allow %q; want 405, GET, HEAD", path, resp.StatusCode, resp.Header.Get("Allow"))
		}
	}
	for _, line := range []string{
		"kvasir_serve_generated_tokens_total " + strconv.Itoa(r.Usage.CompletionTokens),
		"kvasir_serve_prompt_tokens_total " + strconv.Itoa(r.Usage.PromptTokens),
		`kvasir_serve_http_requests_total{code="200",endpoint="completions"} 1`,
		"kvasir_serve_queue_depth 0",
		"kvasir_serve_batch_rows_bucket",
	} {
		if !strings.Contains(text.String(), line) {
			t.Errorf("/metrics lacks %q", line)
		}
	}
	if !slices.Contains(strings.Split(text.String(), "\n"), `kvasir_serve_requests_finished_total{reason="length"} 1`) &&
		!slices.Contains(strings.Split(text.String(), "\n"), `kvasir_serve_requests_finished_total{reason="stop"} 1`) {
		t.Errorf("/metrics lacks the finished request")
	}
}
