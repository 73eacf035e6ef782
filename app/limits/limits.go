// Package limits decides when a contributor's machine should not work:
// on battery, when the owner's machine is busy with other things, or when
// the CPU is too hot (with hysteresis, so the worker does not flap around
// the threshold). It reads what the OS tells through a Probe; SysProbe
// reads Linux's /sys and /proc, and reports "unknown" elsewhere.
//
// The CPU percentage limit is not a pause decided here: the worker keeps
// to it itself, resting between requests (engine/worker Config.CPULimit,
// a duty cycle on its measured process CPU time).
package limits

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// ErrUnsupported is returned by a probe that cannot read a quantity on
// this OS or machine (no battery info, no thermal zones).
var ErrUnsupported = errors.New("limits: not reported by this OS")

// ErrParse wraps malformed /proc or /sys contents.
var ErrParse = errors.New("limits: malformed system file")

// Probe reads the machine's state.
type Probe interface {
	// OnBattery reports whether the machine runs from a discharging
	// battery with no mains power online.
	OnBattery() (bool, error)
	// CPUTempC returns the hottest CPU/thermal-zone temperature in degrees
	// Celsius.
	CPUTempC() (float64, error)
	// CPUTimes returns cumulative CPU time of the whole machine (total and
	// busy, all CPUs) and of this process (self), in the same clock ticks.
	CPUTimes() (total, busy, self uint64, err error)
}

// Limits are the owner's settings. The zero value imposes no limit.
type Limits struct {
	PauseOnBattery bool    // pause while OnBattery
	OnlyWhenIdle   bool    // pause while other processes use more than IdleBelow of the CPUs
	IdleBelow      float64 // fraction of all CPUs, (0, 1]; 0 means DefaultIdleBelow
	MaxTempC       float64 // pause at or above this temperature (°C); 0 = no limit
	ResumeTempC    float64 // resume at or below this (°C); 0 means MaxTempC - DefaultHysteresisC
	// Hours, when set, are the local times of day the worker may work;
	// outside them it pauses.
	Hours Hours
}

// Hours is a daily window of local time, From inclusive to To exclusive,
// in minutes after midnight; To <= From wraps past midnight (22:00-07:00).
// The zero value (From == To == 0) is no window: any time.
type Hours struct{ From, To int }

// Set reports whether h restricts the time of day.
func (h Hours) Set() bool { return h != Hours{} }

// Contains reports whether the local time t is inside h (always when h is
// not set).
func (h Hours) Contains(t time.Time) bool {
	if !h.Set() {
		return true
	}
	m := t.Hour()*60 + t.Minute()
	if h.From < h.To {
		return m >= h.From && m < h.To
	}
	return m >= h.From || m < h.To
}

// String renders h as "HH:MM–HH:MM" ("" when not set).
func (h Hours) String() string {
	if !h.Set() {
		return ""
	}
	return fmt.Sprintf("%02d:%02d–%02d:%02d", h.From/60, h.From%60, h.To/60, h.To%60)
}

// ParseHours parses "HH:MM-HH:MM" (a hyphen or an en dash; "" is no
// window). Errors wrap ErrHours.
func ParseHours(s string) (Hours, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return Hours{}, nil
	}
	a, b, ok := strings.Cut(strings.ReplaceAll(s, "–", "-"), "-")
	if !ok {
		return Hours{}, fmt.Errorf("%w: %q: want HH:MM-HH:MM", ErrHours, s)
	}
	var h Hours
	for i, part := range []string{a, b} {
		t, err := time.Parse("15:04", strings.TrimSpace(part))
		if err != nil {
			return Hours{}, fmt.Errorf("%w: %q: want HH:MM-HH:MM", ErrHours, s)
		}
		m := t.Hour()*60 + t.Minute()
		if i == 0 {
			h.From = m
		} else {
			h.To = m
		}
	}
	if h.From == h.To {
		return Hours{}, fmt.Errorf("%w: %q starts and ends at the same time", ErrHours, s)
	}
	return h, nil
}

// ErrHours wraps ParseHours errors.
var ErrHours = errors.New("limits: bad working hours")

// Defaults for the zero fields of Limits.
const (
	DefaultIdleBelow   = 0.25 // others may use a quarter of the CPUs
	DefaultHysteresisC = 10.0 // °C between pausing and resuming
)

// Governor evaluates Limits against a Probe. Check is called periodically
// (every few seconds); the temperature limit and the idle measurement keep
// state between calls. It is safe for concurrent use.
type Governor struct {
	probe Probe
	// Now is the clock for Limits.Hours; nil means time.Now.
	Now func() time.Time

	mu      sync.Mutex
	lim     Limits
	hot     bool
	prev    [3]uint64 // total, busy, self at the previous Check
	hasPrev bool
}

// NewGovernor returns a Governor for lim reading p.
func NewGovernor(lim Limits, p Probe) *Governor { return &Governor{probe: p, lim: lim} }

// SetLimits replaces the limits (the temperature state is kept).
func (g *Governor) SetLimits(lim Limits) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.lim = lim
}

// Check returns why the worker should be paused now, or "" when no limit
// applies. A quantity the probe cannot read never pauses the worker (the
// error is not fatal: the owner sees the limit has no effect in the
// settings, see Readings).
func (g *Governor) Check() string {
	g.mu.Lock()
	defer g.mu.Unlock()
	lim := g.lim
	var reasons []string

	if lim.MaxTempC > 0 {
		resume := lim.ResumeTempC
		if resume <= 0 || resume >= lim.MaxTempC {
			resume = lim.MaxTempC - DefaultHysteresisC
		}
		if c, err := g.probe.CPUTempC(); err == nil {
			switch {
			case !g.hot && c >= lim.MaxTempC:
				g.hot = true
			case g.hot && c <= resume:
				g.hot = false
			}
			if g.hot {
				reasons = append(reasons, fmt.Sprintf("CPU at %.1f °C (limit %.0f °C, resumes at %.0f °C)", c, lim.MaxTempC, resume))
			}
		}
	} else {
		g.hot = false
	}

	if lim.Hours.Set() {
		now := time.Now
		if g.Now != nil {
			now = g.Now
		}
		if !lim.Hours.Contains(now()) {
			reasons = append(reasons, "outside your working hours ("+lim.Hours.String()+")")
		}
	}

	if lim.PauseOnBattery {
		if on, err := g.probe.OnBattery(); err == nil && on {
			reasons = append(reasons, "running on battery")
		}
	}

	total, busy, self, err := g.probe.CPUTimes()
	if err == nil {
		if lim.OnlyWhenIdle && g.hasPrev && total > g.prev[0] {
			dt := float64(total - g.prev[0])
			others := (float64(busy-min(busy, g.prev[1])) - float64(self-min(self, g.prev[2]))) / dt
			thr := lim.IdleBelow
			if thr <= 0 || thr > 1 {
				thr = DefaultIdleBelow
			}
			if others > thr {
				reasons = append(reasons, fmt.Sprintf("machine busy (other programs use %.0f%% of the CPUs)", 100*others))
			}
		}
		g.prev, g.hasPrev = [3]uint64{total, busy, self}, true
	}

	if len(reasons) == 0 {
		return ""
	}
	r := "paused by a limit: " + reasons[0]
	for _, x := range reasons[1:] {
		r += "; " + x
	}
	return r
}
