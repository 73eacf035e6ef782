// Package up runs a whole single-host network from one configuration file
// (`backbone up --config FILE`): the backbone (`backbone serve`), the hub
// and the gateway, each a child process of the same binary started with
// --config FILE, so each reads its own table ([serve], [hub], [gateway]) of
// the file exactly as it would when run apart on another host.
//
// Up fills in only the addresses that tie the roles together and that the
// file leaves out: the hub's --backbone is the address the backbone's
// dispatcher listens on, the gateway's --hub the address the hub listens
// on, and the gateway's --secret-file the hub's. Roles start in that order,
// each once the one before printed its listening line, so port 0 works
// everywhere. Up stops them in the reverse order (the gateway cuts its
// splices, the hub settles and flushes every session into the ledger, the
// backbone drains its API) when its context ends or when any child exits,
// which is then an error.
package up

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/config"
	"github.com/kvasir-ai/kvasir/backbone/demo"
)

// Roles, in start order.
const (
	RoleServe   = "serve"
	RoleHub     = "hub"
	RoleGateway = "gateway"
)

// Config configures Run.
type Config struct {
	File string    // the network's TOML file (required)
	Bin  string    // the backbone binary the roles run as (os.Executable)
	Log  io.Writer // the children's output, each line prefixed "[role] " (nil: discarded)
	// Backbone says whether up runs the backbone (serve) itself; false runs
	// only hub and gateway, for a backbone on another host ([hub] backbone
	// must then name it).
	Backbone bool
	// StartTimeout bounds each role's start (model load included); default 5 min.
	StartTimeout time.Duration
	// GraceTimeout is how long each role may take to stop after SIGTERM
	// before it is killed; default 30 s.
	GraceTimeout time.Duration
	// Env is added to every child's environment ("KEY=value").
	Env []string
	// Started, if set, is called once every role listens.
	Started func(*Network)
}

// Network is the running network's addresses.
type Network struct {
	Dispatch string // the backbone's dispatch listener ("" without Backbone)
	Hub      string // the hub's LAN listener (also /metrics, /healthz, /readyz)
	Gateway  string // the gateway's public TLS listener
}

var (
	dispatchLine = regexp.MustCompile(`dispatch listening on (\S+)`)
	hubLine      = regexp.MustCompile(`hub: listening on (\S+),`)
	gatewayLine  = regexp.MustCompile(`gateway: listening on (\S+) \(TLS\)`)
)

// ErrRoleExited wraps the error Run returns when a role ended on its own.
var ErrRoleExited = errors.New("up: a role exited")

// Args returns the command line of each role up starts for the file's
// tables t (role -> keys) and the addresses known so far: --config FILE
// plus the flags that tie the roles together and that the file leaves out.
func Args(file, role string, t map[string]map[string]any, n Network) []string {
	args := []string{role, "--config", file}
	has := func(r, k string) bool { _, ok := t[r][k]; return ok }
	switch role {
	case RoleServe:
		if !has(RoleServe, "dispatch-listen") {
			addr := "127.0.0.1:7002"
			if b, ok := t[RoleHub]["backbone"].(string); ok && b != "" {
				addr = b
			}
			args = append(args, "--dispatch-listen", addr)
		}
	case RoleHub:
		if !has(RoleHub, "backbone") && n.Dispatch != "" {
			args = append(args, "--backbone", n.Dispatch)
		}
	case RoleGateway:
		if !has(RoleGateway, "hub") && n.Hub != "" {
			args = append(args, "--hub", n.Hub)
		}
		if !has(RoleGateway, "secret-file") {
			if s, ok := t[RoleHub]["secret-file"].(string); ok && s != "" {
				args = append(args, "--secret-file", s)
			}
		}
	}
	return args
}

// Tables reads the [serve], [hub] and [gateway] tables of file.
func Tables(file string) (map[string]map[string]any, error) {
	t := map[string]map[string]any{}
	for _, r := range []string{RoleServe, RoleHub, RoleGateway} {
		m, err := config.Table(file, r)
		if err != nil {
			return nil, err
		}
		t[r] = m
	}
	return t, nil
}

// Run starts the roles, calls cfg.Started, and supervises them until ctx
// ends (nil error) or a role exits (ErrRoleExited); either way it stops
// every role it started, in reverse order.
func Run(ctx context.Context, cfg Config) error {
	if cfg.File == "" {
		return errors.New("up: --config FILE is required")
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 5 * time.Minute
	}
	if cfg.GraceTimeout <= 0 {
		cfg.GraceTimeout = 30 * time.Second
	}
	t, err := Tables(cfg.File)
	if err != nil {
		return err
	}
	var procs []*demo.Proc
	defer func() {
		for i := len(procs) - 1; i >= 0; i-- {
			_ = procs[i].Stop(cfg.GraceTimeout)
		}
	}()
	var n Network
	start := func(role string, re *regexp.Regexp, addr *string) error {
		p, err := demo.Start(role, cfg.Log, cfg.Env, cfg.Bin, Args(cfg.File, role, t, n)...)
		if err != nil {
			return err
		}
		procs = append(procs, p)
		wctx, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
		defer cancel()
		m, err := p.Await(wctx, re)
		if err != nil {
			return fmt.Errorf("up: %s: %w", role, err)
		}
		*addr = m[1]
		return nil
	}
	if cfg.Backbone {
		if err := start(RoleServe, dispatchLine, &n.Dispatch); err != nil {
			return err
		}
	}
	if err := start(RoleHub, hubLine, &n.Hub); err != nil {
		return err
	}
	if err := start(RoleGateway, gatewayLine, &n.Gateway); err != nil {
		return err
	}
	if cfg.Started != nil {
		cfg.Started(&n)
	}
	exited := make(chan *demo.Proc, len(procs))
	for _, p := range procs {
		go func() { <-p.Done(); exited <- p }()
	}
	select {
	case <-ctx.Done():
		return nil
	case p := <-exited:
		why := "exit status 0: a role stops only when stopped"
		if err := p.Err(); err != nil {
			why = err.Error()
		}
		return fmt.Errorf("%w: %s (%s); its log ends:\n%s", ErrRoleExited, p.Name, why, p.Tail(20))
	}
}

// ErrRoleConfig: a role refused the settings the file gives it (its
// --print-config exited 2, a usage error: an unknown key, a bad value).
var ErrRoleConfig = errors.New("up: a role's settings are refused")

// PrintConfig writes what each role would run with (each role's own
// --print-config, with up's wiring flags) to w.
func PrintConfig(ctx context.Context, cfg Config, w io.Writer) error {
	t, err := Tables(cfg.File)
	if err != nil {
		return err
	}
	roles := []string{RoleHub, RoleGateway}
	if cfg.Backbone {
		roles = append([]string{RoleServe}, roles...)
	}
	// The addresses Run would fill in, as the file gives them (Run takes
	// the bound ones; they differ only for a port 0).
	var n Network
	if cfg.Backbone {
		n.Dispatch, _ = t[RoleServe]["dispatch-listen"].(string)
	}
	n.Hub, _ = t[RoleHub]["listen"].(string)
	var all []byte // printed only when every role's configuration is good
	for _, r := range roles {
		args := append(Args(cfg.File, r, t, n), "--print-config")
		out, err := exec.CommandContext(ctx, cfg.Bin, args...).CombinedOutput()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() == 2 {
			// The role refused its settings: its own words first.
			return fmt.Errorf("%w: [%s]: %s", ErrRoleConfig, r, strings.TrimSpace(string(out)))
		}
		if err != nil {
			return fmt.Errorf("up: %s --print-config: %v\n%s", r, err, out)
		}
		all = append(append(all, out...), '\n')
	}
	_, err = w.Write(all)
	return err
}
