package wire

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Provisioning frames (protocol version 2): the backbone assigns experts to
// a worker (ASSIGN), the worker fetches each expert's bytes in chunks over
// the same connection (CHUNK_REQ -> CHUNK), verifies every chunk against the
// chunk hashes in ASSIGN and the whole file against its SHA-256, and
// announces what it added or dropped (HOLDINGS). Layouts next to the Type
// constants; docs/protocol.md has the flow.

// LayerTypes gives the ggml tensor type ids (quant.Type values, ggml.h
// enum ggml_type) of one layer's gate, up and down expert matrices, which a
// worker writes into its slice manifest.
type LayerTypes struct {
	Layer          uint16
	Gate, Up, Down uint32
}

// Assigned is one expert of an ASSIGN: its file size in bytes, the SHA-256
// of the whole file (gate || up || down, as engine/slice stores it) and the
// SHA-256 of each chunk: chunk i covers bytes [i*ChunkSize,
// min(Size, (i+1)*ChunkSize)). With an ASSIGN source, Ranges are the
// expert file's bytes in the source file, in order (lengths summing to
// Size); without, none.
type Assigned struct {
	Layer  uint16
	Expert uint32
	Size   uint64
	SHA256 [32]byte
	Chunks [][32]byte // ceil(Size / ChunkSize) entries
	Ranges []Range    // 0 without a source, else 1..MaxRanges
}

// Range is Len bytes at Offset of the model source file.
type Range struct{ Offset, Len uint64 }

// Assign is the complete set of experts a worker should hold, in the
// backbone's priority order (most routed first), with the model header a
// worker needs to write them into a slice directory.
type Assign struct {
	ModelID     string   // <= MaxModelID bytes of UTF-8 (engine/slice.ModelID)
	ModelSHA256 [32]byte // engine/slice.ModelID's sum
	Arch        string   // general.architecture, 1..MaxArch bytes of UTF-8
	DFF         uint32   // expert FFN size, elements (> 0)
	ChunkSize   uint32   // bytes per chunk, MinChunk..MaxChunk
	// Source is the http:// or https:// URL of the full model file the
	// worker fetches the experts' bytes from (range requests), <=
	// MaxSource bytes; "" means CHUNK_REQ to the backbone.
	Source  string
	Layers  []LayerTypes
	Experts []Assigned // each (layer, expert) once, its layer in Layers
}

// ChunkReq asks for Len bytes at Offset of an assigned expert's file.
type ChunkReq struct {
	Layer  uint16
	Expert uint32
	Offset uint64
	Len    uint32 // 1..MaxChunk
}

// Chunk carries bytes [Offset, Offset+len(Data)) of an expert's file.
type Chunk struct {
	Layer  uint16
	Expert uint32
	Offset uint64
	Data   []byte // 1..MaxChunk bytes
}

// Holdings updates the worker's holdings and quota: Add lists experts now
// held (downloaded and verified) with their SHA-256, Drop experts no longer
// held (SHA256 unused, zero). An expert appears at most once in Add and Drop
// together.
type Holdings struct {
	Quota uint64 // the slice's disk quota now, bytes
	Add   []Holding
	Drop  []Holding
}

// Type returns TypeAssign.
func (*Assign) Type() Type { return TypeAssign }

// Type returns TypeChunkReq.
func (*ChunkReq) Type() Type { return TypeChunkReq }

// Type returns TypeChunk.
func (*Chunk) Type() Type { return TypeChunk }

// Type returns TypeHoldings.
func (*Holdings) Type() Type { return TypeHoldings }

// NumChunks returns ceil(size / chunk), the chunk count of an expert of size
// bytes (0 when chunk is 0).
func NumChunks(size uint64, chunk uint32) int {
	if chunk == 0 {
		return 0
	}
	return int((size + uint64(chunk) - 1) / uint64(chunk))
}

// Append encodes the ASSIGN; strings longer than their maximum are cut.
func (a *Assign) Append(b []byte) []byte {
	b = appendHeader(b, TypeAssign)
	b = appendStr(b, clip(a.ModelID, MaxModelID))
	b = append(b, a.ModelSHA256[:]...)
	b = appendStr(b, clip(a.Arch, MaxArch))
	b = le.AppendUint32(b, a.DFF)
	b = le.AppendUint32(b, a.ChunkSize)
	b = appendStr(b, clip(a.Source, MaxSource))
	b = le.AppendUint16(b, uint16(len(a.Layers)))
	for _, l := range a.Layers {
		b = le.AppendUint16(b, l.Layer)
		b = le.AppendUint32(b, l.Gate)
		b = le.AppendUint32(b, l.Up)
		b = le.AppendUint32(b, l.Down)
	}
	b = le.AppendUint32(b, uint32(len(a.Experts)))
	for _, e := range a.Experts {
		b = le.AppendUint16(b, e.Layer)
		b = le.AppendUint32(b, e.Expert)
		b = le.AppendUint64(b, e.Size)
		b = append(b, e.SHA256[:]...)
		b = le.AppendUint32(b, uint32(len(e.Chunks)))
		for _, c := range e.Chunks {
			b = append(b, c[:]...)
		}
		b = append(b, byte(len(e.Ranges)))
		for _, r := range e.Ranges {
			b = le.AppendUint64(b, r.Offset)
			b = le.AppendUint64(b, r.Len)
		}
	}
	return b
}

// ChunkReqSize is the encoded size of a CHUNK_REQ in bytes: 4 + 18.
const ChunkReqSize = HeaderSize + 18

// ChunkSize returns the encoded size in bytes of a CHUNK carrying n bytes:
// 4 + 18 + n.
func ChunkSize(n int) int { return HeaderSize + 18 + n }

// Append encodes the CHUNK_REQ.
func (c *ChunkReq) Append(b []byte) []byte {
	b = appendHeader(b, TypeChunkReq)
	b = le.AppendUint16(b, c.Layer)
	b = le.AppendUint32(b, c.Expert)
	b = le.AppendUint64(b, c.Offset)
	return le.AppendUint32(b, c.Len)
}

// Append encodes the CHUNK.
func (c *Chunk) Append(b []byte) []byte {
	b = appendHeader(b, TypeChunk)
	b = le.AppendUint16(b, c.Layer)
	b = le.AppendUint32(b, c.Expert)
	b = le.AppendUint64(b, c.Offset)
	b = le.AppendUint32(b, uint32(len(c.Data)))
	return append(b, c.Data...)
}

// Append encodes the HOLDINGS (Drop entries without their SHA256).
func (h *Holdings) Append(b []byte) []byte {
	b = appendHeader(b, TypeHoldings)
	b = le.AppendUint64(b, h.Quota)
	b = appendHoldings(b, h.Add)
	b = le.AppendUint32(b, uint32(len(h.Drop)))
	for _, x := range h.Drop {
		b = le.AppendUint16(b, x.Layer)
		b = le.AppendUint32(b, x.Expert)
	}
	return b
}

// minAssigned is the encoded size of an ASSIGN entry without chunk hashes
// and ranges.
const minAssigned = 2 + 4 + 8 + 32 + 4 + 1

func decodeAssign(r *reader, lim *Limits) (*Assign, error) {
	a := &Assign{ModelID: r.str(MaxModelID, "model id")}
	copy(a.ModelSHA256[:], r.take(32, "model sha256"))
	a.Arch = r.str(MaxArch, "architecture")
	a.DFF = r.u32("d_ff")
	a.ChunkSize = r.u32("chunk size")
	a.Source = r.str(MaxSource, "source")
	nlt := int(r.u16("layer count"))
	if r.err != nil {
		return nil, r.err
	}
	if a.Source != "" && !(strings.HasPrefix(a.Source, "http://") || strings.HasPrefix(a.Source, "https://")) {
		return nil, fmt.Errorf("%w: assign source is not an http(s) URL", ErrRange)
	}
	if a.Arch == "" || a.DFF == 0 || a.ChunkSize < MinChunk || a.ChunkSize > MaxChunk || !utf8.ValidString(a.Arch) {
		return nil, fmt.Errorf("%w: assign arch %d bytes, d_ff %d, chunk %d", ErrRange, len(a.Arch), a.DFF, a.ChunkSize)
	}
	if nlt*14 > len(r.b) {
		return nil, fmt.Errorf("%w: %d layer types", ErrTruncated, nlt)
	}
	a.Layers = make([]LayerTypes, nlt)
	layers := map[uint16]bool{}
	for i := range a.Layers {
		l := &a.Layers[i]
		l.Layer, l.Gate, l.Up, l.Down = r.u16("layer"), r.u32("gate type"), r.u32("up type"), r.u32("down type")
		if err := checkExpert(lim, l.Layer, 0, "assign"); err != nil {
			return nil, err
		}
		if layers[l.Layer] {
			return nil, fmt.Errorf("%w: assign layer %d listed twice", ErrRange, l.Layer)
		}
		layers[l.Layer] = true
	}
	n := r.u32("expert count")
	if r.err != nil {
		return nil, r.err
	}
	if n > MaxHoldings {
		return nil, fmt.Errorf("%w: %d assigned experts > %d", ErrTooLarge, n, MaxHoldings)
	}
	if uint64(n)*minAssigned > uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: %d assigned experts", ErrTruncated, n)
	}
	a.Experts = make([]Assigned, n)
	seen := make(map[uint64]bool, n)
	for i := range a.Experts {
		e := &a.Experts[i]
		e.Layer, e.Expert, e.Size = r.u16("layer"), r.u32("expert"), r.u64("size")
		copy(e.SHA256[:], r.take(32, "sha256"))
		nc := r.u32("chunk count")
		if r.err != nil {
			return nil, r.err
		}
		if err := checkExpert(lim, e.Layer, e.Expert, "assign"); err != nil {
			return nil, err
		}
		k := uint64(e.Layer)<<32 | uint64(e.Expert)
		switch {
		case !layers[e.Layer]:
			return nil, fmt.Errorf("%w: assign expert (%d, %d) of a layer without types", ErrRange, e.Layer, e.Expert)
		case seen[k]:
			return nil, fmt.Errorf("%w: assign expert (%d, %d) listed twice", ErrRange, e.Layer, e.Expert)
		case e.Size == 0 || e.Size > MaxExpertSize:
			return nil, fmt.Errorf("%w: assign expert size %d", ErrRange, e.Size)
		case int(nc) != NumChunks(e.Size, a.ChunkSize):
			return nil, fmt.Errorf("%w: %d chunk hashes for %d bytes in chunks of %d", ErrShape, nc, e.Size, a.ChunkSize)
		case uint64(nc)*32 > uint64(len(r.b)):
			return nil, fmt.Errorf("%w: %d chunk hashes", ErrTruncated, nc)
		}
		seen[k] = true
		e.Chunks = make([][32]byte, nc)
		for j := range e.Chunks {
			copy(e.Chunks[j][:], r.take(32, "chunk sha256"))
		}
		nr := int(r.u8("range count"))
		if r.err != nil {
			return nil, r.err
		}
		if (a.Source == "") != (nr == 0) || nr > MaxRanges {
			return nil, fmt.Errorf("%w: assign expert (%d, %d) has %d byte ranges (source %v)", ErrRange, e.Layer, e.Expert, nr, a.Source != "")
		}
		var total uint64
		for range nr {
			rg := Range{Offset: r.u64("range offset"), Len: r.u64("range len")}
			if r.err != nil {
				return nil, r.err
			}
			if rg.Len == 0 || rg.Len > MaxExpertSize || rg.Offset > 1<<62 {
				return nil, fmt.Errorf("%w: assign expert (%d, %d) range %d+%d", ErrRange, e.Layer, e.Expert, rg.Offset, rg.Len)
			}
			total += rg.Len
			e.Ranges = append(e.Ranges, rg)
		}
		if nr > 0 && total != e.Size {
			return nil, fmt.Errorf("%w: assign expert (%d, %d) ranges hold %d bytes, size %d", ErrShape, e.Layer, e.Expert, total, e.Size)
		}
	}
	return a, r.err
}

func decodeChunkReq(r *reader, lim *Limits) (*ChunkReq, error) {
	c := &ChunkReq{Layer: r.u16("layer"), Expert: r.u32("expert"), Offset: r.u64("offset"), Len: r.u32("len")}
	if r.err != nil {
		return nil, r.err
	}
	if err := checkExpert(lim, c.Layer, c.Expert, "chunk request"); err != nil {
		return nil, err
	}
	if c.Len == 0 || c.Len > MaxChunk || c.Offset >= MaxExpertSize {
		return nil, fmt.Errorf("%w: chunk request offset %d len %d", ErrRange, c.Offset, c.Len)
	}
	return c, nil
}

func decodeChunk(r *reader, lim *Limits) (*Chunk, error) {
	c := &Chunk{Layer: r.u16("layer"), Expert: r.u32("expert"), Offset: r.u64("offset")}
	n := r.u32("n")
	if r.err != nil {
		return nil, r.err
	}
	if err := checkExpert(lim, c.Layer, c.Expert, "chunk"); err != nil {
		return nil, err
	}
	if n == 0 || n > MaxChunk || c.Offset >= MaxExpertSize {
		return nil, fmt.Errorf("%w: chunk offset %d n %d", ErrRange, c.Offset, n)
	}
	if int(n) != len(r.b) {
		return nil, fmt.Errorf("%w: chunk of %d bytes, %d left", ErrTruncated, n, len(r.b))
	}
	c.Data = append([]byte(nil), r.take(int(n), "data")...)
	return c, r.err
}

func decodeHoldings(r *reader, lim *Limits) (*Holdings, error) {
	h := &Holdings{Quota: r.u64("quota")}
	seen := map[uint64]struct{}{}
	var err error
	if h.Add, err = readHoldings(r, lim, seen, true); err != nil {
		return nil, err
	}
	if h.Drop, err = readHoldings(r, lim, seen, false); err != nil {
		return nil, err
	}
	return h, nil
}
