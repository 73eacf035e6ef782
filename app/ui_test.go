package app

import (
	"bytes"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"fyne.io/fyne/v2"
	"fyne.io/fyne/v2/test"

	"github.com/kvasir-ai/kvasir/app/limits"
	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/engine/vulkan"
	"github.com/kvasir-ai/kvasir/wallet"
)

// fakeBackend is a Backend whose readings the test sets.
type fakeBackend struct {
	mu    sync.Mutex
	snap  status.Snapshot
	sum   wallet.Summary
	err   error
	slice status.SliceInfo
	older []wallet.Event // history rows older than the summary's
	calls []string
}

func (f *fakeBackend) Stats() status.Snapshot { f.mu.Lock(); defer f.mu.Unlock(); return f.snap }
func (f *fakeBackend) Pause()                 { f.mu.Lock(); f.calls = append(f.calls, "pause"); f.mu.Unlock() }
func (f *fakeBackend) Resume()                { f.mu.Lock(); f.calls = append(f.calls, "resume"); f.mu.Unlock() }
func (f *fakeBackend) FinishThenPause() {
	f.mu.Lock()
	f.calls = append(f.calls, "finish")
	f.mu.Unlock()
}
func (f *fakeBackend) Summary() (wallet.Summary, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.sum, f.err
}
func (f *fakeBackend) Slice() status.SliceInfo { return f.slice }

// Groups groups the summary's history by UTC hour (whatever by asks).
func (f *fakeBackend) Groups(by wallet.GroupBy, limit int) ([]wallet.Group, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []wallet.Group
	for _, e := range f.sum.History {
		from := e.Time.Truncate(time.Hour)
		if len(out) == 0 || !out[len(out)-1].From.Equal(from) {
			out = append(out, wallet.Group{By: wallet.ByHour, From: from, To: from.Add(time.Hour)})
		}
		g := &out[len(out)-1]
		switch e.State {
		case wallet.StateMetered:
			g.Sessions++
			g.MeteredBytes += e.Bytes
			g.MeteredNKVR += e.NKVR
		case wallet.StateCredited:
			g.Statements++
			g.CreditedBytes += e.Bytes
			g.CreditedNKVR += e.NKVR
		case wallet.StatePaid:
			g.Payouts++
			g.PaidNKVR += e.NKVR
		}
	}
	return out, f.err
}

// Events returns the summary's history in [from, to); the whole history
// when both are zero, plus f.older (rows past the summary's 100).
func (f *fakeBackend) Events(from, to time.Time, limit int) ([]wallet.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []wallet.Event
	for _, e := range append(append([]wallet.Event{}, f.sum.History...), f.older...) {
		if (from.IsZero() || !e.Time.Before(from)) && (to.IsZero() || e.Time.Before(to)) {
			out = append(out, e)
		}
	}
	if limit > 0 && len(out) > limit {
		out = out[:limit]
	}
	return out, f.err
}

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// sampleSummary is a wallet after one credited statement of the reference
// vector: 1,277,952 bytes at 7 nKVR/byte = 8,945,664 nKVR (DESIGN.md).
func sampleSummary() wallet.Summary {
	return wallet.Summary{
		Address: "kvr1qqqsyqcyq5rqwzqfpg9scrgwpugpzysnzs23v7", MeteredNKVR: 9_100_000, CreditedNKVR: 8_945_664,
		PendingNKVR: 8_945_664, BytesServed: 1_300_000, CreditedBytes: 1_277_952, RateNKVRPerByte: 7, Statements: 1,
		Reconcile: wallet.Reconcile{Explanation: "own count and credited bytes agree within 78536 bytes", CreditLagSeconds: 90},
		History: []wallet.Event{
			{Time: t0.Add(4 * time.Second), State: wallet.StateCredited, Statement: 1, Ledger: "(0, 5]", Bytes: 1_277_952, NKVR: 8_945_664},
			{Time: t0.Add(3 * time.Second), State: wallet.StateMetered, Session: "s1", Bytes: 1_300_000, NKVR: 9_100_000},
		},
	}
}

// testDevices is a machine with a discrete GPU and Mesa's software
// renderer, for the "Compute on" picker.
var testDevices = []vulkan.Device{
	{Index: 0, Name: "llvmpipe (LLVM 15.0.6, 256 bits)", Type: vulkan.TypeCPU, MemoryBytes: 2 << 30, APIVersion: "1.3.230"},
	{Index: 1, Name: "NVIDIA GeForce RTX 4090", Type: vulkan.TypeDiscrete, MemoryBytes: 24 << 30, APIVersion: "1.3.277"},
}

func newTestUI(t *testing.T) (*UI, *fakeBackend, fyne.Window) {
	t.Helper()
	a := test.NewTempApp(t)
	be := &fakeBackend{}
	ctl := status.NewControl(be)
	form := NewSettingsForm(a.Preferences(), nil)
	form.SetDevices(testDevices, nil) // the same picker on every machine
	u := NewUI(a, be, ctl, form)
	u.background = func(f func()) { f() }
	w := a.NewWindow("kvasir")
	w.SetContent(u.Tabs)
	w.Resize(fyne.NewSize(900, 640))
	t.Cleanup(w.Close)
	return u, be, w
}

func TestStatusShowsStatsAndWallet(t *testing.T) {
	u, be, w := newTestUI(t)
	since := time.Date(2026, 11, 29, 11, 59, 0, 0, time.Local)
	be.snap = status.Snapshot{State: status.Connected, Gateway: "127.0.0.1:8443", RTT: 1500 * time.Microsecond,
		Session: "s1", ConnectedSince: since, Device: "NVIDIA GeForce RTX 4090 (Vulkan)"}
	u.Poll(t0, false)()
	// Five one-second steps: 12,345 rows and 1,277,952 bytes in all.
	rowSteps := []uint64{2000, 3000, 2500, 2345, 2500}
	byteSteps := []uint64{200_000, 300_000, 277_952, 250_000, 250_000}
	for i := range rowSteps {
		be.snap.Rows += rowSteps[i]
		be.snap.Requests += 20
		be.snap.BytesIn += byteSteps[i] * 4 / 5
		be.snap.BytesOut += byteSteps[i] - byteSteps[i]*4/5
		if i < len(rowSteps)-1 {
			u.Poll(t0.Add(time.Duration(i+1)*time.Second), false)()
		}
	}
	be.sum = sampleSummary()
	be.slice = status.SliceInfo{Dir: "/srv/slice", Layers: 2, Experts: 96, Bytes: 12 << 20, QuotaBytes: 64 << 20}
	u.Poll(t0.Add(5*time.Second), true)()

	// 12345 rows / 5 s and 1,277,952 bytes / 5 s.
	checks := []struct{ got, want string }{
		{u.rowsPS.Text, "2469.0 rows/s"},
		{u.mbPS.Text, "0.26 MB/s"},
		{u.estT.Text, "0.00910 KVR"},
		{u.credT.Text, "0.00895 KVR"}, // credited, awaiting payout
		{u.paidT.Text, "0.00000 KVR"},
		{u.state.Text, "Connected — earning"},
		{u.gateway.Text, "gateway 127.0.0.1:8443 · round trip 1.5 ms · session s1"},
		{u.device.Text, "Computing on: NVIDIA GeForce RTX 4090 (Vulkan) · 2469.0 rows/s"},
		{u.Settings.computeNow.Text, "Now computing on: NVIDIA GeForce RTX 4090 (Vulkan)"},
		// In: 160,000 + 240,000 + 222,361 + 200,000 + 200,000 bytes; out: the rest of 1,277,952.
		{u.counters.Text, "12345 rows · 100 requests · received 1.02 MB · sent 256 kB · connected since 11:59:00"},
		{u.metered.Text, "0.00910 KVR estimated from this computer's own count of 1.30 MB, at 0.00700 KVR per MB"},
		{u.credited.Text, "0.00895 KVR for 1.28 MB, in 1 statement signed by the gateway; 0.00895 KVR awaiting payout"},
		{u.served.Text, "statements not fetched yet"},
		{u.slice.Text, "96 experts in 2 layers, 12.6 MB of 67.1 MB quota, integrity not verified"},
		{u.sliceDetail.Text, "Folder: /srv/slice"},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
	if u.whyCard.Visible() {
		t.Error("'why am I not earning' shown while earning")
	}
	if got := historyLine(be.sum.History[0]); got != "2026-11-29 12:00:04Z  credited  0.00895 KVR  1.28 MB  statement #1" {
		t.Errorf("history line %q", got)
	}
	test.AssertRendersToMarkup(t, "status_connected.xml", w.Canvas())
	test.AssertImageMatches(t, "status_connected.png", w.Canvas().Capture())

	// Under a CPU limit the worker rests between requests yet earns: the
	// status says so beside the gateway, not as "not earning".
	be.snap.CPULimit = 50
	u.Poll(t0.Add(6*time.Second), false)()
	if want := "gateway 127.0.0.1:8443 · round trip 1.5 ms · limited to 50% CPU · session s1"; u.gateway.Text != want || u.whyCard.Visible() {
		t.Errorf("CPU limit: %q (why card shown: %v), want %q", u.gateway.Text, u.whyCard.Visible(), want)
	}
}

func TestWhyNotEarning(t *testing.T) {
	u, be, _ := newTestUI(t)
	cases := []struct {
		snap  status.Snapshot
		title string
		why   string
	}{
		// The raw error is explained, not shown.
		{status.Snapshot{State: status.Offline, LastError: "dial tcp 127.0.0.1:8443: connection refused"},
			"Offline — not earning", "the gateway refused the connection: the gateway is down or the address is wrong"},
		{status.Snapshot{State: status.Dialing}, "Connecting…", "connecting to the gateway"},
		{status.Snapshot{State: status.Connected, Reason: "no work assigned"}, "Connected — not earning", "no work assigned"},
		{status.Snapshot{State: status.Offline, Reason: "no slice: folder not set", LastError: "x"}, "Offline — not earning", "no slice: folder not set"},
	}
	for _, c := range cases {
		be.snap = c.snap
		u.Poll(time.Time{}, false)()
		if !u.whyCard.Visible() || u.why.Text != c.why || u.state.Text != c.title {
			t.Errorf("%+v: visible=%v why=%q title=%q", c.snap, u.whyCard.Visible(), u.why.Text, u.state.Text)
		}
	}
	// A limit pauses through the Control and explains itself.
	be.snap = status.Snapshot{State: status.Connected}
	u.ctl.SetLimit("paused by a limit: running on battery")
	u.Poll(time.Time{}, false)()
	if u.state.Text != "Paused" || u.why.Text != "paused by a limit: running on battery" {
		t.Errorf("limit: %q %q", u.state.Text, u.why.Text)
	}
}

func TestButtons(t *testing.T) {
	u, be, _ := newTestUI(t)
	be.snap = status.Snapshot{State: status.Connected}
	u.Poll(time.Time{}, false)()
	if u.pause.Disabled() || u.fin.Disabled() || !u.resume.Disabled() {
		t.Fatal("running: want Pause and Finish enabled, Resume disabled")
	}
	test.Tap(u.pause)
	if u.state.Text != "Paused" || u.why.Text != status.ReasonUserPaused || !u.pause.Disabled() || u.resume.Disabled() {
		t.Errorf("after Pause: %q %q", u.state.Text, u.why.Text)
	}
	test.Tap(u.resume)
	test.Tap(u.fin)
	if u.why.Text != status.ReasonFinishing {
		t.Errorf("after Finish: %q", u.why.Text)
	}
	test.Tap(u.resume)
	if got := strings.Join(be.calls, " "); got != "pause resume finish resume" {
		t.Errorf("backend calls %q", got)
	}
}

// TestExportCSV: the export writes every history row the wallet holds,
// also those older than the summary's newest 100.
func TestExportCSV(t *testing.T) {
	u, be, _ := newTestUI(t)
	be.sum = sampleSummary()
	be.older = []wallet.Event{{Time: t0.Add(-time.Hour), State: wallet.StatePaid, NKVR: 5, Ref: "old"}}
	u.Poll(time.Time{}, true)()
	var buf bytes.Buffer
	if err := u.ExportCSV(&buf); err != nil {
		t.Fatal(err)
	}
	want := "time,state,session,statement,ledger,bytes,rejected_bytes,nkvr,kvr,ref\n" +
		"2026-11-29T12:00:04.000Z,credited,,1,\"(0, 5]\",1277952,0,8945664,0.008945664,\n" +
		"2026-11-29T12:00:03.000Z,metered,s1,,,1300000,0,9100000,0.009100000,\n" +
		"2026-11-29T11:00:00.000Z,paid,,,,0,0,5,0.000000005,old\n"
	if buf.String() != want {
		t.Errorf("CSV:\n%s\nwant:\n%s", buf.String(), want)
	}
}

func TestWalletError(t *testing.T) {
	u, be, _ := newTestUI(t)
	be.err = errors.New("wallet: file is corrupt or not a wallet")
	u.Poll(time.Time{}, true)()
	if u.reconcile.Text != "Wallet unreadable: wallet: file is corrupt or not a wallet" {
		t.Errorf("reconcile %q", u.reconcile.Text)
	}
}

func TestSettingsPersist(t *testing.T) {
	a := test.NewTempApp(t)
	var saved []Settings
	f := NewSettingsForm(a.Preferences(), func(s Settings) { saved = append(saved, s) })
	if got := LoadSettings(a.Preferences()); got != DefaultSettings {
		t.Fatalf("defaults %+v", got)
	}
	want := Settings{GatewayURL: "wss://127.0.0.1:8443", CAFile: "/tmp/ca.pem", SliceDir: "/srv/slice", QuotaGB: 0.5,
		Threads: 3, CPULimit: 60, Backend: "auto", OnlyWhenIdle: true, MaxTempC: 85, ResumeTempC: 70, WorkHours: "22:00-07:00"}
	test.Type(f.gateway, want.GatewayURL)
	f.ca.SetText(want.CAFile)
	f.slice.SetText(want.SliceDir)
	f.quota.SetText("0.5")
	f.threads.SetText("3")
	f.cpu.SetText("60")
	f.maxT.SetText("85")
	f.resT.SetText("70")
	f.hours.SetText("22:00-07:00")
	test.Tap(f.battery) // was on by default
	test.Tap(f.idle)
	test.Tap(f.save)
	if f.message.Text != "Saved. The worker restarts to apply the new gateway, slice, quota, threads or compute device." || len(saved) != 1 || saved[0] != want {
		t.Fatalf("message %q saved %+v", f.message.Text, saved)
	}
	// A limit alone applies to the running worker.
	f.maxT.SetText("80")
	test.Tap(f.save)
	if f.message.Text != "Saved and applied; the worker keeps running." || len(saved) != 2 || NeedsRestart(saved[0], saved[1]) {
		t.Fatalf("limit change: message %q", f.message.Text)
	}
	// So does the CPU limit (the app hands it to the running worker).
	f.cpu.SetText("25")
	test.Tap(f.save)
	if f.message.Text != "Saved and applied; the worker keeps running." || len(saved) != 3 || NeedsRestart(saved[1], saved[2]) ||
		saved[2].CPULimit != 25 {
		t.Fatalf("CPU limit change: message %q, saved %+v", f.message.Text, saved[len(saved)-1])
	}
	// An empty field is no limit.
	f.cpu.SetText("")
	if s, err := f.Read(); err != nil || s.CPULimit != 100 {
		t.Fatalf("empty CPU limit: %+v %v", s, err)
	}
	f.cpu.SetText("25")
	test.Tap(f.save)
	if f.message.Text != "Saved (nothing changed)." {
		t.Fatalf("no change: message %q", f.message.Text)
	}
	saved = saved[:1]
	f.Show(want)
	want.Save(a.Preferences())
	if got := LoadSettings(a.Preferences()); got != want {
		t.Errorf("reloaded %+v, want %+v", got, want)
	}
	if l := want.Limits(); l.MaxTempC != 85 || l.ResumeTempC != 70 || !l.OnlyWhenIdle || l.PauseOnBattery || l.Hours != (limits.Hours{From: 22 * 60, To: 7 * 60}) {
		t.Errorf("limits %+v", l)
	}
	if want.QuotaBytes() != 500_000_000 {
		t.Errorf("quota bytes %d", want.QuotaBytes())
	}

	bad := []struct{ field, text, msg string }{
		{"gateway", "https://x", "gateway URL \"https://x\" must look like wss://host:443"},
		{"threads", "2.5", "CPU threads must be a whole number"},
		{"resT", "90", "resume temperature 90 °C must be below the limit 85 °C"},
		{"quota", "lots", "disk quota \"lots\" is not a number"},
		{"hours", "9-5", "working hours \"9-5\": want HH:MM-HH:MM, e.g. 22:00-07:00"},
		{"cpu", "0", "CPU limit 0%: want 1-100 (100 = no limit)"},
		{"cpu", "150", "CPU limit 150%: want 1-100 (100 = no limit)"},
		{"cpu", "12.5", "CPU limit must be a whole percent, 1-100"},
		{"cpu", "half", "CPU limit \"half\" is not a number"},
	}
	for _, b := range bad {
		f.Show(want)
		map[string]func(string){"gateway": f.gateway.SetText, "threads": f.threads.SetText, "resT": f.resT.SetText, "quota": f.quota.SetText, "hours": f.hours.SetText, "cpu": f.cpu.SetText}[b.field](b.text)
		err := f.Submit()
		if !errors.Is(err, ErrSettings) || f.message.Text != "Not saved: settings: "+b.msg {
			t.Errorf("%s=%q: err %v, message %q", b.field, b.text, err, f.message.Text)
		}
	}
	if len(saved) != 1 {
		t.Errorf("invalid settings were saved: %d", len(saved))
	}
}

func TestWalletAndSliceTabs(t *testing.T) {
	t.Setenv(node.EnvDefaultGateway, "") // the settings placeholder shows the public gateway
	u, be, w := newTestUI(t)
	be.sum = sampleSummary()
	be.slice = status.SliceInfo{Dir: "/srv/slice", Layers: 2, Experts: 96, Bytes: 12 << 20, QuotaBytes: 64 << 20}
	u.Poll(time.Time{}, true)()
	u.Tabs.SelectIndex(1)
	if u.paid.Text != "0.00000 KVR — no payouts yet in this version (below)" ||
		u.credited.Text != "0.00895 KVR for 1.28 MB, in 1 statement signed by the gateway; 0.00895 KVR awaiting payout" || u.address.Text != be.sum.Address {
		t.Errorf("wallet labels %q %q %q", u.paid.Text, u.credited.Text, u.address.Text)
	}
	u.history.OpenBranch(u.historyChildren("")[0]) // the group's rows, one level down
	test.AssertRendersToMarkup(t, "wallet.xml", w.Canvas())
	test.AssertImageMatches(t, "wallet.png", w.Canvas().Capture())
	be.snap = status.Snapshot{State: status.Connected, DownloadBytesDone: 3 << 20, DownloadBytesTotal: 4 << 20,
		DownloadExpertsDone: 6, DownloadExpertsTotal: 8}
	u.Poll(time.Time{}, false)()
	if u.download.Value != 0.75 || !u.download.Visible() || u.downloadLine.Text != "downloading experts: 6 of 8, 3.15 MB of 4.19 MB (75%)" ||
		!strings.HasSuffix(u.counters.Text, " · downloading experts: 6 of 8, 3.15 MB of 4.19 MB (75%)") {
		t.Errorf("download %v %q %q", u.download.Value, u.downloadLine.Text, u.counters.Text)
	}
	u.Tabs.SelectIndex(2)
	test.AssertImageMatches(t, "slice.png", w.Canvas().Capture())
	u.Tabs.SelectIndex(3)
	test.AssertImageMatches(t, "settings.png", w.Canvas().Capture())
}

// TestPausedShowsNoThroughput: paused, the figures read 0 at once, not
// the last seconds' rate.
func TestPausedShowsNoThroughput(t *testing.T) {
	u, be, _ := newTestUI(t)
	be.snap = status.Snapshot{State: status.Connected}
	for i := 0; i < 4; i++ {
		be.snap.Rows += 300
		be.snap.BytesIn += 1_000_000
		u.Poll(t0.Add(time.Duration(i)*time.Second), false)()
	}
	if u.rowsPS.Text != "300.0 rows/s" || u.mbPS.Text != "1.00 MB/s" {
		t.Fatalf("working: %q %q", u.rowsPS.Text, u.mbPS.Text)
	}
	test.Tap(u.pause)
	u.Poll(t0.Add(4*time.Second), false)()
	if u.state.Text != "Paused" || u.rowsPS.Text != "0.0 rows/s" || u.mbPS.Text != "0.00 MB/s" {
		t.Errorf("paused: %q %q %q", u.state.Text, u.rowsPS.Text, u.mbPS.Text)
	}
}

// TestExportFileName: a dated name, not a Unix time.
func TestExportFileName(t *testing.T) {
	if got := ExportFileName(time.Date(2026, 12, 1, 14, 30, 59, 0, time.Local)); got != "kvasir-wallet-2026-12-01-1430.csv" {
		t.Errorf("ExportFileName %q", got)
	}
}

// TestNotices: the key-file warning shows on the status tab.
func TestNotices(t *testing.T) {
	u, _, _ := newTestUI(t)
	if u.noticeCard.Visible() {
		t.Fatal("notice shown with nothing to say")
	}
	var win atomic.Pointer[Window]
	win.Store(&Window{UI: u})
	msg := "kvasir: WARNING: OS keyring unavailable (no D-Bus session); storing the identity key in /k/worker-identity.key (mode 0600)."
	if _, err := (noticeWriter{&win}).Write([]byte(msg + "\n")); err != nil {
		t.Fatal(err)
	}
	if !u.noticeCard.Visible() || u.notice.Text != strings.TrimPrefix(msg, "kvasir: WARNING: ") || u.noticeTitle.Text != "Identity key not in a keyring:" {
		t.Errorf("notice %v %q %q", u.noticeCard.Visible(), u.noticeTitle.Text, u.notice.Text)
	}
}

// TestWatchNotifies: a ban is notified once per reason; a new credit
// statement only when asked for.
func TestWatchNotifies(t *testing.T) {
	var got []string
	w := &Window{Notify: func(title, body string) { got = append(got, title+": "+body) }}
	sum := wallet.Summary{Address: "kvr1x", Statements: 1, CreditedNKVR: 7_000_000}
	w.watch(status.Snapshot{State: status.Connected}, sum)
	ban := status.Snapshot{State: status.Offline, LastError: "worker key banned until 2026-12-02 (verification failed)"}
	w.watch(ban, sum)
	w.watch(ban, sum)
	sum.Statements = 2
	w.watch(status.Snapshot{}, sum) // not asked for
	w.NotifyCredits.Store(true)
	sum.Statements, sum.CreditedNKVR = 3, 14_000_000
	w.watch(status.Snapshot{}, sum)
	want := []string{"kvasir: this worker was banned: worker key banned until 2026-12-02 (verification failed)",
		"kvasir: new credit: The gateway credited this worker; 0.01400 KVR credited in all."}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("notifications %q\nwant %q", got, want)
	}
}
