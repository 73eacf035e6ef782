package model

import (
	"context"
	"errors"
	"testing"
)

// TestCheckpointRewind: on both architectures, after a prompt, a
// checkpoint, one Forward of k+1 rows (speculative verification) and
// Truncate to any length from the checkpoint's to the end, decoding on
// gives logits bit-identical to a sequence that only ever saw the kept
// rows (KV truncated; recurrent state restored and the kept rows
// replayed), and the verification rows' logits equal one-row-at-a-time
// decoding's. A Forward that fails midway after a checkpoint is undone by
// Truncate to the checkpoint.
func TestCheckpointRewind(t *testing.T) {
	for _, c := range []struct {
		name string
		m    *Model
	}{{"qwen3moe", tinyModel(t)}, {"qwen35moe", tinyQwen35(t)}} {
		t.Run(c.name, func(t *testing.T) {
			m := c.m
			v := m.Params().Vocab
			prompt := []int32{464, 313, 286, 481, 318, 2}
			verify := []int32{500, 7, 123, 9, 77}
			after := []int32{31, 41, 59}
			feed := func(s *Sequence, tk []int32) []float32 {
				t.Helper()
				rows := make([]Row, len(tk))
				for i := range tk {
					rows[i] = Row{Seq: s, Token: tk[i], Pos: s.Len() + i, Logits: true}
				}
				lg := make([]float32, len(tk)*v)
				if err := m.Forward(context.Background(), rows, lg); err != nil {
					t.Fatal(err)
				}
				return lg
			}
			all := append(append(append([]int32{}, prompt...), verify...), after...)
			ref := run(t, m, all, 1) // one row at a time
			for keep := 0; keep <= len(verify); keep++ {
				s := m.NewSequence()
				feed(s, prompt)
				if err := s.Checkpoint(); err != nil {
					t.Fatal(err)
				}
				lg := feed(s, verify)
				sameBits(t, "verification rows", lg, ref[len(prompt)*v:(len(prompt)+len(verify))*v])
				if err := s.Truncate(len(prompt) + keep); err != nil {
					t.Fatalf("keep %d: %v", keep, err)
				}
				want := run(t, m, append(append(append([]int32{}, prompt...), verify[:keep]...), after...), 1)
				got := feed(s, after)
				sameBits(t, "after rewind", got, want[(len(prompt)+keep)*v:])
				if c.name == "qwen35moe" && s.Truncate(len(prompt)) == nil {
					t.Error("a rewind without a checkpoint succeeded on a recurrent sequence")
				}
			}
			// Two Forwards under one checkpoint, rewound into the first.
			s := m.NewSequence()
			feed(s, prompt)
			if err := s.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			feed(s, verify[:2])
			feed(s, verify[2:])
			if err := s.Truncate(len(prompt) + 3); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "two forwards", feed(s, verify[3:]), ref[(len(prompt)+3)*v:(len(prompt)+len(verify))*v])

			// A failed Forward after a checkpoint: Truncate to the checkpoint.
			s = m.NewSequence()
			feed(s, prompt)
			if err := s.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			m.SetExperts(failAt{m, 1})
			rows := []Row{{Seq: s, Token: verify[0], Pos: s.Len(), Logits: true}}
			err := m.Forward(context.Background(), rows, make([]float32, v))
			m.SetExperts(nil)
			if !errors.Is(err, errInjected) {
				t.Fatalf("failing experts: %v", err)
			}
			if err := s.Truncate(len(prompt)); err != nil {
				t.Fatal(err)
			}
			sameBits(t, "after a failed Forward", feed(s, verify), ref[len(prompt)*v:(len(prompt)+len(verify))*v])
		})
	}
}
