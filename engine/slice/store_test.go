package slice

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/expert"
)

// download fetches expert e of layer l from cat into st in chunks of
// chunk bytes, stopping after stop chunks (-1: all, then Commit).
func download(t *testing.T, st *Store, cat *Catalog, l, e, chunk, stop int) {
	t.Helper()
	sums, ok := cat.Sums(l, e, chunk)
	if !ok {
		t.Fatalf("no sums for (%d, %d)", l, e)
	}
	off, err := st.Resume(l, e, chunk, sums.Chunks)
	if err != nil {
		t.Fatal(err)
	}
	size := cat.Size(l, e)
	for i := int(off) / chunk; i < len(sums.Chunks); i++ {
		if stop >= 0 && i >= stop {
			return
		}
		b := make([]byte, min(int64(chunk), size-int64(i*chunk)))
		cat.ReadAt(l, e, b, int64(i*chunk))
		if err := st.WriteChunk(l, e, int64(i*chunk), b, sums.Chunks[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Commit(l, e, sums.SHA256); err != nil {
		t.Fatal(err)
	}
}

// diskBytes sums the sizes of every file in the layer folders of dir.
func diskBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasPrefix(filepath.Base(filepath.Dir(p)), "L") {
			fi, _ := d.Info()
			n += fi.Size()
		}
		return nil
	})
	return n
}

// TestStoreDownloadResumeQuota: experts downloaded chunk by chunk from a
// Catalog are served bit-identically to the model's own layers; the quota
// counts exact file bytes (partial files too) and is never exceeded; a
// partial download resumes after the last verified chunk across a reopen; a
// flipped byte is found at open, the expert deleted and unlisted; lowering
// the quota drops the least used expert; DeleteAll empties the directory.
func TestStoreDownloadResumeQuota(t *testing.T) {
	f := genGGUF(t, tinySpec(t))
	cat, err := NewCatalog(f)
	if err != nil {
		t.Fatal(err)
	}
	h := cat.Header()
	s0, s2 := cat.Size(0, 0), cat.Size(2, 0) // Q4_K down vs Q6_K down
	if s0 == s2 || s0 == 0 {
		t.Fatalf("sizes %d %d: want two layer types", s0, s2)
	}
	chunk := int(s2/3) + 1 // 3 chunks, the last one shorter
	dir := t.TempDir()
	quota := s0 + 2*s2 - 1 // the third Q6_K expert misses by one byte
	st, bad, err := OpenStore(dir, quota, 1)
	if err != nil || len(bad) != 0 {
		t.Fatal(err, bad)
	}
	if _, err := st.Resume(0, 1, chunk, nil); !errors.Is(err, ErrNoModel) {
		t.Fatalf("resume before SetModel: %v", err)
	}
	if _, err := st.SetModel(h); err != nil {
		t.Fatal(err)
	}
	download(t, st, cat, 0, 1, chunk, -1)
	download(t, st, cat, 2, 3, chunk, -1)
	if got := st.Used(); got != s0+s2 || diskBytes(t, dir) != got {
		t.Fatalf("used %d, disk %d, want %d", got, diskBytes(t, dir), s0+s2)
	}
	hs := st.Holdings()
	if len(hs) != 2 || hs[0].Layer != 0 || hs[0].Expert != 1 || hs[1].Layer != 2 || hs[1].Expert != 3 {
		t.Fatalf("holdings %+v", hs)
	}
	for _, x := range hs {
		want, _ := HashExpert(cat.Layer(int(x.Layer)), int(x.Expert))
		if x.SHA256 != want {
			t.Fatalf("(%d, %d) sha256 differs", x.Layer, x.Expert)
		}
	}
	// Served outputs equal the model's own layer, bit for bit.
	ref, _ := expert.NewLocal([]*expert.Layer{cat.Layer(0), cat.Layer(1), cat.Layer(2), cat.Layer(3)}, 1)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, l := range []int{0, 2} {
		e := int32(1 + l) // 1 in layer 0, 3 in layer 2
		x := randRows(rng, 3, h.DModel)
		ids := []int32{e, e, e}
		got, want := make([]float32, 3*h.DModel), make([]float32, 3*h.DModel)
		if err := st.ComputeExperts(context.Background(), l, x, ids, 3, 1, got); err != nil {
			t.Fatal(err)
		}
		ref.ComputeExperts(context.Background(), l, x, ids, 3, 1, want)
		sameBits(t, "store vs model", got, want)
	}
	if st.Uses(0, 1) != 3 || st.Uses(2, 3) != 3 {
		t.Fatalf("uses %d %d", st.Uses(0, 1), st.Uses(2, 3))
	}
	// Quota: a third Q6_K expert would pass it; the chunk that would is refused.
	download(t, st, cat, 2, 4, chunk, 2) // 2 chunks: s0 + s2 + 2*chunk <= quota
	if st.Partial(2, 4) != int64(2*chunk) || st.Used() != s0+s2+int64(2*chunk) {
		t.Fatalf("partial %d used %d", st.Partial(2, 4), st.Used())
	}
	sums, _ := cat.Sums(2, 4, chunk)
	last := make([]byte, s2-int64(2*chunk))
	cat.ReadAt(2, 4, last, int64(2*chunk))
	if err := st.WriteChunk(2, 4, int64(2*chunk), last, sums.Chunks[2]); !errors.Is(err, ErrQuota) {
		t.Fatalf("over quota: %v", err)
	}
	if diskBytes(t, dir) != st.Used() || st.Used() > st.Quota() {
		t.Fatalf("disk %d used %d quota %d", diskBytes(t, dir), st.Used(), st.Quota())
	}
	// Stray files are swept at open; the partial file survives and resumes.
	os.WriteFile(filepath.Join(dir, "L000", ".E0007.bin.tmp123"), []byte("x"), 0o644)
	os.WriteFile(filepath.Join(dir, "L003", "E0009.bin"), []byte("unlisted"), 0o644)
	st.Close()
	st, bad, err = OpenStore(dir, quota, 1)
	if err != nil || len(bad) != 0 {
		t.Fatal(err, bad)
	}
	if _, err := os.Stat(filepath.Join(dir, "L003", "E0009.bin")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("unlisted file kept: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "L000", ".E0007.bin.tmp123")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("temp file kept: %v", err)
	}
	if st.Partial(2, 4) != int64(2*chunk) || len(st.Holdings()) != 2 {
		t.Fatalf("after reopen: partial %d holdings %d", st.Partial(2, 4), len(st.Holdings()))
	}
	// Corrupt the second chunk of the partial file: resume keeps only the first.
	part := filepath.Join(dir, filepath.FromSlash(PartFile(2, 4)))
	b, _ := os.ReadFile(part)
	b[chunk+3] ^= 0x40
	os.WriteFile(part, b, 0o644)
	if off, err := st.Resume(2, 4, chunk, sums.Chunks); err != nil || off != int64(chunk) {
		t.Fatalf("resume after corrupt chunk: %d %v, want %d", off, err, chunk)
	}
	if fi, _ := os.Stat(part); fi.Size() != int64(chunk) || st.Used() != s0+s2+int64(chunk) {
		t.Fatalf("partial file %d bytes, used %d", fi.Size(), st.Used())
	}
	// Lowering the quota drops partial downloads, then the least used expert.
	st.ComputeExperts(context.Background(), 0, randRows(rng, 1, h.DModel), []int32{1}, 1, 1, make([]float32, h.DModel))
	dropped, err := st.SetQuota(s0 + 10)
	if err != nil || len(dropped) != 1 || dropped[0].Layer != 2 || dropped[0].Expert != 3 {
		t.Fatalf("dropped %+v %v, want (2, 3)", dropped, err)
	}
	if st.Used() != s0 || diskBytes(t, dir) != s0 || st.Holds(2, 3) || !st.Holds(0, 1) {
		t.Fatalf("after quota: used %d disk %d", st.Used(), diskBytes(t, dir))
	}
	m, err := ReadManifest(dir)
	if err != nil || m.Count() != 1 {
		t.Fatalf("manifest %v %v", m, err)
	}
	// A flipped byte in a served expert: found at open, deleted, unlisted.
	if _, err := st.SetQuota(quota); err != nil {
		t.Fatal(err)
	}
	download(t, st, cat, 2, 3, chunk, -1)
	st.Close()
	p := ExpertPath(dir, 2, 3)
	b, _ = os.ReadFile(p)
	b[len(b)/2] ^= 1
	os.WriteFile(p, b, 0o644)
	st, bad, err = OpenStore(dir, quota, 1)
	if err != nil || len(bad) != 1 || bad[0].Layer != 2 || bad[0].Expert != 3 || !errors.Is(bad[0].Err, ErrCorrupt) {
		t.Fatalf("bad %+v %v", bad, err)
	}
	if st.Holds(2, 3) || fileExists(p) {
		t.Fatal("corrupt expert still held or on disk")
	}
	if m, _ := ReadManifest(dir); m.Count() != 1 {
		t.Fatalf("manifest lists %d experts, want 1", m.Count())
	}
	out := make([]float32, h.DModel)
	if err := st.ComputeExperts(context.Background(), 2, randRows(rng, 1, h.DModel), []int32{3}, 1, 1, out); err == nil {
		t.Fatal("corrupt expert computed")
	}
	// Fetched again, it is served.
	download(t, st, cat, 2, 3, chunk, -1)
	if !st.Holds(2, 3) {
		t.Fatal("refetched expert not held")
	}
	// Delete everything.
	if dropped, err := st.DeleteAll(); err != nil || len(dropped) != 2 {
		t.Fatalf("DeleteAll %v %v", dropped, err)
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 1 || ents[0].Name() != LockName || st.Used() != 0 {
		t.Fatalf("after DeleteAll: %d entries (want only %s), used %d", len(ents), LockName, st.Used())
	}
	st.Close()
}

func fileExists(p string) bool { _, err := os.Stat(p); return err == nil }

// TestStoreRefusesForeignDir: a directory holding other files and no
// manifest is not taken over.
func TestStoreRefusesForeignDir(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o644)
	if _, _, err := OpenStore(dir, 1<<20, 1); !errors.Is(err, ErrDir) {
		t.Fatalf("err = %v, want ErrDir", err)
	}
}

// recordingAcc is an Accelerator that computes with the Local it was
// given, scaled by 2 (so the test sees which path answered), and records
// every Rebase: the held experts and their sums.
type recordingAcc struct {
	local   *expert.Local
	rebases []map[[2]int][32]byte // per Rebase: (layer, expert) -> sum; nil for a nil Local
}

func (a *recordingAcc) Rebase(local *expert.Local, sum func(l, e int) ([32]byte, bool)) error {
	a.local = local
	if local == nil {
		a.rebases = append(a.rebases, nil)
		return nil
	}
	m := map[[2]int][32]byte{}
	for l := range local.NumLayers() {
		if ly := local.Layer(l); ly != nil {
			for e := range ly.NExpert {
				if ly.Held(e) {
					s, ok := sum(l, e)
					if !ok {
						s = [32]byte{0xff} // a held expert without a sum: caught below
					}
					m[[2]int{l, e}] = s
				}
			}
		}
	}
	a.rebases = append(a.rebases, m)
	return nil
}

func (a *recordingAcc) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	if err := a.local.ComputeExperts(ctx, layer, hidden, ids, n, k, out); err != nil {
		return err
	}
	for i := range out {
		out[i] *= 2
	}
	return nil
}

// TestStoreAccelerator: an accelerator set on a Store gets the held set
// at once and after every change (a download, a drop by a lower quota),
// each held expert with its SHA-256 as identity, and an empty set at
// Close; while set, every computation goes through it.
func TestStoreAccelerator(t *testing.T) {
	f := genGGUF(t, tinySpec(t))
	cat, err := NewCatalog(f)
	if err != nil {
		t.Fatal(err)
	}
	h := cat.Header()
	chunk := int(cat.Size(0, 0))
	st, _, err := OpenStore(t.TempDir(), 1<<30, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.SetModel(h); err != nil {
		t.Fatal(err)
	}
	download(t, st, cat, 0, 1, chunk, -1)
	acc := &recordingAcc{}
	if err := st.SetAccelerator(acc); err != nil {
		t.Fatal(err)
	}
	sumOf := func(l, e int) [32]byte {
		s, _ := HashExpert(cat.Layer(l), e)
		return s
	}
	check := func(i int, want ...[2]int) {
		t.Helper()
		if len(acc.rebases) != i+1 {
			t.Fatalf("%d rebases, want %d", len(acc.rebases), i+1)
		}
		got := acc.rebases[i]
		if len(got) != len(want) {
			t.Fatalf("rebase %d: held %v, want %v", i, got, want)
		}
		for _, w := range want {
			if s, ok := got[w]; !ok || s != sumOf(w[0], w[1]) {
				t.Fatalf("rebase %d: expert %v missing or with the wrong sum", i, w)
			}
		}
	}
	check(0, [2]int{0, 1})
	download(t, st, cat, 1, 2, chunk, -1)
	check(1, [2]int{0, 1}, [2]int{1, 2})
	// Computations go through the accelerator (its doubled outputs).
	x := randRows(rand.New(rand.NewPCG(1, 2)), 1, h.DModel)
	got, want := make([]float32, h.DModel), make([]float32, h.DModel)
	if err := st.ComputeExperts(context.Background(), 1, x, []int32{2}, 1, 1, got); err != nil {
		t.Fatal(err)
	}
	ref, _ := expert.NewLocal([]*expert.Layer{cat.Layer(0), cat.Layer(1)}, 1)
	ref.ComputeExperts(context.Background(), 1, x, []int32{2}, 1, 1, want)
	for i := range want {
		if got[i] != 2*want[i] {
			t.Fatalf("output %d: %v, want the accelerator's %v", i, got[i], 2*want[i])
		}
	}
	// A quota for one expert drops the least used one (layer 0's, never
	// computed).
	if _, err := st.SetQuota(cat.Size(1, 2)); err != nil {
		t.Fatal(err)
	}
	check(2, [2]int{1, 2})
	st.Close()
	if len(acc.rebases) != 4 || acc.rebases[3] != nil || acc.local != nil {
		t.Fatalf("Close: rebases %d, last %v: want an empty set", len(acc.rebases), acc.rebases[len(acc.rebases)-1])
	}
}

// TestStoreLockAndLostManifest: a store's directory is locked while it is
// open (a second OpenStore fails with ErrInUse naming this process, and
// works after Close): two workers on one quota folder deleted each other's
// experts. A folder whose manifest is gone but which holds two experts is
// refused (ErrDir) with its files left in place; with one expert (what a
// crash between an expert's rename and the manifest's rewrite leaves) it
// opens and the stray is swept.
func TestStoreLockAndLostManifest(t *testing.T) {
	f := genGGUF(t, tinySpec(t))
	cat, err := NewCatalog(f)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	st, _, err := OpenStore(dir, 1<<30, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.SetModel(cat.Header()); err != nil {
		t.Fatal(err)
	}
	chunk := int(cat.Size(0, 0))
	download(t, st, cat, 0, 1, chunk, -1)
	download(t, st, cat, 0, 2, chunk, -1)
	_, _, err = OpenStore(dir, 1<<30, 1)
	if !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), fmt.Sprintf("process %d", os.Getpid())) {
		t.Fatalf("second OpenStore while open: %v, want ErrInUse naming process %d", err, os.Getpid())
	}
	if !st.Holds(0, 1) || !st.Holds(0, 2) {
		t.Fatal("the open store lost its experts")
	}
	st.Close()
	st, _, err = OpenStore(dir, 1<<30, 1)
	if err != nil || !st.Holds(0, 1) || !st.Holds(0, 2) {
		t.Fatalf("reopened after Close: %v", err)
	}
	st.Close()

	if err := os.Remove(filepath.Join(dir, ManifestName)); err != nil {
		t.Fatal(err)
	}
	e1, e2 := ExpertPath(dir, 0, 1), ExpertPath(dir, 0, 2)
	if _, _, err := OpenStore(dir, 1<<30, 1); !errors.Is(err, ErrDir) || !strings.Contains(err.Error(), "2 expert files") {
		t.Fatalf("two experts, no manifest: %v, want ErrDir", err)
	}
	if !fileExists(e1) || !fileExists(e2) {
		t.Fatal("the refused open deleted expert files")
	}
	if err := os.Remove(e2); err != nil {
		t.Fatal(err)
	}
	st, _, err = OpenStore(dir, 1<<30, 1)
	if err != nil {
		t.Fatalf("one expert, no manifest: %v", err)
	}
	defer st.Close()
	if fileExists(e1) || st.Used() != 0 {
		t.Fatalf("the unlisted expert was not swept (used %d)", st.Used())
	}
}
