package wire

import "testing"

// TestFloatPool: Get returns n floats of the power-of-two capacity at or
// above n; a slice put back serves requests of its class only, never a
// larger one; slices Get did not make are ignored.
func TestFloatPool(t *testing.T) {
	var p FloatPool
	if b := p.Get(0); b != nil {
		t.Fatalf("get(0) = %v", b)
	}
	for _, n := range []int{1, 2, 3, 1000, 1024, 1025, 512 * 2048} {
		b := p.Get(n)
		if len(b) != n || cap(b) < n || cap(b)&(cap(b)-1) != 0 || cap(b) >= 2*n && n > 1 {
			t.Fatalf("get(%d): len %d cap %d", n, len(b), cap(b))
		}
	}
	b := p.Get(1000) // class 1024
	p.Put(b)
	if c := p.Get(700); len(c) != 700 || cap(c) != 1024 { // b, or a new one of its class (a sync.Pool may drop)
		t.Fatalf("get(700) after put: len %d cap %d", len(c), cap(c))
	}
	big := p.Get(1024)
	p.Put(big)
	if c := p.Get(1025); cap(c) < 1025 {
		t.Fatalf("get(1025) cap %d", cap(c))
	}
	p.Put(make([]float32, 1000)) // not a pool slice: ignored
	if c := p.Get(1000); cap(c) != 1024 {
		t.Fatalf("get(1000) after a foreign put: cap %d", cap(c))
	}
}

// TestSlicePool: Get returns n elements with capacity >= n whatever was
// put back before (larger, smaller or nothing), for bytes and floats.
func TestSlicePool(t *testing.T) {
	var bp SlicePool[byte]
	var fp SlicePool[float32]
	for _, n := range []int{0, 5, 1 << 20, 3, 1 << 10, 0, 7} {
		b, f := bp.Get(n), fp.Get(n)
		if len(*b) != n || cap(*b) < n || len(*f) != n || cap(*f) < n {
			t.Fatalf("Get(%d): bytes len %d cap %d, floats len %d cap %d", n, len(*b), cap(*b), len(*f), cap(*f))
		}
		for i := range *b {
			(*b)[i], (*f)[i] = byte(i), float32(i)
		}
		bp.Put(b)
		fp.Put(f)
	}
}
