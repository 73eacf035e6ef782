package dispatch_test

import (
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

const provFixture = "tiny-qwen3moe-Q8_0.gguf"

// provStack is a swarm stack whose dispatcher provisions workers from the
// fixture model's catalog; bb is the backbone's model (its own copy).
type provStack struct {
	*stack
	cat   *slice.Catalog
	bb    *model.Model
	size  int64 // bytes of one expert (every layer is Q8_0)
	chunk int
}

func newProvStack(t testing.TB, mod func(*dispatch.Config)) *provStack {
	t.Helper()
	f, err := gguf.Open(filepath.Join(fixtures, provFixture))
	if err != nil {
		t.Skipf("fixture %s: %v", provFixture, err)
	}
	t.Cleanup(func() { f.Close() })
	cat, err := slice.NewCatalog(f)
	if err != nil {
		t.Fatal(err)
	}
	bb := loadFixture(t, provFixture)
	p := bb.Params()
	md := dispatch.Model{ID: cat.Header().ModelID, D: p.Embd, K: p.ExpertsUsed, NLayer: p.Layers, NExpert: p.Experts}
	const chunk = 64 << 10
	s := newStack(t, md, 0, func(c *dispatch.Config) {
		c.Fallback = bb.LocalExperts()
		c.Catalog = cat
		c.ChunkSize = chunk
		if mod != nil {
			mod(c)
		}
	})
	return &provStack{stack: s, cat: cat, bb: bb, size: cat.Size(0, 0), chunk: chunk}
}

// startSliceWorker runs an in-process worker with key over the slice
// folder dir ("cpu" backend, quota bytes of disk, the model id its slice
// says): it serves what it holds and downloads what it is assigned.
func (s *provStack) startSliceWorker(t testing.TB, key ed25519.PrivateKey, dir string, quota int64) *inProc {
	t.Helper()
	return s.startInProc(t, nil, nil, func(c *worker.Config) {
		c.Key, c.SliceDir, c.Quota, c.Backend, c.ModelID = key, dir, quota, "cpu", ""
	})
}

// sliceDiskBytes sums the sizes of the files in dir's layer folders
// (expert files and partial downloads).
func sliceDiskBytes(t *testing.T, dir string) int64 {
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

func workerStats(s *stack, id string) (dispatch.WorkerStats, bool) {
	for _, w := range s.disp.Stats().Workers {
		if w.ID == id && w.Connected {
			return w, true
		}
	}
	return dispatch.WorkerStats{}, false
}

// TestProvisionEmptyWorkerDecode: a worker starting from an empty folder
// with a 64 MiB quota joins, is assigned every expert (the fixture's 64
// Q8_0 experts, 13.4 MB, fit), downloads them in 64 KiB chunks, and then
// serves every expert of a decode whose tokens and logits are bit-identical
// to a local decode. Its slice is exactly the experts' bytes.
func TestProvisionEmptyWorkerDecode(t *testing.T) {
	s := newProvStack(t, nil)
	p, wantLogits, wantToks := localDecode(t, provFixture, 6)

	_, key, _ := ed25519.GenerateKey(nil)
	dir := filepath.Join(t.TempDir(), "slice")
	const quota = 64 << 20
	sw := s.startSliceWorker(t, key, dir, quota)
	n := p.Layers * p.Experts
	waitUntil(t, 60*time.Second, "the download", func() bool {
		ws, ok := workerStats(s.stack, keyID(key))
		return ok && ws.Holdings == n
	})
	st := sw.Stats()
	total := int64(n) * s.size
	if st.Experts != n || st.SliceBytes != total || sliceDiskBytes(t, dir) != total || st.Quota != quota {
		t.Fatalf("worker holds %d experts, %d bytes (disk %d), quota %d; want %d, %d", st.Experts, st.SliceBytes,
			sliceDiskBytes(t, dir), st.Quota, n, total)
	}
	if st.DownloadBytesDone != uint64(total) || st.DownloadBytesTotal != uint64(total) ||
		st.DownloadExpertsDone != n || st.DownloadExpertsTotal != n {
		t.Fatalf("progress %d/%d bytes %d/%d experts", st.DownloadBytesDone, st.DownloadBytesTotal, st.DownloadExpertsDone, st.DownloadExpertsTotal)
	}
	perExpert := (s.size + int64(s.chunk) - 1) / int64(s.chunk)
	if st.ChunkRequests != uint64(int64(n)*perExpert) {
		t.Fatalf("%d chunk requests, want %d x %d", st.ChunkRequests, n, perExpert)
	}
	ws, _ := workerStats(s.stack, keyID(key))
	if ws.AssignedBytes != uint64(total) || ws.ChunkBytes != uint64(total) {
		t.Fatalf("backbone: assigned %d bytes, sent %d, want %d", ws.AssignedBytes, ws.ChunkBytes, total)
	}
	// The downloaded slice is a valid slice directory: slice.Open verifies it.
	sl, err := slice.Open(dir)
	if err != nil || len(sl.Bad()) != 0 || len(sl.Holdings()) != n {
		t.Fatalf("slice.Open: %v, %d bad, %d held", err, len(sl.Bad()), len(sl.Holdings()))
	}
	sl.Close()

	before := s.disp.Stats()
	gotLogits, gotToks := s.swarmDecode(t, s.bb, wantToks)
	sameLogits(t, gotLogits, wantLogits)
	after := s.disp.Stats()
	want := uint64((len(fixturePrompt) + 5) * p.ExpertsUsed * p.Layers)
	if after.ExpertsLocal != before.ExpertsLocal || after.ExpertsRemote-before.ExpertsRemote != want {
		t.Fatalf("experts local +%d remote +%d, want 0 and %d", after.ExpertsLocal-before.ExpertsLocal,
			after.ExpertsRemote-before.ExpertsRemote, want)
	}
	t.Logf("downloaded %d experts (%d bytes) in %d chunks; decode %v identical, all %d expert outputs remote",
		n, total, st.ChunkRequests, gotToks, want)
}

// TestProvisionResume: a worker stopped half-way through its download
// (after 18 of its 40 chunks, mid-expert) and restarted on the same folder
// resumes: the second run requests exactly the chunks that were not yet
// verified on disk, and ends with the whole assignment held.
func TestProvisionResume(t *testing.T) {
	s := newProvStack(t, func(c *dispatch.Config) { c.RateLimit = 1 << 20 }) // 16 chunks/s
	_, key, _ := ed25519.GenerateKey(nil)
	dir := filepath.Join(t.TempDir(), "slice")
	quota := 10 * s.size
	perExpert := (s.size + int64(s.chunk) - 1) / int64(s.chunk)
	totalChunks := 10 * perExpert
	sw := s.startSliceWorker(t, key, dir, quota)
	waitUntil(t, 30*time.Second, "18 chunks", func() bool { return sw.Stats().ChunksReceived >= 18 })
	sw.stop()
	first := sw.Stats()
	if first.Experts >= 10 {
		t.Fatalf("the download finished before the stop (%d experts)", first.Experts)
	}
	// What is verified on disk now: whole experts plus full chunks of partial files.
	st, bad, err := slice.OpenStore(dir, quota, 1)
	if err != nil || len(bad) != 0 {
		t.Fatal(err, bad)
	}
	held := len(st.Holdings())
	var partialChunks int64
	for l := 0; l < s.model.NLayer; l++ {
		for e := 0; e < s.model.NExpert; e++ {
			if n := st.Partial(l, e); n > 0 {
				sums, _ := s.cat.Sums(l, e, s.chunk)
				off, err := st.Resume(l, e, s.chunk, sums.Chunks)
				if err != nil {
					t.Fatal(err)
				}
				partialChunks += off / int64(s.chunk)
			}
		}
	}
	st.Close()
	if partialChunks == 0 {
		t.Fatalf("no partial download on disk after the stop (held %d)", held)
	}
	verified := int64(held)*perExpert + partialChunks
	sw2 := s.startSliceWorker(t, key, dir, quota)
	waitUntil(t, 30*time.Second, "the resumed download", func() bool { return sw2.Stats().Experts == 10 })
	got := sw2.Stats().ChunkRequests
	if int64(got) != totalChunks-verified {
		t.Fatalf("second run requested %d chunks, want %d - %d verified = %d", got, totalChunks, verified, totalChunks-verified)
	}
	if d := sliceDiskBytes(t, dir); d != quota {
		t.Fatalf("slice holds %d bytes, want %d", d, quota)
	}
	t.Logf("stopped with %d experts + %d chunks verified; the restart fetched the other %d of %d chunks",
		held, partialChunks, got, totalChunks)
}

// TestProvisionCorruptRefetched: a byte flipped in a downloaded expert file
// is found when the worker starts; that expert is deleted, not announced and
// not computed, fetched again (exactly its chunks), and then served with
// the right hash.
// flipped is a quota worker's folder with one bit of an expert flipped
// (flipOne): the stack, the worker's key, folder and quota, its manifest
// before the flip, and the expert (layer, expert, file, new bytes).
type flipped struct {
	s     *provStack
	key   ed25519.PrivateKey
	dir   string
	quota int64
	m     *slice.Manifest
	l, e  int
	path  string
	b     []byte
}

// flipOne starts a provisioning stack and a quota worker of 3 experts,
// lets it download them and stops it, then flips one bit of its first
// expert's file in place.
func flipOne(t *testing.T) *flipped {
	t.Helper()
	f := &flipped{s: newProvStack(t, nil), dir: filepath.Join(t.TempDir(), "slice")}
	_, f.key, _ = ed25519.GenerateKey(nil)
	f.quota = 3 * f.s.size
	sw := f.s.startSliceWorker(t, f.key, f.dir, f.quota)
	waitUntil(t, 30*time.Second, "3 experts", func() bool { return sw.Stats().Experts == 3 })
	sw.stop()
	var err error
	if f.m, err = slice.ReadManifest(f.dir); err != nil || f.m.Count() != 3 {
		t.Fatalf("manifest %v %v", f.m, err)
	}
	f.l, f.e = f.m.Layers[0].Layer, f.m.Layers[0].Experts[0].Expert
	f.path = slice.ExpertPath(f.dir, f.l, f.e)
	f.b, _ = os.ReadFile(f.path)
	f.b[len(f.b)/3] ^= 0x10
	if err := os.WriteFile(f.path, f.b, 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

func TestProvisionCorruptRefetched(t *testing.T) {
	f := flipOne(t)
	s, key, dir, quota, l, e, path := f.s, f.key, f.dir, f.quota, f.l, f.e, f.path
	// Let the next start see the corruption before anything runs.
	w, err := worker.New(worker.Config{GatewayURL: s.url, Key: key, RootCAs: s.pool, SliceDir: dir, Quota: quota,
		Backend: "cpu", Threads: 1, Logger: quiet, BackoffBase: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if st := w.Stats(); st.BadExperts != 1 || st.Experts != 2 || w.Store().Holds(l, e) {
		t.Fatalf("at start: %d bad, %d held, holds corrupt %v", st.BadExperts, st.Experts, w.Store().Holds(l, e))
	}
	out := make([]float32, s.model.D)
	if err := w.Store().ComputeExperts(context.Background(), l, make([]float32, s.model.D), []int32{int32(e)}, 1, 1, out); err == nil {
		t.Fatal("the corrupt expert was computed")
	}
	w.Close()
	sw2 := s.startSliceWorker(t, key, dir, quota)
	waitUntil(t, 30*time.Second, "the refetch", func() bool { return sw2.Stats().Experts == 3 })
	perExpert := uint64((s.size + int64(s.chunk) - 1) / int64(s.chunk))
	if got := sw2.Stats().ChunkRequests; got != perExpert {
		t.Fatalf("refetch requested %d chunks, want %d (one expert)", got, perExpert)
	}
	b, _ := os.ReadFile(path)
	want, _ := s.cat.Hash(l, e)
	if sha256.Sum256(b) != want {
		t.Fatal("refetched expert has the wrong hash")
	}
	waitUntil(t, 5*time.Second, "the backbone to accept 3 holdings", func() bool {
		ws, ok := workerStats(s.stack, keyID(key))
		return ok && ws.Holdings == 3
	})
}

// TestProvisionOtherWeightsRefetched: a quota folder holding an expert of
// other weights under the same model id (its manifest consistent with its
// bytes: the store serves it, the backbone refuses the holding at HELLO)
// has it replaced: the ASSIGN names the expert with another SHA-256, so
// the worker drops it and downloads the assigned bytes. Before, it kept
// the expert forever, counted in its quota and never fetched again.
func TestProvisionOtherWeightsRefetched(t *testing.T) {
	f := flipOne(t)
	s, key, dir, quota, m, l, e, path, b := f.s, f.key, f.dir, f.quota, f.m, f.l, f.e, f.path, f.b
	sum := sha256.Sum256(b)
	m.Layers[0].Experts[0].SHA256 = hex.EncodeToString(sum[:])
	if err := slice.WriteManifest(dir, m); err != nil {
		t.Fatal(err)
	}
	sw2 := s.startSliceWorker(t, key, dir, quota)
	want, _ := s.cat.Hash(l, e)
	waitUntil(t, 30*time.Second, "the assigned bytes", func() bool {
		b, err := os.ReadFile(path)
		return err == nil && sha256.Sum256(b) == want && sw2.Stats().Experts == 3
	})
	waitUntil(t, 5*time.Second, "the backbone to accept 3 holdings", func() bool {
		ws, ok := workerStats(s.stack, keyID(key))
		return ok && ws.Holdings == 3
	})
}

// TestProvisionOtherModelReplaced: a quota worker whose folder holds a
// slice of another model (here the embedded demo model's, cut by
// slice.Cut) is welcomed as empty and provisioned afresh: the ASSIGN's
// model replaces the slice, and the backbone accepts what it downloads.
// Before, the HELLO was refused for its model id, and the worker retried
// forever.
func TestProvisionOtherModelReplaced(t *testing.T) {
	s := newProvStack(t, nil)
	_, key, _ := ed25519.GenerateKey(nil)
	dir := filepath.Join(t.TempDir(), "slice")
	other, err := demomodel.File()
	if err != nil {
		t.Fatal(err)
	}
	om, err := slice.Cut(other, []int{0}, []int{0, 1}, dir)
	if err != nil {
		t.Fatal(err)
	}
	if om.ModelID == s.model.ID {
		t.Fatal("the demo model has the fixture's model id")
	}
	sw := s.startSliceWorker(t, key, dir, 3*s.size)
	waitUntil(t, 30*time.Second, "3 experts of the backbone's model", func() bool {
		return sw.Stats().Experts == 3 && sw.Store().ModelID() == s.model.ID
	})
	waitUntil(t, 5*time.Second, "the backbone to accept 3 holdings", func() bool {
		ws, ok := workerStats(s.stack, keyID(key))
		return ok && ws.Holdings == 3
	})
}

// TestProvisionFileChangedInPlace: an expert file of a running quota
// worker overwritten in place with infinite Q8_0 scales (a disk error)
// makes its outputs non-finite. The worker answers ERROR instead of
// sending them, hashes the request's experts again and drops the changed
// one (HOLDINGS): the call's outputs are the backbone's own, bit for bit,
// the session stays up and the key is not banned. Before, the non-finite
// RESULT closed the session, and the worker reconnected announcing the
// same file, again and again.
func TestProvisionFileChangedInPlace(t *testing.T) {
	s := newProvStack(t, nil)
	_, key, _ := ed25519.GenerateKey(nil)
	dir := filepath.Join(t.TempDir(), "slice")
	sw := s.startSliceWorker(t, key, dir, 3*s.size)
	waitUntil(t, 30*time.Second, "3 experts accepted", func() bool {
		ws, ok := workerStats(s.stack, keyID(key))
		return ok && ws.Holdings == 3
	})
	hs := sw.Store().Holdings()
	l, e := int(hs[0].Layer), int(hs[0].Expert)
	f, err := os.OpenFile(slice.ExpertPath(dir, l, e), os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	inf := []byte{0x00, 0x7c} // f16 +Inf, little-endian: every Q8_0 block's scale (34-byte blocks)
	for off := int64(0); off+34 <= s.size; off += 34 {
		if _, err := f.WriteAt(inf, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	rng := rand.New(rand.NewPCG(91, 92))
	hidden := make([]float32, s.model.D)
	for i := range hidden {
		hidden[i] = float32(rng.NormFloat64())
	}
	ids := make([]int32, s.model.K)
	for i := range ids {
		ids[i] = int32((e + i) % s.model.NExpert)
	}
	want := make([]float32, s.model.K*s.model.D)
	if err := s.bb.LocalExperts().ComputeExperts(context.Background(), l, hidden, ids, 1, s.model.K, want); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, len(want))
	if err := s.disp.ComputeExperts(context.Background(), l, hidden, ids, 1, s.model.K, got); err != nil {
		t.Fatal(err)
	}
	for i := range want {
		if fbits(got[i]) != fbits(want[i]) {
			t.Fatalf("output %d: %v, want the backbone's %v", i, got[i], want[i])
		}
	}
	if sw.Store().Holds(l, e) {
		t.Fatal("the changed expert is still served")
	}
	waitUntil(t, 5*time.Second, "the backbone to see the drop", func() bool {
		ws, ok := workerStats(s.stack, keyID(key))
		return ok && ws.Connected && ws.Holdings == 2
	})
	if st := s.disp.Stats(); st.Banned != 0 || st.Caught != 0 {
		t.Fatalf("banned %d, caught %d", st.Banned, st.Caught)
	}
	if le := sw.Stats().LastError; !strings.Contains(le, "dropped") {
		t.Errorf("worker's last error %q, want the drop named", le)
	}
}

// TestProvisionQuotaTooSmall: a worker whose quota holds no expert is
// assigned none and says why (its LastError names the quota and one
// expert's size) instead of showing "connected" at 0 rows/s with no reason.
func TestProvisionQuotaTooSmall(t *testing.T) {
	s := newProvStack(t, nil)
	_, key, _ := ed25519.GenerateKey(nil)
	w := s.startSliceWorker(t, key, filepath.Join(t.TempDir(), "w"), 1024)
	want := fmt.Sprintf("the quota (1024 bytes) is smaller than one expert of this model (%d bytes)", s.size)
	waitUntil(t, 30*time.Second, "the worker's explanation", func() bool { return strings.Contains(w.Stats().LastError, want) })
	if st := w.Stats(); st.Experts != 0 {
		t.Fatalf("holds %d experts in a 1 KiB quota", st.Experts)
	}
}

// TestProvisionQuota: the backbone never assigns more bytes than a worker's
// quota; the slice never exceeds it (checked on disk while downloading);
// lowering the quota drops experts and the backbone re-plans within it.
// Hot experts (every row routed to them) stay on the backbone.
func TestProvisionQuota(t *testing.T) {
	s := newProvStack(t, func(c *dispatch.Config) {
		c.RateLimit = 8 << 20
		c.HotMinTokens = 64
		c.HotShare = 0.9
	})
	// Route 64 rows of layer 0 with expert 3 in every row: it becomes hot.
	p := s.bb.Params()
	k := p.ExpertsUsed
	hidden := make([]float32, 64*p.Embd)
	ids := make([]int32, 64*k)
	for r := 0; r < 64; r++ {
		for j := 0; j < k; j++ {
			ids[r*k+j] = int32([]int{3, 5 + r%4, 9 + r%3, 12 + r%4}[j%4])
		}
		hidden[r*p.Embd] = float32(r)
	}
	if err := s.disp.ComputeExperts(context.Background(), 0, hidden, ids, 64, k, make([]float32, 64*k*p.Embd)); err != nil {
		t.Fatal(err)
	}
	if hot := s.disp.HotExperts(); len(hot) != 1 || hot[0] != [2]int{0, 3} {
		t.Fatalf("hot experts %v, want [[0 3]]", hot)
	}
	if pairs, rows := s.disp.Routing(0, 3); pairs != 64 || rows != 64 {
		t.Fatalf("routing (0, 3): %d pairs of %d rows", pairs, rows)
	}
	_, ka, _ := ed25519.GenerateKey(nil)
	_, kb, _ := ed25519.GenerateKey(nil)
	da, db := filepath.Join(t.TempDir(), "a"), filepath.Join(t.TempDir(), "b")
	qa := 5*s.size/2 + 1000 // room for 2 experts and a half
	qb := int64(64 << 20)
	a := s.startSliceWorker(t, ka, da, qa)
	maxA := int64(0)
	waitUntil(t, 30*time.Second, "A's 2 experts", func() bool {
		maxA = max(maxA, sliceDiskBytes(t, da))
		return a.Stats().Experts == 2
	})
	b := s.startSliceWorker(t, kb, db, qb)
	n := p.Layers * p.Experts
	waitUntil(t, 60*time.Second, "B's download", func() bool {
		maxA = max(maxA, sliceDiskBytes(t, da))
		ws, ok := workerStats(s.stack, keyID(kb))
		return ok && ws.Assigned > 0 && b.Stats().Experts == ws.Assigned
	})
	if maxA > qa {
		t.Fatalf("A's slice reached %d bytes > quota %d", maxA, qa)
	}
	wa, _ := workerStats(s.stack, keyID(ka))
	wb, _ := workerStats(s.stack, keyID(kb))
	if wa.AssignedBytes > uint64(qa) || wa.Assigned != 2 || wb.AssignedBytes > uint64(qb) {
		t.Fatalf("assigned A %d (%d bytes, quota %d), B %d bytes (quota %d)", wa.Assigned, wa.AssignedBytes, qa, wb.AssignedBytes, qb)
	}
	// B, with room for everything, gets every expert but the hot one: those
	// A lacks, then replicas of the routed ones A holds (Replicas = 2).
	if wb.Assigned != n-1 || b.Store().Holds(0, 3) || a.Store().Holds(0, 3) {
		t.Fatalf("B assigned %d (want %d), hot expert held by B %v / A %v", wb.Assigned, n-1, b.Store().Holds(0, 3), a.Store().Holds(0, 3))
	}
	for _, h := range a.Store().Holdings() {
		if pairs, _ := s.disp.Routing(int(h.Layer), int(h.Expert)); pairs == 0 {
			t.Fatalf("A holds (%d, %d), never routed, while routed experts were unassigned", h.Layer, h.Expert)
		}
	}
	// Lower A's quota to one expert: it drops one, the backbone follows.
	if err := a.SetQuota(s.size); err != nil {
		t.Fatal(err)
	}
	if st := a.Stats(); st.Experts != 1 || st.SliceBytes != s.size || sliceDiskBytes(t, da) != s.size {
		t.Fatalf("after SetQuota: %d experts, %d bytes (disk %d)", st.Experts, st.SliceBytes, sliceDiskBytes(t, da))
	}
	waitUntil(t, 10*time.Second, "the backbone to re-plan A", func() bool {
		ws, ok := workerStats(s.stack, keyID(ka))
		return ok && ws.Quota == uint64(s.size) && ws.Holdings == 1 && ws.AssignedBytes <= uint64(s.size)
	})
	// Delete the slice: nothing left on disk but the running store's lock,
	// quota 0, nothing assigned.
	if err := a.DeleteSlice(); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(da); len(ents) != 1 || ents[0].Name() != slice.LockName {
		t.Fatalf("after DeleteSlice %d entries remain (want only %s)", len(ents), slice.LockName)
	}
	waitUntil(t, 10*time.Second, "the backbone to unassign A", func() bool {
		ws, ok := workerStats(s.stack, keyID(ka))
		return ok && ws.Quota == 0 && ws.Holdings == 0
	})
	// A new quota: assigned and downloaded again.
	if err := a.SetQuota(2 * s.size); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 30*time.Second, "A's new download", func() bool { return a.Stats().Experts == 2 })
	if d := sliceDiskBytes(t, da); d != 2*s.size {
		t.Fatalf("A's slice holds %d bytes, want %d", d, 2*s.size)
	}
}
