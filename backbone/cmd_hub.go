package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/config"
	"github.com/kvasir-ai/kvasir/backbone/health"
	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/backbone/ledger"
	"github.com/kvasir-ai/kvasir/backbone/pgstore"
)

func init() {
	register("hub", "LAN-only bridge from the gateway's worker sessions to the backbone, metering bytes", runHub)
}

// runHub: backbone hub --listen 127.0.0.1:7001 --backbone 127.0.0.1:7002
// [--secret-file F [--create-secret]] [--ledger FILE|postgres://...] [--allow-public]
// [--settle 30s] [--settle-results 64]. Prometheus metrics are on the
// listener's /metrics, liveness and readiness on /healthz and /readyz
// (ready: the ledger answers and the backbone's dispatch listener accepts).
func runHub(args []string) int {
	fs := flag.NewFlagSet("hub", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7001", "address to listen on (loopback or private unless --allow-public)")
	backbone := fs.String("backbone", "127.0.0.1:7002", "the backbone's dispatch listener (host:port)")
	secretFile := fs.String("secret-file", "", "shared gateway secret (hex); env KVASIR_HUB_SECRET_FILE; default "+hub.DefaultSecretFile())
	createSecret := fs.Bool("create-secret", false, "create the secret file (random, 0600) when it is missing; without it a missing file is an error (copy the file from the host that created it)")
	spillFile := fs.String("spill-file", "", "where the ledger rows a stopping hub could not append are kept, and appended at the next start (default: the SQLite ledger's path + \".unappended\", or hub-ledger.unappended in the working directory for PostgreSQL)")
	ledgerFile := fs.String("ledger", "hub-ledger.sqlite", "contribution ledger: an SQLite file, or a postgres:// URL of a database several hubs share (password: PGPASSWORD or ~/.pgpass); \"\" to keep counts in memory only")
	allowPublic := fs.Bool("allow-public", false, "allow listening on a public address")
	settle := fs.Duration("settle", hub.DefaultSettleDelay, "hold creditable bytes back from the ledger this long (a verification failure forfeits what is held; docs/accounting.md); 0: none")
	logs := addLogFlags(fs)
	settleResults := fs.Int("settle-results", hub.DefaultSettleResults, "and until this many RESULTs of the session followed them, or --settle passed without a RESULT (paused or idle); 0: none")
	if err := config.Parse(fs, "hub", args, os.Stdout); err != nil {
		if errors.Is(err, config.ErrPrinted) || errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *settle < 0 || *settleResults < 0 {
		fmt.Fprintln(os.Stderr, "hub: --settle and --settle-results must not be negative")
		return 2
	}
	log, err := logs.logger(os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, errLine("hub", err))
		return 2
	}
	if err := hub.CheckListenAddr(*listen, *allowPublic); errors.Is(err, hub.ErrPublic) {
		// Before touching any file: a public address is a flag mistake.
		fmt.Fprintf(os.Stderr, "%v; pass --allow-public to listen there anyway\n", err)
		return 1
	}
	secret, err := loadSecret(*secretFile, *createSecret)
	if err != nil {
		fmt.Fprintln(os.Stderr, errLine("hub", err))
		return 1
	}
	checks := []health.Check{health.Dial("backbone", *backbone)}
	var hubRef atomic.Pointer[hub.Hub] // for the ledger check, once made
	cfg := hub.Config{Listen: *listen, Backbone: *backbone, Secret: secret, AllowPublic: *allowPublic,
		SettleDelay: *settle, SettleResults: *settleResults, Extra: map[string]http.Handler{}, Logger: log}
	if *ledgerFile != "" {
		l, err := ledger.Open(*ledgerFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, errLine("hub", err))
			return 1
		}
		defer l.Close()
		fmt.Fprintf(os.Stderr, "hub: ledger on %s (%s)\n", l.Store().Kind(), pgstore.RedactPath(*ledgerFile))
		if v := l.UpgradedFrom(); v > 0 {
			fmt.Fprintf(os.Stderr, "hub: ledger upgraded from schema %d to %d (rows now keep their number in their session; an older kvasir no longer opens it)\n", v, ledger.SchemaVersion)
		}
		cfg.Meter = l
		cfg.SpillFile = *spillFile
		if cfg.SpillFile == "" {
			cfg.SpillFile = *ledgerFile + ".unappended"
			if pgstore.IsURL(*ledgerFile) {
				cfg.SpillFile = "hub-ledger.unappended"
			}
		}
		cfg.Extra[ledger.Path] = ledger.Handler(l, func(r *http.Request) bool { return hub.Authorized(r, secret) })
		checks = append(checks, health.Check{Name: "ledger", Fn: func(context.Context) error {
			if _, err := l.LastID(); err != nil {
				return err
			}
			if hh := hubRef.Load(); hh != nil {
				return hh.LedgerError() // reads work, appends fail: a full disk
			}
			return nil
		}})
	} else {
		fmt.Fprintln(os.Stderr, "hub: --ledger \"\": counts are kept in memory only; nothing reaches a ledger, so no worker is credited for this hub's sessions")
	}
	for p, h := range health.Handlers(checks...) {
		cfg.Extra[p] = h
	}
	h, err := hub.New(cfg)
	if err == nil {
		hubRef.Store(h)
		err = h.Start()
	}
	if errors.Is(err, hub.ErrPublic) {
		fmt.Fprintf(os.Stderr, "%v; pass --allow-public to listen there anyway\n", err)
		return 1
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(os.Stderr, "hub: listening on %s, backbone %s (metrics: http://%s%s)\n", h.Addr(), *backbone, h.Addr(), hub.MetricsPath)
	t := time.NewTicker(30 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			fmt.Fprintln(os.Stderr, "hub: stopping (signal): settling and flushing open sessions")
			if err := h.Close(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			return 0
		case <-t.C:
			open := 0
			for _, s := range h.Sessions() {
				if !s.Ended {
					open++
				}
			}
			fmt.Fprintf(os.Stderr, "hub: %d open sessions\n", open)
		}
	}
}

// loadSecret reads the gateway<->hub secret from path, $KVASIR_HUB_SECRET_FILE
// or the default file. A missing file is created only with create
// (--create-secret); otherwise it is an error naming the path.
func loadSecret(path string, create bool) ([]byte, error) {
	if path == "" {
		path = os.Getenv("KVASIR_HUB_SECRET_FILE")
	}
	if path == "" {
		path = hub.DefaultSecretFile()
	}
	if create {
		return hub.LoadOrCreateSecret(path)
	}
	return hub.LoadSecret(path)
}
