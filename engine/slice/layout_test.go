package slice

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/moeshape"
)

// rewriteGGUF returns a copy of f (parsed from memory) with general.architecture
// set to arch and every "<old arch>." key renamed to "<arch>."; with fuse,
// each layer's ffn_gate_exps and ffn_up_exps (ne [d, dff, n]) are replaced by
// one ffn_gate_up_exps (ne [d, 2*dff, n]) holding, per expert, its gate rows
// then its up rows: llama.cpp's fused layout of the same weights.
func rewriteGGUF(t testing.TB, f *gguf.File, arch string, fuse bool) *gguf.File {
	t.Helper()
	old := f.Architecture()
	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		key := kv.Key
		if rest, ok := strings.CutPrefix(key, old+"."); ok {
			key = arch + "." + rest
		}
		w.Set(key, kv.Value)
	}
	w.Set("general.architecture", gguf.String(arch))
	fused := 0
	for _, ti := range f.Tensors {
		tt, err := f.Tensor(ti.Name)
		if err != nil {
			t.Fatal(err)
		}
		name, dims, data := ti.Name, ti.Dims, tt.Data
		if fuse && strings.HasSuffix(name, ".ffn_up_exps.weight") {
			continue
		}
		if fuse && strings.HasSuffix(name, ".ffn_gate_exps.weight") {
			up, err := f.Tensor(strings.Replace(name, ".ffn_gate_exps.", ".ffn_up_exps.", 1))
			if err != nil {
				t.Fatal(err)
			}
			if up.Type != ti.Type || !slices.Equal(up.Dims, ti.Dims) {
				t.Fatalf("%s: up %v %v, gate %v %v", name, up.Type, up.Dims, ti.Type, ti.Dims)
			}
			rb, _ := ti.Type.RowBytes(int(dims[0]))
			per := rb * int(dims[1])
			data = make([]byte, 0, 2*len(tt.Data))
			for e := range int(dims[2]) {
				data = append(data, tt.Data[e*per:(e+1)*per]...)
				data = append(data, up.Data[e*per:(e+1)*per]...)
			}
			name = strings.Replace(name, ".ffn_gate_exps.", ".ffn_gate_up_exps.", 1)
			dims = []uint64{dims[0], 2 * dims[1], dims[2]}
			fused++
		}
		if err := w.AddTensor(name, ti.Type, dims, data); err != nil {
			t.Fatal(err)
		}
	}
	if fuse && fused == 0 {
		t.Fatal("rewriteGGUF: nothing to fuse")
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

// layoutPairs returns pairs of GGUFs holding the same weights, separate
// (ffn_gate_exps + ffn_up_exps) and fused (ffn_gate_up_exps), all of
// architecture qwen35moe: the generated tiny model (Q4_K with Q6_K down in
// layers 2-3) renamed, and the qwen35moe fixtures when present.
func layoutPairs(t *testing.T) map[string][2]*gguf.File {
	t.Helper()
	gen := genGGUF(t, tinySpec(t))
	pairs := map[string][2]*gguf.File{
		"modelgen-tiny-mix-as-qwen35moe": {rewriteGGUF(t, gen, "qwen35moe", false), rewriteGGUF(t, gen, "qwen35moe", true)},
	}
	for _, q := range []string{"F16", "Q4_K_M"} {
		p := fixtureModel(filepath.Join("qwen35moe", "tiny-qwen35moe-"+q+".gguf"))
		if p == "" {
			t.Logf("qwen35moe fixture %s absent (set KVASIR_FIXTURES): not tested", q)
			continue
		}
		f := openGGUF(t, p)
		pairs["fixture-qwen35moe-"+q] = [2]*gguf.File{f, rewriteGGUF(t, f, "qwen35moe", true)}
	}
	return pairs
}

// TestFusedLayoutSliceIdentical: slices cut from a separate-layout file and
// from the same weights written fused hold byte-identical expert files, the
// same manifest layers (types, sizes, SHA-256s), the same holdings and
// catalog sums, and compute the same bits, equal to expert.Local over the
// separate file. Only the model id differs, since model_sha256 covers
// tensor names and shapes.
func TestFusedLayoutSliceIdentical(t *testing.T) {
	for name, pair := range layoutPairs(t) {
		t.Run(name, func(t *testing.T) {
			sep := pair[0]
			sh, err := moeshape.Read(sep)
			if err != nil || sh.Experts == 0 {
				t.Fatal(sh, err)
			}
			nl, ne := sh.Layers, sh.Experts
			layers := []int{0, int(nl) - 1}
			experts, err := ParseList(fmt.Sprintf("0-2,%d", ne-1), int(ne))
			if err != nil {
				t.Fatal(err)
			}
			var mans [2]*Manifest
			var ss [2]*Slice
			var dirs [2]string
			for i, f := range pair {
				dirs[i] = filepath.Join(t.TempDir(), "slice")
				if mans[i], err = Cut(f, layers, experts, dirs[i]); err != nil {
					t.Fatalf("cut %d: %v", i, err)
				}
				if ss[i], err = Open(dirs[i]); err != nil {
					t.Fatalf("open %d: %v", i, err)
				}
				defer ss[i].Close()
				if len(ss[i].Bad()) != 0 {
					t.Fatalf("open %d: bad experts %v", i, ss[i].Bad())
				}
				if m := mans[i]; m.Architecture != "qwen35moe" || m.NLayer != int(nl) || m.NExpert != int(ne) {
					t.Fatalf("manifest %d: %s, %d layers, %d experts", i, m.Architecture, m.NLayer, m.NExpert)
				}
			}
			if !reflect.DeepEqual(mans[0].Layers, mans[1].Layers) {
				t.Fatalf("manifest layers differ:\n%+v\n%+v", mans[0].Layers, mans[1].Layers)
			}
			if mans[0].ModelID == mans[1].ModelID {
				t.Errorf("model ids equal (%s) though tensor names differ", mans[0].ModelID)
			}
			if !reflect.DeepEqual(ss[0].Holdings(), ss[1].Holdings()) {
				t.Fatal("holdings (hashes) differ")
			}
			ref := make([]*expert.Layer, nl)
			for _, l := range layers {
				if ref[l], err = expert.FromGGUF(sep, l); err != nil {
					t.Fatal(err)
				}
				for _, e := range experts {
					a, err := os.ReadFile(ExpertPath(dirs[0], l, e))
					if err != nil {
						t.Fatal(err)
					}
					b, err := os.ReadFile(ExpertPath(dirs[1], l, e))
					if err != nil {
						t.Fatal(err)
					}
					want := bytes.Join([][]byte{ref[l].Gate.Expert[e], ref[l].Up.Expert[e], ref[l].Down.Expert[e]}, nil)
					if !bytes.Equal(a, want) || !bytes.Equal(b, want) {
						t.Fatalf("(%d, %d): expert files differ (separate %v, fused %v from gate||up||down)", l, e,
							bytes.Equal(a, want), bytes.Equal(b, want))
					}
				}
			}

			// Bits: both slices and the separate file's own layers.
			full, err := expert.NewLocal(ref, 2)
			if err != nil {
				t.Fatal(err)
			}
			var comps [2]*expert.Local
			for i := range ss {
				if comps[i], err = ss[i].Computer(2); err != nil {
					t.Fatal(err)
				}
			}
			d := mans[0].DModel
			const n, k = 16, 2
			rng := rand.New(rand.NewPCG(31, 7))
			for _, l := range layers {
				x, ids := randRows(rng, n, d), randIDs(rng, experts, n, k)
				want := make([]float32, n*k*d)
				if err := full.ComputeExperts(context.Background(), l, x, ids, n, k, want); err != nil {
					t.Fatal(err)
				}
				for i, c := range comps {
					got := make([]float32, n*k*d)
					if err := c.ComputeExperts(context.Background(), l, x, ids, n, k, got); err != nil {
						t.Fatal(err)
					}
					sameBits(t, fmt.Sprintf("layer %d, slice %d vs GGUF", l, i), got, want)
				}
			}

			// The backbone's catalog of either file serves the same bytes.
			var cats [2]*Catalog
			for i, f := range pair {
				if cats[i], err = NewCatalog(f); err != nil {
					t.Fatalf("catalog %d: %v", i, err)
				}
			}
			if !reflect.DeepEqual(cats[0].Header().Layers, cats[1].Header().Layers) {
				t.Fatal("catalog headers differ")
			}
			for _, l := range layers {
				for _, e := range experts {
					h0, ok0 := cats[0].Hash(l, e)
					h1, ok1 := cats[1].Hash(l, e)
					s0, _ := cats[0].Sums(l, e, 4096)
					s1, _ := cats[1].Sums(l, e, 4096)
					if !ok0 || !ok1 || h0 != h1 || !reflect.DeepEqual(s0, s1) || s0.SHA256 != h0 {
						t.Fatalf("(%d, %d): catalog hashes or sums differ", l, e)
					}
				}
			}
		})
	}
}

// TestQwen35moeFixtureSlice cuts every layer of the qwen35moe F16 fixture
// (4 layers of 16 experts, d_model 256, d_ff 128) for some experts, reopens
// the slice and checks its shapes, hashes and bits against the GGUF.
func TestQwen35moeFixtureSlice(t *testing.T) {
	p := fixtureModel(filepath.Join("qwen35moe", "tiny-qwen35moe-F16.gguf"))
	if p == "" {
		t.Skip("qwen35moe fixture absent (../shared/fixtures/qwen35moe or $KVASIR_FIXTURES): skipped")
	}
	f := openGGUF(t, p)
	experts := []int{0, 5, 15}
	dir := filepath.Join(t.TempDir(), "slice")
	man, err := Cut(f, nil, experts, dir)
	if err != nil {
		t.Fatal(err)
	}
	if man.Architecture != "qwen35moe" || man.NLayer != 4 || man.NExpert != 16 || man.DModel != 256 || man.DFF != 128 {
		t.Fatalf("manifest: %s, %d layers, %d experts, d %d, ff %d", man.Architecture, man.NLayer, man.NExpert, man.DModel, man.DFF)
	}
	for _, le := range man.Layers {
		if le.GateType != "F16" || le.UpType != "F16" || le.DownType != "F16" || le.ExpertBytes != 3*256*128*2 {
			t.Fatalf("layer %d: %s %s %s, %d bytes", le.Layer, le.GateType, le.UpType, le.DownType, le.ExpertBytes)
		}
	}
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if len(s.Bad()) != 0 || len(s.Holdings()) != 4*len(experts) || !reflect.DeepEqual(s.Manifest(), man) {
		t.Fatalf("reopened: %d bad, %d holdings", len(s.Bad()), len(s.Holdings()))
	}
	g, err := FromGGUF(f, nil, experts)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(g.Holdings(), s.Holdings()) {
		t.Fatal("holdings differ from FromGGUF's")
	}
	comp, err := s.Computer(2)
	if err != nil {
		t.Fatal(err)
	}
	gc, err := g.Computer(2)
	if err != nil {
		t.Fatal(err)
	}
	const n, k = 8, 2
	rng := rand.New(rand.NewPCG(3, 5))
	for l := range 4 {
		x, ids := randRows(rng, n, 256), randIDs(rng, experts, n, k)
		got, want := make([]float32, n*k*256), make([]float32, n*k*256)
		if err := comp.ComputeExperts(context.Background(), l, x, ids, n, k, got); err != nil {
			t.Fatal(err)
		}
		if err := gc.ComputeExperts(context.Background(), l, x, ids, n, k, want); err != nil {
			t.Fatal(err)
		}
		sameBits(t, fmt.Sprintf("layer %d", l), got, want)
	}
}

// TestLayoutModelErrors: a file with both expert layouts, or with neither,
// cannot be sliced or catalogued, and the errors name the cause.
func TestLayoutModelErrors(t *testing.T) {
	gen := rewriteGGUF(t, genGGUF(t, tinySpec(t)), "qwen35moe", false)
	build := func(keep func(name string) bool, extra bool) *gguf.File {
		w := gguf.NewWriter()
		for _, kv := range gen.KVs {
			w.Set(kv.Key, kv.Value)
		}
		for _, ti := range gen.Tensors {
			tt, _ := gen.Tensor(ti.Name)
			if keep(ti.Name) {
				if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, tt.Data); err != nil {
					t.Fatal(err)
				}
			}
			if extra && strings.HasSuffix(ti.Name, ".ffn_gate_exps.weight") {
				fused := strings.Replace(ti.Name, ".ffn_gate_exps.", ".ffn_gate_up_exps.", 1)
				dims := []uint64{ti.Dims[0], 2 * ti.Dims[1], ti.Dims[2]}
				if err := w.AddTensor(fused, ti.Type, dims, append(slices.Clone(tt.Data), tt.Data...)); err != nil {
					t.Fatal(err)
				}
			}
		}
		var b bytes.Buffer
		if _, err := w.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(b.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	all := func(string) bool { return true }
	noGateUp := func(n string) bool {
		return !strings.HasSuffix(n, ".ffn_gate_exps.weight") && !strings.HasSuffix(n, ".ffn_up_exps.weight")
	}
	for _, tc := range []struct {
		name string
		f    *gguf.File
		want error
	}{
		{"both layouts", build(all, true), expert.ErrShape},
		{"neither layout", build(noGateUp, false), gguf.ErrNoTensor},
	} {
		if _, err := Cut(tc.f, nil, nil, t.TempDir()); !errors.Is(err, tc.want) {
			t.Errorf("%s: Cut: %v, want %v", tc.name, err, tc.want)
		}
		if _, err := NewCatalog(tc.f); !errors.Is(err, tc.want) {
			t.Errorf("%s: NewCatalog: %v, want %v", tc.name, err, tc.want)
		}
	}
}
