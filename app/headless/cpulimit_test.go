package headless

import (
	"bytes"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/swarmtest"
	"github.com/kvasir-ai/kvasir/engine/worker"
)

// cpuLimitChild is set in the environment of TestCPULimitInSwarm's
// child, which then runs `kvasir --headless` with the arguments in it
// (space-separated).
const cpuLimitChild = "KVASIR_HEADLESS_CPU_LIMIT_ARGS"

// TestCPULimitInSwarm runs `kvasir --headless --cpu-limit 10` in a child
// process against a loopback swarm (the real dispatcher, hub, gateway and
// crediting, on the hub's default settle rules) that keeps it busy, and
// checks how the swarm treats a worker that rests: the dispatcher saw it
// paused at times and never timed out a request of it nor got a late
// answer, the load never failed, the key is not banned, the session
// stayed up (one session, always "connected" in its status lines, with
// the limit shown). The child's CPU time, as
// the kernel accounts it to the parent (rusage of the exited child), stays
// within the limit plus the documented excess and its start-up (opening
// the wallet and the slice happens before the worker and its limit
// exist).
func TestCPULimitInSwarm(t *testing.T) {
	if args := os.Getenv(cpuLimitChild); args != "" {
		os.Exit(Main(strings.Fields(args), os.Stdout, os.Stderr))
	}
	if testing.Short() {
		t.Skip("starts a loopback swarm and a worker process")
	}
	const pct, run = 10, 6 * time.Second
	sw, err := swarmtest.Start(t.TempDir(), 200*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer sw.Close()
	sw.Load(256, 5*time.Millisecond)
	args := []string{"--headless", "--gateway", sw.URL, "--ca", sw.CAFile, "--slice", sw.SliceDir, "--data", t.TempDir(),
		"--cpu-limit", strconv.Itoa(pct), "--interval", "500ms", "--duration", run.String()}
	cmd := exec.Command(os.Args[0], "-test.run=^TestCPULimitInSwarm$")
	cmd.Env = append(os.Environ(), cpuLimitChild+"="+strings.Join(args, " "), "DBUS_SESSION_BUS_ADDRESS=unix:path=/nonexistent")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	pausedSeen, samples := 0, 0
	for waiting := true; waiting; {
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("child: %v\n%s", err, stderr.String())
			}
			waiting = false
		case <-time.After(50 * time.Millisecond):
			for _, w := range sw.Disp.Stats().Workers {
				if w.Connected {
					samples++
					if w.Paused {
						pausedSeen++
					}
				}
			}
		}
	}
	wall := time.Since(start)
	cpu := cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	frac := cpu.Seconds() / wall.Seconds() / float64(runtime.NumCPU())
	st := sw.Disp.Stats()
	t.Logf("child: %.2f CPU s in %.2f s = %.1f%% of %d cores (limit %d%%); dispatcher saw it paused in %d of %d samples; %d load calls, %d failed",
		cpu.Seconds(), wall.Seconds(), 100*frac, runtime.NumCPU(), pct, pausedSeen, samples, sw.Calls.Load(), sw.Errors.Load())
	t.Logf("child output:\n%s", stdout.String())
	if len(st.Workers) != 1 {
		t.Fatalf("%d worker sessions, want 1: %+v", len(st.Workers), st.Workers)
	}
	w := st.Workers[0]
	t.Logf("worker: %d requests, %d results, %d timeouts, %d late, p50 %.1f ms, p99 %.1f ms, compute p50 %.2f ms",
		w.Requests, w.Results, w.Timeouts, w.Late, w.RTTp50ms, w.RTTp99ms, w.ComputeP50ms)
	if w.Results == 0 || w.Timeouts != 0 || w.Late != 0 || w.Mismatches != 0 || sw.Errors.Load() != 0 {
		t.Errorf("worker %+v; load errors %d", w, sw.Errors.Load())
	}
	if pausedSeen == 0 {
		t.Errorf("the dispatcher never saw the limited worker resting (%d samples)", samples)
	}
	if bans := sw.Disp.Bans().List(time.Now()); len(bans) != 0 {
		t.Errorf("banned: %+v", bans)
	}
	connected := 0
	for _, l := range strings.Split(stdout.String(), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 || !strings.Contains(l, " gw=") {
			continue
		}
		if f[1] == "connected" {
			connected++
			if !strings.Contains(l, "cpu-limit=10%") {
				t.Errorf("line without the limit: %q", l)
			}
		} else if connected > 0 {
			t.Errorf("after connecting: %q", l)
		}
	}
	if connected == 0 {
		t.Errorf("never connected:\n%s", stdout.String())
	}
	rate := float64(pct) / 100 * float64(runtime.NumCPU())
	if bound := rate*(wall.Seconds()+worker.MinRest.Seconds()) + 0.5; cpu.Seconds() > bound {
		t.Errorf("child used %.2f CPU s in %.2f s, the limit allows %.2f (with 0.5 s for start-up)", cpu.Seconds(), wall.Seconds(), bound)
	}
}
