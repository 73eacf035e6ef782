package gguf

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ValueType is a GGUF metadata value type id (enum gguf_type in
// ggml/include/gguf.h), stored as uint32 in the file.
type ValueType uint32

// GGUF metadata value types (gguf.h). Scalars occupy their Go size; Bool is
// one byte 0 or 1; String is a uint64 length plus bytes; Array is an element
// type, a uint64 count and the elements.
const (
	TypeUint8   ValueType = 0
	TypeInt8    ValueType = 1
	TypeUint16  ValueType = 2
	TypeInt16   ValueType = 3
	TypeUint32  ValueType = 4
	TypeInt32   ValueType = 5
	TypeFloat32 ValueType = 6
	TypeBool    ValueType = 7
	TypeString  ValueType = 8
	TypeArray   ValueType = 9
	TypeUint64  ValueType = 10
	TypeInt64   ValueType = 11
	TypeFloat64 ValueType = 12

	// TypeInvalid is reported by the zero Value; it never occurs in a file.
	TypeInvalid ValueType = math.MaxUint32
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32",
	"float32", "bool", "string", "array", "uint64", "int64", "float64"}

// String returns the gguf.h name of the type ("uint32"), or "type(N)".
func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	if t == TypeInvalid {
		return "invalid"
	}
	return "type(" + strconv.FormatUint(uint64(t), 10) + ")"
}

// fixedSize returns the encoded size in bytes of a scalar of type t (0 for
// string, array and unknown types).
func (t ValueType) fixedSize() uint64 {
	switch t {
	case TypeUint8, TypeInt8, TypeBool:
		return 1
	case TypeUint16, TypeInt16:
		return 2
	case TypeUint32, TypeInt32, TypeFloat32:
		return 4
	case TypeUint64, TypeInt64, TypeFloat64:
		return 8
	}
	return 0
}

// minSize returns the fewest bytes an encoded value of type t can take
// (used to bound counts before allocating), or 0 for an unknown type.
func (t ValueType) minSize() uint64 {
	switch t {
	case TypeString:
		return 8 // length
	case TypeArray:
		return 12 // element type + count
	}
	return t.fixedSize()
}

// Value is a typed GGUF metadata value. The zero Value is invalid. Values are
// made by the constructors (Uint32, String, Array, ...) or read from a file;
// the Go representation fixes the GGUF type, so a value read and written back
// keeps its type. Arrays hold a typed slice ([]uint32, []string, ...); an
// array of arrays holds []Value whose elements are all arrays.
type Value struct {
	x any
}

// Uint8 returns a uint8 Value.
func Uint8(v uint8) Value { return Value{v} }

// Int8 returns an int8 Value.
func Int8(v int8) Value { return Value{v} }

// Uint16 returns a uint16 Value.
func Uint16(v uint16) Value { return Value{v} }

// Int16 returns an int16 Value.
func Int16(v int16) Value { return Value{v} }

// Uint32 returns a uint32 Value.
func Uint32(v uint32) Value { return Value{v} }

// Int32 returns an int32 Value.
func Int32(v int32) Value { return Value{v} }

// Uint64 returns a uint64 Value.
func Uint64(v uint64) Value { return Value{v} }

// Int64 returns an int64 Value.
func Int64(v int64) Value { return Value{v} }

// Float32 returns a float32 Value.
func Float32(v float32) Value { return Value{v} }

// Float64 returns a float64 Value.
func Float64(v float64) Value { return Value{v} }

// Bool returns a bool Value.
func Bool(v bool) Value { return Value{v} }

// String returns a string Value (bytes stored as given; GGUF expects UTF-8).
func String(v string) Value { return Value{v} }

// ArrayElem lists the Go element types of GGUF arrays; Value elements make an
// array of arrays (each element must itself be an array).
type ArrayElem interface {
	uint8 | int8 | uint16 | int16 | uint32 | int32 | uint64 | int64 |
		float32 | float64 | bool | string | Value
}

// Array returns an array Value holding v (not copied: do not modify v
// afterwards). A nil v is an empty array of that element type.
func Array[T ArrayElem](v []T) Value {
	if v == nil {
		v = []T{}
	}
	return Value{v}
}

// Type returns the value's GGUF type, TypeInvalid for the zero Value.
func (v Value) Type() ValueType {
	switch v.x.(type) {
	case uint8:
		return TypeUint8
	case int8:
		return TypeInt8
	case uint16:
		return TypeUint16
	case int16:
		return TypeInt16
	case uint32:
		return TypeUint32
	case int32:
		return TypeInt32
	case float32:
		return TypeFloat32
	case bool:
		return TypeBool
	case string:
		return TypeString
	case uint64:
		return TypeUint64
	case int64:
		return TypeInt64
	case float64:
		return TypeFloat64
	case []uint8, []int8, []uint16, []int16, []uint32, []int32, []float32, []bool,
		[]string, []uint64, []int64, []float64, []Value:
		return TypeArray
	}
	return TypeInvalid
}

// ElemType returns the element type of an array Value (TypeArray for an
// array of arrays), or TypeInvalid if v is not an array.
func (v Value) ElemType() ValueType {
	switch v.x.(type) {
	case []uint8:
		return TypeUint8
	case []int8:
		return TypeInt8
	case []uint16:
		return TypeUint16
	case []int16:
		return TypeInt16
	case []uint32:
		return TypeUint32
	case []int32:
		return TypeInt32
	case []float32:
		return TypeFloat32
	case []bool:
		return TypeBool
	case []string:
		return TypeString
	case []uint64:
		return TypeUint64
	case []int64:
		return TypeInt64
	case []float64:
		return TypeFloat64
	case []Value:
		return TypeArray
	}
	return TypeInvalid
}

// TypeName describes the type for error messages: "uint32",
// "array of string", "invalid".
func (v Value) TypeName() string {
	if t := v.Type(); t != TypeArray {
		return t.String()
	}
	return "array of " + v.ElemType().String()
}

// Any returns the Go value: uint8 ... float64, bool, string, or for arrays a
// typed slice ([]uint32, []string, ..., []Value for arrays of arrays) shared
// with v. It is nil for the zero Value.
func (v Value) Any() any { return v.x }

// Len returns the number of elements of an array Value, 0 otherwise.
func (v Value) Len() int {
	switch a := v.x.(type) {
	case []uint8:
		return len(a)
	case []int8:
		return len(a)
	case []uint16:
		return len(a)
	case []int16:
		return len(a)
	case []uint32:
		return len(a)
	case []int32:
		return len(a)
	case []float32:
		return len(a)
	case []bool:
		return len(a)
	case []string:
		return len(a)
	case []uint64:
		return len(a)
	case []int64:
		return len(a)
	case []float64:
		return len(a)
	case []Value:
		return len(a)
	}
	return 0
}

// Uint returns an integer-typed value as uint64; ok is false for other types
// and for negative values.
func (v Value) Uint() (u uint64, ok bool) {
	switch x := v.x.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	}
	if i, isInt := v.signed(); isInt && i >= 0 {
		return uint64(i), true
	}
	return 0, false
}

func (v Value) signed() (int64, bool) {
	switch x := v.x.(type) {
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}

// Int returns an integer-typed value as int64; ok is false for other types
// and for a uint64 above math.MaxInt64.
func (v Value) Int() (i int64, ok bool) {
	if i, ok := v.signed(); ok {
		return i, true
	}
	switch x := v.x.(type) {
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	}
	return 0, false
}

// Float returns a float32 or float64 value as float64 (exact).
func (v Value) Float() (float64, bool) {
	switch x := v.x.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	return 0, false
}

// Bool returns a bool value.
func (v Value) Bool() (b, ok bool) {
	b, ok = v.x.(bool)
	return b, ok
}

// Str returns a string value.
func (v Value) Str() (s string, ok bool) {
	s, ok = v.x.(string)
	return s, ok
}

// Strings returns an array-of-string value (shared with v, do not modify).
func (v Value) Strings() ([]string, bool) {
	s, ok := v.x.([]string)
	return s, ok
}

// Ints returns an array of any integer type as a new []int64; ok is false for
// other types or if a uint64 element exceeds math.MaxInt64.
func (v Value) Ints() ([]int64, bool) {
	switch a := v.x.(type) {
	case []uint8:
		return convert(a, func(x uint8) int64 { return int64(x) }), true
	case []int8:
		return convert(a, func(x int8) int64 { return int64(x) }), true
	case []uint16:
		return convert(a, func(x uint16) int64 { return int64(x) }), true
	case []int16:
		return convert(a, func(x int16) int64 { return int64(x) }), true
	case []uint32:
		return convert(a, func(x uint32) int64 { return int64(x) }), true
	case []int32:
		return convert(a, func(x int32) int64 { return int64(x) }), true
	case []int64:
		return convert(a, func(x int64) int64 { return x }), true
	case []uint64:
		for _, x := range a {
			if x > math.MaxInt64 {
				return nil, false
			}
		}
		return convert(a, func(x uint64) int64 { return int64(x) }), true
	}
	return nil, false
}

// Floats returns an array of float32 or float64 as a new []float64.
func (v Value) Floats() ([]float64, bool) {
	switch a := v.x.(type) {
	case []float32:
		return convert(a, func(x float32) float64 { return float64(x) }), true
	case []float64:
		return convert(a, func(x float64) float64 { return x }), true
	}
	return nil, false
}

// Values returns the elements of any array as Values (a new slice; for an
// array of arrays, the elements shared with v).
func (v Value) Values() ([]Value, bool) {
	switch a := v.x.(type) {
	case []uint8:
		return toValues(a), true
	case []int8:
		return toValues(a), true
	case []uint16:
		return toValues(a), true
	case []int16:
		return toValues(a), true
	case []uint32:
		return toValues(a), true
	case []int32:
		return toValues(a), true
	case []float32:
		return toValues(a), true
	case []bool:
		return toValues(a), true
	case []string:
		return toValues(a), true
	case []uint64:
		return toValues(a), true
	case []int64:
		return toValues(a), true
	case []float64:
		return toValues(a), true
	case []Value:
		return a, true
	}
	return nil, false
}

func convert[S, D any](a []S, f func(S) D) []D {
	out := make([]D, len(a))
	for i, x := range a {
		out[i] = f(x)
	}
	return out
}

func toValues[T any](a []T) []Value {
	out := make([]Value, len(a))
	for i, x := range a {
		out[i] = Value{x}
	}
	return out
}

// String formats the value for humans; arrays longer than 8 elements are
// abbreviated as "[a b c ... (N elements)]".
func (v Value) String() string {
	switch x := v.x.(type) {
	case nil:
		return "<invalid>"
	case string:
		return strconv.Quote(x)
	}
	els, ok := v.Values()
	if !ok {
		return fmt.Sprint(v.x)
	}
	var b strings.Builder
	b.WriteByte('[')
	for i, e := range els {
		if i == 8 {
			fmt.Fprintf(&b, " ... (%d elements)", len(els))
			break
		}
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(e.String())
	}
	b.WriteByte(']')
	return b.String()
}
