package node

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

func init() { RegisterSliceLoader(LoadSliceDir) }

// ErrEmptySlice: the slice holds no expert that passed its hash check.
var ErrEmptySlice = errors.New("node: the slice holds no verified expert")

// LoadSliceDir is the default SliceLoader: a slice directory (manifest.json
// and one file per expert, engine/slice.Open, every expert's SHA-256
// checked against the manifest) or a GGUF file (all its experts, hashed by
// engine/slice.FromGGUF). Experts that fail the check are not served and
// counted in Info.Bad. Errors: those of slice.Open / gguf.Open /
// slice.FromGGUF, or ErrEmptySlice.
func LoadSliceDir(path string, threads int) (*Slice, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	var s *slice.Slice
	var closeAll func() error
	if st.IsDir() {
		s, err = slice.Open(path)
		if err != nil {
			return nil, err
		}
		closeAll = s.Close
	} else {
		f, err := gguf.Open(path)
		if err != nil {
			return nil, err
		}
		s, err = slice.FromGGUF(f, nil, nil)
		if err != nil {
			f.Close()
			return nil, err
		}
		closeAll = func() error { return errors.Join(s.Close(), f.Close()) }
	}
	if len(s.Holdings()) == 0 {
		closeAll()
		return nil, fmt.Errorf("%w: %d experts failed verification in %s", ErrEmptySlice, len(s.Bad()), path)
	}
	comp, err := s.Computer(threads)
	if err != nil {
		closeAll()
		return nil, err
	}
	layers := 0
	for _, l := range s.Layers() {
		if l != nil {
			layers++
		}
	}
	info := status.SliceInfo{Dir: path, Layers: layers, Experts: len(s.Holdings()), Bytes: uint64(s.Bytes()),
		Bad: len(s.Bad()), Verified: true, VerifiedAt: time.Now()}
	return &Slice{Computer: comp, Holdings: s.Holdings(), ModelID: s.ModelID(), Backend: "cpu", Info: info, Close: closeAll}, nil
}
