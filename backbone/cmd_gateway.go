package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/acme/autocert"

	"github.com/kvasir-ai/kvasir/backbone/config"
	"github.com/kvasir-ai/kvasir/backbone/gateway"
	"github.com/kvasir-ai/kvasir/backbone/health"
	"github.com/kvasir-ai/kvasir/backbone/hub"
)

func init() {
	register("gateway", "public TLS endpoint: authenticates workers and splices them to the hub", runGateway)
}

// runGateway: backbone gateway --listen 127.0.0.1:8443 --hub 127.0.0.1:7001
// (--tls-cert C --tls-key K | --self-signed-out DIR | --acme-domain NAME
// [--acme-cache DIR] [--acme-directory URL] [--acme-email E] [--acme-ca PEM])
// [--secret-file F [--create-secret]] [--wallets FILE|postgres://...]
// [--metrics-listen 127.0.0.1:9102] [--handshake-timeout 10s]
// [--max-handshakes 256] [--max-handshakes-per-address 8] [--idle-timeout 90s]
// [--log-format text|json]. The metrics listener also serves /healthz and
// /readyz (ready: the hub accepts connections; with --wallets, the wallets
// store and the hub's ledger answer; with ACME, the certificate is
// obtained).
func runGateway(args []string) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:8443", "TLS address to listen on (443 in production; ACME's TLS-ALPN-01 validates there)")
	hubAddr := fs.String("hub", "127.0.0.1:7001", "the hub (host:port)")
	certFile := fs.String("tls-cert", "", "PEM certificate chain")
	keyFile := fs.String("tls-key", "", "PEM private key")
	selfOut := fs.String("self-signed-out", "", "use the self-signed pair DIR/gateway.crt, DIR/gateway.key, kept across restarts while valid for the hosts; a new one is written when they are missing, damaged, expire within 7 days or miss a host (tests, demo)")
	hosts := fs.String("self-signed-hosts", "127.0.0.1,::1,localhost", "comma-separated names/IPs for --self-signed-out")
	publicNames := fs.String("public-name", "", "comma-separated host names workers reach this gateway by, beside its certificate's names (a proxy or CDN in front with another certificate): a worker's upgrade signature names the host it dialled, and one for another host is refused")
	acmeDomain := fs.String("acme-domain", "", "obtain and renew the certificate by ACME (TLS-ALPN-01 on --listen) for these comma-separated names; workers then need no --ca")
	acmeCache := fs.String("acme-cache", defaultACMECache(), "with --acme-domain: directory keeping the ACME account key and certificates across restarts")
	acmeDir := fs.String("acme-directory", "https://acme-v02.api.letsencrypt.org/directory", "with --acme-domain: the ACME server's directory URL (Let's Encrypt; its staging server for trials)")
	acmeEmail := fs.String("acme-email", "", "with --acme-domain: contact address for the CA's expiry notices (optional)")
	acmeCA := fs.String("acme-ca", "", "with --acme-domain: PEM roots trusted for the ACME server's own HTTPS instead of the system's (a test CA such as pebble)")
	secretFile := fs.String("secret-file", "", "shared hub secret (hex), the hub's file; env KVASIR_HUB_SECRET_FILE; default as for hub")
	createSecret := fs.Bool("create-secret", false, "create the secret file when missing (only where hub and gateway share a host; a missing file is otherwise an error)")
	credits := addCreditFlags(fs) // --wallets, --rate-nkvr-per-byte (cmd_ledger.go)
	metricsListen := fs.String("metrics-listen", "", "serve Prometheus metrics on http://ADDR/metrics, and /healthz, /readyz (a loopback or private address; \"\": off; never on the public TLS listener)")
	hsTimeout := fs.Duration("handshake-timeout", gateway.DefaultHandshakeTimeout, "close a connection whose TLS handshake takes longer")
	maxHS := fs.Int("max-handshakes", gateway.DefaultMaxHandshakes, "TLS handshakes in progress at once, all addresses together; more are closed at once")
	maxHSAddr := fs.Int("max-handshakes-per-address", gateway.DefaultMaxHandshakesPerIP, "TLS handshakes in progress at once from one IP address")
	idle := fs.Duration("idle-timeout", 90*time.Second, "close a worker session after this long without bytes in a direction (> the worker's 20 s ping)")
	logs := addLogFlags(fs)
	if err := config.Parse(fs, "gateway", args, os.Stdout); err != nil {
		if errors.Is(err, config.ErrPrinted) || errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	log, err := logs.logger(os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, errLine("gateway", err))
		return 2
	}
	switch {
	case *maxHS < 1:
		fmt.Fprintf(os.Stderr, "gateway: --max-handshakes %d: want 1 or more\n", *maxHS)
		return 2
	case *maxHSAddr < 1:
		fmt.Fprintf(os.Stderr, "gateway: --max-handshakes-per-address %d: want 1 or more\n", *maxHSAddr)
		return 2
	case *idle < 0 || *hsTimeout < 0:
		fmt.Fprintln(os.Stderr, "gateway: --idle-timeout and --handshake-timeout: want a duration >= 0 (0: the default)")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var tlsConf *tls.Config
	var acmeMgr *autocert.Manager
	var domains []string
	var selfPair *gateway.SelfSignedPair // --self-signed-out
	switch {
	case *acmeDomain != "":
		if *certFile != "" || *keyFile != "" || *selfOut != "" {
			fmt.Fprintln(os.Stderr, "gateway: --acme-domain excludes --tls-cert/--tls-key and --self-signed-out")
			return 2
		}
		for _, d := range strings.Split(*acmeDomain, ",") {
			if d = strings.TrimSpace(d); d != "" {
				domains = append(domains, d)
			}
		}
		ac := gateway.ACMEConfig{Domains: domains, CacheDir: *acmeCache, DirectoryURL: *acmeDir, Email: *acmeEmail}
		if *acmeCA != "" {
			pem, err := os.ReadFile(*acmeCA)
			if err != nil {
				fmt.Fprintln(os.Stderr, "gateway: --acme-ca:", err)
				return 1
			}
			ac.RootCAs = x509.NewCertPool()
			if !ac.RootCAs.AppendCertsFromPEM(pem) {
				fmt.Fprintf(os.Stderr, "gateway: --acme-ca %s: no PEM certificate\n", *acmeCA)
				return 1
			}
		}
		if tlsConf, acmeMgr, err = gateway.ACME(ac); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	default:
		if *selfOut != "" {
			// Keep the pair in DIR when it is still good, so that workers
			// pinned to it (--ca DIR/gateway.crt) reconnect after a
			// restart; a new pair is written only once the listener is
			// bound (below), so a gateway that cannot listen (a second
			// one on the same port) leaves the live one's files alone.
			selfPair, err = gateway.LoadOrNewSelfSigned(*selfOut, strings.Split(*hosts, ","), time.Now())
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			cert, err := selfPair.Certificate()
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}}
			break
		}
		if *certFile == "" || *keyFile == "" {
			fmt.Fprintln(os.Stderr, "gateway: --tls-cert and --tls-key, --self-signed-out DIR or --acme-domain NAME is required")
			return 2
		}
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fmt.Fprintf(os.Stderr, "gateway: --tls-cert %s / --tls-key %s: %v\n", *certFile, *keyFile, err)
			return 1
		}
		tlsConf = &tls.Config{Certificates: []tls.Certificate{cert}}
	}
	secret, err := loadSecret(*secretFile, *createSecret)
	if err != nil {
		fmt.Fprintln(os.Stderr, errLine("gateway", err))
		return 1
	}
	reg := prometheus.NewRegistry()
	credits.registry = reg
	crediting, err := credits.start(context.Background(), *hubAddr, secret, func(f string, a ...any) { fmt.Fprintf(os.Stderr, "gateway: "+f+"\n", a...) })
	if err != nil {
		fmt.Fprintln(os.Stderr, errLine("gateway", err))
		return 1
	}
	defer crediting.Stop()
	names := append([]string(nil), domains...) // ACME: no certificate to read names from yet
	for _, n := range strings.Split(*publicNames, ",") {
		if n = strings.TrimSpace(n); n != "" {
			names = append(names, n)
		}
	}
	// The metrics port is bound before the gateway's own, and both before
	// a new self-signed pair is written: a gateway that cannot start (a
	// second one on the same ports) leaves the live one's files alone.
	var mln net.Listener
	if *metricsListen != "" {
		if err := hub.CheckListenAddr(*metricsListen, false); err != nil {
			fmt.Fprintln(os.Stderr, "gateway: --metrics-listen:", err)
			return 1
		}
		if mln, err = net.Listen("tcp", *metricsListen); err != nil {
			fmt.Fprintln(os.Stderr, "gateway: --metrics-listen:", err)
			return 1
		}
		defer mln.Close()
	}
	g, err := gateway.New(gateway.Config{Listen: *listen, HubURL: *hubAddr, Secret: secret, TLSConfig: tlsConf, Extra: crediting.Handlers, Names: names,
		Registry: reg, Logger: log, IdleTimeout: *idle, HandshakeTimeout: *hsTimeout, MaxHandshakes: *maxHS, MaxHandshakesPerIP: *maxHSAddr})
	if err == nil {
		err = g.Start()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer g.Close()
	if selfPair != nil {
		exp := selfPair.NotAfter.UTC().Format(time.RFC3339)
		if selfPair.Reused {
			fmt.Fprintf(os.Stderr, "gateway: reusing the self-signed certificate %s (expires %s; delete it and %s for a new one; workers: --ca %s)\n",
				selfPair.CertFile, exp, selfPair.KeyFile, selfPair.CertFile)
		} else {
			if err := selfPair.Write(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			fmt.Fprintf(os.Stderr, "gateway: new self-signed certificate %s (%s; expires %s; workers: --ca %s)\n",
				selfPair.CertFile, selfPair.Reason, exp, selfPair.CertFile)
		}
	}
	var certsReady atomic.Int64 // domains whose certificate is obtained
	var acmeMu sync.Mutex
	acmeErr := map[string]string{} // domain -> the last failed order's error, until obtained
	if acmeMgr != nil {
		for _, d := range domains {
			go func() {
				var logged string
				var loggedAt time.Time
				failed := func(err error) {
					msg := err.Error()
					acmeMu.Lock()
					acmeErr[d] = msg
					acmeMu.Unlock()
					// Each new cause at once, the same one every 10 min.
					if msg != logged || time.Since(loggedAt) >= 10*time.Minute {
						log.Warn("gateway: ACME certificate not obtained yet; retrying", "domain", d, "err", err)
						logged, loggedAt = msg, time.Now()
					}
				}
				c, err := gateway.ObtainCertificate(ctx, acmeMgr, d, failed)
				if err != nil {
					log.Error("gateway: ACME certificate", "domain", d, "err", err)
					return
				}
				certsReady.Add(1)
				acmeMu.Lock()
				delete(acmeErr, d)
				acmeMu.Unlock()
				exp := ""
				if c.Leaf != nil {
					exp = c.Leaf.NotAfter.UTC().Format(time.RFC3339)
				}
				fmt.Fprintf(os.Stderr, "gateway: ACME certificate for %s obtained (expires %s; cache %s)\n", d, exp, *acmeCache)
			}()
		}
	}
	checks := append([]health.Check{health.Peer("hub", g.HubAddr())}, crediting.Checks...) // with --wallets: the wallets store and the hub's ledger answer
	if acmeMgr != nil {
		checks = append(checks, health.Check{Name: "certificate", Fn: func(context.Context) error {
			if n := certsReady.Load(); n < int64(len(domains)) {
				acmeMu.Lock()
				defer acmeMu.Unlock()
				var why []string
				for _, d := range domains {
					if e, ok := acmeErr[d]; ok {
						why = append(why, d+": "+e)
					}
				}
				if len(why) > 0 {
					return fmt.Errorf("%d of %d ACME certificates obtained (%s)", n, len(domains), strings.Join(why, "; "))
				}
				return fmt.Errorf("%d of %d ACME certificates obtained", n, len(domains))
			}
			return nil
		}})
	}
	if mln != nil {
		ln := mln
		mux := http.NewServeMux()
		mux.Handle("/metrics", g.MetricsHandler())
		health.Mount(mux, checks...)
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = msrv.Serve(ln) }()
		defer msrv.Close()
		fmt.Fprintf(os.Stderr, "gateway: metrics on http://%s/metrics\n", ln.Addr())
	}
	fmt.Fprintf(os.Stderr, "gateway: listening on %s (TLS), hub %s\n", g.Addr(), *hubAddr)
	<-ctx.Done()
	log.Info("gateway: stopping (signal): closing worker connections")
	return 0
}

// defaultACMECache is --acme-cache's default: $XDG_CONFIG_HOME/kvasir/acme
// (os.UserConfigDir), or ./kvasir-acme.
func defaultACMECache() string {
	dir, err := os.UserConfigDir()
	if err != nil {
		return "kvasir-acme"
	}
	return filepath.Join(dir, "kvasir", "acme")
}
