package slice

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/moeshape"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Backbone-only GGUF files (issue 12; docs/slices.md, "Backbone-only
// files").
//
// A backbone-only file is a GGUF written by WriteBackboneOnly from a full
// model: every tensor of the full file except the routed experts
// (blk.N.ffn_gate_exps, ffn_up_exps, ffn_gate_up_exps and ffn_down_exps of
// every layer 0..block_count-1), the full file's metadata, and:
//
//	kvasir.backbone_only.version       u32      BackboneOnlyVersion
//	kvasir.backbone_only.model_id      string   the full model's ModelID (what workers announce)
//	kvasir.backbone_only.model_sha256  string   the full model's ModelID sum, 64 lower-case hex digits
//	kvasir.backbone_only.source_size   u64      the full file's size in bytes
//	kvasir.backbone_only.source_url    string   where the full file is served ("" if not given)
//	kvasir.backbone_only.chunk_size    u32      chunk size of the chunk hashes, bytes
//	kvasir.backbone_only.gate_type     [u32]    per layer: ggml type id of gate (ffn_gate_exps or ffn_gate_up_exps)
//	kvasir.backbone_only.up_type       [u32]    per layer: ggml type id of up
//	kvasir.backbone_only.down_type     [u32]    per layer: ggml type id of ffn_down_exps
//	kvasir.backbone_only.fused         [u32]    per layer: 1 if gate and up are one ffn_gate_up_exps tensor, else 0
//	kvasir.backbone_only.gate_offset   [u64]    per layer: absolute byte offset in the full file of ffn_gate_exps (or ffn_gate_up_exps) data
//	kvasir.backbone_only.up_offset     [u64]    per layer: the same for ffn_up_exps (= gate_offset when fused)
//	kvasir.backbone_only.down_offset   [u64]    per layer: the same for ffn_down_exps
//	kvasir.backbone_only.hot           [u32]    (layer, expert) pairs held in this file, flattened
//
// plus, if the full file lacks it, <arch>.expert_feed_forward_length, and
// these tensors per layer N (bytes stored as F32 elements, 8 per SHA-256,
// since GGUF has no byte tensor type):
//
//	blk.N.ffn_exps_sha256        F32 ne [8, n_expert]            row e: SHA-256 of expert e (HashExpert)
//	blk.N.ffn_exps_chunk_sha256  F32 ne [8, n_expert * n_chunk]  row e*n_chunk + i: SHA-256 of chunk i of expert e
//	blk.N.ffn_gate_hot.E.weight  gate type, ne [d_model, d_ff]   hot expert E's gate matrix (its up and down likewise:
//	blk.N.ffn_up_hot.E.weight    up type,   ne [d_model, d_ff]   ffn_up_hot, ffn_down_hot with ne [d_ff, d_model])
//	blk.N.ffn_down_hot.E.weight  down type, ne [d_ff, d_model]
//
// with n_chunk = ceil(expert_bytes / chunk_size) for the layer. The two hash
// tables take the place of a fused layer's two expert tensors, so a
// backbone-only file has as many tensors per layer as engine/model's loader
// expects at least.

// BackboneOnlyVersion is the version of the backbone-only format this
// package writes and reads.
//
// Changelog:
//
//	1 (2026-12, issue 12): first version.
const BackboneOnlyVersion = 1

// Metadata keys of a backbone-only file (the table above). engine/model's
// loader reads KeyBackboneOnlyVersion, the three type arrays and
// KeyBackboneOnlyHot under the same names.
const (
	KeyBackboneOnlyVersion = "kvasir.backbone_only.version"
	KeyBackboneOnlyModelID = "kvasir.backbone_only.model_id"
	KeyBackboneOnlySum     = "kvasir.backbone_only.model_sha256"
	KeyBackboneOnlySize    = "kvasir.backbone_only.source_size"
	KeyBackboneOnlyURL     = "kvasir.backbone_only.source_url"
	KeyBackboneOnlyChunk   = "kvasir.backbone_only.chunk_size"
	KeyBackboneOnlyHot     = "kvasir.backbone_only.hot"
	keyBOGateType          = "kvasir.backbone_only.gate_type"
	keyBOUpType            = "kvasir.backbone_only.up_type"
	keyBODownType          = "kvasir.backbone_only.down_type"
	keyBOFused             = "kvasir.backbone_only.fused"
	keyBOGateOff           = "kvasir.backbone_only.gate_offset"
	keyBOUpOff             = "kvasir.backbone_only.up_offset"
	keyBODownOff           = "kvasir.backbone_only.down_offset"
)

// DefaultChunkSize is the chunk size, in bytes, of the chunk hashes
// WriteBackboneOnly stores when BackboneOptions.ChunkSize is 0 (1 MiB, the
// dispatcher's default CHUNK size).
const DefaultChunkSize = 1 << 20

// ErrBackboneOnly: a backbone-only file's kvasir.backbone_only metadata or
// hash tables are missing, malformed or inconsistent, or a backbone-only
// file cannot be written as asked (re-slicing a backbone-only file, a bad
// hot expert).
var ErrBackboneOnly = errors.New("slice: bad backbone-only file")

// Range is a byte range of the full GGUF file: Len bytes at Offset.
type Range struct{ Offset, Len uint64 }

// ExpertLayout is where one layer's routed experts lie in the full GGUF
// file, and their types: expert e's gate is GateBytes at GateOffset +
// e*GateStride, its up UpBytes at UpOffset + e*UpStride (the fused layout:
// UpOffset = GateOffset + GateBytes, both strides GateBytes + UpBytes), its
// down DownBytes at DownOffset + e*DownBytes. Offsets are absolute (from
// the start of the file).
type ExpertLayout struct {
	Gate, Up, Down                   quant.Type
	Fused                            bool
	GateOffset, UpOffset, DownOffset uint64
	GateBytes, UpBytes, DownBytes    uint64
}

// ExpertBytes is the size of one expert file of the layer: gate + up +
// down bytes.
func (x *ExpertLayout) ExpertBytes() int64 { return int64(x.GateBytes + x.UpBytes + x.DownBytes) }

// Ranges returns expert e's bytes in the full file as the ranges whose
// concatenation is its expert file (gate || up || down): three ranges, or
// two for the fused layout (gate and up rows are adjacent).
func (x *ExpertLayout) Ranges(e int) []Range {
	ue := uint64(e)
	if x.Fused {
		return []Range{{x.GateOffset + ue*(x.GateBytes+x.UpBytes), x.GateBytes + x.UpBytes}, {x.DownOffset + ue*x.DownBytes, x.DownBytes}}
	}
	return []Range{{x.GateOffset + ue*x.GateBytes, x.GateBytes}, {x.UpOffset + ue*x.UpBytes, x.UpBytes}, {x.DownOffset + ue*x.DownBytes, x.DownBytes}}
}

// layoutOf returns layer il's ExpertLayout in f (expert.FromGGUF has
// checked the tensors' shapes).
func layoutOf(f *gguf.File, il int, ly *expert.Layer) (ExpertLayout, error) {
	x := ExpertLayout{Gate: ly.Gate.Type, Up: ly.Up.Type, Down: ly.Down.Type}
	x.GateBytes = uint64(len(firstHeld(ly.Gate.Expert)))
	x.UpBytes = uint64(len(firstHeld(ly.Up.Expert)))
	x.DownBytes = uint64(len(firstHeld(ly.Down.Expert)))
	name := func(s string) string { return fmt.Sprintf("blk.%d.%s.weight", il, s) }
	down, err := f.TensorInfo(name("ffn_down_exps"))
	if err != nil {
		return x, err
	}
	x.DownOffset = f.DataOffset + down.Offset
	if gu, err := f.TensorInfo(name("ffn_gate_up_exps")); err == nil {
		x.Fused = true
		x.GateOffset = f.DataOffset + gu.Offset
		x.UpOffset = x.GateOffset + x.GateBytes
		return x, nil
	}
	g, err := f.TensorInfo(name("ffn_gate_exps"))
	if err != nil {
		return x, err
	}
	u, err := f.TensorInfo(name("ffn_up_exps"))
	if err != nil {
		return x, err
	}
	x.GateOffset, x.UpOffset = f.DataOffset+g.Offset, f.DataOffset+u.Offset
	return x, nil
}

func firstHeld(b [][]byte) []byte {
	for _, x := range b {
		if x != nil {
			return x
		}
	}
	return nil
}

// isRoutedExpertTensor reports whether name is a routed expert tensor of a
// layer below nl (what a backbone-only file leaves out).
func isRoutedExpertTensor(name string, nl int) bool {
	rest, ok := strings.CutPrefix(name, "blk.")
	if !ok {
		return false
	}
	num, suffix, ok := strings.Cut(rest, ".")
	if !ok {
		return false
	}
	var l int
	if _, err := fmt.Sscanf(num, "%d", &l); err != nil || fmt.Sprint(l) != num || l >= nl {
		return false
	}
	switch suffix {
	case "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_gate_up_exps.weight", "ffn_down_exps.weight":
		return true
	}
	return false
}

// hotTensorName is the name of hot expert e's part ("gate", "up" or
// "down") of layer l in a backbone-only file.
func hotTensorName(l, e int, part string) string {
	return fmt.Sprintf("blk.%d.ffn_%s_hot.%d.weight", l, part, e)
}

// BackboneOptions are WriteBackboneOnly's choices.
type BackboneOptions struct {
	// Hot lists (layer, expert) pairs whose weights the backbone-only
	// file keeps, so the backbone computes them itself; each once.
	Hot [][2]int
	// SourceURL is the HTTP(S) URL where the full file will be served
	// (stored as the default model source; "" for none).
	SourceURL string
	// SourceSize is the full file's size in bytes (0: the end of its last
	// tensor's data).
	SourceSize int64
	// ChunkSize is the chunk size of the stored chunk hashes, bytes,
	// 4 KiB..16 MiB (0: DefaultChunkSize). Workers download and verify in
	// chunks of this size.
	ChunkSize int
}

// WriteBackboneOnly writes a backbone-only GGUF of the full model f to
// path (atomically: a temporary file, synced and renamed): f's metadata
// and every tensor but the routed experts, the kvasir.backbone_only
// metadata (the full model's ModelID, each layer's expert types and
// offsets in f), each expert's SHA-256 and chunk SHA-256s (computed on
// GOMAXPROCS goroutines, one pass over every expert's bytes) and the hot
// experts' weights. It returns the file's description as ReadBackboneOnly
// would. Errors wrap ErrModel (no experts, layers that disagree),
// ErrBackboneOnly (f is itself backbone-only, a bad hot pair or chunk
// size), expert.FromGGUF's, or are the file system's.
func WriteBackboneOnly(f *gguf.File, path string, o BackboneOptions) (*BackboneOnly, error) {
	return WriteBackboneOnlyFrom(f, func(name string) ([]byte, error) {
		t, err := f.Tensor(name)
		return t.Data, err
	}, path, o)
}

// WriteBackboneOnlyFrom is WriteBackboneOnly for a full model whose
// tensors are not in memory: f gives the full file's metadata, tensor infos
// and DataOffset (its data is not read: it may be a gguf.Writer.Layout,
// such as modelgen.Lazy's), and tensor returns the bytes of one of its
// tensors (len = its Size). tensor is called once per tensor: for one
// layer's routed experts at a time, concurrently, whose bytes are dropped
// once the layer is hashed (so at most one layer of experts is held), and
// for the other tensors, whose bytes are held until the file is written.
// The output is the same bytes as WriteBackboneOnly's for a file holding
// those tensors, given the same options (o.SourceSize 0 stands for the end
// of f's last tensor's data, not the file's size). Errors as
// WriteBackboneOnly's, or tensor's.
func WriteBackboneOnlyFrom(f *gguf.File, tensor func(name string) ([]byte, error), path string, o BackboneOptions) (*BackboneOnly, error) {
	if IsBackboneOnly(f) {
		return nil, fmt.Errorf("%w: the input is already a backbone-only file", ErrBackboneOnly)
	}
	arch, nl, err := modelLayers(f)
	if err != nil {
		return nil, err
	}
	if o.ChunkSize == 0 {
		o.ChunkSize = DefaultChunkSize
	}
	if o.ChunkSize < 4<<10 || o.ChunkSize > 16<<20 {
		return nil, fmt.Errorf("%w: chunk size %d (4 KiB..16 MiB)", ErrBackboneOnly, o.ChunkSize)
	}
	id, sum := ModelID(f)
	bo := &BackboneOnly{ModelID: id, ModelSHA256: sum, Architecture: arch, NLayer: nl, SourceURL: o.SourceURL,
		ChunkSize: o.ChunkSize, Layers: make([]BackboneLayer, nl)}
	var end uint64
	for _, t := range f.Tensors {
		end = max(end, f.DataOffset+t.Offset+t.Size)
	}
	bo.SourceSize = o.SourceSize
	if bo.SourceSize == 0 {
		bo.SourceSize = int64(end)
	}
	seen := map[[2]int]bool{}
	for _, h := range o.Hot {
		// NExpert is known once layer 0 is read: checked again below.
		if h[0] < 0 || h[0] >= nl || h[1] < 0 || seen[h] {
			return nil, fmt.Errorf("%w: hot expert (%d, %d) out of range or repeated", ErrBackboneOnly, h[0], h[1])
		}
		seen[h] = true
	}
	bo.Hot = slices.Clone(o.Hot)
	slices.SortFunc(bo.Hot, func(a, b [2]int) int { return (a[0]-b[0])*(1<<21) + a[1] - b[1] })
	hotData := make(map[[2]int][3][]byte, len(bo.Hot)) // the hot experts' gate, up and down bytes
	for l := range nl {
		ly, err := routedLayer(f, tensor, l)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		if l == 0 {
			bo.NExpert, bo.DModel, bo.DFF = ly.NExpert, ly.DModel, ly.DFF
			for _, h := range bo.Hot {
				if h[1] >= bo.NExpert {
					return nil, fmt.Errorf("%w: hot expert (%d, %d) out of range or repeated", ErrBackboneOnly, h[0], h[1])
				}
			}
		} else if ly.NExpert != bo.NExpert || ly.DModel != bo.DModel || ly.DFF != bo.DFF {
			return nil, fmt.Errorf("%w: layer %d has %d experts of %d x %d, layer 0 %d of %d x %d", ErrModel,
				l, ly.NExpert, ly.DModel, ly.DFF, bo.NExpert, bo.DModel, bo.DFF)
		}
		x, err := layoutOf(f, l, ly)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		if _, err := expertBytes(x.Gate, x.Up, x.Down, bo.DModel, bo.DFF); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l, err)
		}
		if end := x.DownOffset + uint64(ly.NExpert)*x.DownBytes; end > uint64(bo.SourceSize) {
			return nil, fmt.Errorf("%w: layer %d's experts end at byte %d, source size %d", ErrBackboneOnly, l, end, bo.SourceSize)
		}
		bl := &bo.Layers[l]
		bl.ExpertLayout = x
		bl.nChunk = int((x.ExpertBytes() + int64(o.ChunkSize) - 1) / int64(o.ChunkSize))
		bl.sums = make([]byte, 32*bo.NExpert)
		bl.chunks = make([]byte, 32*bo.NExpert*bl.nChunk)
		parallelFor(bo.NExpert, func(e int) { hashExpert(bl, ly, e, o.ChunkSize) })
		for _, h := range bo.Hot {
			if h[0] == l {
				e := h[1]
				hotData[h] = [3][]byte{slices.Clone(ly.Gate.Expert[e]), slices.Clone(ly.Up.Expert[e]), slices.Clone(ly.Down.Expert[e])}
			}
		}
	}
	var keep []gguf.TensorInfo
	for _, ti := range f.Tensors {
		if !isRoutedExpertTensor(ti.Name, nl) {
			keep = append(keep, ti)
		}
	}
	data := make([][]byte, len(keep))
	errs := make([]error, len(keep))
	parallelFor(len(keep), func(i int) {
		if data[i], errs[i] = tensor(keep[i].Name); errs[i] == nil && uint64(len(data[i])) != keep[i].Size {
			errs[i] = fmt.Errorf("%w: tensor %q: %d bytes, want %d", ErrModel, keep[i].Name, len(data[i]), keep[i].Size)
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}

	w := gguf.NewWriter()
	for _, kv := range f.KVs {
		w.Set(kv.Key, kv.Value)
	}
	if _, ok := f.Value(arch + ".expert_feed_forward_length"); !ok {
		w.SetUint32(arch+".expert_feed_forward_length", uint32(bo.DFF))
	}
	w.SetUint32(KeyBackboneOnlyVersion, BackboneOnlyVersion)
	w.SetString(KeyBackboneOnlyModelID, bo.ModelID)
	w.SetString(KeyBackboneOnlySum, hex.EncodeToString(sum[:]))
	w.SetUint64(KeyBackboneOnlySize, uint64(bo.SourceSize))
	w.SetString(KeyBackboneOnlyURL, bo.SourceURL)
	w.SetUint32(KeyBackboneOnlyChunk, uint32(bo.ChunkSize))
	u32s := func(fn func(*BackboneLayer) uint32) []uint32 {
		v := make([]uint32, nl)
		for i := range bo.Layers {
			v[i] = fn(&bo.Layers[i])
		}
		return v
	}
	u64s := func(fn func(*BackboneLayer) uint64) []uint64 {
		v := make([]uint64, nl)
		for i := range bo.Layers {
			v[i] = fn(&bo.Layers[i])
		}
		return v
	}
	w.Set(keyBOGateType, gguf.Array(u32s(func(b *BackboneLayer) uint32 { return uint32(b.Gate) })))
	w.Set(keyBOUpType, gguf.Array(u32s(func(b *BackboneLayer) uint32 { return uint32(b.Up) })))
	w.Set(keyBODownType, gguf.Array(u32s(func(b *BackboneLayer) uint32 { return uint32(b.Down) })))
	w.Set(keyBOFused, gguf.Array(u32s(func(b *BackboneLayer) uint32 {
		if b.Fused {
			return 1
		}
		return 0
	})))
	w.Set(keyBOGateOff, gguf.Array(u64s(func(b *BackboneLayer) uint64 { return b.GateOffset })))
	w.Set(keyBOUpOff, gguf.Array(u64s(func(b *BackboneLayer) uint64 { return b.UpOffset })))
	w.Set(keyBODownOff, gguf.Array(u64s(func(b *BackboneLayer) uint64 { return b.DownOffset })))
	hot := make([]uint32, 0, 2*len(bo.Hot))
	for _, h := range bo.Hot {
		hot = append(hot, uint32(h[0]), uint32(h[1]))
	}
	w.Set(KeyBackboneOnlyHot, gguf.Array(hot))
	for i, ti := range keep {
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, data[i]); err != nil {
			return nil, err
		}
	}
	for l := range nl {
		bl := &bo.Layers[l]
		if err := w.AddTensor(fmt.Sprintf("blk.%d.ffn_exps_sha256", l), quant.F32, []uint64{8, uint64(bo.NExpert)}, bl.sums); err != nil {
			return nil, err
		}
		if err := w.AddTensor(fmt.Sprintf("blk.%d.ffn_exps_chunk_sha256", l), quant.F32,
			[]uint64{8, uint64(bo.NExpert * bl.nChunk)}, bl.chunks); err != nil {
			return nil, err
		}
	}
	for _, h := range bo.Hot {
		x, b := &bo.Layers[h[0]].ExpertLayout, hotData[h]
		d, ff := uint64(bo.DModel), uint64(bo.DFF)
		for _, p := range []struct {
			part string
			t    quant.Type
			dims []uint64
			data []byte
		}{{"gate", x.Gate, []uint64{d, ff}, b[0]}, {"up", x.Up, []uint64{d, ff}, b[1]}, {"down", x.Down, []uint64{ff, d}, b[2]}} {
			if err := w.AddTensor(hotTensorName(h[0], h[1], p.part), p.t, p.dims, p.data); err != nil {
				return nil, err
			}
		}
	}
	if err := w.WriteFile(path); err != nil {
		return nil, err
	}
	return bo, nil
}

// routedLayer returns layer l's routed experts of f (expert.FromTensors),
// their tensors' bytes from tensor, asked for concurrently.
func routedLayer(f *gguf.File, tensor func(name string) ([]byte, error), l int) (*expert.Layer, error) {
	var names []string
	for _, n := range []string{"ffn_gate_exps", "ffn_up_exps", "ffn_gate_up_exps", "ffn_down_exps"} {
		name := fmt.Sprintf("blk.%d.%s.weight", l, n)
		if _, err := f.TensorInfo(name); err == nil {
			names = append(names, name)
		}
	}
	data := make([][]byte, len(names))
	errs := make([]error, len(names))
	parallelFor(len(names), func(i int) { data[i], errs[i] = tensor(names[i]) })
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return expert.FromTensors(l, func(name string) (gguf.Tensor, error) {
		ti, err := f.TensorInfo(name)
		if err != nil {
			return gguf.Tensor{}, err
		}
		i := slices.Index(names, name)
		if uint64(len(data[i])) != ti.Size {
			return gguf.Tensor{}, fmt.Errorf("%w: tensor %q: %d bytes, want %d", ErrModel, name, len(data[i]), ti.Size)
		}
		return gguf.Tensor{TensorInfo: ti, Data: data[i]}, nil
	})
}

// hashExpert stores expert e of ly's SHA-256 and chunk SHA-256s (chunks of
// chunkSize bytes over gate || up || down) in bl.
func hashExpert(bl *BackboneLayer, ly *expert.Layer, e, chunkSize int) {
	h := sha256.New()
	c := sha256.New()
	ci, inChunk := 0, 0
	for _, part := range [][]byte{ly.Gate.Expert[e], ly.Up.Expert[e], ly.Down.Expert[e]} {
		h.Write(part)
		for len(part) > 0 {
			n := min(len(part), chunkSize-inChunk)
			c.Write(part[:n])
			part, inChunk = part[n:], inChunk+n
			if inChunk == chunkSize {
				c.Sum(bl.chunks[(e*bl.nChunk+ci)*32 : (e*bl.nChunk+ci)*32 : (e*bl.nChunk+ci+1)*32])
				c.Reset()
				ci, inChunk = ci+1, 0
			}
		}
	}
	if inChunk > 0 {
		c.Sum(bl.chunks[(e*bl.nChunk+ci)*32 : (e*bl.nChunk+ci)*32 : (e*bl.nChunk+ci+1)*32])
	}
	h.Sum(bl.sums[e*32 : e*32 : (e+1)*32])
}

// BackboneOnly describes a backbone-only file (ReadBackboneOnly): the
// full model it stands for and every routed expert's place in the full
// file, size and hashes.
type BackboneOnly struct {
	ModelID      string   // the full model's ModelID (announced by workers, in slice manifests)
	ModelSHA256  [32]byte // the full model's ModelID sum
	Architecture string   // general.architecture
	NLayer       int      // layers with routed experts (block_count)
	NExpert      int      // experts per layer
	DModel, DFF  int      // hidden size and expert FFN size, elements
	SourceSize   int64    // the full file's size, bytes
	SourceURL    string   // the default model source ("" if none)
	ChunkSize    int      // chunk size of the chunk hashes, bytes
	Layers       []BackboneLayer
	Hot          [][2]int // (layer, expert) pairs whose weights the file holds, sorted
}

// BackboneLayer is one layer of a BackboneOnly: its experts' layout in the
// full file and their hashes.
type BackboneLayer struct {
	ExpertLayout
	nChunk int
	sums   []byte // NExpert x 32
	chunks []byte // NExpert x nChunk x 32
}

// IsBackboneOnly reports whether f carries kvasir.backbone_only metadata.
func IsBackboneOnly(f *gguf.File) bool {
	_, ok := f.Value(KeyBackboneOnlyVersion)
	return ok
}

// ReadBackboneOnly reads and checks the backbone-only description of f
// (see the format above). The hash tables are copied, so the result stays
// valid after f is closed. Errors wrap ErrBackboneOnly (or ErrModel for a
// file without general.architecture or block_count).
func ReadBackboneOnly(f *gguf.File) (*BackboneOnly, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBackboneOnly}, a...)...)
	}
	v, err := f.Uint(KeyBackboneOnlyVersion)
	if err != nil {
		return nil, bad("%v", err)
	}
	if v != BackboneOnlyVersion {
		return nil, bad("version %d, this build reads %d", v, BackboneOnlyVersion)
	}
	arch, nl, err := modelLayers(f)
	if err != nil {
		return nil, err
	}
	bo := &BackboneOnly{Architecture: arch, NLayer: nl, Layers: make([]BackboneLayer, nl)}
	if bo.ModelID, err = f.String(KeyBackboneOnlyModelID); err != nil || bo.ModelID == "" || len(bo.ModelID) > 256 {
		return nil, bad("model id: %v", err)
	}
	s, err := f.String(KeyBackboneOnlySum)
	if err != nil || !isHex32(s) {
		return nil, bad("model_sha256 %q: %v", clipUTF8(s, 80), err)
	}
	bo.ModelSHA256 = hexSum(s)
	size, err := f.Uint(KeyBackboneOnlySize)
	if err != nil || size == 0 || size > 1<<56 {
		return nil, bad("source_size %d: %v", size, err)
	}
	bo.SourceSize = int64(size)
	if bo.SourceURL, err = f.String(KeyBackboneOnlyURL); err != nil {
		return nil, bad("%v", err)
	}
	chunk, err := f.Uint(KeyBackboneOnlyChunk)
	if err != nil || chunk < 4<<10 || chunk > 16<<20 {
		return nil, bad("chunk_size %d: %v", chunk, err)
	}
	bo.ChunkSize = int(chunk)
	sh, _ := moeshape.Read(f) // block_count was read by modelLayers
	bo.NExpert, bo.DModel, bo.DFF = moeshape.Int(sh.Experts), moeshape.Int(sh.DModel), moeshape.Int(sh.DFF)
	if bo.NExpert <= 0 || bo.NExpert > MaxExperts || bo.DModel <= 0 || bo.DModel > MaxDim || bo.DFF <= 0 || bo.DFF > MaxDim {
		return nil, bad("expert_count %d, embedding_length %d, expert_feed_forward_length %d", bo.NExpert, bo.DModel, bo.DFF)
	}
	arr := func(key string) ([]int64, error) {
		a, err := f.Ints(key)
		if err != nil || len(a) != nl {
			return nil, bad("%s: %d entries for %d layers (%v)", key, len(a), nl, err)
		}
		return a, nil
	}
	var cols [7][]int64
	for i, k := range []string{keyBOGateType, keyBOUpType, keyBODownType, keyBOFused, keyBOGateOff, keyBOUpOff, keyBODownOff} {
		if cols[i], err = arr(k); err != nil {
			return nil, err
		}
	}
	for l := range nl {
		bl := &bo.Layers[l]
		x := &bl.ExpertLayout
		x.Gate, x.Up, x.Down, x.Fused = quant.Type(cols[0][l]), quant.Type(cols[1][l]), quant.Type(cols[2][l]), cols[3][l] == 1
		if cols[3][l] > 1 || (x.Fused && x.Gate != x.Up) {
			return nil, bad("layer %d: fused %d with gate %v, up %v", l, cols[3][l], x.Gate, x.Up)
		}
		for _, t := range []quant.Type{x.Gate, x.Up, x.Down} {
			if !t.Supported() {
				return nil, bad("layer %d: expert type %v", l, t)
			}
		}
		g, _ := x.Gate.RowBytes(bo.DModel)
		u, _ := x.Up.RowBytes(bo.DModel)
		dn, _ := x.Down.RowBytes(bo.DFF)
		x.GateBytes, x.UpBytes, x.DownBytes = uint64(g*bo.DFF), uint64(u*bo.DFF), uint64(dn*bo.DModel)
		eb, err := expertBytes(x.Gate, x.Up, x.Down, bo.DModel, bo.DFF)
		if err != nil || eb != x.ExpertBytes() {
			return nil, bad("layer %d: expert size: %v", l, err)
		}
		x.GateOffset, x.UpOffset, x.DownOffset = uint64(cols[4][l]), uint64(cols[5][l]), uint64(cols[6][l])
		if x.Fused && x.UpOffset != x.GateOffset+x.GateBytes {
			return nil, bad("layer %d: fused up offset %d, want %d", l, x.UpOffset, x.GateOffset+x.GateBytes)
		}
		ne := uint64(bo.NExpert)
		spans := [][2]uint64{{x.GateOffset, x.GateBytes}, {x.UpOffset, x.UpBytes}, {x.DownOffset, x.DownBytes}}
		if x.Fused {
			spans = [][2]uint64{{x.GateOffset, x.GateBytes + x.UpBytes}, {x.DownOffset, x.DownBytes}}
		}
		for _, r := range spans {
			if r[0] > uint64(bo.SourceSize) || r[1]*ne > uint64(bo.SourceSize)-r[0] {
				return nil, bad("layer %d: expert bytes at %d run past the source size %d", l, r[0], bo.SourceSize)
			}
		}
		bl.nChunk = int((eb + int64(bo.ChunkSize) - 1) / int64(bo.ChunkSize))
		if bl.sums, err = hashTable(f, fmt.Sprintf("blk.%d.ffn_exps_sha256", l), bo.NExpert); err != nil {
			return nil, err
		}
		if bl.chunks, err = hashTable(f, fmt.Sprintf("blk.%d.ffn_exps_chunk_sha256", l), bo.NExpert*bl.nChunk); err != nil {
			return nil, err
		}
	}
	hot, err := f.Ints(KeyBackboneOnlyHot)
	if err != nil || len(hot)%2 != 0 {
		return nil, bad("hot list: %v", err)
	}
	seen := map[[2]int]bool{}
	for i := 0; i < len(hot); i += 2 {
		h := [2]int{int(hot[i]), int(hot[i+1])}
		if h[0] < 0 || h[0] >= nl || h[1] < 0 || h[1] >= bo.NExpert || seen[h] {
			return nil, bad("hot expert (%d, %d) out of range or repeated", h[0], h[1])
		}
		seen[h] = true
		bo.Hot = append(bo.Hot, h)
	}
	return bo, nil
}

// hashTable copies the F32 tensor name holding n SHA-256 sums (ne [8, n]).
func hashTable(f *gguf.File, name string, n int) ([]byte, error) {
	t, err := f.Tensor(name)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBackboneOnly, err)
	}
	if t.Type != quant.F32 || len(t.Dims) != 2 || t.Dims[0] != 8 || t.Dims[1] != uint64(n) || len(t.Data) != 32*n {
		return nil, fmt.Errorf("%w: %s is %v ne %v, want F32 ne [8 %d]", ErrBackboneOnly, name, t.Type, t.Dims, n)
	}
	return slices.Clone(t.Data), nil
}

// Sum returns the SHA-256 of expert e of layer l's file (HashExpert of
// the full model's expert); ok is false out of range.
func (b *BackboneOnly) Sum(l, e int) (sum [32]byte, ok bool) {
	if l < 0 || l >= b.NLayer || e < 0 || e >= b.NExpert {
		return sum, false
	}
	copy(sum[:], b.Layers[l].sums[e*32:])
	return sum, true
}

// ChunkSums returns the SHA-256s of expert e of layer l's ChunkSize-byte
// chunks; nil out of range.
func (b *BackboneOnly) ChunkSums(l, e int) [][32]byte {
	if l < 0 || l >= b.NLayer || e < 0 || e >= b.NExpert {
		return nil
	}
	bl := &b.Layers[l]
	out := make([][32]byte, bl.nChunk)
	for i := range out {
		copy(out[i][:], bl.chunks[(e*bl.nChunk+i)*32:])
	}
	return out
}

// Ranges returns expert e of layer l's bytes in the full file (see
// ExpertLayout.Ranges); nil out of range.
func (b *BackboneOnly) Ranges(l, e int) []Range {
	if l < 0 || l >= b.NLayer || e < 0 || e >= b.NExpert {
		return nil
	}
	return b.Layers[l].Ranges(e)
}

// Bytes returns the total size in bytes of every routed expert.
func (b *BackboneOnly) Bytes() int64 {
	var n int64
	for i := range b.Layers {
		n += b.Layers[i].ExpertBytes() * int64(b.NExpert)
	}
	return n
}

// LeftOutBytes returns the size in bytes of the routed experts the file
// does not hold: Bytes less the hot experts kept in it.
func (b *BackboneOnly) LeftOutBytes() int64 {
	n := b.Bytes()
	for _, h := range b.Hot {
		if h[0] >= 0 && h[0] < len(b.Layers) {
			n -= b.Layers[h[0]].ExpertBytes()
		}
	}
	return n
}

// CheckHot verifies the hot experts of the loaded layers (one per layer;
// engine/model.Model.LocalExperts().Layer(l) of the backbone-only file)
// against the stored hashes. Errors wrap ErrCorrupt or ErrBackboneOnly.
func (b *BackboneOnly) CheckHot(layer func(l int) *expert.Layer) error {
	for _, h := range b.Hot {
		got, ok := HashExpert(layer(h[0]), h[1])
		want, _ := b.Sum(h[0], h[1])
		if !ok {
			return fmt.Errorf("%w: hot expert (%d, %d) not loaded", ErrBackboneOnly, h[0], h[1])
		}
		if got != want {
			return fmt.Errorf("%w: hot expert (%d, %d) of the backbone-only file", ErrCorrupt, h[0], h[1])
		}
	}
	return nil
}
