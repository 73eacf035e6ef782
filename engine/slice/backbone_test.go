package slice

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
)

// boModels are the full models the backbone-only tests cut: qwen3moe,
// qwen35moe, and qwen35moe with fused gate/up experts.
func boModels(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, c := range []struct {
		name, preset string
		fused        bool
	}{{"qwen3moe", "tiny", false}, {"qwen35moe", "tiny-qwen35moe", false}, {"qwen35moe-fused", "tiny-qwen35moe", true}} {
		s, err := modelgen.Preset(c.preset)
		if err != nil {
			t.Fatal(err)
		}
		s.FusedGateUp = c.fused
		b, err := modelgen.Bytes(s)
		if err != nil {
			t.Fatal(err)
		}
		out[c.name] = b
	}
	return out
}

// writeBO writes the backbone-only file of the full model held in data
// (written to dir as full.gguf first, so offsets are a real file's) and
// opens both.
func writeBO(t *testing.T, data []byte, o BackboneOptions) (full, bof *gguf.File, bo *BackboneOnly, fullPath string) {
	t.Helper()
	dir := t.TempDir()
	fullPath = filepath.Join(dir, "full.gguf")
	if err := os.WriteFile(fullPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	full, err := gguf.Open(fullPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { full.Close() })
	path := filepath.Join(dir, "backbone.gguf")
	if bo, err = WriteBackboneOnly(full, path, o); err != nil {
		t.Fatal(err)
	}
	if bof, err = gguf.Open(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { bof.Close() })
	return full, bof, bo, fullPath
}

// TestBackboneOnlyFile: the backbone-only file names the full model (its
// ModelID), holds every expert's SHA-256 and chunk SHA-256s as the full
// file's bytes give them, and the ranges where those bytes lie in the full
// file; it keeps every other tensor and only the hot experts; its catalog
// agrees with the full file's.
func TestBackboneOnlyFile(t *testing.T) {
	for name, data := range boModels(t) {
		t.Run(name, func(t *testing.T) {
			hot := [][2]int{{1, 3}, {0, 1}}
			full, bof, written, fullPath := writeBO(t, data, BackboneOptions{Hot: hot, SourceURL: "https://cdn.example/m.gguf", ChunkSize: 16 << 10})
			if !IsBackboneOnly(bof) || IsBackboneOnly(full) {
				t.Fatal("IsBackboneOnly")
			}
			bo, err := ReadBackboneOnly(bof)
			if err != nil {
				t.Fatal(err)
			}
			id, sum := ModelID(full)
			if bo.ModelID != id || bo.ModelSHA256 != sum || written.ModelID != id {
				t.Fatalf("model id %q %x, want %q %x", bo.ModelID, bo.ModelSHA256, id, sum)
			}
			st, _ := os.Stat(fullPath)
			if bo.SourceSize != st.Size() || bo.SourceURL != "https://cdn.example/m.gguf" || bo.ChunkSize != 16<<10 {
				t.Errorf("source size %d (file %d), url %q, chunk %d", bo.SourceSize, st.Size(), bo.SourceURL, bo.ChunkSize)
			}
			if want := [][2]int{{0, 1}, {1, 3}}; len(bo.Hot) != 2 || bo.Hot[0] != want[0] || bo.Hot[1] != want[1] {
				t.Errorf("hot %v, want %v", bo.Hot, want)
			}
			raw, err := os.ReadFile(fullPath)
			if err != nil {
				t.Fatal(err)
			}
			cat, err := NewCatalog(full)
			if err != nil {
				t.Fatal(err)
			}
			bcat, err := NewBackboneCatalog(bo)
			if err != nil {
				t.Fatal(err)
			}
			if bcat.HasBytes() || !cat.HasBytes() || bcat.ChunkSize() != 16<<10 || cat.ChunkSize() != 0 {
				t.Error("HasBytes / ChunkSize")
			}
			ch, bh := cat.Header(), bcat.Header()
			if ch.ModelID != bh.ModelID || ch.ModelSHA256 != bh.ModelSHA256 || ch.NLayer != bh.NLayer || ch.NExpert != bh.NExpert ||
				ch.DModel != bh.DModel || ch.DFF != bh.DFF || len(ch.Layers) != len(bh.Layers) {
				t.Fatalf("headers differ: %+v vs %+v", ch, bh)
			}
			for l := range ch.Layers {
				a, b := ch.Layers[l], bh.Layers[l]
				if a.GateType != b.GateType || a.UpType != b.UpType || a.DownType != b.DownType || a.ExpertBytes != b.ExpertBytes {
					t.Errorf("layer %d: %+v vs %+v", l, a, b)
				}
			}
			for l := 0; l < bo.NLayer; l++ {
				ly, err := expert.FromGGUF(full, l)
				if err != nil {
					t.Fatal(err)
				}
				for e := 0; e < bo.NExpert; e++ {
					want, _ := HashExpert(ly, e)
					if got, ok := bo.Sum(l, e); !ok || got != want {
						t.Fatalf("(%d, %d): sum %x, want %x", l, e, got, want)
					}
					if got, _ := bcat.Hash(l, e); got != want {
						t.Fatalf("(%d, %d): catalog hash", l, e)
					}
					file := append(append(append([]byte(nil), ly.Gate.Expert[e]...), ly.Up.Expert[e]...), ly.Down.Expert[e]...)
					var cat2 []byte
					for _, r := range bo.Ranges(l, e) {
						cat2 = append(cat2, raw[r.Offset:r.Offset+r.Len]...)
					}
					if !bytes.Equal(cat2, file) {
						t.Fatalf("(%d, %d): the ranges %v do not hold the expert's bytes", l, e, bo.Ranges(l, e))
					}
					if rs := cat.Ranges(l, e); len(rs) != len(bo.Ranges(l, e)) || rs[0] != bo.Ranges(l, e)[0] {
						t.Fatalf("(%d, %d): full catalog ranges %v, backbone-only %v", l, e, rs, bo.Ranges(l, e))
					}
					s, ok := bcat.Sums(l, e, bo.ChunkSize)
					if !ok || s.SHA256 != want || len(s.Chunks) != (len(file)+bo.ChunkSize-1)/bo.ChunkSize {
						t.Fatalf("(%d, %d): sums %v", l, e, ok)
					}
					ref, _ := cat.Sums(l, e, bo.ChunkSize)
					for i, c := range s.Chunks {
						hi := min(len(file), (i+1)*bo.ChunkSize)
						if c != sha256.Sum256(file[i*bo.ChunkSize:hi]) || c != ref.Chunks[i] {
							t.Fatalf("(%d, %d): chunk %d sum", l, e, i)
						}
					}
					if _, ok := bcat.Sums(l, e, 4096); ok {
						t.Fatal("a backbone-only catalog gave sums for another chunk size")
					}
					if bcat.ReadAt(l, e, make([]byte, 4), 0) {
						t.Fatal("a backbone-only catalog read expert bytes")
					}
				}
			}
			// Every tensor but the routed experts is there, unchanged.
			for _, ti := range full.Tensors {
				bt, err := bof.Tensor(ti.Name)
				if isRoutedExpertTensor(ti.Name, bo.NLayer) {
					if err == nil {
						t.Errorf("%s is in the backbone-only file", ti.Name)
					}
					continue
				}
				ft, _ := full.Tensor(ti.Name)
				if err != nil || !bytes.Equal(bt.Data, ft.Data) || bt.Type != ft.Type {
					t.Errorf("%s differs (%v)", ti.Name, err)
				}
			}
			bst, _ := os.Stat(filepath.Join(filepath.Dir(fullPath), "backbone.gguf"))
			if limit := st.Size() - bo.Bytes() + 3*int64(bo.Layers[0].ExpertBytes()) + 64<<10; bst.Size() > limit {
				t.Errorf("backbone-only file %d bytes, full %d, experts %d", bst.Size(), st.Size(), bo.Bytes())
			}
		})
	}
}

// TestBackboneOnlyDecode: the engine loads a backbone-only file with only
// its hot experts held (verified against the stored hashes), and with the
// full model's experts supplied as its Computer it decodes the full
// model's logits bit for bit.
func TestBackboneOnlyDecode(t *testing.T) {
	for name, data := range boModels(t) {
		t.Run(name, func(t *testing.T) {
			hot := [][2]int{{0, 1}, {2, 5}}
			full, bof, bo, _ := writeBO(t, data, BackboneOptions{Hot: hot})
			fm, err := model.Load(full)
			if err != nil {
				t.Fatal(err)
			}
			bm, err := model.Load(bof)
			if err != nil {
				t.Fatal(err)
			}
			loc := bm.LocalExperts()
			for l := 0; l < bo.NLayer; l++ {
				for e := 0; e < bo.NExpert; e++ {
					isHot := (l == 0 && e == 1) || (l == 2 && e == 5)
					if loc.Layer(l).Held(e) != isHot {
						t.Fatalf("(%d, %d) held %v", l, e, !isHot)
					}
				}
			}
			if err := bo.CheckHot(loc.Layer); err != nil {
				t.Fatal(err)
			}
			if fp, bp := fm.Params(), bm.Params(); fp != bp {
				t.Fatalf("params differ:\n%+v\n%+v", fp, bp)
			}
			if fm.BytesPerToken() != bm.BytesPerToken() {
				t.Errorf("bytes per token %d vs %d", fm.BytesPerToken(), bm.BytesPerToken())
			}
			want := decodeLogits(t, fm, 6)
			bm.SetExperts(fm.LocalExperts())
			got := decodeLogits(t, bm, 6)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("logit %d: %v, full model %v", i, got[i], want[i])
				}
			}
			// Alone, it fails on the first expert it does not hold.
			bm.SetExperts(nil)
			seq := bm.NewSequence()
			err = bm.Forward(context.Background(), []model.Row{{Seq: seq, Token: 1, Pos: 0, Logits: true}}, make([]float32, bm.Params().Vocab))
			if !errors.Is(err, expert.ErrUnknownExpert) {
				t.Errorf("forward with only the hot experts: %v", err)
			}
		})
	}
}

// decodeLogits prefills a fixed prompt and decodes steps greedy tokens,
// returning every logits vector.
func decodeLogits(t *testing.T, m *model.Model, steps int) []float32 {
	t.Helper()
	m.SetThreads(1)
	seq := m.NewSequence()
	v := m.Params().Vocab
	prompt := []int32{1, 7, 42, 3}
	rows := make([]model.Row, len(prompt))
	for i, tok := range prompt {
		rows[i] = model.Row{Seq: seq, Token: tok, Pos: i, Logits: i == len(prompt)-1}
	}
	logits := make([]float32, v)
	var all []float32
	if err := m.Forward(context.Background(), rows, logits); err != nil {
		t.Fatal(err)
	}
	all = append(all, logits...)
	for range steps {
		next := model.Greedy(logits)
		if err := m.Forward(context.Background(), []model.Row{{Seq: seq, Token: next, Pos: seq.Len(), Logits: true}}, logits); err != nil {
			t.Fatal(err)
		}
		all = append(all, logits...)
	}
	return all
}

// TestBackboneOnlyRefusals: a backbone-only file is not cut again, a hot
// expert must be in range and listed once, a tampered hash table or hot
// expert is noticed.
func TestBackboneOnlyRefusals(t *testing.T) {
	data := boModels(t)["qwen3moe"]
	full, bof, bo, _ := writeBO(t, data, BackboneOptions{Hot: [][2]int{{0, 0}}})
	if _, err := WriteBackboneOnly(bof, filepath.Join(t.TempDir(), "x.gguf"), BackboneOptions{}); !errors.Is(err, ErrBackboneOnly) {
		t.Errorf("re-slicing: %v", err)
	}
	for _, hot := range [][][2]int{{{0, 8}}, {{4, 0}}, {{1, 1}, {1, 1}}, {{-1, 0}}} {
		if _, err := WriteBackboneOnly(full, filepath.Join(t.TempDir(), "x.gguf"), BackboneOptions{Hot: hot}); !errors.Is(err, ErrBackboneOnly) {
			t.Errorf("hot %v: %v", hot, err)
		}
	}
	if _, err := WriteBackboneOnly(full, filepath.Join(t.TempDir(), "x.gguf"), BackboneOptions{ChunkSize: 100}); !errors.Is(err, ErrBackboneOnly) {
		t.Errorf("chunk 100: %v", err)
	}
	// Rewrite the file with one key or tensor changed.
	rewrite := func(change func(w *gguf.Writer, name string, ti gguf.Tensor) bool) *gguf.File {
		w := gguf.NewWriter()
		for _, kv := range bof.KVs {
			w.Set(kv.Key, kv.Value)
		}
		for _, ti := range bof.Tensors {
			tt, _ := bof.Tensor(ti.Name)
			if change(w, ti.Name, tt) {
				continue
			}
			if err := w.AddTensor(ti.Name, tt.Type, tt.Dims, tt.Data); err != nil {
				t.Fatal(err)
			}
		}
		var buf bytes.Buffer
		if _, err := w.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	short := rewrite(func(w *gguf.Writer, name string, tt gguf.Tensor) bool {
		if name == "blk.2.ffn_exps_sha256" {
			if err := w.AddTensor(name, tt.Type, []uint64{8, 4}, tt.Data[:128]); err != nil {
				t.Fatal(err)
			}
			return true
		}
		return false
	})
	if _, err := ReadBackboneOnly(short); !errors.Is(err, ErrBackboneOnly) {
		t.Errorf("short hash table: %v", err)
	}
	noURL := rewrite(func(w *gguf.Writer, name string, tt gguf.Tensor) bool {
		w.Set(KeyBackboneOnlyVersion, gguf.Uint32(9))
		return false
	})
	if _, err := ReadBackboneOnly(noURL); !errors.Is(err, ErrBackboneOnly) {
		t.Errorf("version 9: %v", err)
	}
	flipped := rewrite(func(w *gguf.Writer, name string, tt gguf.Tensor) bool {
		if name == hotTensorName(0, 0, "down") {
			d := bytes.Clone(tt.Data)
			d[len(d)-1] ^= 1
			if err := w.AddTensor(name, tt.Type, tt.Dims, d); err != nil {
				t.Fatal(err)
			}
			return true
		}
		return false
	})
	m, err := model.Load(flipped)
	if err != nil {
		t.Fatal(err)
	}
	if err := bo.CheckHot(m.LocalExperts().Layer); !errors.Is(err, ErrCorrupt) {
		t.Errorf("flipped hot expert: %v", err)
	}
}

// TestWriteBackboneOnlyFrom: the backbone-only file written from a model's
// layout and its tensors drawn on demand (modelgen.Lazy) is the same file
// as WriteBackboneOnly's from the full file, hot experts and a small chunk
// size included; a tensor function that fails or returns the wrong size
// fails the write.
func TestWriteBackboneOnlyFrom(t *testing.T) {
	for _, c := range []struct {
		preset string
		fused  bool
	}{{"tiny", false}, {"tiny-qwen35moe", false}, {"tiny-qwen35moe", true}} {
		s, err := modelgen.Preset(c.preset)
		if err != nil {
			t.Fatal(err)
		}
		s.FusedGateUp = c.fused
		data, err := modelgen.Bytes(s)
		if err != nil {
			t.Fatal(err)
		}
		o := BackboneOptions{Hot: [][2]int{{2, 1}, {0, 3}}, ChunkSize: 4 << 10, SourceSize: int64(len(data))}
		_, _, want, path := writeBO(t, data, o)
		wantBytes, err := os.ReadFile(filepath.Join(filepath.Dir(path), "backbone.gguf"))
		if err != nil {
			t.Fatal(err)
		}
		l, err := modelgen.NewLazy(s)
		if err != nil {
			t.Fatal(err)
		}
		out := filepath.Join(t.TempDir(), "direct.gguf")
		got, err := WriteBackboneOnlyFrom(l.File, l.Tensor, out, o)
		if err != nil {
			t.Fatal(err)
		}
		gotBytes, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(gotBytes, wantBytes) || got.ModelID != want.ModelID || got.Bytes() != want.Bytes() {
			t.Errorf("%s fused=%v: WriteBackboneOnlyFrom's file (%d bytes, id %s) differs from WriteBackboneOnly's (%d, %s)",
				c.preset, c.fused, len(gotBytes), got.ModelID, len(wantBytes), want.ModelID)
		}
		boom := errors.New("boom")
		if _, err := WriteBackboneOnlyFrom(l.File, func(string) ([]byte, error) { return nil, boom }, out, o); !errors.Is(err, boom) {
			t.Errorf("failing tensor function: %v", err)
		}
		short := func(name string) ([]byte, error) { b, err := l.Tensor(name); return b[:len(b)-1], err }
		if _, err := WriteBackboneOnlyFrom(l.File, short, out, o); !errors.Is(err, ErrModel) {
			t.Errorf("short tensor: %v, want ErrModel", err)
		}
	}
}
