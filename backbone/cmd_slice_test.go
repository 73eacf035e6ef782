package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

// TestSliceCommand cuts the embedded tiny model with the command, checks
// the directory against slice.FromGGUF, damages one expert and checks that
// --check reports it (engine/slice's TestLoad checks that the worker's
// loader, slice.Load, leaves it out).
func TestSliceCommand(t *testing.T) {
	data, err := demomodel.Bytes()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "slice")
	var out, errb bytes.Buffer
	if code := sliceMain([]string{"--model", path, "--layers", "0,2", "--experts", "0-3,7", "--out", dir}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ref, err := slice.FromGGUF(f, []int{0, 2}, []int{0, 1, 2, 3, 7})
	if err != nil {
		t.Fatal(err)
	}
	s, err := slice.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Holdings()) != 10 || !reflect.DeepEqual(s.Holdings(), ref.Holdings()) || len(s.Bad()) != 0 {
		t.Fatalf("holdings %v, bad %v", s.Holdings(), s.Bad())
	}
	s.Close()
	out.Reset()
	if code := sliceMain([]string{"--check", dir}, &out, &errb); code != 0 || !strings.Contains(out.String(), "10 experts verified") {
		t.Fatalf("--check: exit %d: %s", code, out.String())
	}

	// Damage layer 2 expert 3.
	p := slice.ExpertPath(dir, 2, 3)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0x80
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out.Reset()
	if code := sliceMain([]string{"--check", dir}, &out, &errb); code != 1 || !strings.Contains(out.String(), "BAD layer 2 expert 3") {
		t.Fatalf("--check after damage: exit %d: %s", code, out.String())
	}

	for _, args := range [][]string{
		{"--model", path, "--out", dir},                      // no layers
		{"--model", path, "--layers", "9", "--out", dir},     // out of range
		{"--model", path, "--layers", "0", "--experts", "x"}, // bad list, no out
		{"--model", path, "--layers", "0", "--check", dir},   // both modes
		{},
	} {
		if code := sliceMain(args, &out, &errb); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

// TestSliceLeftOutBytes: slice --backbone-only reports the bytes of the
// routed experts it leaves out: all of the full file's *_exps tensor bytes
// without hot experts, none when every expert is kept hot, and the rest
// less the kept ones' share otherwise (it reported every expert's bytes
// whatever was kept).
func TestSliceLeftOutBytes(t *testing.T) {
	dir := t.TempDir()
	model := filepath.Join(dir, "m.gguf")
	genTiny(t, model, "--layers", "2")
	var out, errb bytes.Buffer
	f, err := gguf.Open(model)
	if err != nil {
		t.Fatal(err)
	}
	var all int64
	for _, ti := range f.Tensors {
		if strings.Contains(ti.Name, "_exps.") {
			all += int64(ti.Size)
		}
	}
	f.Close()
	experts := int64(2 * 8) // the tiny preset: 8 experts per layer
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{nil, all},
		{[]string{"--hot-layers", "all", "--hot-experts", "all"}, 0},
		{[]string{"--hot-layers", "0", "--hot-experts", "0-3"}, all - 4*all/experts},
	} {
		out.Reset()
		args := append([]string{"--model", model, "--backbone-only", "--out", filepath.Join(dir, "b.gguf")}, tc.args...)
		if code := sliceMain(args, &out, &errb); code != 0 {
			t.Fatalf("%v: exit %d: %s", tc.args, code, errb.String())
		}
		if want := fmt.Sprintf(" %d bytes, left out", tc.want); !strings.Contains(out.String(), want) {
			t.Errorf("%v: %q, want %q", tc.args, out.String(), want)
		}
	}
}

// TestSliceOfBackboneOnly: slicing a backbone-only file says what it is
// and where slices come from, instead of "gguf: no such tensor".
func TestSliceOfBackboneOnly(t *testing.T) {
	dir := t.TempDir()
	bo := filepath.Join(dir, "bo.gguf")
	genTiny(t, bo, "--layers", "1", "--backbone-only")
	var out, errb bytes.Buffer
	if code := sliceMain([]string{"--model", bo, "--layers", "0", "--out", filepath.Join(dir, "s")}, &out, &errb); code == 0 || !strings.Contains(errb.String(), "a backbone-only file") || !strings.Contains(errb.String(), "full model") {
		t.Fatalf("slice of a backbone-only file: exit %d: %s", code, errb.String())
	}
}

// TestSliceUnknownArchitecture: a file whose general.architecture this
// engine does not load is refused by slice (its experts might not be the
// function workers compute), as generate and serve refuse it.
func TestSliceUnknownArchitecture(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "m.gguf")
	genTiny(t, src, "--layers", "1")
	var out, errb bytes.Buffer
	f, err := gguf.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	arch := f.Architecture()
	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		k, v := kv.Key, kv.Value
		if k == "general.architecture" {
			v = gguf.String("llama4xx")
		} else if rest, ok := strings.CutPrefix(k, arch+"."); ok {
			k = "llama4xx." + rest
		}
		w.Set(k, v)
	}
	for _, ti := range f.Tensors {
		tn, err := f.Tensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, tn.Data); err != nil {
			t.Fatal(err)
		}
	}
	foreign := filepath.Join(dir, "foreign.gguf")
	if err := w.WriteFile(foreign); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"--model", foreign, "--layers", "0", "--out", filepath.Join(dir, "s")},
		{"--model", foreign, "--backbone-only", "--out", filepath.Join(dir, "b.gguf")},
	} {
		errb.Reset()
		if code := sliceMain(args, &out, &errb); code != 1 || !strings.Contains(errb.String(), `unsupported architecture: "llama4xx"`) {
			t.Errorf("%v: exit %d: %s", args, code, errb.String())
		}
	}
}
