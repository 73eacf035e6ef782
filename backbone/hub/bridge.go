package hub

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coder/websocket"

	"github.com/kvasir-ai/kvasir/engine/wire"
)

// bridge copies one session's messages between the worker WebSocket c and
// the backbone link until either side ends (run). Two goroutines copy, a
// method each: fromWorker (worker -> backbone) and fromBackbone (backbone
// -> worker). When the worker's side ends first, the link is half-closed
// and read for up to DrainTimeout more, so that the verdicts the backbone
// still owes (LinkAccepted, LinkRejected, LinkForfeit) are metered before
// the session's final ledger entry.
type bridge struct {
	h    *Hub
	ctx  context.Context // the session's: ends when the hub closes
	s    *session
	c    *websocket.Conn
	cb   *wire.BatchConn // c's connection: each message to the worker leaves in one write (nil: unbatched)
	link net.Conn

	wmu sync.Mutex    // guards bw
	bw  *bufio.Writer // the link's writer

	workerEnd  chan string  // the worker -> backbone direction ended, and why
	linkEnd    chan string  // the backbone -> worker direction ended, and why
	workerGone atomic.Bool  // no more writes to c
	writeErr   atomic.Value // string: why a write to the worker failed
}

// newBridge returns the bridge of session s between c and link.
func newBridge(h *Hub, ctx context.Context, s *session, c *websocket.Conn, cb *wire.BatchConn, link net.Conn) *bridge {
	return &bridge{h: h, ctx: ctx, s: s, c: c, cb: cb, link: link, bw: bufio.NewWriterSize(link, 64<<10),
		workerEnd: make(chan string, 1), linkEnd: make(chan string, 1)}
}

// run bridges until either side ends and returns the reason; it closes
// the link and the WebSocket.
func (b *bridge) run() string {
	defer b.link.Close()
	if err := wire.WriteLinkPreamble(b.bw, b.s.id, b.s.worker); err != nil || b.bw.Flush() != nil {
		b.c.Close(websocket.StatusInternalError, "backbone link failed")
		return "backbone link failed"
	}
	go b.fromWorker()
	go b.fromBackbone()
	var reason string
	select {
	case reason = <-b.workerEnd:
		b.workerGone.Store(true)
		// Drain: FIN tells the backbone the worker is gone; it sends the
		// verdicts it still owes and closes the link.
		if hc, ok := b.link.(interface{ CloseWrite() error }); ok {
			_ = hc.CloseWrite()
		}
		drain := b.h.cfg.DrainTimeout
		if b.ctx.Err() != nil {
			drain = min(drain, time.Second)
		}
		_ = b.link.SetReadDeadline(time.Now().Add(drain))
		<-b.linkEnd
	case reason = <-b.linkEnd:
		b.workerGone.Store(true)
		b.c.CloseNow()
		b.link.Close()
		<-b.workerEnd
	}
	b.c.CloseNow()
	return reason
}

// fromWorker copies the worker's messages to the link, metering them,
// until the WebSocket or the link fails; it posts why on workerEnd.
func (b *bridge) fromWorker() {
	var buf bytes.Buffer // reused; dropped after a message larger than ControlMessageCap
	for {
		if buf.Cap() > 2*ControlMessageCap {
			buf = bytes.Buffer{} // a large answer's buffer is not kept for the session's life
		}
		rctx, rcancel := context.WithTimeout(b.ctx, b.h.cfg.IdleTimeout)
		typ, msg, err := readInto(rctx, b.c, &buf, b.s.answerCap)
		rcancel()
		if err != nil {
			var ce websocket.CloseError
			var big errTooLarge
			switch {
			case errors.As(err, &big):
				b.s.fromWorker(nil, int(big.limit)+1)
				b.c.Close(websocket.StatusMessageTooBig, err.Error())
				b.workerEnd <- "worker sent a " + err.Error()
			case b.writeErr.Load() != nil:
				b.workerEnd <- b.writeErr.Load().(string)
			case errors.As(err, &ce):
				b.workerEnd <- fmt.Sprintf("worker closed: %d %s", ce.Code, ce.Reason)
			case b.ctx.Err() != nil:
				b.workerEnd <- "hub closing"
			default:
				b.workerEnd <- "worker read: " + err.Error()
			}
			return
		}
		if typ != websocket.MessageBinary {
			b.s.fromWorker(nil, len(msg))
			b.c.Close(websocket.StatusUnsupportedData, "binary frames only")
			b.workerEnd <- "worker sent a text message"
			return
		}
		b.s.fromWorker(msg, len(msg))
		b.h.fromW.Add(float64(len(msg)))
		b.wmu.Lock()
		err = wire.WriteLink(b.bw, wire.LinkData, msg)
		if err == nil {
			err = b.bw.Flush()
		}
		b.wmu.Unlock()
		if err != nil {
			b.c.Close(websocket.StatusGoingAway, "backbone link lost")
			b.workerEnd <- "backbone write: " + err.Error()
			return
		}
	}
}

// toWorker writes p to the worker as one message, in one system call
// where the connection batches (net/http's 4 KiB writer under
// coder/websocket otherwise cuts a server's frame in two writes: the first
// 4 KiB with the header, then the rest).
func (b *bridge) toWorker(p []byte) error {
	write := func() error { return b.c.Write(b.ctx, websocket.MessageBinary, p) }
	if b.cb == nil {
		return write()
	}
	return b.cb.Batch(write)
}

// fromBackbone reads the link: it delivers and meters DATA to the worker
// (while the worker is there) and meters the backbone's verdicts and
// forfeits, until the link fails or the backbone closes the session; it
// posts why on linkEnd.
func (b *bridge) fromBackbone() {
	h, s, c := b.h, b.s, b.c
	br := bufio.NewReaderSize(b.link, 64<<10)
	var buf []byte // the last payload's memory, reused (nothing below keeps p)
	for {
		kind, p, err := wire.ReadLinkBuf(br, buf)
		buf = p[:0]
		if err != nil {
			if !b.workerGone.Load() {
				c.Close(websocket.StatusGoingAway, "backbone link closed")
			}
			b.linkEnd <- "backbone link: " + err.Error()
			return
		}
		switch kind {
		case wire.LinkData:
			if b.workerGone.Load() {
				continue // the worker is gone: nothing to meter or deliver
			}
			s.toWorker(p)
			h.toW.Add(float64(len(p)))
			if err := b.toWorker(p); err != nil {
				b.writeErr.CompareAndSwap(nil, "worker write: "+err.Error())
				b.workerGone.Store(true)
				c.CloseNow() // ends the worker reader, which half-closes the link
			}
		case wire.LinkAccepted, wire.LinkRejected:
			req, err := wire.LinkRequest(p)
			if err == nil {
				s.verdict(req, kind == wire.LinkAccepted)
			}
		case wire.LinkForfeit:
			n := s.forfeit(string(p))
			h.met.forfeited.Add(float64(n))
			h.log.Warn("hub: session forfeited", "session", s.id, "worker", short(s.worker), "bytes", n, "reason", string(p))
		case wire.LinkClose:
			code, reason, _ := wire.LinkCloseReason(p)
			c.Close(websocket.StatusCode(code), reason)
			b.linkEnd <- "backbone closed session: " + reason
			return
		default:
			c.Close(websocket.StatusInternalError, "bad backbone link")
			b.linkEnd <- fmt.Sprintf("backbone link kind %d", kind)
			return
		}
	}
}

// errTooLarge: a worker message longer than the session may send now
// (session.answerCap).
type errTooLarge struct{ limit int }

func (e errTooLarge) Error() string {
	return fmt.Sprintf("message of more than %d bytes: larger than any answer outstanding", e.limit)
}

// readInto reads one message into buf (reset first) and returns its bytes,
// valid until the next call; a message longer than limit() (asked once
// the message has begun) fails with errTooLarge before more than limit+1
// of its bytes are read.
func readInto(ctx context.Context, c *websocket.Conn, buf *bytes.Buffer, limit func() int) (websocket.MessageType, []byte, error) {
	typ, r, err := c.Reader(ctx)
	if err != nil {
		return 0, nil, err
	}
	buf.Reset()
	l := limit()
	n, err := buf.ReadFrom(io.LimitReader(r, int64(l)+1))
	if err != nil {
		return 0, nil, err
	}
	if n > int64(l) {
		return 0, nil, errTooLarge{l}
	}
	return typ, buf.Bytes(), nil
}
