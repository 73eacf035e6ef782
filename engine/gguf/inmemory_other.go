//go:build !linux

package gguf

import (
	"fmt"
	"os"
)

// OpenInMemory reads the GGUF file at path into memory (os.ReadFile; the
// Linux version reads it into huge pages) and parses it as Parse does;
// Tensor returns views into that copy. Errors: those of os.ReadFile and
// Parse, prefixed with the path.
func OpenInMemory(path string) (*File, error) {
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
