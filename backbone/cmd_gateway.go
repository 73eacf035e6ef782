package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/config"
	"github.com/kvasir-ai/kvasir/backbone/gateway"
	"github.com/kvasir-ai/kvasir/backbone/hub"
)

func init() {
	register("gateway", "public TLS endpoint: authenticates workers and splices them to the hub", runGateway)
}

// runGateway: backbone gateway --listen 127.0.0.1:8443 --hub 127.0.0.1:7001
// (--tls-cert C --tls-key K | --self-signed-out DIR) [--secret-file F]
// [--wallets FILE|postgres://...] [--metrics-listen 127.0.0.1:9102].
func runGateway(args []string) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8443", "TLS address to listen on (443 in production)")
	hubAddr := fs.String("hub", "127.0.0.1:7001", "the hub (host:port)")
	certFile := fs.String("tls-cert", "", "PEM certificate chain")
	keyFile := fs.String("tls-key", "", "PEM private key")
	selfOut := fs.String("self-signed-out", "", "write a self-signed pair (gateway.crt, gateway.key) to DIR and use it (tests, demo)")
	hosts := fs.String("self-signed-hosts", "127.0.0.1,::1,localhost", "comma-separated names/IPs for --self-signed-out")
	secretFile := fs.String("secret-file", "", "shared hub secret (hex), the hub's file; env KVASIR_HUB_SECRET_FILE; default as for hub")
	createSecret := fs.Bool("create-secret", false, "create the secret file when missing (only where hub and gateway share a host; a missing file is otherwise an error)")
	credits := addCreditFlags(fs) // --wallets, --rate-nkvr-per-byte (cmd_ledger.go)
	metricsListen := fs.String("metrics-listen", "", "serve Prometheus metrics on http://ADDR/metrics (a loopback or private address; \"\": off; never on the public TLS listener)")
	if err := config.Parse(fs, "gateway", args, os.Stdout); err != nil {
		if errors.Is(err, config.ErrPrinted) {
			return 0
		}
		return 2
	}
	if *selfOut != "" {
		c, k, err := gateway.WriteSelfSigned(*selfOut, strings.Split(*hosts, ",")...)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gateway:", err)
			return 1
		}
		*certFile, *keyFile = c, k
		fmt.Fprintf(os.Stderr, "gateway: self-signed certificate %s (workers: --ca %s)\n", c, c)
	}
	if *certFile == "" || *keyFile == "" {
		fmt.Fprintln(os.Stderr, "gateway: --tls-cert and --tls-key (or --self-signed-out DIR) are required")
		return 2
	}
	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "gateway: --tls-cert %s / --tls-key %s: %v\n", *certFile, *keyFile, err)
		return 1
	}
	secret, err := loadSecret(*secretFile, *createSecret)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		return 1
	}
	reg := prometheus.NewRegistry()
	credits.registry = reg
	extra, stopCredit, err := credits.start(context.Background(), *hubAddr, secret, func(f string, a ...any) { fmt.Fprintf(os.Stderr, "gateway: "+f+"\n", a...) })
	if err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		return 1
	}
	defer stopCredit()
	g, err := gateway.New(gateway.Config{Listen: *listen, HubURL: *hubAddr, Secret: secret,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}}, Extra: extra, Registry: reg})
	if err == nil {
		err = g.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if *metricsListen != "" {
		if err := hub.CheckListenAddr(*metricsListen, false); err != nil {
			fmt.Fprintln(os.Stderr, "gateway: --metrics-listen:", err)
			return 1
		}
		ln, err := net.Listen("tcp", *metricsListen)
		if err != nil {
			fmt.Fprintln(os.Stderr, "gateway: --metrics-listen:", err)
			return 1
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", g.MetricsHandler())
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = msrv.Serve(ln) }()
		defer msrv.Close()
		fmt.Fprintf(os.Stderr, "gateway: metrics on http://%s/metrics\n", ln.Addr())
	}
	fmt.Fprintf(os.Stderr, "gateway: listening on %s (TLS), hub %s\n", g.Addr(), *hubAddr)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	_ = g.Close()
	return 0
}
