//go:build linux

package gguf

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/kvasir-ai/kvasir/engine/quant"
)

// residentFile writes a GGUF with three F32 tensors of random bytes (two
// of 300 KiB, one of 3 bytes short of a page multiple) and opens it.
func residentFile(t *testing.T) (string, *File) {
	t.Helper()
	w := NewWriter()
	w.SetString("general.architecture", "test")
	rng := rand.New(rand.NewPCG(1, 2))
	for i, n := range []uint64{75 << 10, 75 << 10, 1023} {
		data := make([]byte, 4*n)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		if err := w.AddTensor("t"+strconv.Itoa(i), quant.F32, []uint64{n}, data); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(t.TempDir(), "r.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return path, f
}

// scribble overwrites the file's tensor data on disk (same inode): a
// MAP_SHARED mapping sees it, anonymous memory does not.
func scribble(t *testing.T, path string, f *File) {
	t.Helper()
	fd, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fd.Close()
	if _, err := fd.WriteAt(bytes.Repeat([]byte{0xAB}, 4096), int64(f.DataOffset)); err != nil {
		t.Fatal(err)
	}
}

func vmLocked(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmLck:"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n << 10
		}
	}
	t.Skip("no VmLck in /proc/self/status")
	return 0
}

// TestMakeResidentCopy: after ResidentCopied every tensor view taken before
// still reads the file's bytes, and a later write to the file no longer
// reaches them (the pages are the process's own); a mapped file, the
// control, sees the write.
func TestMakeResidentCopy(t *testing.T) {
	path, f := residentFile(t)
	before := map[string][]byte{}
	for _, ti := range f.Tensors {
		tn, _ := f.Tensor(ti.Name)
		before[ti.Name] = bytes.Clone(tn.Data)
	}
	t0, _ := f.Tensor("t0")
	r, err := f.MakeResident(ResidentCopied, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Tensors != 3 || r.Bytes < 4*(150<<10) || r.Bytes > uint64(len(f.data)) {
		t.Fatalf("report %+v (file %d bytes)", r, len(f.data))
	}
	scribble(t, path, f)
	for _, ti := range f.Tensors {
		tn, _ := f.Tensor(ti.Name)
		if !bytes.Equal(tn.Data, before[ti.Name]) {
			t.Fatalf("%s changed after the copy (the file's write reached it)", ti.Name)
		}
	}
	if !bytes.Equal(t0.Data, before["t0"]) {
		t.Fatal("a view taken before MakeResident reads other bytes")
	}
}

// TestMakeResidentMappedSeesWrites is the control of TestMakeResidentCopy:
// a file left mapped reflects a write to it.
func TestMakeResidentMappedSeesWrites(t *testing.T) {
	path, f := residentFile(t)
	if _, err := f.MakeResident(ResidentMapped, nil); err != nil {
		t.Fatal(err)
	}
	scribble(t, path, f)
	tn, _ := f.Tensor("t0")
	if tn.Data[0] != 0xAB {
		t.Fatalf("a mapped file did not see the write (byte %#x)", tn.Data[0])
	}
}

// TestMakeResidentLock: ResidentLocked pins the selected tensors' pages
// (VmLck grows by the report's bytes) and keeps their bytes.
func TestMakeResidentLock(t *testing.T) {
	_, f := residentFile(t)
	want, _ := f.Tensor("t1")
	wantB := bytes.Clone(want.Data)
	base := vmLocked(t)
	r, err := f.MakeResident(ResidentLocked, func(ti TensorInfo) bool { return ti.Name == "t1" })
	if err != nil {
		t.Skipf("mlock not allowed here (not root, RLIMIT_MEMLOCK): %v", err)
	}
	if r.Tensors != 1 || r.Bytes < 4*(75<<10) || r.Bytes > 4*(75<<10)+2*4096 {
		t.Fatalf("report %+v", r)
	}
	if got := vmLocked(t) - base; got < int(r.Bytes) {
		t.Fatalf("VmLck grew by %d bytes, want %d", got, r.Bytes)
	}
	got, _ := f.Tensor("t1")
	if !bytes.Equal(got.Data, wantB) {
		t.Fatal("t1 changed")
	}
}

// TestMakeResidentErrors: an unknown mode and a closed file are errors;
// a parsed (not mapped) file is left as it is.
func TestMakeResidentErrors(t *testing.T) {
	_, f := residentFile(t)
	if _, err := f.MakeResident("pin", nil); err == nil {
		t.Fatal("mode pin accepted")
	}
	f.Close()
	if _, err := f.MakeResident(ResidentCopied, nil); err == nil {
		t.Fatal("a closed file accepted")
	}
	p, err := Parse(oneTensor(3))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := p.MakeResident(ResidentCopied, nil); err != nil || r.Bytes != 0 || r.Mode != ResidentInMemory {
		t.Fatalf("parsed file: %+v %v", r, err)
	}
}

// TestWriterDataSize: DataSize is the written file's data section: its
// length minus the parsed DataOffset.
func TestWriterDataSize(t *testing.T) {
	path, f := residentFile(t)
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter()
	for _, ti := range f.Tensors {
		tn, _ := f.Tensor(ti.Name)
		if err := w.AddTensor(ti.Name, ti.Type, ti.Dims, tn.Data); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := w.DataSize(), uint64(st.Size())-f.DataOffset; got != want {
		t.Fatalf("DataSize %d, file data section %d", got, want)
	}
}

// TestMakeResidentCopyHugePages: the copy of a tensor spanning several
// 2 MiB pages sits on transparent huge pages when the system grants them
// on request (/sys/kernel/mm/transparent_hugepage/enabled madvise or
// always; skipped with never): /proc/self/smaps counts AnonHugePages in
// the mapping that holds it.
func TestMakeResidentCopyHugePages(t *testing.T) {
	thp, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil || bytes.Contains(thp, []byte("[never]")) {
		t.Skipf("transparent huge pages off here (%q, %v)", thp, err)
	}
	w := NewWriter()
	w.SetString("general.architecture", "test")
	data := make([]byte, 16<<20)
	for i := range data {
		data[i] = byte(i*7 + i>>11)
	}
	if err := w.AddTensor("big", quant.F32, []uint64{uint64(len(data) / 4)}, data); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "big.gguf")
	if err := w.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.MakeResident(ResidentCopied, nil); err != nil {
		t.Fatal(err)
	}
	tn, _ := f.Tensor("big")
	if !bytes.Equal(tn.Data, data) {
		t.Fatal("the copy reads other bytes")
	}
	huge := anonHugeBytes(t, uintptr(unsafe.Pointer(&tn.Data[len(tn.Data)/2])))
	if huge < 2<<20 {
		t.Fatalf("AnonHugePages of the copy's mapping: %d bytes, want at least one 2 MiB page", huge)
	}
}

// anonHugeBytes returns AnonHugePages (bytes) of the /proc/self/smaps
// mapping that contains addr.
func anonHugeBytes(t *testing.T, addr uintptr) uint64 {
	t.Helper()
	b, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skipf("no smaps: %v", err)
	}
	in := false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		if lo, hi, ok := strings.Cut(f[0], "-"); ok && !strings.HasSuffix(f[0], ":") {
			l, err1 := strconv.ParseUint(lo, 16, 64)
			h, err2 := strconv.ParseUint(hi, 16, 64)
			in = err1 == nil && err2 == nil && uint64(addr) >= l && uint64(addr) < h
			continue
		}
		if in && f[0] == "AnonHugePages:" && len(f) >= 2 {
			kb, _ := strconv.ParseUint(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no smaps mapping holds %#x", addr)
	return 0
}
