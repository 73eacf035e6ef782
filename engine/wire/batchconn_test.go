package wire

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"math/big"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// countConn counts the writes and reads that reach it.
type countConn struct {
	net.Conn
	writes, reads atomic.Int64
}

func (c *countConn) Write(p []byte) (int, error) { c.writes.Add(1); return c.Conn.Write(p) }
func (c *countConn) Read(p []byte) (int, error)  { c.reads.Add(1); return c.Conn.Read(p) }

// tcpPair returns the two ends of a loopback TCP connection.
func tcpPair(t *testing.T) (a, b net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ch := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		ch <- c
	}()
	a, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	b = <-ch
	if b == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}

// readAll reads n bytes from c in the background.
func readAll(c net.Conn, n int) <-chan []byte {
	ch := make(chan []byte, 1)
	go func() {
		b := make([]byte, n)
		_, err := io.ReadFull(c, b)
		if err != nil {
			b = nil
		}
		ch <- b
	}()
	return ch
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7 + i/251)
	}
	return b
}

func TestBatchConnGathersWritesInOrder(t *testing.T) {
	a, b := tcpPair(t)
	cc := &countConn{Conn: a}
	bc := NewBatchConn(cc, nil)
	msg := pattern(64*4096 + 123)
	got := readAll(b, len(msg)+3)
	writeInPieces(t, bc, msg)
	if n := cc.writes.Load(); n != 1 {
		t.Fatalf("%d writes reached the socket for one batch, want 1", n)
	}
	if _, err := bc.Write([]byte("end")); err != nil { // outside a batch: straight through
		t.Fatal(err)
	}
	if n := cc.writes.Load(); n != 2 {
		t.Fatalf("%d writes after an unbatched one, want 2", n)
	}
	if !bytes.Equal(<-got, append(msg, "end"...)) {
		t.Fatal("bytes differ from what was written")
	}
}

func TestBatchConnConcurrentWriterKeepsOrder(t *testing.T) {
	a, b := tcpPair(t)
	bc := NewBatchConn(a, nil)
	got := readAll(b, 3)
	bc.Begin()
	bc.Write([]byte("A"))
	done := make(chan struct{})
	go func() { // a pong written by another goroutine during the batch
		bc.Write([]byte("B"))
		close(done)
	}()
	<-done
	if err := bc.End(); err != nil {
		t.Fatal(err)
	}
	bc.Write([]byte("C"))
	if g := string(<-got); g != "ABC" {
		t.Fatalf("got %q, want ABC", g)
	}
}

func TestBatchConnEndReportsWriteError(t *testing.T) {
	a, _ := tcpPair(t)
	bc := NewBatchConn(a, nil)
	a.Close()
	err := bc.Batch(func() error {
		_, err := bc.Write([]byte("lost"))
		return err
	})
	if !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Batch on a closed connection: %v, want net.ErrClosed", err)
	}
}

// selfSigned returns a TLS certificate for 127.0.0.1 and a pool trusting it.
func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// TestBatchConnAroundTLS is the worker's stack: a message written in 4 KiB
// pieces to a BatchConn above TLS, over a BatchConn below it, leaves in one
// socket write, and a TLS reader over a BatchConn with BufferReads reads
// it back exactly with far fewer socket reads than records.
func TestBatchConnAroundTLS(t *testing.T) {
	a, b := tcpPair(t)
	cert, pool := selfSigned(t)
	ca := &countConn{Conn: a}
	under := NewBatchConn(ca, nil)
	client := tls.Client(under, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	cb := &countConn{Conn: b}
	server := tls.Server(NewBatchConn(cb, nil).BufferReads(), &tls.Config{Certificates: []tls.Certificate{cert}})
	handshake(t, client, server)
	upper := NewBatchConn(client, under)
	msg := pattern(256 << 10)
	got := make(chan []byte, 1)
	go func() {
		out := make([]byte, 0, len(msg))
		buf := make([]byte, 16<<10)
		for len(out) < len(msg) {
			n, err := server.Read(buf)
			out = append(out, buf[:n]...)
			if err != nil {
				break
			}
		}
		got <- out
	}()
	w0, r0 := ca.writes.Load(), cb.reads.Load()
	writeInPieces(t, upper, msg)
	if !bytes.Equal(<-got, msg) {
		t.Fatal("bytes through TLS differ")
	}
	if n := ca.writes.Load() - w0; n != 1 {
		t.Errorf("%d socket writes for a 256 KiB message, want 1", n)
	}
	// 16 records of 16 KiB arrive together: 256 KiB socket reads take 2
	// (crypto/tls alone asks for about a record at a time: 16 or more).
	if n := cb.reads.Load() - r0; n > 8 {
		t.Errorf("%d socket reads for 16 records, want at most 8", n)
	}
}

// writeInPieces writes msg to c in one batch of 4 KiB writes, as
// coder/websocket writes a client's frame (the last piece may be shorter).
func writeInPieces(t *testing.T, c *BatchConn, msg []byte) {
	t.Helper()
	err := c.Batch(func() error {
		for p := msg; len(p) > 0; {
			n := min(4096, len(p))
			if _, err := c.Write(p[:n]); err != nil {
				return err
			}
			p = p[n:]
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// handshake completes the TLS handshake of client and server.
func handshake(t *testing.T, client, server *tls.Conn) {
	t.Helper()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := server.Handshake(); err != nil {
			t.Error(err)
		}
	}()
	if err := client.Handshake(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// errAfter returns data then err from one Read, as a socket may.
type errAfter struct {
	net.Conn
	data []byte
	err  error
}

func (e *errAfter) Read(p []byte) (int, error) {
	if len(e.data) == 0 {
		return 0, e.err
	}
	n := copy(p, e.data)
	e.data = e.data[n:]
	if len(e.data) == 0 {
		return n, e.err
	}
	return n, nil
}

func TestBatchConnBufferedReadsKeepDataBeforeError(t *testing.T) {
	bc := NewBatchConn(&errAfter{data: []byte("hello world"), err: io.EOF}, nil).BufferReads()
	buf := make([]byte, 4)
	out := readToEOF(t, bc, buf, 100)
	if string(out) != "hello world" {
		t.Fatalf("read %q before EOF, want %q", out, "hello world")
	}
	if n, err := bc.Read(buf); n != 0 || err != io.EOF {
		t.Fatalf("after EOF: %d, %v", n, err)
	}
}

// TestBatchConnLargeMessageInLimitedWrites: a 3 MiB message through the
// worker's stack leaves in socket writes of about 256 KiB (not one 3 MiB
// buffer), and arrives exactly.
func TestBatchConnLargeMessageInLimitedWrites(t *testing.T) {
	a, b := tcpPair(t)
	cert, pool := selfSigned(t)
	ca := &countConn{Conn: a}
	under := NewBatchConn(ca, nil)
	client := tls.Client(under, &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
	server := tls.Server(NewBatchConn(b, nil).BufferReads(), &tls.Config{Certificates: []tls.Certificate{cert}})
	handshake(t, client, server) // before batching: a handshake inside a batch would wait on its own gathered ClientHello
	msg := pattern(3 << 20)
	got := make(chan []byte, 1)
	go func() {
		out := make([]byte, len(msg))
		if _, err := io.ReadFull(server, out); err != nil {
			out = nil
		}
		got <- out
	}()
	upper := NewBatchConn(client, under)
	writeInPieces(t, upper, msg)
	if !bytes.Equal(<-got, msg) {
		t.Fatal("bytes through TLS differ")
	}
	// The handshake's writes, then 12 of 256 KiB.
	if n := ca.writes.Load(); n < 12 || n > 16 {
		t.Errorf("%d socket writes for a 3 MiB message, want 12 (256 KiB each) plus the handshake's", n)
	}
}

// asked records the size of every socket read made of it and serves data
// from a stream.
type asked struct {
	net.Conn
	data []byte
	lens []int
}

func (a *asked) Read(p []byte) (int, error) {
	a.lens = append(a.lens, len(p))
	if len(a.data) == 0 {
		return 0, io.EOF
	}
	n := copy(p, a.data)
	a.data = a.data[n:]
	return n, nil
}

// TestBatchConnIdleReadHoldsNoBuffer: a BufferReads connection reads the
// socket into the caller's buffer until a read fills it (bytes are
// streaming); only then does it gather readChunk at a time, and it goes
// back to direct reads after a read that did not fill its chunk. So a
// connection waiting for bytes (an idle keep-alive connection) holds no
// pooled 256 KiB buffer; the bytes and their order are unchanged.
func TestBatchConnIdleReadHoldsNoBuffer(t *testing.T) {
	stream := make([]byte, 3*readChunk/2)
	for i := range stream {
		stream[i] = byte(i * 7)
	}
	a := &asked{data: stream}
	bc := NewBatchConn(a, nil).BufferReads()
	out := readToEOF(t, bc, make([]byte, 1000), len(stream))
	if !bytes.Equal(out, stream) {
		t.Fatalf("read %d bytes, not the stream's %d", len(out), len(stream))
	}
	// The first read is direct (1000 bytes asked, all filled: streaming),
	// then chunks: a full one, a partial one (the rest), then direct
	// reads again, the last of which finds the end.
	want := []int{1000, readChunk, readChunk, 1000}
	if len(a.lens) != len(want) {
		t.Fatalf("socket reads of %v, want %v", a.lens, want)
	}
	for i := range want {
		if a.lens[i] != want[i] {
			t.Fatalf("socket reads of %v, want %v", a.lens, want)
		}
	}
}

// readToEOF reads r with buf until io.EOF and returns what it read; more
// than limit bytes without EOF fails the test.
func readToEOF(t *testing.T, r io.Reader, buf []byte, limit int) []byte {
	t.Helper()
	var out []byte
	for {
		n, err := r.Read(buf)
		out = append(out, buf[:n]...)
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(out) > limit {
			t.Fatal("no EOF")
		}
	}
}
