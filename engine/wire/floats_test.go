package wire

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestFloatsEncoding: AppendFloats and getFloats carry every bit of every
// float32 (signalling and quiet NaN payloads, infinities, -0, subnormals,
// random bits) as little-endian uint32s, against encoding/binary's
// encoding of math.Float32bits; the one-copy path of a little-endian host
// and the per-float path give the same bytes and the same floats.
func TestFloatsEncoding(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	bits := []uint32{0x7fa00001, 0x7fc00000, 0xffc12345, 0x7f800000, 0xff800000, 0x80000000, 0x00000001, 0x807fffff}
	for range 1000 {
		bits = append(bits, rng.Uint32())
	}
	v := make([]float32, len(bits))
	want := make([]byte, 0, 4*len(bits)+3)
	want = append(want, 1, 2, 3) // AppendFloats appends after what is there
	for i, u := range bits {
		v[i] = math.Float32frombits(u)
		want = binary.LittleEndian.AppendUint32(want, u)
	}
	defer func(h bool) { hostLittleEndian = h }(hostLittleEndian)
	for _, fast := range []bool{true, false} {
		hostLittleEndian = fast && hostLittleEndian
		got := AppendFloats([]byte{1, 2, 3}, v)
		if !bytes.Equal(got, want) {
			t.Fatalf("fast=%v: AppendFloats differs from the little-endian bits", fast)
		}
		back := make([]float32, len(bits))
		getFloats(back, want[3:])
		for i := range back {
			if math.Float32bits(back[i]) != bits[i] {
				t.Fatalf("fast=%v: float %d decoded as %#08x, want %#08x", fast, i, math.Float32bits(back[i]), bits[i])
			}
		}
		if got := AppendFloats(nil, nil); len(got) != 0 {
			t.Fatalf("fast=%v: AppendFloats(nil, nil) = %v", fast, got)
		}
	}
}

// BenchmarkFloatFrames encodes and decodes the two frames that carry a
// swarm's floats, at a 30B-A3B layer's shape (d 2048, k 8): a 256-row
// DISPATCH_SUM and its 256-row RESULT (row sums). SetBytes is the frame
// bytes, so MB/s is the codec's throughput.
func BenchmarkFloatFrames(b *testing.B) {
	const n, d, k = 256, 2048, 8
	rng := rand.New(rand.NewPCG(5, 6))
	disp := &Dispatch{Request: 1, Layer: 3, N: n, D: d, K: k, Sum: true,
		Hidden: make([]float32, n*d), IDs: make([]int32, n*k), Weights: make([]float32, n*k)}
	for i := range disp.Hidden {
		disp.Hidden[i] = float32(rng.NormFloat64())
	}
	for i := range disp.IDs {
		disp.IDs[i], disp.Weights[i] = int32(i%k*16), 1/float32(k)
	}
	res := &Result{Request: 1, M: n, D: d, Out: disp.Hidden}
	lim := &Limits{D: d, K: k, NLayer: 48, NExpert: 128}
	for _, f := range []Frame{disp, res} {
		msg := f.Append(nil)
		b.Run(fmt.Sprintf("%T", f)[6:], func(b *testing.B) {
			b.SetBytes(int64(len(msg)))
			buf := make([]byte, 0, len(msg))
			for b.Loop() {
				buf = f.Append(buf[:0])
				if _, err := Decode(buf, lim); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestDecodeFloatsFrom: with Limits.Floats set, Decode fills the slices it
// returns (whatever they held: NaN poison here) for a DISPATCH_SUM's hidden
// rows and weights and a RESULT's outputs, with the bits a plain Decode
// gives.
func TestDecodeFloatsFrom(t *testing.T) {
	const n, d, k = 3, 4, 2
	disp := &Dispatch{Request: 7, Layer: 1, N: n, D: d, K: k, Sum: true, Hidden: make([]float32, n*d),
		IDs: []int32{0, 1, 2, 3, 4, 5}, Weights: []float32{0.5, 0.5, 0.25, 0.75, 1, 0}}
	for i := range disp.Hidden {
		disp.Hidden[i] = float32(i) - 5.5
	}
	res := &Result{Request: 7, M: n, D: d, Out: disp.Hidden}
	for _, f := range []Frame{disp, res} {
		msg := f.Append(nil)
		plain, err := Decode(msg, &Limits{D: d, K: k, NLayer: 2, NExpert: 8})
		if err != nil {
			t.Fatal(err)
		}
		var given [][]float32
		lim := &Limits{D: d, K: k, NLayer: 2, NExpert: 8, Floats: func(m int) []float32 {
			s := make([]float32, m+5) // longer than asked: Decode uses m
			for i := range s {
				s[i] = float32(math.NaN())
			}
			given = append(given, s)
			return s
		}}
		got, err := Decode(msg, lim)
		if err != nil {
			t.Fatal(err)
		}
		var pairs [][2][]float32
		switch g := got.(type) {
		case *Dispatch:
			p := plain.(*Dispatch)
			pairs = [][2][]float32{{g.Hidden, p.Hidden}, {g.Weights, p.Weights}}
		case *Result:
			pairs = [][2][]float32{{g.Out, plain.(*Result).Out}}
		}
		if len(given) != len(pairs) {
			t.Fatalf("%T: Floats called %d times, want %d", got, len(given), len(pairs))
		}
		for i, p := range pairs {
			if len(p[0]) != len(p[1]) || &p[0][0] != &given[i][0] {
				t.Fatalf("%T: slice %d not the one Floats gave (len %d, want %d)", got, i, len(p[0]), len(p[1]))
			}
			for j := range p[0] {
				if math.Float32bits(p[0][j]) != math.Float32bits(p[1][j]) {
					t.Fatalf("%T: slice %d [%d] = %v, want %v", got, i, j, p[0][j], p[1][j])
				}
			}
		}
	}
}

// TestReadLinkBufReuse: ReadLinkBuf reads a payload into the buffer it is
// given when it fits (the same memory), into new memory when it does not,
// and refuses a zero or oversized length and a truncated payload as
// ReadLink does, whatever buffer it holds.
func TestReadLinkBufReuse(t *testing.T) {
	var w bytes.Buffer
	_ = WriteLink(&w, LinkData, []byte("abc"))
	_ = WriteLink(&w, LinkData, bytes.Repeat([]byte("x"), 100))
	r := bufio.NewReader(bytes.NewReader(w.Bytes()))
	buf := make([]byte, 0, 16)
	_, p, err := ReadLinkBuf(r, buf)
	if err != nil || string(p) != "abc" || &p[0] != &buf[:1][0] {
		t.Fatalf("small frame: %q %v (same memory: %v)", p, err, err == nil && &p[0] == &buf[:1][0])
	}
	_, p, err = ReadLinkBuf(r, p[:0])
	if err != nil || len(p) != 100 || cap(buf) != 16 {
		t.Fatalf("large frame: %d bytes %v", len(p), err)
	}
	for name, b := range map[string][]byte{
		"zero length": {0, 0, 0, 0, LinkData},
		"oversized":   {0xFF, 0xFF, 0xFF, 0x7F, LinkData},
		"truncated":   {10, 0, 0, 0, LinkData, 1, 2},
	} {
		_, _, err := ReadLinkBuf(bufio.NewReader(bytes.NewReader(b)), make([]byte, 0, 64))
		_, _, want := ReadLink(bufio.NewReader(bytes.NewReader(b)))
		if err == nil || want == nil || err.Error() != want.Error() {
			t.Errorf("%s: ReadLinkBuf %v, ReadLink %v", name, err, want)
		}
	}
}
