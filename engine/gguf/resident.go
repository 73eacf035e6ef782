package gguf

import (
	"errors"
	"fmt"
	"sort"
	"time"
)

// Residency says how a mapped file's tensor data stays in memory
// (File.MakeResident).
type Residency string

const (
	// ResidentMapped leaves the data in the page cache, read on first use
	// and evictable: under memory pressure evicted weights are read from
	// disk again at each step that needs them. MakeResident only advises
	// the kernel to read ahead (MADV_WILLNEED).
	ResidentMapped Residency = "mmap"
	// ResidentLocked reads the data in once and pins its page-cache pages
	// (mlock): nothing is read from disk again, no copy is made. Needs
	// RLIMIT_MEMLOCK (MakeResident raises it where allowed: root or
	// CAP_IPC_LOCK).
	ResidentLocked Residency = "lock"
	// ResidentCopied copies the data into the process's own anonymous
	// memory at the same addresses (every tensor view stays valid): the
	// kernel can no longer drop it, only swap it. It works without
	// RLIMIT_MEMLOCK; the file's page-cache copy may then be dropped.
	ResidentCopied Residency = "copy"
	// ResidentInMemory is what MakeResident reports for a File from Parse:
	// its data is already the caller's memory (an embedded model), and
	// nothing was done.
	ResidentInMemory Residency = "memory"
)

// ErrResident wraps MakeResident's failures (a mode this platform or its
// limits do not allow, a failed system call).
var ErrResident = errors.New("gguf: cannot make the weights resident")

// ResidentReport says what MakeResident did.
type ResidentReport struct {
	Mode     Residency     // the mode applied
	Bytes    uint64        // bytes of tensor data made resident (page-aligned ranges)
	Tensors  int           // tensors kept
	Ranges   int           // contiguous page ranges they occupy
	Duration time.Duration // time it took (reading the data in from disk included)
}

// String is the report in words, for a log line.
func (r ResidentReport) String() string {
	return fmt.Sprintf("%s: %.2f GB of %d tensors in %d ranges, %v", r.Mode, float64(r.Bytes)/1e9, r.Tensors, r.Ranges,
		r.Duration.Round(time.Millisecond))
}

// ParseResidency parses a --resident value: mmap, lock or copy.
func ParseResidency(s string) (Residency, error) {
	switch r := Residency(s); r {
	case ResidentMapped, ResidentLocked, ResidentCopied:
		return r, nil
	}
	return "", fmt.Errorf("residency %q: want mmap, lock or copy", s)
}

// span is a byte range [lo, hi) of f.data.
type span struct{ lo, hi uint64 }

// residentSpans returns the page-aligned, merged ranges of f.data that hold
// the tensors keep selects (all when keep is nil), their count and bytes.
func (f *File) residentSpans(keep func(TensorInfo) bool, page uint64) ([]span, int, uint64) {
	var sp []span
	n := 0
	for _, ti := range f.Tensors {
		if ti.Size == 0 || (keep != nil && !keep(ti)) {
			continue
		}
		n++
		lo := (f.DataOffset + ti.Offset) / page * page
		hi := min((f.DataOffset+ti.Offset+ti.Size+page-1)/page*page, uint64(len(f.data))) // the file's end may fall inside a page
		sp = append(sp, span{lo, hi})
	}
	sort.Slice(sp, func(i, j int) bool { return sp[i].lo < sp[j].lo })
	var out []span
	var total uint64
	for _, s := range sp {
		if k := len(out) - 1; k >= 0 && s.lo <= out[k].hi {
			out[k].hi = max(out[k].hi, s.hi)
			continue
		}
		out = append(out, s)
	}
	for _, s := range out {
		total += s.hi - s.lo
	}
	return out, n, total
}

// ResidentBytes returns the bytes MakeResident would make resident for
// keep (page-aligned ranges of the selected tensors' data).
func (f *File) ResidentBytes(keep func(TensorInfo) bool) uint64 {
	_, _, b := f.residentSpans(keep, pageSize())
	return b
}

// MakeResident keeps the data of the tensors keep selects (all when keep is
// nil) in memory as mode says, reading it in now. Tensor views taken before
// or after stay valid (same addresses). It applies only to a file opened
// with Open (a mapping); a File from Parse is already the caller's memory
// and is left as it is (report Mode ResidentInMemory, Bytes 0). Errors wrap ErrResident: the mode
// is not supported here, or mlock failed (RLIMIT_MEMLOCK, or too little
// memory: the caller may fall back to ResidentCopied), or a mapping call
// failed; on error the data may be partly resident and stays valid.
func (f *File) MakeResident(mode Residency, keep func(TensorInfo) bool) (ResidentReport, error) {
	if _, err := ParseResidency(string(mode)); err != nil {
		return ResidentReport{}, fmt.Errorf("%w: %v", ErrResident, err)
	}
	r := ResidentReport{Mode: mode}
	if f.closed {
		return r, fmt.Errorf("%w: %w", ErrResident, ErrClosed)
	}
	if f.unmap == nil {
		return ResidentReport{Mode: ResidentInMemory}, nil // Parse: not a mapping
	}
	t0 := time.Now()
	spans, n, total := f.residentSpans(keep, pageSize())
	r.Tensors, r.Ranges = n, len(spans)
	err := f.makeResident(mode, spans)
	r.Duration = time.Since(t0)
	if err != nil {
		return r, fmt.Errorf("%w (%s, %.2f GB): %w", ErrResident, mode, float64(total)/1e9, err)
	}
	r.Bytes = total
	return r, nil
}
