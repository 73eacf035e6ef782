// Package gguf reads and writes GGUF files, the container format of
// llama.cpp models: a header, typed metadata key/values, tensor infos and a
// data section holding the tensors' bytes.
//
// Layout (little-endian; ggml/docs/gguf.md and ggml/src/gguf.cpp in llama.cpp
// at commit 3f545beccee69d9975f466ec7e45fd9aacd8ba90):
//
//	magic      "GGUF" (4 bytes)
//	version    uint32 (2 or 3 are read; 3 is written)
//	n_tensors  uint64
//	n_kv       uint64
//	n_kv x     { key string; type uint32; value }
//	n_tensors x{ name string; n_dims uint32; ne [n_dims]uint64 (innermost first);
//	             type uint32 (ggml_type); offset uint64 (relative to the data section) }
//	padding    zero bytes up to a multiple of general.alignment (default 32)
//	data       each tensor at its offset, each padded to the alignment
//
// where string = { len uint64; bytes [len] } and an array value is
// { elem_type uint32; count uint64; count x element }.
//
// Reading is zero-copy: Open memory-maps the file read-only and Tensor returns
// views into the mapping. Every count, length, offset and size read from the
// file is checked against what is left of the file before anything is
// allocated, so a hostile or truncated file yields an error wrapping one of
// the sentinel errors below, never a panic or a huge allocation.
package gguf

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Sentinel errors. Errors returned by this package wrap one of them and add
// what was being read and where (byte offset, key or tensor name).
var (
	// ErrMagic: the file does not start with "GGUF".
	ErrMagic = errors.New("gguf: bad magic (not a GGUF file)")
	// ErrVersion: version other than 2 or 3, or a big-endian file.
	ErrVersion = errors.New("gguf: unsupported version")
	// ErrTruncated: the file ends before something it declares (a count,
	// string or array that cannot fit in the bytes that are left).
	ErrTruncated = errors.New("gguf: truncated file")
	// ErrTensorType: a tensor's ggml type id is not a known quant.Type.
	ErrTensorType = errors.New("gguf: unknown tensor type")
	// ErrTensorBounds: a tensor's data lies (partly) outside the file, or its
	// size overflows uint64.
	ErrTensorBounds = errors.New("gguf: tensor outside the file")
	// ErrMalformed: any other structural error (unknown value type, duplicate
	// key or tensor name, bad alignment, too many dimensions, misaligned
	// tensor offset, row length not a multiple of the block size).
	ErrMalformed = errors.New("gguf: malformed file")
	// ErrMissingKey: a metadata key is absent.
	ErrMissingKey = errors.New("gguf: missing metadata key")
	// ErrKeyType: a metadata value has a type other than the one asked for,
	// or a value out of range of the requested Go type.
	ErrKeyType = errors.New("gguf: wrong metadata value type")
	// ErrNoTensor: no tensor of that name.
	ErrNoTensor = errors.New("gguf: no such tensor")
	// ErrClosed: the File was closed and its tensor data unmapped.
	ErrClosed = errors.New("gguf: file closed")
	// ErrNoData: the tensor data is not there: a File made by
	// Writer.Layout, or a Writer holding tensors added by AddTensorInfo.
	ErrNoData = errors.New("gguf: no tensor data")
)

// Magic is the 4-byte file signature.
const Magic = "GGUF"

// DefaultAlignment is the data alignment in bytes when general.alignment is
// absent (GGUF_DEFAULT_ALIGNMENT in ggml/include/gguf.h).
const DefaultAlignment = 32

// KeyAlignment is the metadata key that overrides DefaultAlignment; its value
// must be an unsigned integer power of two, at most MaxAlignment.
const KeyAlignment = "general.alignment"

// MaxAlignment is the largest general.alignment accepted, 64 KiB (the
// largest page size in use; a sanity bound so that padding stays small).
const MaxAlignment = 1 << 16

// MaxNameBytes is the longest tensor name read or written, 63 bytes
// (GGML_MAX_NAME = 64 including the NUL, ggml.h; gguf.cpp refuses longer).
const MaxNameBytes = 63

// MaxDims is the most dimensions a tensor may have (GGML_MAX_DIMS, ggml.h).
const MaxDims = 4

// maxArrayDepth bounds the nesting of array values (arrays of arrays).
const maxArrayDepth = 32

// KV is one metadata key/value pair, in file order.
type KV struct {
	Key   string
	Value Value
}

// TensorInfo describes one tensor of the file.
type TensorInfo struct {
	// Name is the tensor's name, e.g. "blk.0.ffn_gate_exps.weight".
	Name string
	// Dims is ggml's ne, innermost (contiguous) dimension first: a matrix of
	// rows x cols has Dims [cols, rows]. 0..MaxDims entries.
	Dims []uint64
	// Type is the ggml element type.
	Type quant.Type
	// Offset is the byte offset of the tensor's data relative to the start
	// of the data section (File.DataOffset); a multiple of the alignment.
	Offset uint64
	// Size is the tensor's size in bytes:
	// Type.RowBytes(Dims[0]) * Dims[1] * ... * Dims[n-1].
	Size uint64
}

// Elements returns the number of elements, the product of Dims (1 for a
// tensor with no dimensions). Parse guarantees it does not overflow.
func (t TensorInfo) Elements() uint64 {
	n := uint64(1)
	for _, d := range t.Dims {
		n *= d
	}
	return n
}

// Tensor is a tensor's info plus a view of its bytes.
type Tensor struct {
	TensorInfo
	// Data is a read-only view into the file's mapping (or the bytes given
	// to Parse), len(Data) == Size. It is valid until File.Close; writing to
	// it faults for a memory-mapped file.
	Data []byte
}

// File is a parsed GGUF file. Metadata (KVs, Tensors) is copied out of the
// file and stays valid after Close; tensor data (Tensor.Data) does not.
type File struct {
	// Version is the GGUF version read from the header (2 or 3).
	Version uint32
	// Alignment is the data alignment in bytes: general.alignment or
	// DefaultAlignment; a power of two.
	Alignment uint64
	// KVs holds the metadata in file order.
	KVs []KV
	// Tensors holds the tensor infos in file order.
	Tensors []TensorInfo
	// DataOffset is the absolute byte offset of the data section: the end
	// of the tensor infos rounded up to Alignment.
	DataOffset uint64

	data    []byte
	unmap   func() error
	closed  bool
	noData  bool // a Writer.Layout: no data
	kvIndex map[string]int
	tIndex  map[string]int
}

// Close releases the memory mapping made by Open; after it, Tensor fails
// with ErrClosed and earlier Tensor.Data views must not be used. Metadata
// accessors keep working. Close is idempotent.
func (f *File) Close() error {
	if f.closed {
		return nil
	}
	f.closed = true
	f.data = nil
	if f.unmap != nil {
		u := f.unmap
		f.unmap = nil
		return u()
	}
	return nil
}

// Value returns the value of a metadata key.
func (f *File) Value(key string) (Value, bool) {
	i, ok := f.kvIndex[key]
	if !ok {
		return Value{}, false
	}
	return f.KVs[i].Value, true
}

func (f *File) lookup(key string) (Value, error) {
	v, ok := f.Value(key)
	if !ok {
		return Value{}, fmt.Errorf("%w: %q", ErrMissingKey, key)
	}
	return v, nil
}

func keyTypeErr(key string, v Value, want string) error {
	return fmt.Errorf("%w: key %q is %s, want %s", ErrKeyType, key, v.TypeName(), want)
}

// String returns a string-typed metadata value. Errors wrap ErrMissingKey or
// ErrKeyType.
func (f *File) String(key string) (string, error) {
	v, err := f.lookup(key)
	if err != nil {
		return "", err
	}
	s, ok := v.Str()
	if !ok {
		return "", keyTypeErr(key, v, "string")
	}
	return s, nil
}

// Uint returns a metadata value of any integer type holding a value >= 0.
// Errors wrap ErrMissingKey or ErrKeyType (also for a negative value).
func (f *File) Uint(key string) (uint64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	u, ok := v.Uint()
	if !ok {
		return 0, keyTypeErr(key, v, "a non-negative integer")
	}
	return u, nil
}

// Int returns a metadata value of any integer type that fits in int64.
// Errors wrap ErrMissingKey or ErrKeyType.
func (f *File) Int(key string) (int64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	i, ok := v.Int()
	if !ok {
		return 0, keyTypeErr(key, v, "an integer fitting int64")
	}
	return i, nil
}

// Float returns a float32 or float64 metadata value as float64 (exact).
// Errors wrap ErrMissingKey or ErrKeyType.
func (f *File) Float(key string) (float64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	x, ok := v.Float()
	if !ok {
		return 0, keyTypeErr(key, v, "float32 or float64")
	}
	return x, nil
}

// Bool returns a bool metadata value. Errors wrap ErrMissingKey or ErrKeyType.
func (f *File) Bool(key string) (bool, error) {
	v, err := f.lookup(key)
	if err != nil {
		return false, err
	}
	b, ok := v.Bool()
	if !ok {
		return false, keyTypeErr(key, v, "bool")
	}
	return b, nil
}

// Strings returns an array-of-string metadata value. The slice is shared
// with the File: do not modify it. Errors wrap ErrMissingKey or ErrKeyType.
func (f *File) Strings(key string) ([]string, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	s, ok := v.Strings()
	if !ok {
		return nil, keyTypeErr(key, v, "array of string")
	}
	return s, nil
}

// Ints returns an array of any integer type as a new []int64. Errors wrap
// ErrMissingKey or ErrKeyType (also for a uint64 element > MaxInt64).
func (f *File) Ints(key string) ([]int64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	s, ok := v.Ints()
	if !ok {
		return nil, keyTypeErr(key, v, "array of integers fitting int64")
	}
	return s, nil
}

// Floats returns an array of float32 or float64 as a new []float64. Errors
// wrap ErrMissingKey or ErrKeyType.
func (f *File) Floats(key string) ([]float64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	s, ok := v.Floats()
	if !ok {
		return nil, keyTypeErr(key, v, "array of float32 or float64")
	}
	return s, nil
}

// Architecture returns general.architecture (e.g. "qwen3moe"), or "" when
// it is absent or not a string.
func (f *File) Architecture() string {
	s, _ := f.String("general.architecture")
	return s
}

// TensorInfo returns the info of the named tensor. The error wraps
// ErrNoTensor.
func (f *File) TensorInfo(name string) (TensorInfo, error) {
	i, ok := f.tIndex[name]
	if !ok {
		return TensorInfo{}, fmt.Errorf("%w: %q", ErrNoTensor, name)
	}
	return f.Tensors[i], nil
}

// Tensor returns the named tensor with a zero-copy view of its bytes. The
// error wraps ErrNoTensor, ErrClosed after Close, or ErrNoData for a
// Writer.Layout.
func (f *File) Tensor(name string) (Tensor, error) {
	ti, err := f.TensorInfo(name)
	if err != nil {
		return Tensor{}, err
	}
	if f.closed {
		return Tensor{}, fmt.Errorf("%w: tensor %q", ErrClosed, name)
	}
	if f.noData {
		return Tensor{}, fmt.Errorf("%w: tensor %q of a layout", ErrNoData, name)
	}
	// Parse checked DataOffset+Offset+Size <= len(f.data) without overflow.
	start := f.DataOffset + ti.Offset
	end := start + ti.Size
	return Tensor{TensorInfo: ti, Data: f.data[start:end:end]}, nil
}

// Summary summarises the file: version, counts, architecture.
func (f *File) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "GGUF v%d, %d KVs, %d tensors, alignment %d, data at %d",
		f.Version, len(f.KVs), len(f.Tensors), f.Alignment, f.DataOffset)
	if a := f.Architecture(); a != "" {
		fmt.Fprintf(&b, ", architecture %s", a)
	}
	return b.String()
}
