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
	"bufio"
	"context"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
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

	MaxSkew     time.Duration // allowed clock skew of a worker's signature; default 60 s
	IdleTimeout time.Duration // close a splice after this long without bytes in a direction; default 90 s (> the 20 s ping)
	DialTimeout time.Duration // hub dial and response timeout; default 5 s
	Logger      *slog.Logger

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
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return nil, fmt.Errorf("gateway: hub address %q: %w", cfg.HubURL, err)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&cfg.MaxSkew, 60*time.Second)
	def(&cfg.IdleTimeout, 90*time.Second)
	def(&cfg.DialTimeout, 5*time.Second)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	g := &Gateway{cfg: cfg, log: cfg.Logger, hubAddr: addr, nonces: map[string]time.Time{}, conns: map[net.Conn]struct{}{}}
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
	tc.NextProtos = []string{"http/1.1"} // WebSocket upgrades need HTTP/1.1 hijacking
	if tc.MinVersion < tls.VersionTLS12 {
		tc.MinVersion = tls.VersionTLS12
	}
	g.srv = &http.Server{Handler: mux, TLSConfig: tc, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	return g, nil
}

// Start binds the TLS listener and serves in the background. Accepted TCP
// connections use 15 s keepalive probes (net.ListenConfig default), which with
// IdleTimeout bounds the life of half-open connections.
func (g *Gateway) Start() error {
	lc := net.ListenConfig{KeepAlive: 15 * time.Second}
	ln, err := lc.Listen(context.Background(), "tcp", g.cfg.Listen)
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.ln = ln
	g.wg.Add(1)
	go func() { defer g.wg.Done(); _ = g.srv.Serve(tls.NewListener(ln, g.srv.TLSConfig)) }()
	g.log.Info("gateway listening", "addr", ln.Addr().String(), "hub", g.hubAddr)
	return nil
}

// Addr is the bound listen address (after Start).
func (g *Gateway) Addr() string { return g.ln.Addr().String() }

// Close stops listening, cuts every splice and waits for them to end.
func (g *Gateway) Close() error {
	err := g.srv.Close()
	g.connsMu.Lock()
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
	g.refused.Add(1)
	g.met.refused.WithLabelValues(reason).Inc()
	g.log.Warn("gateway: refused worker upgrade", "remote", r.RemoteAddr, "status", code, "err", err)
	http.Error(w, http.StatusText(code), code)
}

func (g *Gateway) serveWorker(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || !isUpgrade(r) {
		g.refuse(w, r, http.StatusBadRequest, "not_upgrade", errors.New("not a WebSocket upgrade"))
		return
	}
	now := time.Now()
	pub, nonce, err := wire.VerifyUpgrade(r.Header, r.Method, r.URL.Path, now, g.cfg.MaxSkew)
	switch {
	case errors.Is(err, wire.ErrNoSignature):
		g.refuse(w, r, http.StatusUnauthorized, "unsigned", err)
		return
	case errors.Is(err, wire.ErrStale):
		g.refuse(w, r, http.StatusForbidden, "stale", err)
		return
	case err != nil:
		g.refuse(w, r, http.StatusForbidden, "bad_signature", err)
		return
	}
	worker := hex.EncodeToString(pub)
	if !g.fresh(worker, nonce, now) {
		g.refuse(w, r, http.StatusForbidden, "replayed", errors.New("replayed nonce"))
		return
	}
	hc, err := net.DialTimeout("tcp", g.hubAddr, g.cfg.DialTimeout)
	if err != nil {
		g.refuse(w, r, http.StatusBadGateway, "hub_unreachable", err)
		return
	}
	ok := false
	defer func() {
		if !ok {
			hc.Close()
		}
	}()
	// Forward the request line and headers, minus any gateway headers the
	// client tried to set, plus our own.
	h := r.Header.Clone()
	for _, k := range []string{hub.HeaderWorker, hub.HeaderGwTime, hub.HeaderGwNonce, hub.HeaderGwMAC} {
		h.Del(k)
	}
	hub.SignGateway(h, g.cfg.Secret, worker, now)
	h.Set("X-Forwarded-For", hostOnly(r.RemoteAddr))
	bw := bufio.NewWriter(hc)
	fmt.Fprintf(bw, "GET %s HTTP/1.1\r\nHost: %s\r\n", r.URL.RequestURI(), r.Host)
	if err := h.Write(bw); err != nil {
		g.refuse(w, r, http.StatusBadGateway, "hub_error", err)
		return
	}
	bw.WriteString("\r\n")
	_ = hc.SetDeadline(now.Add(g.cfg.DialTimeout))
	if err := bw.Flush(); err != nil {
		g.refuse(w, r, http.StatusBadGateway, "hub_error", err)
		return
	}
	br := bufio.NewReaderSize(hc, 16<<10)
	resp, err := http.ReadResponse(br, r)
	if err != nil {
		g.refuse(w, r, http.StatusBadGateway, "hub_error", err)
		return
	}
	_ = hc.SetDeadline(time.Time{})
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		g.refused.Add(1)
		g.met.refused.WithLabelValues("hub_refused").Inc()
		g.log.Warn("gateway: hub refused upgrade", "status", resp.StatusCode)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
		return
	}
	hj, isHJ := w.(http.Hijacker)
	if !isHJ {
		g.refuse(w, r, http.StatusInternalServerError, "hijack", errors.New("connection cannot be hijacked"))
		return
	}
	cc, crw, err := hj.Hijack()
	if err != nil {
		g.refused.Add(1)
		g.met.refused.WithLabelValues("hijack").Inc()
		return
	}
	ok = true
	cbw := bufio.NewWriter(cc)
	fmt.Fprintf(cbw, "HTTP/1.1 101 Switching Protocols\r\n")
	_ = resp.Header.Write(cbw)
	cbw.WriteString("\r\n")
	if n := br.Buffered(); n > 0 { // hub bytes read past the response
		b, _ := br.Peek(n)
		cbw.Write(b)
	}
	if err := cbw.Flush(); err != nil {
		cc.Close()
		hc.Close()
		return
	}
	if n := crw.Reader.Buffered(); n > 0 { // client bytes read past the request
		b, _ := crw.Reader.Peek(n)
		if _, err := hc.Write(b); err != nil {
			cc.Close()
			hc.Close()
			return
		}
	}
	g.upgrades.Add(1)
	g.met.sessions.Inc()
	g.track(cc, hc, true)
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		g.splice(cc, hc)
		g.track(cc, hc, false)
	}()
}

func (g *Gateway) track(a, b net.Conn, add bool) {
	g.connsMu.Lock()
	defer g.connsMu.Unlock()
	if add {
		g.conns[a], g.conns[b] = struct{}{}, struct{}{}
		g.active.Add(1)
	} else {
		delete(g.conns, a)
		delete(g.conns, b)
		g.active.Add(-1)
	}
}

// splice copies client<->hub until one side ends or idles out, then gives the
// other direction a short grace period and closes both.
func (g *Gateway) splice(client, hubc net.Conn) {
	done := make(chan string, 2) // why each direction ended: "" normally, else a splice error reason
	cp := func(dst, src net.Conn, n *atomic.Uint64, bytes prometheus.Counter) {
		reason := ""
		defer func() {
			// Pass the end on at once (TCP FIN / TLS close_notify) so the
			// peer sees it without waiting for the grace period.
			if cw, ok := dst.(interface{ CloseWrite() error }); ok {
				_ = cw.CloseWrite()
			}
			done <- reason
		}()
		buf := make([]byte, 64<<10)
		for {
			_ = src.SetReadDeadline(time.Now().Add(g.cfg.IdleTimeout))
			k, err := src.Read(buf)
			if k > 0 {
				_ = dst.SetWriteDeadline(time.Now().Add(g.cfg.IdleTimeout))
				if _, werr := dst.Write(buf[:k]); werr != nil {
					reason = "write"
					return
				}
				n.Add(uint64(k))
				bytes.Add(float64(k))
			}
			if err != nil {
				reason = spliceErrorReason(err)
				return
			}
		}
	}
	go cp(hubc, client, &g.up, g.met.up)
	go cp(client, hubc, &g.down, g.met.down)
	if reason := <-done; reason != "" { // the second direction ends on the grace deadline: not counted
		g.met.spliceErrors.WithLabelValues(reason).Inc()
	}
	grace := time.Now().Add(2 * time.Second)
	_ = client.SetReadDeadline(grace)
	_ = hubc.SetReadDeadline(grace)
	<-done
	client.Close()
	hubc.Close()
}

func hostOnly(addr string) string {
	if h, _, err := net.SplitHostPort(addr); err == nil {
		return h
	}
	return addr
}
