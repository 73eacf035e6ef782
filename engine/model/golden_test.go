package model

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/quant"
)

// TestGoldenLogits is a regression lock for performance work: with
// KVASIR_GOLDEN_DIR set, it runs fixed scenarios (prefill in one batch with
// every row's logits, greedy decode steps, two sequences interleaved with
// logits asked for some rows only; on 1, 2 and 3 threads) on the fixture
// models and on generated models, and either records every logit as raw
// float32 bits (first run: DIR/<scenario>.f32 absent) or compares the run
// bit-for-bit with the recording. Record with the code before a change,
// compare after it. Without the variable it is skipped (the invariance
// tests in model_test.go still run by default).
func TestGoldenLogits(t *testing.T) {
	dir := os.Getenv("KVASIR_GOLDEN_DIR")
	if dir == "" {
		t.Skip("KVASIR_GOLDEN_DIR not set: golden logits harness skipped")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	type model struct {
		name string
		m    func(t *testing.T) *Model
	}
	gen := func(s modelgen.Spec) func(t *testing.T) *Model {
		return func(t *testing.T) *Model { _, m := genModel(t, s); return m }
	}
	tiny, err := modelgen.Preset("tiny")
	if err != nil {
		t.Fatal(err)
	}
	mix := tiny
	mix.Mix, mix.Type, mix.Seed = true, quant.Q4_K, 7
	// Wider: 8 q heads over 2 kv heads, d 512, 32 experts top-4, vocab 2048
	// (attention and the output head take their multi-threaded paths).
	wide := modelgen.Spec{Name: "golden-wide", Layers: 2, Embd: 512, Heads: 8, HeadsKV: 2, HeadDim: 64,
		Experts: 32, ExpertsUsed: 4, ExpertFF: 256, Context: 4096, RopeBase: 1e6, NormEps: 1e-6,
		Vocab: 2048, Type: quant.Q4_K, Mix: true, Seed: 3}
	f16 := tiny
	f16.Type, f16.Seed = quant.F16, 5
	// qwen35moe (Gated DeltaNet): the preset, its Q4_K_M mix, and a wider
	// one of 4 key / 8 value heads of 64 whose decode steps take the
	// recurrence's multi-threaded path.
	q35, err := modelgen.Preset("tiny-qwen35moe")
	if err != nil {
		t.Fatal(err)
	}
	q35mix := q35
	q35mix.Mix, q35mix.Type, q35mix.Seed = true, quant.Q4_K, 9
	q35wide := q35mix
	q35wide.SSMGroups, q35wide.SSMDtRank, q35wide.SSMInner, q35wide.Seed = 4, 8, 512, 11
	models := []model{
		{"gen-tiny-Q8_0", gen(tiny)},
		{"gen-tiny-Q4_K_M", gen(mix)},
		{"gen-tiny-F16", gen(f16)},
		{"gen-wide-Q4_K_M", gen(wide)},
		{"gen-tiny-qwen35moe-Q8_0", gen(q35)},
		{"gen-tiny-qwen35moe-Q4_K_M", gen(q35mix)},
		{"gen-wide-qwen35moe-Q4_K_M", gen(q35wide)},
	}
	if _, err := os.Stat(fixtures); err == nil {
		for _, n := range []string{"tiny-qwen3moe-Q4_K_M", "tiny-qwen3moe-Q8_0", "tiny-qwen3moe-F16",
			"tiny-qwen35moe-Q4_K_M", "tiny-qwen35moe-F16"} {
			models = append(models, model{"fix-" + n, func(t *testing.T) *Model { _, m := loadFixture(t, n); return m }})
		}
	} else {
		t.Logf("fixtures absent: fixture scenarios skipped")
	}
	for _, mc := range models {
		t.Run(mc.name, func(t *testing.T) {
			m := mc.m(t)
			for _, threads := range []int{1, 2, 3} {
				m.SetThreads(threads)
				got := goldenScenario(t, m)
				// Thread count must not matter: both runs compare with one file.
				golden(t, filepath.Join(dir, mc.name+".f32"), got)
			}
			m.SetThreads(0)
		})
	}
}

// goldenScenario returns the concatenated logits of: a 40-token prefill of
// sequence A (every row), 24 greedy decode steps of A, then a batch that
// decodes A and prefills a new sequence B interleaved (logits for B's last
// row and every A row), then 8 two-row steps of A and B.
func goldenScenario(t *testing.T, m *Model) []float32 {
	t.Helper()
	ctx := context.Background()
	v := m.Params().Vocab
	var all []float32
	fwd := func(rows []Row) []float32 {
		nl := 0
		for _, r := range rows {
			if r.Logits {
				nl++
			}
		}
		lg := make([]float32, nl*v)
		if err := m.Forward(ctx, rows, lg); err != nil {
			t.Fatal(err)
		}
		all = append(all, lg...)
		return lg
	}
	a, b := m.NewSequence(), m.NewSequence()
	rows := make([]Row, 40)
	for i := range rows {
		rows[i] = Row{Seq: a, Token: int32((i*7919 + 13) % v), Pos: i, Logits: true}
	}
	lg := fwd(rows)
	next := Greedy(lg[39*v:])
	for range 24 {
		lg = fwd([]Row{{Seq: a, Token: next, Pos: a.Len(), Logits: true}})
		next = Greedy(lg)
	}
	rows = rows[:0]
	for i := range 12 {
		if i%3 == 0 {
			rows = append(rows, Row{Seq: a, Token: int32((i*31 + 5) % v), Pos: a.Len() + i/3, Logits: true})
		}
		rows = append(rows, Row{Seq: b, Token: int32((i*104729 + 1) % v), Pos: i, Logits: i == 11})
	}
	fwd(rows)
	for s := range 8 {
		fwd([]Row{{Seq: b, Token: int32((s*17 + 2) % v), Pos: b.Len(), Logits: true},
			{Seq: a, Token: int32((s*23 + 9) % v), Pos: a.Len(), Logits: s%2 == 0}})
	}
	return all
}

// golden records got at path when absent, else compares bit-for-bit.
func golden(t *testing.T, path string, got []float32) {
	t.Helper()
	var buf bytes.Buffer
	if err := binary.Write(&buf, binary.LittleEndian, got); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(buf.Bytes())
	want, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("recorded %s (%d logits, sha256 %s)", path, len(got), hex.EncodeToString(sum[:8]))
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(want, buf.Bytes()) {
		t.Logf("%s: %d logits bit-identical (sha256 %s)", filepath.Base(path), len(got), hex.EncodeToString(sum[:8]))
		return
	}
	if len(want) != buf.Len() {
		t.Fatalf("%s: %d bytes recorded, %d now", path, len(want), buf.Len())
	}
	for i := range got {
		w := math.Float32frombits(binary.LittleEndian.Uint32(want[4*i:]))
		if math.Float32bits(w) != math.Float32bits(got[i]) {
			t.Fatalf("%s: logit %d differs: %v recorded, %v now", path, i, w, got[i])
		}
	}
}
