package node

import (
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// A connected worker with a quota and no expert assigned is not earning,
// and the snapshot says why (the window said "Connected — earning" at 0
// rows/s); once it holds experts, or while its assignment downloads, it
// has no such reason. A round trip is shown only for the session open now.
func TestSnapshotNoExpertsAndRTT(t *testing.T) {
	base := worker.Stats{State: worker.StateConnected, Gateway: "g:443", RTT: 3 * time.Millisecond, Session: "s1", Quota: 1000}
	s := FromWorker(base)
	if s.Earning() || !strings.Contains(s.Reason, "no experts assigned yet within the 1.00 kB quota") || s.RTT != 3*time.Millisecond {
		t.Fatalf("no experts: %+v", s)
	}
	held := base
	held.Experts = 3
	if s := FromWorker(held); !s.Earning() {
		t.Fatalf("holding experts: %+v", s)
	}
	dl := base
	dl.DownloadExpertsTotal = 4
	if s := FromWorker(dl); !s.Earning() {
		t.Fatalf("downloading its assignment: %+v", s)
	}
	noQuota := base
	noQuota.Quota = 0 // a slice served as it is: the holdings are its files
	if s := FromWorker(noQuota); !s.Earning() {
		t.Fatalf("no quota: %+v", s)
	}
	off := base
	off.State, off.Session = worker.StateDialing, ""
	if s := FromWorker(off); s.RTT != 0 || s.State == status.Connected {
		t.Fatalf("between sessions: %+v, want no round trip", s)
	}
}

// A worker dials wss://, or ws:// to this machine only: ws:// to another
// host would carry its signed upgrade and its work in clear.
func TestCheckGatewayURL(t *testing.T) {
	for _, ok := range []string{"wss://gate.example.net:443", "wss://gate.example.net/v1/worker", "ws://127.0.0.1:7001", "ws://localhost:9", "ws://[::1]:9"} {
		if err := CheckGatewayURL(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"https://x", "ws://gate.example.net:80", "ws://10.0.0.2:7001", "wss://", "gate:443", "wss://127.0.0.1:99999", "wss://gate.example.net:0", "wss://gate.example.net:http"} {
		if err := CheckGatewayURL(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}
