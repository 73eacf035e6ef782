package model

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

const fixtures = "../../../shared/fixtures"

type refFile struct {
	NVocab  int `json:"n_vocab"`
	Prompts []struct {
		Prompt       string   `json:"prompt"`
		PromptTokens []int32  `json:"prompt_tokens"`
		GenTokens    []int32  `json:"gen_tokens"`
		Rows         []refRow `json:"rows"`
	} `json:"prompts"`
}

// refRow is one logits row of a reference file (fixtures README, refs/).
type refRow struct {
	Pos          int         `json:"pos"`
	InputToken   int32       `json:"input_token"`
	IsGen        bool        `json:"is_generation_step"`
	Top          [][]float64 `json:"top"`
	Gap          float64     `json:"gap_top1_top2"`
	RouterMargin *float64    `json:"router_min_margin"` // null where the fixture has no numpy reference (qwen35moe)
}

func skipNoFixtures(t testing.TB) {
	if _, err := os.Stat(fixtures); err != nil {
		t.Skipf("fixtures not found at %s (llama.cpp reference checks skipped; the generated-model tests still run)", fixtures)
	}
}

// fixtureDir returns the folder of fixture name: qwen35moe files live in
// their own subfolder (with its own refs/).
func fixtureDir(name string) string {
	if strings.Contains(name, "qwen35moe") {
		return filepath.Join(fixtures, "qwen35moe")
	}
	return fixtures
}

func loadFixture(t testing.TB, name string) (*gguf.File, *Model) {
	t.Helper()
	f, err := gguf.Open(filepath.Join(fixtureDir(name), name+".gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	m, err := Load(f)
	if err != nil {
		t.Fatal(err)
	}
	return f, m
}

// logitBound is the error allowed against llama.cpp's top-32 logits at any
// row, per model. It is the float64 reference's measured end-to-end error
// when it applies ggml's activation conversions (ACTIVATIONS.md: max |diff|
// A 0.0525, B 2.18, C 4.70), plus 10%: an engine that follows ggml's
// conversions in float32 can match llama.cpp only that well, because its
// float32 sums differ from ggml's kernels in the last bits and now and then
// put a Q8 activation code (or F16 activation) on the other side of a
// rounding boundary; that row and, via the KV cache, later rows then move by
// up to a few logits (rows without such a flip agree to ~1e-5 on Q8_0 and
// Q4_K_M). This engine measures F16 0.043, Q8_0 2.18, Q4_K_M 4.69 (logged as
// "over all rows").
//
// Greedy tokens must equal llama.cpp's up to the first step whose llama.cpp
// top-1/top-2 gap is below logitBound, or that follows a row whose router
// K-th/(K+1)-th margin is below routerBound (router logits agree to ~1e-5
// on rows without a flip; 1e-3 leaves 100x). Beyond that, teacher-forced
// argmax over all 64 generation rows must agree at least as often as the
// float64 reference's did (minArgmax; ACTIVATIONS.md: 64, 63, 63).
var (
	logitBound = map[string]float64{"tiny-qwen3moe-F16": 0.058, "tiny-qwen3moe-Q8_0": 2.4, "tiny-qwen3moe-Q4_K_M": 5.2}
	minArgmax  = map[string]int{"tiny-qwen3moe-F16": 64, "tiny-qwen3moe-Q8_0": 63, "tiny-qwen3moe-Q4_K_M": 63,
		"tiny-qwen35moe-F16": 64, "tiny-qwen35moe-Q4_K_M": 63}
	// promptBound is logitBound per prompt for the qwen35moe fixtures,
	// which have no float64 reference (router_min_margin is null): this
	// engine's measured max |diff| over all rows of that prompt plus ~10%
	// (F16 0.028 / 0.043 / 0.943 / 0.031; Q4_K_M 1.5e-5 / 2.9e-4 / 0.529 /
	// 3.69, logged as "over all rows"). Rows without an activation-rounding
	// flip agree to ~0.03 (F16, whose activations round to fp16) and
	// ~2e-5 (Q4_K_M); a flip (F16 prompt 2 row 20; Q4_K_M prompt 2 from
	// row 0, prompt 3 from row 8) moves that row and later ones by up to a
	// few logits, as ACTIVATIONS.md measured for qwen3moe. So Q4_K_M
	// prompt 0, whose smallest llama.cpp gap is 0.0067, must give all 16
	// of llama.cpp's greedy tokens.
	promptBound = map[string][]float64{"tiny-qwen35moe-F16": {0.035, 0.05, 1.04, 0.035},
		"tiny-qwen35moe-Q4_K_M": {1e-3, 1e-3, 0.6, 4.1}}
)

const routerBound = 1e-3

func TestFixtures(t *testing.T) {
	skipNoFixtures(t)
	for _, name := range []string{"tiny-qwen3moe-F16", "tiny-qwen3moe-Q8_0", "tiny-qwen3moe-Q4_K_M",
		"tiny-qwen35moe-F16", "tiny-qwen35moe-Q4_K_M"} {
		t.Run(name, func(t *testing.T) {
			var ref refFile
			b, err := os.ReadFile(filepath.Join(fixtureDir(name), "refs", name+".ref.json"))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, &ref); err != nil {
				t.Fatal(err)
			}
			f, m := loadFixture(t, name)
			tok, err := tokenizer.FromGGUF(f)
			if err != nil {
				t.Fatal(err)
			}
			if m.Params().Vocab != ref.NVocab {
				t.Fatalf("vocab %d, want %d", m.Params().Vocab, ref.NVocab)
			}
			argmax := 0
			for pi, p := range ref.Prompts {
				ids := tok.Tokenize(p.Prompt, true, false)
				if !equalIDs(ids, p.PromptTokens) {
					t.Errorf("prompt %d: tokens %v, want %v", pi, ids, p.PromptTokens)
				}
				argmax += checkPrompt(t, m, name, pi, p.PromptTokens, p.GenTokens, ref.NVocab, p.Rows)
			}
			t.Logf("%s: teacher-forced argmax equal to llama.cpp's token at %d of %d generation rows", name, argmax, 16*len(ref.Prompts))
			if argmax < minArgmax[name] {
				t.Errorf("%s: argmax agrees at %d generation rows, want >= %d", name, argmax, minArgmax[name])
			}
		})
	}
}

// checkPrompt feeds llama.cpp's sequence (prompt in one batch, then each
// generated token singly, as the reference did) and compares every row. It
// returns at how many generation rows our argmax is llama.cpp's next token.
func checkPrompt(t *testing.T, m *Model, name string, pi int, prompt, gen []int32, vocab int, rows []refRow) int {
	seq := m.NewSequence()
	np := len(prompt)
	all := make([]float32, (np+len(gen))*vocab)
	batch := make([]Row, np)
	for i, tk := range prompt {
		batch[i] = Row{Seq: seq, Token: tk, Pos: i, Logits: true}
	}
	if err := m.Forward(context.Background(), batch, all[:np*vocab]); err != nil {
		t.Fatal(err)
	}
	for s, tk := range gen {
		pos := np + s
		if err := m.Forward(context.Background(), []Row{{Seq: seq, Token: tk, Pos: pos, Logits: true}}, all[pos*vocab:(pos+1)*vocab]); err != nil {
			t.Fatal(err)
		}
	}
	fragile := false
	bound := logitBound[name]
	if pb, ok := promptBound[name]; ok {
		bound = pb[pi]
	}
	var cleanMax, allMax float64
	minCos := 1.0
	matched, argmax := 0, 0
	for i, r := range rows {
		lg := all[i*vocab : (i+1)*vocab]
		var diff, dot, na, nb float64
		for _, pair := range r.Top {
			got := float64(lg[int(pair[0])])
			diff = max(diff, math.Abs(got-pair[1]))
			dot += got * pair[1]
			na += got * got
			nb += pair[1] * pair[1]
		}
		allMax = max(allMax, diff)
		minCos = min(minCos, dot/math.Sqrt(na*nb))
		if diff > bound {
			t.Errorf("%s prompt %d row %d: max |logit diff| %.3g > %g", name, pi, i, diff, bound)
		}
		if !fragile {
			cleanMax = max(cleanMax, diff)
		}
		if r.RouterMargin != nil && *r.RouterMargin < routerBound {
			fragile = true
		}
		if r.IsGen {
			s := i - (np - 1)
			got := Greedy(lg)
			if got == gen[s] {
				argmax++
			}
			if got == gen[s] && matched == s {
				matched++
			} else if got != gen[s] && !fragile && r.Gap > bound && matched == s {
				t.Errorf("%s prompt %d step %d: greedy %d, llama.cpp %d (gap %.3g, router margin %v)", name, pi, s, got, gen[s], r.Gap, r.RouterMargin)
			}
			if r.Gap <= bound {
				fragile = true
			}
		}
	}
	t.Logf("%s prompt %d: greedy tokens equal for %d/%d steps; top-32 logits: max |diff| %.3g before the first fragile row, %.3g over all rows, min cosine %.7f",
		name, pi, matched, len(gen), cleanMax, allMax, minCos)
	if name == "tiny-qwen3moe-F16" && pi == 0 {
		checkFullLogits(t, all, vocab)
	}
	return argmax
}

// checkFullLogits compares model A prompt 0 with llama.cpp's full logits
// (21 x 50257): cosine >= 0.99999 per row (issue 2), max |diff| logged.
func checkFullLogits(t *testing.T, all []float32, vocab int) {
	b, err := os.ReadFile(filepath.Join(fixtures, "refs", "tiny-qwen3moe-F16.prompt0.full_logits.f32"))
	if err != nil {
		t.Fatal(err)
	}
	n := len(b) / 4 / vocab
	minCos, maxDiff := 1.0, 0.0
	for r := range n {
		var dot, na, nb float64
		for j := range vocab {
			want := float64(math.Float32frombits(binary.LittleEndian.Uint32(b[4*(r*vocab+j):])))
			got := float64(all[r*vocab+j])
			dot += want * got
			na += want * want
			nb += got * got
			maxDiff = max(maxDiff, math.Abs(want-got))
		}
		minCos = min(minCos, dot/math.Sqrt(na*nb))
	}
	t.Logf("F16 prompt 0 full logits (%d rows): min cosine %.8f, max |diff| %.3g", n, minCos, maxDiff)
	if minCos < 0.99999 {
		t.Errorf("F16 full logits: min cosine %.8f < 0.99999", minCos)
	}
}

func equalIDs(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
