package worker

import (
	"crypto/sha256"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// ExpertSHA256 is the hash a HELLO announces for expert e of layer l: SHA-256
// over the expert's gate, up and down matrices' bytes, in that order, as
// stored (native quantised type, ggml row layout). ok is false when the layer
// does not hold e.
func ExpertSHA256(l *expert.Layer, e int) (sum [32]byte, ok bool) {
	if l == nil || !l.Held(e) {
		return sum, false
	}
	h := sha256.New()
	h.Write(l.Gate.Expert[e])
	h.Write(l.Up.Expert[e])
	h.Write(l.Down.Expert[e])
	copy(sum[:], h.Sum(nil))
	return sum, true
}

// HoldingsOf lists every expert held by the given layers of c (all of c's
// layers when layers is nil) with its ExpertSHA256, in (layer, expert) order.
// Layers c does not have are skipped.
func HoldingsOf(c *expert.Local, layers []int) []wire.Holding {
	if layers == nil {
		for i := 0; i < c.NumLayers(); i++ {
			layers = append(layers, i)
		}
	}
	var hs []wire.Holding
	for _, li := range layers {
		l := c.Layer(li)
		if l == nil {
			continue
		}
		for e := 0; e < l.NExpert; e++ {
			if sum, ok := ExpertSHA256(l, e); ok {
				hs = append(hs, wire.Holding{Layer: uint16(li), Expert: uint32(e), SHA256: sum})
			}
		}
	}
	return hs
}
