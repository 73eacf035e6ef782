package node

import (
	"errors"
	"fmt"

	"github.com/kvasir-ai/kvasir/engine/expert"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
)

// applyBackend puts sl's experts on the device Config.Backend names
// (engine/vulkan.Wrap: "" or "auto" = a GPU through Vulkan if there is
// one, else the CPU; "cpu"; "vulkan[:N]"), setting sl.Computer, sl.Backend
// ("vulkan:<device>") and extending sl.Close to release the device. A
// slice whose Computer is not an *expert.Local is left as it is.
func applyBackend(backend string, sl *Slice, logf func(string, ...any)) error {
	local, ok := sl.Computer.(*expert.Local)
	if !ok {
		return nil
	}
	comp, name, closeDev, err := vulkan.Wrap(backend, local, 0, logf)
	if err != nil {
		return fmt.Errorf("%w: %w: backend %q: %v", ErrBackend, ErrConfig, backend, err)
	}
	if name == "" {
		return nil
	}
	sl.Computer, sl.Backend = comp, name
	closeSlice := sl.Close
	sl.Close = func() error {
		err := closeDev()
		if closeSlice != nil {
			err = errors.Join(err, closeSlice())
		}
		return err
	}
	return nil
}
