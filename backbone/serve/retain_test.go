package serve

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/kvasir-ai/kvasir/engine/model"
)

// TestLongSequenceNotPinned: a request that takes a sequence from the
// scheduler's pool and grows it past poolMaxPositions is not pooled again
// when it ends (release), and nothing else keeps it: not the pool's
// backing array, not the step's rows and owners, not the model's
// workspace. Its KV cache is garbage once the step is over, with the
// server idle.
func TestLongSequenceNotPinned(t *testing.T) {
	m, tok := loadTiny(t)
	s, err := New(Config{Model: m, Tokenizer: tok, Logger: quiet}) // not started: this test steps the scheduler itself
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	sc := &scheduler{s: s, l: s.lanes[0], ctx: context.Background()}
	pooled := m.NewSequence()
	sc.free = append(sc.free, pooled)
	wp := weak.Make(pooled)
	pooled = nil

	prompt := make([]int32, poolMaxPositions+8) // longer than a pooled sequence may be
	for i := range prompt {
		prompt[i] = int32(1 + i%(m.Params().Vocab-1))
	}
	st, err := s.Submit(context.Background(), Job{Prompt: prompt, MaxTokens: 1, Sampler: model.SamplerOptions{Temperature: 0}})
	if err != nil {
		t.Fatal(err)
	}
	sc.admit()
	if len(sc.active) != 1 || sc.active[0].seq != wp.Value() || len(sc.free) != 0 {
		t.Fatalf("admit did not take the pooled sequence: %d active, %d free", len(sc.active), len(sc.free))
	}
	for len(sc.active) > 0 { // one step per prefill chunk, then the token
		sc.build()
		if err := sc.forward(); err != nil {
			t.Fatal(err)
		}
		sc.deliver(time.Now())
		sc.forget()
	}
	d, err := st.Next(context.Background())
	if err != nil || !d.Done || d.Finish != FinishLength {
		t.Fatalf("request ended with %+v, %v", d, err)
	}
	if len(sc.free) != 0 {
		t.Fatalf("a %d-position sequence went back to the pool", len(prompt)+1)
	}
	for range 3 {
		runtime.GC()
	}
	if wp.Value() != nil {
		t.Fatal("the ended long sequence is still reachable: its KV cache is pinned")
	}
	if len(sc.rows) != 0 || len(sc.owners) != 0 || cap(sc.rows) == 0 {
		t.Fatalf("forget: rows %d/%d, owners %d", len(sc.rows), cap(sc.rows), len(sc.owners))
	}
}
