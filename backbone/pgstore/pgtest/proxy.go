package pgtest

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// Action is what a Proxy does with a message from the client.
type Action int

// The actions of a Proxy hook.
const (
	Forward    Action = iota // pass the message on
	DropBefore               // cut the connection instead of passing it on
	DropAfter                // pass it on, then cut the connection at once (its answer never reaches the client)
)

// Proxy sits between PostgreSQL clients and the server of a DSN on
// loopback and can cut a connection in the middle of a transaction: it
// parses the client's side of the protocol (startup, then typed messages)
// and asks Hook about each typed message. A cut closes both sides, as a
// network failure or a dying client would.
type Proxy struct {
	// Hook decides about each typed client message (type byte and body);
	// nil forwards everything. It is called from the connections'
	// goroutines, one message at a time per connection.
	Hook func(typ byte, body []byte) Action

	ln     net.Listener
	target string
	mu     sync.Mutex
	hookMu sync.Mutex
	conns  map[net.Conn]struct{}
	cuts   int
}

// NewProxy starts a proxy to the server of dsn and returns it with the DSN
// that goes through it; it is closed when t ends.
func NewProxy(t testing.TB, dsn string) (*Proxy, string) {
	t.Helper()
	u, err := url.Parse(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: u.Host, conns: map[net.Conn]struct{}{}}
	go p.serve()
	t.Cleanup(p.Close)
	u.Host = ln.Addr().String()
	return p, u.String()
}

// Cuts returns how many connections the proxy cut.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

// Close stops accepting and cuts every connection.
func (p *Proxy) Close() {
	p.ln.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		c.Close()
	}
}

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.handle(c)
	}
}

func (p *Proxy) track(c net.Conn, add bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if add {
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
}

func (p *Proxy) handle(client net.Conn) {
	server, err := net.Dial("tcp", p.target)
	if err != nil {
		client.Close()
		return
	}
	p.track(client, true)
	p.track(server, true)
	cut := func() {
		client.Close()
		server.Close()
	}
	defer func() {
		cut()
		p.track(client, false)
		p.track(server, false)
	}()
	go func() { _, _ = io.Copy(client, server); cut() }()
	br := bufio.NewReader(client)
	// Startup phase: untyped messages (length, code, ...) until the
	// StartupMessage (protocol 3.0); SSL and GSS requests come before it.
	for {
		var hdr [8]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[:4]))
		if n < 8 || n > 1<<20 {
			return
		}
		rest := make([]byte, n-8)
		if _, err := io.ReadFull(br, rest); err != nil {
			return
		}
		if _, err := server.Write(append(hdr[:], rest...)); err != nil {
			return
		}
		code := binary.BigEndian.Uint32(hdr[4:])
		if code == 196608 { // StartupMessage, protocol 3.0
			break
		}
		if code == 80877102 { // CancelRequest: nothing follows
			return
		}
	}
	for {
		var hdr [5]byte
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return
		}
		n := int(binary.BigEndian.Uint32(hdr[1:]))
		if n < 4 || n > 64<<20 {
			return
		}
		body := make([]byte, n-4)
		if _, err := io.ReadFull(br, body); err != nil {
			return
		}
		act := Forward
		if p.Hook != nil {
			p.hookMu.Lock()
			act = p.Hook(hdr[0], body)
			p.hookMu.Unlock()
		}
		if act == DropBefore {
			p.count()
			return
		}
		if _, err := server.Write(append(hdr[:], body...)); err != nil {
			return
		}
		if act == DropAfter {
			p.count()
			return
		}
	}
}

func (p *Proxy) count() {
	p.mu.Lock()
	p.cuts++
	p.mu.Unlock()
}
