// Package demo runs a loopback swarm out of real processes: the hub, the
// gateway and the workers are the backbone binary's own subcommands
// (backbone hub, gateway, worker) started as children, and the backbone side
// (the dispatcher and the model) stays in the calling process. `backbone
// demo` and the swarm tests of package main use it: Run is the whole demo
// (a local and a swarm decode of the embedded tiny model, the ledger and
// the credits per worker), Serve the demo swarm behind the
// OpenAI-compatible API, Print the report; StartSwarm and Proc are the
// processes underneath.
//
// Every child is started with a parent-death signal where the OS has one
// (Linux: SIGTERM when the parent dies, even by SIGKILL), is stopped with
// SIGTERM and, after a grace period, SIGKILL, and is always waited for, so
// no child outlives its parent. Children bind port 0 on 127.0.0.1 and print
// the address they got; Proc.Await reads it from their log, so no port is
// ever fixed or guessed.
package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrExited is returned (wrapped) by Proc.Await when the process ended
// before printing the awaited line.
var ErrExited = errors.New("process exited")

// maxLines bounds the log lines a Proc keeps (the oldest are dropped).
const maxLines = 2000

// Proc is one child process whose stdout and stderr are read line by line:
// each line is kept (the last maxLines) and copied to the log writer with a
// "[name] " prefix.
type Proc struct {
	Name string
	cmd  *exec.Cmd

	mu      sync.Mutex
	lines   []string
	first   int           // index of lines[0] among all lines read
	changed chan struct{} // closed and replaced on each new line
	done    chan struct{} // closed once the process was waited for
	err     error         // Wait's result, valid after done
}

// Start starts bin with args as a child named name. Its output goes to log
// (nil: discarded) line by line. The child gets the parent's environment
// plus env ("KEY=value").
func Start(name string, log io.Writer, env []string, bin string, args ...string) (*Proc, error) {
	if log == nil {
		log = io.Discard
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = sysProcAttr()
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	pw.Close()
	p := &Proc{Name: name, cmd: cmd, changed: make(chan struct{}), done: make(chan struct{})}
	read := make(chan struct{})
	go func() {
		defer close(read)
		defer pr.Close()
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(log, prefixLine(name, line))
			p.mu.Lock()
			p.lines = append(p.lines, line)
			if len(p.lines) > maxLines {
				drop := len(p.lines) - maxLines
				p.lines = append(p.lines[:0:0], p.lines[drop:]...)
				p.first += drop
			}
			close(p.changed)
			p.changed = make(chan struct{})
			p.mu.Unlock()
		}
		// A grandchild holding the pipe would keep the scanner blocked; the
		// process's own exit is what done reports, so drain in the background.
		_, _ = io.Copy(io.Discard, pr)
	}()
	go func() {
		err := cmd.Wait()
		select { // the output of a process that exited is complete soon after
		case <-read:
		case <-time.After(2 * time.Second):
		}
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.done)
	}()
	return p, nil
}

// prefixLine is a child's output line as Start passes it on: "[name] line",
// or, for a JSON object (a role run with log-format "json"), the object
// with "role":name as its first field, so that the journal of `backbone
// up` stays JSON per line.
func prefixLine(name, line string) string {
	if strings.HasPrefix(line, "{") && strings.HasSuffix(line, "}") && json.Valid([]byte(line)) {
		role, _ := json.Marshal(name)
		if strings.TrimSpace(line[1:len(line)-1]) == "" {
			return `{"role":` + string(role) + `}`
		}
		return `{"role":` + string(role) + `,` + line[1:]
	}
	return "[" + name + "] " + line
}

// Pid is the child's process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the child has exited and been waited for.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Err is the child's exit error (nil for exit status 0); valid after Done.
func (p *Proc) Err() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Tail returns the last n log lines joined by newlines.
func (p *Proc) Tail(n int) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ls := p.lines
	if len(ls) > n {
		ls = ls[len(ls)-n:]
	}
	return strings.Join(ls, "\n")
}

// Await waits for the first log line (already read or to come) that re
// matches and returns its submatches. It fails when ctx ends or when the
// process exits first (ErrExited, with the last lines of its log).
func (p *Proc) Await(ctx context.Context, re *regexp.Regexp) ([]string, error) {
	next := 0 // index among all lines
	for {
		p.mu.Lock()
		if next < p.first {
			next = p.first
		}
		for ; next < p.first+len(p.lines); next++ {
			if m := re.FindStringSubmatch(p.lines[next-p.first]); m != nil {
				p.mu.Unlock()
				return m, nil
			}
		}
		ch := p.changed
		p.mu.Unlock()
		select {
		case <-ch:
		case <-p.done:
			// Lines read before the exit are checked once more above; only
			// then is the exit an error.
			p.mu.Lock()
			more := next < p.first+len(p.lines)
			p.mu.Unlock()
			if !more {
				return nil, fmt.Errorf("%w: %s (%v) before it was ready (its line /%s/); its log ends:\n%s", ErrExited, p.Name, p.Err(), re, p.Tail(20))
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("%s: gave up waiting for it to start: %w; its log ends:\n%s", p.Name, ctx.Err(), p.Tail(20))
		}
	}
}

// Stop asks the child to end (SIGTERM; where signals are not supported,
// it is killed), waits up to grace, then kills it and waits. It returns the
// child's exit error, nil when it exited with status 0 (a child killed by
// Stop's own SIGKILL reports the signal).
func (p *Proc) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return p.Err()
	default:
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	return p.Err()
}

// Signal sends sig to the child (e.g. os.Interrupt, as Ctrl-C would).
func (p *Proc) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

// Kill ends the child with SIGKILL (no chance to clean up) and waits for it.
func (p *Proc) Kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}
