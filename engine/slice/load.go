package slice

import (
	"errors"
	"os"
	"slices"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Served is a slice opened to be served by a worker: the expert function
// over its verified experts, their holdings (layer, expert, SHA-256) for
// HELLO, the model id they belong to, and what was left out. It is the one
// result of Load and LoadFile, which the headless worker command, the
// contributor node and the demo's workers all use.
type Served struct {
	// Computer computes the served experts (expert.Local); valid until
	// Close.
	Computer *expert.Local
	// Holdings are the served experts, in (layer, expert) order.
	Holdings []wire.Holding
	// ModelID is the slice's model id (ModelID of the GGUF file, or the
	// manifest's); a worker may announce another.
	ModelID string
	// Layers counts the layers Computer holds experts of.
	Layers int
	// Bytes are the verified expert bytes of the opened slice (all its
	// layers, also those a layer selection leaves out).
	Bytes int64
	// Bad lists the experts of a slice directory that failed their check
	// (missing, wrong size, hash mismatch): they are not served.
	Bad []BadExpert

	close func() error
}

// Close releases the slice (unmaps its files; with LoadFile or a GGUF
// path, closes the GGUF file too). Computer must not be used after it.
func (s *Served) Close() error { return s.close() }

// Load opens the slice at path for serving with threads compute threads
// (<= 0: GOMAXPROCS), restricted to the given layers (nil: all):
//
//   - a slice directory (Open: every expert's SHA-256 is checked; those
//     that fail are in Served.Bad and not served; layers the directory
//     does not hold are ignored), or
//   - a GGUF file (LoadFile over gguf.Open: views into the mapped file,
//     hashed by FromGGUF; a layer out of range is an error).
//
// Errors: those of os.Stat, Open, gguf.Open, FromGGUF and expert.NewLocal.
func Load(path string, layers []int, threads int) (*Served, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		f, err := gguf.Open(path)
		if err != nil {
			return nil, err
		}
		return LoadFile(f, layers, threads)
	}
	s, err := Open(path)
	if err != nil {
		return nil, err
	}
	ls, hs := s.Layers(), s.Holdings()
	if layers != nil {
		ls, hs = make([]*expert.Layer, len(ls)), nil
		for _, l := range layers {
			if l >= 0 && l < len(ls) {
				ls[l] = s.Layers()[l]
			}
		}
		for _, h := range s.Holdings() {
			if slices.Contains(layers, int(h.Layer)) {
				hs = append(hs, h)
			}
		}
	}
	comp, err := expert.NewLocal(ls, threads)
	if err != nil {
		s.Close()
		return nil, err
	}
	return &Served{Computer: comp, Holdings: hs, ModelID: s.ModelID(), Layers: countLayers(ls), Bytes: s.Bytes(),
		Bad: s.Bad(), close: s.Close}, nil
}

// LoadFile serves the experts of the given layers (nil: all) of the GGUF
// file f, as views into it (FromGGUF), with threads compute threads. It
// takes f over: Close (or an error) closes it.
func LoadFile(f *gguf.File, layers []int, threads int) (*Served, error) {
	s, err := FromGGUF(f, layers, nil)
	if err != nil {
		f.Close()
		return nil, err
	}
	comp, err := s.Computer(threads)
	if err != nil {
		s.Close()
		f.Close()
		return nil, err
	}
	return &Served{Computer: comp, Holdings: s.Holdings(), ModelID: s.ModelID(), Layers: countLayers(s.Layers()),
		Bytes: s.Bytes(), close: func() error { return errors.Join(s.Close(), f.Close()) }}, nil
}

// countLayers counts the non-nil layers.
func countLayers(ls []*expert.Layer) int {
	n := 0
	for _, l := range ls {
		if l != nil {
			n++
		}
	}
	return n
}
