package wire

import (
	"bufio"
	"errors"
	"fmt"
	"io"
)

// The hub<->backbone link is one TCP connection per worker session, opened by
// the hub to the backbone's dispatch listener. The hub first writes a
// preamble, then both sides exchange length-prefixed link frames:
//
//	preamble (hub -> backbone, once):
//	  "KVLK" | version u16 | session_len u16 | session | worker_len u16 | worker (hex public key)
//	link frame (both ways):
//	  len u32 (bytes after this field, 1..MaxMessage+1) | kind u8 | payload [len-1]u8
//
// The worker's WebSocket messages travel as LinkData frames unchanged in both
// directions. Control kinds travel on the link only and never reach the worker.
//
// End of a session (version 2): when the worker's side ends first, the hub
// half-closes the link (TCP FIN, it sends nothing more) and keeps reading
// it: the backbone sends the verdicts of the RESULTs it is still verifying
// (LinkAccepted, LinkRejected, LinkForfeit) and then closes the link. The
// hub reads for at most its drain timeout.
const (
	// LinkVersion is the link protocol version in the preamble.
	//
	// Changelog:
	//
	//	1 (2026-11): DATA, ACCEPTED, REJECTED, CLOSE.
	//	2 (2026-12): FORFEIT (issue 11: a result failed verification, the
	//	             session's bytes not yet settled are never credited);
	//	             the hub half-closes and drains the link at the end of a
	//	             session. A version 1 hub is refused with a LinkClose
	//	             naming both versions (ErrLinkVersion).
	LinkVersion uint16 = 2

	LinkData     byte = 1 // payload: one WebSocket message (a wire frame), either direction
	LinkAccepted byte = 2 // backbone -> hub; payload: req u64 — the RESULT for req was accepted (creditable)
	LinkRejected byte = 3 // backbone -> hub; payload: req u64 — the RESULT for req was refused or late (never credited)
	LinkClose    byte = 4 // backbone -> hub; payload: code u16 (WebSocket close code) | reason (UTF-8, <= 123 bytes)
	// LinkForfeit (backbone -> hub; payload: reason, UTF-8, <= 123 bytes):
	// the worker was caught returning a wrong result. Every creditable byte
	// of the session that the hub has not yet settled into the ledger, and
	// every later one, becomes rejected (docs/accounting.md, "Verification
	// and forfeit").
	LinkForfeit byte = 5
)

const linkMagic = "KVLK"

// ErrLink wraps every malformed-link error.
var ErrLink = errors.New("wire: bad link frame")

// ErrLinkVersion (wrapping ErrLink) is ReadLinkPreamble's error for a
// preamble of another link version; its message names both versions.
var ErrLinkVersion = fmt.Errorf("%w: unsupported link version", ErrLink)

// WriteLinkPreamble writes the hub's link preamble naming the session and the
// authenticated worker id (hex public key).
func WriteLinkPreamble(w io.Writer, session, worker string) error {
	if len(session) > MaxSession || len(worker) > 128 {
		return fmt.Errorf("%w: preamble strings too long", ErrLink)
	}
	b := []byte(linkMagic)
	b = le.AppendUint16(b, LinkVersion)
	b = appendStr(b, session)
	b = appendStr(b, worker)
	_, err := w.Write(b)
	return err
}

// ReadLinkPreamble reads the preamble written by WriteLinkPreamble and returns
// the session id and the worker id. Errors wrap ErrLink (ErrLinkVersion for
// a preamble of another version: answer it with LinkClose and the error's
// message, which both versions understand) or are I/O errors.
func ReadLinkPreamble(r io.Reader) (session, worker string, err error) {
	var h [6]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return "", "", err
	}
	if string(h[:4]) != linkMagic {
		return "", "", fmt.Errorf("%w: preamble magic %q", ErrLink, h[:4])
	}
	if v := le.Uint16(h[4:]); v != LinkVersion {
		return "", "", fmt.Errorf("%w %d, the backbone speaks %d: upgrade the hub", ErrLinkVersion, v, LinkVersion)
	}
	rd := func(max int) (string, error) {
		var l [2]byte
		if _, err := io.ReadFull(r, l[:]); err != nil {
			return "", err
		}
		n := int(le.Uint16(l[:]))
		if n > max {
			return "", fmt.Errorf("%w: preamble string %d bytes", ErrLink, n)
		}
		s := make([]byte, n)
		_, err := io.ReadFull(r, s)
		return string(s), err
	}
	if session, err = rd(MaxSession); err != nil {
		return "", "", err
	}
	worker, err = rd(128)
	return session, worker, err
}

// WriteLink writes one link frame of kind whose payload is the concatenation
// of parts (so a message need not be copied). It does not flush w.
func WriteLink(w io.Writer, kind byte, parts ...[]byte) error {
	n := 1
	for _, p := range parts {
		n += len(p)
	}
	if n > MaxMessage+1 {
		return fmt.Errorf("%w: %d bytes", ErrTooLarge, n)
	}
	var h [5]byte
	le.PutUint32(h[:], uint32(n))
	h[4] = kind
	if _, err := w.Write(h[:]); err != nil {
		return err
	}
	for _, p := range parts {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return nil
}

// ReadLink reads one link frame and returns its kind and a freshly allocated
// payload. A length of 0 or above MaxMessage+1 wraps ErrLink; a short read is
// an I/O error (io.ErrUnexpectedEOF).
func ReadLink(r *bufio.Reader) (kind byte, payload []byte, err error) {
	return ReadLinkBuf(r, nil)
}

// ReadLinkBuf is ReadLink reading the payload into buf's memory when its
// capacity suffices (else into a new slice): a reader that passes the
// previous payload back (payload[:0]) allocates only when a frame is
// larger than all before it. The payload is valid until buf is reused;
// Decode's frames share no memory with it.
func ReadLinkBuf(r *bufio.Reader, buf []byte) (kind byte, payload []byte, err error) {
	var h [5]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := le.Uint32(h[:])
	if n == 0 || n > MaxMessage+1 {
		return 0, nil, fmt.Errorf("%w: length %d", ErrLink, n)
	}
	if cap(buf) >= int(n-1) {
		payload = buf[:n-1]
	} else {
		payload = make([]byte, n-1)
	}
	if _, err := io.ReadFull(r, payload); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return h[4], payload, nil
}

// LinkRequest decodes the u64 request id of a LinkAccepted or LinkRejected
// payload.
func LinkRequest(payload []byte) (uint64, error) {
	if len(payload) != 8 {
		return 0, fmt.Errorf("%w: request payload %d bytes", ErrLink, len(payload))
	}
	return le.Uint64(payload), nil
}

// AppendLinkRequest appends a request id payload (u64).
func AppendLinkRequest(b []byte, req uint64) []byte { return le.AppendUint64(b, req) }

// LinkCloseReason decodes a LinkClose payload into a WebSocket close code and
// reason.
func LinkCloseReason(payload []byte) (code uint16, reason string, err error) {
	if len(payload) < 2 {
		return 0, "", fmt.Errorf("%w: close payload %d bytes", ErrLink, len(payload))
	}
	return le.Uint16(payload), clip(string(payload[2:]), 123), nil
}

// AppendLinkForfeit appends a LinkForfeit payload: the reason, cut to 123
// bytes on a UTF-8 boundary.
func AppendLinkForfeit(b []byte, reason string) []byte { return append(b, clip(reason, 123)...) }

// AppendLinkClose appends a LinkClose payload; the reason is cut to 123 bytes
// (the WebSocket close reason limit, RFC 6455 section 5.5).
func AppendLinkClose(b []byte, code uint16, reason string) []byte {
	return append(le.AppendUint16(b, code), clip(reason, 123)...)
}
