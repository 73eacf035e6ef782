package model

import (
	"context"
	"errors"
	"math"
	"strings"
	"sync"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
)

// tinyMTP is tiny-qwen35moe with an MTP block (modelgen Spec.NextN 1).
var tinyMTP struct {
	once sync.Once
	data []byte
	err  error
}

func tinyQwen35MTP() ([]byte, error) {
	tinyMTP.once.Do(func() {
		s, err := modelgen.Preset("tiny-qwen35moe")
		if err != nil {
			tinyMTP.err = err
			return
		}
		s.NextN = 1
		tinyMTP.data, tinyMTP.err = modelgen.Bytes(s)
	})
	return tinyMTP.data, tinyMTP.err
}

// observe runs tokens at positions pos.. of seq through m (all rows'
// logits into a fresh buffer, returned) and shows them to d.
func observe(t *testing.T, m *Model, seq *Sequence, d *MTPDrafter, tokens []int32) []float32 {
	t.Helper()
	v, e := m.Params().Vocab, m.Params().Embd
	pos := seq.Len()
	rows := make([]Row, len(tokens))
	for i, tk := range tokens {
		rows[i] = Row{Seq: seq, Token: tk, Pos: pos + i, Logits: true}
	}
	logits := make([]float32, len(rows)*v)
	if err := m.Forward(context.Background(), rows, logits); err != nil {
		t.Fatal(err)
	}
	h := make([]float32, len(rows)*e)
	if err := m.Hidden(h); err != nil {
		t.Fatal(err)
	}
	if err := d.Observe(pos, tokens, h); err != nil {
		t.Fatal(err)
	}
	return logits
}

// TestMTPHead: a generated qwen35moe with an MTP block loads the head
// (Model.MTP), runs its main layers exactly as the file without the block,
// and drafts deterministically with finite logits; the drafts and the
// head's logits do not depend on how the main rows were batched or on
// earlier (dropped) chained drafts.
func TestMTPHead(t *testing.T) {
	_, m := parseBytes(t, tinyQwen35MTP)
	_, base := parseBytes(t, modelgen.TinyQwen35MoE)
	if m.MTP == nil || m.MTPErr() != nil {
		t.Fatalf("no MTP head: %v", m.MTPErr())
	}
	if p := m.Params(); p.NextN != 1 || p.Layers != 4 || p.ExpertLayers != 5 {
		t.Fatalf("nextn %d layers %d expert layers %d", p.NextN, p.Layers, p.ExpertLayers)
	}
	sameBits(t, "main logits with an MTP block", run(t, m, testTokens, 5), run(t, base, testTokens, 5))
	if !errors.Is(base.MTPErr(), ErrNoMTP) {
		t.Fatalf("model without MTP block: %v", base.MTPErr())
	}
	if _, err := base.NewMTPDrafter(); !errors.Is(err, ErrNoMTP) {
		t.Fatalf("drafter on a model without MTP block: %v", err)
	}

	ctx := context.Background()
	prompt, next := testTokens[:8], int32(77)
	draftAll := func() ([]int32, []float32) {
		seq := m.NewSequence()
		d, err := m.NewMTPDrafter()
		if err != nil {
			t.Fatal(err)
		}
		observe(t, m, seq, d, prompt)
		got, err := d.Draft(ctx, nil, next, 4)
		if err != nil {
			t.Fatal(err)
		}
		return got, append([]float32(nil), d.Logits()...)
	}
	d1, l1 := draftAll()
	d2, l2 := draftAll()
	if len(d1) != 4 || !equal(d1, d2) {
		t.Fatalf("drafts %v then %v", d1, d2)
	}
	sameBits(t, "MTP logits, second run", l2, l1)
	for i, v := range l1 {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("MTP logit %d = %v", i, v)
		}
	}
	t.Logf("drafts %v", d1)

	// The same state reached in pieces, with a draft (and its dropped
	// chained rows) and a rewind in between.
	seq := m.NewSequence()
	d, err := m.NewMTPDrafter()
	if err != nil {
		t.Fatal(err)
	}
	observe(t, m, seq, d, prompt[:3])
	if _, err := d.Draft(ctx, nil, prompt[3], 3); err != nil {
		t.Fatal(err)
	}
	if err := seq.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	observe(t, m, seq, d, []int32{prompt[3], 9, 9}) // a verification of rejected drafts
	if err := seq.Truncate(4); err != nil {
		t.Fatal(err)
	}
	if err := d.Truncate(4); err != nil {
		t.Fatal(err)
	}
	observe(t, m, seq, d, prompt[4:6])
	if _, err := d.Draft(ctx, nil, prompt[6], 1); err != nil {
		t.Fatal(err)
	}
	observe(t, m, seq, d, prompt[6:])
	got, err := d.Draft(ctx, nil, next, 4)
	if err != nil {
		t.Fatal(err)
	}
	if !equal(got, d1) {
		t.Fatalf("drafts in pieces %v, at once %v", got, d1)
	}
	sameBits(t, "MTP logits in pieces", d.Logits(), l1)
	// Again with nothing new observed: row 8 is redone, same drafts.
	if again, err := d.Draft(ctx, nil, next, 2); err != nil || !equal(again, d1[:2]) {
		t.Fatalf("drafting again: %v, %v (want %v)", again, err, d1[:2])
	}
}

// TestMTPHeadIncomplete: an MTP block missing its nextn tensors loads
// (the main model runs) without a head, and says which tensor is missing.
func TestMTPHeadIncomplete(t *testing.T) {
	f, _ := parseBytes(t, tinyQwen35MTP)
	w := copyWriter(t, f, func(ti *gguf.TensorInfo, _ *[]byte) bool { return ti.Name != "blk.4.nextn.hnorm.weight" })
	m, err := Load(reparse(t, w))
	if err != nil {
		t.Fatal(err)
	}
	if m.MTP != nil || !errors.Is(m.MTPErr(), ErrNoMTP) || !strings.Contains(m.MTPErr().Error(), "nextn.hnorm") {
		t.Fatalf("MTP %v, error %v", m.MTP != nil, m.MTPErr())
	}
}

func equal(a, b []int32) bool {
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
