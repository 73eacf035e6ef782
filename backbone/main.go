// Command backbone is kvasir's headless server: it generates and slices
// models, decodes, and runs the swarm roles (hub, gateway, worker, dispatch).
//
// Usage: backbone <command> [flags]. Each command lives in its own cmd_*.go
// file and registers itself in commands.
package main

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
)

// command is one backbone subcommand. run receives the arguments after the
// command name and returns the process exit code.
type command struct {
	summary string
	run     func(args []string) int
}

// commands is filled by the init functions of the cmd_*.go files.
var commands = map[string]command{}

func register(name, summary string, run func(args []string) int) {
	if _, dup := commands[name]; dup {
		panic("backbone: command registered twice: " + name)
	}
	commands[name] = command{summary: summary, run: run}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: backbone <command> [flags]\n\ncommands:")
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nRun 'backbone <command> -h' for the flags of one command.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		if len(os.Args) < 2 {
			os.Exit(2)
		}
		return
	}
	c, ok := commands[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "backbone: unknown command %q\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if daemons[os.Args[1]] {
		// A service whose log pipe is gone (its parent, `backbone up`,
		// killed with SIGKILL; a log collector restarted) must still shut
		// down in order: by default Go dies of SIGPIPE at the first write
		// to a closed stdout or stderr, before the hub's last flush, and
		// the open sessions' metered bytes never reach the ledger.
		// Ignored, such writes fail with EPIPE and the work goes on.
		signal.Ignore(syscall.SIGPIPE)
	}
	os.Exit(c.run(os.Args[2:]))
}

// daemons are the commands that run as services (under `backbone up`,
// systemd, a supervisor): they ignore SIGPIPE.
var daemons = map[string]bool{"hub": true, "gateway": true, "serve": true, "worker": true, "up": true}

// errLine is "cmd: err" for a command's error line on stderr, without a
// second "cmd: " when err's message already begins with it (the packages'
// errors name themselves: "hub: secret file ...").
func errLine(cmd string, err error) string {
	msg := err.Error()
	if strings.HasPrefix(msg, cmd+": ") {
		return msg
	}
	return cmd + ": " + msg
}

// parseExit is a command's exit code for its flag set's Parse error: 0
// after -h or --help (the usage was printed, as asked), 2 for a bad flag.
func parseExit(err error) int {
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	return 2
}
