//go:build !linux || !cgo || kvasir_novulkan

package vulkan

import (
	"context"

	"github.com/kvasir-ai/kvasir/engine/expert"
)

// Computer is the Vulkan expert.Computer; in this build it cannot be made
// (New returns ErrNotBuilt).
type Computer struct{}

var _ expert.Computer = (*Computer)(nil)

// Devices lists the Vulkan devices; in this build it returns ErrNotBuilt.
func Devices() ([]Device, error) { return nil, ErrNotBuilt }

// New returns ErrNotBuilt in this build.
func New(local *expert.Local, opt Options) (*Computer, error) { return nil, ErrNotBuilt }

// Open returns ErrNotBuilt in this build.
func Open(opt Options) (*Computer, error) { return nil, ErrNotBuilt }

// Rebase returns ErrNotBuilt in this build.
func (c *Computer) Rebase(local *expert.Local, sum func(layer, e int) ([32]byte, bool)) error {
	return ErrNotBuilt
}

// ComputeExperts implements expert.Computer; unreachable in this build.
func (c *Computer) ComputeExperts(ctx context.Context, layer int, hidden []float32, ids []int32, n, k int, out []float32) error {
	return ErrNotBuilt
}

// Device returns the zero Device in this build.
func (c *Computer) Device() Device { return Device{} }

// Stats returns zero counters in this build.
func (c *Computer) Stats() Stats { return Stats{} }

// Close does nothing in this build.
func (c *Computer) Close() error { return nil }

// Fault implements expert.Faulter: there is no device (false).
func (c *Computer) Fault(error) bool { return false }
