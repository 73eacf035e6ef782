package assets

import (
	"bytes"
	"image/png"
	"testing"
)

func TestIcons(t *testing.T) {
	cases := []struct {
		name string
		b    []byte
		size int
		ring [3]uint8 // RGB of the ring at (size/2, 3% from the top)
	}{
		{"icon", Icon, 512, [3]uint8{0x2e, 0xcc, 0x71}},
		{"connected", TrayConnected, 64, [3]uint8{0x2e, 0xcc, 0x71}},
		{"dialing", TrayDialing, 64, [3]uint8{0xf5, 0xa6, 0x23}},
		{"paused", TrayPaused, 64, [3]uint8{0x8a, 0x96, 0xa8}},
		{"offline", TrayOffline, 64, [3]uint8{0xe7, 0x4c, 0x3c}},
	}
	for _, c := range cases {
		img, err := png.Decode(bytes.NewReader(c.b))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if b := img.Bounds(); b.Dx() != c.size || b.Dy() != c.size {
			t.Errorf("%s: %v, want %d square", c.name, b, c.size)
		}
		// The ring spans radius 0.40..0.47 of the size: sample at 0.435.
		r, g, b, a := img.At(c.size/2, int(float64(c.size)*(0.5-0.435))).RGBA()
		if a>>8 != 0xff || [3]uint8{uint8(r >> 8), uint8(g >> 8), uint8(b >> 8)} != c.ring {
			t.Errorf("%s: ring pixel %02x %02x %02x %02x, want %x", c.name, r>>8, g>>8, b>>8, a>>8, c.ring)
		}
		// Corners are transparent (round icon).
		if _, _, _, a := img.At(0, 0).RGBA(); a != 0 {
			t.Errorf("%s: corner alpha %d", c.name, a)
		}
	}
}
