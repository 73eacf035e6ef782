package wire

import "sync"

// SlicePool holds reusable slices of T between uses, as pointers (*[]T, so
// that Put does not allocate): a sender's message buffers and a worker's
// output scratch, which are written whole and copied out (sent, hashed)
// before they go back. Unlike FloatPool it keeps no size classes: a slice
// grows to the largest request it served. The zero value is ready; it is
// safe for concurrent use.
type SlicePool[T any] struct{ p sync.Pool }

// Get returns a slice of length n (contents undefined) and capacity >= n;
// give it back with Put once nothing refers to it.
func (p *SlicePool[T]) Get(n int) *[]T {
	b, _ := p.p.Get().(*[]T)
	if b == nil {
		b = new([]T)
	}
	if cap(*b) < n {
		*b = make([]T, n)
	}
	*b = (*b)[:n]
	return b
}

// Put gives b back for reuse.
func (p *SlicePool[T]) Put(b *[]T) { p.p.Put(b) }
