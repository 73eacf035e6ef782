package quant

import (
	"os"
	"runtime"
	
	"golang.org/x/sys/unix"
	"testing"
	"time"
)

func threadCPU() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	return time.Duration(ts.Nano())
}

func TestZZCPU(t *testing.T) {
	if os.Getenv("ZZ") == "" {
		t.Skip()
	}
	runtime.LockOSThread()
	const n = 4096
	for _, typ := range weightTypes {
		rb, _ := typ.RowBytes(n)
		w := make([]byte, rb)
		Quantize(typ, randomRows(5, n), w)
		ab, _ := ActivationBytes(typ, n)
		a := make([]byte, ab)
		ConvertActivation(typ, randomRows(6, n), a)
		for _, simd := range []bool{true, false} {
			old := useSIMD
			useSIMD = simd
			iters := 100000
			t0 := threadCPU()
			var s float32
			for range iters {
				s += VecDot(typ, w, a, n)
			}
			d := threadCPU() - t0
			useSIMD = old
			ns := float64(d.Nanoseconds()) / float64(iters)
			t.Logf("%-5s simd=%v %8.0f ns/row  %6.2f GB/s (cpu time)", typ, simd, ns, float64(rb)/ns)
		}
	}
}
