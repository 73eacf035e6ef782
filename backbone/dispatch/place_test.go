package dispatch

import (
	"testing"
)

// placeKeys returns n experts of one layer, in priority order.
func placeKeys(n int) []uint64 {
	ks := make([]uint64, n)
	for i := range ks {
		ks[i] = key(0, i)
	}
	return ks
}

func counts(p placement, _ []uint64) map[uint64]int {
	c := map[uint64]int{}
	for _, m := range p.keys {
		for k := range m {
			c[k]++
		}
	}
	return c
}

// TestPlaceCoversBeforeReplicas: with K workers and target R, every expert
// gets one holder before any gets a second; leftover room makes replicas;
// no quota is exceeded.
func TestPlaceCoversBeforeReplicas(t *testing.T) {
	size := func(uint64) int64 { return 10 }
	all := func(uint64) bool { return true }
	for _, c := range []struct {
		workers  int
		quota    int64
		experts  int
		replicas int
		wantMin  int // fewest holders of any expert
	}{
		{3, 40, 12, 2, 1},  // room for exactly one copy each
		{3, 80, 12, 2, 2},  // room for two copies each
		{4, 100, 12, 3, 3}, // 40 slots for 36 copies
		{5, 30, 12, 2, 1},  // 15 slots: covered, 3 replicas
	} {
		ws := make([]placeWorker, c.workers)
		for i := range ws {
			ws[i] = placeWorker{quota: c.quota}
		}
		ks := placeKeys(c.experts)
		p := place(ws, ks, size, c.replicas, all)
		if len(p.uncovered) != 0 {
			t.Fatalf("%+v: %d uncovered", c, len(p.uncovered))
		}
		n := counts(p, ks)
		min := 1 << 30
		for _, k := range ks {
			min = minInt(min, n[k])
			if n[k] > c.replicas {
				t.Fatalf("%+v: expert %d has %d holders", c, k, n[k])
			}
		}
		if min != c.wantMin {
			t.Errorf("%+v: fewest holders %d, want %d", c, min, c.wantMin)
		}
		for i := range ws {
			if p.used[i] > ws[i].quota {
				t.Errorf("%+v: worker %d uses %d > %d", c, i, p.used[i], ws[i].quota)
			}
		}
	}
}

func minInt(a, b int) int {
	if a < b {
		return a
	}
	return b
}

// TestPlaceImpossible: when the quotas cannot hold every expert once, the
// uncovered ones (the least routed) are reported and no replica is made
// at coverage's expense.
func TestPlaceImpossible(t *testing.T) {
	size := func(uint64) int64 { return 10 }
	ws := []placeWorker{{quota: 30}, {quota: 25}}
	ks := placeKeys(8)
	p := place(ws, ks, size, 2, func(uint64) bool { return true })
	if len(p.uncovered) != 3 || p.uncovered[0] != ks[5] {
		t.Fatalf("uncovered %v, want the last 3 of %v", p.uncovered, ks)
	}
	for k, n := range counts(p, ks) {
		if n != 1 {
			t.Fatalf("expert %d has %d holders while others have none", k, n)
		}
	}
	// A worker too small for any expert: nothing placed there.
	p = place([]placeWorker{{quota: 5}}, ks[:1], size, 1, func(uint64) bool { return true })
	if len(p.uncovered) != 1 || len(p.keys[0]) != 0 {
		t.Fatalf("%+v", p)
	}
}

// TestPlaceSticky: experts stay with the workers that hold them (then with
// their previous assignment) instead of moving to a roomier one; a held
// replica does not keep another expert from being covered.
func TestPlaceSticky(t *testing.T) {
	size := func(uint64) int64 { return 10 }
	ks := placeKeys(4)
	ws := []placeWorker{
		{quota: 20, held: map[uint64]bool{ks[3]: true}, prev: map[uint64]bool{ks[2]: true}},
		{quota: 100},
	}
	p := place(ws, ks, size, 1, func(uint64) bool { return false })
	if !p.keys[0][ks[3]] || !p.keys[0][ks[2]] || len(p.keys[0]) != 2 {
		t.Fatalf("worker 0 lost what it held or had: %v", p.keys[0])
	}
	// Both workers hold ks[0] and ks[1] (replicas), worker 0 has room for
	// two experts only: coverage of ks[2] and ks[3] comes first.
	ws = []placeWorker{
		{quota: 20, held: map[uint64]bool{ks[0]: true, ks[1]: true}},
		{quota: 20, held: map[uint64]bool{ks[0]: true, ks[1]: true}},
	}
	p = place(ws, ks, size, 2, func(uint64) bool { return true })
	if len(p.uncovered) != 0 {
		t.Fatalf("replicas kept %d experts uncovered: %v", len(p.uncovered), p.keys)
	}
}

// TestPlaceOneCopyPerKey: two sessions under one worker key (two processes
// sharing a key file) never get copies of the same expert: quorum,
// coverage and readiness count keys, so a second copy there is wasted
// quota. With a third key, every expert still gets its two holders.
func TestPlaceOneCopyPerKey(t *testing.T) {
	size := func(uint64) int64 { return 10 }
	all := func(uint64) bool { return true }
	ks := placeKeys(8)
	ws := []placeWorker{{quota: 80, id: "a"}, {quota: 80, id: "a"}, {quota: 80, id: "b"}}
	p := place(ws, ks, size, 2, all)
	for _, k := range ks {
		if p.keys[0][k] && p.keys[1][k] {
			t.Errorf("expert %d on both sessions of key a", k)
		}
		n := 0
		for i := range ws {
			if p.keys[i][k] {
				n++
			}
		}
		if n != 2 || !p.keys[2][k] {
			t.Errorf("expert %d: %d holders, on b %v; want 2, one of them b", k, n, p.keys[2][k])
		}
	}
	// Without a second key there is nothing to replicate onto.
	p = place(ws[:2], ks, size, 2, all)
	if c := counts(p, ks); len(p.uncovered) != 0 || c[ks[0]] != 1 {
		t.Errorf("one key: uncovered %d, holders of the first expert %d; want 0 and 1", len(p.uncovered), c[ks[0]])
	}
}
