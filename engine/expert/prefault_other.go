//go:build !linux

package expert

// prefault does nothing on this system (see prefault_linux.go).
func prefault(uintptr, int) {}

// physicalMemory is unknown here.
func physicalMemory() uint64 { return 0 }
