// Package status is the contributor app's view of a running worker, shared
// by the desktop window, the tray, headless mode and the mobile API: a
// Snapshot of the worker's counters, a Meter that turns successive
// snapshots into rates (rows/s, MB/s) and a chart series, and a Control
// that combines the owner's Pause/Resume with pauses imposed by limits
// (battery, idle, temperature). It imports neither Fyne nor cgo packages.
package status

import (
	"fmt"
	"sync"
	"time"
)

// State is the worker's connection state.
type State int

// Connection states, in the order a worker goes through them.
const (
	Offline   State = iota // not running, or lost the gateway and waiting to redial
	Dialing                // dialing the gateway / authenticating
	Connected              // session open, serving DISPATCH frames
	Paused                 // connected or not, but not accepting work
)

// String returns the lower-case name shown to people ("connected").
func (s State) String() string {
	switch s {
	case Offline:
		return "offline"
	case Dialing:
		return "dialing"
	case Connected:
		return "connected"
	case Paused:
		return "paused"
	}
	return "unknown"
}

// Snapshot is one reading of a worker's counters. Counters are cumulative
// since the worker started and never decrease.
type Snapshot struct {
	State          State
	Reason         string        // why the worker is not earning; "" when it is
	Gateway        string        // gateway host[:port]
	RTT            time.Duration // last measured WebSocket ping round trip; 0 if unknown
	Rows           uint64        // hidden rows computed (one row = one token x k experts)
	Requests       uint64        // DISPATCH frames answered
	BytesIn        uint64        // WebSocket message bytes received
	BytesOut       uint64        // WebSocket message bytes sent
	Session        string        // current session id; "" when none
	ConnectedSince time.Time     // zero when not connected
	LastError      string        // last connection error; "" if none
	// Device says where the experts are computed, for people: "CPU",
	// "NVIDIA GeForce RTX 4090 (Vulkan)", or "CPU (the Vulkan device ...
	// failed: ...)"; "" when not known.
	Device string

	// Download of the experts the backbone assigned (slice provisioning;
	// zero without): bytes and experts of the assignment held so far and
	// in all.
	DownloadBytesDone, DownloadBytesTotal     uint64
	DownloadExpertsDone, DownloadExpertsTotal int

	// CPULimit is the share of the machine's CPU time the worker's
	// process keeps to, percent (1-99; 0: no limit). It does so by
	// resting between requests (engine/worker's duty cycle) while it stays
	// connected and earning.
	CPULimit int
}

// CPULimitLine renders the CPU limit for people, "limited to 50% CPU", or
// "" without one.
func (s Snapshot) CPULimitLine() string {
	if s.CPULimit <= 0 || s.CPULimit >= 100 {
		return ""
	}
	return fmt.Sprintf("limited to %d%% CPU", s.CPULimit)
}

// Downloading reports whether assigned experts are still being fetched.
func (s Snapshot) Downloading() bool { return s.DownloadBytesDone < s.DownloadBytesTotal }

// DownloadLine renders the download progress, e.g. "downloading experts:
// 3 of 8, 1.2 MiB of 1.6 MiB (75%)", or "" when nothing is assigned.
func (s Snapshot) DownloadLine() string {
	if s.DownloadBytesTotal == 0 {
		return ""
	}
	verb := "downloading experts"
	if !s.Downloading() {
		verb = "assigned experts held"
	}
	return fmt.Sprintf("%s: %d of %d, %s of %s (%.0f%%)", verb, s.DownloadExpertsDone, s.DownloadExpertsTotal,
		FormatBytes(s.DownloadBytesDone), FormatBytes(s.DownloadBytesTotal), 100*float64(s.DownloadBytesDone)/float64(s.DownloadBytesTotal))
}

// Earning reports whether the worker is connected and not paused.
func (s Snapshot) Earning() bool { return s.State == Connected && s.Reason == "" }

// Source is what the app reads and drives: a running worker. Stats must be
// cheap and safe to call from any goroutine. Pause stops taking new work
// at once (requests in flight are answered), FinishThenPause finishes the
// work in flight and then pauses (the same as Pause for a worker whose
// requests are single frames), Resume undoes either.
type Source interface {
	Stats() Snapshot
	Pause()
	Resume()
	FinishThenPause()
}

// Reasons Control gives for not earning.
const (
	ReasonUserPaused = "paused by you"
	ReasonFinishing  = "finishing current work, then pausing"
)

// Control wraps a Source and decides whether it runs: the owner's choice
// (Pause, Resume, FinishThenPause) and a limit's choice (SetLimit) both
// have to allow work. While either holds the worker paused, Stats reports
// State Paused and the reason (the owner's first). It is safe for
// concurrent use.
type Control struct {
	src Source

	mu        sync.Mutex
	user      string // ReasonUserPaused, ReasonFinishing or ""
	limit     string // reason from a limit, or ""
	applied   bool   // whether src is currently paused by us
	finishing bool
}

// NewControl returns a Control over src, initially running (src is not
// paused or resumed until the first call that changes the decision).
func NewControl(src Source) *Control { return &Control{src: src} }

// Pause pauses the worker by the owner's choice.
func (c *Control) Pause() { c.setUser(ReasonUserPaused, false) }

// FinishThenPause lets the work in flight finish, then pauses.
func (c *Control) FinishThenPause() { c.setUser(ReasonFinishing, true) }

// Resume withdraws the owner's pause; a limit may still hold the worker.
func (c *Control) Resume() { c.setUser("", false) }

// UserPaused reports whether the owner has paused the worker.
func (c *Control) UserPaused() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.user != ""
}

// SetLimit sets the reason a limit pauses the worker ("" lifts it), e.g.
// "paused: running on battery".
func (c *Control) SetLimit(reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.limit = reason
	c.apply()
}

func (c *Control) setUser(reason string, finish bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.user = reason
	c.finishing = finish
	c.apply()
}

// apply calls the source to match the decision; c.mu held.
func (c *Control) apply() {
	want := c.user != "" || c.limit != ""
	switch {
	case want && c.finishing && c.limit == "":
		c.src.FinishThenPause()
		c.applied = true
	case want:
		c.src.Pause()
		c.applied = true
	case c.applied:
		c.src.Resume()
		c.applied = false
	}
}

// Stats returns the source's snapshot, with State Paused and the owner's
// or the limit's reason while either holds the worker.
func (c *Control) Stats() Snapshot {
	s := c.src.Stats()
	c.mu.Lock()
	user, limit := c.user, c.limit
	c.mu.Unlock()
	switch {
	case user != "":
		s.State, s.Reason = Paused, user
	case limit != "":
		s.State, s.Reason = Paused, limit
	}
	return s
}

var _ Source = (*Control)(nil)
