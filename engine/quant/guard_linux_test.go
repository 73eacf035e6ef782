package quant

import (
	"syscall"
	"testing"
	"unsafe"
)

// TestDotF32TailAtPageEnd runs DotF32 (and DotF32Rows) on vectors that end
// right before an inaccessible page: the tail kernels' masked loads must
// not touch the lanes past the end (a fault would crash the test), for
// every tail length.
func TestDotF32TailAtPageEnd(t *testing.T) {
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 2*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer syscall.Munmap(mem)
	if err := syscall.Mprotect(mem[page:], syscall.PROT_NONE); err != nil {
		t.Skipf("mprotect: %v", err)
	}
	all := unsafe.Slice((*float32)(unsafe.Pointer(&mem[0])), page/4)
	for i := range all {
		all[i] = float32(i%7) - 3
	}
	for n := 1; n <= 70; n++ {
		a := all[len(all)-n:]
		b := all[len(all)-2*n : len(all)-n]
		got := DotF32(b, a)
		var want float32
		withGeneric(func() { want = DotF32(b, a) })
		if !sameBits(got, want) {
			t.Fatalf("n=%d: %g, generic %g", n, got, want)
		}
		out := make([]float32, 3) // DotF32Rows: last row ends at the page end
		m := all[len(all)-(2*(n+1)+n):]
		if err := DotF32Rows(b, m, n+1, out); err != nil {
			t.Fatal(err)
		}
		if !sameBits(out[2], DotF32(b, m[2*(n+1):])) {
			t.Fatalf("DotF32Rows n=%d: last row %g", n, out[2])
		}
	}
}
