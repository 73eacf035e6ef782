//go:build unix

package gguf

import (
	"fmt"
	"math"
	"os"

	"golang.org/x/sys/unix"
)

// Open memory-maps the GGUF file at path read-only (PROT_READ, MAP_SHARED)
// and parses it as Parse does; tensor data stays in the page cache and
// Tensor returns zero-copy views. Close unmaps. Errors: those of os.Open,
// unix.Mmap and Parse, prefixed with the path; a path that is not a
// regular file (a directory, a device) is refused before mapping.
func Open(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close() // the mapping outlives the descriptor
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w", path, notRegular(st.Mode()))
	}
	size := st.Size()
	if size == 0 {
		if _, err := Parse(nil); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if size < 0 || uint64(size) > math.MaxInt {
		return nil, fmt.Errorf("%s: file size %d cannot be mapped", path, size)
	}
	data, err := unix.Mmap(int(fd.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", path, err)
	}
	f, err := Parse(data)
	if err != nil {
		_ = unix.Munmap(data)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.unmap = func() error { return unix.Munmap(data) }
	return f, nil
}
