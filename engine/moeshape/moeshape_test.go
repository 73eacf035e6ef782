package moeshape

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// TestRead reads the shape of a small written file, key by key, and the
// error of one without block_count.
func TestRead(t *testing.T) {
	open := func(t *testing.T, set func(w *gguf.Writer)) *gguf.File {
		t.Helper()
		w := gguf.NewWriter()
		set(w)
		var b bytes.Buffer
		if _, err := w.WriteTo(&b); err != nil {
			t.Fatal(err)
		}
		f, err := gguf.Parse(b.Bytes())
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	f := open(t, func(w *gguf.Writer) {
		w.SetString("general.architecture", "qwen35moe")
		w.SetUint32("qwen35moe.block_count", 49)
		w.SetUint32("qwen35moe.expert_count", 256)
		w.SetUint32("qwen35moe.expert_used_count", 8)
		w.SetUint32("qwen35moe.embedding_length", 3072)
		w.SetUint32("qwen35moe.expert_feed_forward_length", 1024)
		w.SetUint32("qwen35moe.nextn_predict_layers", 1)
	})
	got, err := Read(f)
	want := Shape{Arch: "qwen35moe", Layers: 49, Experts: 256, ExpertsUsed: 8, DModel: 3072, DFF: 1024, NextN: 1}
	if err != nil || got != want {
		t.Fatalf("Read = %+v, %v; want %+v", got, err, want)
	}
	f = open(t, func(w *gguf.Writer) {
		w.SetString("general.architecture", "qwen3moe")
		w.SetUint32("qwen3moe.expert_count", 16)
	})
	got, err = Read(f)
	if !errors.Is(err, gguf.ErrMissingKey) || got != (Shape{Arch: "qwen3moe", Experts: 16}) {
		t.Fatalf("without block_count: %+v, %v", got, err)
	}
	for v, want := range map[uint64]int{0: 0, 7: 7, 1 << 31: 1 << 31, 1<<31 + 1: 0, 1 << 63: 0} {
		if got := Int(v); got != want {
			t.Errorf("Int(%d) = %d, want %d", v, got, want)
		}
	}
}
