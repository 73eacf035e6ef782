package gguf

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// Writer builds a GGUF v3 little-endian file: metadata in the order first
// set, tensors in the order added, each tensor's data padded with zeros to
// the alignment (general.alignment if set, else DefaultAlignment), as
// gguf-py's GGUFWriter and ggml's gguf_write_to_file lay it out. It is not
// safe for concurrent use.
type Writer struct {
	kvs     []KV
	kvIndex map[string]int
	tensors []Tensor
	tIndex  map[string]int
	noData  int // tensors added by AddTensorInfo
}

// NewWriter returns an empty Writer.
func NewWriter() *Writer {
	return &Writer{kvIndex: map[string]int{}, tIndex: map[string]int{}}
}

// Set sets key to v. Setting an existing key replaces its value and keeps
// its position. Invalid values (the zero Value, an array of arrays holding a
// non-array) are reported by WriteTo.
func (w *Writer) Set(key string, v Value) {
	if i, ok := w.kvIndex[key]; ok {
		w.kvs[i].Value = v
		return
	}
	w.kvIndex[key] = len(w.kvs)
	w.kvs = append(w.kvs, KV{Key: key, Value: v})
}

// SetString sets a string value.
func (w *Writer) SetString(key, v string) { w.Set(key, String(v)) }

// SetUint32 sets a uint32 value.
func (w *Writer) SetUint32(key string, v uint32) { w.Set(key, Uint32(v)) }

// SetInt32 sets an int32 value.
func (w *Writer) SetInt32(key string, v int32) { w.Set(key, Int32(v)) }

// SetUint64 sets a uint64 value.
func (w *Writer) SetUint64(key string, v uint64) { w.Set(key, Uint64(v)) }

// SetFloat32 sets a float32 value.
func (w *Writer) SetFloat32(key string, v float32) { w.Set(key, Float32(v)) }

// SetBool sets a bool value.
func (w *Writer) SetBool(key string, v bool) { w.Set(key, Bool(v)) }

// SetStrings sets an array of string (v is not copied).
func (w *Writer) SetStrings(key string, v []string) { w.Set(key, Array(v)) }

// SetInt32s sets an array of int32 (v is not copied).
func (w *Writer) SetInt32s(key string, v []int32) { w.Set(key, Array(v)) }

// SetFloat32s sets an array of float32 (v is not copied).
func (w *Writer) SetFloat32s(key string, v []float32) { w.Set(key, Array(v)) }

// AddTensor appends a tensor of type t with ggml dims ne (innermost first,
// 0..MaxDims entries; no entries is a single element) and its raw bytes, which must be exactly
// t.RowBytes(ne[0]) * ne[1] * ... long. data is not copied and must stay
// unchanged until WriteTo returns. Errors: over-long (MaxNameBytes) or
// duplicate name; unknown type (ErrTensorType); more than MaxDims dims or
// ne[0] not a multiple of the block size (ErrMalformed); overflowing size
// (ErrTensorBounds); wrong data length. The Writer accepts exactly the
// tensor infos that Parse accepts.
func (w *Writer) AddTensor(name string, t quant.Type, dims []uint64, data []byte) error {
	size, err := w.checkTensor(name, t, dims)
	if err != nil {
		return err
	}
	if uint64(len(data)) != size {
		return fmt.Errorf("gguf: tensor %q (%s, ne %v) needs %d bytes of data, got %d", name, t, dims, size, len(data))
	}
	w.tIndex[name] = len(w.tensors)
	w.tensors = append(w.tensors, Tensor{
		TensorInfo: TensorInfo{Name: name, Dims: append([]uint64(nil), dims...), Type: t, Size: size},
		Data:       data,
	})
	return nil
}

// AddTensorInfo appends a tensor like AddTensor (same checks, same
// errors) but without its data: the Writer then describes a file it cannot
// write. Layout counts such a tensor like any other; WriteTo refuses the
// Writer (ErrNoData). It serves callers that need a file's layout (its
// data offset, its tensors' offsets) without holding the data, e.g. to
// derive a smaller file from a model too large to write
// (engine/modelgen.Lazy).
func (w *Writer) AddTensorInfo(name string, t quant.Type, dims []uint64) error {
	size, err := w.checkTensor(name, t, dims)
	if err != nil {
		return err
	}
	w.tIndex[name] = len(w.tensors)
	w.tensors = append(w.tensors, Tensor{TensorInfo: TensorInfo{Name: name, Dims: append([]uint64(nil), dims...), Type: t, Size: size}})
	w.noData++
	return nil
}

// Layout returns the File that Parse would return for the bytes WriteTo
// writes, without the data: Version 3, Alignment, KVs (the values are
// shared with the Writer), Tensors with their offsets and sizes, and
// DataOffset. Its metadata accessors and TensorInfo work; Tensor fails
// with ErrNoData. The layout depends only on the metadata and the
// tensors' names, types and dims, so it is the same whether they were
// added with AddTensor or AddTensorInfo. Errors: those of WriteTo's
// metadata checks (an invalid value, a bad general.alignment).
func (w *Writer) Layout() (*File, error) {
	align, err := w.checkKVs()
	if err != nil {
		return nil, err
	}
	cw := &countWriter{w: io.Discard}
	e := &encoder{w: bufio.NewWriterSize(cw, 1<<16)}
	w.header(e, align)
	if e.err != nil {
		return nil, e.err
	}
	f := &File{Version: 3, Alignment: align, DataOffset: e.n, noData: true,
		KVs: append([]KV(nil), w.kvs...), kvIndex: make(map[string]int, len(w.kvs)),
		Tensors: make([]TensorInfo, len(w.tensors)), tIndex: make(map[string]int, len(w.tensors))}
	for i, kv := range f.KVs {
		f.kvIndex[kv.Key] = i
	}
	var off uint64
	for i, t := range w.tensors {
		f.Tensors[i] = t.TensorInfo
		f.Tensors[i].Dims = append([]uint64(nil), t.Dims...)
		f.Tensors[i].Offset = off
		f.tIndex[t.Name] = i
		off = padTo(off+t.Size, align)
	}
	return f, nil
}

// checkTensor validates a tensor to add (AddTensor's errors but the data
// length) and returns its size in bytes.
func (w *Writer) checkTensor(name string, t quant.Type, dims []uint64) (uint64, error) {
	if len(name) > MaxNameBytes {
		return 0, fmt.Errorf("gguf: tensor name %q is longer than %d bytes", name, MaxNameBytes)
	}
	if _, dup := w.tIndex[name]; dup {
		return 0, fmt.Errorf("gguf: duplicate tensor %q", name)
	}
	if !t.Known() {
		return 0, fmt.Errorf("%w: tensor %q has type id %d", ErrTensorType, name, uint32(t))
	}
	if len(dims) > MaxDims {
		return 0, fmt.Errorf("%w: tensor %q has %d dims, at most %d allowed", ErrMalformed, name, len(dims), MaxDims)
	}
	size, err := tensorSize(t, dims)
	if err != nil {
		return 0, fmt.Errorf("%w (tensor %q)", err, name)
	}
	return size, nil
}

// alignment returns general.alignment if set (validated), else 32.
func (w *Writer) alignment() (uint64, error) {
	i, ok := w.kvIndex[KeyAlignment]
	if !ok {
		return DefaultAlignment, nil
	}
	v := w.kvs[i].Value
	return checkAlignment(v)
}

func padTo(n, align uint64) uint64 { return (n + align - 1) / align * align }

// DataSize returns the bytes of the data section WriteTo writes: every
// tensor's data padded to the alignment (the header and metadata come on
// top). A caller writing into memory can size its buffer with it.
func (w *Writer) DataSize() uint64 {
	align, err := w.alignment()
	if err != nil {
		align = DefaultAlignment
	}
	var n uint64
	for _, t := range w.tensors {
		n = padTo(n+t.Size, align)
	}
	return n
}

// WriteTo writes the file to out and returns the bytes written. Errors: an
// invalid metadata value (wrapping ErrKeyType), a bad general.alignment, or
// out's write error.
func (w *Writer) WriteTo(out io.Writer) (int64, error) {
	if w.noData > 0 {
		return 0, fmt.Errorf("%w: %d tensors were added without their data (AddTensorInfo)", ErrNoData, w.noData)
	}
	align, err := w.checkKVs()
	if err != nil {
		return 0, err
	}
	cw := &countWriter{w: out}
	e := &encoder{w: bufio.NewWriterSize(cw, 1<<16)}
	w.header(e, align)
	for _, t := range w.tensors {
		e.write(t.Data)
		e.pad(align)
	}
	if e.err == nil {
		e.err = e.w.Flush()
	}
	return cw.n, e.err
}

// checkKVs validates the metadata values and returns the alignment.
func (w *Writer) checkKVs() (uint64, error) {
	align, err := w.alignment()
	if err != nil {
		return 0, err
	}
	for _, kv := range w.kvs {
		if err := checkValue(kv.Value, 0); err != nil {
			return 0, fmt.Errorf("gguf: key %q: %w", kv.Key, err)
		}
	}
	return align, nil
}

// header encodes everything before the data section: the magic, version,
// counts, metadata and tensor infos, then the padding to align (so e.n is
// the data section's offset).
func (w *Writer) header(e *encoder, align uint64) {
	e.write([]byte(Magic))
	e.u32(3)
	e.u64(uint64(len(w.tensors)))
	e.u64(uint64(len(w.kvs)))
	for _, kv := range w.kvs {
		e.str(kv.Key)
		e.u32(uint32(kv.Value.Type()))
		e.value(kv.Value)
	}
	var off uint64
	for _, t := range w.tensors {
		e.str(t.Name)
		e.u32(uint32(len(t.Dims)))
		for _, ne := range t.Dims {
			e.u64(ne)
		}
		e.u32(uint32(t.Type))
		e.u64(off)
		off = padTo(off+t.Size, align)
	}
	e.pad(align)
}

// ErrOutPath is CheckOutPath's error: the path names something a written
// file must not replace.
var ErrOutPath = errors.New("gguf: not a file to write")

// CheckOutPath returns nil when path may receive a written file: nothing
// is there yet, or a regular file (which is replaced). A folder, a
// symbolic link, a device, a FIFO or a socket is refused with ErrOutPath
// (writing renames a temporary file over path, which would replace the
// node itself: /dev/null turned into a model file), and an unreadable
// parent folder with the file system's error.
func CheckOutPath(path string) error {
	st, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case st.Mode().IsRegular():
		return nil
	case st.IsDir():
		return fmt.Errorf("%w: %s is a folder: give a file name in it", ErrOutPath, path)
	case st.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link: give the path of the file itself", ErrOutPath, path)
	default:
		return fmt.Errorf("%w: %s is not a regular file (%s): refusing to replace it", ErrOutPath, path, st.Mode().Type())
	}
}

// WriteFile writes the file to path atomically: to a temporary file in the
// same directory, synced, made mode 0644, then renamed over path. Errors:
// CheckOutPath's, those of WriteTo and the file system.
func (w *Writer) WriteFile(path string) (err error) {
	if err := CheckOutPath(path); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = w.WriteTo(tmp); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	// os.CreateTemp made it 0600; a model file is for others to read too
	// (a service user serving what an operator generated).
	if err = os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// checkValue reports values the encoder cannot write.
func checkValue(v Value, depth int) error {
	switch v.Type() {
	case TypeInvalid:
		return fmt.Errorf("%w: invalid (zero) Value", ErrKeyType)
	case TypeArray:
		if depth >= maxArrayDepth {
			return fmt.Errorf("%w: arrays nested deeper than %d", ErrKeyType, maxArrayDepth)
		}
		if a, ok := v.x.([]Value); ok {
			for i, e := range a {
				if e.Type() != TypeArray {
					return fmt.Errorf("%w: element %d of an array of arrays is %s", ErrKeyType, i, e.TypeName())
				}
				if err := checkValue(e, depth+1); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// encoder writes little-endian values, remembering the first error.
type encoder struct {
	w   *bufio.Writer
	n   uint64 // bytes written so far, for padding
	err error
	buf [8]byte
}

func (e *encoder) write(p []byte) {
	if e.err != nil {
		return
	}
	_, e.err = e.w.Write(p)
	e.n += uint64(len(p))
}

func (e *encoder) u8(x uint8) { e.buf[0] = x; e.write(e.buf[:1]) }
func (e *encoder) u16(x uint16) {
	binary.LittleEndian.PutUint16(e.buf[:], x)
	e.write(e.buf[:2])
}
func (e *encoder) u32(x uint32) {
	binary.LittleEndian.PutUint32(e.buf[:], x)
	e.write(e.buf[:4])
}
func (e *encoder) u64(x uint64) {
	binary.LittleEndian.PutUint64(e.buf[:], x)
	e.write(e.buf[:8])
}
func (e *encoder) str(s string) {
	e.u64(uint64(len(s)))
	if e.err == nil {
		_, e.err = e.w.WriteString(s)
		e.n += uint64(len(s))
	}
}

var zeros [4096]byte

func (e *encoder) pad(align uint64) {
	for n := padTo(e.n, align) - e.n; n > 0; {
		k := min(n, uint64(len(zeros)))
		e.write(zeros[:k])
		n -= k
	}
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// value writes v's payload (no type tag); v has passed checkValue.
func (e *encoder) value(v Value) {
	switch x := v.x.(type) {
	case uint8:
		e.u8(x)
	case int8:
		e.u8(uint8(x))
	case uint16:
		e.u16(x)
	case int16:
		e.u16(uint16(x))
	case uint32:
		e.u32(x)
	case int32:
		e.u32(uint32(x))
	case float32:
		e.u32(math.Float32bits(x))
	case bool:
		e.u8(boolByte(x))
	case string:
		e.str(x)
	case uint64:
		e.u64(x)
	case int64:
		e.u64(uint64(x))
	case float64:
		e.u64(math.Float64bits(x))
	default:
		e.u32(uint32(v.ElemType()))
		e.u64(uint64(v.Len()))
		switch a := x.(type) {
		case []uint8:
			e.write(a)
		case []int8:
			for _, y := range a {
				e.u8(uint8(y))
			}
		case []uint16:
			for _, y := range a {
				e.u16(y)
			}
		case []int16:
			for _, y := range a {
				e.u16(uint16(y))
			}
		case []uint32:
			for _, y := range a {
				e.u32(y)
			}
		case []int32:
			for _, y := range a {
				e.u32(uint32(y))
			}
		case []float32:
			for _, y := range a {
				e.u32(math.Float32bits(y))
			}
		case []bool:
			for _, y := range a {
				e.u8(boolByte(y))
			}
		case []string:
			for _, y := range a {
				e.str(y)
			}
		case []uint64:
			for _, y := range a {
				e.u64(y)
			}
		case []int64:
			for _, y := range a {
				e.u64(uint64(y))
			}
		case []float64:
			for _, y := range a {
				e.u64(math.Float64bits(y))
			}
		case []Value:
			for _, y := range a {
				e.value(y)
			}
		default:
			e.err = errors.New("gguf: internal error: unencodable value")
		}
	}
}
