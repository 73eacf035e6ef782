package slice

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/fslock"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Errors of the Store; returned errors wrap them.
var (
	// ErrQuota: writing would take the slice's expert bytes above its quota.
	ErrQuota = errors.New("slice: disk quota exceeded")
	// ErrChunk: a downloaded chunk is not the next one of its partial file,
	// has the wrong size, or its SHA-256 differs from the assigned one.
	ErrChunk = errors.New("slice: bad chunk")
	// ErrNoModel: the store has no model header yet (SetModel first), or
	// the expert's layer is not in it.
	ErrNoModel = errors.New("slice: no model header for the expert")
	// ErrInUse: another process (or another Store of this one) has the
	// directory open with OpenStore. Two stores on one folder would each
	// delete the other's experts as strays, or to fit their quotas.
	ErrInUse = errors.New("slice: directory in use by another worker")
)

// LockName is the file in a store's directory that OpenStore locks
// (engine/fslock) for as long as the Store is open; it holds the process
// id, for the message of a second OpenStore.
const LockName = ".lock"

// lockDir creates and locks dir/LockName, writing this process's id in it.
// Errors wrap ErrInUse (naming the process that holds it) or are the file
// system's.
func lockDir(dir string) (*os.File, error) {
	p := filepath.Join(dir, LockName)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, err
	}
	held, err := fslock.TryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("slice: lock %s: %w", p, err)
	}
	if !held {
		b, _ := os.ReadFile(p)
		f.Close()
		who := "another process"
		if pid := strings.TrimSpace(string(b)); pid != "" && len(pid) < 12 {
			who = "process " + pid
		}
		return nil, fmt.Errorf("%w: %s is open by %s; give each worker its own --slice folder (two workers on one quota folder delete each other's experts)", ErrInUse, dir, who)
	}
	_ = f.Truncate(0)
	_, _ = f.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0)
	return f, nil
}

// PartFile returns the slash-separated path, relative to the slice
// directory, of the partial download of expert e of layer l:
// "L%03d/.E%04d.bin.part". Open and OpenStore never serve it.
func PartFile(l, e int) string { return fmt.Sprintf("L%03d/.E%04d.bin.part", l, e) }

var (
	layerDirRe = regexp.MustCompile(`^L[0-9]{3,5}$`)
	partRe     = regexp.MustCompile(`^\.E([0-9]{4,7})\.bin\.part$`)
)

// heldExpert is one verified, mapped expert file.
type heldExpert struct {
	sum     [32]byte
	data    []byte
	release func() error
}

// Store is a worker's slice directory managed for downloads: it serves the
// verified experts (it is an expert.Computer), downloads new ones chunk by
// chunk into partial files that survive restarts, publishes each completed
// expert atomically (full SHA-256 checked, renamed into place, manifest
// rewritten), drops experts, and keeps the bytes of expert files plus
// partial files at or below a quota.
//
// The quota counts exactly the sizes of the expert files (L*/E*.bin) and
// partial downloads (L*/.E*.bin.part); manifest.json (about 170 bytes per
// expert) is not counted. It is safe for concurrent use; computations hold
// a read lock, so a drop never unmaps an expert being computed.
type Store struct {
	dir     string
	threads int

	rw    sync.RWMutex // read: ComputeExperts; write: changes to the served set
	local *expert.Local
	acc   Accelerator       // computes local's experts when set (SetAccelerator)
	uses  map[uint64]uint64 // pairs computed per expert, guarded by umu
	umu   sync.Mutex

	mu     sync.Mutex
	header *Manifest // model header (Layers: types, no experts); nil until known
	quota  int64
	held   map[uint64]*heldExpert
	parts  map[uint64]int64 // partial file sizes on disk

	lock *os.File // LockName, locked while the Store is open (Close releases it)
}

var _ expert.Computer = (*Store)(nil)

// Accelerator computes a Store's experts on a device (engine/vulkan's
// Computer): the Store hands it every new set of held experts and computes
// through it. Implementations answer from the given expert.Local whatever
// they cannot compute themselves (a device fault included), so results
// never depend on the device's health.
type Accelerator interface {
	expert.Computer
	// Rebase makes local (nil: nothing held) the experts to compute.
	// sum(layer, e) is the SHA-256 of a held expert's bytes (its
	// identity: an expert already on the device with the same sum need
	// not be copied again). The Store calls it under its write lock,
	// never while a ComputeExperts is in progress. An error means the
	// device failed; the Accelerator then computes on local (the Store
	// goes on).
	Rebase(local *expert.Local, sum func(layer, e int) ([32]byte, bool)) error
}

// SetAccelerator makes a compute the held experts from now on (nil: the
// CPU path, expert.Local, as without one), handing it the experts held now
// and, after every change of the held set, the new set (Accelerator.Rebase).
// The Store does not close a; Close hands it an empty set. It returns
// a.Rebase's error (a device fault: a still computes, on the CPU path).
func (s *Store) SetAccelerator(a Accelerator) error {
	s.rw.Lock()
	defer s.rw.Unlock()
	s.acc = a
	if a == nil {
		return nil
	}
	return s.rebaseLocked()
}

// Fault implements expert.Faulter for the accelerator, if it is one: its
// device is taken as faulty and the CPU computes from then on. False
// without one (the Store computes on the CPU).
func (s *Store) Fault(err error) bool {
	s.rw.RLock()
	a := s.acc
	s.rw.RUnlock()
	f, ok := a.(expert.Faulter)
	return ok && f.Fault(err)
}

// rebaseLocked hands the accelerator, if any, the held set (s.rw held for
// writing, s.mu not held).
func (s *Store) rebaseLocked() error {
	if s.acc == nil {
		return nil
	}
	s.mu.Lock()
	sums := make(map[uint64][32]byte, len(s.held))
	for k, h := range s.held {
		sums[k] = h.sum
	}
	s.mu.Unlock()
	return s.acc.Rebase(s.local, func(l, e int) ([32]byte, bool) {
		v, ok := sums[skey(l, e)]
		return v, ok
	})
}

func skey(l, e int) uint64 { return uint64(l)<<32 | uint64(uint32(e)) }

// OpenStore opens (creating it if needed) the slice directory dir for
// downloads with the given quota in bytes and compute threads (<= 0:
// GOMAXPROCS). A directory with a manifest is opened like Open: every
// listed expert is mapped and verified; bad ones (missing, wrong size,
// corrupt) are returned, deleted and removed from the manifest so they are
// never served and can be fetched again. Files in layer folders that the
// manifest does not list, other than partial downloads, are deleted
// (stray temporary files of an interrupted write, experts of an older
// slice). A directory without a manifest must be empty or hold only layer
// folders with at most one expert file (a first download interrupted;
// checkNoManifest). If the held experts exceed the quota, the least used
// are dropped (see SetQuota). The directory is locked (LockName) until
// Close: a second OpenStore of it, from any process, fails with ErrInUse.
// Errors wrap ErrManifest, ErrDir, ErrInUse, or are the file system's.
func OpenStore(dir string, quota int64, threads int) (*Store, []BadExpert, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	lock, err := lockDir(dir)
	if err != nil {
		return nil, nil, err
	}
	s := &Store{dir: dir, threads: threads, quota: quota, held: map[uint64]*heldExpert{},
		parts: map[uint64]int64{}, uses: map[uint64]uint64{}, lock: lock}
	var bad []BadExpert
	if _, err := os.Stat(filepath.Join(dir, ManifestName)); err == nil {
		m, err := ReadManifest(dir)
		if err != nil {
			s.Close()
			return nil, nil, err
		}
		bad = s.load(m)
	} else if errors.Is(err, fs.ErrNotExist) {
		if err := checkNoManifest(dir); err != nil {
			s.Close()
			return nil, nil, err
		}
	} else {
		s.Close()
		return nil, nil, err
	}
	if err := s.sweep(); err != nil {
		s.Close()
		return nil, nil, err
	}
	if len(bad) > 0 {
		if err := s.writeManifestLocked(); err != nil {
			s.Close()
			return nil, nil, err
		}
	}
	s.rebuild()
	if _, err := s.SetQuota(quota); err != nil {
		s.Close()
		return nil, nil, err
	}
	return s, bad, nil
}

// checkNoManifest checks a store directory without a manifest: it may hold
// layer folders (a first download interrupted), temporary files and the
// lock, and at most one expert file. The manifest is rewritten after each
// expert is renamed into place and removed only when nothing is held, so a
// crash leaves at most one expert it does not list; two or more mean the
// manifest was lost (deleted, or the folder copied without it), and
// sweeping them as strays would delete a whole slice without a word.
// Errors wrap ErrDir.
func checkNoManifest(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	experts := 0
	for _, e := range ents {
		switch {
		case e.IsDir() && layerDirRe.MatchString(e.Name()):
			files, err := os.ReadDir(filepath.Join(dir, e.Name()))
			if err != nil {
				return err
			}
			for _, f := range files {
				var x int
				if n, err := fmt.Sscanf(f.Name(), "E%d.bin", &x); err == nil && n == 1 && strings.HasSuffix(f.Name(), ".bin") {
					experts++
				}
			}
		case isTempName(e.Name()) || e.Name() == LockName:
		default:
			return fmt.Errorf("%w: %s holds %s and no manifest", ErrDir, dir, e.Name())
		}
	}
	if experts > 1 {
		return fmt.Errorf("%w: %s holds %d expert files and no %s (lost, or the folder was copied without it): "+
			"restore it, or move the folder away to start afresh; the files are left as they are", ErrDir, dir, experts, ManifestName)
	}
	return nil
}

// isTempName reports whether n is a temporary file name of writeAtomic
// (".NAME.tmp*").
func isTempName(n string) bool { return strings.HasPrefix(n, ".") && strings.Contains(n, ".tmp") }

// load maps and verifies m's experts; it keeps the header and returns the
// bad ones (their files deleted).
func (s *Store) load(m *Manifest) []BadExpert {
	h := *m
	h.Layers = nil
	for _, l := range m.Layers {
		l.Experts = []ExpertEntry{}
		h.Layers = append(h.Layers, l)
	}
	s.header = &h
	type job struct {
		l int
		e ExpertEntry
	}
	var jobs []job
	for _, l := range m.Layers {
		for _, e := range l.Experts {
			jobs = append(jobs, job{l.Layer, e})
		}
	}
	res := make([]loaded, len(jobs))
	parallelFor(len(jobs), func(i int) {
		j := jobs[i]
		res[i] = loaded{layer: j.l, expert: j.e.Expert, sum: hexSum(j.e.SHA256)}
		res[i].data, res[i].release, res[i].err = loadExpert(ExpertPath(s.dir, j.l, j.e.Expert), j.e)
	})
	var bad []BadExpert
	for _, r := range res {
		if r.err != nil {
			path := ExpertPath(s.dir, r.layer, r.expert)
			bad = append(bad, BadExpert{Layer: r.layer, Expert: r.expert, File: path, Err: r.err})
			_ = os.Remove(path)
			continue
		}
		s.held[skey(r.layer, r.expert)] = &heldExpert{sum: r.sum, data: r.data, release: r.release}
	}
	return bad
}

// sweep deletes unlisted files in layer folders (keeping partial
// downloads, whose sizes it records) and temporary files in dir.
func (s *Store) sweep() error {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return err
	}
	for _, d := range ents {
		if !d.IsDir() {
			if isTempName(d.Name()) {
				_ = os.Remove(filepath.Join(s.dir, d.Name()))
			}
			continue
		}
		if !layerDirRe.MatchString(d.Name()) {
			continue
		}
		var l int
		fmt.Sscanf(d.Name()[1:], "%d", &l)
		if d.Name() != filepath.Base(filepath.Dir(ExpertPath(s.dir, l, 0))) {
			if err := os.RemoveAll(filepath.Join(s.dir, d.Name())); err != nil { // not canonical: nothing of ours
				return err
			}
			continue
		}
		files, err := os.ReadDir(filepath.Join(s.dir, d.Name()))
		if err != nil {
			return err
		}
		for _, f := range files {
			p := filepath.Join(s.dir, d.Name(), f.Name())
			var e int
			if m := partRe.FindStringSubmatch(f.Name()); m != nil && f.Type().IsRegular() {
				fmt.Sscanf(m[1], "%d", &e)
				if _, held := s.held[skey(l, e)]; !held && filepath.Base(ExpertPath(s.dir, l, e)) == f.Name()[1:len(f.Name())-5] {
					if st, err := os.Stat(p); err == nil {
						s.parts[skey(l, e)] = st.Size()
						continue
					}
				}
			}
			if n, err := fmt.Sscanf(f.Name(), "E%d.bin", &e); err == nil && n == 1 && f.Name() == filepath.Base(ExpertPath(s.dir, l, e)) {
				if _, held := s.held[skey(l, e)]; held {
					continue
				}
			}
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
	}
	return nil
}

// Dir returns the slice directory.
func (s *Store) Dir() string { return s.dir }

// ModelID returns the model id of the header ("" before SetModel or a
// manifest).
func (s *Store) ModelID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.header == nil {
		return ""
	}
	return s.header.ModelID
}

// SetModel sets the model header (a Manifest whose Layers give types and
// ExpertBytes; their Experts are ignored). If the store holds another model
// (model id or sum differ), everything is deleted first (DeleteAll) and the
// dropped holdings are returned. Layers already known must have the same
// types. Errors wrap ErrManifest.
func (s *Store) SetModel(h *Manifest) (dropped []wire.Holding, err error) {
	hc := *h
	hc.Layers = nil
	for _, l := range h.Layers {
		l.Experts = []ExpertEntry{}
		hc.Layers = append(hc.Layers, l)
	}
	if err := hc.Validate(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	had := s.header != nil
	same := had && s.header.ModelID == hc.ModelID && s.header.ModelSHA256 == hc.ModelSHA256 &&
		s.header.NLayer == hc.NLayer && s.header.NExpert == hc.NExpert && s.header.DModel == hc.DModel && s.header.DFF == hc.DFF
	s.mu.Unlock()
	if had && !same {
		if dropped, err = s.DeleteAll(); err != nil {
			return dropped, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.header == nil {
		s.header = &hc
		return dropped, nil
	}
	for _, nl := range hc.Layers {
		found := false
		for _, ol := range s.header.Layers {
			if ol.Layer == nl.Layer {
				found = true
				if ol.GateType != nl.GateType || ol.UpType != nl.UpType || ol.DownType != nl.DownType || ol.ExpertBytes != nl.ExpertBytes {
					return dropped, fmt.Errorf("%w: layer %d types differ from the slice's", ErrManifest, nl.Layer)
				}
			}
		}
		if !found {
			s.header.Layers = append(s.header.Layers, nl)
		}
	}
	return dropped, nil
}

// Holdings returns (layer, expert, SHA-256) of every verified expert in
// (layer, expert) order.
func (s *Store) Holdings() []wire.Holding {
	s.mu.Lock()
	defer s.mu.Unlock()
	hs := make([]wire.Holding, 0, len(s.held))
	for k, h := range s.held {
		hs = append(hs, wire.Holding{Layer: uint16(k >> 32), Expert: uint32(k), SHA256: h.sum})
	}
	sort.Slice(hs, func(i, j int) bool {
		return uint64(hs[i].Layer)<<32|uint64(hs[i].Expert) < uint64(hs[j].Layer)<<32|uint64(hs[j].Expert)
	})
	return hs
}

// Holds reports whether expert e of layer l is held (verified and served).
func (s *Store) Holds(l, e int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.held[skey(l, e)]
	return ok
}

// Used returns the bytes the quota counts: held expert files plus partial
// downloads.
func (s *Store) Used() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.usedLocked()
}

func (s *Store) usedLocked() int64 {
	var n int64
	for _, h := range s.held {
		n += int64(len(h.data))
	}
	for _, p := range s.parts {
		n += p
	}
	return n
}

// Quota returns the quota in bytes.
func (s *Store) Quota() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quota
}

// Uses returns how many (row, slot) pairs of expert e of layer l this store
// has computed since it was opened.
func (s *Store) Uses(l, e int) uint64 {
	s.umu.Lock()
	defer s.umu.Unlock()
	return s.uses[skey(l, e)]
}

// Partial returns the size in bytes of expert e of layer l's partial
// download on disk (0 if none).
func (s *Store) Partial(l, e int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.parts[skey(l, e)]
}

// SetQuota sets the quota and, while the counted bytes exceed it, deletes
// partial downloads (largest first) and then held experts, least used
// first (ties: highest (layer, expert) first). It returns the dropped
// experts, to announce in HOLDINGS.
func (s *Store) SetQuota(q int64) (dropped []wire.Holding, err error) {
	s.mu.Lock()
	s.quota = q
	var partKeys []uint64
	for k := range s.parts {
		partKeys = append(partKeys, k)
	}
	sort.Slice(partKeys, func(i, j int) bool { return s.parts[partKeys[i]] > s.parts[partKeys[j]] })
	for _, k := range partKeys {
		if s.usedLocked() <= q {
			break
		}
		_ = os.Remove(filepath.Join(s.dir, filepath.FromSlash(PartFile(int(k>>32), int(uint32(k))))))
		delete(s.parts, k)
	}
	var keys []uint64
	for k := range s.held {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	s.umu.Lock()
	sort.Slice(keys, func(i, j int) bool {
		ui, uj := s.uses[keys[i]], s.uses[keys[j]]
		if ui != uj {
			return ui < uj
		}
		return keys[i] > keys[j]
	})
	s.umu.Unlock()
	var drop []uint64
	s.mu.Lock()
	used := s.usedLocked()
	for _, k := range keys {
		if used <= q {
			break
		}
		used -= int64(len(s.held[k].data))
		drop = append(drop, k)
	}
	s.mu.Unlock()
	if len(drop) == 0 {
		return nil, nil
	}
	return s.drop(drop)
}

// Retain drops every held expert and deletes every partial download for
// which keep(layer, expert) is false, returning the dropped experts.
func (s *Store) Retain(keep func(l, e int) bool) (dropped []wire.Holding, err error) {
	s.mu.Lock()
	var drop []uint64
	for k := range s.held {
		if !keep(int(k>>32), int(uint32(k))) {
			drop = append(drop, k)
		}
	}
	for k := range s.parts {
		if !keep(int(k>>32), int(uint32(k))) {
			_ = os.Remove(filepath.Join(s.dir, filepath.FromSlash(PartFile(int(k>>32), int(uint32(k))))))
			delete(s.parts, k)
		}
	}
	s.mu.Unlock()
	if len(drop) == 0 {
		return nil, nil
	}
	slices.Sort(drop)
	return s.drop(drop)
}

// Reverify hashes the held experts among experts again against the
// SHA-256 they were verified with, and drops (as SetQuota drops: manifest
// first, then unmapped and deleted) those whose bytes changed since: a
// file modified in place, by a disk error or by hand, changes what the
// mapping reads, and its outputs with it. It returns the dropped experts;
// experts not held are skipped, and each expert is hashed once however
// often experts names it.
func (s *Store) Reverify(experts []wire.Holding) ([]wire.Holding, error) {
	var bad []uint64
	seen := make(map[uint64]bool, len(experts)) // a request names an expert once per row: hash it once
	s.rw.RLock()                                // held experts stay mapped while they are hashed
	for _, x := range experts {
		k := skey(int(x.Layer), int(x.Expert))
		if seen[k] {
			continue
		}
		seen[k] = true
		s.mu.Lock()
		h := s.held[k]
		s.mu.Unlock()
		if h != nil && sha256.Sum256(h.data) != h.sum {
			bad = append(bad, k)
		}
	}
	s.rw.RUnlock()
	if len(bad) == 0 {
		return nil, nil
	}
	slices.Sort(bad)
	return s.drop(bad)
}

// drop unlists keys from the manifest (written first), stops serving them
// (waiting for computations in progress), unmaps and deletes their files.
func (s *Store) drop(keys []uint64) ([]wire.Holding, error) {
	s.rw.Lock()
	defer s.rw.Unlock()
	s.mu.Lock()
	var gone []*heldExpert
	var out []wire.Holding
	for _, k := range keys {
		if h := s.held[k]; h != nil {
			gone = append(gone, h)
			delete(s.held, k)
			out = append(out, wire.Holding{Layer: uint16(k >> 32), Expert: uint32(k)})
		}
	}
	err := s.writeManifestLocked()
	s.mu.Unlock()
	s.rebuildLocked()
	for i, h := range gone {
		_ = h.release()
		_ = os.Remove(ExpertPath(s.dir, int(out[i].Layer), int(out[i].Expert)))
	}
	return out, err
}

// DeleteAll removes every expert, partial download and the manifest, and
// forgets the model header. It returns the experts that were held.
func (s *Store) DeleteAll() ([]wire.Holding, error) {
	s.rw.Lock()
	defer s.rw.Unlock()
	s.mu.Lock()
	var out []wire.Holding
	for k, h := range s.held {
		_ = h.release()
		out = append(out, wire.Holding{Layer: uint16(k >> 32), Expert: uint32(k)})
	}
	s.held = map[uint64]*heldExpert{}
	s.parts = map[uint64]int64{}
	s.header = nil
	s.mu.Unlock()
	s.rebuildLocked()
	var errs []error
	errs = append(errs, os.Remove(filepath.Join(s.dir, ManifestName)))
	if errors.Is(errs[0], fs.ErrNotExist) {
		errs[0] = nil
	}
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return out, err
	}
	for _, e := range ents {
		if (e.IsDir() && layerDirRe.MatchString(e.Name())) || isTempName(e.Name()) {
			errs = append(errs, os.RemoveAll(filepath.Join(s.dir, e.Name())))
		}
	}
	errs = append(errs, syncDir(s.dir))
	return out, errors.Join(errs...)
}

// writeManifestLocked writes the manifest of the held experts (s.mu held);
// with nothing held it removes the manifest.
func (s *Store) writeManifestLocked() error {
	if s.header == nil {
		return nil
	}
	m := *s.header
	m.Layers = nil
	for _, l := range s.header.Layers {
		l.Experts = []ExpertEntry{}
		for e := 0; e < m.NExpert && len(l.Experts) < len(s.held); e++ {
			if h := s.held[skey(l.Layer, e)]; h != nil {
				l.Experts = append(l.Experts, ExpertEntry{Expert: e, File: ExpertFile(l.Layer, e), Bytes: l.ExpertBytes,
					SHA256: hex.EncodeToString(h.sum[:])})
			}
		}
		if len(l.Experts) > 0 {
			m.Layers = append(m.Layers, l)
		}
	}
	slices.SortFunc(m.Layers, func(a, b LayerEntry) int { return a.Layer - b.Layer })
	if len(m.Layers) == 0 {
		err := os.Remove(filepath.Join(s.dir, ManifestName))
		if errors.Is(err, fs.ErrNotExist) {
			err = nil
		}
		return err
	}
	return WriteManifest(s.dir, &m)
}

// rebuild swaps in a Computer over the held experts.
func (s *Store) rebuild() {
	s.rw.Lock()
	defer s.rw.Unlock()
	s.rebuildLocked()
}

// rebuildLocked builds the Computer and hands it to the accelerator, if
// any (s.rw held for writing, s.mu not held).
func (s *Store) rebuildLocked() {
	s.buildLocked()
	_ = s.rebaseLocked() // a device fault: the accelerator computes on the CPU path, and logs it
}

// buildLocked builds the CPU Computer over the held experts (s.rw held for
// writing).
func (s *Store) buildLocked() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.header == nil || len(s.held) == 0 {
		s.local = nil
		return
	}
	layers := make([]*expert.Layer, s.header.NLayer)
	for _, le := range s.header.Layers {
		g, u, d, err := le.Types()
		if err != nil {
			continue
		}
		layers[le.Layer] = newLayer(s.header, g, u, d)
	}
	for k, h := range s.held {
		if l := layers[int(k>>32)]; l != nil {
			setExpert(l, int(uint32(k)), h.data)
		}
	}
	for i, l := range layers {
		if l != nil && l.Validate() != nil {
			layers[i] = nil
		}
	}
	s.local, _ = expert.NewLocal(layers, s.threads)
}

// ComputeExperts implements expert.Computer over the held experts and counts
// each expert's (row, slot) pairs (Uses). Errors: those of expert.Local
// (ErrUnknownLayer/ErrUnknownExpert for experts not held, ErrShape).
func (s *Store) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	s.rw.RLock()
	defer s.rw.RUnlock()
	if s.local == nil {
		return fmt.Errorf("%w: %d (nothing held)", expert.ErrUnknownLayer, layer)
	}
	var c expert.Computer = s.local
	if s.acc != nil {
		c = s.acc
	}
	if err := c.ComputeExperts(ctx, layer, hidden, ids, n, k, out); err != nil {
		return err
	}
	s.umu.Lock()
	for _, e := range ids {
		s.uses[skey(layer, int(e))]++
	}
	s.umu.Unlock()
	return nil
}

// layerEntryLocked returns the header's entry for layer l.
func (s *Store) layerEntryLocked(l int) (*LayerEntry, error) {
	if s.header == nil {
		return nil, fmt.Errorf("%w: layer %d", ErrNoModel, l)
	}
	for i := range s.header.Layers {
		if s.header.Layers[i].Layer == l {
			return &s.header.Layers[i], nil
		}
	}
	return nil, fmt.Errorf("%w: layer %d", ErrNoModel, l)
}

// Resume prepares the download of expert e of layer l whose chunk i of
// chunk bytes must have SHA-256 chunks[i]: it verifies the partial file
// chunk by chunk from the start, truncates it after the last verified
// chunk, and returns that length (the offset to request next). Errors wrap
// ErrNoModel or are the file system's.
func (s *Store) Resume(l, e, chunk int, chunks [][32]byte) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	le, err := s.layerEntryLocked(l)
	if err != nil {
		return 0, err
	}
	if chunk <= 0 || len(chunks) != int(wire.NumChunks(uint64(le.ExpertBytes), uint32(chunk))) {
		return 0, fmt.Errorf("%w: %d chunk sums of %d bytes for %d bytes", ErrChunk, len(chunks), chunk, le.ExpertBytes)
	}
	path := filepath.Join(s.dir, filepath.FromSlash(PartFile(l, e)))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, fs.ErrNotExist) {
		delete(s.parts, skey(l, e))
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var good int64
	buf := make([]byte, chunk)
	for i := range chunks {
		want := min(int64(chunk), le.ExpertBytes-good)
		n, err := io.ReadFull(f, buf[:want])
		if err != nil || int64(n) != want || sha256.Sum256(buf[:n]) != chunks[i] {
			break
		}
		good += want
	}
	if err := f.Truncate(good); err != nil {
		return 0, err
	}
	s.parts[skey(l, e)] = good
	return good, nil
}

// WriteChunk appends data, chunk i of expert e of layer l (whose SHA-256
// must be sum), to its partial file. off must equal the partial file's size
// (chunks are written in order) and the counted bytes must stay within the
// quota. Errors wrap ErrChunk, ErrQuota, ErrNoModel or are the file
// system's; a failed write leaves the partial file at its previous size.
func (s *Store) WriteChunk(l, e int, off int64, data []byte, sum [32]byte) error {
	if sha256.Sum256(data) != sum {
		return fmt.Errorf("%w: layer %d expert %d offset %d: sha256 mismatch", ErrChunk, l, e, off)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	le, err := s.layerEntryLocked(l)
	if err != nil {
		return err
	}
	if _, held := s.held[skey(l, e)]; held {
		return fmt.Errorf("%w: layer %d expert %d is already held", ErrChunk, l, e)
	}
	have := s.parts[skey(l, e)]
	if off != have || off+int64(len(data)) > le.ExpertBytes {
		return fmt.Errorf("%w: layer %d expert %d: chunk at %d+%d, partial file has %d of %d", ErrChunk, l, e, off, len(data), have, le.ExpertBytes)
	}
	if used := s.usedLocked(); used+int64(len(data)) > s.quota {
		return fmt.Errorf("%w: %d + %d bytes > quota %d", ErrQuota, used, len(data), s.quota)
	}
	path := filepath.Join(s.dir, filepath.FromSlash(PartFile(l, e)))
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	if _, err = f.WriteAt(data, off); err != nil {
		_ = f.Truncate(off)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	s.parts[skey(l, e)] = off + int64(len(data))
	return nil
}

// Commit publishes the complete partial download of expert e of layer l:
// fsync, SHA-256 of the whole file checked against sum (on mismatch the
// partial file is deleted: ErrCorrupt), rename to ExpertPath, fsync of the
// layer folder, manifest rewritten (atomic), file mapped and served.
// Errors wrap ErrChunk (incomplete), ErrCorrupt, ErrNoModel, ErrManifest
// or are the file system's.
func (s *Store) Commit(l, e int, sum [32]byte) error {
	s.mu.Lock()
	le, err := s.layerEntryLocked(l)
	have := s.parts[skey(l, e)]
	s.mu.Unlock()
	if err != nil {
		return err
	}
	if have != le.ExpertBytes {
		return fmt.Errorf("%w: layer %d expert %d has %d of %d bytes", ErrChunk, l, e, have, le.ExpertBytes)
	}
	part := filepath.Join(s.dir, filepath.FromSlash(PartFile(l, e)))
	f, err := os.Open(part)
	if err != nil {
		return err
	}
	h := sha256.New()
	_, err = io.Copy(h, f)
	if err == nil {
		err = f.Sync()
	}
	f.Close()
	if err != nil {
		return err
	}
	if [32]byte(h.Sum(nil)) != sum {
		_ = os.Remove(part)
		s.mu.Lock()
		delete(s.parts, skey(l, e))
		s.mu.Unlock()
		return fmt.Errorf("%w: layer %d expert %d: downloaded file's sha256 differs", ErrCorrupt, l, e)
	}
	path := ExpertPath(s.dir, l, e)
	if err := os.Rename(part, path); err != nil {
		return err
	}
	if err := SyncLayerDir(s.dir, l); err != nil {
		return err
	}
	entry := ExpertEntry{Expert: e, File: ExpertFile(l, e), Bytes: le.ExpertBytes, SHA256: hex.EncodeToString(sum[:])}
	data, release, err := loadExpert(path, entry)
	if err != nil {
		return err
	}
	s.rw.Lock()
	defer s.rw.Unlock()
	s.mu.Lock()
	delete(s.parts, skey(l, e))
	s.held[skey(l, e)] = &heldExpert{sum: sum, data: data, release: release}
	err = s.writeManifestLocked()
	s.mu.Unlock()
	s.rebuildLocked()
	return err
}

// Abort deletes expert e of layer l's partial download.
func (s *Store) Abort(l, e int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = os.Remove(filepath.Join(s.dir, filepath.FromSlash(PartFile(l, e))))
	delete(s.parts, skey(l, e))
}

// Close hands the accelerator, if any, an empty set and unmaps every
// expert; the Store must not be used afterwards.
func (s *Store) Close() error {
	s.rw.Lock()
	defer s.rw.Unlock()
	s.local = nil
	if s.acc != nil {
		_ = s.acc.Rebase(nil, nil)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, h := range s.held {
		errs = append(errs, h.release())
	}
	s.held = map[uint64]*heldExpert{}
	s.local = nil
	if s.lock != nil {
		errs = append(errs, s.lock.Close()) // releases the lock
		s.lock = nil
	}
	return errors.Join(errs...)
}
