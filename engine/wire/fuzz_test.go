package wire

import (
	"bufio"
	"bytes"
	"testing"
)

// FuzzDecode feeds arbitrary messages to Decode: it must never panic, and
// whatever it accepts must re-encode to the same bytes.
func FuzzDecode(f *testing.F) {
	for _, fr := range sampleFrames() {
		msg := fr.Append(nil)
		f.Add(msg)
		f.Add(msg[:len(msg)/2])
		f.Add(append(msg, 0, 1, 2))
	}
	f.Add([]byte{})
	f.Add([]byte{Magic, 2, 0})
	// DISPATCH header claiming 2^32-1 rows of 2^32-1 floats.
	f.Add([]byte{Magic, 2, 0, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 2, 0})
	f.Fuzz(func(t *testing.T, msg []byte) {
		lim := testLimits()
		lim.Holds = func(l, e int) bool { return e%2 == 1 }
		fr, err := Decode(msg, lim)
		if err != nil {
			return
		}
		if again := fr.Append(nil); !bytes.Equal(again, msg) {
			t.Fatalf("%s re-encodes differently:\n in % x\nout % x", fr.Type(), msg, again)
		}
	})
}

// FuzzReadLink checks the link reader never panics or over-reads.
func FuzzReadLink(f *testing.F) {
	var buf bytes.Buffer
	_ = WriteLinkPreamble(&buf, "s", "w")
	_ = WriteLink(&buf, LinkData, []byte("hello"))
	f.Add(buf.Bytes())
	f.Add([]byte("KVLK\x01\x00\xff\xff"))
	f.Add([]byte{0xFF, 0xFF, 0xFF, 0x7F, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		r := bufio.NewReader(bytes.NewReader(b))
		_, _, _ = ReadLinkPreamble(r)
		for i := 0; i < 8; i++ {
			if _, _, err := ReadLink(r); err != nil {
				return
			}
		}
	})
}

// FuzzDigestCredit checks the hub's DIGEST metering never panics, and that
// whatever it meters is a DIGEST Decode accepts with that size (at a d and
// m the decoder's limits allow).
func FuzzDigestCredit(f *testing.F) {
	f.Add((&Digest{Request: 3, M: 2, D: 3}).Append(nil))
	f.Add((&Digest{Request: 3, M: 1 << 20, D: 1 << 12}).Append(nil))
	f.Add((&Result{Request: 3, M: 1, D: 3, Out: make([]float32, 3)}).Append(nil))
	f.Add([]byte{Magic, byte(Version), 0, byte(TypeDigest)})
	f.Fuzz(func(t *testing.T, msg []byte) {
		req, n, ok := DigestCredit(msg)
		if !ok {
			return
		}
		fr, err := Decode(msg, &Limits{D: int(le.Uint32(msg[HeaderSize+12:]))})
		if err != nil {
			t.Fatalf("DigestCredit metered %d bytes of a DIGEST Decode refuses: %v", n, err)
		}
		g := fr.(*Digest)
		if g.Request != req || ResultSize(g.M, g.D) != n || n > MaxMessage {
			t.Fatalf("metered %d for req %d, decoded %+v", n, req, g)
		}
	})
}
