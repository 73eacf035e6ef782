package wire

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

func testLimits() *Limits {
	return &Limits{D: 3, K: 2, NLayer: 4, NExpert: 8, MaxRows: 16}
}

func sampleFrames() []Frame {
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))
	return []Frame{
		&Hello{Key: key.Public().(ed25519.PublicKey), ModelID: "qwen3moe-test", Backend: "cpu", Threads: 4,
			Quota: 64 << 20, Speed: 12345, Holdings: []Holding{{Layer: 1, Expert: 3, SHA256: sha256.Sum256([]byte("a"))}, {Layer: 3, Expert: 7}}},
		&Welcome{Session: "s-1", D: 3, K: 2, NLayer: 4, NExpert: 8, Accepted: 2},
		&Dispatch{Request: 42, Layer: 2, N: 2, D: 3, K: 2,
			Hidden: []float32{1, -2, 3.5, float32(math.Inf(1)), 0, -0.25}, IDs: []int32{5, -1, 0, 7}},
		&Result{Request: 42, M: 3, D: 3, Out: []float32{1, 2, 3, 4, 5, 6, 7, 8, 9}, Timing: Timing{QueueMicros: 12, ComputeMicros: 3400}},
		&Dispatch{Request: 43, Layer: 1, N: 1, D: 3, K: 2, Hidden: []float32{0.5, 0, -1}, IDs: []int32{-1, 3}, Digest: true},
		&Dispatch{Request: 44, Layer: 3, N: 2, D: 3, K: 2, Hidden: []float32{1, 2, 3, -4, float32(math.Inf(-1)), 6},
			IDs: []int32{5, 7, 1, 3}, Sum: true, Weights: []float32{0.75, 0.25, float32(math.Inf(1)), -0.5}},
		&Dispatch{Request: 45, Layer: 3, N: 1, D: 3, K: 2, Hidden: []float32{1, 2, 3},
			IDs: []int32{5, 7}, Sum: true, Digest: true, Weights: []float32{0.75, 0.25}},
		&Digest{Request: 43, M: 1, D: 3, Sum: sha256.Sum256([]byte("result"))},
		&Error{Request: 9, Code: CodeNotHeld, Message: "nope"},
		&Ping{Time: 123456789},
		&Pong{Time: -5},
		&Pause{Paused: true},
		&Pause{Paused: false},
		&Assign{ModelID: "tiny@0123456789abcdef", ModelSHA256: sha256.Sum256([]byte("m")), Arch: "qwen3moe", DFF: 256,
			ChunkSize: 4096, Layers: []LayerTypes{{Layer: 1, Gate: 8, Up: 8, Down: 8}, {Layer: 3, Gate: 12, Up: 12, Down: 14}},
			Experts: []Assigned{
				{Layer: 3, Expert: 7, Size: 4097, SHA256: sha256.Sum256([]byte("e")), Chunks: [][32]byte{sha256.Sum256([]byte("c0")), sha256.Sum256([]byte("c1"))}},
				{Layer: 1, Expert: 0, Size: 10, Chunks: [][32]byte{{}}},
			}},
		&ChunkReq{Layer: 3, Expert: 7, Offset: 4096, Len: 1},
		&Chunk{Layer: 3, Expert: 7, Offset: 4096, Data: []byte{0xAB}},
		&Holdings{Quota: 1 << 30, Add: []Holding{{Layer: 3, Expert: 7, SHA256: sha256.Sum256([]byte("e"))}},
			Drop: []Holding{{Layer: 1, Expert: 0}}},
		&Assign{ModelID: "tiny@0123456789abcdef", Arch: "qwen35moe", DFF: 256, ChunkSize: 4096,
			Source: "https://cdn.example/model.gguf", Layers: []LayerTypes{{Layer: 2, Gate: 12, Up: 12, Down: 14}},
			Experts: []Assigned{{Layer: 2, Expert: 5, Size: 4097, Chunks: make([][32]byte, 2),
				Ranges: []Range{{Offset: 1 << 33, Len: 4000}, {Offset: 64, Len: 97}}}}},
	}
}

func TestRoundTrip(t *testing.T) {
	for _, f := range sampleFrames() {
		msg := f.Append(nil)
		got, err := Decode(msg, testLimits())
		if err != nil {
			t.Fatalf("%s: %v", f.Type(), err)
		}
		if !reflect.DeepEqual(got, f) {
			t.Fatalf("%s: round trip\n got %#v\nwant %#v", f.Type(), got, f)
		}
		if typ, _ := Peek(msg); typ != f.Type() {
			t.Fatalf("Peek = %s, want %s", typ, f.Type())
		}
	}
}

// TestEncodingBytes checks the exact bytes of small frames against the
// layouts written next to the type constants (worked by hand).
func TestEncodingBytes(t *testing.T) {
	ping := (&Ping{Time: 0x0102030405060708}).Append(nil)
	want := []byte{0x6B, 7, 0, 0x06, 8, 7, 6, 5, 4, 3, 2, 1}
	if !bytes.Equal(ping, want) {
		t.Fatalf("ping = % x, want % x", ping, want)
	}
	// DISPATCH req=1 layer=2 n=1 d=1 k=1 hidden=[1.0] ids=[-1]:
	// 1.0f = 0x3F800000, -1 = 0xFFFFFFFF.
	d := (&Dispatch{Request: 1, Layer: 2, N: 1, D: 1, K: 1, Hidden: []float32{1}, IDs: []int32{-1}}).Append(nil)
	want = []byte{0x6B, 7, 0, 0x03,
		1, 0, 0, 0, 0, 0, 0, 0, // req
		2, 0, // layer
		1, 0, 0, 0, // n
		1, 0, 0, 0, // d
		1, 0, // k
		0, 0, 0x80, 0x3F, // hidden
		0xFF, 0xFF, 0xFF, 0xFF} // ids
	if !bytes.Equal(d, want) {
		t.Fatalf("dispatch = % x\nwant       % x", d, want)
	}
	if len(d) != DispatchSize(1, 1, 1) {
		t.Fatalf("DispatchSize = %d, encoded %d", DispatchSize(1, 1, 1), len(d))
	}
	r := (&Result{Request: 1, M: 2, D: 3, Out: make([]float32, 6), Timing: Timing{QueueMicros: 0x0201, ComputeMicros: 0x04030201}}).Append(nil)
	if len(r) != ResultSize(2, 3) || len(r) != 4+8+4+4+24+8 {
		t.Fatalf("ResultSize = %d, encoded %d", ResultSize(2, 3), len(r))
	}
	// Version 5's timing trailer: queue_us u32 | compute_us u32.
	if tail := r[len(r)-8:]; !bytes.Equal(tail, []byte{1, 2, 0, 0, 1, 2, 3, 4}) {
		t.Fatalf("timing trailer = % x", tail)
	}
	if Micros(-time.Second) != 0 || Micros(1500*time.Nanosecond) != 1 || Micros(time.Hour*2) != math.MaxUint32 {
		t.Fatal("Micros does not clamp")
	}
}

// errRefused is what a hub reader's ok = false reads as in TestDecodeRejects
// (the hub's readers return no error).
var errRefused = errors.New("refused by the hub's reader")

func refusedUnless(ok bool) error {
	if ok {
		return nil
	}
	return errRefused
}

// The readers of TestDecodeRejects: Decode under lim, and the hub's
// readers of forwarded messages, which meter bytes without decoding.
func decodeWith(lim *Limits) func([]byte) error {
	return func(msg []byte) error { _, err := Decode(msg, lim); return err }
}

func sumRequest(msg []byte) error { _, _, _, _, ok := SumRequest(msg); return refusedUnless(ok) }

func digestCredit(msg []byte) error { _, _, ok := DigestCredit(msg); return refusedUnless(ok) }

func sumCredit(n, d, k int) func([]byte) error {
	return func(msg []byte) error { _, ok := SumCredit(msg, n, d, k); return refusedUnless(ok) }
}

func sumDigestCredit(n, d, k int) func([]byte) error {
	return func(msg []byte) error { _, ok := SumDigestCredit(msg, n, d, k); return refusedUnless(ok) }
}

// rejectCase is one message for a reader of TestDecodeRejects and the
// error it must give (wrapped): nil for a message it accepts, errRefused
// for a hub reader's refusal.
type rejectCase struct {
	name string
	msg  []byte
	want error
	read func([]byte) error // nil: the row's reader
}

// dispatchMsg is a message of one of the four DISPATCH types: header,
// request 1, layer, n, d, k, min(n*d, 64) zero floats of hidden, the ids,
// and weights zero floats (after the ids: the sum types' weights).
func dispatchMsg(typ Type, layer uint16, n, d uint32, k uint16, weights int, ids ...int32) []byte {
	b := appendHeader(nil, typ)
	b = le.AppendUint64(b, 1)
	b = le.AppendUint16(b, layer)
	b = le.AppendUint32(b, n)
	b = le.AppendUint32(b, d)
	b = le.AppendUint16(b, k)
	b = AppendFloats(b, make([]float32, min(int(n)*int(d), 64)))
	for _, id := range ids {
		b = le.AppendUint32(b, uint32(id))
	}
	return AppendFloats(b, make([]float32, weights))
}

// dispatchRejects are the cases every DISPATCH type shares, as messages
// of type typ under testLimits (d 3, k 2, 4 layers, 8 experts, 16 rows),
// with the n*k weights of the sum types (DISPATCH_SUM, _DIGEST), which
// may not leave a slot at -1 and must carry exactly n*k weights.
func dispatchRejects(typ Type) []rejectCase {
	sum := typ == TypeDispatchSum || typ == TypeDispatchSumDigest
	w := func(n, k int) int { // the weights a well-formed message of typ carries
		if sum {
			return n * k
		}
		return 0
	}
	msg := func(layer uint16, n, d uint32, k uint16, ids ...int32) []byte {
		return dispatchMsg(typ, layer, n, d, k, w(int(n), int(k)), ids...)
	}
	holds := func(e int) func([]byte) error {
		return decodeWith(&Limits{D: 3, K: 2, NLayer: 4, NExpert: 8, Holds: func(l, x int) bool { return x == e }})
	}
	var oneMinus error // a row with one slot at -1
	if sum {
		oneMinus = ErrShape
	}
	cs := []rejectCase{
		{"ok", msg(0, 1, 3, 2, 1, 2), nil, nil},
		{"one -1", msg(0, 1, 3, 2, 1, -1), oneMinus, nil},
		{"all -1", msg(0, 1, 3, 2, -1, -1), ErrShape, nil},
		{"wrong d", msg(0, 1, 2, 2, 1, 2), ErrShape, nil},
		{"wrong k", msg(0, 1, 3, 1, 1), ErrShape, nil},
		{"layer", msg(4, 1, 3, 2, 1, 2), ErrRange, nil},
		{"expert in slot 0", msg(0, 1, 3, 2, 8, 2), ErrRange, nil},
		{"expert in slot 1", msg(0, 1, 3, 2, 1, 8), ErrRange, nil},
		{"negative", msg(0, 1, 3, 2, -2, 2), ErrRange, nil},
		{"zero rows", msg(0, 0, 3, 2), ErrShape, nil},
		{"too many rows", msg(0, 17, 3, 2, make([]int32, 34)...), ErrShape, nil},
		{"huge n", dispatchMsg(typ, 0, 0xFFFFFFFF, 3, 2, 0), ErrTruncated, decodeWith(&Limits{D: 3, K: 2, NLayer: 4, NExpert: 8})},
		{"not held in slot 0", msg(0, 1, 3, 2, 1, 2), ErrNotHeld, holds(2)},
		{"not held in slot 1", msg(0, 1, 3, 2, 1, 2), ErrNotHeld, holds(1)},
		{"no limits", msg(0, 1, 3, 2, 1, 2), ErrShape, decodeWith(&Limits{})},
	}
	if sum {
		cs = append(cs,
			rejectCase{"no weights", dispatchMsg(typ, 0, 1, 3, 2, 0, 1, 2), ErrTruncated, nil},
			rejectCase{"short weights", dispatchMsg(typ, 0, 1, 3, 2, 1, 1, 2), ErrTruncated, nil},
			rejectCase{"extra weight", dispatchMsg(typ, 0, 1, 3, 2, 3, 1, 2), ErrTruncated, nil})
	}
	return cs
}

// TestDecodeRejects: malformed messages of every type are refused by
// Decode with the sentinel error their flaw calls for, and by the hub's
// readers of the types it meters (SumRequest, SumCredit, DigestCredit,
// SumDigestCredit). For each type and reader, a valid message is
// accepted, and that message cut by one byte, cut to its header, with one
// byte appended, or with a damaged header (magic, version, unknown type)
// is refused: ErrTruncated, ErrTruncated, long (ErrTruncated where the
// payload's length is checked as a whole, else ErrTrailing), ErrMagic,
// ErrVersion and ErrType from Decode, errRefused from a hub reader; then
// come the cases peculiar to the type.
func TestDecodeRejects(t *testing.T) {
	lim := testLimits()
	frames := sampleFrames()
	appendByte := func(b []byte, x byte) []byte { return append(append([]byte(nil), b...), x) }
	sumMsg := (&Dispatch{Request: 9, Layer: 0, N: 3, D: 4, K: 2, Hidden: make([]float32, 12), IDs: make([]int32, 6), Sum: true, Weights: make([]float32, 6)}).Append(nil)
	sumDigestMsg := (&Dispatch{Request: 9, Layer: 0, N: 3, D: 4, K: 2, Hidden: make([]float32, 12), IDs: make([]int32, 6), Sum: true, Digest: true, Weights: make([]float32, 6)}).Append(nil)
	plain := (&Dispatch{Request: 9, Layer: 0, N: 3, D: 4, K: 2, Hidden: make([]float32, 12), IDs: make([]int32, 6)}).Append(nil)
	res := (&Result{Request: 9, M: 3, D: 4, Out: make([]float32, 12)}).Append(nil)
	dg := (&Digest{Request: 9, M: 3, D: 4}).Append(nil)
	g := (&Digest{Request: 0x0102, M: 2, D: 3, Sum: sha256.Sum256([]byte("result"))}).Append(nil)
	chunk := (&Chunk{Layer: 1, Data: []byte{1, 2}}).Append(nil)
	noExperts := assignMsg(func(a *Assign) { a.Experts = nil })
	rows := []struct {
		name  string
		read  func([]byte) error
		hub   bool   // a hub reader: every refusal is errRefused
		good  []byte // a message read accepts
		long  error  // Decode's error for good with a byte appended
		cases []rejectCase
	}{
		{"HELLO", decodeWith(lim), false, frames[0].Append(nil), ErrTruncated, []rejectCase{
			{"holding layer", (&Hello{Key: make([]byte, 32), Holdings: []Holding{{Layer: 4}}}).Append(nil), ErrRange, nil},
			{"duplicate holding", (&Hello{Key: make([]byte, 32), Holdings: []Holding{{Layer: 1, Expert: 2}, {Layer: 1, Expert: 2}}}).Append(nil), ErrRange, nil},
		}},
		{"WELCOME", decodeWith(lim), false, frames[1].Append(nil), ErrTrailing, nil},
		{"DISPATCH", decodeWith(lim), false, frames[2].Append(nil), ErrTruncated,
			append(dispatchRejects(TypeDispatch), rejectCase{"empty message", nil, ErrTruncated, nil})},
		{"DISPATCH_DIGEST", decodeWith(lim), false, frames[4].Append(nil), ErrTruncated, dispatchRejects(TypeDispatchDigest)},
		{"DISPATCH_SUM", decodeWith(lim), false, frames[5].Append(nil), ErrTruncated, dispatchRejects(TypeDispatchSum)},
		{"DISPATCH_SUM_DIGEST", decodeWith(lim), false, frames[6].Append(nil), ErrTruncated, dispatchRejects(TypeDispatchSumDigest)},
		{"RESULT", decodeWith(lim), false, frames[3].Append(nil), ErrTruncated, []rejectCase{
			{"d", (&Result{Request: 1, M: 1, D: 2, Out: []float32{1, 2}}).Append(nil), ErrShape, nil},
			{"m=0", (&Result{Request: 1, M: 0, D: 3}).Append(nil), ErrShape, nil},
			{"fewer floats than m*d", (&Result{Request: 1, M: 2, D: 3, Out: []float32{1, 2, 3}}).Append(nil), ErrTruncated, nil},
			{"oversized", append(appendHeader(nil, TypeResult), make([]byte, MaxMessage)...), ErrTooLarge, nil},
		}},
		{"DIGEST", decodeWith(lim), false, frames[7].Append(nil), ErrTrailing, []rejectCase{
			{"another d", (&Digest{Request: 1, M: 1, D: 4}).Append(nil), ErrShape, nil},
			{"m > MaxRows*K", (&Digest{Request: 1, M: 33, D: 3}).Append(nil), ErrShape, nil},
		}},
		{"ERROR", decodeWith(lim), false, frames[8].Append(nil), ErrTrailing, []rejectCase{
			{"bad utf8", append(le.AppendUint16(le.AppendUint16(le.AppendUint64(appendHeader(nil, TypeError), 0), 1), 1), 0xFF), ErrString, nil},
		}},
		{"PING", decodeWith(lim), false, frames[9].Append(nil), ErrTrailing, nil},
		{"PONG", decodeWith(lim), false, frames[10].Append(nil), ErrTrailing, nil},
		{"PAUSE", decodeWith(lim), false, frames[11].Append(nil), ErrTrailing, []rejectCase{
			{"flag 2", append(appendHeader(nil, TypePause), 2), ErrRange, nil},
		}},
		{"ASSIGN", decodeWith(lim), false, assignMsg(func(*Assign) {}), ErrTrailing, []rejectCase{
			{"chunk size small", assignMsg(func(a *Assign) { a.ChunkSize = 100 }), ErrRange, nil},
			{"chunk size big", assignMsg(func(a *Assign) { a.ChunkSize = MaxChunk + 1 }), ErrRange, nil},
			{"no arch", assignMsg(func(a *Assign) { a.Arch = "" }), ErrRange, nil},
			{"chunk count", assignMsg(func(a *Assign) { a.Experts[0].Chunks = a.Experts[0].Chunks[:1] }), ErrShape, nil},
			{"size 0", assignMsg(func(a *Assign) { a.Experts[0].Size = 0; a.Experts[0].Chunks = nil }), ErrRange, nil},
			{"layer without types", assignMsg(func(a *Assign) { a.Experts[0].Layer = 2 }), ErrRange, nil},
			{"layer range", assignMsg(func(a *Assign) { a.Layers[0].Layer = 4 }), ErrRange, nil},
			{"expert range", assignMsg(func(a *Assign) { a.Experts[0].Expert = 8 }), ErrRange, nil},
			{"dup expert", assignMsg(func(a *Assign) { a.Experts = append(a.Experts, a.Experts[0]) }), ErrRange, nil},
			{"dup layer", assignMsg(func(a *Assign) { a.Layers = append(a.Layers, a.Layers[0]) }), ErrRange, nil},
			{"source not http", assignMsg(func(a *Assign) { a.Source = "file:///etc/passwd"; a.Experts[0].Ranges = []Range{{0, 5000}} }), ErrRange, nil},
			{"source without ranges", assignMsg(func(a *Assign) { a.Source = "http://h/m" }), ErrRange, nil},
			{"ranges without source", assignMsg(func(a *Assign) { a.Experts[0].Ranges = []Range{{0, 5000}} }), ErrRange, nil},
			{"ranges short", assignMsg(func(a *Assign) { a.Source = "http://h/m"; a.Experts[0].Ranges = []Range{{0, 4999}} }), ErrShape, nil},
			{"range empty", assignMsg(func(a *Assign) { a.Source = "http://h/m"; a.Experts[0].Ranges = []Range{{0, 5000}, {9, 0}} }), ErrRange, nil},
			{"too many ranges", assignMsg(func(a *Assign) {
				a.Source = "http://h/m"
				a.Experts[0].Ranges = make([]Range, MaxRanges+1)
				for i := range a.Experts[0].Ranges {
					a.Experts[0].Ranges[i] = Range{uint64(i) * 1000, 500}
				}
				a.Experts[0].Ranges[0].Len = 5000 - 500*MaxRanges
			}), ErrRange, nil},
			{"version 2", func() []byte { b := assignMsg(func(*Assign) {}); b[1] = 2; return b }(), ErrVersion, nil},
			// ASSIGN claiming 2^32-1 experts in a short message: refused before allocating.
			{"huge n", append(noExperts[:len(noExperts)-4:len(noExperts)-4], 0xFF, 0xFF, 0xFF, 0xFF), ErrTooLarge, nil},
		}},
		{"CHUNK_REQ", decodeWith(lim), false, frames[14].Append(nil), ErrTrailing, []rejectCase{
			{"len 0", (&ChunkReq{Layer: 1, Len: 0}).Append(nil), ErrRange, nil},
			{"len big", (&ChunkReq{Layer: 1, Len: MaxChunk + 1}).Append(nil), ErrRange, nil},
			{"layer", (&ChunkReq{Layer: 4, Len: 1}).Append(nil), ErrRange, nil},
		}},
		{"CHUNK", decodeWith(lim), false, chunk, ErrTruncated, []rejectCase{
			{"empty", (&Chunk{Layer: 1}).Append(nil), ErrRange, nil},
		}},
		{"HOLDINGS", decodeWith(lim), false, frames[16].Append(nil), ErrTrailing, []rejectCase{
			{"dup", (&Holdings{Add: []Holding{{Layer: 1, Expert: 2}}, Drop: []Holding{{Layer: 1, Expert: 2}}}).Append(nil), ErrRange, nil},
			{"range", (&Holdings{Drop: []Holding{{Layer: 1, Expert: 9}}}).Append(nil), ErrRange, nil},
			{"short", (&Holdings{Drop: []Holding{{Layer: 1, Expert: 2}}}).Append(nil)[:20], ErrTruncated, nil},
		}},
		// The hub's readers.
		{"DISPATCH_SUM/SumRequest", sumRequest, true, sumMsg, nil, []rejectCase{
			{"DISPATCH", plain, errRefused, nil},
			{"shape cut", sumMsg[:HeaderSize+19], errRefused, nil},
		}},
		{"DISPATCH_SUM_DIGEST/SumRequest", sumRequest, true, sumDigestMsg, nil, []rejectCase{
			{"shape cut", sumDigestMsg[:HeaderSize+19], errRefused, nil},
		}},
		{"RESULT/SumCredit", sumCredit(3, 4, 2), true, res, nil, []rejectCase{
			{"other m", res, errRefused, sumCredit(6, 4, 2)},
			{"other d", res, errRefused, sumCredit(3, 2, 2)},
			{"DIGEST", dg, errRefused, nil},
			{"shape cut", res[:HeaderSize+10], errRefused, nil},
		}},
		{"DIGEST/DigestCredit", digestCredit, true, g, nil, []rejectCase{
			{"RESULT", (&Result{Request: 7, M: 1, D: 3, Out: []float32{1, -2, 0.5}}).Append(nil), errRefused, nil},
			{"m=0", (&Digest{Request: 1, M: 0, D: 3}).Append(nil), errRefused, nil},
			{"too big", (&Digest{Request: 1, M: 1 << 20, D: 1 << 10}).Append(nil), errRefused, nil},
			{"RESULT type", append([]byte{0x6B, 7, 0, 0x04}, g[4:]...), errRefused, nil},
		}},
		{"DIGEST/SumDigestCredit", sumDigestCredit(3, 4, 2), true, dg, nil, []rejectCase{
			{"other m", dg, errRefused, sumDigestCredit(6, 4, 2)},
			{"other d", dg, errRefused, sumDigestCredit(3, 2, 2)},
			{"RESULT", res, errRefused, nil},
			{"k 0", dg, errRefused, sumDigestCredit(3, 4, 0)},
		}},
	}
	for _, row := range rows {
		t.Run(row.name, func(t *testing.T) {
			header := func(i int, x byte) []byte { b := append([]byte(nil), row.good...); b[i] = x; return b }
			generic := []rejectCase{
				{"valid", row.good, nil, nil},
				{"cut by one byte", row.good[:len(row.good)-1], ErrTruncated, nil},
				{"header only", row.good[:HeaderSize], ErrTruncated, nil},
				{"one byte appended", appendByte(row.good, 0), row.long, nil},
				{"magic", header(0, 'x'), ErrMagic, nil},
				{"version", header(1, 1), ErrVersion, nil},
				{"unknown type", header(3, 0x7F), ErrType, nil},
			}
			if row.hub {
				for i := range generic[1:] {
					generic[i+1].want = errRefused
				}
			}
			for _, c := range append(generic, row.cases...) {
				read := row.read
				if c.read != nil {
					read = c.read
				}
				if err := read(c.msg); !errors.Is(err, c.want) { // errors.Is(err, nil): err == nil
					t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
				}
			}
		})
	}
}

func TestUpgradeSignature(t *testing.T) {
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32))
	now := time.Unix(1_800_000_000, 0)
	h := SignUpgrade(key, "GET", "Gate.Example.net:443", WorkerPath, now)
	pub, nonce, err := VerifyUpgrade(h, "GET", "gate.example.net", WorkerPath, now.Add(10*time.Second), time.Minute)
	if err != nil || !pub.Equal(key.Public()) || len(nonce) != 32 {
		t.Fatalf("verify: %v %x %q", err, pub, nonce)
	}
	if h2 := SignUpgrade(key, "GET", "Gate.Example.net:443", WorkerPath, now); h2.Get(HeaderNonce) == nonce {
		t.Fatal("nonce repeated")
	}
	if _, _, err := VerifyUpgrade(h, "GET", "gate.example.net", "/v1/other", now, time.Minute); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("other path: %v", err)
	}
	// The host is signed (port and case aside): the same headers at
	// another gateway fail.
	if _, _, err := VerifyUpgrade(h, "GET", "GATE.example.NET:8443", WorkerPath, now, time.Minute); err != nil {
		t.Fatalf("same host, other port and case: %v", err)
	}
	if _, _, err := VerifyUpgrade(h, "GET", "other.example.net:443", WorkerPath, now, time.Minute); !errors.Is(err, ErrBadSignature) || errors.Is(err, ErrOldSignature) {
		t.Fatalf("other host: %v", err)
	}
	// Version 1's message (no host), written out as its docs gave it: a
	// bad signature here, recognised as an old worker's.
	v1 := h.Clone()
	v1msg := "kvasir-upgrade-v1\nGET\n" + WorkerPath + "\n" + h.Get(HeaderTime) + "\n" + h.Get(HeaderNonce)
	v1.Set(HeaderSig, hex.EncodeToString(ed25519.Sign(key, []byte(v1msg))))
	if _, _, err := VerifyUpgrade(v1, "GET", "gate.example.net", WorkerPath, now, time.Minute); !errors.Is(err, ErrBadSignature) || !errors.Is(err, ErrOldSignature) {
		t.Fatalf("v1 signature: %v", err)
	}
	if _, _, err := VerifyUpgrade(h, "GET", "gate.example.net", WorkerPath, now.Add(61*time.Second), time.Minute); !errors.Is(err, ErrStale) {
		t.Fatalf("stale: %v", err)
	}
	if _, _, err := VerifyUpgrade(h, "GET", "gate.example.net", WorkerPath, now.Add(-61*time.Second), time.Minute); !errors.Is(err, ErrStale) {
		t.Fatalf("future: %v", err)
	}
	if _, _, err := VerifyUpgrade(http_Header(), "GET", "gate.example.net", WorkerPath, now, time.Minute); !errors.Is(err, ErrNoSignature) {
		t.Fatalf("unsigned: %v", err)
	}
	other := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, 32))
	forged := h.Clone()
	forged.Set(HeaderKey, SignUpgrade(other, "GET", "gate.example.net", WorkerPath, now).Get(HeaderKey))
	if _, _, err := VerifyUpgrade(forged, "GET", "gate.example.net", WorkerPath, now, time.Minute); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("forged key: %v", err)
	}
	bumped := h.Clone()
	bumped.Set(HeaderTime, "1800000001000")
	if _, _, err := VerifyUpgrade(bumped, "GET", "gate.example.net", WorkerPath, now, time.Minute); !errors.Is(err, ErrBadSignature) {
		t.Fatalf("bumped time: %v", err)
	}
}

func http_Header() map[string][]string { return map[string][]string{} }

func TestUpgradeHost(t *testing.T) {
	for in, want := range map[string]string{
		"gate.example.net:443": "gate.example.net", "GATE.Example.net": "gate.example.net",
		"[2001:DB8::1]:443": "2001:db8::1", "[::1]": "::1", "127.0.0.1:8543": "127.0.0.1", "127.0.0.1": "127.0.0.1", "gate.example.net.:443": "gate.example.net",
	} {
		if got := UpgradeHost(in); got != want {
			t.Errorf("UpgradeHost(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLink(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteLinkPreamble(&buf, "sess", "abcd"); err != nil {
		t.Fatal(err)
	}
	msg := (&Ping{Time: 5}).Append(nil)
	_ = WriteLink(&buf, LinkData, msg[:3], msg[3:])
	_ = WriteLink(&buf, LinkAccepted, AppendLinkRequest(nil, 77))
	_ = WriteLink(&buf, LinkClose, AppendLinkClose(nil, 1008, "bad frame"))
	r := bufio.NewReader(&buf)
	s, w, err := ReadLinkPreamble(r)
	if err != nil || s != "sess" || w != "abcd" {
		t.Fatalf("preamble %q %q %v", s, w, err)
	}
	k, p, err := ReadLink(r)
	if err != nil || k != LinkData || !bytes.Equal(p, msg) {
		t.Fatalf("data %d % x %v", k, p, err)
	}
	k, p, _ = ReadLink(r)
	if req, err := LinkRequest(p); k != LinkAccepted || req != 77 || err != nil {
		t.Fatalf("accepted %d %d %v", k, req, err)
	}
	k, p, _ = ReadLink(r)
	if code, reason, err := LinkCloseReason(p); k != LinkClose || code != 1008 || reason != "bad frame" || err != nil {
		t.Fatalf("close %d %d %q %v", k, code, reason, err)
	}
	bad := bufio.NewReader(bytes.NewReader([]byte{0, 0, 0, 0, 1}))
	if _, _, err := ReadLink(bad); !errors.Is(err, ErrLink) {
		t.Fatalf("zero length: %v", err)
	}
	huge := bufio.NewReader(bytes.NewReader([]byte{0xFF, 0xFF, 0xFF, 0xFF, 1}))
	if _, _, err := ReadLink(huge); !errors.Is(err, ErrLink) {
		t.Fatalf("huge length: %v", err)
	}
}

// TestLinkVersion2: FORFEIT round-trips, and a version 1 preamble is refused
// with ErrLinkVersion naming both versions.
func TestLinkVersion2(t *testing.T) {
	var buf bytes.Buffer
	_ = WriteLink(&buf, LinkForfeit, AppendLinkForfeit(nil, strings.Repeat("é", 100)))
	k, p, err := ReadLink(bufio.NewReader(&buf))
	if err != nil || k != LinkForfeit || len(p) > 123 || !utf8.Valid(p) {
		t.Fatalf("forfeit %d %d bytes %v", k, len(p), err)
	}
	old := append([]byte("KVLK"), 1, 0, 0, 0, 0, 0)
	_, _, err = ReadLinkPreamble(bytes.NewReader(old))
	if !errors.Is(err, ErrLinkVersion) || !errors.Is(err, ErrLink) || !strings.Contains(err.Error(), "link version 1, the backbone speaks 2") {
		t.Fatalf("version 1 preamble: %v", err)
	}
	if _, _, err := ReadLinkPreamble(bytes.NewReader(append([]byte("XXXX"), 2, 0, 0, 0, 0, 0))); !errors.Is(err, ErrLink) || errors.Is(err, ErrLinkVersion) {
		t.Fatalf("bad magic: %v", err)
	}
}

// TestDigest: the DIGEST layout byte by byte, ResultDigest over the RESULT
// payload after the request id (the same for another request id),
// DigestCredit's metering size and its refusals, and the decoder's.
func TestDigest(t *testing.T) {
	out := []float32{1, -2, 0.5}
	r1 := (&Result{Request: 7, M: 1, D: 3, Out: out}).Append(nil)
	r2 := (&Result{Request: 8, M: 1, D: 3, Out: out, Timing: Timing{QueueMicros: 5, ComputeMicros: 900}}).Append(nil)
	sum := ResultDigest(r1)
	if sum != ResultDigest(r2) || sum != sha256.Sum256(r1[12:len(r1)-TimingSize]) || sum != OutputsDigest(1, 3, out) {
		t.Fatal("ResultDigest depends on the request id or hashes other bytes")
	}
	big := make([]float32, 3*40000) // more than one 64 KiB buffer
	for i := range big {
		big[i] = float32(i) * 0.5
	}
	if OutputsDigest(40000, 3, big) != ResultDigest((&Result{Request: 1, M: 40000, D: 3, Out: big}).Append(nil)) {
		t.Fatal("OutputsDigest differs from ResultDigest over several buffers")
	}
	r3 := (&Result{Request: 7, M: 1, D: 3, Out: []float32{1, -2, math.Nextafter32(0.5, 1)}}).Append(nil)
	if ResultDigest(r3) == sum {
		t.Fatal("one ulp does not change the digest")
	}
	g := (&Digest{Request: 0x0102, M: 2, D: 3, Sum: sum}).Append(nil)
	want := append([]byte{0x6B, 7, 0, 0x0E, 2, 1, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0}, sum[:]...)
	if !bytes.Equal(g, want) || len(g) != DigestSize {
		t.Fatalf("digest = % x\nwant     % x", g, want)
	}
	if req, n, ok := DigestCredit(g); !ok || req != 0x0102 || n != ResultSize(2, 3) {
		t.Fatalf("DigestCredit = %d %d %v", req, n, ok)
	}
	if typ, req, ok := PeekRequest(g); !ok || typ != TypeDigest || req != 0x0102 {
		t.Fatalf("PeekRequest = %s %d %v", typ, req, ok)
	}
	dd := (&Dispatch{Request: 9, Layer: 1, N: 1, D: 3, K: 2, Hidden: make([]float32, 3), IDs: []int32{1, -1}, Digest: true}).Append(nil)
	if typ, req, ok := PeekRequest(dd); !ok || typ != TypeDispatchDigest || req != 9 || len(dd) != DispatchSize(1, 3, 2) {
		t.Fatalf("PeekRequest(DISPATCH_DIGEST) = %s %d %v", typ, req, ok)
	}
	if TypeDigest.String() != "DIGEST" || TypeDispatchDigest.String() != "DISPATCH_DIGEST" {
		t.Fatal("type names")
	}
}

// TestDispatchSum: the DISPATCH_SUM layout byte by byte (worked by hand
// from the layout next to TypeDispatchSum), weights of any bits kept as
// sent, and the hub's view of it: SumRequest's shape, ResultShape and
// SumCredit metering a RESULT of n rows as the RESULT of n*k outputs.
func TestDispatchSum(t *testing.T) {
	nan := math.Float32frombits(0x7fc00001)
	d := &Dispatch{Request: 1, Layer: 2, N: 1, D: 1, K: 2, Hidden: []float32{1}, IDs: []int32{3, 0}, Sum: true, Weights: []float32{0.5, nan}}
	msg := d.Append(nil)
	want := []byte{0x6B, 7, 0, 0x0F,
		1, 0, 0, 0, 0, 0, 0, 0, // req
		2, 0, // layer
		1, 0, 0, 0, // n
		1, 0, 0, 0, // d
		2, 0, // k
		0, 0, 0x80, 0x3F, // hidden 1.0
		3, 0, 0, 0, 0, 0, 0, 0, // ids 3, 0
		0, 0, 0, 0x3F, // weight 0.5
		1, 0, 0xC0, 0x7F} // weight NaN (0x7fc00001), kept as sent
	if !bytes.Equal(msg, want) || len(msg) != DispatchSumSize(1, 1, 2) || len(msg) != d.Size() || d.Type() != TypeDispatchSum {
		t.Fatalf("dispatch_sum = % x\nwant           % x", msg, want)
	}
	f, err := Decode(msg, &Limits{D: 1, K: 2, NLayer: 4, NExpert: 4})
	if err != nil {
		t.Fatal(err)
	}
	got := f.(*Dispatch)
	if !got.Sum || got.Digest || math.Float32bits(got.Weights[1]) != 0x7fc00001 || !bytes.Equal(got.Append(nil), msg) {
		t.Fatalf("decoded %+v", got)
	}
	if typ, req, ok := PeekRequest(msg); !ok || typ != TypeDispatchSum || req != 1 || typ.String() != "DISPATCH_SUM" {
		t.Fatalf("PeekRequest = %s %d %v", typ, req, ok)
	}
	if req, n, dd, k, ok := SumRequest(msg); !ok || req != 1 || n != 1 || dd != 1 || k != 2 {
		t.Fatalf("SumRequest = %d %d %d %d %v", req, n, dd, k, ok)
	}
	big := (&Dispatch{Request: 9, Layer: 0, N: 3, D: 4, K: 2, Hidden: make([]float32, 12), IDs: make([]int32, 6), Sum: true, Weights: make([]float32, 6)}).Append(nil)
	if req, n, dd, k, ok := SumRequest(big); !ok || req != 9 || n != 3 || dd != 4 || k != 2 {
		t.Fatalf("SumRequest(3 rows) = %d %d %d %d %v", req, n, dd, k, ok)
	}
	res := (&Result{Request: 9, M: 3, D: 4, Out: make([]float32, 12)}).Append(nil)
	if req, m, dd, ok := ResultShape(res); !ok || req != 9 || m != 3 || dd != 4 {
		t.Fatalf("ResultShape = %d %d %d %v", req, m, dd, ok)
	}
	// 3 rows of a sum over k = 2 stand for 6 outputs: 28 + 4*6*4 bytes.
	if n, ok := SumCredit(res, 3, 4, 2); !ok || n != 28+96 || n != ResultSize(6, 4) {
		t.Fatalf("SumCredit = %d %v", n, ok)
	}
}

// TestDispatchSumDigest: the DISPATCH_SUM_DIGEST layout (worked by hand:
// the DISPATCH_SUM bytes of TestDispatchSum with type byte 0x10), decoded
// with Sum and Digest set, and the hub's view: SumRequest's shape, and
// SumDigestCredit metering a DIGEST of n rows as the RESULT of n*k outputs
// (and nothing else: a RESULT, a DIGEST of another shape, a cut one).
func TestDispatchSumDigest(t *testing.T) {
	d := &Dispatch{Request: 1, Layer: 2, N: 1, D: 1, K: 2, Hidden: []float32{1}, IDs: []int32{3, 0}, Sum: true, Digest: true, Weights: []float32{0.5, 2}}
	msg := d.Append(nil)
	want := []byte{0x6B, 7, 0, 0x10,
		1, 0, 0, 0, 0, 0, 0, 0, // req
		2, 0, // layer
		1, 0, 0, 0, // n
		1, 0, 0, 0, // d
		2, 0, // k
		0, 0, 0x80, 0x3F, // hidden 1.0
		3, 0, 0, 0, 0, 0, 0, 0, // ids 3, 0
		0, 0, 0, 0x3F, // weight 0.5
		0, 0, 0, 0x40} // weight 2.0
	if !bytes.Equal(msg, want) || len(msg) != DispatchSumSize(1, 1, 2) || len(msg) != d.Size() || d.Type() != TypeDispatchSumDigest {
		t.Fatalf("dispatch_sum_digest = % x\nwant                  % x", msg, want)
	}
	f, err := Decode(msg, &Limits{D: 1, K: 2, NLayer: 4, NExpert: 4})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.(*Dispatch); !got.Sum || !got.Digest || got.Weights[1] != 2 || !bytes.Equal(got.Append(nil), msg) {
		t.Fatalf("decoded %+v", got)
	}
	if typ, req, ok := PeekRequest(msg); !ok || typ != TypeDispatchSumDigest || req != 1 || typ.String() != "DISPATCH_SUM_DIGEST" {
		t.Fatalf("PeekRequest = %s %d %v", typ, req, ok)
	}
	if req, n, dd, k, ok := SumRequest(msg); !ok || req != 1 || n != 1 || dd != 1 || k != 2 {
		t.Fatalf("SumRequest = %d %d %d %d %v", req, n, dd, k, ok)
	}
	dg := (&Digest{Request: 9, M: 3, D: 4}).Append(nil)
	// 3 rows of a sum over k = 2 stand for 6 outputs: 28 + 4*6*4 bytes.
	if n, ok := SumDigestCredit(dg, 3, 4, 2); !ok || n != 28+96 || n != ResultSize(6, 4) {
		t.Fatalf("SumDigestCredit = %d %v", n, ok)
	}
}
