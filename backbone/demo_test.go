package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/demo"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// TestDemoProcess runs `backbone demo --json` as a process and checks its
// report against independent sources: a local decode here, the wire sizes
// of docs/protocol.md, the hub's ledger (`backbone ledger --json`) and the
// gateway's wallets file (`backbone wallets --json`).
func TestDemoProcess(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "demo")
	const prompt, n = "The demo decodes", 24
	out := runBackbone(t, 120*time.Second, "demo", "--json", "--dir", dir, "--max-tokens", strconv.Itoa(n), "--prompt", prompt,
		"--min-deadline", "3s") // a loaded machine must not turn a slow answer into a local computation
	var r demo.Result
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("%v: %s", err, out)
	}

	lm, err := loadGenModel("")
	if err != nil {
		t.Fatal(err)
	}
	defer lm.Close()
	local, err := decode(context.Background(), lm, decodeOptions{prompt: prompt, maxTokens: n}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if !r.TokensEqual || !r.LogitsEqual || !slices.Equal(r.Tokens, local.Tokens) || !slices.Equal(r.LocalTokens, local.Tokens) {
		t.Errorf("demo tokens %v (equal %v, logits %v), its local %v; local decode here %v",
			r.Tokens, r.TokensEqual, r.LogitsEqual, r.LocalTokens, local.Tokens)
	}
	var wantText string // JSON carries each invalid UTF-8 byte as U+FFFD
	enc, _ := json.Marshal(local.Text)
	_ = json.Unmarshal(enc, &wantText)
	if r.Text != wantText || r.SwarmTokS <= 0 || r.LocalTokS <= 0 {
		t.Errorf("text %q (want %q), tok/s swarm %v local %v", r.Text, wantText, r.SwarmTokS, r.LocalTokS)
	}
	p := lm.m.Params()
	rows := uint64(len(local.PromptTokens) + len(local.Tokens) - 1) // rows through each layer
	forwards := uint64(len(local.Tokens))                           // prefill + one per token but the last
	if r.ExpertsLocal != 0 || r.ExpertsRemote != rows*uint64(p.Layers*p.ExpertsUsed) {
		t.Errorf("experts remote %d local %d, want %d and 0", r.ExpertsRemote, r.ExpertsLocal, rows*uint64(p.Layers*p.ExpertsUsed))
	}
	if len(r.Workers) != 2 {
		t.Fatalf("workers: %+v", r.Workers)
	}
	for _, w := range r.Workers {
		for _, s := range w.Sessions {
			// The demo's workers run --backend auto: the CPU here (no GPU),
			// checked to the bit.
			if !strings.HasPrefix(s.Backend, "cpu") || s.Tolerance != 0 || s.Mismatches != 0 {
				t.Errorf("worker %s session %s: backend %q tolerance %v mismatches %d, want cpu, 0, 0", w.Name, s.Session, s.Backend, s.Tolerance, s.Mismatches)
			}
		}
	}

	var ledger ledgerJSON
	if err := json.Unmarshal(runBackbone(t, 30*time.Second, "ledger", "--db", filepath.Join(dir, "ledger.sqlite"), "--json"), &ledger); err != nil {
		t.Fatal(err)
	}
	var wallets struct {
		Wallets []struct {
			Worker string `json:"worker"`
			Bytes  uint64 `json:"bytes"`
			NKVR   uint64 `json:"nkvr"`
		} `json:"wallets"`
	}
	if err := json.Unmarshal(runBackbone(t, 30*time.Second, "wallets", "--db", filepath.Join(dir, "wallets.sqlite"), "--json"), &wallets); err != nil {
		t.Fatal(err)
	}
	if len(ledger.Workers) != 2 || len(wallets.Wallets) != 2 {
		t.Fatalf("ledger %+v, wallets %+v: want 2 workers each", ledger, wallets)
	}
	d, k := uint64(p.Embd), uint64(p.ExpertsUsed)
	for i, w := range r.Workers {
		wantLayers := []int{i, i + 2}
		if len(w.Layers) != 2 || w.Layers[0] != wantLayers[0] || w.Layers[1] != wantLayers[1] {
			t.Errorf("%s layers %v, want %v", w.Name, w.Layers, wantLayers)
		}
		// docs/protocol.md: each worker holds all k experts of its layers,
		// so every request is a DISPATCH_SUM (row sums, wire 6) = 24 +
		// 4nd + 8nk bytes, answered by a RESULT of n rows = 28 + 4nd
		// bytes on the wire, credited as the RESULT of its n x k outputs,
		// 28 + 4nkd; one request per held layer per forward.
		wRows := rows * uint64(len(w.Layers))
		reqs := forwards * uint64(len(w.Layers))
		wantBytes := 52*reqs + 4*wRows*(d+2*k) + 4*wRows*k*d
		if w.Rows != wRows || w.LedgerBytes != wantBytes || w.RejectedBytes != 0 {
			t.Errorf("%s: rows %d ledger %d rejected %d; want rows %d, %d creditable bytes", w.Name, w.Rows, w.LedgerBytes, w.RejectedBytes, wRows, wantBytes)
		}
		// The backbone's own counts are the bytes on the wire, plus the
		// control frames (HELLO, WELCOME).
		wireBytes := 52*reqs + 4*wRows*(d+2*k) + 4*wRows*d
		if all := w.BytesIn + w.BytesOut; all < wireBytes || all > wireBytes+16<<10 {
			t.Errorf("%s: backbone counted %d bytes, the frames %d (ledger %d)", w.Name, all, wireBytes, wantBytes)
		}
		if w.CreditedBytes != w.LedgerBytes || w.CreditedNKVR != 7*w.LedgerBytes || w.CreditedNKVR == 0 ||
			w.CreditedKVR != walletapi.FormatKVR(7*w.LedgerBytes) {
			t.Errorf("%s: credited %d bytes, %d nKVR (%s); want %d x 7", w.Name, w.CreditedBytes, w.CreditedNKVR, w.CreditedKVR, w.LedgerBytes)
		}
		found := 0
		for _, l := range ledger.Workers {
			if l.ID == w.ID && l.Bytes == w.LedgerBytes && l.RejectedBytes == 0 && l.Address == w.Address {
				found++
			}
		}
		for _, x := range wallets.Wallets {
			if x.Worker == w.ID && x.Bytes == w.LedgerBytes && x.NKVR == 7*w.LedgerBytes {
				found++
			}
		}
		if found != 2 {
			t.Errorf("%s (%s): ledger %+v, wallets %+v", w.Name, w.ID, ledger.Workers, wallets.Wallets)
		}
		if alive(w.Pid) {
			t.Errorf("%s (pid %d) outlived the demo", w.Name, w.Pid)
		}
	}
}

// alive reports whether process pid exists (signal 0).
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	if err != nil {
		return false
	}
	return p.Signal(syscall.Signal(0)) == nil
}

// newMark returns a fresh environment marker "KVASIR_TEST_MARK=<16 hex
// digits>" for a child process tree (see marked).
func newMark() string {
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	return "KVASIR_TEST_MARK=" + hex.EncodeToString(rnd[:])
}

// waitUnmarked waits up to 10 s until no process holds mark; otherwise it
// kills those left and fails the test ("processes [...] outlived WHAT").
func waitUnmarked(t *testing.T, mark, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for left := marked(t, mark); len(left) > 0; left = marked(t, mark) {
		if time.Now().After(deadline) {
			for _, pid := range left {
				if q, err := os.FindProcess(pid); err == nil {
					_ = q.Kill()
				}
			}
			t.Fatalf("processes %v outlived %s", left, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// marked lists the processes whose environment holds mark (Linux /proc).
func marked(t *testing.T, mark string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc:", err)
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && bytes.Contains(env, []byte(mark)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestDemoNoOrphans interrupts (SIGINT, as Ctrl-C) and kills (SIGKILL) a
// running demo once its workers are connected: none of its children may
// survive it. Children are found by an environment marker they inherit.
func TestDemoNoOrphans(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("finds children through /proc and relies on Linux's parent-death signal")
	}
	for _, sig := range []os.Signal{os.Interrupt, os.Kill} {
		t.Run(sig.String(), func(t *testing.T) {
			mark := newMark()
			log := newTestLog(t)
			p, err := demo.Start("demo", log, []string{asBackbone, mark}, backboneBin(t),
				"demo", "--verbose", "--max-tokens", "4000", "--dir", t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer p.Kill()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := p.Await(ctx, regexp.MustCompile(`^\[worker-1\] .*worker: connected`)); err != nil {
				t.Fatal(err)
			}
			if n := len(marked(t, mark)); n < 5 {
				t.Fatalf("%d marked processes while the demo runs, want demo + hub + gateway + 2 workers", n)
			}
			if err := p.Signal(sig); err != nil {
				t.Fatal(err)
			}
			select {
			case <-p.Done():
			case <-time.After(30 * time.Second):
				t.Fatal("demo did not exit")
			}
			waitUnmarked(t, mark, fmt.Sprintf("the demo (%v)", sig))
		})
	}
}

// TestDemoFlags: bad flags exit 2; a --dir that already holds files
// (whose ledger and wallets would mix into the report) exits 1 before
// anything starts.
func TestDemoFlags(t *testing.T) {
	var out, errb bytes.Buffer
	for _, args := range [][]string{{"extra"}, {"--max-tokens", "0"}, {"--workers", "0"}, {"--rate-nkvr-per-byte", "0"}, {"--nope"},
		{"--serve-requests", "-1"}, {"--provision-rate", "1XiB"}} {
		if c := demoMain(context.Background(), args, &out, &errb); c != 2 {
			t.Errorf("demo %v: exit %d, want 2", args, c)
		}
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "ledger.sqlite"), []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	errb.Reset()
	if c := demoMain(context.Background(), []string{"--dir", dir}, &out, &errb); c != 1 || !bytes.Contains(errb.Bytes(), []byte("not empty")) {
		t.Errorf("non-empty --dir: exit %d, %q", c, errb.String())
	}
	if c := demoMain(context.Background(), []string{"--workers", "5"}, &out, &errb); c != 1 || !bytes.Contains(errb.Bytes(), []byte("only 4 layers")) {
		t.Errorf("--workers 5 on 4 layers: exit %d, %q", c, errb.String())
	}
}
