package gguf

import (
	"encoding/binary"
	"fmt"
	"io/fs"
	"math"
	"math/bits"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Minimum encoded sizes used to bound counts before allocating.
const (
	minKVBytes     = 8 + 4 + 1     // key length, value type, 1-byte value
	minTensorBytes = 8 + 4 + 4 + 8 // name length, n_dims, type, offset
	headerBytes    = 4 + 4 + 8 + 8 // magic, version, n_tensors, n_kv
)

// Parse parses a GGUF v2 or v3 file held in data. It does not copy data:
// Tensor returns views into it, so data must stay unchanged while the File
// is used. Metadata strings and arrays are copied.
//
// Errors wrap ErrMagic, ErrVersion, ErrTruncated, ErrTensorType,
// ErrTensorBounds or ErrMalformed, and say what was being read at which byte
// offset. Checks (as ggml/src/gguf.cpp gguf_init_from_file_impl, plus
// bounds against the file size): every count, string length and array
// length fits in the bytes left (the header's counts too, at the smallest
// encoded size of a KV or tensor info); arrays nest at most 32 deep; bools
// are 0 or 1; general.alignment is an unsigned power of two <= MaxAlignment;
// a tensor has at most MaxDims dims that fit in int64 and whose product (and
// byte size) does not overflow int64; its name is at most MaxNameBytes; its
// type is Known and ne[0] a multiple of the block size; its offset is a
// multiple of the alignment; keys and tensor names are unique; every tensor
// lies inside data. A tensor past the end of data yields an error matching
// both ErrTensorBounds and ErrTruncated. Missing padding after the last
// tensor is accepted.
func Parse(data []byte) (*File, error) {
	d := &decoder{b: data}
	f := &File{data: data}
	if err := d.parse(f); err != nil {
		return nil, err
	}
	return f, nil
}

type decoder struct {
	b     []byte
	off   uint64
	where string // what is being read, for errors: "key 3", "tensor info 17"
	depth int
}

func (d *decoder) left() uint64 { return uint64(len(d.b)) - d.off }

func (d *decoder) truncated(field string, need uint64) error {
	w := field
	if d.where != "" {
		w = d.where + " " + field
	}
	return fmt.Errorf("%w: reading %s at offset %d: need %d bytes, %d left (file is %d bytes)",
		ErrTruncated, w, d.off, need, d.left(), len(d.b))
}

func (d *decoder) malformed(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if d.where != "" {
		msg = d.where + ": " + msg
	}
	return fmt.Errorf("%w: %s", ErrMalformed, msg)
}

// take returns the next n bytes, or an ErrTruncated error naming field.
func (d *decoder) take(n uint64, field string) ([]byte, error) {
	if n > d.left() {
		return nil, d.truncated(field, n)
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	return p, nil
}

func (d *decoder) u8(field string) (uint8, error) {
	p, err := d.take(1, field)
	if err != nil {
		return 0, err
	}
	return p[0], nil
}

func (d *decoder) u16(field string) (uint16, error) {
	p, err := d.take(2, field)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint16(p), nil
}

func (d *decoder) u32(field string) (uint32, error) {
	p, err := d.take(4, field)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(p), nil
}

func (d *decoder) u64(field string) (uint64, error) {
	p, err := d.take(8, field)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(p), nil
}

// str reads a GGUF string: uint64 length, then that many bytes (copied).
// MaxKeyBytes is the longest metadata key accepted: 2^16-1 bytes, the
// GGUF specification's limit (ggml's docs/gguf.md, "gguf_kv_t": the key
// "must be no longer than 2^16-1 bytes").
const MaxKeyBytes = 1<<16 - 1

// quoteClip quotes s for an error message, cut to its first 64 bytes
// with its length when longer: a damaged length field made a key or a
// tensor name of tens of MB, and messages that long.
func quoteClip(s string) string {
	const n = 64
	if len(s) <= n {
		return fmt.Sprintf("%q", s)
	}
	return fmt.Sprintf("%q... (%d bytes)", s[:n], len(s))
}

func (d *decoder) str(field string) (string, error) {
	n, err := d.u64(field + " length")
	if err != nil {
		return "", err
	}
	p, err := d.take(n, field)
	if err != nil {
		return "", err
	}
	return string(p), nil
}

// count reads a uint64 element count and checks that count elements of at
// least minSize bytes each fit in what is left.
func (d *decoder) count(field string, minSize uint64) (int, error) {
	at := d.off
	n, err := d.u64(field)
	if err != nil {
		return 0, err
	}
	if minSize > 0 && n > d.left()/minSize {
		return 0, fmt.Errorf("%w: reading %s%s at offset %d: %d elements of at least %d bytes cannot fit in the %d bytes left (file is %d bytes)",
			ErrTruncated, prefix(d.where), field, at, n, minSize, d.left(), len(d.b))
	}
	return int(n), nil
}

func prefix(where string) string {
	if where == "" {
		return ""
	}
	return where + " "
}

func (d *decoder) parse(f *File) error {
	magic, err := d.take(4, "magic")
	if err != nil {
		return err
	}
	if string(magic) != Magic {
		return fmt.Errorf("%w: file starts with %q, want %q", ErrMagic, magic, Magic)
	}
	ver, err := d.u32("version")
	if err != nil {
		return err
	}
	switch {
	case ver == 2 || ver == 3:
	case ver == 1:
		return fmt.Errorf("%w: version 1 (only GGUF v2 and v3 are read)", ErrVersion)
	case ver&0xffff == 0 && bits.ReverseBytes32(ver) <= 3:
		return fmt.Errorf("%w: big-endian GGUF (version field %#08x); only little-endian files are read", ErrVersion, ver)
	default:
		return fmt.Errorf("%w: version %d (only GGUF v2 and v3 are read)", ErrVersion, ver)
	}
	f.Version = ver

	at := d.off
	nTensors, err := d.u64("tensor count")
	if err != nil {
		return err
	}
	nKV, err := d.u64("metadata count")
	if err != nil {
		return err
	}
	rest := d.left()
	if nKV > rest/minKVBytes || nTensors > (rest-nKV*minKVBytes)/minTensorBytes {
		return fmt.Errorf("%w: header at offset %d declares %d metadata entries and %d tensors, more than the %d bytes left can hold (file is %d bytes)",
			ErrTruncated, at, nKV, nTensors, rest, len(d.b))
	}

	// Metadata.
	f.KVs = make([]KV, 0, nKV)
	f.kvIndex = make(map[string]int, nKV)
	for i := range int(nKV) {
		d.where = fmt.Sprintf("metadata %d", i)
		key, err := d.str("key")
		if err != nil {
			return err
		}
		d.where = fmt.Sprintf("metadata %d (%s)", i, quoteClip(key))
		if len(key) > MaxKeyBytes {
			return d.malformed("key is %d bytes, at most %d allowed", len(key), MaxKeyBytes)
		}
		if _, dup := f.kvIndex[key]; dup {
			return d.malformed("duplicate key")
		}
		typ, err := d.u32("value type")
		if err != nil {
			return err
		}
		v, err := d.value(ValueType(typ), "value")
		if err != nil {
			return err
		}
		f.kvIndex[key] = len(f.KVs)
		f.KVs = append(f.KVs, KV{Key: key, Value: v})
	}
	d.where = ""

	f.Alignment = DefaultAlignment
	if v, ok := f.Value(KeyAlignment); ok {
		a, err := checkAlignment(v)
		if err != nil {
			return err
		}
		f.Alignment = a
	}

	// Tensor infos.
	f.Tensors = make([]TensorInfo, 0, nTensors)
	f.tIndex = make(map[string]int, nTensors)
	for i := range int(nTensors) {
		d.where = fmt.Sprintf("tensor info %d", i)
		ti, err := d.tensorInfo(f.Alignment)
		if err != nil {
			return err
		}
		if _, dup := f.tIndex[ti.Name]; dup {
			return d.malformed("duplicate tensor name")
		}
		f.tIndex[ti.Name] = len(f.Tensors)
		f.Tensors = append(f.Tensors, ti)
	}
	d.where = ""

	// Data section: end of the infos rounded up to the alignment.
	f.DataOffset = d.off
	if r := d.off % f.Alignment; r != 0 {
		f.DataOffset += f.Alignment - r // d.off <= len(b), no overflow for any real alignment
		if f.DataOffset < d.off {
			return fmt.Errorf("%w: data offset overflows with alignment %d", ErrMalformed, f.Alignment)
		}
	}
	size := uint64(len(d.b))
	for _, ti := range f.Tensors {
		if f.DataOffset > size || ti.Offset > size-f.DataOffset || ti.Size > size-f.DataOffset-ti.Offset {
			return &boundsError{fmt.Sprintf("%v: tensor %q (%s, ne %v, %d bytes) at data section %d + offset %d ends past the end of the file (%d bytes); truncated file?",
				ErrTensorBounds, ti.Name, ti.Type, ti.Dims, ti.Size, f.DataOffset, ti.Offset, size)}
		}
	}
	return nil
}

func (d *decoder) tensorInfo(alignment uint64) (TensorInfo, error) {
	var ti TensorInfo
	name, err := d.str("name")
	if err != nil {
		return ti, err
	}
	ti.Name = name
	d.where = fmt.Sprintf("%s (%s)", d.where, quoteClip(name))
	if len(name) > MaxNameBytes {
		return ti, d.malformed("tensor name is %d bytes, at most %d allowed", len(name), MaxNameBytes)
	}
	nDims, err := d.u32("dimension count")
	if err != nil {
		return ti, err
	}
	if nDims > MaxDims {
		return ti, d.malformed("%d dimensions, at most %d allowed", nDims, MaxDims)
	}
	ti.Dims = make([]uint64, nDims)
	for j := range ti.Dims {
		ne, err := d.u64(fmt.Sprintf("ne[%d]", j))
		if err != nil {
			return ti, err
		}
		if ne > math.MaxInt64 {
			return ti, d.malformed("ne[%d] = %d exceeds int64", j, ne)
		}
		ti.Dims[j] = ne
	}
	typ, err := d.u32("type")
	if err != nil {
		return ti, err
	}
	ti.Type = quant.Type(typ)
	if !ti.Type.Known() {
		return ti, fmt.Errorf("%w: tensor %q has type id %d", ErrTensorType, name, typ)
	}
	if ti.Offset, err = d.u64("offset"); err != nil {
		return ti, err
	}
	if ti.Offset%alignment != 0 {
		return ti, d.malformed("offset %d is not a multiple of the alignment %d", ti.Offset, alignment)
	}
	ti.Size, err = tensorSize(ti.Type, ti.Dims)
	if err != nil {
		return ti, fmt.Errorf("%w (tensor %q)", err, name)
	}
	return ti, nil
}

// tensorSize returns RowBytes(ne[0]) * ne[1] * ... in bytes, checking that
// the element count and byte size fit in int64 (ggml uses int64 ne and
// size_t sizes) and that ne[0] is a whole number of blocks.
func tensorSize(t quant.Type, dims []uint64) (uint64, error) {
	elems := uint64(1)
	for _, ne := range dims {
		hi, lo := bits.Mul64(elems, ne)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("%w: element count of ne %v overflows int64", ErrTensorBounds, dims)
		}
		elems = lo
	}
	ne0 := uint64(1)
	if len(dims) > 0 {
		ne0 = dims[0]
	}
	if ne0 > math.MaxInt {
		return 0, fmt.Errorf("%w: ne[0] = %d too large", ErrTensorBounds, ne0)
	}
	rb, err := t.RowBytes(int(ne0))
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	size := uint64(rb)
	for _, ne := range dims[min(1, len(dims)):] {
		hi, lo := bits.Mul64(size, ne)
		if hi != 0 || lo > math.MaxInt64 {
			return 0, fmt.Errorf("%w: byte size of %s ne %v overflows int64", ErrTensorBounds, t, dims)
		}
		size = lo
	}
	return size, nil
}

// value reads one metadata value of type t.
func (d *decoder) value(t ValueType, field string) (Value, error) {
	switch t {
	case TypeUint8:
		x, err := d.u8(field)
		return Value{x}, err
	case TypeInt8:
		x, err := d.u8(field)
		return Value{int8(x)}, err
	case TypeUint16:
		x, err := d.u16(field)
		return Value{x}, err
	case TypeInt16:
		x, err := d.u16(field)
		return Value{int16(x)}, err
	case TypeUint32:
		x, err := d.u32(field)
		return Value{x}, err
	case TypeInt32:
		x, err := d.u32(field)
		return Value{int32(x)}, err
	case TypeFloat32:
		x, err := d.u32(field)
		return Value{math.Float32frombits(x)}, err
	case TypeUint64:
		x, err := d.u64(field)
		return Value{x}, err
	case TypeInt64:
		x, err := d.u64(field)
		return Value{int64(x)}, err
	case TypeFloat64:
		x, err := d.u64(field)
		return Value{math.Float64frombits(x)}, err
	case TypeBool:
		at := d.off
		x, err := d.u8(field)
		if err != nil {
			return Value{}, err
		}
		if x > 1 {
			return Value{}, d.malformed("%s: bool byte %d at offset %d, want 0 or 1", field, x, at)
		}
		return Value{x == 1}, nil
	case TypeString:
		s, err := d.str(field)
		return Value{s}, err
	case TypeArray:
		return d.array(field)
	}
	return Value{}, d.malformed("%s: unknown value type %d at offset %d", field, uint32(t), d.off-4)
}

func (d *decoder) array(field string) (Value, error) {
	if d.depth >= maxArrayDepth {
		return Value{}, d.malformed("%s: arrays nested deeper than %d", field, maxArrayDepth)
	}
	d.depth++
	defer func() { d.depth-- }()

	et, err := d.u32(field + " element type")
	if err != nil {
		return Value{}, err
	}
	elem := ValueType(et)
	minSize := elem.minSize()
	if minSize == 0 {
		return Value{}, d.malformed("%s: unknown array element type %d at offset %d", field, et, d.off-4)
	}
	n, err := d.count(field+" element count", minSize)
	if err != nil {
		return Value{}, err
	}
	if fs := elem.fixedSize(); fs != 0 && elem != TypeBool {
		p, _ := d.take(uint64(n)*fs, field) // count checked that it fits
		return fixedArray(elem, p, n), nil
	}
	// Leaf elements are read with a constant label; on failure the element
	// is read again with its index in the label, so errors name it without
	// formatting a label per element.
	var a []Value
	var strs []string
	switch elem {
	case TypeString:
		strs = make([]string, n)
	default:
		a = make([]Value, n)
	}
	for i := range n {
		at := d.off
		var v Value
		var err error
		switch elem {
		case TypeString:
			strs[i], err = d.str(field)
		case TypeArray: // label eagerly: re-reading would recurse
			if a[i], err = d.array(fmt.Sprintf("%s[%d]", field, i)); err != nil {
				return Value{}, err
			}
		default:
			v, err = d.value(elem, field)
			a[i] = v
		}
		if err != nil {
			d.off = at
			_, err = d.value(elem, fmt.Sprintf("%s[%d]", field, i))
			return Value{}, err
		}
	}
	switch elem {
	case TypeString:
		return Value{strs}, nil
	case TypeBool:
		bs := make([]bool, n)
		for i, v := range a {
			bs[i] = v.x.(bool)
		}
		return Value{bs}, nil
	}
	return Value{a}, nil
}

// fixedArray decodes n little-endian scalars of type t from p.
func fixedArray(t ValueType, p []byte, n int) Value {
	le := binary.LittleEndian
	switch t {
	case TypeUint8:
		return Value{append([]uint8{}, p...)}
	case TypeInt8:
		return Value{decodeN(p, n, 1, func(b []byte) int8 { return int8(b[0]) })}
	case TypeUint16:
		return Value{decodeN(p, n, 2, le.Uint16)}
	case TypeInt16:
		return Value{decodeN(p, n, 2, func(b []byte) int16 { return int16(le.Uint16(b)) })}
	case TypeUint32:
		return Value{decodeN(p, n, 4, le.Uint32)}
	case TypeInt32:
		return Value{decodeN(p, n, 4, func(b []byte) int32 { return int32(le.Uint32(b)) })}
	case TypeFloat32:
		return Value{decodeN(p, n, 4, func(b []byte) float32 { return math.Float32frombits(le.Uint32(b)) })}
	case TypeUint64:
		return Value{decodeN(p, n, 8, le.Uint64)}
	case TypeInt64:
		return Value{decodeN(p, n, 8, func(b []byte) int64 { return int64(le.Uint64(b)) })}
	default: // TypeFloat64
		return Value{decodeN(p, n, 8, func(b []byte) float64 { return math.Float64frombits(le.Uint64(b)) })}
	}
}

func decodeN[T any](p []byte, n, size int, f func([]byte) T) []T {
	out := make([]T, n)
	for i := range out {
		out[i] = f(p[i*size : i*size+size])
	}
	return out
}

// boundsError is a tensor lying past the end of the file: it matches both
// ErrTensorBounds and ErrTruncated, since a truncated file and a bad offset
// cannot be told apart.
type boundsError struct{ msg string }

func (e *boundsError) Error() string   { return e.msg }
func (e *boundsError) Unwrap() []error { return []error{ErrTensorBounds, ErrTruncated} }

// checkAlignment validates a general.alignment value.
func checkAlignment(v Value) (uint64, error) {
	a, isUint := v.Uint()
	if v.Type() == TypeArray || !isUint || a == 0 || a&(a-1) != 0 || a > MaxAlignment {
		return 0, fmt.Errorf("%w: %s = %v (%s), want an unsigned integer power of two <= %d",
			ErrMalformed, KeyAlignment, v, v.TypeName(), MaxAlignment)
	}
	return a, nil
}

// notRegular is Open's error for a path that is not a regular file.
func notRegular(m fs.FileMode) error {
	what := "not a regular file"
	if m.IsDir() {
		what = "a directory"
	}
	return fmt.Errorf("is %s, not a GGUF model file", what)
}
