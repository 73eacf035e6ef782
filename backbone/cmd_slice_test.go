package main

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

// TestSliceCommand cuts the embedded tiny model with the command, checks
// the directory against slice.FromGGUF, damages one expert and checks that
// --check and the worker's loader both leave it out.
func TestSliceCommand(t *testing.T) {
	data, err := modelgen.Default()
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

	var warn bytes.Buffer
	ws, err := loadWorkerSlice(dir, []int{2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	ws2, err := loadSliceDir(dir, []int{2}, 1, &warn)
	if err != nil {
		t.Fatal(err)
	}
	defer ws2.Close()
	if !strings.Contains(warn.String(), "layer 2 expert 3") {
		t.Fatalf("no warning for the bad expert: %q", warn.String())
	}
	want := ref.Holdings()[5:] // layer 2
	want = append(want[:3:3], want[4])
	if !reflect.DeepEqual(ws.Holdings, want) {
		t.Fatalf("worker holdings %v, want %v", ws.Holdings, want)
	}
	if id, _ := slice.ModelID(f); ws.ModelID != id {
		t.Fatalf("model id %q, want %q", ws.ModelID, id)
	}
	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	d := m.Params().Embd
	hidden := make([]float32, 2*d)
	for i := range hidden {
		hidden[i] = float32(math.Sin(float64(i)))
	}
	ids := []int32{0, 7, 2, 1}
	got, exp := make([]float32, 4*d), make([]float32, 4*d)
	if err := ws.Computer.ComputeExperts(context.Background(), 2, hidden, ids, 2, 2, got); err != nil {
		t.Fatal(err)
	}
	if err := m.LocalExperts().ComputeExperts(context.Background(), 2, hidden, ids, 2, 2, exp); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(exp[i]) {
			t.Fatalf("output %d: %g, want %g", i, got[i], exp[i])
		}
	}
	if err := ws.Computer.ComputeExperts(context.Background(), 0, hidden[:d], []int32{0}, 1, 1, got[:d]); err == nil {
		t.Fatal("layer 0 served although --layers 2")
	}
	if err := ws.Computer.ComputeExperts(context.Background(), 2, hidden[:d], []int32{3}, 1, 1, got[:d]); err == nil {
		t.Fatal("the damaged expert was served")
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
