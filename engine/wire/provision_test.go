package wire

import (
	"bytes"
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

// assignMsg is a valid ASSIGN under testLimits (one expert of layer 1 in
// two chunks) after mod.
func assignMsg(mod func(a *Assign)) []byte {
	a := &Assign{ModelID: "m", Arch: "qwen3moe", DFF: 8, ChunkSize: 4096,
		Layers:  []LayerTypes{{Layer: 1, Gate: 8, Up: 8, Down: 8}},
		Experts: []Assigned{{Layer: 1, Expert: 2, Size: 5000, Chunks: make([][32]byte, 2)}}}
	mod(a)
	return a.Append(nil)
}

// FuzzProvision feeds mutations of valid, truncated and oversized ASSIGN,
// CHUNK_REQ, CHUNK and HOLDINGS messages to Decode: no panic, and what is
// accepted re-encodes to the same bytes.
func FuzzProvision(f *testing.F) {
	for _, fr := range sampleFrames() {
		switch fr.(type) {
		case *Assign, *ChunkReq, *Chunk, *Holdings:
		default:
			continue
		}
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
