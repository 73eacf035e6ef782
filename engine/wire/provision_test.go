package wire

import (
	"bytes"
	"errors"
	"testing"
)

// TestProvisionBytes checks CHUNK_REQ, CHUNK and HOLDINGS bytes against the
// layouts next to the Type constants (worked by hand).
func TestProvisionBytes(t *testing.T) {
	req := (&ChunkReq{Layer: 2, Expert: 0x0102, Offset: 0x10000, Len: 0x8000}).Append(nil)
	want := []byte{0x6B, 7, 0, 0x0A,
		2, 0, // layer
		2, 1, 0, 0, // expert
		0, 0, 1, 0, 0, 0, 0, 0, // offset 65536
		0, 0x80, 0, 0} // len 32768
	if !bytes.Equal(req, want) || len(req) != ChunkReqSize {
		t.Fatalf("chunk req = % x\nwant        % x", req, want)
	}
	ch := (&Chunk{Layer: 1, Expert: 3, Offset: 5, Data: []byte{9, 8}}).Append(nil)
	want = []byte{0x6B, 7, 0, 0x0B, 1, 0, 3, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 9, 8}
	if !bytes.Equal(ch, want) || len(ch) != ChunkSize(2) {
		t.Fatalf("chunk = % x\nwant    % x", ch, want)
	}
	h := (&Holdings{Quota: 256, Drop: []Holding{{Layer: 1, Expert: 2}}}).Append(nil)
	want = []byte{0x6B, 7, 0, 0x0C, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 2, 0, 0, 0}
	if !bytes.Equal(h, want) {
		t.Fatalf("holdings = % x\nwant       % x", h, want)
	}
	for _, c := range []struct {
		size  uint64
		chunk uint32
		want  int
	}{{1, 4096, 1}, {4096, 4096, 1}, {4097, 4096, 2}, {110592, 1 << 16, 2}, {5, 0, 0}} {
		if got := NumChunks(c.size, c.chunk); got != c.want {
			t.Errorf("NumChunks(%d, %d) = %d, want %d", c.size, c.chunk, got, c.want)
		}
	}
}

func TestProvisionRejects(t *testing.T) {
	lim := testLimits()
	assign := func(mod func(a *Assign)) []byte {
		a := &Assign{ModelID: "m", Arch: "qwen3moe", DFF: 8, ChunkSize: 4096,
			Layers:  []LayerTypes{{Layer: 1, Gate: 8, Up: 8, Down: 8}},
			Experts: []Assigned{{Layer: 1, Expert: 2, Size: 5000, Chunks: make([][32]byte, 2)}}}
		mod(a)
		return a.Append(nil)
	}
	cases := []struct {
		name string
		msg  []byte
		want error
	}{
		{"chunk size small", assign(func(a *Assign) { a.ChunkSize = 100 }), ErrRange},
		{"chunk size big", assign(func(a *Assign) { a.ChunkSize = MaxChunk + 1 }), ErrRange},
		{"no arch", assign(func(a *Assign) { a.Arch = "" }), ErrRange},
		{"chunk count", assign(func(a *Assign) { a.Experts[0].Chunks = a.Experts[0].Chunks[:1] }), ErrShape},
		{"size 0", assign(func(a *Assign) { a.Experts[0].Size = 0; a.Experts[0].Chunks = nil }), ErrRange},
		{"layer without types", assign(func(a *Assign) { a.Experts[0].Layer = 2 }), ErrRange},
		{"layer range", assign(func(a *Assign) { a.Layers[0].Layer = 4 }), ErrRange},
		{"expert range", assign(func(a *Assign) { a.Experts[0].Expert = 8 }), ErrRange},
		{"dup expert", assign(func(a *Assign) { a.Experts = append(a.Experts, a.Experts[0]) }), ErrRange},
		{"dup layer", assign(func(a *Assign) { a.Layers = append(a.Layers, a.Layers[0]) }), ErrRange},
		{"assign trailing", append(assign(func(*Assign) {}), 0), ErrTrailing},
		{"source not http", assign(func(a *Assign) { a.Source = "file:///etc/passwd"; a.Experts[0].Ranges = []Range{{0, 5000}} }), ErrRange},
		{"source without ranges", assign(func(a *Assign) { a.Source = "http://h/m" }), ErrRange},
		{"ranges without source", assign(func(a *Assign) { a.Experts[0].Ranges = []Range{{0, 5000}} }), ErrRange},
		{"ranges short", assign(func(a *Assign) { a.Source = "http://h/m"; a.Experts[0].Ranges = []Range{{0, 4999}} }), ErrShape},
		{"range empty", assign(func(a *Assign) { a.Source = "http://h/m"; a.Experts[0].Ranges = []Range{{0, 5000}, {9, 0}} }), ErrRange},
		{"too many ranges", assign(func(a *Assign) {
			a.Source = "http://h/m"
			a.Experts[0].Ranges = make([]Range, MaxRanges+1)
			for i := range a.Experts[0].Ranges {
				a.Experts[0].Ranges[i] = Range{uint64(i) * 1000, 500}
			}
			a.Experts[0].Ranges[0].Len = 5000 - 500*MaxRanges
		}), ErrRange},
		{"version 2", func() []byte { b := assign(func(*Assign) {}); b[1] = 2; return b }(), ErrVersion},
		// ASSIGN claiming 2^32-1 experts in a short message: refused before allocating.
		{"assign huge n", append(assign(func(a *Assign) { a.Experts = nil })[:len(assign(func(a *Assign) { a.Experts = nil }))-4], 0xFF, 0xFF, 0xFF, 0xFF), ErrTooLarge},
		{"req len 0", (&ChunkReq{Layer: 1, Len: 0}).Append(nil), ErrRange},
		{"req len big", (&ChunkReq{Layer: 1, Len: MaxChunk + 1}).Append(nil), ErrRange},
		{"req layer", (&ChunkReq{Layer: 4, Len: 1}).Append(nil), ErrRange},
		{"chunk empty", (&Chunk{Layer: 1}).Append(nil), ErrRange},
		{"chunk short", (&Chunk{Layer: 1, Data: []byte{1, 2}}).Append(nil)[:ChunkSize(2)-1], ErrTruncated},
		{"chunk long", append((&Chunk{Layer: 1, Data: []byte{1, 2}}).Append(nil), 3), ErrTruncated},
		{"holdings dup", (&Holdings{Add: []Holding{{Layer: 1, Expert: 2}}, Drop: []Holding{{Layer: 1, Expert: 2}}}).Append(nil), ErrRange},
		{"holdings range", (&Holdings{Drop: []Holding{{Layer: 1, Expert: 9}}}).Append(nil), ErrRange},
		{"holdings short", (&Holdings{Drop: []Holding{{Layer: 1, Expert: 2}}}).Append(nil)[:20], ErrTruncated},
	}
	for _, c := range cases {
		f, err := Decode(c.msg, lim)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v (frame %v), want %v", c.name, err, f, c.want)
		}
	}
}

// FuzzProvision feeds mutations of valid, truncated and oversized ASSIGN,
// CHUNK_REQ, CHUNK and HOLDINGS messages to Decode: no panic, and what is
// accepted re-encodes to the same bytes.
func FuzzProvision(f *testing.F) {
	for _, fr := range sampleFrames()[9:] {
		msg := fr.Append(nil)
		f.Add(msg)
		f.Add(msg[:len(msg)-1])
		f.Add(append(msg, 7))
	}
	// CHUNK claiming 2^32-1 bytes; HOLDINGS claiming 2^32-1 adds.
	f.Add([]byte{Magic, byte(Version), 0, 0x0B, 1, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 1})
	f.Add([]byte{Magic, byte(Version), 0, 0x0C, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF})
	f.Fuzz(func(t *testing.T, msg []byte) {
		fr, err := Decode(msg, testLimits())
		if err != nil {
			return
		}
		if again := fr.Append(nil); !bytes.Equal(again, msg) {
			t.Fatalf("%s re-encodes differently:\n in % x\nout % x", fr.Type(), msg, again)
		}
	})
}
