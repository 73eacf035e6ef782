package status

import (
	"bytes"
	"encoding/csv"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/wallet"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestMeterRate(t *testing.T) {
	m := NewMeter(10)
	if r, b := m.Rate(0); r != 0 || b != 0 {
		t.Fatalf("empty meter: %v %v", r, b)
	}
	m.Add(t0, Snapshot{})
	m.Add(t0.Add(5*time.Second), Snapshot{Rows: 12345, BytesIn: 1_000_000, BytesOut: 277_952})
	r, b := m.Rate(0)
	// 12345 rows / 5 s = 2469 rows/s; 1,277,952 bytes / 5 s = 255,590.4 B/s.
	if got := FormatRows(r); got != "2469.0 rows/s" {
		t.Errorf("rows: %s", got)
	}
	if b != 255590.4 {
		t.Errorf("bytes/s %v", b)
	}
	if got := FormatMBps(b); got != "0.26 MB/s" {
		t.Errorf("MB/s: %s", got)
	}
}

func TestMeterWindowRingAndRestart(t *testing.T) {
	m := NewMeter(4)
	// rows grow by i*10 each second: 0, 10, 30, 60, 100, 150
	var rows uint64
	for i := 0; i < 6; i++ {
		rows += uint64(i * 10)
		m.Add(t0.Add(time.Duration(i)*time.Second), Snapshot{Rows: rows})
	}
	// Held: t=2..5 (rows 30, 60, 100, 150). Whole ring: (150-30)/3 s = 40.
	if r, _ := m.Rate(0); r != 40 {
		t.Errorf("ring rate %v, want 40", r)
	}
	// Last 1 s: (150-100)/1 = 50.
	if r, _ := m.Rate(time.Second); r != 50 {
		t.Errorf("1s rate %v, want 50", r)
	}
	s := m.Series()
	want := []float64{30, 40, 50}
	if len(s) != len(want) {
		t.Fatalf("series len %d", len(s))
	}
	for i, w := range want {
		if s[i].RowsPS != w || !s[i].T.Equal(t0.Add(time.Duration(i+3)*time.Second)) {
			t.Errorf("series[%d] = %+v, want %v rows/s", i, s[i], w)
		}
	}
	// A same-time sample replaces the newest.
	m.Add(t0.Add(5*time.Second), Snapshot{Rows: 160})
	if r, _ := m.Rate(time.Second); r != 60 {
		t.Errorf("after replace %v, want 60", r)
	}
	// Counters went down (the worker restarted, counting from 0 again):
	// the series goes on from the last count, no reset, no negative rate.
	m.Add(t0.Add(6*time.Second), Snapshot{Rows: 5})
	if r, _ := m.Rate(time.Second); r != 5 {
		t.Errorf("after restart %v, want 5", r)
	}
	m.Add(t0.Add(8*time.Second), Snapshot{Rows: 25})
	if r, _ := m.Rate(2 * time.Second); r != 10 {
		t.Errorf("after restart %v, want 10", r)
	}
	// Held: t=4 (100), 5 (160), 6 (165), 8 (185).
	if s := m.Series(); len(s) != 3 || s[0].RowsPS != 60 || s[1].RowsPS != 5 || s[2].RowsPS != 10 {
		t.Errorf("series across the restart %+v", s)
	}
}

func TestFormat(t *testing.T) {
	cases := []struct{ got, want string }{
		{FormatKVR(8_945_664), "0.00895 KVR"}, // DESIGN.md test vector
		{FormatKVR(0), "0.00000 KVR"},
		{FormatKVR(1_234_567_890_000), "1234.56789 KVR"},
		{FormatKVR(4_999), "0.00000 KVR"},
		{FormatKVR(5_000), "0.00001 KVR"},
		{ExactKVR(8_945_664), "0.008945664"},
		{ExactKVR(12_000_000_001), "12.000000001"},
		{FormatBytes(0), "0 B"},
		{FormatBytes(1023), "1.02 kB"}, {FormatBytes(999), "999 B"},
		{FormatBytes(1536), "1.54 kB"},
		{FormatBytes(64 << 20), "67.1 MB"},
		{FormatBytes(3 << 30), "3.22 GB"},
		{FormatRTT(0), "—"},
		{FormatRTT(12345 * time.Microsecond), "12.3 ms"},
		{Line(Snapshot{State: Connected, Gateway: "gw.example:443", RTT: 12 * time.Millisecond}, 2469, 1_277_952, 9_100_000, 8_945_664),
			"connected gw=gw.example:443 rtt=12.0 ms 2469.0 rows/s 1.28 MB/s earned≈0.00910 KVR pending=0.00895 KVR"},
		{Line(Snapshot{State: Connected, DownloadBytesDone: 3 << 20, DownloadBytesTotal: 4 << 20, DownloadExpertsDone: 6, DownloadExpertsTotal: 8}, 0, 0, 0, 0),
			"connected gw=- rtt=— 0.0 rows/s 0.00 MB/s earned≈0.00000 KVR pending=0.00000 KVR download=6/8 experts"},
		{Snapshot{DownloadBytesDone: 3 << 20, DownloadBytesTotal: 4 << 20, DownloadExpertsDone: 6, DownloadExpertsTotal: 8}.DownloadLine(),
			"downloading experts: 6 of 8, 3.15 MB of 4.19 MB (75%)"},
		{Snapshot{DownloadBytesDone: 4 << 20, DownloadBytesTotal: 4 << 20, DownloadExpertsDone: 8, DownloadExpertsTotal: 8}.DownloadLine(),
			"assigned experts held: 8 of 8, 4.19 MB of 4.19 MB (100%)"},
		{Snapshot{}.DownloadLine(), ""},
		{Line(Snapshot{State: Connected, CPULimit: 50}, 0, 0, 0, 0),
			"connected gw=- rtt=— 0.0 rows/s 0.00 MB/s earned≈0.00000 KVR pending=0.00000 KVR cpu-limit=50%"},
		{Snapshot{CPULimit: 25}.CPULimitLine(), "limited to 25% CPU"},
		{Snapshot{CPULimit: 100}.CPULimitLine(), ""},
		{Snapshot{}.CPULimitLine(), ""},
		{Line(Snapshot{State: Offline, Reason: "gateway unreachable"}, 0, 0, 0, 0),
			"offline gw=- rtt=— 0.0 rows/s 0.00 MB/s earned≈0.00000 KVR pending=0.00000 KVR (gateway unreachable)"},
	}
	for i, c := range cases {
		if c.got != c.want {
			t.Errorf("%d: got %q want %q", i, c.got, c.want)
		}
	}
}

// fakeSource records the control calls it gets.
type fakeSource struct {
	snap  Snapshot
	calls []string
}

func (f *fakeSource) Stats() Snapshot  { return f.snap }
func (f *fakeSource) Pause()           { f.calls = append(f.calls, "pause") }
func (f *fakeSource) Resume()          { f.calls = append(f.calls, "resume") }
func (f *fakeSource) FinishThenPause() { f.calls = append(f.calls, "finish") }

func TestControl(t *testing.T) {
	f := &fakeSource{snap: Snapshot{State: Connected, Rows: 7}}
	c := NewControl(f)
	if s := c.Stats(); s.State != Connected || s.Reason != "" || !s.Earning() {
		t.Fatalf("initial %+v", s)
	}
	c.SetLimit("paused: running on battery")
	if s := c.Stats(); s.State != Paused || s.Reason != "paused: running on battery" || s.Rows != 7 {
		t.Errorf("limited %+v", s)
	}
	c.Pause() // owner pause takes precedence in the reason
	if s := c.Stats(); s.Reason != ReasonUserPaused {
		t.Errorf("user+limit reason %q", s.Reason)
	}
	c.SetLimit("") // limit lifts, owner still holds
	if s := c.Stats(); s.State != Paused || s.Reason != ReasonUserPaused {
		t.Errorf("user only %+v", s)
	}
	c.Resume()
	if s := c.Stats(); s.State != Connected || s.Reason != "" {
		t.Errorf("resumed %+v", s)
	}
	c.FinishThenPause()
	if s := c.Stats(); s.Reason != ReasonFinishing || !c.UserPaused() {
		t.Errorf("finishing %+v", s)
	}
	c.Resume()
	want := "pause pause pause resume finish resume"
	if got := strings.Join(f.calls, " "); got != want {
		t.Errorf("calls %q, want %q", got, want)
	}
}

func TestWriteHistoryCSV(t *testing.T) {
	ev := []wallet.Event{
		{Time: t0.Add(1500 * time.Millisecond), State: wallet.StateCredited, Statement: 3, Ledger: "(10, 42]", Bytes: 1_277_952, Rejected: 17, NKVR: 8_945_664},
		{Time: t0, State: wallet.StateMetered, Session: "s-1,\"x\"", Bytes: 1000, NKVR: 7000},
		{Time: t0.Add(-time.Hour), State: wallet.StatePaid, NKVR: 1_000_000_000, Ref: "tx 9"},
	}
	var buf bytes.Buffer
	if err := WriteHistoryCSV(&buf, ev); err != nil {
		t.Fatal(err)
	}
	recs, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		CSVHeader,
		{"2026-11-29T12:00:01.500Z", "credited", "", "3", "(10, 42]", "1277952", "17", "8945664", "0.008945664", ""},
		{"2026-11-29T12:00:00.000Z", "metered", "s-1,\"x\"", "", "", "1000", "0", "7000", "0.000007000", ""},
		{"2026-11-29T11:00:00.000Z", "paid", "", "", "", "0", "0", "1000000000", "1.000000000", "tx 9"},
	}
	if len(recs) != len(want) {
		t.Fatalf("%d records, want %d:\n%s", len(recs), len(want), buf.String())
	}
	for i := range want {
		if strings.Join(recs[i], "|") != strings.Join(want[i], "|") {
			t.Errorf("row %d: %q, want %q", i, recs[i], want[i])
		}
	}
}

func TestSliceSummary(t *testing.T) {
	at := time.Date(2026, 11, 29, 12, 0, 5, 0, time.Local)
	cases := []struct {
		s    SliceInfo
		want string
	}{
		{SliceInfo{Problem: "no slice folder set"}, "no slice folder set"},
		{SliceInfo{Layers: 1, Experts: 1, Bytes: 1536}, "1 expert in 1 layer, 1.54 kB, integrity not verified"},
		{SliceInfo{Layers: 2, Experts: 96, Bytes: 12 << 20, QuotaBytes: 64 << 20, Verified: true, VerifiedAt: at},
			"96 experts in 2 layers, 12.6 MB of 67.1 MB quota, integrity verified 12:00:05"},
		{SliceInfo{Layers: 2, Experts: 95, Bytes: 12 << 20, Bad: 1, Verified: true, VerifiedAt: at},
			"95 experts in 2 layers, 12.6 MB, 1 experts failed the hash check and are not served (verified 12:00:05)"},
		// An empty folder has nothing to verify: no "integrity verified".
		{SliceInfo{QuotaBytes: 4e9, Verified: true, VerifiedAt: at}, "no experts held yet (quota 4.00 GB): the backbone assigns them once connected"},
		{SliceInfo{Verified: true, VerifiedAt: at}, "no experts held"},
	}
	for _, c := range cases {
		if got := c.s.Summary(); got != c.want {
			t.Errorf("got %q\nwant %q", got, c.want)
		}
	}
}

func TestComputeLine(t *testing.T) {
	for _, c := range []struct {
		dev  string
		rows float64
		want string
	}{
		{"NVIDIA GeForce RTX 4090 (Vulkan)", 2469, "Computing on: NVIDIA GeForce RTX 4090 (Vulkan) · 2469.0 rows/s"},
		{"CPU", 0, "Computing on: CPU · 0.0 rows/s"},
		{"", 12.25, "Computing on: — · 12.2 rows/s"},
	} {
		if got := ComputeLine(Snapshot{Device: c.dev}, c.rows); got != c.want {
			t.Errorf("ComputeLine(%q, %v) = %q, want %q", c.dev, c.rows, got, c.want)
		}
	}
}
