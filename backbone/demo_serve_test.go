package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// sseChat streams a greedy chat completion of one user message from the
// API at addr with a plain Go SSE client (bufio over the response body,
// "data: " lines, "[DONE]" last) and returns the concatenated delta
// contents and the last finish_reason.
func sseChat(t *testing.T, addr, model, content string, n int) (text, finish string) {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": n, "temperature": 0,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("chat: %d %s: %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	var sb strings.Builder
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			return sb.String(), finish
		}
		var c struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				Finish *string `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil || c.Object != "chat.completion.chunk" {
			t.Fatalf("chunk %q: %v", data, err)
		}
		for _, ch := range c.Choices {
			sb.WriteString(ch.Delta.Content)
			if ch.Finish != nil {
				finish = *ch.Finish
			}
		}
	}
	t.Fatalf("stream ended without [DONE] (%v)", sc.Err())
	return "", ""
}

// TestDemoServe runs `backbone demo --serve --serve-requests 2` as a
// process: hub, TLS gateway and two worker processes with the API on top.
// A Go SSE client streams a greedy chat completion whose text equals a
// local decode of the ChatML-rendered prompt (tokenized here with
// special-token parsing, independently of the server's template code);
// /metrics then counts exactly rows x layers x k expert outputs computed
// by workers and none locally. The printed curl command (run as printed
// where curl exists) is the second request, after which the demo stops
// by itself with status 0 and leaves no child process behind.
func TestDemoServe(t *testing.T) {
	mark := newMark()
	log := newTestLog(t)
	p, err := demo.Start("demo", log, []string{asBackbone, mark}, backboneBin(t), "demo", "--serve",
		"--http", "127.0.0.1:0", "--serve-requests", "2", "--threads", "1",
		"--min-deadline", "3s") // a loaded machine must not turn a slow answer into a local computation
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	m, err := p.Await(ctx, regexp.MustCompile(`^API: http://(\S+)/v1 `))
	if err != nil {
		t.Fatal(err)
	}
	addr := m[1]
	try, err := p.Await(ctx, regexp.MustCompile(`^try: (curl .*)$`))
	if err != nil {
		t.Fatal(err)
	}
	if runtime.GOOS == "linux" {
		if n := len(marked(t, mark)); n != 5 {
			t.Errorf("%d marked processes while serving, want demo + hub + gateway + 2 workers", n)
		}
	}

	lm, err := loadGenModel("")
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	const content, n = "Who computes the experts?", 16
	local, err := decode(context.Background(), lm, decodeOptions{maxTokens: n, special: true,
		prompt: "<|im_start|>user\n" + content + "<|im_end|>\n<|im_start|>assistant\n"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	var want []byte
	for _, tk := range local.Tokens {
		if !lm.tok.IsEOG(tk) {
			want = append(want, lm.tok.Piece(tk)...)
		}
	}
	name, err := lm.File().String("general.name") // the served model's id
	if err != nil {
		t.Fatal(err)
	}
	got, finish := sseChat(t, addr, name, content, n)
	if got != tokenizer.ToValidUTF8(want) {
		t.Errorf("streamed %q, local decode %q (tokens %v)", got, tokenizer.ToValidUTF8(want), local.Tokens)
	}
	if wantFinish := map[bool]string{true: "stop", false: "length"}[lm.tok.IsEOG(local.Tokens[len(local.Tokens)-1])]; finish != wantFinish {
		t.Errorf("finish_reason %q, want %q", finish, wantFinish)
	}
	t.Logf("streamed %d tokens (finish %s): %q", len(local.Tokens), finish, got)
	pp := lm.m.Params()
	rows := len(local.PromptTokens) + len(local.Tokens) - 1
	met := getMetrics(t, addr)
	remote := metricValue(met, `kvasir_swarm_expert_outputs_total{where="remote"}`)
	localN := metricValue(met, `kvasir_swarm_expert_outputs_total{where="local"}`)
	if w := float64(rows * pp.Layers * pp.ExpertsUsed); remote != w || localN != 0 {
		t.Errorf("expert outputs remote %v local %v, want %v and 0\n%s", remote, localN, w, grepLines(met, "kvasir_swarm_"))
	}

	// The second completion request: the printed command, or the same
	// request from Go where there is no curl.
	if _, err := exec.LookPath("curl"); err == nil {
		out, err := exec.CommandContext(ctx, "sh", "-c", try[1]+" --silent --show-error").Output()
		if err != nil || !bytes.Contains(out, []byte("data: [DONE]")) || !bytes.Contains(out, []byte(`"chat.completion.chunk"`)) {
			t.Errorf("%s: %v\n%s", try[1], err, out)
		}
	} else {
		sseChat(t, addr, name, "Tell me about the swarm.", 32)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("demo --serve did not stop after --serve-requests 2")
	}
	if err := p.Err(); err != nil {
		t.Errorf("demo --serve: %v", err)
	}
	if _, err := p.Await(ctx, regexp.MustCompile(`^experts: [1-9][0-9]* computed by workers, 0 locally`)); err != nil {
		t.Error(err)
	}
	if runtime.GOOS == "linux" {
		waitUnmarked(t, mark, "demo --serve")
	}
}

// TestDemoServeInterrupt: `backbone demo --serve` without
// --serve-requests serves until SIGINT (Ctrl-C), then exits with status 0
// and stops every child (none is left, found by an inherited environment
// marker).
func TestDemoServeInterrupt(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("finds children through /proc")
	}
	mark := newMark()
	p, err := demo.Start("demo", newTestLog(t), []string{asBackbone, mark}, backboneBin(t), "demo", "--serve",
		"--http", "127.0.0.1:0", "--threads", "1")
	if err != nil {
		t.Fatal(err)
	}
	defer p.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := p.Await(ctx, regexp.MustCompile(`^serving until Ctrl-C`)); err != nil {
		t.Fatal(err)
	}
	if n := len(marked(t, mark)); n != 5 {
		t.Errorf("%d marked processes while serving, want demo + hub + gateway + 2 workers", n)
	}
	if err := p.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("demo --serve did not stop on SIGINT")
	}
	if err := p.Err(); err != nil {
		t.Errorf("demo --serve after SIGINT: %v", err)
	}
	waitUnmarked(t, mark, "demo --serve")
}

// TestDemoProvision runs `backbone demo --provision --json`: the workers
// start with empty slice folders and a quota, download their experts from
// the backbone, and the decode over them equals the local one bit for bit
// with every expert output computed remotely. Each worker holds some
// experts, together all of them, and the backbone sent at least the bytes
// of every expert file (as `backbone slice` writes them) to the workers.
func TestDemoProvision(t *testing.T) {
	const prompt, n = "Experts travel to the workers", 16
	out := runBackbone(t, 120*time.Second, "demo", "--json", "--provision", "--max-tokens", strconv.Itoa(n),
		"--prompt", prompt, "--min-deadline", "3s")
	var r demo.Result
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	lm, err := loadGenModel("")
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	local, err := decode(context.Background(), lm, decodeOptions{prompt: prompt, maxTokens: n}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if !r.TokensEqual || !r.LogitsEqual || !slices.Equal(r.Tokens, local.Tokens) {
		t.Errorf("tokens %v (equal %v, logits %v), local %v", r.Tokens, r.TokensEqual, r.LogitsEqual, local.Tokens)
	}
	p := lm.m.Params()
	rows := uint64(len(local.PromptTokens) + len(local.Tokens) - 1)
	if r.ExpertsLocal != 0 || r.ExpertsRemote != rows*uint64(p.Layers*p.ExpertsUsed) {
		t.Errorf("experts remote %d local %d, want %d and 0", r.ExpertsRemote, r.ExpertsLocal, rows*uint64(p.Layers*p.ExpertsUsed))
	}

	// The expert files' bytes, from a slice of every layer.
	data, err := demomodel.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	modelPath := filepath.Join(dir, "tiny.gguf")
	if err := os.WriteFile(modelPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	runBackbone(t, 60*time.Second, "slice", "--model", modelPath, "--layers", "0,1,2,3", "--out", filepath.Join(dir, "all"))
	var expertBytes uint64
	err = filepath.WalkDir(filepath.Join(dir, "all"), func(path string, d fs.DirEntry, err error) error {
		if err == nil && strings.HasSuffix(path, ".bin") {
			info, err := d.Info()
			if err != nil {
				return err
			}
			expertBytes += uint64(info.Size())
		}
		return err
	})
	if err != nil || expertBytes == 0 {
		t.Fatalf("slice files: %d bytes, %v", expertBytes, err)
	}

	if len(r.Workers) != 2 {
		t.Fatalf("workers %+v", r.Workers)
	}
	held, sent := 0, uint64(0)
	for _, w := range r.Workers {
		h := 0
		for _, s := range w.Sessions {
			h += s.Holdings
		}
		if h == 0 || w.Rows == 0 || len(w.Layers) != 0 {
			t.Errorf("%s: holdings %d, rows %d, layers %v: want a share of the experts, no fixed layers", w.Name, h, w.Rows, w.Layers)
		}
		held += h
		sent += w.BytesOut
	}
	if held != p.Layers*p.Experts || sent < expertBytes {
		t.Errorf("workers hold %d experts (want %d), were sent %d bytes (expert files: %d)", held, p.Layers*p.Experts, sent, expertBytes)
	}
}
