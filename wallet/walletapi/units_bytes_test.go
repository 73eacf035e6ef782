package walletapi

import "testing"

// TestFormatBytes: decimal units, hand-computed.
func TestFormatBytes(t *testing.T) {
	for in, want := range map[uint64]string{0: "0 B", 999: "999 B", 1000: "1.00 kB", 1536: "1.54 kB", 1_277_952: "1.28 MB",
		12_345_678: "12.3 MB", 123_456_789: "123 MB", 999_600: "1.00 MB", 4_000_000_000: "4.00 GB", 4 << 30: "4.29 GB"} {
		if got := FormatBytes(in); got != want {
			t.Errorf("FormatBytes(%d) = %q, want %q", in, got, want)
		}
	}
}
