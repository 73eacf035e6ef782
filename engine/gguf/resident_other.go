//go:build !linux

package gguf

import (
	"fmt"
	"runtime"
)

func pageSize() uint64 { return 4096 }

// makeResident: only the page-cache default is available off Linux.
func (f *File) makeResident(mode Residency, spans []span) error {
	if mode == ResidentMapped {
		return nil
	}
	return fmt.Errorf("residency %q is implemented on Linux only (%s)", mode, runtime.GOOS)
}
