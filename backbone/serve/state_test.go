package serve

import "testing"

// TestStateMemoryBoundsSeqs: with a recurrent model (the embedded default
// is qwen35moe) MaxSeqs is lowered so that MaxSeqs x StateBytes fits
// StateMemory, never below one sequence; models without recurrent state
// keep MaxSeqs.
func TestStateMemoryBoundsSeqs(t *testing.T) {
	m, tok := loadTiny(t)
	sb := m.StateBytes()
	if sb <= 0 {
		t.Fatalf("StateBytes %d for the qwen35moe default", sb)
	}
	// 3 recurrent layers x ((4-1) x 512 + 4 x 64 x 64) float32.
	if want := int64(3 * 4 * (3*512 + 4*64*64)); sb != want {
		t.Errorf("StateBytes %d, want %d", sb, want)
	}
	for _, c := range []struct {
		mem        int64
		seqs, want int
	}{{10 * sb, 64, 10}, {10*sb + sb/2, 64, 10}, {sb / 2, 64, 1}, {100 * sb, 64, 64}, {0, 64, 64}} {
		s, err := New(Config{Model: m, Tokenizer: tok, MaxSeqs: c.seqs, StateMemory: c.mem, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		if s.cfg.MaxSeqs != c.want {
			t.Errorf("StateMemory %d (%.1f sequences): MaxSeqs %d, want %d", c.mem, float64(c.mem)/float64(sb), s.cfg.MaxSeqs, c.want)
		}
	}
}
