package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/run"
)

// swarmFlags are the dispatcher flags that generate, serve and demo share:
// the deadline floor and provisioning (issue 6).
type swarmFlags struct {
	minDeadline time.Duration
	provision   bool
	rate        string // --provision-rate as given
	rateBytes   int64  // parsed by check: bytes/s, 0 unlimited
}

// addSwarmFlags registers --min-deadline, --provision and --provision-rate
// on fs.
func addSwarmFlags(fs *flag.FlagSet) *swarmFlags {
	sf := &swarmFlags{}
	fs.DurationVar(&sf.minDeadline, "min-deadline", 0, "with a swarm: lower bound of a worker request's adaptive deadline (0: dispatch's 50 ms; raise it on a loaded machine to keep slow answers remote)")
	fs.BoolVar(&sf.provision, "provision", false, "with a swarm: provision workers started with --quota (and an empty --slice dir): assign them experts and send the experts' bytes from the model file")
	fs.StringVar(&sf.rate, "provision-rate", "0", "with --provision: bytes/s of expert data sent to one worker, with optional KiB/MiB/GiB suffix (0: unlimited)")
	return sf
}

// check validates the parsed flags; the error names the bad flag.
func (sf *swarmFlags) check() error {
	n, err := parseBytes(sf.rate)
	if err != nil {
		return fmt.Errorf("--provision-rate: %w", err)
	}
	sf.rateBytes = n
	return nil
}

// config is the run.SwarmConfig of the flags for a dispatcher on listen
// logging to log; the caller adds Workers and Listening.
func (sf *swarmFlags) config(listen string, log *slog.Logger) run.SwarmConfig {
	return run.SwarmConfig{Listen: listen, Logger: log, MinDeadline: sf.minDeadline,
		Provision: sf.provision, ProvisionRate: sf.rateBytes}
}

// announceListening returns a run.SwarmConfig.Listening that prints "CMD:
// dispatch listening on HOST:PORT (model id ...)" to w (the line tests and
// scripts wait for).
func announceListening(w io.Writer, cmd string, lm *run.Model) func(addr string) {
	return func(addr string) {
		fmt.Fprintf(w, "%s: dispatch listening on %s (model id %q)\n", cmd, addr, lm.ID())
	}
}
