package gateway

import (
	"crypto/tls"
	"errors"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
	"github.com/prometheus/client_golang/prometheus"
)

// splice copies bytes between a worker's connection and its hub
// connection, a copyLoop per direction, until one side ends or idles out;
// then it gives the other direction a short grace period and closes both.
type splice struct {
	g      *Gateway
	client net.Conn      // the worker's (hijacked) connection
	hubc   net.Conn      // the connection to the hub
	done   chan struct{} // each direction posts when it has ended
	ended  atomic.Bool   // set by the first direction to end, which alone counts its error
}

// newSplice returns the splice of a worker's connection client and its
// hub connection hubc.
func newSplice(g *Gateway, client, hubc net.Conn) *splice {
	return &splice{g: g, client: client, hubc: hubc, done: make(chan struct{}, 2)}
}

// run splices until both directions have ended and closes both
// connections.
func (sp *splice) run() {
	g := sp.g
	go sp.copyLoop(sp.hubc, sp.client, &g.up, g.met.up)
	go sp.copyLoop(sp.client, sp.hubc, &g.down, g.met.down)
	<-sp.done
	grace := time.Now().Add(2 * time.Second)
	_ = sp.client.SetReadDeadline(grace)
	_ = sp.hubc.SetReadDeadline(grace)
	<-sp.done
	sp.client.Close()
	sp.hubc.Close()
}

// copyLoop copies src to dst, counting the bytes in n and bytes, until src
// ends, idles out or dst fails; it then counts a splice error if it was
// the first direction to end, half-closes dst and posts on done.
func (sp *splice) copyLoop(dst, src net.Conn, n *atomic.Uint64, bytes prometheus.Counter) {
	reason := ""
	// end counts why the splice ended if this direction is the first to
	// end: before the end is passed on, so that the other direction's
	// reaction to it (EOF, a write on a connection the error closed, or
	// the grace deadline) is never taken for the cause.
	end := func() {
		if sp.ended.CompareAndSwap(false, true) && reason != "" {
			sp.g.met.spliceErrors.WithLabelValues(reason).Inc()
		}
	}
	defer func() {
		end()
		// Pass the end on (TCP FIN / TLS close_notify) so the
		// peer sees it without waiting for the grace period.
		if cw, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		sp.done <- struct{}{}
	}()
	idle := sp.g.cfg.IdleTimeout
	buf := make([]byte, 256<<10)
	// A TLS source returns one record per Read: the records its last
	// read from the socket already holds are gathered too (drain), so that
	// a worker's message goes on to the hub in one write rather than one
	// per 16 KiB record. A TLS destination writes one record per 16 KiB:
	// they leave in one system call (wire.BatchConn below crypto/tls).
	// Only when the socket read under it holds more (wire.BatchConn's
	// Buffered): a lone small message pays nothing for the drain.
	tsrc, _ := src.(*tls.Conn)
	var srcUnder *wire.BatchConn
	if tsrc != nil {
		srcUnder, _ = tsrc.NetConn().(*wire.BatchConn)
	}
	var batch *wire.BatchConn
	if tc, ok := dst.(*tls.Conn); ok {
		batch, _ = tc.NetConn().(*wire.BatchConn)
	}
	for {
		_ = src.SetReadDeadline(time.Now().Add(idle))
		k, err := src.Read(buf)
		if srcUnder != nil && err == nil && k > 0 && srcUnder.Buffered() > 0 {
			k, err = drain(tsrc, buf, k)
		}
		if err != nil {
			// The read's error ends the splice: counted now, before
			// the bytes read ahead of it go on (a bad TLS record makes
			// crypto/tls fail the connection's writes too, and the
			// other direction's write could otherwise be first to end).
			reason = spliceErrorReason(err)
			end()
		}
		if k > 0 {
			_ = dst.SetWriteDeadline(time.Now().Add(idle))
			var werr error
			if batch != nil {
				werr = batch.Batch(func() error { _, e := dst.Write(buf[:k]); return e })
			} else {
				_, werr = dst.Write(buf[:k])
			}
			if werr != nil {
				if reason == "" {
					reason = "write"
				}
				return
			}
			n.Add(uint64(k))
			bytes.Add(float64(k))
		}
		if err != nil {
			return
		}
	}
}

// drain reads into buf[k:] what c can return without waiting (the records
// its last socket read already holds: a Read with a deadline in the past
// makes no system call and returns those, then a timeout, which a
// crypto/tls read survives) and returns the new length; err is a read
// error other than that timeout (k then counts the bytes before it).
func drain(c *tls.Conn, buf []byte, k int) (int, error) {
	_ = c.SetReadDeadline(aLongTimeAgo)
	for k < len(buf) {
		n, err := c.Read(buf[k:])
		k += n
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return k, nil
			}
			return k, err
		}
	}
	return k, nil
}

// aLongTimeAgo is a deadline that has passed (net/http's trick to end a
// read at once).
var aLongTimeAgo = time.Unix(1, 0)
