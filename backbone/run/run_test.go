package run

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func loadTiny(t *testing.T) *Model {
	t.Helper()
	m, err := Load("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	m.Engine().SetThreads(1)
	return m
}

func TestLoad(t *testing.T) {
	m := loadTiny(t)
	if m.File() == nil || m.Engine() == nil || m.Tokenizer() == nil {
		t.Fatal("a part of the model is missing")
	}
	if want, _ := slice.ModelID(m.File()); m.ID() == "" || m.ID() != want {
		t.Errorf("ID %q, want slice.ModelID %q", m.ID(), want)
	}
	if _, err := Load(filepath.Join(t.TempDir(), "missing.gguf")); err == nil {
		t.Error("a missing file loaded")
	}
}

// TestDecodeGreedy: Decode's tokens are the engine's greedy continuation
// (prefill, then each argmax fed back), the streamed text is Text, OnToken
// sees every token in order, and the logits hash is deterministic.
func TestDecodeGreedy(t *testing.T) {
	m := loadTiny(t)
	const prompt, n = "The swarm decodes", 8
	var streamed bytes.Buffer
	var seen []int32
	res, err := Decode(context.Background(), m, DecodeOptions{Prompt: prompt, MaxTokens: n,
		OnToken: func(i int, tok int32) {
			if i != len(seen) {
				t.Errorf("OnToken index %d after %d tokens", i, len(seen))
			}
			seen = append(seen, tok)
		}}, &streamed)
	if err != nil {
		t.Fatal(err)
	}

	eng, tok := m.Engine(), m.Tokenizer()
	ids := tok.Tokenize(prompt, true, false)
	if !slices.Equal(res.PromptTokens, ids) {
		t.Fatalf("prompt tokens %v, want %v", res.PromptTokens, ids)
	}
	seq := eng.NewSequence()
	logits := make([]float32, eng.Params().Vocab)
	rows := make([]model.Row, len(ids))
	for i, id := range ids {
		rows[i] = model.Row{Seq: seq, Token: id, Pos: i, Logits: i == len(ids)-1}
	}
	if err := eng.Forward(context.Background(), rows, logits); err != nil {
		t.Fatal(err)
	}
	var want []int32
	for {
		next := model.Greedy(logits)
		want = append(want, next)
		if len(want) == n || tok.IsEOG(next) {
			break
		}
		if err := eng.Forward(context.Background(), []model.Row{{Seq: seq, Token: next, Pos: seq.Len(), Logits: true}}, logits); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(res.Tokens, want) || !slices.Equal(seen, want) {
		t.Errorf("tokens %v (OnToken %v), want %v", res.Tokens, seen, want)
	}
	if res.Text != tok.Decode(want) || streamed.String() != tokenizer.ToValidUTF8([]byte(res.Text)) {
		t.Errorf("text %q, streamed %q, want %q", res.Text, streamed.String(), tok.Decode(want))
	}
	if res.PrefillTokS <= 0 || (len(want) > 1 && (res.DecodeTokS <= 0 || res.MaxStepMs <= 0)) {
		t.Errorf("rates %+v", res)
	}
	again, err := Decode(context.Background(), m, DecodeOptions{Prompt: prompt, MaxTokens: n}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.LogitsSHA256 != res.LogitsSHA256 || len(res.LogitsSHA256) != 64 {
		t.Errorf("logits hash %s, then %s", res.LogitsSHA256, again.LogitsSHA256)
	}
}

// TestDecodeNoTokens: MaxTokens 0 runs no forward pass (the hash is that
// of no logits); a cancelled ctx fails the forward pass.
func TestDecodeNoTokens(t *testing.T) {
	m := loadTiny(t)
	res, err := Decode(context.Background(), m, DecodeOptions{Prompt: "x"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	const emptySHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
	if len(res.Tokens) != 0 || res.Tokens == nil || res.LogitsSHA256 != emptySHA || len(res.PromptTokens) == 0 {
		t.Errorf("%+v", res)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Decode(ctx, m, DecodeOptions{Prompt: "x", MaxTokens: 2}, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled decode: %v", err)
	}
}

// TestDecodeFinish: why a decode stopped (Result.Finish): "length" at
// MaxTokens, "context" when the model's context is full first (the last
// position fed is Context-1), and a prompt longer than the context is an
// error naming both counts, before any forward pass.
func TestDecodeFinish(t *testing.T) {
	m := loadTiny(t)
	ctxLen := m.Engine().Params().Context
	var streamed strings.Builder
	res, err := Decode(context.Background(), m, DecodeOptions{Prompt: "In the beginning", MaxTokens: 3}, &streamed)
	if err != nil || res.Finish != "length" || len(res.Tokens) != 3 {
		t.Fatalf("3 tokens: %v, %+v", err, res)
	}
	// --json's text is the text output, valid UTF-8 (a cut-off character
	// one U+FFFD, as serve shows it; JSON encoding would make one per byte).
	if res.Text != streamed.String() || !utf8.ValidString(res.Text) {
		t.Errorf("text %q, streamed %q", res.Text, streamed.String())
	}
	res, err = Decode(context.Background(), m, DecodeOptions{Prompt: "In the beginning", MaxTokens: 2 * ctxLen}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Finish == "stop" {
		t.Fatalf("the embedded model ended its text after %d tokens: take a prompt it continues to its context", len(res.Tokens))
	}
	if res.Finish != "context" || len(res.PromptTokens)+len(res.Tokens)-1 != ctxLen {
		t.Errorf("finish %q after %d + %d tokens, context %d", res.Finish, len(res.PromptTokens), len(res.Tokens), ctxLen)
	}
	long := strings.Repeat("and the king said ", ctxLen/4+1)
	_, err = Decode(context.Background(), m, DecodeOptions{Prompt: long, MaxTokens: 1}, nil)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the model's context is %d", ctxLen)) {
		t.Errorf("a prompt over the context: %v", err)
	}
}

// TestDispatcherConfig: the shapes and id of the model, expert hashes equal
// to slice.HashExpert of the local experts, the deadline floor, the
// provisioning catalog and rate, and Tune last.
func TestDispatcherConfig(t *testing.T) {
	m := loadTiny(t)
	p := m.Engine().Params()
	cfg, err := dispatcherConfig(m, SwarmConfig{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	if want := (dispatch.Model{ID: m.ID(), D: p.Embd, K: p.ExpertsUsed, NLayer: p.Layers, NExpert: p.Experts}); cfg.Model != want {
		t.Errorf("model %+v, want %+v", cfg.Model, want)
	}
	if cfg.MinDeadline != 0 || cfg.MaxDeadline != 0 || cfg.Catalog != nil || cfg.Fallback == nil {
		t.Errorf("defaults changed: %+v", cfg)
	}
	local := m.Engine().LocalExperts()
	for range 2 { // the second time from the cache
		h, ok := cfg.ExpertHash(1, 3)
		if want, wok := slice.HashExpert(local.Layer(1), 3); !ok || !wok || h != want {
			t.Errorf("hash of (1, 3): %x %v, want %x", h, ok, want)
		}
	}
	if _, ok := cfg.ExpertHash(p.Layers, 0); ok {
		t.Error("a hash for a layer the model lacks")
	}

	for _, c := range []struct{ min, wantMax time.Duration }{{time.Second, 5 * time.Second}, {9 * time.Second, 9 * time.Second}} {
		cfg, err := dispatcherConfig(m, SwarmConfig{MinDeadline: c.min})
		if err != nil || cfg.MinDeadline != c.min || cfg.MaxDeadline != c.wantMax {
			t.Errorf("--min-deadline %v: min %v max %v (%v), want max %v", c.min, cfg.MinDeadline, cfg.MaxDeadline, err, c.wantMax)
		}
	}
	cfg, err = dispatcherConfig(m, SwarmConfig{Provision: true, ProvisionRate: 1 << 20, MinDeadline: time.Second,
		Tune: func(c *dispatch.Config) { c.MaxDeadline = 2 * time.Second }})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Catalog == nil || cfg.RateLimit != 1<<20 || cfg.MaxDeadline != 2*time.Second {
		t.Errorf("provision: catalog %v rate %v max deadline %v", cfg.Catalog != nil, cfg.RateLimit, cfg.MaxDeadline)
	}
}

// TestStartSwarm: Listening gets the bound address before the wait; a
// wait that ends with its ctx closes the dispatcher (its port is free
// again) and says how many workers it waited for.
func TestStartSwarm(t *testing.T) {
	m := loadTiny(t)
	var heard string
	d, err := StartSwarm(context.Background(), m, SwarmConfig{Listen: "127.0.0.1:0", Logger: quiet, Listening: func(a string) { heard = a }})
	if err != nil {
		t.Fatal(err)
	}
	if heard == "" || heard != d.Addr() {
		t.Errorf("Listening heard %q, dispatcher at %q", heard, d.Addr())
	}
	d.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	heard = ""
	_, err = StartSwarm(ctx, m, SwarmConfig{Listen: "127.0.0.1:0", Workers: 2, Logger: quiet, Listening: func(a string) { heard = a }})
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "waiting for 2 workers") {
		t.Fatalf("err %v", err)
	}
	ln, err := net.Listen("tcp", heard)
	if err != nil {
		t.Fatalf("the dispatcher of a failed wait still listens: %v", err)
	}
	ln.Close()
	if _, err := StartSwarm(context.Background(), m, SwarmConfig{Listen: "256.0.0.1:0", Logger: quiet}); err == nil {
		t.Error("listening on a bad address succeeded")
	}
	// Every interface, or a public address, only with AllowPublic: the
	// hub's links are not authenticated.
	for _, public := range []string{"0.0.0.0:0", ":0", "[::]:0", "8.8.8.8:0"} {
		_, err := StartSwarm(context.Background(), m, SwarmConfig{Listen: public, Logger: quiet})
		if !errors.Is(err, hub.ErrPublic) || !strings.Contains(err.Error(), "--dispatch-allow-public") {
			t.Errorf("%s: %v, want hub.ErrPublic naming --dispatch-allow-public", public, err)
		}
	}
	d, err = StartSwarm(context.Background(), m, SwarmConfig{Listen: "0.0.0.0:0", AllowPublic: true, Logger: quiet})
	if err != nil {
		t.Fatalf("0.0.0.0:0 with AllowPublic: %v", err)
	}
	d.Close()
}

// TestBackboneOnlyModel: a backbone-only file loads with the full model's
// id and its hot experts only; it cannot decode alone (CheckLocal); its
// dispatcher uses the stored hashes, computes only the hot experts, and
// provisions from a model source (the file's URL or SwarmConfig.Source),
// refusing to provision without one.
func TestBackboneOnlyModel(t *testing.T) {
	full := loadTiny(t)
	dir := t.TempDir()
	bpath := filepath.Join(dir, "backbone.gguf")
	bo, err := slice.WriteBackboneOnly(full.File(), bpath, slice.BackboneOptions{Hot: [][2]int{{2, 3}}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(bpath)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if m.ID() != full.ID() || m.BackboneOnly() == nil || full.BackboneOnly() != nil || full.CheckLocal() != nil {
		t.Fatalf("id %q (full %q), backbone-only %v", m.ID(), full.ID(), m.BackboneOnly() != nil)
	}
	if err := m.CheckLocal(); !errors.Is(err, ErrNeedsSwarm) {
		t.Fatalf("CheckLocal: %v", err)
	}
	cfg, err := dispatcherConfig(m, SwarmConfig{HolderWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Model.ID != full.ID() || cfg.HolderWait != time.Second || cfg.Catalog != nil || cfg.LocalHeld == nil {
		t.Fatalf("config %+v", cfg)
	}
	if !cfg.LocalHeld(2, 3) || cfg.LocalHeld(2, 4) || cfg.LocalHeld(0, 3) {
		t.Error("LocalHeld is not the hot set")
	}
	want, _ := slice.HashExpert(full.Engine().LocalExperts().Layer(1), 6)
	if got, ok := cfg.ExpertHash(1, 6); !ok || got != want {
		t.Error("ExpertHash is not the full model's expert hash")
	}
	if _, err := dispatcherConfig(m, SwarmConfig{Provision: true}); err == nil || !strings.Contains(err.Error(), "--model-source") {
		t.Errorf("provisioning without a source: %v", err)
	}
	cfg, err = dispatcherConfig(m, SwarmConfig{Provision: true, Source: "http://127.0.0.1:9/full.gguf"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Catalog == nil || cfg.Catalog.HasBytes() || cfg.Source != "http://127.0.0.1:9/full.gguf" {
		t.Fatalf("provisioning: catalog %v, source %q", cfg.Catalog != nil, cfg.Source)
	}
	if _, err := dispatch.New(cfg); err != nil {
		t.Fatalf("dispatch.New: %v", err)
	}
	// A flipped byte of the hot expert in the file is refused at load.
	raw, err := os.ReadFile(bpath)
	if err != nil {
		t.Fatal(err)
	}
	f, _ := gguf.Parse(raw)
	ti, _ := f.TensorInfo("blk.2.ffn_down_hot.3.weight")
	raw[f.DataOffset+ti.Offset] ^= 1
	if err := os.WriteFile(bpath, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(bpath); !errors.Is(err, slice.ErrCorrupt) {
		t.Errorf("a corrupt hot expert: %v", err)
	}
	if len(bo.Hot) != 1 {
		t.Errorf("hot %v", bo.Hot)
	}
}
