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
	"strconv"
	"sync"
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
// (status.Source), the local wallet and the slice on disk. Summary may
// touch the disk (SQLite): the UI calls it off the Fyne goroutine.
type Backend interface {
	status.Source
	Summary() (wallet.Summary, error)
	Slice() status.SliceInfo
}

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
	stateIcon          *canvas.Image
	state              *canvas.Text
	gateway            *widget.Label
	statusTab          *fyne.Container // relaid out when the why card shows or hides
	whyCard            *widget.Card
	why                *widget.Label
	rowsPS, mbPS       *canvas.Text
	pendingT, credT    *canvas.Text
	counters           *widget.Label
	chart              *Chart
	pause, resume, fin *widget.Button
	// wallet tab
	address, pending, credited, metered, paid, served, reconcile *widget.Label
	history                                                      *widget.List
	events                                                       []wallet.Event
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
	t.TextSize = 2 * theme.TextSize()
	t.TextStyle.Bold = true
	return t
}

func tile(caption string, value *canvas.Text) fyne.CanvasObject {
	cap := widget.NewLabel(caption)
	cap.Importance = widget.LowImportance
	return container.NewVBox(cap, value)
}

// NewUI builds the window content for be, controlled through ctl (which
// must wrap be). settings is the settings tab (see NewSettingsForm).
func NewUI(a fyne.App, be Backend, ctl *status.Control, settings *SettingsForm) *UI {
	u := &UI{app: a, be: be, ctl: ctl, meter: status.NewMeter(int(ChartSpan/time.Second) + 1), Settings: settings}

	u.stateIcon = canvas.NewImageFromResource(stateIcons[status.Offline])
	u.stateIcon.FillMode = canvas.ImageFillContain
	u.stateIcon.SetMinSize(fyne.NewSize(48, 48))
	u.state = bigText("offline", theme.ColorNameForeground)
	u.gateway = widget.NewLabel("gateway —")
	u.why = widget.NewLabel("")
	u.why.Wrapping = fyne.TextWrapWord
	u.whyCard = widget.NewCard("Why am I not earning?", "", u.why)
	u.rowsPS = bigText(status.FormatRows(0), theme.ColorNamePrimary)
	u.rowsPS.Color = rowsColor
	u.mbPS = bigText(status.FormatMBps(0), theme.ColorNameSuccess)
	u.mbPS.Color = mbColor
	u.pendingT = bigText(status.FormatKVR(0), theme.ColorNameForeground)
	u.credT = bigText(status.FormatKVR(0), theme.ColorNameForeground)
	u.counters = widget.NewLabel("")
	u.counters.Wrapping = fyne.TextWrapWord
	u.chart = NewChart(ChartSpan)

	u.pause = widget.NewButtonWithIcon("Pause", theme.MediaPauseIcon(), func() { u.ctl.Pause(); u.refreshState() })
	u.resume = widget.NewButtonWithIcon("Resume", theme.MediaPlayIcon(), func() { u.ctl.Resume(); u.refreshState() })
	u.fin = widget.NewButtonWithIcon("Finish current work then pause", theme.MediaStopIcon(), func() { u.ctl.FinishThenPause(); u.refreshState() })

	header := container.NewBorder(nil, nil, u.stateIcon, nil,
		container.NewVBox(u.state, u.gateway))
	tiles := container.NewGridWithColumns(4,
		tile("Throughput", u.rowsPS), tile("Traffic", u.mbPS),
		tile("Pending (credited, not paid)", u.pendingT), tile("Credited in total", u.credT))
	buttons := container.NewHBox(u.pause, u.resume, u.fin)
	u.statusTab = container.NewBorder(container.NewVBox(header, u.whyCard, tiles),
		container.NewVBox(u.counters, buttons), nil, nil,
		u.chart)

	u.address = widget.NewLabel("")
	u.address.TextStyle.Monospace = true
	u.pending, u.credited, u.metered, u.paid, u.served = widget.NewLabel(""), widget.NewLabel(""), widget.NewLabel(""), widget.NewLabel(""), widget.NewLabel("")
	u.reconcile = widget.NewLabel("")
	u.reconcile.Wrapping = fyne.TextWrapWord
	u.history = widget.NewList(
		func() int { return len(u.events) },
		func() fyne.CanvasObject {
			return widget.NewLabel("2026-01-01 00:00:00Z  credited  0.00000 KVR  0.000000 units")
		},
		func(i widget.ListItemID, o fyne.CanvasObject) {
			if i < len(u.events) {
				o.(*widget.Label).SetText(historyLine(u.events[i]))
			}
		})
	export := widget.NewButtonWithIcon("Export CSV", theme.DocumentSaveIcon(), u.showExport)
	walletTab := container.NewBorder(
		container.NewVBox(
			widget.NewForm(
				widget.NewFormItem("Address", u.address),
				widget.NewFormItem("Pending", u.pending),
				widget.NewFormItem("Credited", u.credited),
				widget.NewFormItem("Metered", u.metered),
				widget.NewFormItem("Paid", u.paid),
				widget.NewFormItem("Served", u.served)),
			u.reconcile,
			widget.NewLabelWithStyle("History", fyne.TextAlignLeading, fyne.TextStyle{Bold: true})),
		container.NewHBox(layout.NewSpacer(), export), nil, nil, u.history)

	u.slice = widget.NewLabel("")
	u.slice.Wrapping = fyne.TextWrapWord
	u.sliceDetail = widget.NewLabel("")
	u.download = widget.NewProgressBar()
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
	if withWallet {
		s, err := u.be.Summary()
		if err == nil {
			sum = &s
		}
		serr = err
		si := u.be.Slice()
		sl = &si
	}
	return func() {
		if withWallet {
			u.mu.Lock()
			u.sumErr = serr
			u.mu.Unlock()
		}
		u.Apply(now, snap, sum, sl)
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
	u.rowsPS.Text = status.FormatRows(rows)
	u.mbPS.Text = status.FormatMBps(bytes)
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

// notEarning explains a snapshot that is not earning.
func notEarning(s status.Snapshot) string {
	if s.Reason != "" {
		if s.LastError != "" && s.State != status.Paused {
			return s.Reason + " (last error: " + s.LastError + ")"
		}
		return s.Reason
	}
	switch s.State {
	case status.Dialing:
		return "connecting to the gateway"
	case status.Offline:
		if s.LastError != "" {
			return "gateway unreachable: " + s.LastError
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
	u.state.Text = stateTitle(s.State)
	u.state.Refresh()
	gw := s.Gateway
	if gw == "" {
		gw = "—"
	}
	line := "gateway " + gw + " · round trip " + status.FormatRTT(s.RTT)
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

// stateTitle is the heading for a state.
func stateTitle(s status.State) string {
	switch s {
	case status.Connected:
		return "Connected — earning"
	case status.Dialing:
		return "Connecting…"
	case status.Paused:
		return "Paused"
	}
	return "Offline"
}

func (u *UI) showWallet(s wallet.Summary, err error) {
	u.pendingT.Text = status.FormatKVR(s.PendingNKVR)
	u.credT.Text = status.FormatKVR(s.CreditedNKVR)
	u.pendingT.Refresh()
	u.credT.Refresh()
	u.address.SetText(s.Address)
	u.pending.SetText(status.FormatKVR(s.PendingNKVR) + " — credited by the gateway, not yet paid out")
	u.credited.SetText(fmt.Sprintf("%s — %d signed statements, %s", status.FormatKVR(s.CreditedNKVR), s.Statements, status.FormatBytes(s.CreditedBytes)))
	u.metered.SetText(status.FormatKVR(s.MeteredNKVR) + " — this worker's own count (estimate)")
	u.paid.SetText(status.FormatKVR(s.PaidNKVR))
	u.served.SetText(fmt.Sprintf("%s (%d bytes)", status.FormatBytes(s.BytesServed), s.BytesServed))
	switch {
	case err != nil:
		u.reconcile.SetText("Wallet unreadable: " + err.Error())
	case s.Reconcile.Mismatch:
		u.reconcile.SetText("Mismatch: " + s.Reconcile.Explanation)
	default:
		u.reconcile.SetText(s.Reconcile.Explanation)
	}
	u.events = s.History
	u.history.Refresh()
}

// refreshState re-applies the last snapshot through the Control (after a
// button press changed the owner's choice).
func (u *UI) refreshState() { u.Apply(time.Time{}, u.ctl.Stats(), nil, nil) }

// ExportCSV writes the last wallet summary's history as CSV
// (status.WriteHistoryCSV).
func (u *UI) ExportCSV(w io.Writer) error {
	u.mu.Lock()
	ev := u.sum.History
	u.mu.Unlock()
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
		err = u.ExportCSV(wc)
		if cerr := wc.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			dialog.ShowError(err, win[0])
		}
	}, win[0])
	d.SetFileName("kvasir-wallet-" + strconv.FormatInt(time.Now().Unix(), 10) + ".csv")
	d.Show()
}
