// Package app is kvasir's contributor app on Fyne: a window with the
// worker's connection state ("why am I not earning?"), a live throughput
// chart, pending and credited KVR with the wallet history (CSV export),
// the slice on disk, settings and limits, and Pause / Resume / "Finish
// current work then pause"; a system tray icon and menu on desktops. It
// reads the worker through a Backend, so it is tested against fakes with
// fyne.io/fyne/v2/test. Headless mode lives in app/headless, which does
// not import Fyne.
package app

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"fyne.io/fyne/v2"
	"fyne.io/fyne/v2/canvas"
	"fyne.io/fyne/v2/container"
	"fyne.io/fyne/v2/dialog"
	"fyne.io/fyne/v2/layout"
	"fyne.io/fyne/v2/theme"
	"fyne.io/fyne/v2/widget"

	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/assets"
	"github.com/kvasir-ai/kvasir/wallet"
)

// Backend is the running contributor node the window shows: the worker
// (status.Source), the local wallet and the slice on disk. Summary,
// Groups and Events touch the disk (SQLite): the UI calls them off the
// Fyne goroutine.
type Backend interface {
	status.Source
	Summary() (wallet.Summary, error)
	// Groups returns the wallet history grouped (wallet.Wallet.Groups).
	Groups(by wallet.GroupBy, limit int) ([]wallet.Group, error)
	// Events returns history rows in [from, to) (wallet.Wallet.Events).
	Events(from, to time.Time, limit int) ([]wallet.Event, error)
	Slice() status.SliceInfo
}

// History sizes: the groups the wallet tab lists and the rows it shows
// inside one group (the CSV export writes every row).
const (
	HistoryGroups = 48
	DetailRows    = 500
)

// ChartSpan is the time the throughput chart shows; the meter keeps one
// snapshot per second for it.
const ChartSpan = 5 * time.Minute

// UI is the contributor window's content and state. Create with NewUI;
// all methods except Poll must run on the Fyne goroutine.
type UI struct {
	app   fyne.App
	ctl   *status.Control
	be    Backend
	meter *status.Meter

	mu      sync.Mutex
	sum     wallet.Summary
	sumErr  error
	snap    status.Snapshot
	onState func(status.Snapshot, wallet.Summary) // tray hook

	// status tab
	stateIcon           *canvas.Image
	state               *canvas.Text
	gateway             *widget.Label
	device              *widget.Label   // "Computing on: DEVICE · N rows/s"
	statusTab           *fyne.Container // relaid out when the why card shows or hides
	whyCard             *fyne.Container // "Not earning:" and why, one compact line (wraps when long)
	why                 *widget.Label
	noticeCard          *fyne.Container // a warning the owner should see (the identity key in a plain file)
	noticeTitle, notice *widget.Label
	rowsPS, mbPS        *canvas.Text
	estT, credT, paidT  *canvas.Text
	payNote             *widget.Label
	counters            *widget.Label
	chart               *Chart
	pause, resume, fin  *widget.Button
	// wallet tab
	address, credited, metered, paid, served, reconcile *widget.Label
	earnings                                            *EarningsChart
	earningsAt                                          time.Time // last earnings read (poll goroutine)
	earningsKey                                         [2]uint64 // statements, bytes served at that read
	groupBy                                             *widget.RadioGroup
	history                                             *widget.Tree
	by                                                  wallet.GroupBy           // u.mu
	groups                                              []wallet.Group           // Fyne goroutine
	detail                                              map[int64][]wallet.Event // by group start (unix ms), Fyne goroutine
	open                                                map[int64]bool           // expanded groups, u.mu
	walletShown                                         atomic.Bool              // the wallet tab is selected
	// background runs f off the Fyne goroutine (a goroutine; tests run it
	// in place); f applies its results with fyne.Do.
	background func(f func())
	// slice tab
	slice, sliceDetail *widget.Label
	download           *widget.ProgressBar // assigned bytes downloaded, 0..1
	downloadLine       *widget.Label

	Settings *SettingsForm // settings tab

	Tabs *container.AppTabs // the window content
}

// icons per state, as Fyne resources.
var stateIcons = map[status.State]fyne.Resource{
	status.Connected: fyne.NewStaticResource("tray-connected.png", assets.TrayConnected),
	status.Dialing:   fyne.NewStaticResource("tray-dialing.png", assets.TrayDialing),
	status.Paused:    fyne.NewStaticResource("tray-paused.png", assets.TrayPaused),
	status.Offline:   fyne.NewStaticResource("tray-offline.png", assets.TrayOffline),
}

// AppIcon is the app icon resource (assets.Icon).
var AppIcon = fyne.NewStaticResource("icon.png", assets.Icon)

func bigText(s string, c fyne.ThemeColorName) *canvas.Text {
	t := canvas.NewText(s, theme.Color(c))
	t.TextSize = 1.5 * theme.TextSize() // large, yet four rows of figures fit a 640x480 window
	t.TextStyle.Bold = true
	return t
}

// tile is a figure with its caption above it, in the normal text colour
// (not the low-contrast grey), both indented like a label's text. Every
// figure is a canvas.Text of the same size and style, so they share one
// baseline.
func tile(caption string, value *canvas.Text) fyne.CanvasObject {
	cap := canvas.NewText(caption, theme.Color(theme.ColorNameForeground))
	indent := layout.NewCustomPaddedLayout(0, 0, theme.InnerPadding(), 0)
	return container.NewVBox(container.New(indent, cap), container.New(indent, value))
}

// NewUI builds the window content for be, controlled through ctl (which
// must wrap be). settings is the settings tab (see NewSettingsForm).
func NewUI(a fyne.App, be Backend, ctl *status.Control, settings *SettingsForm) *UI {
	u := &UI{app: a, be: be, ctl: ctl, meter: status.NewMeter(int(ChartSpan/time.Second) + 1), Settings: settings,
		background: func(f func()) { go f() }}

	u.stateIcon = canvas.NewImageFromResource(stateIcons[status.Offline])
	u.stateIcon.FillMode = canvas.ImageFillContain
	u.stateIcon.SetMinSize(fyne.NewSize(48, 48))
	u.state = bigText("offline", theme.ColorNameForeground)
	u.gateway = widget.NewLabel("gateway —")
	u.device = widget.NewLabel(status.ComputeLine(status.Snapshot{}, 0))
	u.device.Truncation = fyne.TextTruncateEllipsis
	u.device.Alignment = fyne.TextAlignTrailing
	u.why = widget.NewLabel("")
	u.why.Wrapping = fyne.TextWrapWord
	u.whyCard = container.NewBorder(nil, nil, widget.NewLabelWithStyle("Not earning:", fyne.TextAlignLeading, fyne.TextStyle{Bold: true}), nil, u.why)
	u.rowsPS = bigText(status.FormatRows(0), theme.ColorNamePrimary)
	u.rowsPS.Color = rowsColor
	u.mbPS = bigText(status.FormatMBps(0), theme.ColorNameSuccess)
	u.mbPS.Color = mbColor
	u.estT = bigText(status.FormatKVR(0), theme.ColorNameForeground)
	u.credT = bigText(status.FormatKVR(0), theme.ColorNameForeground)
	u.paidT = bigText(status.FormatKVR(0), theme.ColorNameForeground)
	u.payNote = widget.NewLabel(payNote(wallet.Summary{}))
	u.payNote.Truncation = fyne.TextTruncateEllipsis
	u.notice = widget.NewLabel("")
	u.notice.Wrapping = fyne.TextWrapWord
	u.noticeTitle = widget.NewLabelWithStyle("", fyne.TextAlignLeading, fyne.TextStyle{Bold: true})
	u.noticeTitle.Importance = widget.WarningImportance
	u.noticeCard = container.NewBorder(nil, nil, u.noticeTitle, nil, u.notice)
	u.noticeCard.Hide()
	u.counters = widget.NewLabel("")
	u.counters.Truncation = fyne.TextTruncateEllipsis
	u.chart = NewChart(ChartSpan)

	u.pause = widget.NewButtonWithIcon("Pause", theme.MediaPauseIcon(), func() { u.ctl.Pause(); u.refreshState() })
	u.resume = widget.NewButtonWithIcon("Resume", theme.MediaPlayIcon(), func() { u.ctl.Resume(); u.refreshState() })
	u.fin = widget.NewButtonWithIcon("Finish current work then pause", theme.MediaStopIcon(), func() { u.ctl.FinishThenPause(); u.refreshState() })

	u.gateway.Truncation = fyne.TextTruncateEllipsis
	header := container.NewBorder(nil, nil, u.stateIcon, nil,
		// The device shares the title's row: a line of its own made the
		// not-earning status taller than a 640x480 window.
		container.NewVBox(container.NewBorder(nil, nil, u.state, nil, u.device), u.gateway))
	tiles := container.NewVBox(
		container.NewGridWithColumns(2, tile("Throughput", u.rowsPS), tile("Traffic", u.mbPS)),
		container.NewGridWithColumns(3, tile("Earned (estimate, live)", u.estT),
			tile("Credited, awaiting payout", u.credT), tile("Paid out", u.paidT)),
		u.payNote)
	buttons := container.NewHBox(u.pause, u.resume, u.fin)
	u.statusTab = container.NewBorder(container.NewVBox(header, u.noticeCard, u.whyCard, tiles),
		container.NewVBox(u.counters, buttons), nil, nil,
		u.chart)

	u.address = widget.NewLabel("")
	u.address.TextStyle.Monospace = true
	u.credited, u.metered, u.paid, u.served = widget.NewLabel(""), widget.NewLabel(""), widget.NewLabel(""), widget.NewLabel("")
	// Single lines in the form (a wrapping label in a form asks for the
	// height of one word per line before it is laid out, which made the
	// window taller than a 640x480 screen); the long texts wrap in a
	// scrolled pane below.
	for _, l := range []*widget.Label{u.credited, u.metered, u.paid} {
		l.Truncation = fyne.TextTruncateEllipsis
	}
	u.reconcile = widget.NewLabel("")
	u.reconcile.Wrapping = fyne.TextWrapWord
	payout := widget.NewLabel("Payouts: " + wallet.PayoutNote + ".")
	payout.Wrapping = fyne.TextWrapWord
	u.earnings = NewEarningsChart()
	u.detail, u.open = map[int64][]wallet.Event{}, map[int64]bool{}
	u.history = widget.NewTree(u.historyChildren, u.historyIsBranch,
		func(bool) fyne.CanvasObject {
			l := widget.NewLabel("2026-01-01 00:00–01:00 UTC")
			l.Truncation = fyne.TextTruncateEllipsis // a narrow window cuts a row with "…", not mid-word
			return l
		},
		func(id widget.TreeNodeID, _ bool, o fyne.CanvasObject) { o.(*widget.Label).SetText(u.historyText(id)) })
	u.history.OnBranchOpened = func(id widget.TreeNodeID) { u.setOpen(id, true) }
	u.history.OnBranchClosed = func(id widget.TreeNodeID) { u.setOpen(id, false) }
	u.groupBy = widget.NewRadioGroup([]string{"Hour", "Day", "Session"}, func(v string) {
		by := map[string]wallet.GroupBy{"Hour": wallet.ByHour, "Day": wallet.ByDay, "Session": wallet.BySession}[v]
		u.mu.Lock()
		changed := by != u.by
		u.by = by
		u.open = map[int64]bool{}
		u.mu.Unlock()
		if changed {
			u.groups, u.detail = nil, map[int64][]wallet.Event{}
			u.history.CloseAllBranches()
			u.history.Refresh()
			u.background(func() { fyne.Do(u.pollHistory()) })
		}
	})
	u.groupBy.Horizontal = true
	u.groupBy.Required = true
	u.groupBy.SetSelected("Hour")
	export := widget.NewButtonWithIcon("Export CSV", theme.DocumentSaveIcon(), u.showExport)
	u.address.Truncation = fyne.TextTruncateEllipsis
	history := container.NewBorder(
		container.NewHBox(widget.NewLabelWithStyle("History by", fyne.TextAlignLeading, fyne.TextStyle{Bold: true}), u.groupBy),
		nil, nil, nil, u.history)
	lower := container.NewVSplit(u.earnings, history)
	lower.Offset = 0.35
	split := container.NewVSplit(container.NewVScroll(container.NewVBox(u.reconcile, payout)), lower)
	split.Offset = 0.2
	walletTab := container.NewBorder(
		widget.NewForm(
			widget.NewFormItem("Address", u.address),
			widget.NewFormItem("Earned", u.metered),
			widget.NewFormItem("Credited", u.credited),
			widget.NewFormItem("Paid out", u.paid)),
		container.NewHBox(u.served, layout.NewSpacer(), export), nil, nil, split)

	u.slice = widget.NewLabel("")
	u.slice.Wrapping = fyne.TextWrapWord
	u.sliceDetail = widget.NewLabel("")
	u.download = widget.NewProgressBar()
	u.download.Hide() // shown once experts are assigned: an empty assignment is no bar, not a full one
	u.downloadLine = widget.NewLabel("no experts assigned yet")
	sliceTab := container.NewVBox(widget.NewCard("Slice on disk", "", container.NewVBox(u.slice, u.sliceDetail)),
		widget.NewCard("Assigned by the backbone", "", container.NewVBox(u.downloadLine, u.download)))

	tabs := []*container.TabItem{
		container.NewTabItemWithIcon("Status", theme.HomeIcon(), u.statusTab),
		container.NewTabItemWithIcon("Wallet", theme.AccountIcon(), walletTab),
		container.NewTabItemWithIcon("Slice", theme.StorageIcon(), sliceTab),
	}
	if settings != nil {
		tabs = append(tabs, container.NewTabItemWithIcon("Settings", theme.SettingsIcon(), settings.Content))
	}
	u.Tabs = container.NewAppTabs(tabs...)
	u.Tabs.OnSelected = func(ti *container.TabItem) {
		shown := ti.Content == walletTab
		if shown && !u.walletShown.Load() {
			u.background(func() { fyne.Do(u.pollHistory()) })
		}
		u.walletShown.Store(shown)
	}
	u.Apply(time.Time{}, status.Snapshot{}, nil, nil)
	return u
}

// historyLine renders one wallet event for the history list.
func historyLine(e wallet.Event) string {
	what := ""
	switch e.State {
	case wallet.StateMetered:
		what = "session " + e.Session
	case wallet.StateCredited:
		what = fmt.Sprintf("statement #%d", e.Statement)
	case wallet.StatePaid:
		what = "ref " + e.Ref
	}
	return fmt.Sprintf("%s  %-8s  %s  %s  %s", e.Time.UTC().Format("2006-01-02 15:04:05Z"), e.State,
		status.FormatKVR(e.NKVR), status.FormatBytes(e.Bytes), what)
}

// Poll reads the backend (stats always, the wallet summary and slice when
// withWallet) and returns a function that applies the readings to the UI,
// to be run on the Fyne goroutine (fyne.Do). It may run on any goroutine.
func (u *UI) Poll(now time.Time, withWallet bool) func() {
	snap := u.ctl.Stats()
	var sum *wallet.Summary
	var sl *status.SliceInfo
	var serr error
	history := func() {}
	if withWallet {
		s, err := u.be.Summary()
		if err == nil {
			sum = &s
			// The earnings chart reads the hourly history when the wallet
			// changed, and every minute for the hour boundary.
			if key := [2]uint64{s.Statements, s.BytesServed}; key != u.earningsKey || now.Sub(u.earningsAt) >= time.Minute {
				if gs, err := u.be.Groups(wallet.ByHour, EarningsHours); err == nil {
					u.earningsKey, u.earningsAt = key, now
					at := now
					if at.IsZero() {
						at = time.Now()
					}
					prev := history
					history = func() { prev(); u.earnings.SetGroups(gs, at) }
				}
			}
		}
		serr = err
		si := u.be.Slice()
		sl = &si
		if u.walletShown.Load() {
			prev := history
			h := u.pollHistory()
			history = func() { prev(); h() }
		}
	}
	return func() {
		if withWallet {
			u.mu.Lock()
			u.sumErr = serr
			u.mu.Unlock()
		}
		u.Apply(now, snap, sum, sl)
		history()
	}
}

// Apply shows snap (taken at now; a zero now skips the meter), and sum and
// slice when not nil. Run on the Fyne goroutine.
func (u *UI) Apply(now time.Time, snap status.Snapshot, sum *wallet.Summary, slice *status.SliceInfo) {
	if !now.IsZero() {
		u.meter.Add(now, snap)
	}
	u.mu.Lock()
	u.snap = snap
	if sum != nil {
		u.sum = *sum
	}
	s, sumErr, hook := u.sum, u.sumErr, u.onState
	u.mu.Unlock()

	u.showState(snap)
	rows, bytes := u.meter.Rate(10 * time.Second)
	if !snap.Earning() {
		// Paused, offline or finishing: no rate is shown as if still
		// working (the meter's window would report the last seconds).
		rows, bytes = 0, 0
	}
	u.rowsPS.Text = status.FormatRows(rows)
	u.mbPS.Text = status.FormatMBps(bytes)
	if t := status.ComputeLine(snap, rows); u.device.Text != t {
		u.device.SetText(t)
	}
	if u.Settings != nil {
		u.Settings.ShowComputing(snap.Device)
	}
	u.rowsPS.Refresh()
	u.mbPS.Refresh()
	since := ""
	if !snap.ConnectedSince.IsZero() {
		since = " · connected since " + snap.ConnectedSince.Local().Format("15:04:05")
	}
	counters := fmt.Sprintf("%d rows · %d requests · received %s · sent %s%s",
		snap.Rows, snap.Requests, status.FormatBytes(snap.BytesIn), status.FormatBytes(snap.BytesOut), since)
	if snap.Downloading() {
		counters += " · " + snap.DownloadLine()
	}
	u.counters.SetText(counters)
	u.chart.SetSeries(u.meter.Series())
	if snap.DownloadBytesTotal > 0 {
		u.downloadLine.SetText(snap.DownloadLine())
		u.download.SetValue(float64(snap.DownloadBytesDone) / float64(snap.DownloadBytesTotal))
		u.download.Show()
	}

	if sum != nil || sumErr != nil {
		u.showWallet(s, sumErr)
	}
	if slice != nil {
		u.slice.SetText(slice.Summary())
		d := "Folder: " + slice.Dir
		if slice.Dir == "" {
			d = "Folder: not set (Settings)"
		}
		u.sliceDetail.SetText(d)
	}
	if hook != nil {
		hook(snap, s)
	}
}

// notEarning explains a snapshot that is not earning, in sentences: the
// worker's raw error text stays out of the window (status.ExplainDial
// turns a dial error into what to check).
func notEarning(s status.Snapshot) string {
	if s.Reason != "" {
		return s.Reason
	}
	switch s.State {
	case status.Dialing:
		return "connecting to the gateway"
	case status.Offline:
		if _, text := status.ExplainDial(s.Gateway, s.LastError); text != "" {
			return text
		}
		return "the worker is not running"
	case status.Paused:
		return "paused"
	}
	return ""
}

func (u *UI) showState(s status.Snapshot) {
	u.stateIcon.Resource = stateIcons[s.State]
	u.stateIcon.Refresh()
	u.state.Text = stateTitle(s)
	u.state.Refresh()
	gw := s.Gateway
	if gw == "" {
		gw = "—"
	}
	line := "gateway " + gw + " · round trip " + status.FormatRTT(s.RTT)
	if l := s.CPULimitLine(); l != "" {
		line += " · " + l // before the session id, which a narrow window cuts first
	}
	if s.Session != "" {
		line += " · session " + s.Session
	}
	u.gateway.SetText(line)
	was := u.whyCard.Visible()
	if s.Earning() {
		u.whyCard.Hide()
	} else {
		u.why.SetText(notEarning(s))
		u.whyCard.Show()
	}
	if was != u.whyCard.Visible() {
		u.statusTab.Refresh()
	}
	paused := s.State == status.Paused || u.ctl.UserPaused()
	setEnabled(u.pause, !paused)
	setEnabled(u.fin, !paused)
	setEnabled(u.resume, u.ctl.UserPaused())
}

func setEnabled(b *widget.Button, on bool) {
	if on {
		b.Enable()
	} else {
		b.Disable()
	}
}

// stateTitle is the heading for a snapshot's state: connected and
// earning, or connected and not (no experts assigned yet, resting, ...:
// the card under it says why).
func stateTitle(snap status.Snapshot) string {
	switch s := snap.State; s {
	case status.Connected:
		if !snap.Earning() {
			return "Connected — not earning"
		}
		return "Connected — earning"
	case status.Dialing:
		return "Connecting…"
	case status.Paused:
		return "Paused"
	}
	return "Offline — not earning"
}

// payNote is the status tab's line under the money figures: how long
// credits follow the estimate, and that kvasir makes no payouts yet (the
// wallet tab says more).
func payNote(s wallet.Summary) string {
	lag := time.Duration(s.Reconcile.CreditLagSeconds) * time.Second
	if lag <= 0 {
		lag = wallet.DefaultCreditLag
	}
	n := "Credits follow the estimate within " + lag.String()
	if s.PaidNKVR == 0 {
		return n + " · no payouts yet in this version (see Wallet)"
	}
	return n + " · paid out: payouts recorded in this wallet"
}

func (u *UI) showWallet(s wallet.Summary, err error) {
	u.estT.Text = status.FormatKVR(s.MeteredNKVR)
	u.credT.Text = status.FormatKVR(s.PendingNKVR)
	u.paidT.Text = status.FormatKVR(s.PaidNKVR)
	u.estT.Refresh()
	u.credT.Refresh()
	u.paidT.Refresh()
	u.payNote.SetText(payNote(s))
	u.address.SetText(s.Address)
	plural := "s"
	if s.Statements == 1 {
		plural = ""
	}
	u.credited.SetText(fmt.Sprintf("%s for %s, in %d statement%s signed by the gateway; %s awaiting payout",
		status.FormatKVR(s.CreditedNKVR), status.FormatBytes(s.CreditedBytes), s.Statements, plural, status.FormatKVR(s.PendingNKVR)))
	u.metered.SetText(fmt.Sprintf("%s estimated from this computer's own count of %s, at %s per MB",
		status.FormatKVR(s.MeteredNKVR), status.FormatBytes(s.BytesServed), status.FormatKVR(s.RateNKVRPerByte*status.BytesPerMB)))
	if s.PaidNKVR > 0 {
		u.paid.SetText(status.FormatKVR(s.PaidNKVR))
	} else {
		u.paid.SetText(status.FormatKVR(0) + " — no payouts yet in this version (below)")
	}
	fetched := "statements not fetched yet"
	if !s.LastFetched.IsZero() {
		fetched = "statements fetched " + s.LastFetched.Local().Format("15:04:05")
	}
	u.served.SetText(fetched)
	switch {
	case err != nil:
		u.reconcile.SetText("Wallet unreadable: " + err.Error())
	case s.Reconcile.Mismatch:
		u.reconcile.SetText("Credits missing: " + s.Reconcile.Explanation)
	case s.Reconcile.AwaitingBytes > 0:
		u.reconcile.SetText("Awaiting credit: " + s.Reconcile.Explanation)
	default:
		u.reconcile.SetText("Credits up to date: " + s.Reconcile.Explanation)
	}
}

// SetNotice shows a warning card on the status tab ("" hides it), e.g.
// that the identity key is stored in a plain file. Run on the Fyne
// goroutine.
func (u *UI) SetNotice(title, text string) {
	if text == "" {
		u.noticeCard.Hide()
	} else {
		u.noticeTitle.SetText(title + ":")
		u.notice.SetText(text)
		u.noticeCard.Show()
	}
	u.statusTab.Refresh()
}

// refreshState re-applies the last snapshot through the Control (after a
// button press changed the owner's choice).
func (u *UI) refreshState() { u.Apply(time.Time{}, u.ctl.Stats(), nil, nil) }

// ExportCSV writes every history row of the wallet as CSV
// (status.WriteHistoryCSV): not only the newest or grouped ones.
func (u *UI) ExportCSV(w io.Writer) error {
	ev, err := u.be.Events(time.Time{}, time.Time{}, 0)
	if err != nil {
		return err
	}
	return status.WriteHistoryCSV(w, ev)
}

func (u *UI) showExport() {
	win := u.app.Driver().AllWindows()
	if len(win) == 0 {
		return
	}
	d := dialog.NewFileSave(func(wc fyne.URIWriteCloser, err error) {
		if err != nil || wc == nil {
			return
		}
		go func() { // the whole history comes from disk
			var n countWriter
			err := u.ExportCSV(io.MultiWriter(wc, &n))
			if cerr := wc.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				fyne.Do(func() { dialog.ShowError(err, win[0]) })
				return
			}
			fyne.Do(func() {
				dialog.ShowInformation("Wallet exported", fmt.Sprintf("%d history rows (%s) written to\n%s", n.lines-1,
					status.FormatBytes(n.bytes), wc.URI().Path()), win[0])
			})
		}()
	}, win[0])
	d.SetFileName(ExportFileName(time.Now()))
	d.Show()
}

// ExportFileName is the name Export CSV proposes: the wallet and the local
// date and time, e.g. "kvasir-wallet-2026-12-01-1430.csv".
func ExportFileName(now time.Time) string {
	return "kvasir-wallet-" + now.Format("2006-01-02-1504") + ".csv"
}

// countWriter counts the bytes and lines written through it.
type countWriter struct{ bytes, lines uint64 }

func (c *countWriter) Write(p []byte) (int, error) {
	c.bytes += uint64(len(p))
	c.lines += uint64(strings.Count(string(p), "\n"))
	return len(p), nil
}

// pollHistory reads the history groups of the chosen grouping and the
// rows of the expanded groups (off the Fyne goroutine) and returns the
// function that shows them (on it).
func (u *UI) pollHistory() func() {
	u.mu.Lock()
	by := u.by
	open := make([]int64, 0, len(u.open))
	for k := range u.open {
		open = append(open, k)
	}
	u.mu.Unlock()
	groups, err := u.be.Groups(by, HistoryGroups)
	if err != nil {
		return func() {}
	}
	detail := map[int64][]wallet.Event{}
	for _, g := range groups {
		k := g.From.UnixMilli()
		if slices.Contains(open, k) {
			if ev, err := u.be.Events(g.From, g.To, DetailRows); err == nil {
				detail[k] = ev
			}
		}
	}
	return func() {
		u.mu.Lock()
		same := u.by == by
		u.mu.Unlock()
		if !same { // the owner switched the grouping meanwhile
			return
		}
		u.groups = groups
		for k, ev := range detail {
			u.detail[k] = ev
		}
		u.history.Refresh()
	}
}

// History tree node ids: "g<ms>" for the group starting at unix ms,
// "g<ms>/<i>" for its i-th row, "g<ms>/more" for the rows not shown.

func groupKey(id widget.TreeNodeID) (int64, string, bool) {
	k, rest, _ := strings.Cut(strings.TrimPrefix(id, "g"), "/")
	ms, err := strconv.ParseInt(k, 10, 64)
	return ms, rest, err == nil && strings.HasPrefix(id, "g")
}

func (u *UI) group(ms int64) (wallet.Group, bool) {
	for _, g := range u.groups {
		if g.From.UnixMilli() == ms {
			return g, true
		}
	}
	return wallet.Group{}, false
}

func (u *UI) historyChildren(id widget.TreeNodeID) []widget.TreeNodeID {
	if id == "" {
		ids := make([]widget.TreeNodeID, len(u.groups))
		for i, g := range u.groups {
			ids[i] = fmt.Sprintf("g%d", g.From.UnixMilli())
		}
		return ids
	}
	ms, _, _ := groupKey(id)
	ev, loaded := u.detail[ms]
	if !loaded {
		return []widget.TreeNodeID{id + "/loading"}
	}
	ids := make([]widget.TreeNodeID, 0, len(ev)+1)
	for i := range ev {
		ids = append(ids, fmt.Sprintf("%s/%d", id, i))
	}
	if g, ok := u.group(ms); ok && groupRows(g) > len(ev) {
		ids = append(ids, id+"/more")
	}
	return ids
}

func (u *UI) historyIsBranch(id widget.TreeNodeID) bool {
	return id == "" || !strings.Contains(id, "/")
}

// groupRows is the number of history rows in g.
func groupRows(g wallet.Group) int { return g.Sessions + g.Statements + g.Payouts }

func (u *UI) historyText(id widget.TreeNodeID) string {
	ms, rest, ok := groupKey(id)
	g, found := u.group(ms)
	if !ok || !found {
		return ""
	}
	switch {
	case !strings.Contains(id, "/"):
		return groupLine(g)
	case rest == "loading":
		return "loading…"
	case rest == "more":
		return fmt.Sprintf("… %d more rows (Export CSV writes every row)", groupRows(g)-len(u.detail[ms]))
	}
	i, err := strconv.Atoi(rest)
	if ev := u.detail[ms]; err == nil && i < len(ev) {
		return historyLine(ev[i])
	}
	return ""
}

// groupLine renders a history group: its period or session, what the
// gateway credited, the estimate from the own count, and payouts.
func groupLine(g wallet.Group) string {
	plural := func(n int, one string) string {
		if n == 1 {
			return "1 " + one
		}
		return fmt.Sprintf("%d %ss", n, one)
	}
	l := fmt.Sprintf("%s · credited %s (%s) · estimate %s (%s)", wallet.GroupLabel(g), status.FormatKVR(g.CreditedNKVR),
		plural(g.Statements, "statement"), status.FormatKVR(g.MeteredNKVR), plural(g.Sessions, "session"))
	if g.Payouts > 0 {
		l += " · paid " + status.FormatKVR(g.PaidNKVR)
	}
	return l
}

// setOpen records an expanded or collapsed group and loads its rows.
func (u *UI) setOpen(id widget.TreeNodeID, open bool) {
	ms, _, ok := groupKey(id)
	if !ok {
		return
	}
	u.mu.Lock()
	if open {
		u.open[ms] = true
	} else {
		delete(u.open, ms)
	}
	u.mu.Unlock()
	if g, found := u.group(ms); open && found {
		u.background(func() {
			ev, err := u.be.Events(g.From, g.To, DetailRows)
			if err != nil {
				return
			}
			fyne.Do(func() { u.detail[ms] = ev; u.history.Refresh() })
		})
	}
}
