package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"sync"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Defaults of the handshake limits (Config.HandshakeTimeout,
// MaxHandshakes, MaxHandshakesPerIP) and of the request header cap.
const (
	DefaultHandshakeTimeout   = 10 * time.Second
	DefaultMaxHandshakes      = 256
	DefaultMaxHandshakesPerIP = 8
	MaxHeaderBytes            = 16 << 10
	// HTTPIdleTimeout closes an HTTP keep-alive connection that sent no
	// request for this long.
	HTTPIdleTimeout = 60 * time.Second
)

// handshakeListener accepts TCP connections and completes their TLS
// handshakes before the HTTP server sees them, each within a timeout, with
// at most max handshakes in flight in total and perIP from one address:
// a connection over either bound is closed at once, before any TLS byte is
// read. The bounds count handshakes in progress, not sessions: a worker
// that finished its handshake no longer holds a slot.
type handshakeListener struct {
	net.Listener
	g       *Gateway
	tc      *tls.Config
	timeout time.Duration
	max     int
	perIP   int

	mu     sync.Mutex
	total  int
	byIP   map[string]int
	ready  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newHandshakeListener(g *Gateway, ln net.Listener, tc *tls.Config) *handshakeListener {
	l := &handshakeListener{Listener: ln, g: g, tc: tc, timeout: g.cfg.HandshakeTimeout, max: g.cfg.MaxHandshakes,
		perIP: g.cfg.MaxHandshakesPerIP, byIP: map[string]int{}, ready: make(chan net.Conn), closed: make(chan struct{})}
	go l.acceptLoop()
	return l
}

func (l *handshakeListener) acceptLoop() {
	defer l.once.Do(func() { close(l.closed) })
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				time.Sleep(5 * time.Millisecond)
				continue
			}
			return
		}
		ip := addressGroup(c.RemoteAddr().String())
		if !l.take(ip) {
			c.Close()
			continue
		}
		go l.handshake(c, ip)
	}
}

// addressGroup is the key the per-address handshake bound counts a peer
// under: its IPv4 address, or the /64 of its IPv6 address (one host
// usually has a whole /64 to pick source addresses from: counted per
// address, 32 of them filled the gateway's 256 slots).
func addressGroup(addr string) string {
	h := hostOnly(addr)
	ip := net.ParseIP(h)
	if ip == nil || ip.To4() != nil {
		return h
	}
	return ip.Mask(net.CIDRMask(64, 128)).String() + "/64"
}

// take reserves a handshake slot for ip; false (and the refusal counted)
// when the total or the address is at its bound.
func (l *handshakeListener) take(ip string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	reason := ""
	switch {
	case l.total >= l.max:
		reason = "handshake_total"
	case l.byIP[ip] >= l.perIP:
		reason = "handshake_per_address"
	}
	if reason != "" {
		l.g.met.refused.WithLabelValues(reason).Inc()
		return false
	}
	l.total++
	l.byIP[ip]++
	return true
}

func (l *handshakeListener) release(ip string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.total--
	if l.byIP[ip]--; l.byIP[ip] <= 0 {
		delete(l.byIP, ip)
	}
}

func (l *handshakeListener) handshake(c net.Conn, ip string) {
	// The splice writes a hub read's records in one system call
	// (wire.BatchConn; splice.copyLoop).
	tc := tls.Server(wire.NewBatchConn(c, nil).BufferReads(), l.tc)
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	_ = c.SetDeadline(time.Now().Add(l.timeout))
	err := tc.HandshakeContext(ctx)
	expired := ctx.Err() != nil // before cancel, which would set it for every handshake
	cancel()
	l.release(ip)
	if err != nil {
		if expired || errors.Is(err, os.ErrDeadlineExceeded) {
			l.g.met.refused.WithLabelValues("handshake_timeout").Inc()
		}
		c.Close()
		return
	}
	_ = c.SetDeadline(time.Time{})
	select {
	case l.ready <- tc:
	case <-l.closed:
		c.Close()
	}
}

// inProgress is the number of handshakes holding a slot now.
func (l *handshakeListener) inProgress() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.total
}

// Accept returns the next connection whose TLS handshake completed.
func (l *handshakeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ready:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

// Close stops accepting; handshakes in progress end on their timeout or
// are closed when they complete.
func (l *handshakeListener) Close() error {
	err := l.Listener.Close()
	l.once.Do(func() { close(l.closed) })
	return err
}
