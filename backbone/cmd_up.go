package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/config"
	"github.com/kvasir-ai/kvasir/backbone/up"
)

func init() {
	register("up", "a whole single-host network from one config file: backbone (serve) + hub + gateway", runUp)
}

// runUp: backbone up --config FILE [--backbone=false] [--start-timeout 5m]
// [--grace 30s] [--print-config]. The roles are child processes of this
// binary, each reading its own table of FILE (backbone/up).
func runUp(args []string) int {
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	backbone := fs.Bool("backbone", true, "run the backbone (backbone serve, table [serve]) too; false: only hub and gateway, [hub] backbone names a backbone elsewhere")
	startTimeout := fs.Duration("start-timeout", 5*time.Minute, "how long each role may take to start listening (model load included)")
	grace := fs.Duration("grace", 30*time.Second, "how long each role may take to settle and stop after SIGTERM")
	// --config is up's own file too: [up] sets these flags, [serve], [hub]
	// and [gateway] the roles'.
	printCfg := false
	var file string
	var upTable bytes.Buffer // [up] as --print-config prints it: written after the roles' checks pass
	err := config.Parse(fs, "up", args, &upTable)
	if errors.Is(err, config.ErrPrinted) {
		printCfg = true
	} else if err != nil {
		return parseExit(err)
	}
	file = fs.Lookup("config").Value.String()
	if file == "" || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "up: --config FILE is required (and no other arguments)")
		return 2
	}
	bin, err := os.Executable()
	if err != nil {
		fmt.Fprintln(os.Stderr, "up:", err)
		return 1
	}
	cfg := up.Config{File: file, Bin: bin, Log: os.Stderr, Backbone: *backbone, StartTimeout: *startTimeout, GraceTimeout: *grace,
		Started: func(n *up.Network) {
			dispatch := n.Dispatch
			if dispatch == "" {
				dispatch = "(not started here: --backbone=false)"
			}
			fmt.Fprintf(os.Stderr, "up: network running: gateway %s (TLS), hub %s, backbone dispatch %s\n", n.Gateway, n.Hub, dispatch)
		}}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var roles bytes.Buffer
	// Every role's configuration is checked (its own --print-config)
	// before anything starts: a typo in [hub] must not cost a model load.
	if err := up.PrintConfig(ctx, cfg, &roles); err != nil {
		fmt.Fprintln(os.Stderr, err)
		if errors.Is(err, up.ErrRoleConfig) {
			return 2 // a usage error, as a bad [up] key
		}
		return 1
	}
	if printCfg {
		// Printed only when every role's configuration is good.
		os.Stdout.Write(upTable.Bytes())
		os.Stdout.Write(roles.Bytes())
		return 0
	}
	if err := up.Run(ctx, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintln(os.Stderr, "up: stopped")
	return 0
}
