package slice

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/moeshape"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// fixtureModel returns the path of a fixture model in $KVASIR_FIXTURES or
// ../shared/fixtures beside the repository root, or "" when it is absent.
func fixtureModel(name string) string {
	dir := os.Getenv("KVASIR_FIXTURES")
	if dir == "" {
		dir = filepath.Join("..", "..", "..", "shared", "fixtures")
	}
	p := filepath.Join(dir, name)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// openGGUF memory-maps path and closes it at the end of the test.
func openGGUF(t testing.TB, path string) *gguf.File {
	t.Helper()
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// generated caches modelgen.Build output per spec (generation takes
// seconds on a loaded machine).
var generated sync.Map // fmt.Sprint(spec) -> []byte

// genGGUF writes the model of spec s to a temporary file and maps it.
func genGGUF(t testing.TB, s modelgen.Spec) *gguf.File {
	t.Helper()
	key := fmt.Sprint(s)
	data, ok := generated.Load(key)
	if !ok {
		w, err := modelgen.Build(s)
		if err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if _, err := w.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		data, _ = generated.LoadOrStore(key, b.Bytes())
	}
	path := filepath.Join(t.TempDir(), "model.gguf")
	if err := os.WriteFile(path, data.([]byte), 0o644); err != nil {
		t.Fatal(err)
	}
	return openGGUF(t, path)
}

// withKV returns a copy of f (parsed from memory) with metadata key set to v.
func withKV(t testing.TB, f *gguf.File, key string, v gguf.Value) *gguf.File {
	t.Helper()
	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		w.Set(kv.Key, kv.Value)
	}
	w.Set(key, v)
	for _, ti := range f.Tensors {
		tt, err := f.Tensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, tt.Data); err != nil {
			t.Fatal(err)
		}
	}
	var b bytes.Buffer
	if _, err := w.WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	g, err := gguf.Parse(b.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// tinySpec is modelgen's tiny preset with the Q4_K_M-like mix (Q6_K
// ffn_down_exps in layers 2 and 3), so layers differ in tensor types.
func tinySpec(t testing.TB) modelgen.Spec {
	s, err := modelgen.Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	s.Type, s.Mix = quant.Q4_K, true
	return s
}

// sourceModels returns the models the tests cut from: the fixture Q4_K_M
// model (when present) and a generated one.
func sourceModels(t *testing.T) map[string]*gguf.File {
	t.Helper()
	fs := map[string]*gguf.File{"modelgen-tiny-mix": genGGUF(t, tinySpec(t))}
	if p := fixtureModel("tiny-qwen3moe-Q4_K_M.gguf"); p != "" {
		fs["fixture-Q4_K_M"] = openGGUF(t, p)
	} else {
		t.Log("fixture model absent (set KVASIR_FIXTURES): testing the generated model only")
	}
	return fs
}

// randRows returns n x d float32 drawn from N(0, 1).
func randRows(r *rand.Rand, n, d int) []float32 {
	x := make([]float32, n*d)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// randIDs returns n x k expert ids, each row k distinct draws from held.
func randIDs(r *rand.Rand, held []int, n, k int) []int32 {
	ids := make([]int32, 0, n*k)
	for range n {
		p := r.Perm(len(held))
		for s := range k {
			ids = append(ids, int32(held[p[s]]))
		}
	}
	return ids
}

// sameBits fails unless a and b are equal bit for bit.
func sameBits(t *testing.T, what string, a, b []float32) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d vs %d values", what, len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("%s: value %d differs: %g vs %g", what, i, a[i], b[i])
		}
	}
}

// TestCutOpenBitIdentical cuts layers and a subset of experts from each
// source model, opens the slice and checks that its Computer returns the
// same bits as the full model's local experts for random rows routed to
// every held expert; that hashes match an independent SHA-256 of gate || up || down (refHash)
// over the GGUF and sha256 of the files; and that files hold exactly the
// GGUF's bytes.
func TestCutOpenBitIdentical(t *testing.T) {
	for name, f := range sourceModels(t) {
		t.Run(name, func(t *testing.T) {
			m, err := model.Load(f)
			if err != nil {
				t.Fatal(err)
			}
			full := m.LocalExperts()
			p := m.Params()
			layers := []int{1, p.Layers - 1} // a Q4_K and (both models) a Q6_K ffn_down layer
			experts, err := ParseList("0-3,5,7", p.Experts)
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join(t.TempDir(), "slice")
			man, err := Cut(f, layers, experts, dir)
			if err != nil {
				t.Fatal(err)
			}
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if len(s.Bad()) != 0 {
				t.Fatalf("bad experts in a fresh cut: %v", s.Bad())
			}
			if !reflect.DeepEqual(s.Manifest(), man) {
				t.Fatalf("Open's manifest differs from Cut's")
			}
			if got, want := len(s.Holdings()), len(layers)*len(experts); got != want {
				t.Fatalf("%d holdings, want %d", got, want)
			}
			if s.ModelID() == "" || s.ModelID() != man.ModelID {
				t.Fatalf("model id %q / %q", s.ModelID(), man.ModelID)
			}
			if down := man.Layers[1].DownType; down != "Q6_K" {
				t.Fatalf("layer %d down type %s, want Q6_K (the mix)", layers[1], down)
			}

			// Hashes: the independent implementation over the GGUF views,
			// the file's sha256, the manifest, and the bytes themselves.
			var total int64
			for i, h := range s.Holdings() {
				l, e := int(h.Layer), int(h.Expert)
				if wantL, wantE := layers[i/len(experts)], experts[i%len(experts)]; l != wantL || e != wantE {
					t.Fatalf("holding %d is (%d, %d), want (%d, %d)", i, l, e, wantL, wantE)
				}
				ref, ok := refHash(full.Layer(l), e)
				if !ok || h.SHA256 != ref {
					t.Fatalf("(%d, %d): hash %x, refHash %x", l, e, h.SHA256, ref)
				}
				if got, _ := HashExpert(s.Layers()[l], e); got != ref {
					t.Fatalf("(%d, %d): HashExpert over the slice %x, want %x", l, e, got, ref)
				}
				data, err := os.ReadFile(ExpertPath(dir, l, e))
				if err != nil {
					t.Fatal(err)
				}
				if sha256.Sum256(data) != ref {
					t.Fatalf("(%d, %d): file sha256 differs", l, e)
				}
				fl := full.Layer(l)
				want := bytes.Join([][]byte{fl.Gate.Expert[e], fl.Up.Expert[e], fl.Down.Expert[e]}, nil)
				if !bytes.Equal(data, want) {
					t.Fatalf("(%d, %d): file bytes are not gate||up||down from the GGUF", l, e)
				}
				_, ee := man.find(l, e)
				if ee == nil || ee.SHA256 != hex.EncodeToString(ref[:]) || ee.Bytes != int64(len(data)) {
					t.Fatalf("(%d, %d): manifest entry %+v", l, e, ee)
				}
				total += int64(len(data))
			}
			if s.Bytes() != total || man.Bytes() != total {
				t.Fatalf("Bytes %d, manifest %d, files %d", s.Bytes(), man.Bytes(), total)
			}

			// FromGGUF gives the same holdings and manifest without a directory.
			g, err := FromGGUF(f, layers, experts)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(g.Holdings(), s.Holdings()) || !reflect.DeepEqual(g.Manifest(), man) {
				t.Fatal("FromGGUF differs from the opened slice")
			}

			comp, err := s.Computer(2)
			if err != nil {
				t.Fatal(err)
			}
			r := rand.New(rand.NewPCG(7, uint64(len(name))))
			k := p.ExpertsUsed
			for _, l := range layers {
				for _, n := range []int{1, 5, 33} {
					hidden := randRows(r, n, p.Embd)
					ids := randIDs(r, experts, n, k)
					want := make([]float32, n*k*p.Embd)
					got := make([]float32, n*k*p.Embd)
					if err := full.ComputeExperts(context.Background(), l, hidden, ids, n, k, want); err != nil {
						t.Fatal(err)
					}
					if err := comp.ComputeExperts(context.Background(), l, hidden, ids, n, k, got); err != nil {
						t.Fatal(err)
					}
					sameBits(t, name, got, want)
				}
				// Every held expert at least once in one call.
				n := len(experts)
				ids := make([]int32, n*1)
				for i, e := range experts {
					ids[i] = int32(e)
				}
				hidden := randRows(r, n, p.Embd)
				want := make([]float32, n*p.Embd)
				got := make([]float32, n*p.Embd)
				if err := full.ComputeExperts(context.Background(), l, hidden, ids, n, 1, want); err != nil {
					t.Fatal(err)
				}
				if err := comp.ComputeExperts(context.Background(), l, hidden, ids, n, 1, got); err != nil {
					t.Fatal(err)
				}
				sameBits(t, name+" all experts", got, want)
			}
			// Not held: expert 4 and layer 0.
			out := make([]float32, p.Embd)
			if err := comp.ComputeExperts(context.Background(), layers[0], randRows(r, 1, p.Embd), []int32{4}, 1, 1, out); !errors.Is(err, expert.ErrUnknownExpert) {
				t.Fatalf("expert 4 not held: %v", err)
			}
			if err := comp.ComputeExperts(context.Background(), 0, randRows(r, 1, p.Embd), []int32{0}, 1, 1, out); !errors.Is(err, expert.ErrUnknownLayer) {
				t.Fatalf("layer 0 not held: %v", err)
			}
		})
	}
}

// find returns the entry of (layer, expert), or nils.
func (m *Manifest) find(layer, e int) (*LayerEntry, *ExpertEntry) {
	for i := range m.Layers {
		if l := &m.Layers[i]; l.Layer == layer {
			for j := range l.Experts {
				if l.Experts[j].Expert == e {
					return l, &l.Experts[j]
				}
			}
			return l, nil
		}
	}
	return nil, nil
}

// TestCutWholeModelBytes cuts every expert of the fixture model (or the
// generated one) and checks the slice's size against the GGUF's tensor
// infos: the sum of the ffn_{gate,up,down}_exps tensors' sizes.
func TestCutWholeModelBytes(t *testing.T) {
	for name, f := range sourceModels(t) {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			man, err := Cut(f, nil, nil, dir)
			if err != nil {
				t.Fatal(err)
			}
			var want int64
			for _, ti := range f.Tensors {
				if strings.Contains(ti.Name, "_exps.") {
					want += int64(ti.Size)
				}
			}
			s, err := Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			sh, _ := moeshape.Read(f)
			nl, ne := sh.Layers, sh.Experts
			if s.Bytes() != want || man.Bytes() != want || len(s.Holdings()) != int(nl*ne) {
				t.Fatalf("slice %d bytes, manifest %d, holdings %d; GGUF expert tensors %d bytes, %d experts",
					s.Bytes(), man.Bytes(), len(s.Holdings()), want, nl*ne)
			}
			// No temporary files left behind.
			err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
				if err == nil && strings.Contains(d.Name(), ".tmp") {
					t.Errorf("temporary file left: %s", path)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestBadExperts damages expert files in each way and checks that Open
// reports exactly those, does not hold or serve them, and still serves the
// rest with the full model's bits.
func TestBadExperts(t *testing.T) {
	f := genGGUF(t, tinySpec(t))
	dir := t.TempDir()
	if _, err := Cut(f, []int{0, 1, 2}, nil, dir); err != nil {
		t.Fatal(err)
	}
	flip := func(l, e int, off func(n int) int) {
		path := ExpertPath(dir, l, e)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b[off(len(b))] ^= 0x01
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	flip(1, 3, func(n int) int { return n / 2 })                     // a bit in the middle (up)
	flip(0, 0, func(n int) int { return n - 1 })                     // the last byte (down)
	if err := os.Truncate(ExpertPath(dir, 0, 5), 4096); err != nil { // truncated
		t.Fatal(err)
	}
	fh, err := os.OpenFile(ExpertPath(dir, 1, 6), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fh.Write([]byte{0}); err != nil { // one byte too long
		t.Fatal(err)
	}
	fh.Close()
	if err := os.Remove(ExpertPath(dir, 1, 7)); err != nil { // missing
		t.Fatal(err)
	}
	if err := os.Remove(ExpertPath(dir, 2, 2)); err != nil { // a folder in its place
		t.Fatal(err)
	}
	if err := os.Mkdir(ExpertPath(dir, 2, 2), 0o755); err != nil {
		t.Fatal(err)
	}

	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := []struct {
		l, e int
		err  error
	}{{0, 0, ErrCorrupt}, {0, 5, ErrSize}, {1, 3, ErrCorrupt}, {1, 6, ErrSize}, {1, 7, ErrMissing}, {2, 2, ErrMissing}}
	bad := s.Bad()
	if len(bad) != len(want) {
		t.Fatalf("bad = %v, want %d entries", bad, len(want))
	}
	for i, w := range want {
		b := bad[i]
		if b.Layer != w.l || b.Expert != w.e || !errors.Is(b.Err, w.err) || b.File != ExpertPath(dir, w.l, w.e) {
			t.Errorf("bad[%d] = %+v, want (%d, %d) %v", i, b, w.l, w.e, w.err)
		}
		if s.Layers()[w.l].Held(w.e) {
			t.Errorf("(%d, %d) is held", w.l, w.e)
		}
	}
	if got, wantN := len(s.Holdings()), 3*8-len(want); got != wantN {
		t.Fatalf("%d holdings, want %d", got, wantN)
	}
	for _, h := range s.Holdings() {
		for _, w := range want {
			if int(h.Layer) == w.l && int(h.Expert) == w.e {
				t.Fatalf("bad expert (%d, %d) announced", w.l, w.e)
			}
		}
	}
	var held int64
	for _, h := range s.Holdings() {
		le, _ := s.Manifest().find(int(h.Layer), int(h.Expert))
		held += le.ExpertBytes
	}
	if s.Bytes() != held || s.Bytes() >= s.Manifest().Bytes() {
		t.Fatalf("Bytes %d, held experts %d, manifest %d", s.Bytes(), held, s.Manifest().Bytes())
	}

	m, err := model.Load(f)
	if err != nil {
		t.Fatal(err)
	}
	comp, err := s.Computer(1)
	if err != nil {
		t.Fatal(err)
	}
	d := m.Params().Embd
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]float32, d)
	if err := comp.ComputeExperts(context.Background(), 1, randRows(r, 1, d), []int32{3}, 1, 1, out); !errors.Is(err, expert.ErrUnknownExpert) {
		t.Fatalf("corrupt expert served: %v", err)
	}
	good := []int{0, 1, 2, 4, 5}
	hidden := randRows(r, 9, d)
	ids := randIDs(r, good, 9, 2)
	a, b := make([]float32, 9*2*d), make([]float32, 9*2*d)
	if err := comp.ComputeExperts(context.Background(), 1, hidden, ids, 9, 2, a); err != nil {
		t.Fatal(err)
	}
	if err := m.LocalExperts().ComputeExperts(context.Background(), 1, hidden, ids, 9, 2, b); err != nil {
		t.Fatal(err)
	}
	sameBits(t, "intact experts beside bad ones", a, b)

	// Every expert of a layer bad: the layer is not held at all.
	for e := range 8 {
		if err := os.Truncate(ExpertPath(dir, 2, e), 0); err != nil && e != 2 {
			t.Fatal(err)
		}
	}
	s2, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if s2.Layers()[2] != nil || len(s2.Bad()) != 5+8 {
		t.Fatalf("layer 2 all bad: layer %v, %d bad", s2.Layers()[2] != nil, len(s2.Bad()))
	}
}

// TestCutDirRules checks where Cut may write and that a failed cut leaves
// no manifest.
func TestCutDirRules(t *testing.T) {
	f := genGGUF(t, tinySpec(t))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Cut(f, []int{0}, nil, dir); !errors.Is(err, ErrDir) {
		t.Fatalf("non-empty folder: %v", err)
	}

	dir = filepath.Join(t.TempDir(), "a", "b") // created
	if _, err := Cut(f, []int{0}, []int{1}, dir); err != nil {
		t.Fatal(err)
	}
	// Re-cutting into a slice folder replaces its manifest.
	man, err := Cut(f, []int{3}, []int{0, 2}, dir)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ReadManifest(dir)
	if err != nil || !reflect.DeepEqual(got, man) || man.Count() != 2 || man.Layers[0].Layer != 3 {
		t.Fatalf("re-cut manifest %v, %v", got, err)
	}
	// ... and removes the first cut's expert files and emptied layer
	// folders (they were left behind, unlisted), not a file of its own
	// or the new cut's.
	if err := os.WriteFile(filepath.Join(dir, "L003", "notes.txt"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Cut(f, []int{3}, []int{2}, dir); err != nil {
		t.Fatal(err)
	}
	var files []string
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	})
	if want := []string{"L003/E0002.bin", "L003/notes.txt", ManifestName}; !reflect.DeepEqual(files, want) {
		t.Fatalf("after re-cuts: %v, want %v", files, want)
	}

	// An expert that cannot be written: the cut fails and no manifest is left.
	if err := os.MkdirAll(filepath.Join(ExpertPath(dir, 2, 1), "blocker"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Cut(f, []int{2}, nil, dir); err == nil {
		t.Fatal("cut over a blocked expert path succeeded")
	}
	if _, err := os.Stat(filepath.Join(dir, ManifestName)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("manifest after a failed cut: %v", err)
	}
	ents, _ := os.ReadDir(filepath.Join(dir, "L002"))
	for _, e := range ents {
		if strings.Contains(e.Name(), ".tmp") {
			t.Errorf("temporary file left: %s", e.Name())
		}
	}
	if _, err := Open(dir); !errors.Is(err, ErrManifest) || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Open without a manifest: %v", err)
	}

	for _, c := range []struct {
		name            string
		layers, experts []int
	}{{"layer range", []int{4}, nil}, {"negative layer", []int{-1}, nil}, {"repeated layer", []int{1, 1}, nil},
		{"expert range", []int{0}, []int{8}}, {"repeated expert", []int{0}, []int{2, 2}}, {"no layers", []int{}, nil},
		{"no experts", []int{0}, []int{}}} {
		if _, err := FromGGUF(f, c.layers, c.experts); !errors.Is(err, ErrSelection) {
			t.Errorf("%s: %v", c.name, err)
		}
	}
}

// TestModelID checks what the model id distinguishes and its bounds.
func TestModelID(t *testing.T) {
	s := tinySpec(t)
	id1, sum1 := ModelID(genGGUF(t, s))
	id2, sum2 := ModelID(genGGUF(t, s))
	if id1 != id2 || sum1 != sum2 {
		t.Fatalf("same model, ids %q %q", id1, id2)
	}
	if want := s.Name + "@" + hex.EncodeToString(sum1[:8]); id1 != want {
		t.Fatalf("id %q, want %q", id1, want)
	}
	f := genGGUF(t, s)
	if id, _ := ModelID(withKV(t, f, "general.name", gguf.String(s.Name))); id != id1 {
		t.Fatalf("rewritten copy: id %q, want %q", id, id1)
	}
	if id, _ := ModelID(withKV(t, f, "qwen3moe.attention.layer_norm_rms_epsilon", gguf.Float32(1e-5))); id == id1 {
		t.Fatalf("another hyperparameter, same id %q", id)
	}
	// The same spec without the mix: only tensor types differ.
	plain := s
	plain.Mix = false
	if id, _ := ModelID(genGGUF(t, plain)); id == id1 || !strings.HasPrefix(id, s.Name+"@") {
		t.Fatalf("other tensor types: id %q (mix: %q)", id, id1)
	}
	id, _ := ModelID(withKV(t, f, "general.name", gguf.String(strings.Repeat("é", 200)))) // 400 bytes
	if len(id) > 256 || !utf8.ValidString(id) || !strings.HasPrefix(id, "éé") {
		t.Fatalf("long name: id of %d bytes %q", len(id), id)
	}
	if pa, pb := fixtureModel("tiny-qwen3moe-Q4_K_M.gguf"), fixtureModel("tiny-qwen3moe-Q8_0.gguf"); pa != "" && pb != "" {
		a, _ := ModelID(openGGUF(t, pa))
		b, _ := ModelID(openGGUF(t, pb))
		if a == b || !strings.HasPrefix(a, "tiny-qwen3moe-A@") || !strings.HasPrefix(b, "tiny-qwen3moe-A@") {
			t.Fatalf("fixture ids %q, %q", a, b)
		}
	}
}

func TestParseList(t *testing.T) {
	for _, c := range []struct {
		in   string
		n    int
		want []int
		ok   bool
	}{
		{"0-7,12", 16, []int{0, 1, 2, 3, 4, 5, 6, 7, 12}, true},
		{" 3 , 1-2 ,2", 4, []int{1, 2, 3}, true},
		{"5", 6, []int{5}, true},
		{"all", 6, nil, true},
		{"6", 6, nil, false},
		{"2-1", 6, nil, false},
		{"", 6, nil, false},
		{"1,", 6, nil, false},
		{"-1", 6, nil, false},
		{"+1", 6, nil, false},
		{"1-2-3", 6, nil, false},
		{"x", 6, nil, false},
		{"0", 0, nil, false},
		{"99999999999999999999", 6, nil, false},
	} {
		got, err := ParseList(c.in, c.n)
		if (err == nil) != c.ok || !reflect.DeepEqual(got, c.want) {
			t.Errorf("ParseList(%q, %d) = %v, %v; want %v ok=%v", c.in, c.n, got, err, c.want, c.ok)
		}
		if err != nil && !errors.Is(err, ErrSelection) {
			t.Errorf("ParseList(%q): %v does not wrap ErrSelection", c.in, err)
		}
	}
}

// TestDownloadFlow builds a slice the way a downloader would (issue 6): one
// expert at a time with WriteExpert, then WriteManifest listing only what was
// written; a manifest that does not validate is not written.
func TestDownloadFlow(t *testing.T) {
	f := genGGUF(t, tinySpec(t))
	src, err := FromGGUF(f, []int{3}, []int{1, 4, 6})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	m := *src.Manifest()
	m.Layers = []LayerEntry{m.Layers[0]}
	m.Layers[0].Experts = nil
	if err := WriteManifest(dir, &m); err != nil { // an empty slice of layer 3
		t.Fatal(err)
	}
	l := src.Layers()[3]
	for _, ee := range src.Manifest().Layers[0].Experts[:2] {
		e := ee.Expert
		if err := WriteExpert(dir, 3, e, l.Gate.Expert[e], l.Up.Expert[e], l.Down.Expert[e]); err != nil {
			t.Fatal(err)
		}
		if err := SyncLayerDir(dir, 3); err != nil {
			t.Fatal(err)
		}
		m.Layers[0].Experts = append(m.Layers[0].Experts, ee)
		if err := WriteManifest(dir, &m); err != nil {
			t.Fatal(err)
		}
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !reflect.DeepEqual(s.Holdings(), src.Holdings()[:2]) || len(s.Bad()) != 0 || s.Dir() != dir {
		t.Fatalf("holdings %v, want %v; bad %v", s.Holdings(), src.Holdings()[:2], s.Bad())
	}
	bad := m
	bad.Version = 2
	if err := WriteManifest(dir, &bad); !errors.Is(err, ErrManifest) {
		t.Fatalf("invalid manifest written: %v", err)
	}
	if got, err := ReadManifest(dir); err != nil || got.Count() != 2 {
		t.Fatalf("manifest after a refused write: %v, %v", got, err)
	}
}

// refHash is SHA-256 over expert e's gate, up and down bytes fed one after
// the other (the definition in docs/slices.md), computed independently of
// HashExpert. The engine/worker package cannot be used here: it imports
// this package.
func refHash(l *expert.Layer, e int) ([32]byte, bool) {
	if l == nil || e < 0 || e >= l.NExpert || l.Gate.Expert[e] == nil {
		return [32]byte{}, false
	}
	var all []byte
	all = append(all, l.Gate.Expert[e]...)
	all = append(all, l.Up.Expert[e]...)
	all = append(all, l.Down.Expert[e]...)
	return sha256.Sum256(all), true
}
