package dispatch

import (
	"testing"
	"time"
)

// TestDeadline checks the deadline formula on hand-worked samples.
func TestDeadline(t *testing.T) {
	cfg := Config{MinDeadline: 5 * time.Millisecond, MaxDeadline: 5 * time.Second, DeadlineMargin: 20 * time.Millisecond}
	c := &conn{}
	if d := c.deadline(cfg, 0); d != cfg.MaxDeadline {
		t.Fatalf("no samples: %v", d)
	}
	// 4 samples of 1,000,000 bytes: three in 100 ms, one in 200 ms.
	// rates 10e6, 10e6, 10e6, 5e6 B/s -> median (nearest rank, 2nd of 4
	// sorted [5e6 10e6 10e6 10e6]) = 10e6 B/s; latencies 100-100=0, 0, 0,
	// 200-100=100 ms -> p99 = 100 ms.
	for _, ms := range []int{100, 100, 200, 100} {
		c.addRTT(time.Duration(ms)*time.Millisecond, 1_000_000)
	}
	// bytes 0: 3*100 + 20 = 320 ms.
	if d := c.deadline(cfg, 0); d != 320*time.Millisecond {
		t.Fatalf("deadline(0) = %v, want 320ms", d)
	}
	// bytes 2e6: 320 ms + 4*2e6/10e6 s = 320 + 800 = 1120 ms.
	if d := c.deadline(cfg, 2_000_000); d != 1120*time.Millisecond {
		t.Fatalf("deadline(2e6) = %v, want 1120ms", d)
	}
	// Bounded above.
	if d := c.deadline(cfg, 1e12); d != cfg.MaxDeadline {
		t.Fatalf("deadline(1e12) = %v", d)
	}
	q, n := c.quantiles(0.5, 0.99)
	if n != 4 || q[0] != 100*time.Millisecond || q[1] != 200*time.Millisecond {
		t.Fatalf("quantiles %v n %d", q, n)
	}
}
