package swarmtest

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// linkEnv, set in a child's environment to "TARGET ONEWAY_NS", makes the
// running binary a Link process (NewProcLink) before its main or TestMain
// runs.
const linkEnv = "KVASIR_SWARMTEST_LINK"

func init() {
	if v := os.Getenv(linkEnv); v != "" {
		os.Exit(linkChild(v, os.Stdin, os.Stdout))
	}
}

// ProcLink is a Link run in a child process: the running binary (a test
// binary importing this package) started again with linkEnv set. The
// benchmarks' round trips use it: a Link in the process under test sleeps
// each chunk's delay in a blocking nanosleep (sleepUntil), and a Go thread
// in a system call keeps its P (scheduler slot) until the runtime's
// monitor takes it back, so on a 2-CPU machine the link's sleeps took the
// Ps that the dispatcher, hub, gateway and workers needed, adding
// milliseconds to every round trip that carried many chunks (a quorum
// step at 64 rows: 22-25 ms with the link in the process, 18 ms with
// GOMAXPROCS=8; docs/BENCHMARKS.md, "Quorum"). A wide-area link is not in
// the backbone's process, and now it is not in the benchmark's either.
// The child runs with GOMAXPROCS 32 for the same reason: its sleeping
// writers must not keep its readers from stamping the chunks they read.
type ProcLink struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	addr string

	mu     sync.Mutex // one request to the child at a time
	closed bool
}

// NewProcLink starts a child process relaying connections accepted on
// Addr to target with oneWay of delay each way, as NewLink does in this
// process. Close stops it; the child also ends when this process does
// (its standard input closes).
func NewProcLink(target string, oneWay time.Duration) (*ProcLink, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d", linkEnv, target, oneWay.Nanoseconds()))
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &ProcLink{cmd: cmd, in: in, out: bufio.NewReader(out)}
	line, err := p.out.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "addr ") {
		in.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return nil, fmt.Errorf("swarmtest: link process: %q, %v", line, err)
	}
	p.addr = strings.TrimSpace(strings.TrimPrefix(line, "addr "))
	return p, nil
}

// Addr is the address to dial instead of the target.
func (p *ProcLink) Addr() string { return p.addr }

// ask sends one command line to the child and returns its answer line.
func (p *ProcLink) ask(cmd string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return "", errors.New("swarmtest: link process closed")
	}
	if _, err := io.WriteString(p.in, cmd+"\n"); err != nil {
		return "", err
	}
	line, err := p.out.ReadString('\n')
	return strings.TrimSpace(line), err
}

// askInt is ask for a number (0 on any error).
func (p *ProcLink) askInt(cmd string) int64 {
	s, err := p.ask(cmd)
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseInt(s, 10, 64)
	return v
}

// Conns is how many connections the link has accepted.
func (p *ProcLink) Conns() int64 { return p.askInt("conns") }

// RTTp50 is Link.RTTp50 of the child's link.
func (p *ProcLink) RTTp50() time.Duration { return time.Duration(p.askInt("rtt")) }

// ResetHolds is Link.ResetHolds of the child's link.
func (p *ProcLink) ResetHolds() { _, _ = p.ask("reset") }

// Close ends the child (its relayed connections close with it) and waits
// for it.
func (p *ProcLink) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.in.Close()
	p.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(5 * time.Second):
		_ = p.cmd.Process.Kill()
		return <-done
	}
}

// linkChild is the child's whole life: a Link to the target given in v
// ("TARGET ONEWAY_NS"), its address written to out, then one answer per
// command read from in (conns, rtt, reset) until in ends. It returns the
// exit status.
func linkChild(v string, in io.Reader, out io.Writer) int {
	runtime.GOMAXPROCS(32)
	target, ns, ok := strings.Cut(v, " ")
	oneWay, err := strconv.ParseInt(ns, 10, 64)
	if !ok || err != nil {
		fmt.Fprintf(os.Stderr, "swarmtest: link process: bad %s %q\n", linkEnv, v)
		return 2
	}
	l, err := NewLink(target, time.Duration(oneWay))
	if err != nil {
		fmt.Fprintf(os.Stderr, "swarmtest: link process: %v\n", err)
		return 1
	}
	defer l.Close()
	fmt.Fprintf(out, "addr %s\n", l.Addr())
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		switch sc.Text() {
		case "conns":
			fmt.Fprintf(out, "%d\n", l.Conns())
		case "rtt":
			fmt.Fprintf(out, "%d\n", l.RTTp50().Nanoseconds())
		case "reset":
			l.ResetHolds()
			fmt.Fprintln(out, "ok")
		default:
			fmt.Fprintln(out, "?")
		}
	}
	return 0
}
