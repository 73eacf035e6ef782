package serve

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// loadTiny loads a fresh Model (its own buffers) of the generated
// tiny-qwen35moe (random weights, vocabulary 512): these tests are of the
// server, not of the commands' default model.
func loadTiny(tb testing.TB) (*model.Model, *tokenizer.Tokenizer) {
	tb.Helper()
	data, err := modelgen.TinyQwen35MoE()
	if err != nil {
		tb.Fatal(err)
	}
	f, err := gguf.Parse(data)
	if err != nil {
		tb.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		tb.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		tb.Fatal(err)
	}
	return m, tok
}

// loadSpec builds and loads the tiny preset modified by mod.
func loadSpec(tb testing.TB, mod func(*modelgen.Spec)) (*model.Model, *tokenizer.Tokenizer) {
	tb.Helper()
	sp, err := modelgen.Preset(modelgen.DefaultPreset)
	if err != nil {
		tb.Fatal(err)
	}
	mod(&sp)
	w, err := modelgen.Build(sp)
	if err != nil {
		tb.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		tb.Fatal(err)
	}
	f, err := gguf.Parse(buf.Bytes())
	if err != nil {
		tb.Fatal(err)
	}
	m, err := model.Load(f)
	if err != nil {
		tb.Fatal(err)
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		tb.Fatal(err)
	}
	return m, tok
}

// fixtureTokenizer loads the fixtures' GPT-2 tokenizer (model B), skipping
// when the fixtures are absent.
func fixtureTokenizer(tb testing.TB) *tokenizer.Tokenizer {
	tb.Helper()
	f, err := gguf.Open("../../../shared/fixtures/tiny-qwen3moe-Q8_0.gguf")
	if err != nil {
		tb.Skipf("fixtures not available: %v", err)
	}
	tb.Cleanup(func() { f.Close() })
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		tb.Fatal(err)
	}
	return tok
}

var errInjected = errors.New("injected expert failure")

// failingExperts fails every call while on is set.
type failingExperts struct {
	inner expert.Computer
	on    atomic.Bool
}

func (e *failingExperts) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	if e.on.Load() {
		return errInjected
	}
	return e.inner.ComputeExperts(ctx, layer, hidden, ids, n, k, out)
}

// refModel is a second, independent instance of the tiny model for
// reference decodes (a Model's Forward is not concurrent).
var refModel struct {
	once sync.Once
	mu   sync.Mutex
	m    *model.Model
	tok  *tokenizer.Tokenizer
}

// directGreedy decodes prompt greedily on its own: the whole prompt in one
// Forward, then one token per Forward, stopping after maxTokens tokens, an
// end-of-generation token (included) or a full context, as
// backbone generate does.
func directGreedy(tb testing.TB, prompt []int32, maxTokens int) []int32 {
	tb.Helper()
	refModel.once.Do(func() { refModel.m, refModel.tok = loadTiny(tb) })
	refModel.mu.Lock()
	defer refModel.mu.Unlock()
	m, tok := refModel.m, refModel.tok
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
	var out []int32
	for {
		t := model.Greedy(logits)
		out = append(out, t)
		if len(out) >= maxTokens || tok.IsEOG(t) || seq.Len() >= p.Context {
			return out
		}
		if err := m.Forward(context.Background(), []model.Row{{Seq: seq, Token: t, Pos: seq.Len(), Logits: true}}, logits); err != nil {
			tb.Fatal(err)
		}
	}
}

// slowExperts wraps a Computer: each call sleeps delay, and waits for gate
// (when set) to be closed or ctx to end.
type slowExperts struct {
	inner expert.Computer
	delay time.Duration
	gate  chan struct{}
	mu    sync.Mutex
	n     int
	rows  []int // rows per call
}

func (e *slowExperts) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	e.mu.Lock()
	e.n++
	e.rows = append(e.rows, n)
	e.mu.Unlock()
	if e.delay > 0 {
		t := time.NewTimer(e.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if e.gate != nil {
		select {
		case <-e.gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return e.inner.ComputeExperts(ctx, layer, hidden, ids, n, k, out)
}

// testServer is a started Server behind an httptest server.
type testServer struct {
	s   *Server
	ts  *httptest.Server
	reg *prometheus.Registry
	tok *tokenizer.Tokenizer
	m   *model.Model
}

func newTestServer(tb testing.TB, mod func(*Config)) *testServer {
	tb.Helper()
	m, tok := loadTiny(tb)
	m.SetThreads(1)
	reg := prometheus.NewRegistry()
	chat, chatErr := ChatTemplateFor(tok, "", "auto")
	cfg := Config{Model: m, Tokenizer: tok, ModelID: "tiny", Chat: chat, ChatErr: chatErr, Registry: reg, Logger: quiet}
	if mod != nil {
		mod(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	s.Start()
	ts := httptest.NewServer(s.Handler())
	tb.Cleanup(func() {
		ts.Close()
		s.Close()
	})
	return &testServer{s: s, ts: ts, reg: reg, tok: tok, m: m}
}

func (t *testServer) post(tb testing.TB, path, body string) (*http.Response, []byte) {
	tb.Helper()
	resp, err := http.Post(t.ts.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp, b
}

// sseEvents parses a server-sent-event body into its data payloads, in
// order; it fails on lines that are not "data: ..." or blank.
func sseEvents(r io.Reader) ([]string, error) {
	var out []string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
		case strings.HasPrefix(line, "data: "):
			out = append(out, strings.TrimPrefix(line, "data: "))
		default:
			return out, fmt.Errorf("unexpected SSE line %q", line)
		}
	}
	return out, sc.Err()
}

// streamed is what a streaming client collected.
type streamed struct {
	text   string
	finish string
	usage  *usage
	chunks int
	done   bool // saw data: [DONE]
}

// collectStream parses completion or chat chunks.
func collectStream(events []string) (streamed, error) {
	var s streamed
	for i, e := range events {
		if e == "[DONE]" {
			if i != len(events)-1 {
				return s, fmt.Errorf("[DONE] is not last")
			}
			s.done = true
			continue
		}
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Text  *string `json:"text"`
				Delta *struct {
					Content *string `json:"content"`
				} `json:"delta"`
				Finish *string `json:"finish_reason"`
			} `json:"choices"`
			Usage *usage          `json:"usage"`
			Error json.RawMessage `json:"error"`
		}
		if err := json.Unmarshal([]byte(e), &c); err != nil {
			return s, fmt.Errorf("event %d: %v", i, err)
		}
		if c.Error != nil {
			return s, fmt.Errorf("error event: %s", c.Error)
		}
		if c.Usage != nil {
			s.usage = c.Usage
		}
		for _, ch := range c.Choices {
			s.chunks++
			if ch.Text != nil {
				s.text += *ch.Text
			}
			if ch.Delta != nil && ch.Delta.Content != nil {
				s.text += *ch.Delta.Content
			}
			if ch.Finish != nil {
				s.finish = *ch.Finish
			}
		}
	}
	return s, nil
}

// gatherValue returns the value of a counter or gauge, or the sample count
// of a histogram, from reg (labels: name=value pairs to match).
func gatherValue(tb testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	tb.Helper()
	mf := gatherFamily(tb, reg, name)
	if mf == nil {
		return 0
	}
	sum := 0.0
	for _, m := range mf.Metric {
		ok := true
		for i := 0; i+1 < len(labels); i += 2 {
			found := false
			for _, lp := range m.Label {
				if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
					found = true
				}
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

func gatherFamily(tb testing.TB, reg prometheus.Gatherer, name string) *dto.MetricFamily {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf
		}
	}
	return nil
}

func jsonBody(tb testing.TB, v any) string {
	tb.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		tb.Fatal(err)
	}
	return string(bytes.TrimSpace(b))
}
