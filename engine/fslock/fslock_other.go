//go:build !unix && !windows

package fslock

import "os"

// TryLock always succeeds where the OS has no file locks (js, wasip1,
// plan9): one instance per folder is not enforced there.
func TryLock(*os.File) (bool, error) { return true, nil }

// Unlock does nothing where TryLock takes no lock.
func Unlock(*os.File) error { return nil }
