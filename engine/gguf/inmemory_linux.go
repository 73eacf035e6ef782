package gguf

import (
	"fmt"
	"io"
	"math"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePage is the size of an x86-64 / arm64 transparent huge page.
const hugePage = 2 << 20

// OpenInMemory reads the GGUF file at path into anonymous memory and
// parses it as Parse does; Tensor returns views into that copy, which is
// read-only once filled (PROT_READ) and freed by Close. Unlike Open's
// mapping of the page cache (4 KiB pages), the copy starts on a 2 MiB
// boundary and asks for transparent huge pages (MADV_HUGEPAGE), so a
// decode streaming its weights walks page tables 512 times less often
// (expert.BenchmarkLocalFile: the routed experts read from the file's
// mapping cost up to 1.5x the CPU per byte of the same bytes on huge
// pages). The file's page-cache copy is then dropped
// (POSIX_FADV_DONTNEED), so the process holds the weights once, as
// llama.cpp --no-mmap does. It reads the whole file before returning:
// the caller decides whether it fits in memory. Errors: those of os.Open,
// mmap, reading the file and Parse, prefixed with the path.
func OpenInMemory(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	st, err := fd.Stat()
	if err != nil {
		return nil, err
	}
	size := st.Size()
	if size <= 0 || uint64(size) > math.MaxInt-hugePage {
		return nil, fmt.Errorf("%s: file size %d cannot be read into memory", path, size)
	}
	region, err := unix.Mmap(-1, 0, int(size)+hugePage, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return nil, fmt.Errorf("%s: mmap: %w", path, err)
	}
	off := (hugePage - int(uintptr(unsafe.Pointer(&region[0]))%hugePage)) % hugePage
	data := region[off : off+int(size)]
	_ = unix.Madvise(data, unix.MADV_HUGEPAGE) // advice only
	if _, err := io.ReadFull(io.NewSectionReader(fd, 0, size), data); err != nil {
		_ = unix.Munmap(region)
		return nil, fmt.Errorf("%s: read: %w", path, err)
	}
	if err := unix.Mprotect(region, unix.PROT_READ); err != nil {
		_ = unix.Munmap(region)
		return nil, fmt.Errorf("%s: mprotect: %w", path, err)
	}
	_ = unix.Fadvise(int(fd.Fd()), 0, 0, unix.FADV_DONTNEED) // advice only
	f, err := Parse(data)
	if err != nil {
		_ = unix.Munmap(region)
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	f.unmap = func() error { return unix.Munmap(region) }
	return f, nil
}
