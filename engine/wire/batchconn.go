package wire

import (
	"net"
	"sync"
)

// BatchConn is a net.Conn whose writes between Begin and End are gathered
// and written together (at End, or each time a limit of 256-512 KiB is
// reached: NewBatchConn); outside a batch every write goes straight
// through. With BufferReads it also reads the socket in large chunks. It exists for the writers that cut one message into
// many small writes that each cost a system call (and, on the reading side,
// a wake-up):
//
//   - github.com/coder/websocket masks a client's frames through its 4 KiB
//     bufio.Writer, so a worker's 256 KiB RESULT reaches the connection as 64
//     writes of 4 KiB; over TLS each becomes a record and a write(2).
//     Batched above the TLS connection the message reaches crypto/tls as one
//     write (16 KiB records); batched below it, the records leave in one
//     write(2) (Batch nests the two).
//   - crypto/tls writes each record with its own write(2): a gateway passing
//     64 KiB of a hub's bytes to its worker makes 4 of them.
//
// The bytes and their order are unchanged: a write from another goroutine
// during a batch (a WebSocket pong, a TLS alert) joins the batch in the
// order it was made, and End writes everything gathered before any later
// write. A write inside a batch returns once its bytes are gathered (or,
// past the limit, written); the error of bytes written later is End's. A
// deadline set on the connection applies to those writes.
//
// The cost is one copy of the batched bytes, against 4-64x fewer system
// calls (docs/BENCHMARKS-by-hand.md, "Writes per message").
type BatchConn struct {
	net.Conn
	under *BatchConn // a batching connection below this one (Batch: above and below TLS), or nil
	limit int        // gathered bytes that are written at once, before End

	mu  sync.Mutex
	on  bool
	bp  *[]byte // the gathered bytes' buffer (batchBufs), held during a batch only
	buf []byte  // the gathered bytes, in *bp

	// Reads (BufferReads): rb holds rb[ri:rn] read from the socket and
	// not yet returned, rerr the error that came with them; rb is a
	// readBufs buffer only while it holds bytes.
	rmu       sync.Mutex
	bufReads  bool
	streaming bool // the last socket read filled its buffer: the next one gathers
	rb        *[]byte
	ri, rn    int
	rerr      error
}

// NewBatchConn returns c with batching; under, when not nil, is a
// BatchConn somewhere below c (c a TLS connection over under) whose batch
// brackets each write c makes of what it gathered, so that the records it
// becomes leave in one system call.
//
// A batch writes what it gathered when it reaches 256 KiB (512 KiB when
// under is nil: the socket's writer, which then takes a whole 256 KiB of an
// upper layer with its records' overhead) and at End, so a large message
// costs a system call per 256-512 KiB and holds no more than that.
//
// A TLS connection over a BatchConn must finish its handshake before the
// first batch: a handshake inside one would wait for the answer to its own
// gathered ClientHello.
func NewBatchConn(c net.Conn, under *BatchConn) *BatchConn {
	limit := 2 * batchLimit
	if under != nil {
		limit = batchLimit
	}
	return &BatchConn{Conn: c, under: under, limit: limit}
}

// batchLimit is an upper BatchConn's write size (bytes).
const batchLimit = 256 << 10

// batchBufs holds the buffers of batches between them (capacity
// 2*batchLimit plus a record's worth of slack).
var batchBufs SlicePool[byte]

// Begin starts a batch (a second Begin before End is the same batch).
func (c *BatchConn) Begin() {
	c.mu.Lock()
	c.on = true
	c.mu.Unlock()
}

// End ends the batch and writes what it gathered, returning the write's
// error.
func (c *BatchConn) End() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.on = false
	err := c.flushLocked()
	if c.bp != nil {
		batchBufs.Put(c.bp)
		c.bp, c.buf = nil, nil
	}
	return err
}

// writeInner writes p to the connection below, inside a batch of under.
func (c *BatchConn) writeInner(p []byte) (int, error) {
	if c.under == nil {
		return c.Conn.Write(p)
	}
	c.under.Begin()
	n, err := c.Conn.Write(p)
	if uerr := c.under.End(); err == nil {
		err = uerr
	}
	return n, err
}

// Write gathers p during a batch (writing what was gathered once it
// reaches the limit) and writes it otherwise.
func (c *BatchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.on {
		return c.Conn.Write(p)
	}
	if len(c.buf) == 0 && len(p) >= c.limit {
		return c.writeInner(p) // nothing to join: no copy
	}
	if c.bp == nil {
		c.bp = batchBufs.Get(2*batchLimit + 64<<10)
		c.buf = (*c.bp)[:0]
	}
	c.buf = append(c.buf, p...)
	if len(c.buf) >= c.limit {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

// flushLocked writes what the batch gathered (c.mu held).
func (c *BatchConn) flushLocked() error {
	if len(c.buf) == 0 {
		return nil
	}
	_, err := c.writeInner(c.buf)
	c.buf = c.buf[:0]
	return err
}

// readChunk is the size of a gathered socket read (BufferReads).
const readChunk = 256 << 10

// readBufs holds the read buffers of BatchConns between reads.
var readBufs SlicePool[byte]

// BufferReads makes c read the socket readChunk bytes at a time for
// readers that ask for less (crypto/tls asks for one record, ~16 KiB, per
// read) while bytes stream in: fewer system calls, one more copy. The
// buffer is pooled and taken only when the last socket read filled what it
// was given (more is likely waiting); otherwise a read goes straight into
// the caller's buffer, so a connection waiting for bytes holds none (an
// idle keep-alive connection held 256 KiB before). Call it before the
// first Read.
func (c *BatchConn) BufferReads() *BatchConn {
	c.bufReads = true
	return c
}

// Buffered is the number of bytes a BufferReads connection has read from
// the socket and not yet returned.
func (c *BatchConn) Buffered() int {
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.rb == nil {
		return 0
	}
	return c.rn - c.ri
}

// Read reads from the connection, through the gathered socket reads when
// BufferReads was called.
func (c *BatchConn) Read(p []byte) (int, error) {
	if !c.bufReads {
		return c.Conn.Read(p)
	}
	c.rmu.Lock()
	defer c.rmu.Unlock()
	if c.rb == nil {
		if err := c.rerr; err != nil {
			c.rerr = nil
			return 0, err
		}
		if len(p) >= readChunk || !c.streaming {
			n, err := c.Conn.Read(p)
			c.streaming = n == len(p) && len(p) > 0
			return n, err
		}
		bp := readBufs.Get(readChunk)
		n, err := c.Conn.Read(*bp)
		c.streaming = n == readChunk
		if n == 0 {
			readBufs.Put(bp)
			return 0, err
		}
		c.rb, c.ri, c.rn, c.rerr = bp, 0, n, err
	}
	n := copy(p, (*c.rb)[c.ri:c.rn])
	c.ri += n
	if c.ri == c.rn {
		readBufs.Put(c.rb)
		c.rb = nil
		if err := c.rerr; err != nil {
			c.rerr = nil
			return n, err
		}
	}
	return n, nil
}

// CloseWrite writes what a batch gathered so far, then half-closes the
// connection below when it can (TCP FIN), as net/http and the gateway's
// splice ask of a connection; otherwise it does nothing more and reports
// no error.
func (c *BatchConn) CloseWrite() error {
	c.mu.Lock()
	err := c.flushLocked()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// Batch runs write inside a batch of c and returns write's error, else
// End's.
func (c *BatchConn) Batch(write func() error) error {
	c.Begin()
	err := write()
	if eerr := c.End(); err == nil {
		err = eerr
	}
	return err
}
