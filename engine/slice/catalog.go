package slice

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/moeshape"
)

// Catalog is the backbone's view of every expert of a model for
// provisioning workers: the manifest header a worker needs (model id, shapes,
// per-layer tensor types and expert sizes), each expert's file bytes (gate ||
// up || down, read from views into the memory-mapped GGUF, never copied
// whole) and its SHA-256 and per-chunk SHA-256s, computed on first use and
// cached. It is safe for concurrent use.
//
// A catalog of a backbone-only file (NewBackboneCatalog) has no expert
// bytes: HasBytes is false, ReadAt copies nothing, and the hashes come from
// the file (Sums only for its ChunkSize). Workers then fetch the bytes from
// the model source at Ranges.
type Catalog struct {
	header  *Manifest       // Layers carry types and ExpertBytes, no Experts
	layers  []*expert.Layer // n_layer entries, every expert held; nil for a backbone-only catalog
	bytes   []int64         // expert file size per layer
	layouts []ExpertLayout  // where each layer's experts lie in the full file; nil if unknown
	bo      *BackboneOnly   // set for a backbone-only catalog

	mu     sync.Mutex
	sums   map[uint64]*Sums
	hashes map[uint64][32]byte
}

// Sums are an expert's file SHA-256 and the SHA-256 of each Chunk-byte
// chunk: Chunks[i] covers bytes [i*Chunk, min(size, (i+1)*Chunk)).
type Sums struct {
	SHA256 [32]byte
	Chunk  int
	Chunks [][32]byte
}

// modelLayers returns f's general.architecture and its block_count (the
// layer count, 1..MaxLayers). Errors wrap ErrModel.
// notBackboneOnly returns an error wrapping ErrModel when f is a
// backbone-only file, whose routed experts (the ones a slice or a catalog
// is made of) were left out.
func notBackboneOnly(f *gguf.File) error {
	if _, ok := f.Value(KeyBackboneOnlyVersion); !ok {
		return nil
	}
	id, _ := f.String(KeyBackboneOnlyModelID)
	return fmt.Errorf("%w: a backbone-only file (its routed experts were left out): cut slices from the full model (model id %s)", ErrModel, id)
}

func modelLayers(f *gguf.File) (arch string, nl int, err error) {
	sh, err := moeshape.Read(f)
	if sh.Arch == "" {
		return "", 0, fmt.Errorf("%w: no general.architecture", ErrModel)
	}
	if err != nil {
		return "", 0, fmt.Errorf("%w: %v", ErrModel, err)
	}
	if sh.Layers == 0 || sh.Layers > MaxLayers {
		return "", 0, fmt.Errorf("%w: block_count %d (1..%d)", ErrModel, sh.Layers, MaxLayers)
	}
	return sh.Arch, int(sh.Layers), nil
}

// NewCatalog returns the catalog of every layer and expert of f, which must
// stay open while the catalog is used. Errors wrap ErrModel or those of
// expert.FromGGUF.
func NewCatalog(f *gguf.File) (*Catalog, error) {
	if err := notBackboneOnly(f); err != nil {
		return nil, err
	}
	arch, nl, err := modelLayers(f)
	if err != nil {
		return nil, err
	}
	layers := make([]*expert.Layer, nl)
	layouts := make([]ExpertLayout, nl)
	for i := range layers {
		if layers[i], err = expert.FromGGUF(f, i); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		if layouts[i], err = layoutOf(f, i, layers[i]); err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
	}
	id, sum := ModelID(f)
	m := &Manifest{Format: FormatName, Version: FormatVersion, ModelID: id, ModelSHA256: hex.EncodeToString(sum[:]),
		Architecture: clipUTF8(arch, 64), NLayer: nl}
	c, err := newCatalog(m, layers)
	if err != nil {
		return nil, err
	}
	c.layouts = layouts
	return c, nil
}

// NewBackboneCatalog returns the catalog of the full model a backbone-only
// file stands for (ReadBackboneOnly): its header, expert sizes, hashes and
// chunk hashes come from bo; it holds no expert bytes. Errors wrap
// ErrManifest.
func NewBackboneCatalog(bo *BackboneOnly) (*Catalog, error) {
	m := &Manifest{Format: FormatName, Version: FormatVersion, ModelID: bo.ModelID,
		ModelSHA256: hex.EncodeToString(bo.ModelSHA256[:]), Architecture: clipUTF8(bo.Architecture, 64), NLayer: bo.NLayer,
		NExpert: bo.NExpert, DModel: bo.DModel, DFF: bo.DFF}
	c := &Catalog{header: m, bytes: make([]int64, bo.NLayer), layouts: make([]ExpertLayout, bo.NLayer), bo: bo,
		sums: map[uint64]*Sums{}, hashes: map[uint64][32]byte{}}
	for i := range bo.Layers {
		x := bo.Layers[i].ExpertLayout
		c.layouts[i] = x
		c.bytes[i] = x.ExpertBytes()
		m.Layers = append(m.Layers, LayerEntry{Layer: i, GateType: x.Gate.String(), UpType: x.Up.String(),
			DownType: x.Down.String(), ExpertBytes: c.bytes[i], Experts: []ExpertEntry{}})
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// HasBytes reports whether the catalog can read expert bytes (ReadAt): false
// for a backbone-only catalog.
func (c *Catalog) HasBytes() bool { return c.bo == nil }

// ChunkSize returns the only chunk size Sums accepts, bytes (a
// backbone-only catalog's stored chunk hashes), or 0 when any size works.
func (c *Catalog) ChunkSize() int {
	if c.bo != nil {
		return c.bo.ChunkSize
	}
	return 0
}

// Ranges returns expert e of layer l's bytes in the full model file, in
// file order of its expert file (gate || up || down); nil when out of
// range or when the catalog does not know the file's layout (NewCatalogOf).
func (c *Catalog) Ranges(l, e int) []Range {
	if c.layouts == nil || c.Size(l, e) == 0 {
		return nil
	}
	return c.layouts[l].Ranges(e)
}

// NewCatalogOf returns a catalog over layers (n_layer entries, each holding
// every expert, all of one shape) with the given model id, model sum and
// architecture. Errors wrap ErrModel or ErrManifest.
func NewCatalogOf(modelID string, modelSHA256 [32]byte, arch string, layers []*expert.Layer) (*Catalog, error) {
	m := &Manifest{Format: FormatName, Version: FormatVersion, ModelID: modelID,
		ModelSHA256: hex.EncodeToString(modelSHA256[:]), Architecture: arch, NLayer: len(layers)}
	return newCatalog(m, layers)
}

func newCatalog(m *Manifest, layers []*expert.Layer) (*Catalog, error) {
	c := &Catalog{header: m, layers: layers, bytes: make([]int64, len(layers)), sums: map[uint64]*Sums{}, hashes: map[uint64][32]byte{}}
	for i, l := range layers {
		if l == nil {
			return nil, fmt.Errorf("%w: layer %d missing", ErrModel, i)
		}
		if m.NExpert == 0 {
			m.NExpert, m.DModel, m.DFF = l.NExpert, l.DModel, l.DFF
		} else if l.NExpert != m.NExpert || l.DModel != m.DModel || l.DFF != m.DFF {
			return nil, fmt.Errorf("%w: layer %d has %d experts of %d x %d, want %d of %d x %d", ErrModel,
				i, l.NExpert, l.DModel, l.DFF, m.NExpert, m.DModel, m.DFF)
		}
		for e := 0; e < l.NExpert; e++ {
			if !l.Held(e) {
				return nil, fmt.Errorf("%w: layer %d lacks expert %d", ErrModel, i, e)
			}
		}
		eb, err := expertBytes(l.Gate.Type, l.Up.Type, l.Down.Type, m.DModel, m.DFF)
		if err != nil {
			return nil, fmt.Errorf("%w: layer %d: %v", ErrModel, i, err)
		}
		c.bytes[i] = eb
		m.Layers = append(m.Layers, LayerEntry{Layer: i, GateType: l.Gate.Type.String(), UpType: l.Up.Type.String(),
			DownType: l.Down.Type.String(), ExpertBytes: eb, Experts: []ExpertEntry{}})
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Header returns the manifest header: model id and sum, architecture,
// shapes, and one LayerEntry per layer with its types and ExpertBytes and no
// experts. Do not modify it.
func (c *Catalog) Header() *Manifest { return c.header }

// Layer returns layer l's experts (views into the model), nil when out of
// range or for a backbone-only catalog.
func (c *Catalog) Layer(l int) *expert.Layer {
	if c.bo != nil || l < 0 || l >= len(c.layers) {
		return nil
	}
	return c.layers[l]
}

// Size returns the file size in bytes of expert e of layer l, 0 when out of
// range.
func (c *Catalog) Size(l, e int) int64 {
	if l < 0 || l >= len(c.bytes) || e < 0 || e >= c.header.NExpert {
		return 0
	}
	return c.bytes[l]
}

// ReadAt copies bytes [off, off+len(p)) of expert e of layer l's file (gate
// || up || down) into p. It returns false, copying nothing, when (l, e) is
// out of range or the range is not inside the file.
func (c *Catalog) ReadAt(l, e int, p []byte, off int64) bool {
	size := c.Size(l, e)
	if size == 0 || c.bo != nil || off < 0 || off > size || int64(len(p)) > size-off {
		return false
	}
	ly := c.layers[l]
	n := 0
	for _, part := range [][]byte{ly.Gate.Expert[e], ly.Up.Expert[e], ly.Down.Expert[e]} {
		if off >= int64(len(part)) {
			off -= int64(len(part))
			continue
		}
		n += copy(p[n:], part[off:])
		off = 0
		if n == len(p) {
			break
		}
	}
	return true
}

// Sums returns expert e of layer l's file SHA-256 and its chunk SHA-256s
// for chunks of chunk bytes (> 0), computing and caching them on first use
// (one pass over the expert's bytes). ok is false when (l, e) is out of
// range, or for a backbone-only catalog when chunk is not its ChunkSize.
func (c *Catalog) Sums(l, e, chunk int) (s *Sums, ok bool) {
	size := c.Size(l, e)
	if size == 0 || chunk <= 0 {
		return nil, false
	}
	if c.bo != nil {
		if chunk != c.bo.ChunkSize {
			return nil, false
		}
		sum, _ := c.bo.Sum(l, e)
		return &Sums{SHA256: sum, Chunk: chunk, Chunks: c.bo.ChunkSums(l, e)}, true
	}
	k := uint64(l)<<32 | uint64(e)
	c.mu.Lock()
	s = c.sums[k]
	c.mu.Unlock()
	if s != nil && s.Chunk == chunk {
		return s, true
	}
	s = &Sums{Chunk: chunk}
	full := sha256.New()
	buf := make([]byte, chunk)
	for off := int64(0); off < size; off += int64(chunk) {
		b := buf[:min(int64(chunk), size-off)]
		c.ReadAt(l, e, b, off)
		full.Write(b)
		s.Chunks = append(s.Chunks, sha256.Sum256(b))
	}
	full.Sum(s.SHA256[:0])
	c.mu.Lock()
	c.sums[k] = s
	c.hashes[k] = s.SHA256
	c.mu.Unlock()
	return s, true
}

// Hash returns the SHA-256 of expert e of layer l's file (HashExpert),
// cached; ok is false when out of range.
func (c *Catalog) Hash(l, e int) (sum [32]byte, ok bool) {
	k := uint64(l)<<32 | uint64(e)
	c.mu.Lock()
	sum, ok = c.hashes[k]
	c.mu.Unlock()
	if ok {
		return sum, true
	}
	if c.Size(l, e) == 0 {
		return sum, false
	}
	if c.bo != nil {
		return c.bo.Sum(l, e)
	}
	sum, ok = HashExpert(c.layers[l], e)
	c.mu.Lock()
	c.hashes[k] = sum
	c.mu.Unlock()
	return sum, ok
}
