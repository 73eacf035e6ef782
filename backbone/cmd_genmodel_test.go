package main

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// TestGenmodelBackboneOnly: `genmodel --backbone-only` writes the same file
// as `genmodel` followed by `slice --backbone-only` of the full file: same
// metadata keys and values in the same order, same tensors (names, types,
// dims, offsets, bytes), same bytes overall; for both architectures, the
// fused gate_up layout and an MTP block.
func TestGenmodelBackboneOnly(t *testing.T) {
	dir := t.TempDir()
	for i, args := range [][]string{
		{"--preset", "tiny-qwen35moe", "--layers", "4", "--seed", "3"},
		{"--preset", "tiny-qwen35moe", "--layers", "2", "--seed", "1", "--fused-gate-up", "--nextn", "1"},
		{"--preset", "tiny", "--layers", "2", "--type", "Q4_K_M", "--seed", "2"},
	} {
		full, sliced, direct := filepath.Join(dir, "full.gguf"), filepath.Join(dir, "sliced.gguf"), filepath.Join(dir, "direct.gguf")
		var out, errb bytes.Buffer
		if code := genmodelMain(append(args, "--out", full), &out, &errb); code != 0 {
			t.Fatalf("%v: genmodel: exit %d: %s", args, code, errb.String())
		}
		if code := sliceMain([]string{"--model", full, "--backbone-only", "--out", sliced}, &out, &errb); code != 0 {
			t.Fatalf("%v: slice: exit %d: %s", args, code, errb.String())
		}
		if code := genmodelMain(append(args, "--backbone-only", "--out", direct), &out, &errb); code != 0 {
			t.Fatalf("%v: genmodel --backbone-only: exit %d: %s", args, code, errb.String())
		}
		a, err := os.ReadFile(sliced)
		if err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(direct)
		if err != nil {
			t.Fatal(err)
		}
		fa, err := gguf.Parse(a)
		if err != nil {
			t.Fatal(err)
		}
		fb, err := gguf.Parse(b)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(fa.KVs, fb.KVs) {
			t.Errorf("case %d %v: metadata differs", i, args)
		}
		if !reflect.DeepEqual(fa.Tensors, fb.Tensors) {
			t.Errorf("case %d %v: tensor infos differ", i, args)
		}
		for _, ti := range fa.Tensors {
			x, _ := fa.Tensor(ti.Name)
			y, err := fb.Tensor(ti.Name)
			if err != nil || !bytes.Equal(x.Data, y.Data) {
				t.Errorf("case %d %v: tensor %s differs (%v)", i, args, ti.Name, err)
			}
		}
		if !bytes.Equal(a, b) {
			t.Errorf("case %d %v: the files differ (%d and %d bytes)", i, args, len(a), len(b))
		}
		if st, err := os.Stat(full); err != nil || len(b) >= int(st.Size()) {
			t.Errorf("case %d: backbone-only file of %d bytes, full file %v (%v)", i, len(b), st, err)
		}
	}
}

// TestOutNotAFile: genmodel and slice --backbone-only refuse an --out that
// is a FIFO, a symbolic link or a folder (exit 2, the path and what it is
// named) before any work, and leave it as it was. They wrote a temporary
// file and renamed it over the path: `--out /dev/null` as root replaced the
// device with a 3.6 GB model file.
func TestOutNotAFile(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	genTiny(t, model, "--layers", "1")
	var out, errb bytes.Buffer
	fifo, link, folder := filepath.Join(dir, "fifo"), filepath.Join(dir, "link"), filepath.Join(dir, "folder")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(model, link); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(folder, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		path, want string
		mode       os.FileMode
	}{{fifo, "not a regular file", os.ModeNamedPipe}, {link, "symbolic link", os.ModeSymlink}, {folder, "is a folder", os.ModeDir}} {
		for _, run := range []struct {
			name string
			main func([]string, io.Writer, io.Writer) int
			args []string
		}{
			{"genmodel", genmodelMain, []string{"--preset", "tiny", "--layers", "1"}},
			{"slice", sliceMain, []string{"--model", model, "--backbone-only"}},
		} {
			errb.Reset()
			if code := run.main(append(run.args, "--out", tc.path), &out, &errb); code != 2 || !strings.Contains(errb.String(), tc.path) || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("%s --out %s: exit %d: %s", run.name, tc.path, code, errb.String())
			}
			st, err := os.Lstat(tc.path)
			if err != nil || st.Mode().Type() != tc.mode {
				t.Fatalf("%s --out %s: now %v, %v", run.name, tc.path, st.Mode(), err)
			}
		}
	}
	if b, err := os.ReadFile(model); err != nil || len(b) == 0 {
		t.Fatalf("the linked model: %d bytes, %v", len(b), err)
	}
}

// genTiny writes the tiny preset's model to path with genmodel and args
// (--layers N, --backbone-only, ...), failing the test if it cannot.
func genTiny(t *testing.T, path string, args ...string) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := genmodelMain(append([]string{"--preset", "tiny", "--out", path}, args...), &out, &errb); code != 0 {
		t.Fatalf("genmodel %v: exit %d: %s", args, code, errb.String())
	}
}
