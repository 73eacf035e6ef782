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
//	  |--- HELLO (key, model, holdings, backend, threads, quota, speed) -------------------->|
//	  |<-- WELCOME (session, d, k, n_layer, n_expert, accepted holdings) --------------------|
//	  |<-- ASSIGN (model header, chunk size, experts to hold with sha256 + chunk sha256s) ---|  (provisioning)
//	  |--- CHUNK_REQ (layer, expert, offset, len), a few in flight ------------------------->|
//	  |<-- CHUNK (layer, expert, offset, bytes): after any queued DISPATCH, rate limited ----|
//	  |--- HOLDINGS (quota, added experts with sha256, dropped experts) -------------------->|
//	  |<-- DISPATCH (req, layer, n x d hidden, n x k ids; -1 = not yours) -------------------|
//	  |--- RESULT (req, m x d outputs, m = ids != -1, row-major (row, slot) order) --------->|
//	  |<-- DISPATCH_DIGEST (as DISPATCH; quorum: a second holder's copy) --------------------|
//	  |--- DIGEST (req, m, d, sha256 of the RESULT payload it stands for) ------------------>|
//	  |<-- DISPATCH_SUM (as DISPATCH, every id present, + n x k router weights) -------------|
//	  |--- RESULT (req, n x d: each row's weighted sum of its k outputs) ------------------->|
//	  |<-- DISPATCH_SUM_DIGEST (as DISPATCH_SUM; quorum: a second full holder's copy) -------|
//	  |--- DIGEST (req, n, d, sha256 of the sum RESULT's payload it stands for) ------------>|
//	  |                                  |                           |<-- ACCEPTED(req) -------| (link only)
//	  |                                  |                           |<-- FORFEIT (reason) ----| (link only: a caught worker)
//	  |--- PING (t) every 20 s -------------------------------------------------------------->|
//	  |<-- PONG (t) -------------------------------------------------------------------------|
//	  |--- PAUSE (1) / PAUSE (0): takes no new work / takes work again --------------------->|
//	  |<-> ERROR (req, code, message) either way; the backbone closes a session on any bad frame
//
// The gateway never parses frames; the hub reads only the 4-byte header, a
// RESULT's or DIGEST's request id, m and d, and a DISPATCH_SUM's (or
// DISPATCH_SUM_DIGEST's) request id, n, d and k to meter bytes.
package wire

// Version is the protocol version carried in every frame header and in the
// HELLO. A receiver refuses any other version (ErrVersion).
//
// Changelog:
//
//	1 (2026-11): first version: HELLO, WELCOME, DISPATCH, RESULT, ERROR,
//	             PING, PONG, PAUSE; signed upgrade "kvasir-upgrade-v1".
//	2 (2026-11): expert provisioning (issue 6): HELLO carries the slice's
//	             disk quota (u64 bytes) and a download speed hint (u32 KiB/s)
//	             after threads; new frames ASSIGN, CHUNK_REQ, CHUNK,
//	             HOLDINGS; error code 9 (not assigned). Version 1 peers are
//	             refused (ErrVersion).
//	3 (2026-12): model sources (issue 12): ASSIGN carries a source URL
//	             (source_len u16 | source, after chunk) and, per expert, its
//	             byte ranges in that file (n_range u8 | n_range x (offset
//	             u64 | len u64), after its chunk hashes); with a source the
//	             worker fetches the experts' bytes from it (HTTP range
//	             requests) instead of with CHUNK_REQ. Version 2 peers are
//	             refused (ErrVersion; the backbone's refusal names both
//	             versions).
//	4 (2026-12): quorum verification (issue 20): frame DISPATCH_DIGEST
//	             (0x0D, the layout of DISPATCH: compute the same outputs,
//	             answer with their digest) and DIGEST (0x0E: req u64 | m u32
//	             | d u32 | sha256 [32]u8, the SHA-256 of the m u32 | d u32 |
//	             out bytes of the RESULT the worker would have sent). Other
//	             frames are unchanged. Version 3 peers are refused
//	             (ErrVersion; the backbone's refusal names both versions).
//	5 (2027-01): request timings (issue 19): a RESULT ends with a timing
//	             trailer, queue_us u32 | compute_us u32 (the worker's
//	             queue and compute time of the request, Timing); RESULT is
//	             20 + 4*m*d + 8 bytes, and a DIGEST is metered as that
//	             RESULT. ResultDigest leaves the trailer out. Other frames
//	             are unchanged. Version 4 peers are refused (ErrVersion).
//	6 (2027-01): row sums (issue 19): frame DISPATCH_SUM (0x0F: the
//	             payload of DISPATCH followed by weights [n*k]f32, the
//	             router's weights of every slot; every id present, no -1),
//	             answered by a RESULT of m = n rows, each the weighted sum
//	             of its k expert outputs (expert.WeightedSum). The hub
//	             meters that RESULT as the RESULT of the n*k outputs it
//	             stands for. Other frames are unchanged. Version 5 peers
//	             are refused (ErrVersion).
//	7 (2027-01): row sums under quorum (issue 20): frame
//	             DISPATCH_SUM_DIGEST (0x10, the payload of DISPATCH_SUM:
//	             compute the same row sums, answer with a DIGEST of m = n
//	             rows, the SHA-256 of the sum RESULT's m u32 | d u32 | out
//	             bytes). The hub meters that DIGEST as the RESULT of the n*k
//	             outputs it stands for, as the sum RESULT. Other frames are
//	             unchanged. Version 6 peers are refused (ErrVersion).
const Version uint16 = 7

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
	MaxHoldings = 1 << 20 // HELLO holdings entries; also ASSIGN entries and HOLDINGS adds + drops
	MaxArch     = 64      // ASSIGN architecture name, bytes
	// MaxChunk is the largest CHUNK payload and CHUNK_REQ length, bytes
	// (16 MiB); MinChunk the smallest ASSIGN chunk size (4 KiB).
	MaxChunk = 16 << 20
	MinChunk = 4 << 10
	// MaxExpertSize is the largest expert ASSIGN may name, bytes (4 GiB, the
	// slice format's limit).
	MaxExpertSize = 4 << 30
	// MaxSource is the longest ASSIGN model source URL, bytes.
	MaxSource = 2048
	// MaxRanges is the most byte ranges of one ASSIGN expert.
	MaxRanges = 8
)

// Type is a frame type, the 4th byte of the header.
type Type uint8

// Frame types. The trailing comment is the payload layout after the header.
const (
	TypeHello    Type = 0x01 // key [32]u8 | model_len u16 | model [model_len]u8 | backend_len u16 | backend [backend_len]u8 | threads u16 | quota u64 (slice disk quota, bytes; 0 = take no assignment) | speed u32 (download hint, KiB/s; 0 = unknown) | n_hold u32 | n_hold x (layer u16 | expert u32 | sha256 [32]u8)
	TypeWelcome  Type = 0x02 // session_len u16 | session [session_len]u8 | d u32 | k u16 | n_layer u16 | n_expert u32 | accepted u32
	TypeDispatch Type = 0x03 // req u64 | layer u16 | n u32 | d u32 | k u16 | hidden [n*d]f32 | ids [n*k]i32 (-1 = slot not for this worker)
	TypeResult   Type = 0x04 // req u64 | m u32 | d u32 | out [m*d]f32 (m = ids != -1 of the DISPATCH, in row-major (row, slot) order; m = n rows for a DISPATCH_SUM) | queue_us u32 | compute_us u32 (version 5: Timing)
	TypeError    Type = 0x05 // req u64 (0 = none) | code u16 | msg_len u16 | msg [msg_len]u8 (UTF-8)
	TypePing     Type = 0x06 // time i64 (sender's clock, unix ns)
	TypePong     Type = 0x07 // time i64 (the PING's time, echoed)
	TypePause    Type = 0x08 // paused u8 (1 = worker takes no new DISPATCH, 0 = takes work again)
	// TypeAssign (backbone -> worker) is the complete set of experts the
	// worker should hold (held ones it keeps, missing ones it fetches,
	// held ones not listed it may delete) and what it needs to write them
	// into a slice directory (engine/slice manifest fields). Entries come in
	// the backbone's priority order (most used first).
	// With a source URL the worker fetches each expert's bytes from that
	// file (the full GGUF on any HTTP(S) host): the expert file is the
	// concatenation of its ranges.
	TypeAssign Type = 0x09 // model_len u16 | model | model_sha256 [32]u8 | arch_len u16 | arch | d_ff u32 | chunk u32 (chunk size, bytes, MinChunk..MaxChunk) | source_len u16 | source [source_len]u8 (http(s) URL of the full model file, <= MaxSource; empty: fetch with CHUNK_REQ) | n_lt u16 | n_lt x (layer u16 | gate_type u32 | up_type u32 | down_type u32) (ggml type ids) | n u32 | n x (layer u16 | expert u32 | size u64 | sha256 [32]u8 | n_chunk u32 (= ceil(size/chunk)) | n_chunk x sha256 [32]u8 (of bytes [i*chunk, min(size, (i+1)*chunk)) ) | n_range u8 (0 without a source, else 1..MaxRanges) | n_range x (offset u64 | len u64) (byte ranges of the source file, lens summing to size))
	// TypeChunkReq (worker -> backbone) asks for bytes [offset, offset+len)
	// of an assigned expert's file (gate || up || down).
	TypeChunkReq Type = 0x0A // layer u16 | expert u32 | offset u64 | len u32 (1..MaxChunk)
	// TypeChunk (backbone -> worker) answers a CHUNK_REQ; the backbone sends
	// it after any DISPATCH queued on the same connection.
	TypeChunk Type = 0x0B // layer u16 | expert u32 | offset u64 | n u32 (1..MaxChunk) | data [n]u8
	// TypeHoldings (worker -> backbone) updates what the worker holds and
	// its quota: experts added (downloaded and verified) and dropped.
	TypeHoldings Type = 0x0C // quota u64 | n_add u32 | n_add x (layer u16 | expert u32 | sha256 [32]u8) | n_drop u32 | n_drop x (layer u16 | expert u32)
	// TypeDispatchDigest (backbone -> worker, version 4) is a DISPATCH
	// (same payload, decoded as a *Dispatch with Digest set) whose outputs
	// the worker computes as usual but answers with a DIGEST instead of a
	// RESULT: the backbone compares it with another holder's RESULT for
	// the same pairs (quorum verification).
	TypeDispatchDigest Type = 0x0D // the payload of DISPATCH
	// TypeDigest (worker -> backbone, version 4) answers a DISPATCH_DIGEST:
	// the SHA-256 (FIPS 180-4) of the bytes m u32 | d u32 | out [m*d]f32 of
	// the RESULT the worker would have sent (its payload after the request
	// id; ResultDigest).
	TypeDigest Type = 0x0E // req u64 | m u32 | d u32 | sha256 [32]u8
	// TypeDispatchSum (backbone -> worker, version 6) is a DISPATCH of
	// rows whose k experts the worker all holds, with the router's
	// weights (decoded as a *Dispatch with Sum set): the worker computes
	// the n*k outputs as for DISPATCH and answers with a RESULT of m = n
	// rows, row r being expert.WeightedSum of its k outputs with its
	// weights (the model's order and rounding: float32 products added in
	// slot order).
	TypeDispatchSum Type = 0x0F // req u64 | layer u16 | n u32 | d u32 | k u16 | hidden [n*d]f32 | ids [n*k]i32 (none -1) | weights [n*k]f32
	// TypeDispatchSumDigest (backbone -> worker, version 7) is a
	// DISPATCH_SUM (same payload, decoded as a *Dispatch with Sum and
	// Digest set) whose row sums the worker computes as usual but answers
	// with a DIGEST (m = n rows) of the sum RESULT instead: under quorum
	// the backbone compares it with another full holder's sum RESULT.
	TypeDispatchSumDigest Type = 0x10 // the payload of DISPATCH_SUM
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
	CodeNotAssign uint16 = 9 // a CHUNK_REQ named an expert not assigned to the worker or bytes outside it
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
	case TypeAssign:
		return "ASSIGN"
	case TypeChunkReq:
		return "CHUNK_REQ"
	case TypeChunk:
		return "CHUNK"
	case TypeHoldings:
		return "HOLDINGS"
	case TypeDispatchDigest:
		return "DISPATCH_DIGEST"
	case TypeDigest:
		return "DIGEST"
	case TypeDispatchSum:
		return "DISPATCH_SUM"
	case TypeDispatchSumDigest:
		return "DISPATCH_SUM_DIGEST"
	}
	const hex = "0123456789ABCDEF"
	return "TYPE(0x" + string([]byte{hex[t>>4], hex[t&15]}) + ")"
}
