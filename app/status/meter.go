package status

import (
	"fmt"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/wallet/walletapi"
)

// BytesPerMB is the byte count of one MB in the app's rates (10^6, the
// same decimal unit as a billing unit).
const BytesPerMB = 1_000_000

// Sample is one point of a throughput series: the rates over the interval
// that ends at T.
type Sample struct {
	T       time.Time
	RowsPS  float64 // rows per second
	BytesPS float64 // bytes (in + out) per second
}

// Meter keeps the last Capacity snapshots with their times and derives
// rates from them. It is safe for concurrent use. Counters that go down
// (the worker restarted and counts from 0 again) continue from the last
// count, so the series goes on across a restart without negative rates.
type Meter struct {
	mu                sync.Mutex
	buf               []point // ring, oldest at head
	head              int
	n                 int
	rawRows, rawBytes uint64 // the newest snapshot's own counters
	offRows, offBytes uint64 // added to a restarted worker's counters
}

type point struct {
	t     time.Time
	rows  uint64
	bytes uint64
}

// NewMeter returns a Meter holding up to capacity snapshots (at least 2);
// with one Add per second, 300 covers five minutes.
func NewMeter(capacity int) *Meter {
	return &Meter{buf: make([]point, max(capacity, 2))}
}

// Add records snapshot s taken at time t. Times must not go backwards; a
// sample at or before the newest one replaces it.
func (m *Meter) Add(t time.Time, s Snapshot) {
	rows, bytes := s.Rows, s.BytesIn+s.BytesOut
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n > 0 && (rows < m.rawRows || bytes < m.rawBytes) { // restarted: go on from the last count
		last := m.buf[(m.head+m.n-1)%len(m.buf)]
		m.offRows, m.offBytes = last.rows, last.bytes
	}
	m.rawRows, m.rawBytes = rows, bytes
	p := point{t: t, rows: rows + m.offRows, bytes: bytes + m.offBytes}
	if m.n > 0 {
		last := &m.buf[(m.head+m.n-1)%len(m.buf)]
		if !t.After(last.t) {
			*last = p
			return
		}
	}
	if m.n == len(m.buf) {
		m.buf[m.head] = p
		m.head = (m.head + 1) % len(m.buf)
		return
	}
	m.buf[(m.head+m.n)%len(m.buf)] = p
	m.n++
}

func (m *Meter) at(i int) point { return m.buf[(m.head+i)%len(m.buf)] }

// Rate returns rows/s and bytes/s over the snapshots of the last window
// (measured back from the newest snapshot; window <= 0 means all held):
// (newest counter - oldest counter in the window) / their time apart.
// Both are 0 with fewer than two snapshots.
func (m *Meter) Rate(window time.Duration) (rowsPS, bytesPS float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n < 2 {
		return 0, 0
	}
	last := m.at(m.n - 1)
	first := last
	for i := 0; i < m.n; i++ {
		if p := m.at(i); window <= 0 || last.t.Sub(p.t) <= window {
			first = p
			break
		}
	}
	dt := last.t.Sub(first.t).Seconds()
	if dt <= 0 {
		return 0, 0
	}
	return float64(last.rows-first.rows) / dt, float64(last.bytes-first.bytes) / dt
}

// Series returns the rate between each pair of consecutive snapshots,
// oldest first: len = held snapshots - 1 (nil with fewer than two).
func (m *Meter) Series() []Sample {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.n < 2 {
		return nil
	}
	out := make([]Sample, 0, m.n-1)
	prev := m.at(0)
	for i := 1; i < m.n; i++ {
		p := m.at(i)
		dt := p.t.Sub(prev.t).Seconds()
		out = append(out, Sample{T: p.t, RowsPS: float64(p.rows-prev.rows) / dt, BytesPS: float64(p.bytes-prev.bytes) / dt})
		prev = p
	}
	return out
}

// FormatRows renders a rows/s rate with one decimal: "2469.0 rows/s".
func FormatRows(rowsPS float64) string { return fmt.Sprintf("%.1f rows/s", rowsPS) }

// ComputeLine says where the worker computes and how fast, for people:
// "Computing on: NVIDIA GeForce RTX 4090 (Vulkan) · 2469.0 rows/s", or
// "Computing on: CPU · 0.0 rows/s"; "—" for an unknown device.
func ComputeLine(s Snapshot, rowsPS float64) string {
	d := s.Device
	if d == "" {
		d = "—"
	}
	return "Computing on: " + d + " · " + FormatRows(rowsPS)
}

// FormatMBps renders a bytes/s rate in MB/s (10^6 bytes) with two
// decimals: "1.28 MB/s".
func FormatMBps(bytesPS float64) string { return fmt.Sprintf("%.2f MB/s", bytesPS/BytesPerMB) }

// FormatKVR renders an nKVR amount as KVR with 5 decimals, rounded half
// up: 8945664 -> "0.00895 KVR" (walletapi.FormatKVR).
func FormatKVR(nkvr uint64) string { return walletapi.FormatKVR(nkvr) }

// FormatBytes renders a byte count in decimal units, the app's one unit
// system (walletapi.FormatBytes): 1536 -> "1.54 kB", 0 -> "0 B".
func FormatBytes(b uint64) string { return walletapi.FormatBytes(b) }

// FormatRTT renders a round trip in milliseconds with one decimal, or "—"
// when unknown (0).
func FormatRTT(d time.Duration) string {
	if d <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// Line is the one-line status headless mode prints:
//
//	connected gw=host:443 rtt=12.0 ms 2469.0 rows/s 1.28 MB/s earned≈0.00910 KVR pending=0.00895 KVR
//
// where earned≈ is the estimate from the worker's own count (the wallet's
// metered nKVR, at once) and pending what the gateway has credited and
// not yet paid (it follows the work by the credit lag), followed by
// " download=3/8 experts" while assigned experts are being fetched,
// " cpu-limit=50%" under a CPU limit and " (reason)" when not earning.
func Line(s Snapshot, rowsPS, bytesPS float64, estimateNKVR, pendingNKVR uint64) string {
	gw := s.Gateway
	if gw == "" {
		gw = "-"
	}
	l := fmt.Sprintf("%s gw=%s rtt=%s %s %s earned≈%s pending=%s", s.State, gw, FormatRTT(s.RTT), FormatRows(rowsPS), FormatMBps(bytesPS),
		FormatKVR(estimateNKVR), FormatKVR(pendingNKVR))
	if s.Downloading() {
		l += fmt.Sprintf(" download=%d/%d experts", s.DownloadExpertsDone, s.DownloadExpertsTotal)
	}
	if s.CPULimitLine() != "" {
		l += fmt.Sprintf(" cpu-limit=%d%%", s.CPULimit)
	}
	if s.Reason != "" {
		l += " (" + s.Reason + ")"
	}
	return l
}
