package limits

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

type fakeProbe struct {
	temp      float64
	tempErr   error
	battery   bool
	batErr    error
	total     uint64
	busy      uint64
	self      uint64
	cpuErrSet bool
}

func (f *fakeProbe) OnBattery() (bool, error)   { return f.battery, f.batErr }
func (f *fakeProbe) CPUTempC() (float64, error) { return f.temp, f.tempErr }
func (f *fakeProbe) CPUTimes() (uint64, uint64, uint64, error) {
	if f.cpuErrSet {
		return 0, 0, 0, ErrUnsupported
	}
	return f.total, f.busy, f.self, nil
}

func TestTemperatureHysteresis(t *testing.T) {
	p := &fakeProbe{cpuErrSet: true}
	g := NewGovernor(Limits{MaxTempC: 85, ResumeTempC: 75}, p)
	// temperature walk and whether the worker is paused after each reading
	steps := []struct {
		c      float64
		paused bool
	}{{60, false}, {84.9, false}, {85, true}, {80, true}, {75.1, true}, {75, false}, {84, false}, {90, true}}
	for i, s := range steps {
		p.temp = s.c
		r := g.Check()
		if (r != "") != s.paused {
			t.Fatalf("step %d (%.1f °C): reason %q, want paused=%v", i, s.c, r, s.paused)
		}
	}
	if r := g.Check(); r != "paused by a limit: CPU at 90.0 °C (limit 85 °C, resumes at 75 °C)" {
		t.Errorf("reason %q", r)
	}
	// Default hysteresis: resume at 70 for a max of 80.
	g.SetLimits(Limits{MaxTempC: 80})
	p.temp = 71
	if g.Check() == "" {
		t.Error("71 °C with max 80 should still be paused (resume at 70)")
	}
	p.temp = 70
	if r := g.Check(); r != "" {
		t.Errorf("70 °C: %q", r)
	}
	// Unreadable temperature never pauses.
	p.temp, p.tempErr = 99, ErrUnsupported
	if r := g.Check(); r != "" {
		t.Errorf("unreadable temp paused: %q", r)
	}
}

func TestBatteryAndIdle(t *testing.T) {
	p := &fakeProbe{battery: true, total: 1000, busy: 100, self: 50}
	g := NewGovernor(Limits{PauseOnBattery: true, OnlyWhenIdle: true}, p)
	if r := g.Check(); r != "paused by a limit: running on battery" {
		t.Errorf("battery: %q", r)
	}
	p.battery = false
	// next 1000 ticks: busy +600 of which self +400 -> others 20% < 25%.
	p.total, p.busy, p.self = 2000, 700, 450
	if r := g.Check(); r != "" {
		t.Errorf("others at 20%%: %q", r)
	}
	// next 1000 ticks: busy +500, self +100 -> others 40%.
	p.total, p.busy, p.self = 3000, 1200, 550
	if r := g.Check(); r != "paused by a limit: machine busy (other programs use 40% of the CPUs)" {
		t.Errorf("others at 40%%: %q", r)
	}
	p.battery = true
	p.total, p.busy, p.self = 4000, 1700, 650
	if r := g.Check(); !strings.Contains(r, "running on battery; machine busy") {
		t.Errorf("both: %q", r)
	}
	// Limits off: nothing pauses.
	g.SetLimits(Limits{})
	if r := g.Check(); r != "" {
		t.Errorf("no limits: %q", r)
	}
}

func write(t *testing.T, root, rel, s string) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestSysProbe(t *testing.T) {
	root := t.TempDir()
	p := SysProbe{Root: root}
	if _, err := p.OnBattery(); !errors.Is(err, ErrUnsupported) {
		t.Errorf("no battery: %v", err)
	}
	if _, err := p.CPUTempC(); !errors.Is(err, ErrUnsupported) {
		t.Errorf("no zones: %v", err)
	}
	write(t, root, "sys/class/power_supply/BAT0/type", "Battery\n")
	write(t, root, "sys/class/power_supply/BAT0/status", "Discharging\n")
	write(t, root, "sys/class/power_supply/AC/type", "Mains\n")
	write(t, root, "sys/class/power_supply/AC/online", "0\n")
	if on, err := p.OnBattery(); err != nil || !on {
		t.Errorf("discharging, AC offline: %v %v", on, err)
	}
	write(t, root, "sys/class/power_supply/AC/online", "1\n")
	if on, err := p.OnBattery(); err != nil || on {
		t.Errorf("AC online: %v %v", on, err)
	}
	write(t, root, "sys/class/thermal/thermal_zone0/temp", "45000\n")
	write(t, root, "sys/class/thermal/thermal_zone1/temp", "87500\n")
	write(t, root, "sys/class/thermal/thermal_zone2/temp", "-273000\n") // bogus sensor, ignored
	write(t, root, "sys/class/thermal/thermal_zone3/temp", "n/a\n")
	if c, err := p.CPUTempC(); err != nil || c != 87.5 {
		t.Errorf("temp %v %v, want 87.5", c, err)
	}
	write(t, root, "proc/stat", "cpu  100 5 40 800 20 3 2 1 0 0\ncpu0 1 2 3 4\n")
	write(t, root, "proc/self/stat", "42 (kva sir) (x) R 1 2 3 0 -1 4194304 98 0 0 0 17 4 0 0 20 0 1 0\n")
	total, busy, self, err := p.CPUTimes()
	// total = 100+5+40+800+20+3+2+1 = 971; busy = 971-800-20 = 151; self = 17+4.
	if err != nil || total != 971 || busy != 151 || self != 21 {
		t.Errorf("CPUTimes = %d %d %d %v", total, busy, self, err)
	}
}

func TestParseErrors(t *testing.T) {
	for _, s := range []string{"", "intr 1 2", "cpu 1 2", "cpu 1 2 x 4 5", "cpu 18446744073709551615 1 0 0"} {
		if _, _, err := ParseProcStat(s); !errors.Is(err, ErrParse) {
			t.Errorf("ParseProcStat(%q) = %v", s, err)
		}
	}
	for _, s := range []string{"", "1 (x R 1", "1 (x) R 1 2 3", "1 (x) R 1 2 3 4 5 6 7 8 9 10 -1 2"} {
		if _, err := ParseSelfStat(s); !errors.Is(err, ErrParse) {
			t.Errorf("ParseSelfStat(%q) = %v", s, err)
		}
	}
}

func FuzzParseProcStat(f *testing.F) {
	for _, s := range []string{"cpu  118943 0 40247 65393 386 0 406 0 0 0\ncpu0 1", "cpu 1 2 3", "cpu", "cpu 99999999999999999999 1 1 1", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		total, busy, err := ParseProcStat(s)
		if err == nil && busy > total {
			t.Fatalf("busy %d > total %d", busy, total)
		}
	})
}

func FuzzParseSelfStat(f *testing.F) {
	for _, s := range []string{"28952 (cat) R 28882 28882 5156 0 -1 4194304 98 0 0 0 7 3 0 0 20", "1 ((a)) R", "1 (x) R 1 2 3 4 5 6 7 8 9 10 18446744073709551615 1", ")"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = ParseSelfStat(s) // must not panic
	})
}

// TestHours: a daily window, also one past midnight, pauses the worker
// outside it.
func TestHours(t *testing.T) {
	day := func(h, m int) time.Time { return time.Date(2026, 12, 1, h, m, 0, 0, time.Local) }
	h, err := ParseHours("22:00-07:30")
	if err != nil || h != (Hours{From: 22 * 60, To: 7*60 + 30}) || h.String() != "22:00–07:30" {
		t.Fatalf("ParseHours: %+v %v", h, err)
	}
	for _, c := range []struct {
		at   time.Time
		want bool
	}{{day(21, 59), false}, {day(22, 0), true}, {day(3, 0), true}, {day(7, 29), true}, {day(7, 30), false}, {day(12, 0), false}} {
		if got := h.Contains(c.at); got != c.want {
			t.Errorf("%v in %s: %v, want %v", c.at.Format("15:04"), h, got, c.want)
		}
	}
	if d, _ := ParseHours("09:00–17:00"); !d.Contains(day(9, 0)) || d.Contains(day(17, 0)) {
		t.Errorf("daytime window %+v", d)
	}
	for _, bad := range []string{"9-5", "25:00-01:00", "10:00-10:00", "10:00"} {
		if _, err := ParseHours(bad); !errors.Is(err, ErrHours) {
			t.Errorf("ParseHours(%q) = %v", bad, err)
		}
	}
	if z, err := ParseHours(" "); err != nil || z.Set() || !z.Contains(day(3, 0)) {
		t.Errorf("empty: %+v %v", z, err)
	}
	now := day(12, 0)
	g := NewGovernor(Limits{Hours: h}, &fakeProbe{})
	g.Now = func() time.Time { return now }
	if r := g.Check(); r != "paused by a limit: outside your working hours (22:00–07:30)" {
		t.Errorf("at noon: %q", r)
	}
	now = day(23, 0)
	if r := g.Check(); r != "" {
		t.Errorf("at 23:00: %q", r)
	}
}
