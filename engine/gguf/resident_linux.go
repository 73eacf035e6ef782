//go:build linux

package gguf

import (
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

func pageSize() uint64 { return uint64(unix.Getpagesize()) }

// copyChunk is how much MakeResident(ResidentCopied) moves at a time: the
// transient extra memory it needs.
const copyChunk = 64 << 20

// makeResident applies mode to spans of f.data (page-aligned, disjoint).
func (f *File) makeResident(mode Residency, spans []span) error {
	switch mode {
	case ResidentMapped:
		for _, s := range spans {
			_ = unix.Madvise(f.data[s.lo:s.hi], unix.MADV_WILLNEED) // advice only
		}
		return nil
	case ResidentLocked:
		var total uint64
		for _, s := range spans {
			total += s.hi - s.lo
		}
		raiseMemlock(total)
		for _, s := range spans {
			if err := unix.Mlock(f.data[s.lo:s.hi]); err != nil {
				return fmt.Errorf("mlock: %w", err)
			}
		}
		return nil
	case ResidentCopied:
		buf := make([]byte, copyChunk)
		for _, s := range spans {
			for lo := s.lo; lo < s.hi; lo += copyChunk {
				if err := f.anonymize(f.data[lo:min(lo+copyChunk, s.hi)], buf); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return fmt.Errorf("residency %q", mode)
}

// anonymize replaces the file mapping under b (page-aligned start) by
// anonymous memory holding the same bytes at the same addresses, read-only
// again afterwards. buf is scratch of at least len(b) bytes. Readers of b
// must not run meanwhile (MakeResident is called before decoding).
func (f *File) anonymize(b, buf []byte) error {
	n := copy(buf, b)
	addr := unsafe.Pointer(unsafe.SliceData(b))
	p, err := unix.MmapPtr(-1, 0, addr, uintptr(len(b)), unix.PROT_READ|unix.PROT_WRITE,
		unix.MAP_FIXED|unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mmap anonymous: %w", err)
	}
	if p != addr {
		return fmt.Errorf("mmap anonymous: got %p, asked %p", p, addr)
	}
	// Transparent huge pages where the system allows them on request
	// (/sys/kernel/mm/transparent_hugepage/enabled = madvise, the usual
	// default): a decode streaming its weights then walks the page tables
	// 512 times less often than over the file's 4 KiB pages
	// (expert.BenchmarkLocalFile: up to 1.5x the CPU per weight byte read
	// through the mapping). Advice only.
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	copy(b, buf[:n])
	if err := unix.Mprotect(b, unix.PROT_READ); err != nil {
		return fmt.Errorf("mprotect: %w", err)
	}
	return nil
}

// raiseMemlock lifts RLIMIT_MEMLOCK to at least need bytes where the
// process may (root or CAP_IPC_LOCK raise the hard limit; others up to it).
func raiseMemlock(need uint64) {
	var lim unix.Rlimit
	if unix.Getrlimit(unix.RLIMIT_MEMLOCK, &lim) != nil || lim.Cur == unix.RLIM_INFINITY || lim.Cur >= need {
		return
	}
	if unix.Setrlimit(unix.RLIMIT_MEMLOCK, &unix.Rlimit{Cur: unix.RLIM_INFINITY, Max: unix.RLIM_INFINITY}) == nil {
		return
	}
	lim.Cur = lim.Max
	_ = unix.Setrlimit(unix.RLIMIT_MEMLOCK, &lim)
}
