package swarmtest

import (
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// Link is a loopback TCP relay standing in for a wide-area link: every
// connection accepted on Addr is relayed to a target address, and every
// chunk read in either direction is written oneWay after it was read (an
// injected round trip of 2 x oneWay; the benchmarks use 6.5 ms, the
// reference deployment's 13 ms). The delay is waited in a blocking
// nanosleep (sleepUntil), not by the Go scheduler's timers, whose
// millisecond resolution in epoll would add ~1 ms each way, and not by
// spinning, which would take a core from the processes under test.
// Holds (read to written, per chunk) are recorded: twice their median is
// the link's own round trip, which a benchmark subtracts to find what the
// rest of the path adds.
type Link struct {
	ln     net.Listener
	target string
	oneWay time.Duration
	conns  atomic.Int64
	wg     sync.WaitGroup

	mu    sync.Mutex
	holds []time.Duration
	open  map[net.Conn]struct{}
}

// NewLink listens on 127.0.0.1 (an ephemeral port) and relays to target
// with oneWay of delay each way (0: a plain relay). Close stops it.
func NewLink(target string, oneWay time.Duration) (*Link, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	l := &Link{ln: ln, target: target, oneWay: oneWay, open: map[net.Conn]struct{}{}}
	l.wg.Add(1)
	go l.accept()
	return l, nil
}

// Addr is the address to dial instead of the target.
func (l *Link) Addr() string { return l.ln.Addr().String() }

// Conns is how many connections the link has accepted.
func (l *Link) Conns() int64 { return l.conns.Load() }

// Close stops accepting, closes every relayed connection and waits for
// the relays to end.
func (l *Link) Close() error {
	err := l.ln.Close()
	l.mu.Lock()
	for c := range l.open {
		c.Close()
	}
	l.mu.Unlock()
	l.wg.Wait()
	return err
}

// ResetHolds forgets the recorded holds.
func (l *Link) ResetHolds() {
	l.mu.Lock()
	l.holds = nil
	l.mu.Unlock()
}

// RTTp50 is twice the median hold of the chunks relayed since the last
// ResetHolds (0 when none): the link's own round trip, as delivered.
func (l *Link) RTTp50() time.Duration {
	l.mu.Lock()
	h := slices.Clone(l.holds)
	l.mu.Unlock()
	if len(h) == 0 {
		return 0
	}
	slices.Sort(h)
	return 2 * h[len(h)/2]
}

func (l *Link) accept() {
	defer l.wg.Done()
	for {
		c, err := l.ln.Accept()
		if err != nil {
			return
		}
		l.conns.Add(1)
		t, err := net.Dial("tcp", l.target)
		if err != nil {
			c.Close()
			continue
		}
		l.track(c, t)
		l.wg.Add(2)
		go l.relay(t, c)
		go l.relay(c, t)
	}
}

// track registers relayed connections for Close.
func (l *Link) track(cs ...net.Conn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, c := range cs {
		l.open[c] = struct{}{}
	}
}

func (l *Link) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.open, c)
	l.mu.Unlock()
}

type chunk struct {
	due time.Time
	b   []byte  // the bytes read
	buf *[]byte // the readBufs buffer holding them, put back once written
}

// readBufs holds the relays' 256 KiB read buffers: a buffer per read would
// allocate (and have the collector clear) 256 KiB for every TLS record a
// benchmark's swarm sends.
var readBufs wire.SlicePool[byte]

// relay copies src to dst, each chunk oneWay after it was read; either
// side's end closes both.
func (l *Link) relay(dst, src net.Conn) {
	defer l.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		l.untrack(dst)
		l.untrack(src)
	}()
	q := make(chan chunk, 4096)
	go func() {
		defer close(q)
		for {
			bp := readBufs.Get(256 << 10)
			n, err := src.Read(*bp)
			if n > 0 {
				q <- chunk{time.Now().Add(l.oneWay), (*bp)[:n:n], bp}
			} else {
				readBufs.Put(bp)
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range q {
		if l.oneWay > 0 {
			sleepUntil(c.due)
		}
		_, err := dst.Write(c.b)
		readBufs.Put(c.buf)
		if err != nil {
			src.Close()
			for range q { // let the reader finish
			}
			return
		}
		if l.oneWay > 0 {
			held := time.Since(c.due) + l.oneWay
			l.mu.Lock()
			if len(l.holds) < 1<<20 {
				l.holds = append(l.holds, held)
			}
			l.mu.Unlock()
		}
	}
}
