package run

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/demomodel"
)

// residentModel writes the tiny preset to a file (Resident applies to
// mapped files only) and loads it.
func residentModel(t *testing.T) *Model {
	t.Helper()
	data, err := demomodel.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := writeFile(path, data); err != nil {
		t.Fatal(err)
	}
	m, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestResidentSameLogits: every --resident mode decodes the same tokens
// and logits bits as the file left mapped (the weights are the same bytes
// at the same addresses).
func TestResidentSameLogits(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("lock and copy are Linux-only")
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var want *Result
	for _, mode := range []string{"mmap", "copy", "lock", ResidentAuto} {
		m := residentModel(t)
		r, err := m.Resident(mode, quiet)
		if err != nil {
			if mode == "lock" {
				t.Logf("lock refused here: %v", err)
				continue
			}
			t.Fatalf("%s: %v", mode, err)
		}
		if r.Bytes == 0 || r.Bytes > m.File().ResidentBytes(nil) {
			t.Fatalf("%s: report %+v", mode, r)
		}
		res, err := Decode(context.Background(), m, DecodeOptions{Prompt: "Hello", MaxTokens: 8}, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if want == nil {
			want = res
			continue
		}
		if res.LogitsSHA256 != want.LogitsSHA256 {
			t.Fatalf("%s: logits %s, mapped %s", mode, res.LogitsSHA256, want.LogitsSHA256)
		}
	}
}

// TestResidentAutoTooBig: when the weights and the margin do not fit in
// MemAvailable, auto leaves them mapped and says so in a warning.
func TestResidentAutoTooBig(t *testing.T) {
	m := residentModel(t)
	defer func(f func() (uint64, uint64, error)) { memInfoFn = f }(memInfoFn)
	need := m.File().ResidentBytes(nil)
	if need > 1<<30 {
		t.Fatalf("the tiny model needs %d bytes", need)
	}
	// 4 GiB total: a 1 GiB margin; half the weights' size left above it.
	memInfoFn = func() (uint64, uint64, error) { return (1 << 30) + need/2, 4 << 30, nil }
	var logs bytes.Buffer
	r, err := m.Resident(ResidentAuto, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if r.Mode != "mmap" || !strings.Contains(logs.String(), "do not fit in available memory") {
		t.Fatalf("report %+v, log %q", r, logs.String())
	}
	if _, err := m.Resident("pin", slog.New(slog.NewTextHandler(io.Discard, nil))); err == nil {
		t.Fatal("--resident pin accepted")
	}
}

func writeFile(path string, data []byte) error { return os.WriteFile(path, data, 0o644) }
