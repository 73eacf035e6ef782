package app

import (
	"fmt"
	"image/color"
	"math"
	"sync"
	"time"

	"fyne.io/fyne/v2"
	"fyne.io/fyne/v2/canvas"
	"fyne.io/fyne/v2/theme"
	"fyne.io/fyne/v2/widget"

	"github.com/kvasir-ai/kvasir/app/status"
)

// Chart colours: rows/s and MB/s.
var (
	rowsColor = color.NRGBA{0x3b, 0x82, 0xf6, 0xff}
	mbColor   = color.NRGBA{0x2e, 0xcc, 0x71, 0xff}
)

// Chart is a small time-series chart of throughput drawn with canvas
// lines: rows/s against the left scale and MB/s against the right, over
// the last Span (the newest sample at the right edge; while less data is
// held, the time the data covers rounded to a minute, at least a minute).
type Chart struct {
	widget.BaseWidget

	Span time.Duration // time shown, e.g. 5 minutes

	mu     sync.Mutex
	series []status.Sample
}

// NewChart returns an empty chart showing span.
func NewChart(span time.Duration) *Chart {
	c := &Chart{Span: span}
	c.ExtendBaseWidget(c)
	return c
}

// SetSeries replaces the samples (oldest first) and redraws. Call it on
// the Fyne goroutine (fyne.Do).
func (c *Chart) SetSeries(s []status.Sample) {
	c.mu.Lock()
	c.series = s
	c.mu.Unlock()
	c.Refresh()
}

// CreateRenderer implements fyne.Widget.
func (c *Chart) CreateRenderer() fyne.WidgetRenderer {
	r := &chartRenderer{c: c,
		bg:     canvas.NewRectangle(theme.Color(theme.ColorNameInputBackground)),
		rowMax: canvas.NewText("", rowsColor), mbMax: canvas.NewText("", mbColor),
		left: canvas.NewText("", theme.Color(theme.ColorNamePlaceHolder)), right: canvas.NewText("now", theme.Color(theme.ColorNamePlaceHolder)),
	}
	for _, t := range []*canvas.Text{r.rowMax, r.mbMax, r.left, r.right} {
		t.TextSize = theme.CaptionTextSize()
	}
	r.bg.CornerRadius = theme.InputRadiusSize()
	return r
}

type chartRenderer struct {
	c                       *Chart
	bg                      *canvas.Rectangle
	rowMax, mbMax           *canvas.Text
	left, right             *canvas.Text
	grid, rowLines, mbLines []fyne.CanvasObject
	size                    fyne.Size
}

func (r *chartRenderer) MinSize() fyne.Size { return fyne.NewSize(240, 120) }

func (r *chartRenderer) Layout(size fyne.Size) {
	r.size = size
	r.rebuild()
}

func (r *chartRenderer) Refresh() {
	r.rebuild()
	canvas.Refresh(r.c)
}

func (r *chartRenderer) Destroy() {}

func (r *chartRenderer) Objects() []fyne.CanvasObject {
	objs := []fyne.CanvasObject{r.bg}
	objs = append(objs, r.grid...)
	objs = append(objs, r.mbLines...)
	objs = append(objs, r.rowLines...)
	return append(objs, r.rowMax, r.mbMax, r.left, r.right)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten (v > 0).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func (r *chartRenderer) rebuild() {
	size := r.size
	r.bg.Resize(size)
	r.bg.Move(fyne.NewPos(0, 0))
	r.c.mu.Lock()
	series := r.c.series
	span := r.c.Span
	r.c.mu.Unlock()
	if span <= 0 {
		span = 5 * time.Minute
	}
	// Show at least a minute, and no more than the data covers (up to Span).
	if len(series) > 1 {
		span = min(span, max(time.Minute, series[len(series)-1].T.Sub(series[0].T).Round(time.Minute)))
	} else {
		span = min(span, time.Minute)
	}

	pad := theme.Padding()
	textH := theme.CaptionTextSize() + 2*pad
	plotX, plotY := pad, textH
	plotW, plotH := size.Width-2*pad, size.Height-2*textH
	if plotW < 10 || plotH < 10 {
		r.grid, r.rowLines, r.mbLines = nil, nil, nil
		return
	}

	var maxRows, maxMB float64
	for _, s := range series {
		maxRows = math.Max(maxRows, s.RowsPS)
		maxMB = math.Max(maxMB, s.BytesPS/status.BytesPerMB)
	}
	maxRows, maxMB = niceCeil(maxRows), niceCeil(maxMB)

	gridColor := theme.Color(theme.ColorNameSeparator)
	r.grid = r.grid[:0]
	for i := 0; i <= 4; i++ {
		y := plotY + plotH*float32(i)/4
		l := canvas.NewLine(gridColor)
		l.StrokeWidth = 1
		l.Position1, l.Position2 = fyne.NewPos(plotX, y), fyne.NewPos(plotX+plotW, y)
		r.grid = append(r.grid, l)
	}

	var end time.Time
	if len(series) > 0 {
		end = series[len(series)-1].T
	}
	xOf := func(t time.Time) float32 {
		return plotX + plotW*float32(1-end.Sub(t).Seconds()/span.Seconds())
	}
	poly := func(dst []fyne.CanvasObject, col color.Color, val func(status.Sample) float64, max float64) []fyne.CanvasObject {
		dst = dst[:0]
		for i := 1; i < len(series); i++ {
			a, b := series[i-1], series[i]
			if end.Sub(a.T) > span {
				continue
			}
			l := canvas.NewLine(col)
			l.StrokeWidth = 2
			l.Position1 = fyne.NewPos(xOf(a.T), plotY+plotH*float32(1-val(a)/max))
			l.Position2 = fyne.NewPos(xOf(b.T), plotY+plotH*float32(1-val(b)/max))
			dst = append(dst, l)
		}
		return dst
	}
	r.mbLines = poly(r.mbLines, mbColor, func(s status.Sample) float64 { return s.BytesPS / status.BytesPerMB }, maxMB)
	r.rowLines = poly(r.rowLines, rowsColor, func(s status.Sample) float64 { return s.RowsPS }, maxRows)

	r.rowMax.Text = fmt.Sprintf("rows/s (scale %g)", maxRows)
	r.mbMax.Text = fmt.Sprintf("MB/s (scale %g)", maxMB)
	if span%time.Minute == 0 {
		r.left.Text = fmt.Sprintf("%d min ago", span/time.Minute)
	} else {
		r.left.Text = fmt.Sprintf("%s ago", span.Round(time.Second))
	}
	for _, t := range []*canvas.Text{r.rowMax, r.mbMax, r.left, r.right} {
		t.Refresh()
	}
	r.rowMax.Move(fyne.NewPos(plotX, pad/2))
	mbw := r.mbMax.MinSize().Width
	r.mbMax.Move(fyne.NewPos(plotX+plotW-mbw, pad/2))
	r.left.Move(fyne.NewPos(plotX, plotY+plotH+pad/2))
	r.right.Move(fyne.NewPos(plotX+plotW-r.right.MinSize().Width, plotY+plotH+pad/2))
}
