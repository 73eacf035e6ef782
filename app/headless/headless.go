// Package headless is the contributor binary without a window: `kvasir
// --headless` runs the same node as the desktop app and prints a status
// line every few seconds, and `kvasir wallet [--json]` prints the local
// wallet. It does not import Fyne, so it builds and tests without X11/GL
// (and `go build -tags nogui .` gives a kvasir binary without them).
package headless

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/kvasir-ai/kvasir/app/instance"
	"github.com/kvasir-ai/kvasir/app/limits"
	"github.com/kvasir-ai/kvasir/app/node"
	"github.com/kvasir-ai/kvasir/app/status"
	"github.com/kvasir-ai/kvasir/engine/bytesize"
	"github.com/kvasir-ai/kvasir/wallet"
)

// Options configures Run.
type Options struct {
	Source   status.Source                        // the worker (usually a *status.Control over a node)
	Wallet   func() (wallet.Summary, error)       // nil: pending shows 0
	Governor *limits.Governor                     // nil: no limits
	Limit    func(reason string)                  // receives the governor's verdict (Control.SetLimit)
	Out      io.Writer                            // status lines
	Interval time.Duration                        // between lines; <= 0 means 5 s
	Now      func() time.Time                     // clock; nil = time.Now
	Tick     func(time.Duration) <-chan time.Time // ticker; nil = a time.Ticker (tests pass their own)
}

// Run prints one status line (status.Line) per Interval until ctx is done,
// with rates over the last interval, after checking the limits. The first
// line comes after the first interval. It returns ctx.Err() or the first
// write error.
func Run(ctx context.Context, o Options) error {
	if o.Interval <= 0 {
		o.Interval = 5 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	tick := o.Tick
	if tick == nil {
		t := time.NewTicker(o.Interval)
		defer t.Stop()
		tick = func(time.Duration) <-chan time.Time { return t.C }
	}
	c := tick(o.Interval)
	m := status.NewMeter(2)
	m.Add(o.Now(), o.Source.Stats())
	var last wallet.Summary // the wallet's last figures read
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-c:
		}
		if err := ctx.Err(); err != nil { // a tick racing the stop: the worker is already going down
			return err
		}
		if o.Governor != nil && o.Limit != nil {
			o.Limit(o.Governor.Check())
		}
		snap := o.Source.Stats()
		if err := ctx.Err(); err != nil {
			// The stop may have come between the check above and the
			// snapshot: a worker that shows "stopped" saw ctx end first,
			// so checking again after the snapshot never prints that line.
			return err
		}
		m.Add(o.Now(), snap)
		rows, bytes := m.Rate(0)
		var est, pending uint64
		walletNote := ""
		if o.Wallet != nil {
			if s, err := o.Wallet(); err == nil {
				est, pending = s.MeteredNKVR, s.PendingNKVR
				last = s
			} else {
				// The last figures read, and why they are not today's (a
				// full disk, a read-only folder): not "0.00000".
				est, pending = last.MeteredNKVR, last.PendingNKVR
				walletNote = " [wallet: " + err.Error() + "]"
			}
		}
		if _, err := fmt.Fprintln(o.Out, o.Now().Format("15:04:05"), status.Line(snap, rows, bytes, est, pending)+walletNote); err != nil {
			return err
		}
	}
}

// Main runs the contributor command line without a window; args exclude
// the program name. Forms:
//
//	kvasir --headless [--gateway wss://HOST:PORT] [--slice DIR] [--ca FILE] [--quota SIZE] [--cpu-limit PCT] [--interval 5s] ...
//	kvasir wallet [--json] [--by hour|day|session] [--data DIR]
//
// With no flags but --headless it runs as a first run of the app does
// (node.Config.WithDefaults): the public gateway, the slice folder in the
// data folder, the experts the backbone assigns within 4 GB.
//
// It returns the process exit code: 0 on a clean stop (SIGINT/SIGTERM or
// --duration elapsed), 1 on a runtime error, 2 on bad usage.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "wallet" {
		return walletMain(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("kvasir --headless", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Bool("headless", true, "run without a window (this mode)")
	gw := fs.String("gateway", node.DefaultGateway(), "gateway URL, wss://HOST:PORT (default: the network's public gateway, or $"+node.EnvDefaultGateway+")")
	slice := fs.String("slice", "", "expert slice folder (default: DATA/slice, kept within --quota, default 4GB)")
	ca := fs.String("ca", "", "PEM file of root CAs for the gateway (default: system roots)")
	data := fs.String("data", "", "data folder for identity and wallet (default: user config dir/kvasir)")
	threads := fs.Int("threads", 0, "compute threads (0 = all CPUs)")
	cpuLimit := fs.Int("cpu-limit", 100, "percent of this machine's CPU time the worker's process may use, 1-100: it works, then rests (100 = no limit)")
	interval := fs.Duration("interval", 5*time.Second, "status line interval")
	duration := fs.Duration("duration", 0, "stop after this long (0 = until interrupted)")
	battery := fs.Bool("pause-on-battery", false, "pause while running on battery")
	idle := fs.Bool("only-when-idle", false, "pause while other programs use more than a quarter of the CPUs")
	maxT := fs.Float64("max-temp", 0, "pause at this CPU temperature in °C (0 = no limit)")
	resT := fs.Float64("resume-temp", 0, "resume at this CPU temperature in °C (default max-temp - 10)")
	hoursFlag := fs.String("hours", "", "work only between these local times, HH:MM-HH:MM (e.g. 22:00-07:00; default: any time)")
	syncEvery := fs.Duration("sync", 30*time.Second, "how often to fetch credit statements from the gateway")
	quotaFlag := fs.String("quota", "", "disk quota for experts the backbone assigns, bytes with an optional suffix, e.g. 500MB or 4GB (KiB/MiB/GiB also read): "+
		"the worker keeps --slice DIR (may start empty) and downloads its assignment; unset: serve --slice as it is")
	backend := fs.String("backend", "auto", "where the experts are computed (a --slice served as it is or kept within --quota): auto (a GPU through Vulkan if there is one, else the CPU), cpu, vulkan or vulkan:N (device N, software drivers such as lavapipe included)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "kvasir: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	if *cpuLimit < 1 || *cpuLimit > 100 {
		fmt.Fprintf(stderr, "kvasir: --cpu-limit %d: want a percent from 1 to 100 (100 = no limit)\n", *cpuLimit)
		return 2
	}
	switch {
	case *interval <= 0:
		fmt.Fprintf(stderr, "kvasir: --interval %v: want a positive duration (5s)\n", *interval)
		return 2
	case *syncEvery <= 0:
		fmt.Fprintf(stderr, "kvasir: --sync %v: want a positive duration (30s)\n", *syncEvery)
		return 2
	case *threads < 0 || *threads > 4096:
		fmt.Fprintf(stderr, "kvasir: --threads %d: want 0 (all CPUs) to 4096\n", *threads)
		return 2
	case *maxT < 0 || *resT < 0 || (*maxT > 0 && *resT >= *maxT):
		fmt.Fprintf(stderr, "kvasir: --max-temp %v --resume-temp %v: want temperatures >= 0 (0 = no limit), resuming below the maximum\n", *maxT, *resT)
		return 2
	case *duration < 0:
		fmt.Fprintf(stderr, "kvasir: --duration %v: want >= 0 (0 = until interrupted)\n", *duration)
		return 2
	}
	hours, err := limits.ParseHours(*hoursFlag)
	if err != nil {
		fmt.Fprintf(stderr, "kvasir: --hours: %v\n", err)
		return 2
	}
	var quota uint64
	if *quotaFlag != "" {
		q, err := ParseBytes(*quotaFlag)
		if err != nil || q == 0 {
			fmt.Fprintf(stderr, "kvasir: --quota %q: want a positive byte count like 64MiB\n", *quotaFlag)
			return 2
		}
		quota = q
	}
	cfg, err := node.Config{GatewayURL: *gw, CAFile: *ca, SliceDir: *slice, QuotaBytes: quota, DataDir: *data, Threads: *threads, CPULimit: *cpuLimit, Warn: stderr, Backend: *backend,
		SyncEvery: *syncEvery, Logger: slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))}.WithDefaults()
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		if errors.Is(err, node.ErrConfig) {
			return 2 // a bad flag value, as the others
		}
		return 1
	}
	// One worker per data folder, GUI or headless: a second one would
	// share the identity and the wallet.
	lock, err := instance.Acquire(cfg.DataDir, nil)
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		if errors.Is(err, instance.ErrRunning) {
			return instance.ExitRunning
		}
		return 1
	}
	defer lock.Release()
	n, err := node.Open(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		if errors.Is(err, node.ErrConfig) {
			return 2
		}
		return 1
	}
	closed := false
	defer func() {
		if !closed {
			n.Close()
		}
	}()
	fmt.Fprintf(stdout, "kvasir worker %s\ngateway: %s\nslice: %s\ncompute: %s\n", n.Identity().Address, cfg.GatewayURL, n.Slice().Summary(), n.Device())
	if p := n.Problem(); p != "" {
		// The window waits for Settings; a headless worker cannot serve
		// until someone restarts it: say so and exit non-zero, so that a
		// supervisor sees it.
		fmt.Fprintln(stderr, "kvasir: cannot serve:", p)
		return 1
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if *duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *duration)
		defer cancel()
	}
	ctl := status.NewControl(n)
	gov := limits.NewGovernor(limits.Limits{PauseOnBattery: *battery, OnlyWhenIdle: *idle, MaxTempC: *maxT, ResumeTempC: *resT, Hours: hours}, limits.SysProbe{})
	done := make(chan struct{})
	go func() { defer close(done); _ = n.Run(ctx) }()
	err = Run(ctx, Options{Source: ctl, Wallet: n.Summary, Governor: gov, Limit: ctl.SetLimit, Out: stdout, Interval: *interval})
	<-done
	if err != nil && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
		fmt.Fprintln(stderr, "kvasir:", err)
		return 1
	}
	s, serr := n.Summary()
	if serr == nil {
		fmt.Fprintf(stdout, "stopped: served %s, earned≈%s, pending %s, credited %s\n", status.FormatBytes(s.BytesServed),
			status.FormatKVR(s.MeteredNKVR), status.FormatKVR(s.PendingNKVR), status.FormatKVR(s.CreditedNKVR))
	}
	// Closing writes the wallet's last counts: a full disk or a read-only
	// folder loses them, and the contributor is told (it was silent).
	closed = true
	if cerr := n.Close(); cerr != nil || serr != nil {
		fmt.Fprintln(stderr, "kvasir: stopping:", errors.Join(serr, cerr), "(the wallet's count of the last bytes served may be lost; the gateway's credit is not affected)")
		return 1
	}
	return 0
}

// ErrBytes wraps ParseBytes errors.
var ErrBytes = errors.New("headless: bad byte count")

// ParseBytes parses a byte count (engine/bytesize.Parse, the parser of
// the backbone's flags too): a non-negative number, decimals allowed, with
// an optional suffix B, KiB, MiB, GiB or TiB (powers of 1024) or KB, MB,
// GB, TB (powers of 1000). Errors wrap ErrBytes (also above 2^62).
func ParseBytes(s string) (uint64, error) {
	v, err := bytesize.Parse(s)
	if err != nil {
		return 0, fmt.Errorf("%w: %q", ErrBytes, s)
	}
	return uint64(v), nil
}

// walletMain is `kvasir wallet [--json] [--by hour|day|session] [--data
// DIR] [--gateway URL [--ca FILE]] [--no-fetch]`. Before it reports, it
// fetches new credit statements from the gateway the worker last worked
// through (node.LoadGateway; --gateway overrides it), so a wallet read
// after the window is closed shows the credits that arrived since. When
// the fetch fails it says so, and the figures are those of the last fetch.
func walletMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("kvasir wallet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "print JSON")
	by := fs.String("by", "hour", "group the history by hour, day or session (UTC)")
	data := fs.String("data", "", "data folder for identity and wallet (default: user config dir/kvasir)")
	gw := fs.String("gateway", "", "gateway URL to fetch new credit statements from first (default: the one the worker last used)")
	ca := fs.String("ca", "", "PEM file of root CAs for the gateway (default: the one saved with the gateway)")
	noFetch := fs.Bool("no-fetch", false, "report the wallet as it is on disk, without asking the gateway for new statements")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "kvasir wallet: unexpected arguments %q\n", fs.Args())
		return 2
	}
	groupBy, ok := map[string]wallet.GroupBy{"hour": wallet.ByHour, "day": wallet.ByDay, "session": wallet.BySession}[*by]
	if !ok {
		fmt.Fprintf(stderr, "kvasir: --by %q: want hour, day or session\n", *by)
		return 2
	}
	dataDir, err := node.DataDir(*data)
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		return 1
	}
	// A --data folder that does not exist is a typo, not a new wallet: it
	// would get a new identity and an empty wallet, and say nothing. (An
	// existing folder, or the default one, may start a wallet: a new
	// contributor reads its address this way.)
	if *data != "" {
		if st, err := os.Stat(dataDir); errors.Is(err, os.ErrNotExist) {
			fmt.Fprintf(stderr, "kvasir: no data folder %s (check --data; kvasir creates it when it first works there)\n", dataDir)
			return 1
		} else if err == nil && !st.IsDir() {
			fmt.Fprintf(stderr, "kvasir: --data %s is a file, not a folder (the folder that holds the identity and wallet.db)\n", dataDir)
			return 1
		}
	}
	fetch := struct {
		Gateway string `json:"gateway,omitempty"`
		New     int    `json:"new"`
		Error   string `json:"error,omitempty"`
	}{Gateway: *gw}
	caFile := *ca
	saved := false // the gateway and CA come from the data folder, not flags
	if fetch.Gateway == "" && !*noFetch {
		if g, err := node.LoadGateway(dataDir); err == nil {
			fetch.Gateway, saved = g.URL, true
			if caFile == "" {
				caFile = g.CAFile
			}
		} else if !errors.Is(err, os.ErrNotExist) {
			fmt.Fprintln(stderr, "kvasir:", err)
		}
	}
	if *noFetch {
		fetch.Gateway = ""
	}
	_, idErr := os.Stat(filepath.Join(dataDir, wallet.IdentityRecordName))
	fresh := errors.Is(idErr, os.ErrNotExist)
	n, err := node.Open(node.Config{DataDir: dataDir, GatewayURL: fetch.Gateway, CAFile: caFile, Warn: stderr})
	if err == nil && fresh {
		// The default folder of another user or HOME, or a forgotten
		// --data: say that this is a new wallet, not an empty old one.
		fmt.Fprintf(stderr, "kvasir: %s held no identity: a new one was made there, with an empty wallet "+
			"(if your wallet is elsewhere, give its folder with --data)\n", dataDir)
	}
	if err != nil && saved && errors.Is(err, node.ErrConfig) {
		// The saved gateway cannot be used (its CA file moved, or was
		// saved relative to another directory): no fetch, but the wallet's
		// own figures, as of the last fetch.
		fetch.Error = err.Error()
		fmt.Fprintf(stderr, "kvasir: warning: cannot fetch statements from the saved gateway %s (%s): %v; "+
			"reporting the figures of the last fetch (give --gateway and --ca, or start the worker once, to fetch)\n",
			fetch.Gateway, filepath.Join(dataDir, node.GatewayFile), err)
		n, err = node.Open(node.Config{DataDir: dataDir, Warn: stderr})
	}
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		return 1
	}
	defer n.Close()
	if fetch.Gateway != "" && fetch.Error == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		fetch.New, err = n.SyncNow(ctx)
		cancel()
		if err != nil {
			fetch.Error = err.Error()
			fmt.Fprintf(stderr, "kvasir: could not fetch statements from %s: %v\n", fetch.Gateway, err)
		}
	}
	s, err := n.Summary()
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		return 1
	}
	groups, err := n.Groups(groupBy, 0)
	if groups == nil {
		groups = []wallet.Group{} // "groups": [] in JSON, as "history" is
	}
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		return 1
	}
	if *asJSON {
		out := struct {
			wallet.Summary
			Fetch  any            `json:"fetch,omitempty"`
			Groups []wallet.Group `json:"groups"`
		}{Summary: s, Groups: groups}
		if fetch.Gateway != "" {
			out.Fetch = fetch
		}
		err = wallet.WriteJSON(stdout, out)
	} else {
		switch {
		case *noFetch:
			fmt.Fprintln(stdout, "Statements: not fetched (--no-fetch); figures as of the last fetch")
		case fetch.Gateway == "":
			fmt.Fprintln(stdout, "Statements: not fetched (no gateway saved or given); figures as of the last fetch")
		case fetch.Error != "":
			fmt.Fprintf(stdout, "Statements: could not fetch from %s; figures as of the last fetch\n", fetch.Gateway)
		default:
			fmt.Fprintf(stdout, "Statements: fetched from %s, %d new\n", fetch.Gateway, fetch.New)
		}
		if err = wallet.WriteText(stdout, s); err == nil {
			err = wallet.WriteGroups(stdout, groups)
		}
	}
	if err != nil {
		fmt.Fprintln(stderr, "kvasir:", err)
		return 1
	}
	return 0
}
