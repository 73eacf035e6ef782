package wire

import (
	"bufio"
	"bytes"
	"errors"
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
		// The same bytes through ReadLink and through ReadLinkBuf reusing
		// its last payload: the same frames, the same end.
		r, rb := bufio.NewReader(bytes.NewReader(b)), bufio.NewReader(bytes.NewReader(b))
		_, _, _ = ReadLinkPreamble(r)
		_, _, _ = ReadLinkPreamble(rb)
		var buf []byte
		for i := 0; i < 8; i++ {
			k, p, err := ReadLink(r)
			kb, pb, errb := ReadLinkBuf(rb, buf)
			if (err == nil) != (errb == nil) || k != kb || !bytes.Equal(p, pb) {
				t.Fatalf("frame %d: ReadLink %d %x %v, ReadLinkBuf %d %x %v", i, k, p, err, kb, pb, errb)
			}
			if err != nil {
				return
			}
			buf = pb[:0]
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

// FuzzSumCredit checks the hub's DISPATCH_SUM metering never panics: a
// DISPATCH_SUM SumRequest accepts has the length Decode wants for its
// shape (Decode never finds it truncated), and SumCredit credits only a
// RESULT Decode accepts, of exactly n rows, as ResultSize(n*k, d).
func FuzzSumCredit(f *testing.F) {
	ds := (&Dispatch{Request: 3, Layer: 1, N: 2, D: 3, K: 2, Hidden: make([]float32, 6), IDs: []int32{1, 2, 3, 4},
		Sum: true, Weights: []float32{0.5, 0.5, 1, 0}}).Append(nil)
	res := (&Result{Request: 3, M: 2, D: 3, Out: make([]float32, 6)}).Append(nil)
	f.Add(ds, res)
	f.Add(ds[:len(ds)-4], res[:len(res)-1])
	f.Add((&Dispatch{Request: 3, Layer: 1, N: 1, D: 3, K: 2, Hidden: make([]float32, 3), IDs: []int32{1, 2}}).Append(nil), res)
	f.Add([]byte{Magic, byte(Version), 0, byte(TypeDispatchSum)}, []byte{Magic, byte(Version), 0, byte(TypeResult)})
	f.Fuzz(func(t *testing.T, disp, result []byte) {
		n, d, k, ok := checkSumRequest(t, disp)
		if !ok {
			return
		}
		size, ok := SumCredit(result, n, d, k)
		if !ok {
			return
		}
		fr, err := Decode(result, &Limits{D: d})
		if err != nil {
			t.Fatalf("SumCredit metered %d bytes of a RESULT Decode refuses: %v", size, err)
		}
		if r := fr.(*Result); r.M != n || size != ResultSize(n*k, d) {
			t.Fatalf("metered %d for %+v of a sum of %d x %d", size, r, n, k)
		}
	})
}

// FuzzSumDigestCredit checks the hub's DISPATCH_SUM_DIGEST metering never
// panics: SumRequest accepts a DISPATCH_SUM_DIGEST of the length Decode
// wants, and SumDigestCredit credits only a DIGEST Decode accepts, of
// exactly n rows of d, as ResultSize(n*k, d).
func FuzzSumDigestCredit(f *testing.F) {
	ds := (&Dispatch{Request: 3, Layer: 1, N: 2, D: 3, K: 2, Hidden: make([]float32, 6), IDs: []int32{1, 2, 3, 4},
		Sum: true, Digest: true, Weights: []float32{0.5, 0.5, 1, 0}}).Append(nil)
	dg := (&Digest{Request: 3, M: 2, D: 3}).Append(nil)
	f.Add(ds, dg)
	f.Add(ds[:len(ds)-4], dg[:len(dg)-1])
	f.Add(ds, (&Result{Request: 3, M: 2, D: 3, Out: make([]float32, 6)}).Append(nil))
	f.Add([]byte{Magic, byte(Version), 0, byte(TypeDispatchSumDigest)}, []byte{Magic, byte(Version), 0, byte(TypeDigest)})
	f.Fuzz(func(t *testing.T, disp, digest []byte) {
		n, d, k, ok := checkSumRequest(t, disp)
		if !ok {
			return
		}
		size, ok := SumDigestCredit(digest, n, d, k)
		if !ok {
			return
		}
		fr, err := Decode(digest, &Limits{D: d})
		if err != nil {
			t.Fatalf("SumDigestCredit metered %d bytes of a DIGEST Decode refuses: %v", size, err)
		}
		if g := fr.(*Digest); g.M != n || g.D != d || size != ResultSize(n*k, d) {
			t.Fatalf("metered %d for %+v of a sum of %d x %d", size, g, n, k)
		}
	})
}

// checkSumRequest is the hub's reading of a forwarded DISPATCH_SUM or
// DISPATCH_SUM_DIGEST (SumRequest), checked against Decode: what it
// accepts and Decode decodes says the same request, rows, width and slots,
// and it never accepts one of a length Decode refuses.
func checkSumRequest(t *testing.T, disp []byte) (n, d, k int, ok bool) {
	req, n, d, k, ok := SumRequest(disp)
	if !ok {
		return 0, 0, 0, false
	}
	lim := &Limits{D: d, K: k, NLayer: 1 << 16, NExpert: 1 << 30}
	if fr, err := Decode(disp, lim); err == nil {
		g := fr.(*Dispatch)
		if !g.Sum || g.Request != req || g.N != n || g.D != d || g.K != k {
			t.Fatalf("SumRequest %d %d %d %d, decoded %+v", req, n, d, k, g)
		}
	} else if errors.Is(err, ErrTruncated) || errors.Is(err, ErrTrailing) {
		t.Fatalf("SumRequest accepted a DISPATCH_SUM(_DIGEST) of the wrong length: %v", err)
	}
	return n, d, k, true
}
