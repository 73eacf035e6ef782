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
	"github.com/kvasir-ai/kvasir/wallet"
	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// Chart colours: rows/s (the throughput line and figure), MB/s (the
// traffic figure), and the earnings chart's credited and estimated bars.
var (
	rowsColor     = color.NRGBA{0x3b, 0x82, 0xf6, 0xff}
	mbColor       = color.NRGBA{0x2e, 0xcc, 0x71, 0xff}
	creditedColor = color.NRGBA{0xf5, 0x9e, 0x0b, 0xff}
	estimateColor = color.NRGBA{0xf5, 0x9e, 0x0b, 0x55}
)

// Chart is a small time-series chart of throughput drawn with canvas
// lines: rows/s on a labelled scale (its top and middle values at the
// grid lines), over the last Span (the newest sample at the right edge;
// while less data is held, the time the data covers rounded to a minute,
// at least a minute). MB/s is proportional to rows/s for a given model, so
// it is a figure beside the chart, not a second line on top of the first.
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
		rowMax: canvas.NewText("", rowsColor), mbMax: canvas.NewText("", theme.Color(theme.ColorNameForeground)),
		left: canvas.NewText("", theme.Color(theme.ColorNameForeground)), right: canvas.NewText("now", theme.Color(theme.ColorNameForeground)),
	}
	for _, t := range []*canvas.Text{r.rowMax, r.mbMax, r.left, r.right} {
		t.TextSize = theme.CaptionTextSize()
	}
	r.bg.CornerRadius = theme.InputRadiusSize()
	return r
}

// chartRenderer draws the chart with objects it keeps and moves (lineAt):
// making new ones on every layout, as it once did, kept Fyne repainting the
// window at its frame rate (about a third of a CPU with a software GL
// driver, with nothing changing on screen).
type chartRenderer struct {
	c                  *Chart
	bg                 *canvas.Rectangle
	rowMax, mbMax      *canvas.Text
	left, right        *canvas.Text
	gridPool, linePool []*canvas.Line
	grid, rowLines     []fyne.CanvasObject // the pools' lines in use
	size               fyne.Size
	laidOut            bool
}

// lineAt returns the i-th line of *pool (made on first use) with colour
// col and width w.
func lineAt(pool *[]*canvas.Line, i int, col color.Color, w float32) *canvas.Line {
	for len(*pool) <= i {
		*pool = append(*pool, canvas.NewLine(col))
	}
	l := (*pool)[i]
	l.StrokeColor, l.StrokeWidth = col, w
	return l
}

func (r *chartRenderer) MinSize() fyne.Size { return fyne.NewSize(200, 64) }

func (r *chartRenderer) Layout(size fyne.Size) {
	if r.laidOut && size == r.size {
		return // the data did not change either: Refresh rebuilds for that
	}
	r.size, r.laidOut = size, true
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
	textH := theme.CaptionTextSize() + 3*pad // the top label clears the top grid line
	plotX, plotY := pad, textH
	plotW, plotH := size.Width-2*pad, size.Height-2*textH
	if plotW < 10 || plotH < 10 {
		r.grid, r.rowLines = nil, nil
		return
	}

	var maxRows float64
	for _, s := range series {
		maxRows = math.Max(maxRows, s.RowsPS)
	}
	maxRows = niceCeil(maxRows)

	gridColor := theme.Color(theme.ColorNameSeparator)
	r.grid = r.grid[:0]
	for i := 0; i <= 4; i++ {
		y := plotY + plotH*float32(i)/4
		l := lineAt(&r.gridPool, i, gridColor, 1)
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
			l := lineAt(&r.linePool, len(dst), col, 2)
			l.Position1 = fyne.NewPos(xOf(a.T), plotY+plotH*float32(1-val(a)/max))
			l.Position2 = fyne.NewPos(xOf(b.T), plotY+plotH*float32(1-val(b)/max))
			dst = append(dst, l)
		}
		return dst
	}
	r.rowLines = poly(r.rowLines, rowsColor, func(s status.Sample) float64 { return s.RowsPS }, maxRows)

	// The scale: the top grid line's value, and the middle one's.
	r.rowMax.Text = fmt.Sprintf("%g rows/s", maxRows)
	r.mbMax.Text = fmt.Sprintf("%g rows/s", maxRows/2)
	if span%time.Minute == 0 {
		r.left.Text = fmt.Sprintf("%d min ago", span/time.Minute)
	} else {
		r.left.Text = fmt.Sprintf("%s ago", span.Round(time.Second))
	}
	r.rowMax.Move(fyne.NewPos(plotX, pad/2))
	r.mbMax.Move(fyne.NewPos(plotX+pad, plotY+plotH/2-r.mbMax.MinSize().Height-1))
	r.left.Move(fyne.NewPos(plotX, plotY+plotH+pad/2))
	r.right.Move(fyne.NewPos(plotX+plotW-r.right.MinSize().Width, plotY+plotH+pad/2))
}

// EarningsHours is how many hours the earnings chart shows.
const EarningsHours = 24

// EarningsChart shows the wallet's history per hour over the last
// EarningsHours: KVR credited by the gateway's statements (solid bars)
// and the estimate from the worker's own count (light bars behind them).
// It is read from the wallet file, so it survives restarts of the worker
// and of the app.
type EarningsChart struct {
	widget.BaseWidget

	mu     sync.Mutex
	groups []wallet.Group // hourly groups, any order
	now    time.Time
}

// NewEarningsChart returns an empty earnings chart.
func NewEarningsChart() *EarningsChart {
	c := &EarningsChart{}
	c.ExtendBaseWidget(c)
	return c
}

// SetGroups shows hourly groups (wallet.Wallet.Groups(wallet.ByHour, ...))
// up to the hour of now. Call it on the Fyne goroutine.
func (c *EarningsChart) SetGroups(gs []wallet.Group, now time.Time) {
	c.mu.Lock()
	c.groups, c.now = gs, now
	c.mu.Unlock()
	c.Refresh()
}

// CreateRenderer implements fyne.Widget.
func (c *EarningsChart) CreateRenderer() fyne.WidgetRenderer {
	fg := theme.Color(theme.ColorNameForeground)
	r := &earningsRenderer{c: c, bg: canvas.NewRectangle(theme.Color(theme.ColorNameInputBackground)),
		title: canvas.NewText("KVR per hour, last 24 h", fg), max: canvas.NewText("", fg),
		left: canvas.NewText("24 h ago", fg), right: canvas.NewText("now", fg),
		legend: canvas.NewText("", fg)}
	for _, t := range []*canvas.Text{r.title, r.max, r.left, r.right, r.legend} {
		t.TextSize = theme.CaptionTextSize()
	}
	r.bg.CornerRadius = theme.InputRadiusSize()
	return r
}

// earningsRenderer keeps and moves its objects, as chartRenderer does.
type earningsRenderer struct {
	c                               *EarningsChart
	bg                              *canvas.Rectangle
	title, max, left, right, legend *canvas.Text
	rectPool                        []*canvas.Rectangle
	base                            *canvas.Line
	bars                            []fyne.CanvasObject // the pool's rectangles in use, and base
	size                            fyne.Size
	laidOut                         bool
}

func (r *earningsRenderer) MinSize() fyne.Size { return fyne.NewSize(200, 90) }
func (r *earningsRenderer) Layout(size fyne.Size) {
	if r.laidOut && size == r.size {
		return
	}
	r.size, r.laidOut = size, true
	r.rebuild()
}
func (r *earningsRenderer) Refresh() { r.rebuild(); canvas.Refresh(r.c) }
func (r *earningsRenderer) Destroy() {}
func (r *earningsRenderer) Objects() []fyne.CanvasObject {
	return append(append([]fyne.CanvasObject{r.bg}, r.bars...), r.title, r.max, r.left, r.right, r.legend)
}

// hourlyEarnings sums groups into EarningsHours hourly slots ending with
// now's hour: credited and estimated nKVR per slot, oldest first.
func hourlyEarnings(gs []wallet.Group, now time.Time) (credited, estimate [EarningsHours]uint64) {
	last := now.UTC().Truncate(time.Hour)
	for _, g := range gs {
		i := EarningsHours - 1 - int(last.Sub(g.From.UTC().Truncate(time.Hour))/time.Hour)
		if i < 0 || i >= EarningsHours {
			continue
		}
		credited[i] += g.CreditedNKVR
		estimate[i] += g.MeteredNKVR
	}
	return credited, estimate
}

func (r *earningsRenderer) rebuild() {
	size := r.size
	r.bg.Resize(size)
	r.c.mu.Lock()
	credited, estimate := hourlyEarnings(r.c.groups, r.c.now)
	r.c.mu.Unlock()
	pad := theme.Padding()
	textH := theme.CaptionTextSize() + 2*pad
	plotX, plotY, plotW, plotH := pad, textH, size.Width-2*pad, size.Height-2*textH
	r.bars = r.bars[:0]
	if plotW < 10 || plotH < 10 {
		return
	}
	var top uint64
	for i := range credited {
		top = max(top, credited[i], estimate[i])
	}
	scale := niceCeil(float64(top) / walletapi.NanoPerKVR)
	slot := plotW / EarningsHours
	bar := func(i int, v uint64, col color.Color, inset float32) {
		if v == 0 {
			return
		}
		h := plotH * float32(float64(v)/walletapi.NanoPerKVR/scale)
		for len(r.rectPool) <= len(r.bars) {
			r.rectPool = append(r.rectPool, canvas.NewRectangle(col))
		}
		b := r.rectPool[len(r.bars)]
		b.FillColor = col
		b.Move(fyne.NewPos(plotX+float32(i)*slot+inset, plotY+plotH-h))
		b.Resize(fyne.NewSize(max(slot-2*inset, 1), h))
		r.bars = append(r.bars, b)
	}
	for i := range credited {
		bar(i, estimate[i], estimateColor, 1)
		bar(i, credited[i], creditedColor, 3)
	}
	if r.base == nil {
		r.base = canvas.NewLine(theme.Color(theme.ColorNameSeparator))
	}
	r.base.Position1, r.base.Position2 = fyne.NewPos(plotX, plotY+plotH), fyne.NewPos(plotX+plotW, plotY+plotH)
	r.bars = append(r.bars, r.base)
	if top == 0 {
		r.max.Text = "nothing earned in the last 24 h"
	} else {
		r.max.Text = "top: " + walletapi.FormatKVR(uint64(scale*walletapi.NanoPerKVR))
	}
	r.legend.Text = "solid: credited · light: estimate"
	r.title.Move(fyne.NewPos(plotX, pad/2))
	r.max.Move(fyne.NewPos(plotX+plotW-r.max.MinSize().Width, pad/2))
	r.left.Move(fyne.NewPos(plotX, plotY+plotH+pad/2))
	r.legend.Move(fyne.NewPos(plotX+(plotW-r.legend.MinSize().Width)/2, plotY+plotH+pad/2))
	r.right.Move(fyne.NewPos(plotX+plotW-r.right.MinSize().Width, plotY+plotH+pad/2))
}
