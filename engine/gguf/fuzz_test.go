package gguf

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// fuzzSeedFile is a small valid file made by the Writer: scalar, string,
// string-array, float-array and nested-array metadata and three tensors of
// different types.
func fuzzSeedFile(tb testing.TB) []byte {
	w := NewWriter()
	w.SetString("general.architecture", "qwen3moe")
	w.SetUint32("qwen3moe.block_count", 1)
	w.SetFloat32("qwen3moe.rope.freq_base", 1e6)
	w.SetStrings("tokenizer.ggml.tokens", []string{"a", "b", "<|endoftext|>"})
	w.SetInt32s("tokenizer.ggml.token_type", []int32{1, 1, 3})
	w.SetFloat32s("f", []float32{0.5})
	w.SetBool("b", true)
	w.Set("nested", Array([]Value{Array([]uint16{1, 2})}))
	for _, t := range []struct {
		name string
		typ  quant.Type
		dims []uint64
		size int
	}{{"a.weight", quant.F32, []uint64{4}, 16}, {"b.weight", quant.Q8_0, []uint64{32, 1}, 34}, {"c.weight", quant.Q4_K, []uint64{256}, 144}} {
		if err := w.AddTensor(t.name, t.typ, t.dims, bytes.Repeat([]byte{0x3c}, t.size)); err != nil {
			tb.Fatal(err)
		}
	}
	var buf bytes.Buffer
	if _, err := w.WriteTo(&buf); err != nil {
		tb.Fatal(err)
	}
	return buf.Bytes()
}

// FuzzParse checks that Parse never panics and that whatever it accepts is
// consistent: every tensor view lies inside the input with len == Size, and
// the file re-written by the Writer parses to the same metadata and tensors
// (write(parse(write(parse(x)))) == write(parse(x))).
//
// Run: go test -run '^$' -fuzz FuzzParse -fuzztime 20s ./engine/gguf/
func FuzzParse(f *testing.F) {
	valid := fuzzSeedFile(f)
	f.Add(valid)
	for _, n := range []int{0, 3, 4, 8, 16, 24, 40, len(valid) / 2, len(valid) - 100, len(valid) - 1} {
		f.Add(valid[:n])
	}
	f.Add(oneTensor(2))
	f.Add(header(3, 0, 1).str("s").u32(uint32(TypeString)).u64(1 << 60).b)                        // huge string length
	f.Add(header(3, 0, 1).str("a").u32(uint32(TypeArray)).u32(uint32(TypeString)).u64(1 << 61).b) // huge array
	f.Add(append([]byte("GGML"), valid[4:]...))                                                   // wrong magic
	f.Add(append([]byte("GGUF\x07\x00\x00\x00"), valid[8:]...))                                   // bad version
	f.Add(header(3, 1, 0).tinfo("t", 0, 1<<40, 4).pad(32).b)                                      // tensor out of bounds
	f.Add(header(3, 1, 0).tinfo("t", 99, 0, 4).pad(32).b)                                         // unknown tensor type
	f.Add(header(3, 1, 0).tinfo("t", 0, 0, 1<<32, 1<<32, 1<<32).pad(32).b)                        // dims overflow

	deep := header(3, 0, 1).str("deep").u32(uint32(TypeArray)) // arrays nested past the limit
	for range 40 {
		deep.u32(uint32(TypeArray)).u64(1)
	}
	f.Add(deep.b)

	f.Fuzz(func(t *testing.T, data []byte) {
		g, err := Parse(data)
		if err != nil {
			if g != nil {
				t.Fatal("non-nil File with an error")
			}
			for _, s := range []error{ErrMagic, ErrVersion, ErrTruncated, ErrTensorType, ErrTensorBounds, ErrMalformed} {
				if errors.Is(err, s) {
					return
				}
			}
			t.Fatalf("error wraps no sentinel: %v", err)
		}
		for _, ti := range g.Tensors {
			tn, err := g.Tensor(ti.Name)
			if err != nil {
				t.Fatal(err)
			}
			if uint64(len(tn.Data)) != ti.Size || g.DataOffset+ti.Offset+ti.Size > uint64(len(data)) {
				t.Fatalf("tensor %q view %d bytes, size %d", ti.Name, len(tn.Data), ti.Size)
			}
		}
		var w1, w2 bytes.Buffer
		if _, err := rewrite(t, g).WriteTo(&w1); err != nil {
			t.Fatalf("re-write of an accepted file: %v", err)
		}
		g2, err := Parse(w1.Bytes())
		if err != nil {
			t.Fatalf("re-written file does not parse: %v", err)
		}
		if len(g2.KVs) != len(g.KVs) || len(g2.Tensors) != len(g.Tensors) {
			t.Fatalf("re-write changed counts")
		}
		for i, ti := range g.Tensors {
			a, _ := g.Tensor(ti.Name)
			b, err := g2.Tensor(g2.Tensors[i].Name)
			if err != nil || b.Name != a.Name || b.Type != a.Type || !bytes.Equal(a.Data, b.Data) {
				t.Fatalf("tensor %d changed on re-write: %v", i, err)
			}
		}
		if _, err := rewrite(t, g2).WriteTo(&w2); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(w1.Bytes(), w2.Bytes()) {
			t.Fatal("write(parse(.)) is not idempotent")
		}
	})
}
