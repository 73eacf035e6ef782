package serve

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// Defaults of the request limits (Config.BodyTimeout, WriteTimeout,
// ParseSlots, ParseWait).
const (
	// DefaultBodyTimeout bounds reading one request body.
	DefaultBodyTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds one write of a response: a whole
	// non-streamed body, or one event of a stream. A client that stops
	// reading is dropped after it, and its generation cancelled.
	DefaultWriteTimeout = 30 * time.Second
	// DefaultParseWait is how long a request waits for a parse slot
	// before it is refused with 429.
	DefaultParseWait = 10 * time.Second
)

// defaultParseSlots is Config.ParseSlots' default: bodies read and parsed
// (tokenized) at once.
func defaultParseSlots(procs int) int { return max(4, 2*procs) }

// intParam is an integer request field. It also accepts a JSON number
// with an integral value ("max_tokens": 5.0, as some clients send); any
// other value is a type error naming the field.
type intParam int64

func (v *intParam) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || !(b[0] == '-' || (b[0] >= '0' && b[0] <= '9')) {
		return &json.UnmarshalTypeError{Value: jsonKind(b), Type: reflect.TypeFor[intParam]()}
	}
	if i, err := strconv.ParseInt(string(b), 10, 64); err == nil {
		*v = intParam(i)
		return nil
	}
	f, err := strconv.ParseFloat(string(b), 64)
	if err != nil || f != math.Trunc(f) || math.Abs(f) > 1<<53 {
		return &json.UnmarshalTypeError{Value: "number " + string(b), Type: reflect.TypeFor[intParam]()}
	}
	*v = intParam(f)
	return nil
}

// intPtr returns *p as an int, or nil.
func intPtr(p *intParam) *int {
	if p == nil {
		return nil
	}
	i := int(*p)
	return &i
}

// jsonKind names the JSON kind of the raw value b for an error message.
func jsonKind(b []byte) string {
	if len(b) == 0 {
		return "nothing"
	}
	switch b[0] {
	case '"':
		return "string"
	case '{':
		return "object"
	case '[':
		return "array"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	}
	return "number"
}

// typeWant says in words which JSON a Go field type takes.
func typeWant(t reflect.Type) string {
	switch t {
	case reflect.TypeFor[intParam]():
		return "an integer"
	case reflect.TypeFor[stopList]():
		return "a string or an array of strings"
	}
	if t == nil {
		return "another type"
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return typeWant(t.Elem())
	}
	return "another type"
}

// unsupportedFields are OpenAI request fields this server knows and does
// not implement, with the reason given in the 400.
var unsupportedFields = map[string]string{
	"tools":               "tool calling is not supported",
	"tool_choice":         "tool calling is not supported",
	"functions":           "function calling is not supported",
	"function_call":       "function calling is not supported",
	"parallel_tool_calls": "tool calling is not supported",
	"response_format":     "structured output (response_format) is not supported",
	"suffix":              "suffix (insertion) is not supported",
	"best_of":             "best_of is not supported",
	"audio":               "audio output is not supported",
	"modalities":          "only text output is supported",
	"prediction":          "predicted outputs are not supported",
	"reasoning_effort":    "reasoning_effort is not supported",
	"tool_calls":          "tool calling is not supported",
	"tool_call_id":        "tool calling is not supported",
	"web_search_options":  "web search is not supported",
}

// decodeJSON parses exactly one JSON value into v, refusing unknown fields
// and, in v's own object, names that match a field only case-insensitively
// (checkFieldNames). Errors are 400s: invalid_json (not JSON, or data after
// it), invalid_type naming the field, unsupported_parameter naming the
// field.
func decodeJSON(b []byte, v any) *apiError {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		// Decoding null into a struct changes nothing: say what is wrong,
		// not that the prompt is missing.
		return badRequest("", "invalid_type", "the body must be a JSON object, not null")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return badRequest("", "invalid_json", "could not parse the JSON body: data after the JSON value")
	}
	// b is one valid JSON value now: its names are walked in place.
	if t := reflect.TypeOf(v).Elem(); t.Kind() == reflect.Struct {
		return checkStructNames(b, t)
	}
	return nil
}

// jsonError maps a decoding error to its 400.
func jsonError(err error) *apiError {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		field := strings.TrimPrefix(te.Field, "genParams.") // the embedded struct's Go name
		if field == "" {
			return badRequest("", "invalid_type", "the body must be a JSON object, not %s", article(te.Value))
		}
		return badRequest(field, "invalid_type", "%s must be %s, not %s", field, typeWant(te.Type), article(te.Value))
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return badRequest("", "invalid_json", "could not parse the JSON body: %v (at byte %d)", se, se.Offset)
	}
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		name, _ = strconv.Unquote(name)
		if why, known := unsupportedFields[name]; known {
			return badRequest(name, "unsupported_parameter", "%s: %s by this server", name, why)
		}
		return badRequest(name, "unsupported_parameter", "unknown parameter %q", name)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return badRequest("", "invalid_json", "could not parse the JSON body: it ends early")
	}
	return badRequest("", "invalid_json", "could not parse the JSON body: %v", err)
}

// freeBody is how much of a body is read before a parse slot is taken:
// a body that fits (every ordinary prompt) arrives without holding one, so
// that clients that stall or trickle after their headers hold no slot and
// cannot lock others out; a larger body takes its slot to read the rest,
// at most one slot per client address (largeSlot).
const freeBody = 64 << 10

// acquireParse takes one of the ParseSlots for parsing a body (and, with
// large, reading the rest of it), waiting at most ParseWait; the 429 says
// when to retry. A large body's client address may hold one slot at once:
// a second large body from it is refused at once. release is non-nil
// exactly when the error is nil.
func (s *Server) acquireParse(w http.ResponseWriter, r *http.Request, large bool) (release func(), e *apiError) {
	secs := max(1, int(math.Ceil(s.cfg.RetryAfter.Seconds())))
	refuse := func(format string, a ...any) *apiError {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		s.met.rejected.Inc()
		return newAPIError(http.StatusTooManyRequests, "rate_limit_error", "", "too_many_requests", format, a...)
	}
	unhold := func() {}
	if large {
		addr := clientAddr(r)
		s.largeMu.Lock()
		if s.large[addr] {
			s.largeMu.Unlock()
			return nil, refuse("a body over %d bytes from this address is already being read; send one at a time (retry after %d s)", freeBody, secs)
		}
		s.large[addr] = true
		s.largeMu.Unlock()
		unhold = func() {
			s.largeMu.Lock()
			delete(s.large, addr)
			s.largeMu.Unlock()
		}
	}
	select {
	case s.parse <- struct{}{}:
		return func() { <-s.parse; unhold() }, nil
	default:
	}
	t := time.NewTimer(s.cfg.ParseWait)
	defer t.Stop()
	select {
	case s.parse <- struct{}{}:
		return func() { <-s.parse; unhold() }, nil
	case <-r.Context().Done():
		unhold()
		return nil, newAPIError(statusClientClosed, "invalid_request_error", "", "cancelled", "the client went away")
	case <-t.C:
		unhold()
		return nil, refuse("%d requests are being parsed or are reading large bodies; retry after %d s", cap(s.parse), secs)
	}
}

// clientAddr is r's client address without the port (the proxy's, behind
// a reverse proxy: its clients then share one large-body slot).
func clientAddr(r *http.Request) string {
	if h, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		return h
	}
	return r.RemoteAddr
}

// statusClientClosed is the status recorded (and, where anything can still
// be written, sent) for a request whose client went away: nginx's 499.
const statusClientClosed = 499

// readBody appends r's body to b until it ends (more false) or b holds
// more than upTo bytes (more true), all within BodyTimeout of the first
// call's start (set by it when b is empty); 405 for a method other than
// POST, 413 past MaxBodyBytes, 408 on the deadline.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, b []byte, upTo int) (_ []byte, more bool, e *apiError) {
	if r.Method != http.MethodPost {
		return nil, false, newAPIError(http.StatusMethodNotAllowed, "invalid_request_error", "", "method_not_allowed", "use POST")
	}
	rc := http.NewResponseController(w)
	if b == nil {
		_ = rc.SetReadDeadline(time.Now().Add(s.cfg.BodyTimeout))
		b = make([]byte, 0, 4096)
	}
	if upTo == MaxBodyBytes && r.ContentLength > int64(cap(b)) && r.ContentLength <= MaxBodyBytes {
		// The rest of a large body (a parse slot is held): one allocation
		// of the announced size rather than a doubling series of copies.
		nb := make([]byte, len(b), r.ContentLength+1)
		copy(nb, b)
		b = nb
	}
	lr := io.LimitReader(r.Body, int64(upTo-len(b)+1))
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)]
		}
		n, err := lr.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == nil {
			continue
		}
		if errors.Is(err, io.EOF) {
			if len(b) <= upTo {
				_ = rc.SetReadDeadline(time.Time{})
				return b, false, nil
			}
			if upTo < MaxBodyBytes {
				return b, true, nil
			}
			// The rest of the body is not read: close the connection after
			// the answer (net/http would otherwise try to read and discard it).
			w.Header().Set("Connection", "close")
			return nil, false, newAPIError(http.StatusRequestEntityTooLarge, "invalid_request_error", "", "body_too_large",
				"the request body exceeds %d bytes", MaxBodyBytes)
		}
		w.Header().Set("Connection", "close")
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			return nil, false, newAPIError(http.StatusRequestTimeout, "invalid_request_error", "", "body_timeout",
				"the request body did not arrive within %v", s.cfg.BodyTimeout)
		}
		return nil, false, badRequest("", "invalid_body", "reading the body: %v", err)
	}
}

func isTimeout(err error) bool {
	var ne interface{ Timeout() bool }
	return errors.As(err, &ne) && ne.Timeout()
}

// tooLong reports whether text certainly encodes to more than limit
// tokens, without tokenizing it: every token covers at most
// Tokenizer.MaxTokenBytes bytes.
func (s *Server) tooLong(nbytes, limit int) bool {
	mb := max(1, s.tok.MaxTokenBytes())
	return nbytes > limit*mb
}

// contextError is the 400 for a prompt longer than the context.
func (s *Server) contextError(n int, exact bool) *apiError {
	if !exact {
		return badRequest("prompt", "context_length_exceeded",
			"this model's maximum context length is %d tokens; the prompt is longer (%d bytes, at least %d tokens)",
			s.p.Context, n, (n+s.tok.MaxTokenBytes()-1)/max(1, s.tok.MaxTokenBytes()))
	}
	return badRequest("prompt", "context_length_exceeded",
		"this model's maximum context length is %d tokens; the prompt has %d tokens", s.p.Context, n)
}

// encodePrompt tokenizes a completion prompt text, refusing one that
// certainly exceeds the context before spending memory on it.
func (s *Server) encodePrompt(text string) ([]int32, *apiError) {
	if s.tooLong(len(text), s.p.Context) {
		return nil, s.contextError(len(text), false)
	}
	return s.tok.Tokenize(text, true, false), nil
}

// writeTimeout sets the deadline for the next write on w.
func (s *Server) writeTimeout(w http.ResponseWriter) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
}

// checkPenalties accepts presence and frequency penalties of 0 (what
// clients send by default) and refuses others.
func checkPenalties(p *genParams) *apiError {
	for _, f := range []struct {
		name string
		v    *float64
	}{{"presence_penalty", p.PresencePenalty}, {"frequency_penalty", p.FrequencyPenalty}} {
		if f.v != nil && *f.v != 0 {
			return badRequest(f.name, "unsupported_value", "%s is not supported (only 0; got %v)", f.name, *f.v)
		}
	}
	return nil
}

// article puts "a" or "an" before a JSON kind ("an array", "a number 5.5").
func article(kind string) string {
	if kind != "" && strings.ContainsRune("aeiou", rune(kind[0])) {
		return "an " + kind
	}
	return "a " + kind
}

// jsonElements calls fn with each element of the JSON array b (its raw
// bytes, from the first byte of the value to its last), in order, until fn
// returns false or the array ends. b must be valid JSON starting with '['
// (surrounding space allowed); jsonElements does not allocate, so a
// caller can bound what it keeps of an array whatever its length.
func jsonElements(b []byte, fn func(elem []byte) bool) {
	i := bytes.IndexByte(b, '[') + 1
	for i > 0 {
		i = skipJSONSpace(b, i)
		if i >= len(b) || b[i] == ']' {
			return
		}
		end := skipJSONValue(b, i)
		if !fn(b[i:end]) {
			return
		}
		i = skipJSONSpace(b, end)
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

// jsonObjectKeys calls fn with each key of the JSON object b (the raw
// bytes between its quotes, escapes not decoded), in order, until fn
// returns false. b must be valid JSON starting with '{'; it does not
// allocate.
func jsonObjectKeys(b []byte, fn func(key []byte) bool) {
	jsonObjectFields(b, func(key, _ []byte) bool { return fn(key) })
}

// jsonObjectFields is jsonObjectKeys with each key's value (its raw
// bytes, first to last).
func jsonObjectFields(b []byte, fn func(key, value []byte) bool) {
	i := bytes.IndexByte(b, '{') + 1
	for i > 0 {
		i = skipJSONSpace(b, i)
		if i >= len(b) || b[i] != '"' {
			return
		}
		end := skipJSONValue(b, i)
		key := b[i+1 : end-1]
		i = skipJSONSpace(b, end) + 1 // past ':'
		vi := skipJSONSpace(b, i)
		i = skipJSONValue(b, vi)
		if !fn(key, b[vi:i]) {
			return
		}
		i = skipJSONSpace(b, i)
		if i < len(b) && b[i] == ',' {
			i++
		}
	}
}

// jsonField is a struct field as encoding/json reads it: its JSON name
// and its Go type.
type jsonField struct {
	name string
	typ  reflect.Type
}

// jsonFields lists struct type t's fields as encoding/json reads them: the
// json tag's name, else the Go name; the fields of an embedded struct
// without a tag as t's own.
func jsonFields(t reflect.Type) []jsonField {
	var fs []jsonField
	for f := range t.Fields() {
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch {
		case tag == "-" || !f.IsExported() && !f.Anonymous:
		case f.Anonymous && tag == "" && f.Type.Kind() == reflect.Struct:
			fs = append(fs, jsonFields(f.Type)...)
		case tag != "":
			fs = append(fs, jsonField{tag, f.Type})
		default:
			fs = append(fs, jsonField{f.Name, f.Type})
		}
	}
	return fs
}

// checkStructNames is checkFieldNames for the object b decoded into struct
// type t, and for the objects of its fields of struct type (or pointer to
// one; "stream_options"), recursively.
func checkStructNames(b []byte, t reflect.Type) *apiError {
	fs := jsonFields(t)
	names := make([]string, len(fs))
	for i, f := range fs {
		names[i] = f.name
	}
	if e := checkFieldNames(b, names, ""); e != nil {
		return e
	}
	var e *apiError
	jsonObjectFields(bytes.TrimSpace(b), func(key, value []byte) bool {
		for _, f := range fs {
			ft := f.typ
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if f.name == string(key) && ft.Kind() == reflect.Struct {
				e = checkStructNames(value, ft)
				return e == nil
			}
		}
		return true
	})
	return e
}

// checkFieldNames refuses a key of the JSON object b that is not exactly
// one of known: encoding/json matches names case-insensitively, so
// "Prompt" would fill prompt (and, after "prompt", overwrite it) where
// OpenAI's API, and this server's documentation, refuse an unknown
// field. The 400 is unsupported_parameter naming the key (where, when
// not "", says where it was: "in a message"); a known OpenAI field this
// server does not implement gets its reason (unsupportedFields). b that
// is not an object is left to the decoder's type error.
func checkFieldNames(b []byte, known []string, where string) *apiError {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' {
		return nil
	}
	var e *apiError
	jsonObjectKeys(b, func(key []byte) bool {
		name := string(key)
		if bytes.IndexByte(key, '\\') >= 0 { // an escaped name: decode it
			_ = json.Unmarshal([]byte(`"`+name+`"`), &name)
		}
		for _, k := range known {
			if name == k {
				return true
			}
		}
		in := ""
		if where != "" {
			in = " " + where
		}
		if why, ok := unsupportedFields[name]; ok {
			e = badRequest(name, "unsupported_parameter", "%s: %s by this server", name, why)
			return false
		}
		for _, k := range known {
			if strings.EqualFold(name, k) {
				e = badRequest(name, "unsupported_parameter", "unknown parameter %q%s (names are case-sensitive: %q)", name, in, k)
				return false
			}
		}
		e = badRequest(name, "unsupported_parameter", "unknown parameter %q%s", name, in)
		return false
	})
	return e
}

func skipJSONSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipJSONValue returns the index just past the valid JSON value that
// starts at b[i].
func skipJSONValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		for i++; i < len(b); i++ {
			switch b[i] {
			case '\\':
				i++
			case '"':
				return i + 1
			}
		}
		return len(b)
	case '[', '{':
		depth := 0
		for ; i < len(b); i++ {
			switch b[i] {
			case '"':
				i = skipJSONValue(b, i) - 1
			case '[', '{':
				depth++
			case ']', '}':
				if depth--; depth == 0 {
					return i + 1
				}
			}
		}
		return len(b)
	}
	for i < len(b) && strings.IndexByte(",]} \t\r\n", b[i]) < 0 {
		i++
	}
	return i
}

// jsonInt parses a JSON number that is an integer written without a
// fraction or exponent, as a token id is, within int64.
func jsonInt(b []byte) (int64, bool) {
	neg := len(b) > 0 && b[0] == '-'
	if neg {
		b = b[1:]
	}
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var v int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		v = v*10 + int64(c-'0')
	}
	if neg {
		v = -v
	}
	return v, true
}
