package model

import (
	"sync"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// BenchmarkQwen35_35B_A3B_4L runs a 4-layer Q4_K model with Qwen3.5-35B-A3B
// layer shapes (modelgen preset qwen3.5-35b-a3b: 3 Gated DeltaNet layers of
// 16 key / 32 value heads of 128 and one gated attention layer of 16/2
// heads of 256, 256 experts top-8 of FFN 512 plus a shared expert; ~1.9
// GB, far beyond the caches) generated in memory once per process. Decode
// reads ~BytesPerToken of weights per token; the recurrent state (32 x
// 128 x 128 float32 per linear layer) is read and written once per token
// too.
func BenchmarkQwen35_35B_A3B_4L(b *testing.B) {
	m := presetModel(b, &q35, "qwen3.5-35b-a3b")
	b.Run("decode", func(b *testing.B) { benchDecode(b, m) })
	b.Run("prefill64", func(b *testing.B) { benchPrefill(b, m) })
}

// presetOnce holds a benchmark model generated in memory once per process.
type presetOnce struct {
	once sync.Once
	m    *Model
	err  error
}

var q30, q35 presetOnce

// presetModel generates modelgen preset with 4 Q4_K layers in memory once
// (writing it to disk first only adds I/O time) and loads it.
func presetModel(b *testing.B, p *presetOnce, preset string) *Model {
	p.once.Do(func() {
		f, err := modelgen.PresetFile(preset, 4, quant.Q4_K)
		if err != nil {
			p.err = err
			return
		}
		p.m, p.err = Load(f)
	})
	if p.err != nil {
		b.Fatal(p.err)
	}
	return p.m
}

// BenchmarkFixtureQwen35Q4KM runs the qwen35moe Q4_K_M fixture (cache-sized:
// a check of the per-token overheads, not of memory speed).
func BenchmarkFixtureQwen35Q4KM(b *testing.B) {
	skipNoFixtures(b)
	_, m := loadFixture(b, "tiny-qwen35moe-Q4_K_M")
	b.Run("decode", func(b *testing.B) { benchDecode(b, m) })
	b.Run("prefill64", func(b *testing.B) { benchPrefill(b, m) })
}
