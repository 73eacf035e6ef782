package run

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
)

// SwarmFlags are the dispatcher flags that generate, serve and demo share:
// the deadline floor, provisioning (issue 6), verification (issue 11), the
// model source and the holder wait (issue 12), hedging, row sums and idle
// spinning (issue 19).
type SwarmFlags struct {
	minDeadline time.Duration
	Provision   bool   // --provision
	rate        string // --provision-rate as given
	rateBytes   int64  // parsed by check: bytes/s, 0 unlimited

	probation int           // --check-probation
	checkRate float64       // --check-rate
	tolerance float64       // --check-tolerance
	banFile   string        // --ban-file
	banFor    time.Duration // --ban-for

	ModelSource string        // --model-source: URL workers fetch expert bytes from
	HolderWait  time.Duration // --holder-wait
	AllowPublic bool          // --dispatch-allow-public

	Verify dispatch.VerifyMode // --verify: spot | quorum (issue 20)
	Hedge  bool                // --hedge: latency-aware replica choice and hedged requests (issue 19)
	// RowSums is --row-sums (default true): rows whose experts one worker
	// holds are sent as DISPATCH_SUM and answered with their weighted sum
	// (under --verify quorum: rows two workers hold, one of them answering
	// with the DIGEST of the sum, DISPATCH_SUM_DIGEST).
	RowSums bool
	// SpinWait is --spin-wait: how long a call keeps the CPUs spinning
	// while it waits for workers (dispatch.Config.SpinWait; 0 off).
	SpinWait time.Duration
}

// AddSwarmFlags registers --min-deadline, --provision, --provision-rate,
// the --check-* and --ban-* flags, --model-source, --holder-wait,
// --verify, --hedge, --row-sums and --spin-wait on fs.
func AddSwarmFlags(fs *flag.FlagSet) *SwarmFlags {
	sf := &SwarmFlags{}
	fs.DurationVar(&sf.minDeadline, "min-deadline", 0, "with a swarm: lower bound of a worker request's adaptive deadline (0: dispatch's 50 ms; raise it on a loaded machine to keep slow answers remote)")
	fs.BoolVar(&sf.Provision, "provision", false, "with a swarm: provision workers started with --quota (and an empty --slice dir): assign them experts and send the experts' bytes from the model file")
	fs.StringVar(&sf.rate, "provision-rate", "0", "with --provision: bytes/s of expert data sent to one worker, with optional KiB/MiB/GiB suffix (0: unlimited)")
	fs.IntVar(&sf.probation, "check-probation", dispatch.DefaultProbation, "with a swarm: results of each worker session verified (recomputed locally) before sampling starts; 0: none")
	fs.Float64Var(&sf.checkRate, "check-rate", dispatch.DefaultCheckRate, "with a swarm: fraction of later results verified, drawn per request; 0: none")
	fs.Float64Var(&sf.tolerance, "check-tolerance", dispatch.DefaultTolerance, "with a swarm: relative bound per output row for workers declaring a non-CPU backend (CPU: exact bits); negative: accept CPU workers only")
	fs.StringVar(&sf.banFile, "ban-file", dispatch.DefaultBanFile(), "with a swarm: worker keys caught lying, kept across restarts (\"\": in memory only)")
	fs.DurationVar(&sf.banFor, "ban-for", dispatch.DefaultBanFor, "with a swarm: how long a worker key caught lying is refused")
	fs.StringVar(&sf.ModelSource, "model-source", "", "with --provision: http(s) URL of the full model GGUF; workers fetch their experts' byte ranges from it (a backbone-only --model: default its stored URL)")
	fs.Var((*verifyFlag)(&sf.Verify), "verify", "with a swarm: verification policy: spot (probation and random --check-rate checks: a liar is caught and loses its pay, an unchecked wrong answer is used) or quorum (every answer confirmed by a second holder under another key, or computed here: no single liar changes a token; 2x worker compute). Default spot; quorum is recommended for a public network (docs/accounting.md)")
	fs.BoolVar(&sf.Hedge, "hedge", false, "with a swarm: send each request to one of the fastest holders of its experts and, when it is later than that holder's recent p95, the same pairs to a second holder; the first valid answer is used (checked as any other), the other's RESULT is not paid (spot verification only)")
	fs.BoolVar(&sf.RowSums, "row-sums", true, "with a swarm: send a row whose k experts one worker holds to it as a DISPATCH_SUM, answered with the row's router-weighted sum (d floats instead of k x d; the same bits; under --verify quorum two full holders, the second answering with the sum's digest); false: every expert output travels")
	fs.DurationVar(&sf.SpinWait, "spin-wait", dispatch.DefaultSpinWait, "with a swarm: while a step waits for workers, keep every CPU spinning at idle priority (SCHED_IDLE: it yields to any other thread) for up to this long, so that the answer is read and the next layers computed on CPUs that never halted (issue 19: 1.5-2.7 ms less per 13 ms round trip on a virtual machine); only while recent calls waited 2 ms or more on average (a LAN's sub-ms round trips ran slower with spinning); 0: off, the CPUs sleep. Linux builds with cgo only")
	fs.BoolVar(&sf.AllowPublic, "dispatch-allow-public", false, "with a swarm: allow --dispatch-listen on a public address or on every interface; the hub's worker links to it are not authenticated (the hub vouches for each worker's key), so keep it on loopback or a private (LAN) address")
	fs.DurationVar(&sf.HolderWait, "holder-wait", dispatch.DefaultHolderWait, "with a swarm: how long a step waits for a worker holding an expert the backbone cannot compute (backbone-only model) before the request fails (serve: 503 with Retry-After)")
	return sf
}

// Check validates the parsed flags; the error names the bad flag.
func (sf *SwarmFlags) Check() error {
	n, err := ParseBytes(sf.rate)
	if err != nil {
		return fmt.Errorf("--provision-rate: %w", err)
	}
	sf.rateBytes = n
	if sf.ModelSource != "" && !strings.HasPrefix(sf.ModelSource, "http://") && !strings.HasPrefix(sf.ModelSource, "https://") {
		return fmt.Errorf("--model-source %q: want an http:// or https:// URL", sf.ModelSource)
	}
	if sf.ModelSource != "" && !sf.Provision {
		return errors.New("--model-source needs --provision")
	}
	if sf.SpinWait < 0 {
		return fmt.Errorf("--spin-wait %v: want >= 0 (0: off)", sf.SpinWait)
	}
	if sf.HolderWait <= 0 {
		return fmt.Errorf("--holder-wait %v: want > 0", sf.HolderWait)
	}
	switch {
	case sf.probation < 0:
		return fmt.Errorf("--check-probation %d: want >= 0", sf.probation)
	case !(sf.checkRate >= 0 && sf.checkRate <= 1): // NaN too
		return fmt.Errorf("--check-rate %g: want a fraction in [0, 1] (0: no checks after probation)", sf.checkRate)
	case math.IsNaN(sf.tolerance) || math.IsInf(sf.tolerance, 0) || sf.tolerance == 0 || sf.tolerance > dispatch.MaxTolerance:
		return fmt.Errorf("--check-tolerance %g: want a relative error in (0, %g], or negative to accept CPU workers only", sf.tolerance, dispatch.MaxTolerance)
	case sf.banFor <= 0:
		return fmt.Errorf("--ban-for %v: want > 0", sf.banFor)
	}
	return nil
}

// config is the SwarmConfig of the flags for a dispatcher on listen
// logging to log; the caller adds Workers and Listening.
func (sf *SwarmFlags) Config(listen string, log *slog.Logger) SwarmConfig {
	return SwarmConfig{Listen: listen, AllowPublic: sf.AllowPublic, Logger: log, MinDeadline: sf.minDeadline,
		Provision: sf.Provision, ProvisionRate: sf.rateBytes, Source: sf.ModelSource, HolderWait: sf.HolderWait, Tune: sf.tune}
}

// tune sets the verification flags on the dispatcher's configuration (0
// means "none" on the command line, a default in dispatch.Config).
func (sf *SwarmFlags) tune(c *dispatch.Config) {
	c.Probation, c.CheckRate, c.Tolerance = sf.probation, sf.checkRate, sf.tolerance
	if sf.probation == 0 {
		c.Probation = -1
	}
	if sf.checkRate == 0 {
		c.CheckRate = -1
	}
	c.BanFile, c.BanFor = sf.banFile, sf.banFor
	c.Verify = sf.Verify
	c.Hedge = sf.Hedge
	c.NoRowSums = !sf.RowSums
	c.SpinWait = sf.SpinWait
	if sf.SpinWait == 0 {
		c.SpinWait = -1
	}
}

// announceListening returns a SwarmConfig.Listening that prints "CMD:
// dispatch listening on HOST:PORT (model id ...)" to w (the line tests and
// scripts wait for).
func AnnounceListening(w io.Writer, cmd string, lm *Model) func(addr string) {
	return func(addr string) {
		fmt.Fprintf(w, "%s: dispatch listening on %s (model id %q)\n", cmd, addr, lm.ID())
	}
}

// verifyFlag is --verify as a flag.Value, so that --print-config and
// flag defaults show it: spot or quorum (dispatch.ParseVerifyMode).
type verifyFlag dispatch.VerifyMode

func (v *verifyFlag) String() string { return string(*v) }

func (v *verifyFlag) Set(s string) error {
	m, err := dispatch.ParseVerifyMode(s)
	*v = verifyFlag(m)
	return err
}
