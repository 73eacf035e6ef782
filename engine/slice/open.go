package slice

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Slice is a set of held experts ready to compute with: from a verified
// slice directory (Open) or as views into a GGUF file (FromGGUF). Only
// experts whose bytes match their hash are held. A Slice is read-only and
// safe for concurrent use until Close.
type Slice struct {
	dir      string
	m        *Manifest
	layers   []*expert.Layer
	holdings []wire.Holding
	bad      []BadExpert
	bytes    int64
	releases []func() error
}

// BadExpert is an expert the manifest lists but Open did not load: its
// file is missing, has the wrong size, or the wrong SHA-256. Fetch it again
// (issue 6) and reopen.
type BadExpert struct {
	Layer, Expert int
	File          string // path of the file, inside the slice directory
	Err           error  // wraps ErrMissing, ErrSize or ErrCorrupt
}

// Manifest returns the slice's manifest: as read by Open (including the
// experts listed by Bad) or as built by FromGGUF. Do not modify it.
func (s *Slice) Manifest() *Manifest { return s.m }

// Dir returns the slice directory ("" for a Slice from FromGGUF).
func (s *Slice) Dir() string { return s.dir }

// ModelID returns the manifest's model id (see ModelID), the id a worker
// announces in HELLO.
func (s *Slice) ModelID() string { return s.m.ModelID }

// Layers returns the held experts as n_layer entries indexed by layer
// number: nil for a layer with no expert held; in a held layer, nil
// Proj.Expert entries for experts not held. Views are valid until Close;
// do not modify them.
func (s *Slice) Layers() []*expert.Layer { return s.layers }

// Holdings returns (layer, expert, SHA-256) of every held expert in
// (layer, expert) order, as HELLO announces them. Do not modify it.
func (s *Slice) Holdings() []wire.Holding { return s.holdings }

// Bad returns the experts listed in the manifest that are not held because
// their file is missing, truncated or corrupt, in (layer, expert) order.
func (s *Slice) Bad() []BadExpert { return s.bad }

// Bytes returns the total size in bytes of the held experts' weights.
func (s *Slice) Bytes() int64 { return s.bytes }

// Computer returns the expert function over the held experts (expert.Local
// with threads goroutines; <= 0 means GOMAXPROCS). It is valid until Close.
// Errors wrap expert.ErrShape or expert.ErrType (not expected: Open and
// FromGGUF validate every layer).
func (s *Slice) Computer(threads int) (*expert.Local, error) {
	return expert.NewLocal(s.layers, threads)
}

// Close unmaps the expert files of a slice from Open; Layers, Computer
// results and their views must not be used after it. A Slice from FromGGUF
// releases nothing (close the gguf.File instead). Close is idempotent.
func (s *Slice) Close() error {
	var errs []error
	for _, r := range s.releases {
		errs = append(errs, r())
	}
	s.releases = nil
	return errors.Join(errs...)
}

// newLayer returns an empty layer (no expert held) of the manifest's shape
// and the entry's types.
func newLayer(m *Manifest, g, u, d quant.Type) *expert.Layer {
	return &expert.Layer{NExpert: m.NExpert, DModel: m.DModel, DFF: m.DFF,
		Gate: expert.Proj{Type: g, Rows: m.DFF, Cols: m.DModel, Expert: make([][]byte, m.NExpert)},
		Up:   expert.Proj{Type: u, Rows: m.DFF, Cols: m.DModel, Expert: make([][]byte, m.NExpert)},
		Down: expert.Proj{Type: d, Rows: m.DModel, Cols: m.DFF, Expert: make([][]byte, m.NExpert)}}
}

// setExpert points expert e of l at data = gate || up || down (len(data)
// must be the layer's expert size).
func setExpert(l *expert.Layer, e int, data []byte) {
	gb, _ := l.Gate.Type.RowBytes(l.DModel)
	ub, _ := l.Up.Type.RowBytes(l.DModel)
	g, u := gb*l.DFF, ub*l.DFF
	l.Gate.Expert[e] = data[:g:g]
	l.Up.Expert[e] = data[g : g+u : g+u]
	l.Down.Expert[e] = data[g+u : len(data) : len(data)]
}

// loaded is one expert file's outcome in Open.
type loaded struct {
	layer, expert int
	data          []byte
	release       func() error
	sum           [32]byte
	err           error
}

// loadExpert maps path, checks its size and hash against e.
func loadExpert(path string, e ExpertEntry) (data []byte, release func() error, err error) {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil, fmt.Errorf("%w: %s", ErrMissing, path)
		}
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrMissing, path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: %v", ErrMissing, path, err)
	}
	if !st.Mode().IsRegular() {
		return nil, nil, fmt.Errorf("%w: %s is not a regular file", ErrMissing, path)
	}
	if st.Size() != e.Bytes {
		return nil, nil, fmt.Errorf("%w: %s holds %d bytes, manifest says %d", ErrSize, path, st.Size(), e.Bytes)
	}
	data, release, err = mapFile(f, int(e.Bytes))
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %s: map: %v", ErrMissing, path, err)
	}
	if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != e.SHA256 {
		_ = release()
		return nil, nil, fmt.Errorf("%w: %s has sha256 %x, manifest says %s", ErrCorrupt, path, sum, e.SHA256)
	}
	return data, release, nil
}

// Open reads DIR/manifest.json, maps every expert file it lists and checks
// each file's size and SHA-256 (on GOMAXPROCS goroutines) before returning.
// Experts that fail are left out of the Slice and listed by Bad; the other
// experts are served. Errors (nothing opened) wrap ErrManifest; a slice
// with every expert bad is not an error.
func Open(dir string) (*Slice, error) {
	m, err := ReadManifest(dir)
	if err != nil {
		return nil, err
	}
	var jobs []loaded
	for _, l := range m.Layers {
		for _, e := range l.Experts {
			jobs = append(jobs, loaded{layer: l.Layer, expert: e.Expert})
		}
	}
	byLayer := make(map[int]*LayerEntry, len(m.Layers))
	for i := range m.Layers {
		byLayer[m.Layers[i].Layer] = &m.Layers[i]
	}
	// entries[i] is jobs[i]'s entry, in manifest order.
	entries := make([]ExpertEntry, 0, len(jobs))
	for _, l := range m.Layers {
		entries = append(entries, l.Experts...)
	}
	parallelFor(len(jobs), func(i int) {
		e := entries[i]
		jobs[i].data, jobs[i].release, jobs[i].err = loadExpert(filepath.Join(dir, filepath.FromSlash(e.File)), e)
		jobs[i].sum = hexSum(e.SHA256)
	})

	s := &Slice{dir: dir, m: m, layers: make([]*expert.Layer, m.NLayer)}
	for i := range jobs {
		j := &jobs[i]
		if j.err != nil {
			s.bad = append(s.bad, BadExpert{Layer: j.layer, Expert: j.expert,
				File: filepath.Join(dir, filepath.FromSlash(entries[i].File)), Err: j.err})
			continue
		}
		s.releases = append(s.releases, j.release)
		l := s.layers[j.layer]
		if l == nil {
			g, u, d, _ := byLayer[j.layer].Types()
			l = newLayer(m, g, u, d)
			s.layers[j.layer] = l
		}
		setExpert(l, j.expert, j.data)
		s.holdings = append(s.holdings, wire.Holding{Layer: uint16(j.layer), Expert: uint32(j.expert), SHA256: j.sum})
		s.bytes += int64(len(j.data))
	}
	s.sortLists()
	for i, l := range s.layers {
		if l == nil {
			continue
		}
		if err := l.Validate(); err != nil {
			_ = s.Close()
			return nil, fmt.Errorf("%w: layer %d: %v", ErrManifest, i, err)
		}
	}
	return s, nil
}

// sortLists puts holdings and bad entries in (layer, expert) order.
func (s *Slice) sortLists() {
	slices.SortFunc(s.holdings, func(a, b wire.Holding) int {
		if a.Layer != b.Layer {
			return int(a.Layer) - int(b.Layer)
		}
		return int(a.Expert) - int(b.Expert)
	})
	slices.SortFunc(s.bad, func(a, b BadExpert) int {
		if a.Layer != b.Layer {
			return a.Layer - b.Layer
		}
		return a.Expert - b.Expert
	})
}

// FromGGUF returns the experts of the given layers of f (nil: every layer,
// 0..block_count-1) restricted to the given expert ids (nil: all) as views
// into f, with their hashes (HashExpert, on GOMAXPROCS goroutines) and the
// manifest Cut would write for them. f must stay open while the Slice is
// used. Either gate/up layout of f (separate or fused, see
// expert.FromGGUF) gives the same expert bytes, hashes and manifest layers.
// Selections must be in range and without repeats. Errors wrap
// ErrModel, ErrSelection, gguf.ErrNoTensor, expert.ErrShape or
// expert.ErrType.
func FromGGUF(f *gguf.File, layers, experts []int) (*Slice, error) {
	if err := notBackboneOnly(f); err != nil {
		return nil, err
	}
	arch, nl, err := modelLayers(f)
	if err != nil {
		return nil, err
	}
	if layers == nil {
		layers = make([]int, nl)
		for i := range layers {
			layers[i] = i
		}
	}
	if err := checkSelection("layer", layers, nl); err != nil {
		return nil, err
	}
	id, sum := ModelID(f)
	m := &Manifest{Format: FormatName, Version: FormatVersion, ModelID: id, ModelSHA256: hex.EncodeToString(sum[:]),
		Architecture: clipUTF8(arch, 64), NLayer: nl}
	s := &Slice{m: m, layers: make([]*expert.Layer, nl)}
	type job struct{ layer, expert int }
	var jobs []job
	for _, li := range layers {
		full, err := expert.FromGGUF(f, li)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", li, err)
		}
		if m.NExpert == 0 {
			m.NExpert, m.DModel, m.DFF = full.NExpert, full.DModel, full.DFF
			if experts != nil {
				if err := checkSelection("expert", experts, m.NExpert); err != nil {
					return nil, err
				}
			}
		} else if full.NExpert != m.NExpert || full.DModel != m.DModel || full.DFF != m.DFF {
			return nil, fmt.Errorf("%w: layer %d has %d experts of %d x %d, layer %d has %d of %d x %d", ErrModel,
				li, full.NExpert, full.DModel, full.DFF, layers[0], m.NExpert, m.DModel, m.DFF)
		}
		eb, err := expertBytes(full.Gate.Type, full.Up.Type, full.Down.Type, m.DModel, m.DFF)
		if err != nil {
			return nil, fmt.Errorf("%w: layer %d: %v", ErrModel, li, err)
		}
		l := newLayer(m, full.Gate.Type, full.Up.Type, full.Down.Type)
		sel := experts
		if sel == nil {
			sel = make([]int, m.NExpert)
			for i := range sel {
				sel[i] = i
			}
		}
		for _, e := range sel {
			l.Gate.Expert[e], l.Up.Expert[e], l.Down.Expert[e] = full.Gate.Expert[e], full.Up.Expert[e], full.Down.Expert[e]
			jobs = append(jobs, job{li, e})
		}
		if err := l.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", li, err)
		}
		s.layers[li] = l
		m.Layers = append(m.Layers, LayerEntry{Layer: li, GateType: l.Gate.Type.String(), UpType: l.Up.Type.String(),
			DownType: l.Down.Type.String(), ExpertBytes: eb})
	}
	sums := make([][32]byte, len(jobs))
	parallelFor(len(jobs), func(i int) {
		sums[i], _ = HashExpert(s.layers[jobs[i].layer], jobs[i].expert)
	})
	li := 0
	for i, j := range jobs {
		for m.Layers[li].Layer != j.layer {
			li++
		}
		le := &m.Layers[li]
		le.Experts = append(le.Experts, ExpertEntry{Expert: j.expert, File: ExpertFile(j.layer, j.expert),
			Bytes: le.ExpertBytes, SHA256: hex.EncodeToString(sums[i][:])})
		s.holdings = append(s.holdings, wire.Holding{Layer: uint16(j.layer), Expert: uint32(j.expert), SHA256: sums[i]})
		s.bytes += le.ExpertBytes
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	s.sortLists()
	return s, nil
}

// checkSelection checks that every index of sel is in [0, n) and appears
// once. Errors wrap ErrSelection.
func checkSelection(what string, sel []int, n int) error {
	if len(sel) == 0 {
		return fmt.Errorf("%w: no %s selected", ErrSelection, what)
	}
	seen := make(map[int]bool, len(sel))
	for _, x := range sel {
		if x < 0 || x >= n {
			return fmt.Errorf("%w: %s %d out of range 0..%d", ErrSelection, what, x, n-1)
		}
		if seen[x] {
			return fmt.Errorf("%w: %s %d selected twice", ErrSelection, what, x)
		}
		seen[x] = true
	}
	return nil
}

// parallelFor runs fn(0..n-1) on up to GOMAXPROCS goroutines.
func parallelFor(n int, fn func(i int)) {
	var mu sync.Mutex
	next := 0
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), max(1, n)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= n {
					return
				}
				fn(i)
			}
		}()
	}
	wg.Wait()
}
