// Command gen draws the contributor app's icons into assets/ (run by `go
// generate ./assets/`): the app icon and one tray icon per connection
// state. They are drawn with the standard library only, anti-aliased by
// 4x4 supersampling, so the committed PNGs are reproducible.
package main

import (
	"flag"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"os"
	"path/filepath"
)

// A shape reports how much of its colour covers point (x, y) in a unit
// square [0,1)^2: 0 or 1 (coverage comes from supersampling).
type layer struct {
	in  func(x, y float64) bool
	col color.NRGBA
}

func disc(cx, cy, r float64) func(x, y float64) bool {
	return func(x, y float64) bool { return (x-cx)*(x-cx)+(y-cy)*(y-cy) <= r*r }
}

func ring(cx, cy, r0, r1 float64) func(x, y float64) bool {
	return func(x, y float64) bool {
		d := math.Hypot(x-cx, y-cy)
		return d >= r0 && d <= r1
	}
}

// segment is a thick line from (x0,y0) to (x1,y1) of half-width w.
func segment(x0, y0, x1, y1, w float64) func(x, y float64) bool {
	return func(x, y float64) bool {
		dx, dy := x1-x0, y1-y0
		t := ((x-x0)*dx + (y-y0)*dy) / (dx*dx + dy*dy)
		t = math.Max(0, math.Min(1, t))
		px, py := x0+t*dx-x, y0+t*dy-y
		return px*px+py*py <= w*w
	}
}

// render draws layers in order (later on top) into a size x size image.
func render(size int, layers []layer) *image.NRGBA {
	img := image.NewNRGBA(image.Rect(0, 0, size, size))
	const ss = 4
	for py := 0; py < size; py++ {
		for px := 0; px < size; px++ {
			var r, g, b, a float64
			for sy := 0; sy < ss; sy++ {
				for sx := 0; sx < ss; sx++ {
					x := (float64(px) + (float64(sx)+0.5)/ss) / float64(size)
					y := (float64(py) + (float64(sy)+0.5)/ss) / float64(size)
					var cr, cg, cb, ca float64 // premultiplied, "over" compositing
					for _, l := range layers {
						if l.in(x, y) {
							la := float64(l.col.A) / 255
							cr = float64(l.col.R)/255*la + cr*(1-la)
							cg = float64(l.col.G)/255*la + cg*(1-la)
							cb = float64(l.col.B)/255*la + cb*(1-la)
							ca = la + ca*(1-la)
						}
					}
					r, g, b, a = r+cr, g+cg, b+cb, a+ca
				}
			}
			n := float64(ss * ss)
			r, g, b, a = r/n, g/n, b/n, a/n
			if a > 0 {
				img.SetNRGBA(px, py, color.NRGBA{uint8(math.Round(r / a * 255)), uint8(math.Round(g / a * 255)), uint8(math.Round(b / a * 255)), uint8(math.Round(a * 255))})
			}
		}
	}
	return img
}

// icon is the kvasir mark: a dark disc with a ring in the state colour and
// a 3x3 grid of expert dots, the lit ones (mask bits, row-major) in the
// state colour joined by links to the centre.
func icon(state color.NRGBA, lit uint16) []layer {
	dark := color.NRGBA{0x17, 0x22, 0x36, 0xff}
	dim := color.NRGBA{0x4a, 0x5a, 0x74, 0xff}
	ls := []layer{{disc(0.5, 0.5, 0.47), dark}, {ring(0.5, 0.5, 0.40, 0.47), state}}
	for i := 0; i < 9; i++ {
		x, y := 0.31+0.19*float64(i%3), 0.31+0.19*float64(i/3)
		if lit&(1<<i) != 0 && i != 4 {
			ls = append(ls, layer{segment(0.5, 0.5, x, y, 0.018), state})
		}
	}
	for i := 0; i < 9; i++ {
		x, y := 0.31+0.19*float64(i%3), 0.31+0.19*float64(i/3)
		c := dim
		if lit&(1<<i) != 0 {
			c = state
		}
		ls = append(ls, layer{disc(x, y, 0.055), c})
	}
	return ls
}

func main() {
	out := flag.String("o", ".", "output folder")
	flag.Parse()
	green := color.NRGBA{0x2e, 0xcc, 0x71, 0xff}
	amber := color.NRGBA{0xf5, 0xa6, 0x23, 0xff}
	grey := color.NRGBA{0x8a, 0x96, 0xa8, 0xff}
	red := color.NRGBA{0xe7, 0x4c, 0x3c, 0xff}
	const all, cross, centre, none = 0x1ff, 0xba, 0x10, 0
	files := []struct {
		name string
		size int
		ls   []layer
	}{
		{"icon.png", 512, icon(green, all)},
		{"tray-connected.png", 64, icon(green, all)},
		{"tray-dialing.png", 64, icon(amber, cross)},
		{"tray-paused.png", 64, icon(grey, centre)},
		{"tray-offline.png", 64, icon(red, none)},
	}
	for _, f := range files {
		p := filepath.Join(*out, f.name)
		w, err := os.Create(p)
		if err == nil {
			err = png.Encode(w, render(f.size, f.ls))
			if cerr := w.Close(); err == nil {
				err = cerr
			}
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "gen:", err)
			os.Exit(1)
		}
	}
}
