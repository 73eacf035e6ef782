package wire

import (
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/bits"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"
)

// Sentinel errors returned (wrapped) by the decoder. Any of them means the
// message is invalid and the receiver closes the session with the reason.
var (
	ErrTruncated = errors.New("wire: truncated frame")
	ErrTooLarge  = errors.New("wire: frame too large")
	ErrMagic     = errors.New("wire: bad magic")
	ErrVersion   = errors.New("wire: unsupported protocol version")
	ErrType      = errors.New("wire: unknown frame type")
	ErrShape     = errors.New("wire: shape does not match the model")
	ErrRange     = errors.New("wire: value out of range")
	ErrNotHeld   = errors.New("wire: expert not held")
	ErrTrailing  = errors.New("wire: trailing bytes after frame")
	ErrString    = errors.New("wire: invalid string")
)

// Limits are the model shapes a decoder validates DISPATCH, RESULT, HELLO and
// WELCOME frames against. The backbone knows them from its model; a worker
// learns them from WELCOME.
type Limits struct {
	D       int // hidden size d (floats per row), > 0 for DISPATCH/RESULT
	K       int // experts per row (top-k routing), > 0 for DISPATCH
	NLayer  int // number of layers; layer ids are in [0, NLayer)
	NExpert int // experts per layer; expert ids are in [0, NExpert)
	// MaxRows bounds n in DISPATCH and m in RESULT (m <= MaxRows*K); 0 means
	// only MaxMessage bounds them.
	MaxRows int
	// Holds, when non-nil, reports whether the receiver holds (layer, expert);
	// a DISPATCH naming an expert it does not hold fails with ErrNotHeld.
	Holds func(layer, expert int) bool
	// Floats, when non-nil, gives the float slices Decode fills (a
	// DISPATCH's hidden rows and weights, a RESULT's outputs): len n, any
	// contents (all n are overwritten), so that a receiver can recycle
	// them; nil allocates.
	Floats func(n int) []float32
}

// FloatPool recycles float slices by capacity class (a power of two, so
// that a slice serves only requests that fit it): a Limits.Floats for a
// receiver that gives the decoded slices back once done with them. The
// zero value is ready; it is safe for concurrent use.
type FloatPool [bits.UintSize + 1]sync.Pool

// Get returns n floats (contents undefined) of capacity the power of two
// at or above n; nil for n <= 0.
func (p *FloatPool) Get(n int) []float32 {
	if n <= 0 {
		return nil
	}
	c := bits.Len(uint(n - 1))
	if v, _ := p[c].Get().(*[]float32); v != nil {
		return (*v)[:n]
	}
	return make([]float32, n, 1<<c)
}

// Put gives b back for reuse; the caller keeps no reference to it. A
// slice Get did not return (its capacity not a power of two) is ignored.
func (p *FloatPool) Put(b []float32) {
	if c := bits.Len(uint(cap(b) - 1)); cap(b) > 0 && cap(b) == 1<<c {
		p[c].Put(&b)
	}
}

// floats returns n floats for Decode to fill: from lim.Floats, or new.
func (lim *Limits) floats(n int) []float32 {
	if lim.Floats != nil {
		return lim.Floats(n)[:n]
	}
	return make([]float32, n)
}

// Frame is one decoded protocol frame: *Hello, *Welcome, *Dispatch (also a
// DISPATCH_DIGEST, a DISPATCH_SUM or a DISPATCH_SUM_DIGEST), *Result, *Digest, *Error, *Ping, *Pong, *Pause,
// *Assign, *ChunkReq, *Chunk or *Holdings.
type Frame interface {
	// Type is the frame's type byte.
	Type() Type
	// Append appends the whole encoded message (header and payload) to b and
	// returns the extended slice.
	Append(b []byte) []byte
}

// Holding is one expert a worker holds: (layer, expert) and the SHA-256 of
// the expert's bytes as stored in its slice.
type Holding struct {
	Layer  uint16
	Expert uint32
	SHA256 [32]byte
}

// Hello is the worker's first message: who it is and what it holds.
type Hello struct {
	Key      ed25519.PublicKey // 32 bytes, must equal the key that signed the upgrade
	ModelID  string            // model identity, <= MaxModelID bytes of UTF-8
	Backend  string            // e.g. "cpu-avx2", <= MaxBackend bytes of UTF-8
	Threads  uint16            // compute threads the worker uses
	Quota    uint64            // disk quota of the worker's slice, bytes (held experts count); 0: no assignment
	Speed    uint32            // download speed hint, KiB/s; 0: unknown
	Holdings []Holding         // <= MaxHoldings entries, no duplicates
}

// Welcome is the backbone's answer to HELLO: the session id and model shapes.
type Welcome struct {
	Session  string // hub-assigned session id, <= MaxSession bytes
	D        uint32 // hidden size
	K        uint16 // experts per row
	NLayer   uint16 // layers
	NExpert  uint32 // experts per layer
	Accepted uint32 // holdings the backbone accepted (hash and range checked)
}

// Dispatch asks a worker to compute the experts of one layer for N rows.
// Hidden is N x D float32 row-major; IDs is N x K int32 row-major, where -1
// marks a slot this worker must not compute. The RESULT carries one output
// row (D floats) per id != -1, in row-major (row, slot) order. With
// Digest set the frame is a DISPATCH_DIGEST: the worker answers with a
// DIGEST of that RESULT instead. With Sum set it is a DISPATCH_SUM
// (version 6): no id is -1, Weights holds the router's N x K weights
// (row-major, slot order), and the RESULT carries N rows, row r the
// weighted sum of its K outputs (expert.WeightedSum). With both Sum and
// Digest set it is a DISPATCH_SUM_DIGEST (version 7): the worker answers
// with a DIGEST of that sum RESULT (m = N rows) instead.
type Dispatch struct {
	Request uint64
	Layer   uint16
	N, D, K int
	Hidden  []float32
	IDs     []int32
	Digest  bool      // a DISPATCH_DIGEST (with Sum: a DISPATCH_SUM_DIGEST): answer with DIGEST
	Sum     bool      // a DISPATCH_SUM: answer with the rows' weighted sums
	Weights []float32 // N x K router weights; DISPATCH_SUM and DISPATCH_SUM_DIGEST only
}

// Digest is a worker's answer to a DISPATCH_DIGEST: M and D of the RESULT
// it stands for and the SHA-256 of that RESULT's payload after the request
// id (ResultDigest).
type Digest struct {
	Request uint64
	M, D    int
	Sum     [32]byte
}

// DigestSize is the encoded size in bytes of a DIGEST: 4 + 8 + 4 + 4 + 32.
const DigestSize = HeaderSize + 48

// ResultDigest returns the digest a DIGEST carries for a RESULT message
// (header included): the SHA-256 of its bytes after the request id up to
// the timing trailer, m u32 | d u32 | out. A RESULT for another request id,
// or with other timings, and the same outputs has the same digest.
func ResultDigest(result []byte) [32]byte {
	if len(result) < HeaderSize+8+TimingSize {
		return sha256.Sum256(nil)
	}
	return sha256.Sum256(result[HeaderSize+8 : len(result)-TimingSize])
}

// OutputsDigest returns ResultDigest of a RESULT of m rows of d floats
// carrying out, without encoding the RESULT: the SHA-256 of m u32 | d u32
// | out, streamed through a small buffer.
func OutputsDigest(m, d int, out []float32) [32]byte {
	h := sha256.New()
	buf := make([]byte, 0, 64<<10)
	buf = le.AppendUint32(buf, uint32(m))
	buf = le.AppendUint32(buf, uint32(d))
	for len(out) > 0 {
		n := min(len(out), (cap(buf)-len(buf))/4)
		buf = AppendFloats(buf, out[:n])
		out = out[n:]
		h.Write(buf)
		buf = buf[:0]
	}
	if len(buf) > 0 {
		h.Write(buf)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum
}

// DigestCredit returns the size of the RESULT a DIGEST message stands for,
// ResultSize(m, d), after checking the header and the DIGEST's exact
// length; ok is false for any other message or a size above MaxMessage.
// The hub meters an accepted DIGEST as that many bytes.
func DigestCredit(msg []byte) (req uint64, size int, ok bool) {
	if t, err := Peek(msg); err != nil || t != TypeDigest || len(msg) != DigestSize {
		return 0, 0, false
	}
	m, d := uint64(le.Uint32(msg[HeaderSize+8:])), uint64(le.Uint32(msg[HeaderSize+12:]))
	n := uint64(ResultSize(0, 0)) + 4*m*d // m, d < 2^32: no overflow
	if m == 0 || d == 0 || n > MaxMessage {
		return 0, 0, false
	}
	return le.Uint64(msg[HeaderSize:]), int(n), true
}

// Result is a worker's answer: M output rows of D float32, M being the count
// of ids != -1 in the DISPATCH with the same Request, and (version 5) the
// worker's own timing of the request.
type Result struct {
	Request uint64
	M, D    int
	Out     []float32
	Timing  Timing
}

// Timing is the trailer of a RESULT (version 5): how long the worker held
// the request, in microseconds (saturating at 2^32-1). Queue runs from the
// moment the DISPATCH message was read whole to the start of the
// computation (decode, the queue behind earlier DISPATCHes, gathering the
// rows); Compute is the expert computation itself. The backbone subtracts
// both from its round trip to get the wire's share (network, TLS, hub,
// encode, decode). Advisory: nothing is verified or paid by it.
type Timing struct {
	QueueMicros, ComputeMicros uint32
}

// TimingSize is the size in bytes of a RESULT's timing trailer.
const TimingSize = 8

// Micros converts d to a Timing field: microseconds, clamped to [0, 2^32-1].
func Micros(d time.Duration) uint32 {
	return uint32(max(0, min(int64(d/time.Microsecond), math.MaxUint32)))
}

// Error reports a failure; Request is 0 when it concerns no request.
type Error struct {
	Request uint64
	Code    uint16
	Message string // <= MaxErrorMsg bytes of UTF-8
}

// Ping asks for a Pong; Time is the sender's clock in unix nanoseconds.
type Ping struct{ Time int64 }

// Pong echoes a Ping's Time, giving the sender the round-trip time.
type Pong struct{ Time int64 }

// Pause tells the backbone whether the worker takes new work.
type Pause struct{ Paused bool }

// Type returns TypeHello.
func (*Hello) Type() Type { return TypeHello }

// Type returns TypeWelcome.
func (*Welcome) Type() Type { return TypeWelcome }

// Type returns TypeDispatch, TypeDispatchSum with Sum set,
// TypeDispatchDigest with Digest set, or TypeDispatchSumDigest with both.
func (d *Dispatch) Type() Type {
	if d.Sum && d.Digest {
		return TypeDispatchSumDigest
	}
	if d.Sum {
		return TypeDispatchSum
	}
	if d.Digest {
		return TypeDispatchDigest
	}
	return TypeDispatch
}

// Type returns TypeDigest.
func (*Digest) Type() Type { return TypeDigest }

// Type returns TypeResult.
func (*Result) Type() Type { return TypeResult }

// Type returns TypeError.
func (*Error) Type() Type { return TypeError }

// Type returns TypePing.
func (*Ping) Type() Type { return TypePing }

// Type returns TypePong.
func (*Pong) Type() Type { return TypePong }

// Type returns TypePause.
func (*Pause) Type() Type { return TypePause }

var le = binary.LittleEndian

func appendHeader(b []byte, t Type) []byte {
	b = append(b, Magic)
	b = le.AppendUint16(b, Version)
	return append(b, byte(t))
}

func appendStr(b []byte, s string) []byte {
	b = le.AppendUint16(b, uint16(len(s)))
	return append(b, s...)
}

// AppendFloats appends v as little-endian float32 bits (every bit kept,
// NaN payloads included). On a little-endian host that is v's memory,
// appended in one copy.
func AppendFloats(b []byte, v []float32) []byte {
	if hostLittleEndian && len(v) > 0 {
		return append(b, unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*len(v))...)
	}
	for _, f := range v {
		b = le.AppendUint32(b, math.Float32bits(f))
	}
	return b
}

// getFloats sets dst[i] to the float32 whose little-endian bits are
// src[4i:4i+4] (len(src) == 4*len(dst)), every bit kept: one copy on a
// little-endian host.
func getFloats(dst []float32, src []byte) {
	if hostLittleEndian && len(dst) > 0 {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(&dst[0])), 4*len(dst)), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(le.Uint32(src[4*i:]))
	}
}

// hostLittleEndian reports whether this machine stores a uint32 least
// significant byte first (amd64, arm64, ...), so that a []float32's memory
// is already its wire encoding.
var hostLittleEndian = func() bool {
	x := uint32(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// Append encodes the HELLO. Strings longer than their maximum are truncated.
func (h *Hello) Append(b []byte) []byte {
	b = appendHeader(b, TypeHello)
	var key [ed25519.PublicKeySize]byte
	copy(key[:], h.Key)
	b = append(b, key[:]...)
	b = appendStr(b, clip(h.ModelID, MaxModelID))
	b = appendStr(b, clip(h.Backend, MaxBackend))
	b = le.AppendUint16(b, h.Threads)
	b = le.AppendUint64(b, h.Quota)
	b = le.AppendUint32(b, h.Speed)
	return appendHoldings(b, h.Holdings)
}

func appendHoldings(b []byte, hs []Holding) []byte {
	b = le.AppendUint32(b, uint32(len(hs)))
	for _, x := range hs {
		b = le.AppendUint16(b, x.Layer)
		b = le.AppendUint32(b, x.Expert)
		b = append(b, x.SHA256[:]...)
	}
	return b
}

// Append encodes the WELCOME.
func (w *Welcome) Append(b []byte) []byte {
	b = appendHeader(b, TypeWelcome)
	b = appendStr(b, clip(w.Session, MaxSession))
	b = le.AppendUint32(b, w.D)
	b = le.AppendUint16(b, w.K)
	b = le.AppendUint16(b, w.NLayer)
	b = le.AppendUint32(b, w.NExpert)
	return le.AppendUint32(b, w.Accepted)
}

// DispatchSize is the encoded size in bytes of a DISPATCH with n rows of d
// floats and k slots: 4 + 20 + 4*n*d + 4*n*k.
func DispatchSize(n, d, k int) int { return HeaderSize + 20 + 4*n*d + 4*n*k }

// DispatchSumSize is the encoded size in bytes of a DISPATCH_SUM with n
// rows of d floats and k slots: DispatchSize(n, d, k) + 4*n*k (weights).
func DispatchSumSize(n, d, k int) int { return DispatchSize(n, d, k) + 4*n*k }

// Size returns the encoded size of the DISPATCH (DispatchSize, or
// DispatchSumSize with Sum set, a DISPATCH_SUM_DIGEST too).
func (d *Dispatch) Size() int {
	if d.Sum {
		return DispatchSumSize(d.N, d.D, d.K)
	}
	return DispatchSize(d.N, d.D, d.K)
}

// ResultSize is the encoded size in bytes of a RESULT with m rows of d
// floats: 4 + 16 + 4*m*d + TimingSize.
func ResultSize(m, d int) int { return HeaderSize + 16 + 4*m*d + TimingSize }

// Append encodes the DISPATCH (or DISPATCH_DIGEST, DISPATCH_SUM,
// DISPATCH_SUM_DIGEST);
// Hidden must hold N*D and IDs N*K values, and Weights N*K with Sum set
// (nothing of Weights is written without it).
func (d *Dispatch) Append(b []byte) []byte {
	b = appendHeader(b, d.Type())
	b = le.AppendUint64(b, d.Request)
	b = le.AppendUint16(b, d.Layer)
	b = le.AppendUint32(b, uint32(d.N))
	b = le.AppendUint32(b, uint32(d.D))
	b = le.AppendUint16(b, uint16(d.K))
	b = AppendFloats(b, d.Hidden)
	for _, id := range d.IDs {
		b = le.AppendUint32(b, uint32(id))
	}
	if d.Sum {
		b = AppendFloats(b, d.Weights)
	}
	return b
}

// Append encodes the RESULT; Out must hold M*D values.
func (r *Result) Append(b []byte) []byte {
	b = appendHeader(b, TypeResult)
	b = le.AppendUint64(b, r.Request)
	b = le.AppendUint32(b, uint32(r.M))
	b = le.AppendUint32(b, uint32(r.D))
	b = AppendFloats(b, r.Out)
	b = le.AppendUint32(b, r.Timing.QueueMicros)
	return le.AppendUint32(b, r.Timing.ComputeMicros)
}

// Append encodes the DIGEST.
func (g *Digest) Append(b []byte) []byte {
	b = appendHeader(b, TypeDigest)
	b = le.AppendUint64(b, g.Request)
	b = le.AppendUint32(b, uint32(g.M))
	b = le.AppendUint32(b, uint32(g.D))
	return append(b, g.Sum[:]...)
}

// Append encodes the ERROR; a message longer than MaxErrorMsg is truncated.
func (e *Error) Append(b []byte) []byte {
	b = appendHeader(b, TypeError)
	b = le.AppendUint64(b, e.Request)
	b = le.AppendUint16(b, e.Code)
	return appendStr(b, clip(e.Message, MaxErrorMsg))
}

// Append encodes the PING.
func (p *Ping) Append(b []byte) []byte {
	return le.AppendUint64(appendHeader(b, TypePing), uint64(p.Time))
}

// Append encodes the PONG.
func (p *Pong) Append(b []byte) []byte {
	return le.AppendUint64(appendHeader(b, TypePong), uint64(p.Time))
}

// Append encodes the PAUSE.
func (p *Pause) Append(b []byte) []byte {
	v := byte(0)
	if p.Paused {
		v = 1
	}
	return append(appendHeader(b, TypePause), v)
}

// Error makes *Error an error value.
func (e *Error) Error() string {
	return fmt.Sprintf("wire: peer error %d (request %d): %s", e.Code, e.Request, e.Message)
}

// clip cuts s to at most n bytes on a UTF-8 boundary.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// Peek returns a message's frame type after checking its header (magic and
// version). It does not validate the payload.
func Peek(msg []byte) (Type, error) {
	if len(msg) > MaxMessage {
		return 0, fmt.Errorf("%w: %d bytes > %d", ErrTooLarge, len(msg), MaxMessage)
	}
	if len(msg) < HeaderSize {
		return 0, fmt.Errorf("%w: %d bytes < header", ErrTruncated, len(msg))
	}
	if msg[0] != Magic {
		return 0, fmt.Errorf("%w: 0x%02x", ErrMagic, msg[0])
	}
	if v := le.Uint16(msg[1:]); v != Version {
		return 0, fmt.Errorf("%w: %d (want %d)", ErrVersion, v, Version)
	}
	return Type(msg[3]), nil
}

// PeekRequest returns the request id of a DISPATCH, DISPATCH_DIGEST,
// DISPATCH_SUM, DISPATCH_SUM_DIGEST, RESULT, DIGEST or ERROR message after checking its header;
// ok is false for other types or short messages.
func PeekRequest(msg []byte) (t Type, req uint64, ok bool) {
	t, err := Peek(msg)
	if err != nil || len(msg) < HeaderSize+8 {
		return t, 0, false
	}
	switch t {
	case TypeDispatch, TypeDispatchDigest, TypeDispatchSum, TypeDispatchSumDigest, TypeResult, TypeDigest, TypeError:
		return t, le.Uint64(msg[HeaderSize:]), true
	}
	return t, 0, false
}

// reader is a bounds-checked cursor over a payload.
type reader struct {
	b   []byte
	err error
}

func (r *reader) take(n int, what string) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || n > len(r.b) {
		r.err = fmt.Errorf("%w: %s needs %d bytes, %d left", ErrTruncated, what, n, len(r.b))
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) u8(what string) uint8 {
	if v := r.take(1, what); v != nil {
		return v[0]
	}
	return 0
}

func (r *reader) u16(what string) uint16 {
	if v := r.take(2, what); v != nil {
		return le.Uint16(v)
	}
	return 0
}

func (r *reader) u32(what string) uint32 {
	if v := r.take(4, what); v != nil {
		return le.Uint32(v)
	}
	return 0
}

func (r *reader) u64(what string) uint64 {
	if v := r.take(8, what); v != nil {
		return le.Uint64(v)
	}
	return 0
}

func (r *reader) str(max int, what string) string {
	n := int(r.u16(what + " length"))
	if r.err != nil {
		return ""
	}
	if n > max {
		r.err = fmt.Errorf("%w: %s is %d bytes > %d", ErrString, what, n, max)
		return ""
	}
	v := r.take(n, what)
	if r.err == nil && !utf8.Valid(v) {
		r.err = fmt.Errorf("%w: %s is not UTF-8", ErrString, what)
		return ""
	}
	return string(v)
}

func (r *reader) done() error {
	if r.err == nil && len(r.b) != 0 {
		r.err = fmt.Errorf("%w: %d bytes", ErrTrailing, len(r.b))
	}
	return r.err
}

// Decode parses and validates one message against lim. It never panics and
// never allocates more than a small multiple of len(msg); the frame it
// returns shares no memory with msg (a reader may reuse msg's buffer for
// the next message). Errors wrap
// ErrTruncated, ErrTooLarge, ErrMagic, ErrVersion, ErrType, ErrShape,
// ErrRange, ErrNotHeld, ErrTrailing or ErrString.
func Decode(msg []byte, lim *Limits) (Frame, error) {
	if lim == nil {
		lim = &Limits{}
	}
	t, err := Peek(msg)
	if err != nil {
		return nil, err
	}
	r := &reader{b: msg[HeaderSize:]}
	var f Frame
	switch t {
	case TypeHello:
		f, err = decodeHello(r, lim)
	case TypeWelcome:
		w := &Welcome{}
		w.Session = r.str(MaxSession, "session")
		w.D = r.u32("d")
		w.K = r.u16("k")
		w.NLayer = r.u16("n_layer")
		w.NExpert = r.u32("n_expert")
		w.Accepted = r.u32("accepted")
		if r.err == nil && (w.D == 0 || w.K == 0 || w.NLayer == 0 || w.NExpert == 0 || uint32(w.K) > w.NExpert) {
			err = fmt.Errorf("%w: welcome d=%d k=%d n_layer=%d n_expert=%d", ErrRange, w.D, w.K, w.NLayer, w.NExpert)
		}
		f = w
	case TypeDispatch, TypeDispatchDigest, TypeDispatchSum, TypeDispatchSumDigest:
		var d *Dispatch
		if d, err = decodeDispatch(r, lim, t == TypeDispatchSum || t == TypeDispatchSumDigest); d != nil {
			d.Digest = t == TypeDispatchDigest || t == TypeDispatchSumDigest
		}
		f = d
	case TypeResult:
		f, err = decodeResult(r, lim)
	case TypeDigest:
		f, err = decodeDigest(r, lim)
	case TypeError:
		e := &Error{Request: r.u64("request"), Code: r.u16("code")}
		e.Message = r.str(MaxErrorMsg, "message")
		f = e
	case TypePing:
		f = &Ping{Time: int64(r.u64("time"))}
	case TypePong:
		f = &Pong{Time: int64(r.u64("time"))}
	case TypeAssign:
		f, err = decodeAssign(r, lim)
	case TypeChunkReq:
		f, err = decodeChunkReq(r, lim)
	case TypeChunk:
		f, err = decodeChunk(r, lim)
	case TypeHoldings:
		f, err = decodeHoldings(r, lim)
	case TypePause:
		v := r.u8("paused")
		if r.err == nil && v > 1 {
			err = fmt.Errorf("%w: pause flag %d", ErrRange, v)
		}
		f = &Pause{Paused: v == 1}
	default:
		return nil, fmt.Errorf("%w: %s", ErrType, t)
	}
	if err != nil {
		return nil, err
	}
	if err := r.done(); err != nil {
		return nil, fmt.Errorf("%s: %w", t, err)
	}
	return f, nil
}

const holdingSize = 2 + 4 + 32

func decodeHello(r *reader, lim *Limits) (*Hello, error) {
	h := &Hello{}
	if k := r.take(ed25519.PublicKeySize, "key"); k != nil {
		h.Key = ed25519.PublicKey(append([]byte(nil), k...))
	}
	h.ModelID = r.str(MaxModelID, "model id")
	h.Backend = r.str(MaxBackend, "backend")
	h.Threads = r.u16("threads")
	h.Quota = r.u64("quota")
	h.Speed = r.u32("speed")
	var err error
	h.Holdings, err = readHoldings(r, lim, map[uint64]struct{}{}, true)
	if err != nil {
		return nil, err
	}
	if len(r.b) != 0 {
		return nil, fmt.Errorf("%w: %d bytes after holdings", ErrTruncated, len(r.b))
	}
	return h, r.err
}

// readHoldings reads n u32 and n holdings (with sha256 when withSum, else
// (layer, expert) only), checking ranges against lim and duplicates against
// seen (which it extends).
func readHoldings(r *reader, lim *Limits, seen map[uint64]struct{}, withSum bool) ([]Holding, error) {
	n := r.u32("holdings count")
	if r.err != nil {
		return nil, r.err
	}
	size := holdingSize
	if !withSum {
		size = 6
	}
	if n > MaxHoldings {
		return nil, fmt.Errorf("%w: %d holdings > %d", ErrTooLarge, n, MaxHoldings)
	}
	if int(n)*size > len(r.b) {
		return nil, fmt.Errorf("%w: %d holdings need %d bytes, %d left", ErrTruncated, n, int(n)*size, len(r.b))
	}
	hs := make([]Holding, n)
	for i := range hs {
		x := &hs[i]
		x.Layer = r.u16("layer")
		x.Expert = r.u32("expert")
		if withSum {
			copy(x.SHA256[:], r.take(32, "sha256"))
		}
		if err := checkExpert(lim, x.Layer, x.Expert, "holding"); err != nil {
			return nil, err
		}
		key := uint64(x.Layer)<<32 | uint64(x.Expert)
		if _, dup := seen[key]; dup {
			return nil, fmt.Errorf("%w: duplicate holding (%d, %d)", ErrRange, x.Layer, x.Expert)
		}
		seen[key] = struct{}{}
	}
	return hs, r.err
}

// checkExpert checks (layer, expert) against lim's NLayer and NExpert when
// they are set.
func checkExpert(lim *Limits, layer uint16, e uint32, what string) error {
	if lim.NLayer > 0 && int(layer) >= lim.NLayer {
		return fmt.Errorf("%w: %s layer %d >= %d", ErrRange, what, layer, lim.NLayer)
	}
	if lim.NExpert > 0 && uint64(e) >= uint64(lim.NExpert) {
		return fmt.Errorf("%w: %s expert %d >= %d", ErrRange, what, e, lim.NExpert)
	}
	return nil
}

// decodeDispatch decodes a DISPATCH or DISPATCH_DIGEST, or with sum a
// DISPATCH_SUM (weights after the ids, no id -1).
func decodeDispatch(r *reader, lim *Limits, sum bool) (*Dispatch, error) {
	d := &Dispatch{Request: r.u64("request"), Layer: r.u16("layer")}
	n, dd, k := r.u32("n"), r.u32("d"), r.u16("k")
	if r.err != nil {
		return nil, r.err
	}
	if lim.D <= 0 || int64(dd) != int64(lim.D) || lim.K <= 0 || int(k) != lim.K {
		return nil, fmt.Errorf("%w: dispatch d=%d k=%d, model d=%d k=%d", ErrShape, dd, k, lim.D, lim.K)
	}
	if lim.NLayer <= 0 || int(d.Layer) >= lim.NLayer {
		return nil, fmt.Errorf("%w: dispatch layer %d, model has %d", ErrRange, d.Layer, lim.NLayer)
	}
	if n == 0 || (lim.MaxRows > 0 && int64(n) > int64(lim.MaxRows)) {
		return nil, fmt.Errorf("%w: dispatch n=%d (max %d)", ErrShape, n, lim.MaxRows)
	}
	per := uint64(dd) + uint64(k)
	if sum {
		per += uint64(k) // weights
	}
	need := uint64(n) * per * 4
	if need != uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: dispatch n=%d d=%d k=%d needs %d payload bytes, have %d", ErrTruncated, n, dd, k, need, len(r.b))
	}
	d.N, d.D, d.K = int(n), int(dd), int(k)
	hb := r.take(d.N*d.D*4, "hidden")
	ib := r.take(d.N*d.K*4, "ids")
	d.Hidden = lim.floats(d.N * d.D)
	getFloats(d.Hidden, hb)
	d.IDs = make([]int32, d.N*d.K)
	some := false
	for i := range d.IDs {
		id := int32(le.Uint32(ib[4*i:]))
		d.IDs[i] = id
		if id == -1 && sum {
			return nil, fmt.Errorf("%w: dispatch_sum row %d slot %d is -1 (a sum needs every slot)", ErrShape, i/d.K, i%d.K)
		}
		if id == -1 {
			continue
		}
		if id < 0 || lim.NExpert <= 0 || int(id) >= lim.NExpert {
			return nil, fmt.Errorf("%w: dispatch expert id %d (n_expert %d)", ErrRange, id, lim.NExpert)
		}
		if lim.Holds != nil && !lim.Holds(int(d.Layer), int(id)) {
			return nil, fmt.Errorf("%w: layer %d expert %d", ErrNotHeld, d.Layer, id)
		}
		some = true
	}
	if !some {
		return nil, fmt.Errorf("%w: dispatch has no slot to compute", ErrShape)
	}
	if sum {
		// Any bits, as hidden: the backbone's router weights, used as sent.
		wb := r.take(d.N*d.K*4, "weights")
		d.Sum, d.Weights = true, lim.floats(d.N*d.K)
		getFloats(d.Weights, wb)
	}
	return d, nil
}

// SumRequest returns the request id and the shape of a DISPATCH_SUM (or
// DISPATCH_SUM_DIGEST) message after checking its header and its exact
// length (DispatchSumSize(n, d, k)); ok is false for any other message.
// The hub meters the RESULT (or DIGEST) answering it as the RESULT of its
// n*k outputs, ResultSize(n*k, d) bytes (SumCredit, SumDigestCredit),
// without decoding the payload.
func SumRequest(msg []byte) (req uint64, n, d, k int, ok bool) {
	if t, err := Peek(msg); err != nil || (t != TypeDispatchSum && t != TypeDispatchSumDigest) || len(msg) < DispatchSize(0, 0, 0) {
		return 0, 0, 0, 0, false
	}
	p := msg[HeaderSize:]
	n64, d64, k64 := uint64(le.Uint32(p[10:])), uint64(le.Uint32(p[14:])), uint64(le.Uint16(p[18:]))
	if n64 == 0 || d64 == 0 || k64 == 0 || uint64(DispatchSize(0, 0, 0))+4*n64*(d64+2*k64) != uint64(len(msg)) {
		return 0, 0, 0, 0, false // n, d < 2^32, k < 2^16: no overflow
	}
	return le.Uint64(p), int(n64), int(d64), int(k64), true
}

// DispatchShape returns the rows n, width d and slots k a DISPATCH,
// DISPATCH_DIGEST, DISPATCH_SUM or DISPATCH_SUM_DIGEST declares in its
// header (the fields after the request id and layer); ok is false for any
// other message or one shorter than the header. The lengths are not
// checked against the message (a hub bounding the answer it will read
// needs only the declared shape).
func DispatchShape(msg []byte) (n, d, k int, ok bool) {
	t, err := Peek(msg)
	if err != nil || len(msg) < DispatchSize(0, 0, 0) {
		return 0, 0, 0, false
	}
	switch t {
	case TypeDispatch, TypeDispatchDigest, TypeDispatchSum, TypeDispatchSumDigest:
	default:
		return 0, 0, 0, false
	}
	p := msg[HeaderSize:]
	return int(le.Uint32(p[10:])), int(le.Uint32(p[14:])), int(le.Uint16(p[18:])), true
}

// ResultShape returns the request id, m and d of a RESULT message after
// checking its header and its exact length (ResultSize(m, d)); ok is false
// for any other message.
func ResultShape(msg []byte) (req uint64, m, d int, ok bool) {
	if t, err := Peek(msg); err != nil || t != TypeResult || len(msg) < ResultSize(0, 0) {
		return 0, 0, 0, false
	}
	p := msg[HeaderSize:]
	m64, d64 := uint64(le.Uint32(p[8:])), uint64(le.Uint32(p[12:]))
	if uint64(ResultSize(0, 0))+4*m64*d64 != uint64(len(msg)) {
		return 0, 0, 0, false
	}
	return le.Uint64(p), int(m64), int(d64), true
}

// SumCredit is the size the hub meters for a RESULT (result, the whole
// message) answering a DISPATCH_SUM of n rows of d floats and k slots:
// ResultSize(n*k, d), the RESULT of the n*k outputs the worker computed,
// when result is a well-formed RESULT of exactly n rows of d floats; else
// ok is false and the RESULT is metered as itself (a wrong-shaped answer
// the backbone refuses).
func SumCredit(result []byte, n, d, k int) (size int, ok bool) {
	_, m, rd, ok := ResultShape(result)
	if !ok || m != n || rd != d || n <= 0 || k <= 0 {
		return 0, false
	}
	return ResultSize(n*k, d), true
}

// SumDigestCredit is the size the hub meters for a DIGEST (digest, the
// whole message) answering a DISPATCH_SUM_DIGEST of n rows of d floats and
// k slots: ResultSize(n*k, d), the RESULT of the n*k outputs the worker
// computed (as SumCredit meters the sum RESULT it stands for), when digest
// is a well-formed DIGEST (DigestCredit) of exactly n rows of d floats;
// else ok is false and the DIGEST is metered as DigestCredit says (a
// wrong-shaped answer the backbone refuses).
func SumDigestCredit(digest []byte, n, d, k int) (size int, ok bool) {
	if _, _, ok := DigestCredit(digest); !ok || n <= 0 || k <= 0 {
		return 0, false
	}
	m, dd := le.Uint32(digest[HeaderSize+8:]), le.Uint32(digest[HeaderSize+12:])
	if uint64(m) != uint64(n) || uint64(dd) != uint64(d) {
		return 0, false
	}
	return ResultSize(n*k, d), true
}

func decodeResult(r *reader, lim *Limits) (*Result, error) {
	res := &Result{Request: r.u64("request")}
	m, dd := r.u32("m"), r.u32("d")
	if r.err != nil {
		return nil, r.err
	}
	if lim.D <= 0 || int64(dd) != int64(lim.D) {
		return nil, fmt.Errorf("%w: result d=%d, model d=%d", ErrShape, dd, lim.D)
	}
	if m == 0 || (lim.MaxRows > 0 && lim.K > 0 && int64(m) > int64(lim.MaxRows)*int64(lim.K)) {
		return nil, fmt.Errorf("%w: result m=%d", ErrShape, m)
	}
	need := uint64(m)*uint64(dd)*4 + TimingSize
	if need != uint64(len(r.b)) {
		return nil, fmt.Errorf("%w: result m=%d d=%d needs %d payload bytes, have %d", ErrTruncated, m, dd, need, len(r.b))
	}
	res.M, res.D = int(m), int(dd)
	ob := r.take(res.M*res.D*4, "out")
	res.Out = lim.floats(res.M * res.D)
	getFloats(res.Out, ob)
	res.Timing = Timing{QueueMicros: r.u32("queue"), ComputeMicros: r.u32("compute")}
	return res, nil
}

func decodeDigest(r *reader, lim *Limits) (*Digest, error) {
	g := &Digest{Request: r.u64("request")}
	m, dd := r.u32("m"), r.u32("d")
	sum := r.take(32, "sha256")
	if r.err != nil {
		return nil, r.err
	}
	if lim.D <= 0 || int64(dd) != int64(lim.D) {
		return nil, fmt.Errorf("%w: digest d=%d, model d=%d", ErrShape, dd, lim.D)
	}
	if m == 0 || (lim.MaxRows > 0 && lim.K > 0 && int64(m) > int64(lim.MaxRows)*int64(lim.K)) ||
		uint64(ResultSize(0, 0))+4*uint64(m)*uint64(dd) > MaxMessage {
		return nil, fmt.Errorf("%w: digest m=%d", ErrShape, m)
	}
	g.M, g.D = int(m), int(dd)
	copy(g.Sum[:], sum)
	return g, nil
}
