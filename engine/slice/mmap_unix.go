//go:build unix

package slice

import (
	"os"

	"golang.org/x/sys/unix"
)

// mapFile maps the first size bytes of f read-only (PROT_READ, MAP_SHARED);
// release unmaps them. size must be > 0.
func mapFile(f *os.File, size int) (data []byte, release func() error, err error) {
	data, err = unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, err
	}
	return data, func() error { return unix.Munmap(data) }, nil
}
