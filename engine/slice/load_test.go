package slice

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
)

// TestLoad cuts layers 0 and 2 (experts 0-3 and 7) of the embedded tiny
// model, damages layer 2 expert 3 and loads the directory for layer 2: the
// damaged expert is in Bad and neither held nor served, layer 0 is not
// served, the rest computes the model's own bits. Load of the GGUF file
// serves the same holdings as FromGGUF, and refuses a layer out of range.
// (It was the worker command's part of backbone's TestSliceCommand.)
func TestLoad(t *testing.T) {
	data, err := modelgen.TinyQwen35MoE()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "tiny.gguf")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	f := openGGUF(t, path)
	dir := filepath.Join(t.TempDir(), "slice")
	if _, err := Cut(f, []int{0, 2}, []int{0, 1, 2, 3, 7}, dir); err != nil {
		t.Fatal(err)
	}
	ref, err := FromGGUF(f, []int{0, 2}, []int{0, 1, 2, 3, 7})
	if err != nil {
		t.Fatal(err)
	}
	p := ExpertPath(dir, 2, 3)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0x80
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}

	ws, err := Load(dir, []int{2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	if len(ws.Bad) != 1 || ws.Bad[0].Layer != 2 || ws.Bad[0].Expert != 3 {
		t.Fatalf("bad experts %v, want layer 2 expert 3", ws.Bad)
	}
	want := ref.Holdings()[5:] // layer 2
	want = append(want[:3:3], want[4])
	if !reflect.DeepEqual(ws.Holdings, want) || ws.Layers != 1 {
		t.Fatalf("holdings %v in %d layers, want %v in 1", ws.Holdings, ws.Layers, want)
	}
	if id, _ := ModelID(f); ws.ModelID != id {
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
		t.Fatal("layer 0 served although layers [2]")
	}
	if err := ws.Computer.ComputeExperts(context.Background(), 2, hidden[:d], []int32{3}, 1, 1, got[:d]); err == nil {
		t.Fatal("the damaged expert was served")
	}

	all, err := Load(dir, nil, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Holdings) != 9 || all.Layers != 2 || !(all.Bytes > 0 && all.Bytes < ref.Bytes()) {
		t.Errorf("whole directory: %d holdings in %d layers, %d bytes", len(all.Holdings), all.Layers, all.Bytes)
	}
	all.Close()

	fs, err := Load(path, []int{0, 2}, 1)
	if err != nil {
		t.Fatal(err)
	}
	full, err := FromGGUF(f, []int{0, 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(fs.Holdings, full.Holdings()) || fs.Layers != 2 || len(fs.Bad) != 0 || fs.ModelID != ws.ModelID {
		t.Errorf("GGUF file: %d holdings in %d layers, bad %v, model %q", len(fs.Holdings), fs.Layers, fs.Bad, fs.ModelID)
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(path, []int{99}, 1); err == nil {
		t.Error("layer 99 of the GGUF file loaded")
	}
	if _, err := Load(filepath.Join(dir, "nonexist"), nil, 1); !os.IsNotExist(err) {
		t.Errorf("missing path: %v", err)
	}
}
