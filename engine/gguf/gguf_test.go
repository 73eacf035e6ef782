package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// raw is a hand encoder for test inputs, independent of the Writer.
type raw struct{ b []byte }

func (r *raw) u8(x uint8) *raw   { r.b = append(r.b, x); return r }
func (r *raw) u32(x uint32) *raw { r.b = binary.LittleEndian.AppendUint32(r.b, x); return r }
func (r *raw) u64(x uint64) *raw { r.b = binary.LittleEndian.AppendUint64(r.b, x); return r }
func (r *raw) str(s string) *raw { r.u64(uint64(len(s))); r.b = append(r.b, s...); return r }
func (r *raw) pad(a int) *raw {
	for len(r.b)%a != 0 {
		r.b = append(r.b, 0)
	}
	return r
}

// header starts a file: magic, version, tensor count, KV count.
func header(ver uint32, nTensors, nKV uint64) *raw {
	r := &raw{b: []byte("GGUF")}
	return r.u32(ver).u64(nTensors).u64(nKV)
}

// kvU32 appends a uint32 KV.
func (r *raw) kvU32(key string, v uint32) *raw { return r.str(key).u32(uint32(TypeUint32)).u32(v) }

// tinfo appends a tensor info.
func (r *raw) tinfo(name string, typ uint32, off uint64, dims ...uint64) *raw {
	r.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		r.u64(d)
	}
	return r.u32(typ).u64(off)
}

// oneTensor is a valid v3 file: one KV, one F32 tensor ne=[4] (16 bytes).
func oneTensor(ver uint32) []byte {
	r := header(ver, 1, 1).kvU32("k", 7).tinfo("t", 0, 0, 4).pad(32)
	for i := range 16 {
		r.u8(byte(i))
	}
	return r.pad(32).b
}

// TestWriterHandWorked compares the Writer with bytes laid out by hand:
//
//	24 header + 22 KV ("a" = "b") + 33 tensor info ("t", F32, ne [2]) = 79,
//	padded to 96 = DataOffset, 8 data bytes, padded to 128.
func TestWriterHandWorked(t *testing.T) {
	w := NewWriter()
	w.SetString("a", "b")
	data := []byte{0, 0, 0x80, 0x3f, 0, 0, 0, 0x40} // float32 1, 2
	if err := w.AddTensor("t", quant.F32, []uint64{2}, data); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	n, err := w.WriteTo(&buf)
	if err != nil {
		t.Fatal(err)
	}
	want := header(3, 1, 1).str("a").u32(8).str("b").tinfo("t", 0, 0, 2)
	if len(want.b) != 79 {
		t.Fatalf("hand layout is %d bytes, expected 79", len(want.b))
	}
	want.pad(32)
	want.b = append(want.b, data...)
	want.pad(32)
	if n != 128 || !bytes.Equal(buf.Bytes(), want.b) {
		t.Fatalf("wrote %d bytes\n got %x\nwant %x", n, buf.Bytes(), want.b)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	tn, err := f.Tensor("t")
	if err != nil {
		t.Fatal(err)
	}
	if f.DataOffset != 96 || tn.Size != 8 || tn.Elements() != 2 || !bytes.Equal(tn.Data, data) {
		t.Fatalf("DataOffset %d, tensor %+v", f.DataOffset, tn)
	}
}

// allValues has one KV of every scalar type (with edge values), every array
// element type, empty arrays, and nested arrays.
func allValues() []KV {
	return []KV{
		{"u8", Uint8(255)}, {"i8", Int8(-128)}, {"u16", Uint16(65535)}, {"i16", Int16(-32768)},
		{"u32", Uint32(math.MaxUint32)}, {"i32", Int32(math.MinInt32)},
		{"f32", Float32(float32(math.Inf(-1)))}, {"f32neg0", Float32(float32(math.Copysign(0, -1)))},
		{"bool.t", Bool(true)}, {"bool.f", Bool(false)},
		{"str", String("héllo \x00 wörld")}, {"str.empty", String("")},
		{"u64", Uint64(math.MaxUint64)}, {"i64", Int64(math.MinInt64)}, {"f64", Float64(math.SmallestNonzeroFloat64)},
		{"a.u8", Array([]uint8{0, 1, 255})}, {"a.i8", Array([]int8{-1, 2})},
		{"a.u16", Array([]uint16{1, 65535})}, {"a.i16", Array([]int16{-2, 3})},
		{"a.u32", Array([]uint32{4, 5, 6})}, {"a.i32", Array([]int32{-7})},
		{"a.f32", Array([]float32{1.5, -2.25})}, {"a.bool", Array([]bool{true, false, true})},
		{"a.str", Array([]string{"x", "", "yz"})}, {"a.u64", Array([]uint64{math.MaxUint64})},
		{"a.i64", Array([]int64{-9, 10})}, {"a.f64", Array([]float64{math.Pi})},
		{"a.empty.u32", Array([]uint32(nil))}, {"a.empty.str", Array([]string{})},
		{"a.nested", Array([]Value{Array([]string{"p", "q"}), Array([]int16{}), Array([]Value{Array([]bool{true})})})},
		{"a.nested.empty", Array([]Value{})},
	}
}

// TestRoundTripAllTypes writes every value type, parses it back with the
// same types and values, and checks that re-writing the parsed file gives
// the same bytes.
func TestRoundTripAllTypes(t *testing.T) {
	w := NewWriter()
	kvs := allValues()
	for _, kv := range kvs {
		w.Set(kv.Key, kv.Value)
	}
	w.Set("u8", Uint8(254)) // replacing keeps the position
	kvs[0].Value = Uint8(254)
	nan := math.Float32frombits(0x7fc00123) // NaN with a payload survives bit-exactly
	w.Set("f32nan", Float32(nan))
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if len(f.KVs) != len(kvs)+1 || len(f.Tensors) != 0 {
		t.Fatalf("%d KVs, %d tensors", len(f.KVs), len(f.Tensors))
	}
	for i, want := range kvs {
		got := f.KVs[i]
		if got.Key != want.Key || got.Value.Type() != want.Value.Type() ||
			got.Value.ElemType() != want.Value.ElemType() || !reflect.DeepEqual(got.Value, want.Value) {
			t.Errorf("KV %d: got %s %s = %v, want %s %s = %v", i, got.Key, got.Value.TypeName(), got.Value,
				want.Key, want.Value.TypeName(), want.Value)
		}
	}
	if v, _ := f.Value("f32nan"); math.Float32bits(v.Any().(float32)) != 0x7fc00123 {
		t.Errorf("NaN payload lost: %v", v)
	}
	var again bytes.Buffer
	if _, err := rewrite(t, f).WriteTo(&again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(again.Bytes(), buf.Bytes()) {
		t.Fatal("re-writing the parsed file changed its bytes")
	}
}

func TestAccessors(t *testing.T) {
	w := NewWriter()
	for _, kv := range allValues() {
		w.Set(kv.Key, kv.Value)
	}
	w.SetInt32("neg", -5)
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if u, err := f.Uint("u16"); err != nil || u != 65535 {
		t.Errorf("Uint(u16) = %d, %v", u, err)
	}
	if u, err := f.Uint("u64"); err != nil || u != math.MaxUint64 {
		t.Errorf("Uint(u64) = %d, %v", u, err)
	}
	if i, err := f.Int("i8"); err != nil || i != -128 {
		t.Errorf("Int(i8) = %d, %v", i, err)
	}
	if i, err := f.Int("u32"); err != nil || i != math.MaxUint32 {
		t.Errorf("Int(u32) = %d, %v", i, err)
	}
	if x, err := f.Float("f64"); err != nil || x != math.SmallestNonzeroFloat64 {
		t.Errorf("Float(f64) = %g, %v", x, err)
	}
	if s, err := f.Strings("a.str"); err != nil || !reflect.DeepEqual(s, []string{"x", "", "yz"}) {
		t.Errorf("Strings = %q, %v", s, err)
	}
	if s, err := f.Ints("a.i16"); err != nil || !reflect.DeepEqual(s, []int64{-2, 3}) {
		t.Errorf("Ints(a.i16) = %v, %v", s, err)
	}
	if s, err := f.Ints("a.u8"); err != nil || !reflect.DeepEqual(s, []int64{0, 1, 255}) {
		t.Errorf("Ints(a.u8) = %v, %v", s, err)
	}
	if s, err := f.Floats("a.f32"); err != nil || !reflect.DeepEqual(s, []float64{1.5, -2.25}) {
		t.Errorf("Floats = %v, %v", s, err)
	}
	if b, err := f.Bool("bool.t"); err != nil || !b {
		t.Errorf("Bool = %v, %v", b, err)
	}
	if s, err := f.String("str"); err != nil || s != "héllo \x00 wörld" {
		t.Errorf("String = %q, %v", s, err)
	}
	typeErrs := []struct {
		name string
		err  error
	}{
		{"Uint(neg)", func() error { _, err := f.Uint("neg"); return err }()},
		{"Int(u64 max)", func() error { _, err := f.Int("u64"); return err }()},
		{"Float(u32)", func() error { _, err := f.Float("u32"); return err }()},
		{"String(u32)", func() error { _, err := f.String("u32"); return err }()},
		{"Bool(u8)", func() error { _, err := f.Bool("u8"); return err }()},
		{"Strings(a.u32)", func() error { _, err := f.Strings("a.u32"); return err }()},
		{"Ints(a.u64 max)", func() error { _, err := f.Ints("a.u64"); return err }()},
		{"Ints(a.f32)", func() error { _, err := f.Ints("a.f32"); return err }()},
		{"Floats(a.i32)", func() error { _, err := f.Floats("a.i32"); return err }()},
		{"Uint(a.u32)", func() error { _, err := f.Uint("a.u32"); return err }()},
	}
	for _, c := range typeErrs {
		if !errors.Is(c.err, ErrKeyType) {
			t.Errorf("%s: err %v, want ErrKeyType", c.name, c.err)
		}
	}
	if _, err := f.Uint("absent"); !errors.Is(err, ErrMissingKey) || !strings.Contains(err.Error(), `"absent"`) {
		t.Errorf("missing key: %v", err)
	}
	if a := f.Architecture(); a != "" {
		t.Errorf("Architecture() = %q without the key", a)
	}
	if _, err := f.Tensor("x"); !errors.Is(err, ErrNoTensor) {
		t.Errorf("Tensor(x): %v", err)
	}
}

// TestParseErrors feeds hand-made broken files and checks the sentinel and
// the message.
func TestParseErrors(t *testing.T) {
	huge := uint64(1) << 60
	nest := header(3, 0, 1).str("deep").u32(uint32(TypeArray))
	for range 40 {
		nest.u32(uint32(TypeArray)).u64(1)
	}
	cases := []struct {
		name string
		data []byte
		want error
		msg  string
	}{
		{"empty", nil, ErrTruncated, "reading magic at offset 0: need 4 bytes, 0 left (file is 0 bytes)"},
		{"short magic", []byte("GG"), ErrTruncated, "reading magic"},
		{"wrong magic", append([]byte("GGML"), oneTensor(3)[4:]...), ErrMagic, `file starts with "GGML"`},
		{"version 1", header(1, 0, 0).b, ErrVersion, "version 1"},
		{"version 4", header(4, 0, 0).b, ErrVersion, "version 4"},
		{"big-endian", append([]byte("GGUF\x00\x00\x00\x03"), make([]byte, 16)...), ErrVersion, "big-endian"},
		{"no counts", []byte("GGUF\x03\x00\x00\x00\x01"), ErrTruncated, "reading tensor count at offset 8"},
		{"huge kv count", header(3, 0, huge).b, ErrTruncated, "declares 1152921504606846976 metadata entries"},
		{"huge tensor count", header(3, huge, 0).b, ErrTruncated, "and 1152921504606846976 tensors"},
		{"huge key length", header(3, 0, 1).u64(huge).u32(0).u64(0).b, ErrTruncated,
			"reading metadata 0 key at offset 32: need 1152921504606846976 bytes, 12 left (file is 44 bytes)"},
		{"huge string value", header(3, 0, 1).str("s").u32(uint32(TypeString)).u64(huge).b, ErrTruncated,
			`reading metadata 0 ("s") value at offset 45: need 1152921504606846976 bytes`},
		{"huge array", header(3, 0, 1).str("a").u32(uint32(TypeArray)).u32(uint32(TypeUint64)).u64(huge).u64(0).b,
			ErrTruncated, "1152921504606846976 elements of at least 8 bytes cannot fit"},
		{"huge string array", header(3, 0, 1).str("a").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(huge).b,
			ErrTruncated, "value element count"},
		{"array element truncated", header(3, 0, 1).str("a").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(2).str("x").u64(5).b,
			ErrTruncated, `metadata 0 ("a") value[1] at offset`},
		{"nested too deep", nest.b, ErrMalformed, "nested deeper than 32"},
		{"unknown value type", header(3, 0, 1).str("k").u32(13).u64(0).b, ErrMalformed, `metadata 0 ("k"): value: unknown value type 13 at offset 33`},
		{"unknown element type", header(3, 0, 1).str("k").u32(uint32(TypeArray)).u32(99).u64(0).b, ErrMalformed, "unknown array element type 99"},
		{"bool 2", header(3, 0, 1).str("k").u32(uint32(TypeBool)).u8(2).b, ErrMalformed, "bool byte 2"},
		{"duplicate key", header(3, 0, 2).kvU32("k", 1).kvU32("k", 2).b, ErrMalformed, `metadata 1 ("k"): duplicate key`},
		{"alignment 48", header(3, 0, 1).kvU32(KeyAlignment, 48).b, ErrMalformed, "general.alignment = 48"},
		{"alignment 0", header(3, 0, 1).kvU32(KeyAlignment, 0).b, ErrMalformed, "power of two"},
		{"alignment string", header(3, 0, 1).str(KeyAlignment).u32(uint32(TypeString)).str("32").b, ErrMalformed, "(string)"},
		{"5 dims", header(3, 1, 0).tinfo("t", 0, 0, 1, 1, 1, 1, 1).pad(32).b, ErrMalformed, `tensor info 0 ("t"): 5 dimensions`},
		{"ne over int64", header(3, 1, 0).tinfo("t", 0, 0, 1<<63).b, ErrMalformed, "exceeds int64"},
		{"dims overflow", header(3, 1, 0).tinfo("t", 0, 0, 1<<32, 1<<32, 1<<32).b, ErrTensorBounds, "overflows int64"},
		{"bytes overflow", header(3, 1, 0).tinfo("t", 0, 0, 1<<31, 1<<31).b, ErrTensorBounds, "byte size of F32"},
		{"unknown tensor type", header(3, 1, 0).tinfo("blk.0.w", 99, 0, 32).b, ErrTensorType, `tensor "blk.0.w" has type id 99`},
		{"partial block", header(3, 1, 0).tinfo("q", uint32(quant.Q8_0), 0, 16).b, ErrMalformed, "block size 32"},
		{"misaligned offset", header(3, 1, 0).tinfo("t", 0, 8, 4).b, ErrMalformed, "offset 8 is not a multiple of the alignment 32"},
		{"tensor past end", header(3, 1, 0).tinfo("t", 0, 1<<40, 4).pad(32).b, ErrTensorBounds, "ends past the end of the file (64 bytes)"},
		{"offset+size wraps", header(3, 1, 0).tinfo("t", 0, math.MaxUint64-31, 16).pad(32).b, ErrTensorBounds, "past the end"},
		{"long name", header(3, 1, 0).tinfo(strings.Repeat("n", 64), 0, 0, 4).b, ErrMalformed, "tensor name is 64 bytes"},
		{"duplicate tensor", header(3, 2, 0).tinfo("t", 0, 0, 4).tinfo("t", 0, 32, 4).pad(32).b, ErrMalformed, `tensor info 1 ("t"): duplicate tensor name`},
		{"truncated info", header(3, 1, 0).str("tensor").u32(1).u64(4).b, ErrTruncated, `reading tensor info 0 ("tensor") type at offset 50: need 4 bytes, 0 left`},
		{"missing data", oneTensor(3)[:96+15], ErrTruncated, "truncated file?"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			f, err := Parse(c.data)
			runtime.ReadMemStats(&after)
			if f != nil || !errors.Is(err, c.want) {
				t.Fatalf("Parse: %v, want %v", err, c.want)
			}
			if !strings.Contains(err.Error(), c.msg) {
				t.Errorf("error %q does not contain %q", err, c.msg)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
				t.Errorf("allocated %d bytes for a %d-byte input", alloc, len(c.data))
			}
		})
	}
}

func TestParseVersion2(t *testing.T) {
	f, err := Parse(oneTensor(2))
	if err != nil {
		t.Fatal(err)
	}
	tn, err := f.Tensor("t")
	if err != nil {
		t.Fatal(err)
	}
	if f.Version != 2 || f.DataOffset != 96 || tn.Data[15] != 15 || len(tn.Data) != 16 || cap(tn.Data) != 16 {
		t.Fatalf("v2: version %d data at %d, tensor %+v", f.Version, f.DataOffset, tn)
	}
}

// TestTruncations cuts a valid file at every length: every cut before the
// end of the last tensor's data fails with ErrTruncated; cutting only the
// trailing padding still parses.
func TestTruncations(t *testing.T) {
	w := NewWriter()
	w.SetString("general.architecture", "qwen3moe")
	w.SetStrings("tokens", []string{"a", "bc"})
	w.SetFloat32s("f", []float32{1, 2})
	w.SetBool("b", true)
	if err := w.AddTensor("x", quant.Q8_0, []uint64{32, 2}, make([]byte, 68)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("y", quant.F16, []uint64{3}, []byte{1, 2, 3, 4, 5, 6}); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	full := buf.Bytes()
	f, err := Parse(full)
	if err != nil {
		t.Fatal(err)
	}
	y := f.Tensors[1]
	end := int(f.DataOffset + y.Offset + y.Size)
	if y.Offset != 96 || end+26 != len(full) {
		t.Fatalf("layout: y at %d, end %d, file %d", y.Offset, end, len(full))
	}
	for n := range len(full) {
		_, err := Parse(full[:n])
		switch {
		case n < end && !errors.Is(err, ErrTruncated):
			t.Fatalf("cut at %d: err %v, want ErrTruncated", n, err)
		case n >= end && err != nil:
			t.Fatalf("cut at %d (padding only): %v", n, err)
		}
	}
}

func TestWriterAlignment(t *testing.T) {
	w := NewWriter()
	w.SetUint32(KeyAlignment, 64)
	if err := w.AddTensor("a", quant.F32, []uint64{3}, make([]byte, 12)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("b", quant.Q4_K, []uint64{256}, bytes.Repeat([]byte{7}, 144)); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	f, err := Parse(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := f.Tensor("b")
	// a: 12 bytes padded to 64; b: 144 bytes padded to 192.
	if f.Alignment != 64 || f.DataOffset%64 != 0 || b.Offset != 64 || b.Size != 144 || b.Data[143] != 7 ||
		uint64(buf.Len()) != f.DataOffset+64+192 {
		t.Fatalf("alignment %d data %d b %+v file %d", f.Alignment, f.DataOffset, b.TensorInfo, buf.Len())
	}
}

func TestWriterErrors(t *testing.T) {
	w := NewWriter()
	if err := w.AddTensor("t", quant.F32, []uint64{4}, make([]byte, 15)); err == nil || !strings.Contains(err.Error(), "needs 16 bytes") {
		t.Errorf("short data: %v", err)
	}
	if err := w.AddTensor("t", quant.Type(99), []uint64{4}, nil); !errors.Is(err, ErrTensorType) {
		t.Errorf("unknown type: %v", err)
	}
	if err := w.AddTensor("t", quant.Q4_0, []uint64{31}, nil); !errors.Is(err, ErrMalformed) {
		t.Errorf("partial block: %v", err)
	}
	if err := w.AddTensor("t", quant.F32, []uint64{1, 1, 1, 1, 1}, make([]byte, 4)); !errors.Is(err, ErrMalformed) {
		t.Errorf("5 dims: %v", err)
	}
	if err := w.AddTensor(strings.Repeat("n", 64), quant.F32, []uint64{1}, make([]byte, 4)); err == nil {
		t.Error("64-byte name accepted")
	}
	if err := w.AddTensor("t", quant.F32, []uint64{1}, make([]byte, 4)); err != nil {
		t.Fatal(err)
	}
	if err := w.AddTensor("t", quant.F32, []uint64{1}, make([]byte, 4)); err == nil {
		t.Error("duplicate tensor accepted")
	}
	for _, c := range []struct {
		name string
		v    Value
	}{{"zero", Value{}}, {"scalar in nested", Array([]Value{Uint8(1)})}} {
		w := NewWriter()
		w.Set("k", c.v)
		if _, err := w.WriteTo(io.Discard); !errors.Is(err, ErrKeyType) {
			t.Errorf("%s value: %v", c.name, err)
		}
	}
	w = NewWriter()
	w.SetUint32(KeyAlignment, 24)
	if _, err := w.WriteTo(io.Discard); !errors.Is(err, ErrMalformed) {
		t.Errorf("alignment 24: %v", err)
	}
}

// TestLayout checks Writer.Layout against Parse of what WriteTo writes
// (metadata, tensor infos and offsets, data offset, alignment), for a
// Writer whose tensors carry their data and for the same one described by
// AddTensorInfo, which WriteTo then refuses.
func TestLayout(t *testing.T) {
	type tensor struct {
		name string
		typ  quant.Type
		dims []uint64
		data []byte
	}
	ts := []tensor{
		{"a", quant.F32, []uint64{3}, make([]byte, 12)},
		{"blk.0.b", quant.Q4_K, []uint64{256, 2}, bytes.Repeat([]byte{7}, 288)},
		{"c", quant.Q8_0, []uint64{32, 1, 3}, bytes.Repeat([]byte{1}, 102)},
	}
	for _, align := range []uint32{0, 64} {
		full, info := NewWriter(), NewWriter()
		for _, w := range []*Writer{full, info} {
			w.SetString("general.architecture", "test")
			if align != 0 {
				w.SetUint32(KeyAlignment, align)
			}
			w.SetStrings("tokens", []string{"x", "yz"})
		}
		for _, x := range ts {
			if err := full.AddTensor(x.name, x.typ, x.dims, x.data); err != nil {
				t.Fatal(err)
			}
			if err := info.AddTensorInfo(x.name, x.typ, x.dims); err != nil {
				t.Fatal(err)
			}
		}
		var buf bytes.Buffer
		if _, err := full.WriteTo(&buf); err != nil {
			t.Fatal(err)
		}
		want, err := Parse(buf.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range []*Writer{full, info} {
			got, err := w.Layout()
			if err != nil {
				t.Fatal(err)
			}
			if got.Version != want.Version || got.Alignment != want.Alignment || got.DataOffset != want.DataOffset ||
				!reflect.DeepEqual(got.KVs, want.KVs) || !reflect.DeepEqual(got.Tensors, want.Tensors) {
				t.Errorf("alignment %d: layout %d %d %d %v %v, parsed %d %d %d %v %v", align, got.Version, got.Alignment,
					got.DataOffset, got.KVs, got.Tensors, want.Version, want.Alignment, want.DataOffset, want.KVs, want.Tensors)
			}
			if s, err := got.String("general.architecture"); err != nil || s != "test" {
				t.Errorf("layout metadata: %q, %v", s, err)
			}
			if ti, err := got.TensorInfo("blk.0.b"); err != nil || ti.Offset != want.Tensors[1].Offset {
				t.Errorf("layout TensorInfo: %+v, %v", ti, err)
			}
			if _, err := got.Tensor("a"); !errors.Is(err, ErrNoData) {
				t.Errorf("Tensor of a layout: %v, want ErrNoData", err)
			}
		}
		if _, err := info.WriteTo(io.Discard); !errors.Is(err, ErrNoData) {
			t.Errorf("WriteTo with AddTensorInfo tensors: %v, want ErrNoData", err)
		}
	}
	w := NewWriter()
	if err := w.AddTensorInfo("t", quant.Q4_0, []uint64{31}); !errors.Is(err, ErrMalformed) {
		t.Errorf("AddTensorInfo partial block: %v", err)
	}
	w.SetUint32(KeyAlignment, 24)
	if _, err := w.Layout(); !errors.Is(err, ErrMalformed) {
		t.Errorf("Layout with alignment 24: %v", err)
	}
}

// TestOpenClose writes a file with WriteFile, maps it with Open, and checks
// views, Close and errors after Close.
func TestOpenClose(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "m.gguf")
	w := NewWriter()
	w.SetString("general.architecture", "qwen3moe")
	data := []byte{1, 2, 3, 4, 5, 6, 7, 8}
	if err := w.AddTensor("t", quant.F16, []uint64{2, 2}, data); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Fatalf("WriteFile left %d entries (temp file not renamed?)", len(ents))
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	tn, err := f.Tensor("t")
	if err != nil || !bytes.Equal(tn.Data, data) || tn.Elements() != 4 {
		t.Fatalf("tensor %+v, %v", tn, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := f.Tensor("t"); !errors.Is(err, ErrClosed) {
		t.Errorf("Tensor after Close: %v", err)
	}
	if f.Architecture() != "qwen3moe" {
		t.Error("metadata lost after Close")
	}

	if _, err := Open(filepath.Join(dir, "absent.gguf")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("absent file: %v", err)
	}
	empty := filepath.Join(dir, "empty.gguf")
	if err := os.WriteFile(empty, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(empty); !errors.Is(err, ErrTruncated) || !strings.Contains(err.Error(), empty) {
		t.Errorf("empty file: %v", err)
	}
	sub := filepath.Join(dir, "dir.gguf")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(sub); err == nil || !strings.Contains(err.Error(), "is a directory, not a GGUF model file") {
		t.Errorf("directory: %v", err)
	}
	if st, err := os.Stat(path); err != nil || st.Mode().Perm() != 0o644 {
		t.Errorf("WriteFile's mode: %v, %v; want 0644", st.Mode(), err)
	}
}
