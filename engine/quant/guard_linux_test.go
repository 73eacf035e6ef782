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

// pageEndBytes returns n bytes that end where an inaccessible page begins
// (unmapped when the test ends), or skips.
func pageEndBytes(t *testing.T, n int) []byte {
	t.Helper()
	page := syscall.Getpagesize()
	size := (n + page - 1) / page * page
	mem, err := syscall.Mmap(-1, 0, size+page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	t.Cleanup(func() { syscall.Munmap(mem) })
	if err := syscall.Mprotect(mem[size:], syscall.PROT_NONE); err != nil {
		t.Skipf("mprotect: %v", err)
	}
	return mem[size-n : size : size]
}

// TestRowKernelsAtPageEnd runs vecDotRows and vecDot4Rows (the row
// kernels where this build has them) on weight rows and activation rows
// that end right before an inaccessible page, every weight type with 1 and
// 3 blocks of 256 (Q8_0: also 7 blocks of 32, the 4-block loop and its
// tail): no load may reach past the last block (a fault would crash the
// test), and each result is the generic vecDot's.
func TestRowKernelsAtPageEnd(t *testing.T) { eachSIMDPath(t, testRowKernelsAtPageEnd) }

func testRowKernelsAtPageEnd(t *testing.T) {
	for _, typ := range weightTypes {
		ns := []int{QK_K, 3 * QK_K}
		if typ == Q8_0 {
			ns = append(ns, 7*32)
		}
		for _, n := range ns {
			rb, _ := typ.RowBytes(n)
			ab, _ := ActivationBytes(typ, n)
			const rows = 2
			w := pageEndBytes(t, rows*rb)
			a := pageEndBytes(t, 4*ab)
			for i := range rows {
				copy(w[i*rb:], quantRow(t, typ, randomRows(uint64(90+i), n)))
			}
			for j := range 4 {
				copy(a[j*ab:], convertRow(t, typ, randomRows(uint64(95+j), n)))
			}
			want := make([]float32, 4*rows)
			withGeneric(func() {
				for j := range 4 {
					for i := range rows {
						want[j*rows+i] = vecDot(typ, w[i*rb:(i+1)*rb], a[j*ab:(j+1)*ab], n)
					}
				}
			})
			got := make([]float32, rows)
			vecDotRows(typ, w, rb, a[3*ab:], n, got) // the last activation row
			for i := range rows {
				if !sameBits(got[i], want[3*rows+i]) {
					t.Fatalf("%s n=%d: vecDotRows row %d = %g, generic %g", typ, n, i, got[i], want[3*rows+i])
				}
			}
			y := make([]float32, 4*rows)
			if !vecDot4Rows(typ, w, rb, a, ab, n, y, rows, rows) {
				continue
			}
			for k := range y {
				if !sameBits(y[k], want[k]) {
					t.Fatalf("%s n=%d: vecDot4Rows y[%d] = %g, generic %g", typ, n, k, y[k], want[k])
				}
			}
		}
	}
}
