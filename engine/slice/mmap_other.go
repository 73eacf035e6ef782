//go:build !unix

package slice

import (
	"io"
	"os"
)

// mapFile reads the first size bytes of f into memory (platforms without
// mmap); release is a no-op.
func mapFile(f *os.File, size int) (data []byte, release func() error, err error) {
	data = make([]byte, size)
	if _, err := io.ReadFull(f, data); err != nil {
		return nil, nil, err
	}
	return data, func() error { return nil }, nil
}
