package node

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

func init() { RegisterSliceLoader(LoadSliceDir) }

// ErrEmptySlice: the slice holds no expert that passed its hash check.
var ErrEmptySlice = errors.New("node: the slice holds no verified expert")

// LoadSliceDir is the default SliceLoader: engine/slice.Load of path, a
// slice directory (manifest.json and one file per expert, every expert's
// SHA-256 checked against the manifest) or a GGUF file (all its experts,
// hashed by engine/slice.FromGGUF). Experts that fail the check are not
// served and counted in Info.Bad. Errors: those of slice.Load, or
// ErrEmptySlice.
func LoadSliceDir(path string, threads int) (*Slice, error) {
	s, err := slice.Load(path, nil, threads)
	if err != nil {
		return nil, err
	}
	if len(s.Holdings) == 0 {
		s.Close()
		return nil, fmt.Errorf("%w: %d experts failed verification in %s", ErrEmptySlice, len(s.Bad), path)
	}
	info := status.SliceInfo{Dir: path, Layers: s.Layers, Experts: len(s.Holdings), Bytes: uint64(s.Bytes),
		Bad: len(s.Bad), Verified: true, VerifiedAt: time.Now()}
	return &Slice{Computer: s.Computer, Holdings: s.Holdings, ModelID: s.ModelID, Backend: "cpu", Info: info, Close: s.Close}, nil
}
