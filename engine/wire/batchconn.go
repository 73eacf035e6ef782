package wire

import (
	"net"
	"sync"
)

// BatchConn is a net.Conn whose writes between Begin and End are gathered
// and written with one system call at End; outside a batch every write goes
// straight through. It exists for the writers that cut one message into
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
// write. Writes inside a batch report success at once; an error of the
// gathered bytes is End's (and the connection's next write's). A deadline
// set on the connection applies to End's write.
//
// The cost is one copy of the batched bytes, against 4-64x fewer system
// calls (docs/BENCHMARKS-by-hand.md, "Writes per message").
type BatchConn struct {
	net.Conn
	under *BatchConn // a batching connection below this one (Batch: above and below TLS), or nil

	mu  sync.Mutex
	on  bool
	buf []byte

	// Reads (BufferReads): rb holds rb[ri:rn] read from the socket and
	// not yet returned, rerr the error that came with them; rb is a
	// readBufs buffer only while it holds bytes.
	rmu      sync.Mutex
	bufReads bool
	rb       *[]byte
	ri, rn   int
	rerr     error
}

// readChunk is the size of a gathered socket read (BufferReads).
const readChunk = 64 << 10

// readBufs holds the read buffers of BatchConns between reads.
var readBufs SlicePool[byte]

// BufferReads makes c read the socket readChunk bytes at a time for
// readers that ask for less (crypto/tls asks for one record, ~16 KiB, per
// read): fewer system calls, one more copy. The buffer is pooled and held
// only while it has bytes not yet returned, so an idle connection holds
// none. Call it before the first Read.
func (c *BatchConn) BufferReads() *BatchConn {
	c.bufReads = true
	return c
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
		if len(p) >= readChunk {
			return c.Conn.Read(p)
		}
		bp := readBufs.Get(readChunk)
		n, err := c.Conn.Read(*bp)
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

// NewBatchConn returns c with batching; under, when not nil, is a
// BatchConn somewhere below c (c a TLS connection over under) that End
// brackets in a batch of its own, so that what c writes at End leaves in one
// system call.
func NewBatchConn(c net.Conn, under *BatchConn) *BatchConn {
	return &BatchConn{Conn: c, under: under}
}

// maxKeep is the largest buffer End keeps for the next batch (bytes);
// a larger one is dropped so that one big message does not pin its size.
const maxKeep = 1 << 20

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
	if len(c.buf) == 0 {
		return nil
	}
	if c.under != nil {
		c.under.Begin()
	}
	_, err := c.Conn.Write(c.buf)
	if c.under != nil {
		if uerr := c.under.End(); err == nil {
			err = uerr
		}
	}
	if cap(c.buf) > maxKeep {
		c.buf = nil
	} else {
		c.buf = c.buf[:0]
	}
	return err
}

// Write gathers p during a batch and writes it otherwise.
func (c *BatchConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.on {
		c.buf = append(c.buf, p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
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
