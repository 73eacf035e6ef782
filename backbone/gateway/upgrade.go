package gateway

import (
	"bufio"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/hub"
	"github.com/kvasir-ai/kvasir/engine/wire"
)

// serveWorker takes a worker's upgrade: it checks the signature, forwards
// the upgrade to the hub and, once the hub switches protocols, splices the
// two connections in the background.
func (g *Gateway) serveWorker(w http.ResponseWriter, r *http.Request) {
	worker, now, ok := g.admit(w, r)
	if !ok {
		return
	}
	hc, err := net.DialTimeout("tcp", g.hubAddr, g.cfg.DialTimeout)
	if err != nil {
		g.refuse(w, r, http.StatusBadGateway, "hub_unreachable", err)
		return
	}
	cc := g.upgrade(w, r, hc, worker, now)
	if cc == nil {
		return
	}
	g.upgrades.Add(1)
	g.met.sessions.Inc()
	if !g.track(cc, hc, true) { // Close ran meanwhile: cut the splice before it starts
		cc.Close()
		hc.Close()
		return
	}
	go func() {
		defer g.wg.Done()
		newSplice(g, cc, hc).run()
		g.track(cc, hc, false)
	}()
}

// admit checks that r is a WebSocket upgrade signed by a worker, fresh and
// not replayed; it returns the worker's key (hex) and the time of the
// check, or ok false after refusing r.
func (g *Gateway) admit(w http.ResponseWriter, r *http.Request) (worker string, now time.Time, ok bool) {
	if r.Method != http.MethodGet || !isUpgrade(r) {
		g.refuse(w, r, http.StatusBadRequest, "not_upgrade", errors.New("not a WebSocket upgrade"))
		return "", now, false
	}
	now = time.Now()
	if host := wire.UpgradeHost(r.Host); len(g.names) > 0 && !nameMatches(g.names, host) {
		g.refuseSaying(w, r, http.StatusForbidden, "wrong_host", fmt.Errorf("upgrade for host %q, not a name of this gateway", host),
			fmt.Sprintf("%q is not a name of this gateway: dial it by the name its certificate gives", host))
		return "", now, false
	}
	pub, nonce, err := wire.VerifyUpgrade(r.Header, r.Method, r.Host, r.URL.Path, now, g.cfg.MaxSkew)
	switch {
	case errors.Is(err, wire.ErrNoSignature):
		g.refuse(w, r, http.StatusUnauthorized, "unsigned", err)
		return "", now, false
	case errors.Is(err, wire.ErrStale):
		g.refuse(w, r, http.StatusForbidden, "stale", err)
		return "", now, false
	case errors.Is(err, wire.ErrOldSignature):
		// A worker older than this gateway: say so to it (its status
		// shows the body's first line), not only to the log.
		g.refuseSaying(w, r, http.StatusForbidden, "old_signature", err,
			"this gateway needs a newer worker: its upgrade signature (kvasir-upgrade-v1) does not name the gateway's host; update kvasir")
		return "", now, false
	case err != nil:
		g.refuse(w, r, http.StatusForbidden, "bad_signature", err)
		return "", now, false
	}
	worker = hex.EncodeToString(pub)
	if !g.fresh(worker, nonce, now) {
		g.refuse(w, r, http.StatusForbidden, "replayed", errors.New("replayed nonce"))
		return "", now, false
	}
	return worker, now, true
}

// upgrade forwards the worker's upgrade r to the hub on hc and, when the
// hub switches protocols, takes over the worker's connection and relays
// the hub's answer. It returns the worker's connection, or nil (hc then
// closed) once r is answered otherwise or a connection failed.
func (g *Gateway) upgrade(w http.ResponseWriter, r *http.Request, hc net.Conn, worker string, now time.Time) net.Conn {
	ok := false
	defer func() {
		if !ok {
			hc.Close()
		}
	}()
	br, resp, err := g.forward(r, hc, worker, now)
	if err != nil {
		g.refuse(w, r, http.StatusBadGateway, "hub_error", err)
		return nil
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		g.refused.Add(1)
		if resp.StatusCode == http.StatusForbidden {
			// The hub refuses only this gateway's signature (shared
			// secret, clock skew, a replayed nonce): the worker was
			// admitted here, so it is not its identity that failed.
			// Tell it so (502: the swarm behind the gateway), and the
			// operator what to check.
			g.met.refused.WithLabelValues("hub_forbidden").Inc()
			g.log.Error("gateway: the hub refused this gateway's signature: check that hub and gateway use the same secret file and that their clocks agree",
				"status", resp.StatusCode, "hub", g.cfg.HubURL)
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusBadGateway)
			_, _ = io.WriteString(w, "the hub did not accept this gateway (a gateway misconfiguration, not this worker's identity)\n")
			return nil
		}
		g.met.refused.WithLabelValues("hub_refused").Inc()
		g.log.Warn("gateway: hub refused upgrade", "status", resp.StatusCode)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(body)
		return nil
	}
	hj, isHJ := w.(http.Hijacker)
	if !isHJ {
		g.refuse(w, r, http.StatusInternalServerError, "hijack", errors.New("connection cannot be hijacked"))
		return nil
	}
	cc, crw, err := hj.Hijack()
	if err != nil {
		g.refused.Add(1)
		g.met.refused.WithLabelValues("hijack").Inc()
		return nil
	}
	ok = true
	if err := switchOver(cc, crw, hc, br, resp); err != nil {
		cc.Close()
		hc.Close()
		return nil
	}
	return cc
}

// forward writes the upgrade request r to the hub on hc, minus any gateway
// headers the client tried to set, plus our own, and reads the hub's
// response with br, which may have read hub bytes past it.
func (g *Gateway) forward(r *http.Request, hc net.Conn, worker string, now time.Time) (br *bufio.Reader, resp *http.Response, err error) {
	h := r.Header.Clone()
	for _, k := range []string{hub.HeaderWorker, hub.HeaderGwTime, hub.HeaderGwNonce, hub.HeaderGwMAC} {
		h.Del(k)
	}
	hub.SignGateway(h, g.cfg.Secret, worker, now)
	h.Set("X-Forwarded-For", hostOnly(r.RemoteAddr))
	bw := bufio.NewWriter(hc)
	fmt.Fprintf(bw, "GET %s HTTP/1.1\r\nHost: %s\r\n", r.URL.RequestURI(), r.Host)
	if err := h.Write(bw); err != nil {
		return nil, nil, err
	}
	bw.WriteString("\r\n")
	_ = hc.SetDeadline(now.Add(g.cfg.DialTimeout))
	if err := bw.Flush(); err != nil {
		return nil, nil, err
	}
	br = bufio.NewReaderSize(hc, 16<<10)
	resp, err = http.ReadResponse(br, r)
	if err != nil {
		return nil, nil, err
	}
	_ = hc.SetDeadline(time.Time{})
	return br, resp, nil
}

// switchOver answers the worker's hijacked connection cc with the hub's
// 101 response and the hub bytes br read past it, then passes the hub the
// client bytes crw read past the request.
func switchOver(cc net.Conn, crw *bufio.ReadWriter, hc net.Conn, br *bufio.Reader, resp *http.Response) error {
	cbw := bufio.NewWriter(cc)
	fmt.Fprintf(cbw, "HTTP/1.1 101 Switching Protocols\r\n")
	_ = resp.Header.Write(cbw)
	cbw.WriteString("\r\n")
	if n := br.Buffered(); n > 0 { // hub bytes read past the response
		b, _ := br.Peek(n)
		cbw.Write(b)
	}
	if err := cbw.Flush(); err != nil {
		return err
	}
	if n := crw.Reader.Buffered(); n > 0 { // client bytes read past the request
		b, _ := crw.Reader.Peek(n)
		if _, err := hc.Write(b); err != nil {
			return err
		}
	}
	return nil
}
