//go:build !unix

package gguf

import (
	"fmt"
	"os"
)

// Open reads the GGUF file at path into memory (platforms without mmap) and
// parses it as Parse does; Tensor returns views into that copy. Errors: those
// of os.ReadFile and Parse, prefixed with the path.
func Open(path string) (*File, error) {
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w", path, notRegular(st.Mode()))
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	f, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return f, nil
}
