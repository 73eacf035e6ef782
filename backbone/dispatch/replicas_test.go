package dispatch

import "testing"

// TestDistinctWorkers: replicas are counted by worker key, so one worker
// connected twice is one holder (quorum cannot pair it with itself, and
// readiness must not count it twice).
func TestDistinctWorkers(t *testing.T) {
	a1, a2, b := &conn{worker: "aa"}, &conn{worker: "aa"}, &conn{worker: "bb"}
	for _, c := range []struct {
		cs   []*conn
		want int
	}{{nil, 0}, {[]*conn{a1}, 1}, {[]*conn{a1, a2}, 1}, {[]*conn{a1, a2, b}, 2}, {[]*conn{b, a1}, 2}} {
		if got := distinctWorkers(c.cs); got != c.want {
			t.Errorf("%d conns: %d distinct workers, want %d", len(c.cs), got, c.want)
		}
	}
}
