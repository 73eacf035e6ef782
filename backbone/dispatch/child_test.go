package dispatch_test

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/x509"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// TestMain doubles as a worker process: with KVASIR_TEST_CHILD_WORKER set it
// runs only a worker (gateway URL, CA file, layers, compute delay from the
// environment) until killed.
func TestMain(m *testing.M) {
	if os.Getenv("KVASIR_TEST_CHILD_WORKER") == "1" {
		os.Exit(childWorker())
	}
	if os.Getenv("KVASIR_TEST_CHILD_TRUST") == "1" {
		os.Exit(trustChild())
	}
	os.Exit(m.Run())
}

func childWorker() int {
	pem, err := os.ReadFile(os.Getenv("KVASIR_CA"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	delay, _ := time.ParseDuration(os.Getenv("KVASIR_DELAY"))
	mdl := testModel()
	var layers []int
	for _, f := range strings.Split(os.Getenv("KVASIR_LAYERS"), ",") {
		var l int
		fmt.Sscan(f, &l)
		layers = append(layers, l)
	}
	comp := &fakeExperts{d: mdl.D, nExpert: mdl.NExpert, holds: holdsLayers(layers...), delay: delay,
		onCall: func() { fmt.Println("COMPUTING") }}
	_, key, _ := ed25519.GenerateKey(nil)
	w, err := worker.New(worker.Config{GatewayURL: os.Getenv("KVASIR_GATEWAY"), Key: key, RootCAs: pool,
		Computer: comp, Holdings: holdings(mdl, layers...), ModelID: mdl.ID, Backend: "fake", Logger: quiet})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go func() {
		for w.Stats().State != worker.StateConnected {
			time.Sleep(5 * time.Millisecond)
		}
		fmt.Println("CONNECTED")
	}()
	_ = w.Run(context.Background())
	return 0
}

// startChild runs a worker process and waits for it to connect; it returns
// the process and a channel of its stdout lines.
func (s *stack) startChild(t *testing.T, layers string, delay time.Duration) (*exec.Cmd, chan string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "KVASIR_TEST_CHILD_WORKER=1", "KVASIR_CA="+s.caFile,
		"KVASIR_GATEWAY="+s.url, "KVASIR_LAYERS="+layers, "KVASIR_DELAY="+delay.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	select {
	case l := <-lines:
		if l != "CONNECTED" {
			t.Fatalf("child said %q", l)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("child worker did not connect")
	}
	return cmd, lines
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
	cmd, _ := s.startChild(t, "0,1,2,3", 0)
	s.waitWorkers(t, 1)
	s.run(t, randomCall(t, m, rand.New(rand.NewPCG(31, 32)), 1, 3))
	states := socketStates(t, cmd.Process.Pid)
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
	cmd, lines := s.startChild(t, "0,1,2,3", 30*time.Second)
	s.waitWorkers(t, 1)
	go func() {
		for l := range lines {
			if l == "COMPUTING" {
				_ = cmd.Process.Signal(syscall.SIGKILL)
			}
		}
	}()
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
