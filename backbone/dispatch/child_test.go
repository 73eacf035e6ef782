package dispatch_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
)

// TestMain doubles as a worker process: with KVASIR_TEST_CHILD_TRUST set it
// runs only a trust child (trust_child_test.go) until killed.
func TestMain(m *testing.M) {
	if os.Getenv("KVASIR_TEST_CHILD_TRUST") == "1" {
		os.Exit(trustChild())
	}
	os.Exit(m.Run())
}

// socketStates returns the TCP/UDP states ("0A" = LISTEN, "01" =
// ESTABLISHED, "udp" for any UDP socket) of the sockets pid owns, read from
// /proc/PID/fd and /proc/PID/net/{tcp,tcp6,udp,udp6}.
func socketStates(t *testing.T, pid int) []string {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		l, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(l, "socket:["), "]")] = true
		}
	}
	var states []string
	for _, f := range []string{"tcp", "tcp6", "udp", "udp6"} {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/%s", pid, f))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			if len(fs) < 10 || !inodes[fs[9]] {
				continue
			}
			if strings.HasPrefix(f, "udp") {
				states = append(states, "udp")
			} else {
				states = append(states, fs[3])
			}
		}
	}
	return states
}

// TestWorkerOpensNoListeningSocket runs a worker as its own process and
// inspects its sockets: connected through the gateway, nothing listening.
func TestWorkerOpensNoListeningSocket(t *testing.T) {
	m := testModel()
	s := newStack(t, m, 0, nil)
	key, _ := newKey()
	p := s.startTrustChild(t, childEnv(key, fakeSpec(m), "KVASIR_BACKEND", "fake"), true)
	s.waitWorkers(t, 1)
	s.run(t, randomCall(t, m, rand.New(rand.NewPCG(31, 32)), 1, 3))
	states := socketStates(t, p.cmd.Process.Pid)
	est := 0
	for _, st := range states {
		switch st {
		case "0A", "udp":
			t.Fatalf("worker process owns a listening/UDP socket: %v", states)
		case "01":
			est++
		}
	}
	if est == 0 {
		t.Fatalf("no ESTABLISHED socket found for the worker (states %v): inspection is broken", states)
	}
	// The check can fail: the test process itself listens (dispatcher, hub, gateway).
	self := socketStates(t, os.Getpid())
	if !strings.Contains(strings.Join(self, ","), "0A") {
		t.Fatalf("own listeners not seen: %v", self)
	}
}

// TestWorkerKilledMidStep: SIGKILL a worker process while it computes; the
// call finishes with the same numbers, bounded by the deadline.
func TestWorkerKilledMidStep(t *testing.T) {
	m := testModel()
	const maxDL = 2 * time.Second
	s := newStack(t, m, 0, func(c *dispatch.Config) { c.MaxDeadline = maxDL })
	key, _ := newKey()
	p := s.startTrustChild(t, childEnv(key, fakeSpec(m), "KVASIR_BACKEND", "fake", "KVASIR_DELAY", "30s"), true)
	s.waitWorkers(t, 1)
	killWhenComputing(p)
	el := s.run(t, randomCall(t, m, rand.New(rand.NewPCG(33, 34)), 3, 6))
	if el > maxDL {
		t.Fatalf("call took %v > deadline %v", el, maxDL)
	}
	st := s.disp.Stats()
	if st.ExpertsLocal != 12 || st.ExpertsRemote != 0 {
		t.Fatalf("local %d remote %d", st.ExpertsLocal, st.ExpertsRemote)
	}
	t.Logf("call finished %v after the worker was killed mid-compute", el)
}
