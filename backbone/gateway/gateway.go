// Package gateway is kvasir's only public role: a TLS listener that
// authenticates a worker at the WebSocket upgrade (engine/wire signed
// headers: signature, freshness, single-use nonce), then forwards the upgrade
// to the hub with the hub's HMAC headers naming the worker and splices bytes
// both ways without parsing them. Non-upgrade requests go to Config.Extra.
//
// Refusals happen before any connection to the hub is opened: 401 when the
// request is unsigned, 403 when the signature is bad, stale or replayed.
package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Config configures a Gateway. Zero durations take the defaults noted.
type Config struct {
	Listen    string                  // host:port of the TLS listener ("127.0.0.1:0" picks a port)
	HubURL    string                  // the hub: "host:port" or "http://host:port"
	Secret    []byte                  // shared hub secret (>= 16 bytes) for the HMAC headers
	TLSConfig *tls.Config             // server certificate(s); required
	Extra     map[string]http.Handler // handlers for non-worker paths (http.ServeMux patterns)
	// Names are the host names (and IP addresses) workers reach this
	// gateway by, beside those of TLSConfig's certificates (their DNS and
	// IP subject alternative names): a worker's upgrade signature names
	// the host it dialled (wire.UpgradeMessage), and one naming a host
	// that is not one of these is refused (403, reason wrong_host), so a
	// signature seen elsewhere (another network's gateway, a proxy) cannot
	// be replayed here. Give the public name when a proxy or CDN in front
	// terminates TLS with another certificate, and the ACME domains (a
	// GetCertificate configuration has no certificate to read names from).
	// With no name at all, any host the signature names is accepted.
	Names []string

	MaxSkew     time.Duration // allowed clock skew of a worker's signature; default 60 s
	IdleTimeout time.Duration // close a splice after this long without bytes in a direction; default 90 s (> the 20 s ping)
	DialTimeout time.Duration // hub dial and response timeout; default 5 s

	// HandshakeTimeout bounds a TLS handshake (DefaultHandshakeTimeout);
	// the request header then has 10 s more.
	HandshakeTimeout time.Duration
	// MaxHandshakes bounds the TLS handshakes in progress in total
	// (DefaultMaxHandshakes), MaxHandshakesPerIP those from one address (an IPv6 /64 counts as one)
	// (DefaultMaxHandshakesPerIP); a connection over either is closed
	// before any byte is read (kvasir_gateway_refused_upgrades_total
	// reason handshake_total / handshake_per_address).
	MaxHandshakes, MaxHandshakesPerIP int
	Logger                            *slog.Logger

	// Registry receives the gateway's Prometheus metrics (MetricsHandler);
	// nil: the gateway makes its own registry.
	Registry *prometheus.Registry
}

// Stats are the gateway's cumulative counters.
type Stats struct {
	Upgrades  uint64 // worker upgrades spliced to the hub
	Refused   uint64 // worker upgrades refused (401/403/502)
	Active    int64  // splices open now
	BytesUp   uint64 // bytes copied worker -> hub after the upgrade
	BytesDown uint64 // bytes copied hub -> worker after the upgrade
}

// Gateway is a running gateway. Create with New, then Start.
type Gateway struct {
	cfg     Config
	log     *slog.Logger
	hubAddr string
	srv     *http.Server
	ln      net.Listener
	hl      *handshakeListener

	names map[string]bool // Config.Names and the certificates' names, UpgradeHost form

	nonceMu sync.Mutex
	nonces  map[string]time.Time
	pruned  time.Time

	upgrades, refused, up, down atomic.Uint64
	active                      atomic.Int64
	met                         *metrics
	gatherer                    prometheus.Gatherer
	wg                          sync.WaitGroup
	connsMu                     sync.Mutex
	conns                       map[net.Conn]struct{}
	closing                     bool // Close began: no new splice is tracked
}

// New validates cfg and returns a Gateway that is not yet listening.
func New(cfg Config) (*Gateway, error) {
	if cfg.TLSConfig == nil {
		return nil, errors.New("gateway: TLSConfig required")
	}
	if len(cfg.Secret) < 16 {
		return nil, hub.ErrNoSecret
	}
	addr := cfg.HubURL
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil {
			return nil, fmt.Errorf("gateway: hub url: %w", err)
		}
		addr = u.Host
	}
	if err := hub.CheckDialAddr(addr); err != nil {
		return nil, fmt.Errorf("gateway: hub address %w", err)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.MaxSkew, 60*time.Second)
	def(&cfg.IdleTimeout, 90*time.Second)
	def(&cfg.DialTimeout, 5*time.Second)
	def(&cfg.HandshakeTimeout, DefaultHandshakeTimeout)
	if cfg.MaxHandshakes <= 0 {
		cfg.MaxHandshakes = DefaultMaxHandshakes
	}
	if cfg.MaxHandshakesPerIP <= 0 {
		cfg.MaxHandshakesPerIP = DefaultMaxHandshakesPerIP
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, hubAddr: addr, nonces: map[string]time.Time{}, conns: map[net.Conn]struct{}{},
		names: hostNames(cfg.Names, cfg.TLSConfig)}
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	g.gatherer = reg
	met, err := newMetrics(g, reg)
	if err != nil {
		return nil, fmt.Errorf("gateway: metrics: %w", err)
	}
	g.met = met
	mux := http.NewServeMux()
	mux.HandleFunc(wire.WorkerPath, g.serveWorker)
	for p, h := range cfg.Extra {
		mux.Handle(p, h)
	}
	tc := cfg.TLSConfig.Clone()
	// WebSocket upgrades need HTTP/1.1 hijacking: no h2. An ACME
	// configuration's "acme-tls/1" (TLS-ALPN-01) stays.
	protos := []string{"http/1.1"}
	for _, p := range tc.NextProtos {
		if p == "acme-tls/1" {
			protos = append(protos, p)
		}
	}
	tc.NextProtos = protos
	if tc.MinVersion < tls.VersionTLS12 {
		tc.MinVersion = tls.VersionTLS12
	}
	// IdleTimeout closes a keep-alive connection waiting for its next
	// request (wallet syncs, probes; a splice is hijacked and no longer
	// the server's): without it one stayed open for good.
	g.srv = &http.Server{Handler: mux, TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: HTTPIdleTimeout, MaxHeaderBytes: MaxHeaderBytes,
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	return g, nil
}

// HubAddr returns the hub's host:port the gateway splices to (the host
// part of Config.HubURL).
func (g *Gateway) HubAddr() string { return g.hubAddr }

// Start binds the TLS listener and serves in the background. Accepted TCP
// connections use 15 s keepalive probes (net.ListenConfig default), which with
// IdleTimeout bounds the life of half-open connections; their TLS handshakes
// are bounded in number and time (Config.HandshakeTimeout, MaxHandshakes,
// MaxHandshakesPerIP).
func (g *Gateway) Start() error {
	lc := net.ListenConfig{KeepAlive: 15 * time.Second}
	ln, err := lc.Listen(context.Background(), "tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.ln = ln
	g.wg.Add(1)
	g.hl = newHandshakeListener(g, ln, g.srv.TLSConfig)
	go func() { defer g.wg.Done(); _ = g.srv.Serve(g.hl) }()
	g.log.Info("gateway listening", "addr", ln.Addr().String(), "hub", g.hubAddr)
	return nil
}

// Addr is the bound listen address (after Start).
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// Close stops listening, cuts every splice and waits for them to end.
func (g *Gateway) Close() error {
	err := g.srv.Close()
	g.connsMu.Lock()
	g.closing = true
	for c := range g.conns {
		c.Close()
	}
	g.connsMu.Unlock()
	g.wg.Wait()
	return err
}

// Stats returns the gateway's counters.
func (g *Gateway) Stats() Stats {
	return Stats{Upgrades: g.upgrades.Load(), Refused: g.refused.Load(), Active: g.active.Load(),
		BytesUp: g.up.Load(), BytesDown: g.down.Load()}
}

// fresh records a nonce; false if it was seen within the skew window.
func (g *Gateway) fresh(key, nonce string, now time.Time) bool {
	g.nonceMu.Lock()
	defer g.nonceMu.Unlock()
	if now.Sub(g.pruned) > time.Second {
		for k, exp := range g.nonces {
			if now.After(exp) {
				delete(g.nonces, k)
			}
		}
		g.pruned = now
	}
	id := key + "/" + nonce
	if exp, ok := g.nonces[id]; ok && !now.After(exp) {
		return false
	}
	// A signature is valid for +-MaxSkew around its time, so remembering the
	// nonce 2*MaxSkew from now outlives it.
	g.nonces[id] = now.Add(2 * g.cfg.MaxSkew)
	return true
}

func isUpgrade(r *http.Request) bool {
	return strings.EqualFold(r.Header.Get("Upgrade"), "websocket") &&
		strings.Contains(strings.ToLower(r.Header.Get("Connection")), "upgrade")
}

func (g *Gateway) refuse(w http.ResponseWriter, r *http.Request, code int, reason string, err error) {
	g.refuseSaying(w, r, code, reason, err, http.StatusText(code))
}

// refuseSaying is refuse with body as the answer's one line (what the
// worker shows): for refusals whose reason helps an honest worker and
// tells a forger nothing (an old worker, a wrong host name).
func (g *Gateway) refuseSaying(w http.ResponseWriter, r *http.Request, code int, reason string, err error, body string) {
	g.refused.Add(1)
	g.met.refused.WithLabelValues(reason).Inc()
	g.log.Warn("gateway: refused worker upgrade", "remote", r.RemoteAddr, "status", code, "reason", reason, "err", err)
	http.Error(w, body, code)
}

// track adds (add) or removes a splice's two connections. Adding also
// counts the splice in g.wg, under the same lock Close takes, so a splice
// either is cut and waited for by Close or is refused here (false) once
// Close began; without this an upgrade hijacked while Close ran could
// outlive it, and wg.Add could race wg.Wait.
func (g *Gateway) track(a, b net.Conn, add bool) bool {
	g.connsMu.Lock()
	defer g.connsMu.Unlock()
	if add {
		if g.closing {
			return false
		}
		g.conns[a], g.conns[b] = struct{}{}, struct{}{}
		g.active.Add(1)
		g.wg.Add(1)
	} else {
		delete(g.conns, a)
		delete(g.conns, b)
		g.active.Add(-1)
	}
	return true
}

// hostNames is the set of names (wire.UpgradeHost form) a worker may sign
// for: names and the DNS and IP subject alternative names of tc's
// certificates (a certificate that does not parse adds none).
func hostNames(names []string, tc *tls.Config) map[string]bool {
	set := map[string]bool{}
	for _, n := range names {
		if n = strings.TrimSpace(n); n != "" {
			set[wire.UpgradeHost(n)] = true
		}
	}
	for _, c := range tc.Certificates {
		leaf := c.Leaf
		if leaf == nil && len(c.Certificate) > 0 {
			leaf, _ = x509.ParseCertificate(c.Certificate[0])
		}
		if leaf == nil {
			continue
		}
		for _, d := range leaf.DNSNames {
			set[strings.TrimSuffix(strings.ToLower(d), ".")] = true
		}
		for _, ip := range leaf.IPAddresses {
			set[ip.String()] = true
		}
	}
	return set
}

// nameMatches reports whether host (wire.UpgradeHost form) is one of
// names, or matches a wildcard name ("*.example.net") in its leftmost
// label as a certificate does (x509.Certificate.VerifyHostname: one label,
// never an IP address).
func nameMatches(names map[string]bool, host string) bool {
	if names[host] {
		return true
	}
	if net.ParseIP(host) != nil {
		return false
	}
	if i := strings.IndexByte(host, '.'); i > 0 {
		return names["*"+host[i:]]
	}
	return false
}

func hostOnly(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}
