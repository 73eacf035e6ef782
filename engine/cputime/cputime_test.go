package cputime

import (
	"runtime"
	"testing"
	"time"
)

// TestProcessCountsWork: busy work makes the process's CPU time grow (20 ms
// of it within 5 s of wall time, however loaded the machine), and it never
// runs backwards.
func TestProcessCountsWork(t *testing.T) {
	c0, ok := Process()
	if !ok {
		if runtime.GOOS == "linux" || runtime.GOOS == "windows" || runtime.GOOS == "darwin" {
			t.Fatal("no process CPU time on an OS that has it")
		}
		t.Skip("no process CPU time on " + runtime.GOOS)
	}
	last, x := c0, 0
	for deadline := time.Now().Add(5 * time.Second); ; {
		for range 1 << 16 {
			x++
		}
		c, _ := Process()
		if c < last {
			t.Fatalf("CPU time ran backwards: %v -> %v", last, c)
		}
		if last = c; c-c0 >= 20*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("CPU time %v -> %v after 5 s of busy work (%d loops)", c0, c, x)
		}
	}
	if Used() < last {
		t.Fatalf("Used %v < Process %v", Used(), last)
	}
}
