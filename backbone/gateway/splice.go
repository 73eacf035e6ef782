package gateway

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// splice copies bytes between a worker's connection and its hub
// connection, a copyLoop per direction, until one side ends or idles out;
// then it gives the other direction a short grace period and closes both.
type splice struct {
	g      *Gateway
	client net.Conn    // the worker's (hijacked) connection
	hubc   net.Conn    // the connection to the hub
	done   chan string // why each direction ended: "" normally, else a splice error reason
}

// newSplice returns the splice of a worker's connection client and its
// hub connection hubc.
func newSplice(g *Gateway, client, hubc net.Conn) *splice {
	return &splice{g: g, client: client, hubc: hubc, done: make(chan string, 2)}
}

// run splices until both directions have ended and closes both
// connections.
func (sp *splice) run() {
	g := sp.g
	go sp.copyLoop(sp.hubc, sp.client, &g.up, g.met.up)
	go sp.copyLoop(sp.client, sp.hubc, &g.down, g.met.down)
	if reason := <-sp.done; reason != "" { // the second direction ends on the grace deadline: not counted
		g.met.spliceErrors.WithLabelValues(reason).Inc()
	}
	grace := time.Now().Add(2 * time.Second)
	_ = sp.client.SetReadDeadline(grace)
	_ = sp.hubc.SetReadDeadline(grace)
	<-sp.done
	sp.client.Close()
	sp.hubc.Close()
}

// copyLoop copies src to dst, counting the bytes in n and bytes, until src
// ends, idles out or dst fails; it then half-closes dst and posts why on
// done.
func (sp *splice) copyLoop(dst, src net.Conn, n *atomic.Uint64, bytes prometheus.Counter) {
	reason := ""
	defer func() {
		// Pass the end on at once (TCP FIN / TLS close_notify) so the
		// peer sees it without waiting for the grace period.
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		sp.done <- reason
	}()
	idle := sp.g.cfg.IdleTimeout
	buf := make([]byte, 64<<10)
	for {
		_ = src.SetReadDeadline(time.Now().Add(idle))
		k, err := src.Read(buf)
		if k > 0 {
			_ = dst.SetWriteDeadline(time.Now().Add(idle))
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
