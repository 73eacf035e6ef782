package run

import (
	"bufio"
	"os"
	"strconv"
	"strings"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
)

// WorkerJSON is one worker session in generate's and demo's JSON, from the
// dispatcher's dispatch.WorkerStats. Bytes are whole messages of the session
// (control frames included), as the backbone counted them.
type WorkerJSON struct {
	ID        string `json:"id"`      // hex ed25519 public key
	Session   string `json:"session"` // hub session id
	Connected bool   `json:"connected"`
	Reason    string `json:"reason,omitempty"` // why an ended session ended
	// Backend is where the worker computes, as its HELLO declares it
	// ("cpu", "vulkan:<device>"); Tolerance is the relative error per
	// output row its checks allow (0: exact bits, a CPU backend: a
	// non-CPU worker's answers may change the logits' last bits).
	Backend    string  `json:"backend"`
	Tolerance  float64 `json:"tolerance"`
	Checks     uint64  `json:"checks"`     // results verified against a local recomputation
	Mismatches uint64  `json:"mismatches"` // checked results that differed (key banned)
	Holdings   int     `json:"holdings"`   // (layer, expert) pairs accepted
	Requests   uint64  `json:"requests"`   // DISPATCH frames sent
	Rows       uint64  `json:"rows"`       // hidden rows in accepted RESULTs
	Pairs      uint64  `json:"pairs"`      // (row, slot) outputs accepted
	Timeouts   uint64  `json:"timeouts"`   // requests past their deadline
	BytesIn    uint64  `json:"bytes_in"`   // worker -> backbone
	BytesOut   uint64  `json:"bytes_out"`  // backbone -> worker
	RTTp50ms   float64 `json:"rtt_p50_ms"`
	RTTp99ms   float64 `json:"rtt_p99_ms"`
	// Where the recent requests' time went (issue 19; dispatch.WorkerStats),
	// medians in ms: the backbone's encode and link write, the worker's
	// queue and compute (from its RESULTs), the wire (round trip less
	// those two) and the backbone's decode.
	EncodeP50ms  float64 `json:"encode_p50_ms"`
	WriteP50ms   float64 `json:"write_p50_ms"`
	QueueP50ms   float64 `json:"queue_p50_ms"`
	ComputeP50ms float64 `json:"compute_p50_ms"`
	WireP50ms    float64 `json:"wire_p50_ms"`
	DecodeP50ms  float64 `json:"decode_p50_ms"`
}

// WorkersJSON returns st.Workers as WorkerJSON entries.
func WorkersJSON(st dispatch.Stats) []WorkerJSON {
	out := make([]WorkerJSON, 0, len(st.Workers))
	for _, w := range st.Workers {
		out = append(out, WorkerJSON{ID: w.ID, Session: w.Session, Connected: w.Connected, Reason: w.Reason,
			Backend: w.Backend, Tolerance: w.Tolerance, Checks: w.Checks, Mismatches: w.Mismatches,
			Holdings: w.Holdings, Requests: w.Requests, Rows: w.Rows, Pairs: w.Pairs, Timeouts: w.Timeouts,
			BytesIn: w.BytesIn, BytesOut: w.BytesOut, RTTp50ms: w.RTTp50ms, RTTp99ms: w.RTTp99ms,
			EncodeP50ms: w.EncodeP50ms, WriteP50ms: w.WriteP50ms, QueueP50ms: w.QueueP50ms,
			ComputeP50ms: w.ComputeP50ms, WireP50ms: w.WireP50ms, DecodeP50ms: w.DecodeP50ms})
	}
	return out
}

// ProcessRSS returns this process's resident set size and its peak, bytes
// (VmRSS and VmHWM of /proc/self/status: anonymous memory plus the pages of
// mapped files, such as the model, that are resident). Both are 0 where
// /proc is not available.
func ProcessRSS() (rss, peak int64) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			continue
		}
		if k == "VmRSS" {
			rss = n << 10
		} else {
			peak = n << 10
		}
	}
	return rss, peak
}
