package bytesize

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"17", 17}, {"17B", 17}, {"4KiB", 4096}, {"64MiB", 64 << 20}, {"4GiB", 4 << 30}, {"2TiB", 2 << 40},
		{"100KB", 100_000}, {"64MB", 64_000_000}, {"4GB", 4_000_000_000}, {"1TB", 1_000_000_000_000},
		{"1.5GiB", 1610612736}, {"0.5KiB", 512}, {"2.5 MB", 2_500_000}, {" 8 MiB ", 8 << 20}, {"1.0001B", 1},
	} {
		if got, err := Parse(c.in); err != nil || got != c.want {
			t.Errorf("Parse(%q) = %d, %v; want %d", c.in, got, err, c.want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "-1MiB", "4 GB GB", "4gb", "1e3", "+5", "0x10", "NaN", "Inf", "4PiB0", "4194305TiB", "9223372036854775807", "1..5GB", ".", "1.5", "0.5", "2."} {
		if got, err := Parse(in); !errors.Is(err, ErrBad) {
			t.Errorf("Parse(%q) = %d, %v; want ErrBad", in, got, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{"4GiB", "1.5GB", "0", "-1", "1e3"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := Parse(s)
		if err == nil && (v < 0 || v > Max) {
			t.Fatalf("Parse(%q) = %d", s, v)
		}
	})
}
