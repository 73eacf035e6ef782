// Package wire is kvasir's dispatch protocol: the versioned binary frames that
// carry hidden rows from the backbone to a worker and expert outputs back,
// plus the signed WebSocket upgrade that authenticates a worker and the
// framing of the hub<->backbone link. docs/protocol.md is the prose version.
//
// Transport: each frame is exactly one WebSocket binary message
// (github.com/coder/websocket, compression disabled). All integers and floats
// are little-endian; floats are IEEE-754 binary32, bit-exact. Every message
// starts with a 4-byte header:
//
//	magic u8 = 0x6B ('k') | version u16 = Version | type u8
//
// followed by the payload of that type (layouts next to the Type constants).
// A message is at most MaxMessage bytes; receivers set that as the WebSocket
// read limit and the decoder refuses anything larger.
//
// Protocol flow (one worker session):
//
//	worker                          gateway (TLS, public)        hub (LAN)            backbone dispatcher
//	  |--- GET /v1/worker, signed ------>|                           |                         |
//	  |    X-Kvasir-Key/Time/Nonce/Sig   |-- same request + HMAC --->|                         |
//	  |                                  |   X-Kvasir-Worker...      |-- TCP link, preamble -->|
//	  |<============== 101 Switching Protocols, then raw byte splice ===============>|          |
//	  |--- HELLO (key, model, holdings, backend, threads) ---------------------------------->|
//	  |<-- WELCOME (session, d, k, n_layer, n_expert, accepted holdings) --------------------|
//	  |<-- DISPATCH (req, layer, n x d hidden, n x k ids; -1 = not yours) -------------------|
//	  |--- RESULT (req, m x d outputs, m = ids != -1, row-major (row, slot) order) --------->|
//	  |                                  |                           |<-- ACCEPTED(req) -------| (link only)
//	  |--- PING (t) every 20 s -------------------------------------------------------------->|
//	  |<-- PONG (t) -------------------------------------------------------------------------|
//	  |--- PAUSE (1) / PAUSE (0): takes no new work / takes work again --------------------->|
//	  |<-> ERROR (req, code, message) either way; the backbone closes a session on any bad frame
//
// The gateway never parses frames; the hub reads only the 4-byte header and a
// RESULT's request id to meter bytes.
package wire

// Version is the protocol version carried in every frame header and in the
// HELLO. A receiver refuses any other version (ErrVersion).
//
// Changelog:
//
//	1 (2026-11): first version: HELLO, WELCOME, DISPATCH, RESULT, ERROR,
//	             PING, PONG, PAUSE; signed upgrade "kvasir-upgrade-v1".
const Version uint16 = 1

// Magic is the first byte of every frame.
const Magic byte = 0x6B

// HeaderSize is the size in bytes of the frame header (magic, version, type).
const HeaderSize = 4

// MaxMessage is the hard maximum size of one WebSocket message (one frame) in
// bytes, 64 MiB. Receivers pass it to (*websocket.Conn).SetReadLimit.
const MaxMessage = 64 << 20

// Limits on variable-length strings and lists, in bytes or entries.
const (
	MaxModelID  = 256     // HELLO model id, bytes
	MaxBackend  = 256     // HELLO backend description, bytes
	MaxSession  = 128     // WELCOME session id, bytes
	MaxErrorMsg = 1024    // ERROR message, bytes
	MaxHoldings = 1 << 20 // HELLO holdings entries
)

// Type is a frame type, the 4th byte of the header.
type Type uint8

// Frame types. The trailing comment is the payload layout after the header.
const (
	TypeHello    Type = 0x01 // key [32]u8 | model_len u16 | model [model_len]u8 | backend_len u16 | backend [backend_len]u8 | threads u16 | n_hold u32 | n_hold x (layer u16 | expert u32 | sha256 [32]u8)
	TypeWelcome  Type = 0x02 // session_len u16 | session [session_len]u8 | d u32 | k u16 | n_layer u16 | n_expert u32 | accepted u32
	TypeDispatch Type = 0x03 // req u64 | layer u16 | n u32 | d u32 | k u16 | hidden [n*d]f32 | ids [n*k]i32 (-1 = slot not for this worker)
	TypeResult   Type = 0x04 // req u64 | m u32 | d u32 | out [m*d]f32 (m = ids != -1 of the DISPATCH, in row-major (row, slot) order)
	TypeError    Type = 0x05 // req u64 (0 = none) | code u16 | msg_len u16 | msg [msg_len]u8 (UTF-8)
	TypePing     Type = 0x06 // time i64 (sender's clock, unix ns)
	TypePong     Type = 0x07 // time i64 (the PING's time, echoed)
	TypePause    Type = 0x08 // paused u8 (1 = worker takes no new DISPATCH, 0 = takes work again)
)

// Error codes carried by ERROR frames.
const (
	CodeInternal  uint16 = 1 // the sender failed (e.g. the expert computation returned an error)
	CodeBadFrame  uint16 = 2 // the peer's frame was invalid; the session closes
	CodeNotHeld   uint16 = 3 // a DISPATCH named an expert the worker does not hold
	CodePaused    uint16 = 4 // the worker is paused and did not compute the request
	CodeModel     uint16 = 5 // model id or shapes do not match
	CodeProtocol  uint16 = 6 // unexpected frame type or version
	CodeShutdown  uint16 = 7 // the sender is shutting down
	CodeBadResult uint16 = 8 // a RESULT had the wrong shape or an unknown request id
)

// String returns the frame type's upper-case name, or "TYPE(0xNN)".
func (t Type) String() string {
	switch t {
	case TypeHello:
		return "HELLO"
	case TypeWelcome:
		return "WELCOME"
	case TypeDispatch:
		return "DISPATCH"
	case TypeResult:
		return "RESULT"
	case TypeError:
		return "ERROR"
	case TypePing:
		return "PING"
	case TypePong:
		return "PONG"
	case TypePause:
		return "PAUSE"
	}
	const hex = "0123456789ABCDEF"
	return "TYPE(0x" + string([]byte{hex[t>>4], hex[t&15]}) + ")"
}
