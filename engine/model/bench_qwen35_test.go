package model

import (
	"sync"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

var q35 struct {
	once sync.Once
	m    *Model
	err  error
}

// BenchmarkQwen35_35B_A3B_4L runs a 4-layer Q4_K model with Qwen3.5-35B-A3B
// layer shapes (modelgen preset qwen3.5-35b-a3b: 3 Gated DeltaNet layers of
// 16 key / 32 value heads of 128 and one gated attention layer of 16/2
// heads of 256, 256 experts top-8 of FFN 512 plus a shared expert; ~1.9
// GB, far beyond the caches) generated in memory once per process. Decode
// reads ~BytesPerToken of weights per token; the recurrent state (32 x
// 128 x 128 float32 per linear layer) is read and written once per token
// too.
func BenchmarkQwen35_35B_A3B_4L(b *testing.B) {
	q35.once.Do(func() {
		s, err := modelgen.Preset("qwen3.5-35b-a3b")
		if err != nil {
			q35.err = err
			return
		}
		s.Layers, s.Type = 4, quant.Q4_K
		data, err := modelgen.Bytes(s)
		if err != nil {
			q35.err = err
			return
		}
		f, err := gguf.Parse(data)
		if err != nil {
			q35.err = err
			return
		}
		q35.m, q35.err = Load(f)
	})
	if q35.err != nil {
		b.Fatal(q35.err)
	}
	b.Run("decode", func(b *testing.B) { benchDecode(b, q35.m) })
	b.Run("prefill64", func(b *testing.B) { benchPrefill(b, q35.m) })
}

// BenchmarkFixtureQwen35Q4KM runs the qwen35moe Q4_K_M fixture (cache-sized:
// a check of the per-token overheads, not of memory speed).
func BenchmarkFixtureQwen35Q4KM(b *testing.B) {
	skipNoFixtures(b)
	_, m := loadFixture(b, "tiny-qwen35moe-Q4_K_M")
	b.Run("decode", func(b *testing.B) { benchDecode(b, m) })
	b.Run("prefill64", func(b *testing.B) { benchPrefill(b, m) })
}
