package serve

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/spec"
)

// MaxBodyBytes bounds a request body (bytes); larger bodies get 413.
const MaxBodyBytes = 8 << 20

// MaxStops bounds the stop strings of one request (OpenAI allows 4).
const MaxStops = 16

// DefaultCompletionTokens is max_tokens when a /v1/completions request does
// not give it (OpenAI's default: 16). Chat requests default to the rest of
// the context.
const DefaultCompletionTokens = 16

// apiError is the OpenAI error body: {"error":{"message","type","param","code"}}.
type apiError struct {
	status int
	Msg    string  `json:"message"`
	Type   string  `json:"type"`
	Param  *string `json:"param"`
	Code   *string `json:"code"`
}

func (e *apiError) Error() string { return e.Msg }

func newAPIError(status int, typ, param, code, format string, a ...any) *apiError {
	e := &apiError{status: status, Msg: fmt.Sprintf(format, a...), Type: typ}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	return e
}

func badRequest(param, code, format string, a ...any) *apiError {
	return newAPIError(http.StatusBadRequest, "invalid_request_error", param, code, format, a...)
}

// Handler returns the HTTP API:
//
//	POST /v1/completions       OpenAI completions (prompt: string, [string], [int] or [[int]] of one prompt)
//	POST /v1/chat/completions  OpenAI chat completions (Config.Chat)
//	GET  /v1/models            the served model; GET /v1/models/{id} one model
//	GET  /metrics              Prometheus text format (when Config.Registry is a Gatherer)
//	GET  /health               200 "ok"
//
// Errors are JSON {"error":{"message","type","param","code"}}: 400 bad JSON
// or parameters or a prompt longer than the context, 401 missing API key
// (when Config.APIKey is set), 404 unknown model or
// path, 405 wrong method, 413 body over MaxBodyBytes, 429 (with
// Retry-After) when the queue is full, 503 while closing, 503 (with
// Retry-After and the count of experts no worker holds) when a step found
// no worker holding an expert it needs (dispatch.ErrNoHolder: the swarm
// waited for one, then gave up), 500 when the forward pass fails otherwise.
// A streamed request's status is sent with its first token, so an error
// before any token is an HTTP error, not an event.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/completions", s.count("completions", s.handleGenerate(s.parseCompletion, false)))
	mux.HandleFunc("/v1/chat/completions", s.count("chat", s.handleGenerate(s.parseChat, true)))
	mux.HandleFunc("/v1/models", s.count("models", s.handleModels))
	mux.HandleFunc("/v1/models/{id...}", s.count("models", s.handleModel))
	if s.gather != nil {
		mux.Handle("/metrics", getOnly(promhttp.HandlerFor(s.gather, promhttp.HandlerOpts{})))
	}
	mux.Handle("/health", getOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = w.Write([]byte("ok\n"))
	})))
	mux.HandleFunc("/", s.count("other", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, newAPIError(http.StatusNotFound, "invalid_request_error", "", "not_found", "no route for %s %s", r.Method, r.URL.Path))
	}))
	return mux
}

// statusWriter records the status code for the request counter and passes
// Flush through for streaming.
type statusWriter struct {
	http.ResponseWriter
	code int
	gone bool // the client went away before the response was complete: counted as 499
}

// clientGone marks w's request as ended by its client (counted as 499,
// whatever status was already sent).
func clientGone(w http.ResponseWriter) {
	if sw, ok := w.(*statusWriter); ok {
		sw.gone = true
	}
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's deadlines.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *Server) count(endpoint string, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w}
		if s.cfg.APIKey != "" && !s.authorized(r) {
			sw.Header().Set("WWW-Authenticate", `Bearer realm="kvasir"`)
			writeError(sw, newAPIError(http.StatusUnauthorized, "invalid_request_error", "", "invalid_api_key",
				"missing or wrong API key (Authorization: Bearer ...)"))
		} else {
			h(sw, r)
		}
		if sw.code == 0 {
			sw.code = http.StatusOK
		}
		if sw.gone {
			sw.code = statusClientClosed
		}
		s.met.httpRequests.WithLabelValues(endpoint, strconv.Itoa(sw.code)).Inc()
	}
}

// authorized compares the bearer token with Config.APIKey in constant time.
// The scheme's name is case-insensitive (RFC 9110 section 11.1: "bearer"
// is Bearer); the token is not.
func (s *Server) authorized(r *http.Request) bool {
	scheme, got, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	return ok && strings.EqualFold(scheme, "Bearer") &&
		subtle.ConstantTimeCompare([]byte(strings.TrimLeft(got, " ")), []byte(s.cfg.APIKey)) == 1
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"message":"encoding the response failed","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, map[string]*apiError{"error": e})
}

// getOnly passes GET and HEAD requests to h and answers others 405 with
// Allow: GET, HEAD.
func getOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			writeError(w, newAPIError(http.StatusMethodNotAllowed, "invalid_request_error", "", "method_not_allowed", "use GET"))
			return
		}
		h.ServeHTTP(w, r)
	})
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		writeError(w, newAPIError(http.StatusMethodNotAllowed, "invalid_request_error", "", "method_not_allowed", "use GET"))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": []any{s.modelObject()}})
}

func (s *Server) handleModel(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		w.Header().Set("Allow", "GET")
		writeError(w, newAPIError(http.StatusMethodNotAllowed, "invalid_request_error", "", "method_not_allowed", "use GET"))
		return
	}
	if id := r.PathValue("id"); id != s.cfg.ModelID {
		writeError(w, s.unknownModel(id))
		return
	}
	writeJSON(w, http.StatusOK, s.modelObject())
}

// modelObject is the served model as /v1/models lists it; with a swarm it
// carries "kvasir_coverage": which routed experts are computed where
// (dispatch.Coverage), and "kvasir_verify": the verification policy
// (--verify: spot or quorum).
func (s *Server) modelObject() map[string]any {
	o := map[string]any{"id": s.cfg.ModelID, "object": "model", "created": s.created, "owned_by": "kvasir",
		"context_length": s.p.Context}
	if s.cfg.Coverage != nil {
		cv := s.cfg.Coverage()
		o["kvasir_coverage"] = map[string]any{"experts": cv.Experts, "local": cv.Local, "covered": cv.Covered,
			"missing": cv.Missing, "by_replicas": cv.ByReplicas, "min_replicas": cv.MinReplicas}
		o["kvasir_verify"] = string(cv.Verify)
	}
	return o
}

func (s *Server) unknownModel(id string) *apiError {
	return newAPIError(http.StatusNotFound, "invalid_request_error", "model", "model_not_found",
		"the model %q does not exist; this server serves %q", id, s.cfg.ModelID)
}

// stopList is the "stop" field: null, a string, or an array of strings.
type stopList []string

func (l *stopList) UnmarshalJSON(b []byte) error {
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		*l = nil
		return nil
	}
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*l = stopList{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return &json.UnmarshalTypeError{Value: jsonKind(bytes.TrimSpace(b)), Type: reflect.TypeFor[stopList]()}
	}
	*l = many
	return nil
}

// maxDraft bounds a request's draft_max.
const maxDraft = spec.MaxMax

// genParams are the sampling fields shared by both endpoints.
type genParams struct {
	Model               *string            `json:"model"`
	MaxTokens           *intParam          `json:"max_tokens"`
	MaxCompletionTokens *intParam          `json:"max_completion_tokens"`
	Temperature         *float64           `json:"temperature"`
	TopP                *float64           `json:"top_p"`
	TopK                *intParam          `json:"top_k"` // extension (llama.cpp, vLLM)
	Seed                *intParam          `json:"seed"`
	Stop                *stopList          `json:"stop"`
	N                   *intParam          `json:"n"`
	LogitBias           map[string]float64 `json:"logit_bias"`
	PresencePenalty     *float64           `json:"presence_penalty"`  // 0 only
	FrequencyPenalty    *float64           `json:"frequency_penalty"` // 0 only
	User                *string            `json:"user"`              // accepted, not used
	Metadata            map[string]string  `json:"metadata"`          // accepted, not used
	Draft               *string            `json:"draft"`             // extension: none | ngram | mtp (Job.Draft)
	DraftMax            *intParam          `json:"draft_max"`         // extension: drafts per step (Job.DraftMax)
	Stream              bool               `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage         bool  `json:"include_usage"`
		ContinuousUsageStats *bool `json:"continuous_usage_stats"` // vLLM's; only false (checkDefaults)
	} `json:"stream_options"`
	// Fields clients send with their default values: accepted at those
	// values, refused at others (checkDefaults).
	Store       *bool   `json:"store"`        // only false: nothing is stored
	ServiceTier *string `json:"service_tier"` // only "auto" or "default"
}

// checkDefaults refuses the fields this server accepts only at the values
// that ask for nothing (what some clients send on every request): store
// true, a service_tier other than auto or default, and
// stream_options.continuous_usage_stats true.
func checkDefaults(p *genParams) *apiError {
	if p.Store != nil && *p.Store {
		return badRequest("store", "unsupported_parameter", "store: stored completions are not supported by this server (only false)")
	}
	if t := p.ServiceTier; t != nil && *t != "auto" && *t != "default" {
		return badRequest("service_tier", "unsupported_parameter", "service_tier %q is not supported by this server (only auto or default)", *t)
	}
	if o := p.StreamOptions; o != nil && o.ContinuousUsageStats != nil && *o.ContinuousUsageStats {
		return badRequest("stream_options.continuous_usage_stats", "unsupported_parameter",
			"stream_options.continuous_usage_stats is not supported by this server (usage comes in the last chunk: include_usage)")
	}
	return nil
}

// job validates p into a Job for prompt (defaultMax when max_tokens is not
// given; 0 = up to the context).
func (s *Server) job(p *genParams, prompt []int32, defaultMax int) (Job, *apiError) {
	if p.Model != nil && *p.Model != "" && *p.Model != s.cfg.ModelID {
		return Job{}, s.unknownModel(*p.Model)
	}
	if p.N != nil && *p.N != 1 {
		return Job{}, badRequest("n", "unsupported_value", "n must be 1 (got %d)", *p.N)
	}
	if e := checkPenalties(p); e != nil {
		return Job{}, e
	}
	if e := checkDefaults(p); e != nil {
		return Job{}, e
	}
	if len(prompt) == 0 {
		return Job{}, badRequest("prompt", "empty_prompt", "the prompt encodes to no tokens")
	}
	if len(prompt) > s.p.Context {
		return Job{}, s.contextError(len(prompt), true)
	}
	j := Job{Prompt: prompt, Sampler: model.SamplerOptions{Temperature: 1, TopP: 1}}
	bias, e := s.logitBias(p.LogitBias)
	if e != nil {
		return Job{}, e
	}
	j.LogitBias = bias
	mt := intPtr(p.MaxCompletionTokens) // OpenAI's current name wins over the deprecated max_tokens
	if mt == nil {
		mt = intPtr(p.MaxTokens)
	}
	switch {
	case mt != nil && *mt < 1:
		return Job{}, badRequest("max_tokens", "invalid_value", "max_tokens must be at least 1 (got %d)", *mt)
	case mt != nil:
		j.MaxTokens = *mt
	case defaultMax > 0:
		j.MaxTokens = defaultMax
	default:
		j.MaxTokens = s.p.Context
	}
	if t := p.Temperature; t != nil {
		if !(*t >= 0 && *t <= 2) {
			return Job{}, badRequest("temperature", "invalid_value", "temperature must be in [0, 2] (got %v)", *t)
		}
		j.Sampler.Temperature = float32(*t)
	}
	if t := p.TopP; t != nil {
		if !(*t > 0 && *t <= 1) {
			return Job{}, badRequest("top_p", "invalid_value", "top_p must be in (0, 1] (got %v)", *t)
		}
		j.Sampler.TopP = model.TopP32(*t)
	}
	if k := p.TopK; k != nil {
		if *k < 0 {
			return Job{}, badRequest("top_k", "invalid_value", "top_k must be >= 0 (got %d)", *k)
		}
		j.Sampler.TopK = int(*k)
	}
	if p.Seed != nil {
		j.Sampler.Seed = uint64(*p.Seed)
	} else {
		var b [8]byte
		_, _ = rand.Read(b[:])
		for _, x := range b {
			j.Sampler.Seed = j.Sampler.Seed<<8 | uint64(x)
		}
	}
	if p.Draft != nil {
		d, err := spec.ParseMode(*p.Draft)
		if err != nil {
			return Job{}, badRequest("draft", "invalid_value", "draft must be none, ngram or mtp (got %q)", *p.Draft)
		}
		if d == spec.ModeMTP {
			if err := s.cfg.Model.MTPErr(); err != nil {
				return Job{}, badRequest("draft", "invalid_value", "draft mtp: %v (use ngram)", err)
			}
		}
		j.Draft = d
	}
	if k := p.DraftMax; k != nil {
		if *k < 1 || *k > maxDraft {
			return Job{}, badRequest("draft_max", "invalid_value", "draft_max must be in [1, %d] (got %d)", maxDraft, *k)
		}
		j.DraftMax = int(*k)
	}
	if p.Stop != nil {
		if len(*p.Stop) > MaxStops {
			return Job{}, badRequest("stop", "invalid_value", "at most %d stop strings (got %d)", MaxStops, len(*p.Stop))
		}
		j.Stop = *p.Stop
	}
	return j, nil
}

type completionRequest struct {
	genParams
	Prompt   json.RawMessage `json:"prompt"`
	Echo     bool            `json:"echo"`
	Logprobs *intParam       `json:"logprobs"` // 0..MaxLogprobsCompletions alternatives per token
	BestOf   *intParam       `json:"best_of"`  // only 1
	Suffix   *string         `json:"suffix"`   // only "": no insertion
}

// completionPrompt parses the "prompt" field: a string, or an array
// holding one string, or an array of token ids, or an array holding one
// such array. raw is valid JSON (decodeJSON parsed the body). Token ids
// are read in place (jsonElements), at most the context plus one: a
// longer array is refused without allocating for it, whatever the body
// holds.
func (s *Server) completionPrompt(raw json.RawMessage) ([]int32, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("prompt", "missing_required_parameter", "prompt is required")
	}
	badType := badRequest("prompt", "invalid_type", "prompt must be a string, an array of strings or an array of token ids")
	switch raw[0] {
	case '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return nil, badType
		}
		return s.encodePrompt(text)
	case '[':
	default:
		return nil, badType
	}
	// An array: of strings, of token-id arrays, or of token ids; the kind
	// of its first element says which, and every element must be of it.
	n, kind, mixed := 0, byte(0), false
	var first []byte
	jsonElements(raw, func(e []byte) bool {
		k := e[0]
		if k != '"' && k != '[' {
			k = '0'
		}
		if n == 0 {
			kind, first = k, e
		}
		mixed = mixed || k != kind
		n++
		return kind == '0' || !mixed // a token-id array is read below, element by element
	})
	switch {
	case n == 0:
		return nil, badRequest("prompt", "unsupported_value", "exactly one prompt per request is supported (got 0)")
	case kind != '0' && mixed:
		return nil, badType
	case kind != '0' && n != 1:
		return nil, badRequest("prompt", "unsupported_value", "exactly one prompt per request is supported (got %d)", n)
	case kind == '"':
		var text string
		if err := json.Unmarshal(first, &text); err != nil {
			return nil, badType
		}
		return s.encodePrompt(text)
	case kind == '[':
		raw = first
	}
	out := make([]int32, 0, min(n, s.p.Context+1))
	var e *apiError
	jsonElements(raw, func(el []byte) bool {
		t, ok := jsonInt(el)
		switch {
		case !ok:
			e = badType
		case t < 0 || t >= int64(s.p.Vocab):
			e = badRequest("prompt", "invalid_value", "prompt token %d is %d, outside the vocabulary of %d", len(out), t, s.p.Vocab)
		case len(out) == s.p.Context:
			e = badRequest("prompt", "context_length_exceeded",
				"this model's maximum context length is %d tokens; the prompt has more token ids", s.p.Context)
		default:
			out = append(out, int32(t))
			return true
		}
		return false
	})
	if e != nil {
		return nil, e
	}
	return out, nil
}

// parseCompletion turns a /v1/completions body into a Job.
func (s *Server) parseCompletion(body []byte) (Job, *genParams, *apiError) {
	var req completionRequest
	if e := decodeJSON(body, &req); e != nil {
		return Job{}, nil, e
	}
	if req.Model != nil && *req.Model != "" && *req.Model != s.cfg.ModelID {
		return Job{}, nil, s.unknownModel(*req.Model)
	}
	if req.Echo {
		return Job{}, nil, badRequest("echo", "unsupported_value", "echo is not supported")
	}
	if req.BestOf != nil && *req.BestOf != 1 {
		return Job{}, nil, badRequest("best_of", "unsupported_parameter", "best_of: %s by this server (only 1; got %d)", unsupportedFields["best_of"], *req.BestOf)
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return Job{}, nil, badRequest("suffix", "unsupported_parameter", "suffix: %s by this server", unsupportedFields["suffix"])
	}
	prompt, e := s.completionPrompt(req.Prompt)
	if e != nil {
		return Job{}, nil, e
	}
	j, e := s.job(&req.genParams, prompt, DefaultCompletionTokens)
	if e != nil {
		return Job{}, nil, e
	}
	if req.Logprobs != nil {
		if *req.Logprobs < 0 || *req.Logprobs > MaxLogprobsCompletions {
			return Job{}, nil, badRequest("logprobs", "invalid_value", "logprobs must be in [0, %d] (got %d)", MaxLogprobsCompletions, *req.Logprobs)
		}
		j.Logprobs, j.TopLogprobs = true, int(*req.Logprobs)
	}
	return j, &req.genParams, nil
}

// handleGenerate serves a completion endpoint: it reads the body, turns
// it into a Job with parse (parseCompletion or parseChat) and runs it (chat:
// chat.completion objects), or writes the error.
func (s *Server) handleGenerate(parse func([]byte) (Job, *genParams, *apiError), chat bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		j, p, e := s.readParse(w, r, parse)
		if e != nil {
			s.writeTimeout(w)
			writeError(w, e)
			return
		}
		s.run(w, r, j, p, chat)
	}
}

// readParse reads a body and parses it holding one of the ParseSlots, so
// that at most ParseSlots bodies are parsed (tokenized, each at most the
// context) at once and at most ParseSlots bodies over freeBody (each at
// most MaxBodyBytes) are in memory at once. A body of at most freeBody
// bytes is read before the slot is taken.
func (s *Server) readParse(w http.ResponseWriter, r *http.Request, parse func([]byte) (Job, *genParams, *apiError)) (Job, *genParams, *apiError) {
	body, large, e := s.readBody(w, r, nil, freeBody)
	if e != nil {
		return Job{}, nil, e
	}
	release, e := s.acquireParse(w, r, large)
	if e != nil {
		if large {
			w.Header().Set("Connection", "close") // the rest of the body is not read
		}
		return Job{}, nil, e
	}
	defer release()
	if large {
		if body, _, e = s.readBody(w, r, body, MaxBodyBytes); e != nil {
			return Job{}, nil, e
		}
	}
	return parse(body)
}

// chatMessage is one entry of "messages": content is a string, null, or an
// array of parts of which the "text" parts are concatenated.
type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Name    *string         `json:"name"` // accepted, not rendered (ChatML has no names)
}

type chatRequest struct {
	genParams
	Messages    json.RawMessage `json:"messages"` // []chatMessage, decoded by chatMessages once counted
	Logprobs    *bool           `json:"logprobs"`
	TopLogprobs *intParam       `json:"top_logprobs"` // 0..MaxLogprobsChat, needs logprobs
}

func messageText(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("content must be a string or an array of content parts")
	}
	var b strings.Builder
	for _, p := range parts {
		if p.Type != "text" {
			return "", fmt.Errorf("content part type %q is not supported (only text)", p.Type)
		}
		b.WriteString(p.Text)
	}
	return b.String(), nil
}

// chatMessages decodes the "messages" array raw (valid JSON), counting
// its elements first: more than the context holds (a template gives each
// message at least one token, and one to the assistant's turn) are
// refused before any is decoded. Errors name the field: invalid_type
// ("messages", "messages.role"), unsupported_parameter for a message
// field this server does not implement, missing_required_parameter for
// none.
func (s *Server) chatMessages(raw json.RawMessage) ([]chatMessage, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("messages", "missing_required_parameter", "messages must be a non-empty array")
	}
	if raw[0] != '[' {
		return nil, badRequest("messages", "invalid_type", "messages must be an array, not %s", article(jsonKind(raw)))
	}
	n := 0
	jsonElements(raw, func([]byte) bool { n++; return n < s.p.Context })
	switch {
	case n == 0:
		return nil, badRequest("messages", "missing_required_parameter", "messages must be a non-empty array")
	case n >= s.p.Context:
		return nil, badRequest("messages", "context_length_exceeded",
			"this model's maximum context length is %d tokens; %d or more messages take at least one more", s.p.Context, n)
	}
	if e := checkMessageFields(raw); e != nil {
		return nil, e
	}
	// json.Unmarshal reads raw in place (a Decoder would copy it first).
	var msgs []chatMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			field := "messages"
			if te.Field != "" {
				field += "." + te.Field
			}
			return nil, badRequest(field, "invalid_type", "%s must be %s, not %s", field, typeWant(te.Type), article(te.Value))
		}
		return nil, jsonError(err)
	}
	return msgs, nil
}

// checkMessageFields refuses a field of a message (an object of the
// "messages" array raw) that chatMessage does not have, as decodeJSON
// refuses unknown fields elsewhere: unsupported_parameter naming it. Names
// must match exactly (checkFieldNames): encoding/json would let "CONTENT"
// fill, or overwrite, content.
func checkMessageFields(raw []byte) *apiError {
	var e *apiError
	jsonElements(raw, func(el []byte) bool {
		e = checkFieldNames(el, []string{"role", "content", "name"}, "in a message")
		return e == nil
	})
	return e
}

// parseChat turns a /v1/chat/completions body into a Job.
func (s *Server) parseChat(body []byte) (Job, *genParams, *apiError) {
	var req chatRequest
	if e := decodeJSON(body, &req); e != nil {
		return Job{}, nil, e
	}
	if req.Model != nil && *req.Model != "" && *req.Model != s.cfg.ModelID {
		return Job{}, nil, s.unknownModel(*req.Model)
	}
	if s.cfg.Chat == nil {
		msg := "this model has no supported chat template"
		if s.cfg.ChatErr != nil {
			msg = s.cfg.ChatErr.Error()
		}
		return Job{}, nil, badRequest("messages", "unsupported_chat_template", "%s; use /v1/completions", msg)
	}
	messages, e := s.chatMessages(req.Messages)
	if e != nil {
		return Job{}, nil, e
	}
	msgs := make([]Message, len(messages))
	nbytes := 0
	for i, m := range messages {
		switch m.Role {
		case "system", "developer", "user", "assistant", "tool":
		default:
			return Job{}, nil, badRequest(fmt.Sprintf("messages[%d].role", i), "invalid_value",
				"role %q: want system, developer, user, assistant or tool", m.Role)
		}
		text, err := messageText(m.Content)
		if err != nil {
			return Job{}, nil, badRequest(fmt.Sprintf("messages[%d].content", i), "invalid_type", "%v", err)
		}
		msgs[i] = Message{Role: m.Role, Content: text}
		nbytes += len(text)
	}
	if s.tooLong(nbytes, s.p.Context) {
		return Job{}, nil, inMessages(s.contextError(nbytes, false))
	}
	prompt, err := s.cfg.Chat.Apply(msgs)
	if err != nil {
		return Job{}, nil, badRequest("messages", "invalid_value", "%v", err)
	}
	j, e := s.job(&req.genParams, prompt, 0)
	if e != nil {
		return Job{}, nil, inMessages(e)
	}
	if e := chatLogprobs(&j, req.Logprobs, req.TopLogprobs); e != nil {
		return Job{}, nil, e
	}
	return j, &req.genParams, nil
}

// inMessages renames the param of an error about the prompt to
// "messages", the chat request's field it came from (as OpenAI names it).
func inMessages(e *apiError) *apiError {
	if e != nil && e.Param != nil && *e.Param == "prompt" {
		m := "messages"
		e.Param = &m
	}
	return e
}

// usage is the OpenAI usage object.
type usage struct {
	PromptTokens     int `json:"prompt_tokens"`
	CompletionTokens int `json:"completion_tokens"`
	TotalTokens      int `json:"total_tokens"`
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// submitError maps Submit's errors to API errors.
func (s *Server) submitError(w http.ResponseWriter, err error) *apiError {
	switch {
	case errors.Is(err, ErrQueueFull):
		secs := int(math.Ceil(s.cfg.RetryAfter.Seconds()))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		return newAPIError(http.StatusTooManyRequests, "rate_limit_error", "", "queue_full",
			"the server is at capacity (%v); retry after %d s", err, secs)
	case errors.Is(err, ErrClosed):
		return newAPIError(http.StatusServiceUnavailable, "server_error", "", "shutting_down", "the server is shutting down")
	case errors.Is(err, ErrPrompt):
		return badRequest("prompt", "invalid_value", "%v", err)
	case errors.Is(err, ErrParams):
		return badRequest("", "invalid_value", "%v", err)
	}
	return newAPIError(http.StatusInternalServerError, "server_error", "", "", "%v", err)
}

// finishError maps the error that ended a generation to an API error; for a
// missing expert holder it sets Retry-After on w.
func (s *Server) finishError(w http.ResponseWriter, d Delta) *apiError {
	if errors.Is(d.Err, ErrClosed) {
		return newAPIError(http.StatusServiceUnavailable, "server_error", "", "shutting_down", "the server is shutting down")
	}
	var me *dispatch.MissingError
	if errors.As(d.Err, &me) {
		secs := max(1, int(math.Ceil(s.cfg.HolderRetryAfter.Seconds())))
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		missing := ""
		if s.cfg.Coverage != nil {
			cv := s.cfg.Coverage()
			missing = fmt.Sprintf("; %d of the model's %d (layer, expert) pairs have no connected holder now", cv.Missing, cv.Experts)
			w.Header().Set("X-Kvasir-Missing-Experts", strconv.Itoa(cv.Missing))
		}
		return newAPIError(http.StatusServiceUnavailable, "server_error", "", "no_expert_holder",
			"no connected worker holds %d (layer, expert) pair(s) this step needed (layer %d, waited %v)%s; retry after %d s",
			len(me.Experts), me.Layer, me.Waited.Round(time.Millisecond), missing, secs)
	}
	return newAPIError(http.StatusInternalServerError, "server_error", "", "", "generation failed: %v", d.Err)
}

// run submits j and writes the response: one JSON object, or server-sent
// events when p.Stream. The request's context cancels the generation (a
// client disconnect), as does an error or a timeout (WriteTimeout) writing
// the response. A stream that fails after its first token, or is ended by
// the server's shutdown, ends with an error event and [DONE].
func (s *Server) run(w http.ResponseWriter, r *http.Request, j Job, p *genParams, chat bool) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	st, err := s.Submit(ctx, j)
	if err != nil {
		s.writeTimeout(w)
		writeError(w, s.submitError(w, err))
		return
	}
	defer st.Cancel()
	rs := &response{s: s, w: w, rc: http.NewResponseController(w), chat: chat, logprobs: j.Logprobs, id: newID("cmpl-"), created: time.Now().Unix(),
		object: "text_completion"}
	if chat {
		rs.id, rs.object = newID("chatcmpl-"), "chat.completion"
	}
	if !p.Stream {
		rs.whole(ctx, st)
		return
	}
	// The status goes with the first delta: a generation that fails before
	// its first token (no expert holder) is an HTTP error.
	first, err := st.Next(ctx)
	if err != nil {
		clientGone(w)
		return
	}
	if first.Done && (first.Finish == FinishError || first.Finish == FinishCancelled) && first.Text == "" {
		s.writeTimeout(w)
		writeError(w, s.finishError(w, first))
		return
	}
	rs.includeUsage = p.StreamOptions != nil && p.StreamOptions.IncludeUsage
	rs.stream(ctx, st, first)
}

// response writes one request's answer.
type response struct {
	s            *Server
	w            http.ResponseWriter
	rc           *http.ResponseController // w's deadlines and flush, made once
	chat         bool
	logprobs     bool // Job.Logprobs
	id, object   string
	created      int64
	includeUsage bool
	offset       int // text_offset of the next completion token
}

// deadline gives the next write WriteTimeout.
func (rs *response) deadline() {
	_ = rs.rc.SetWriteDeadline(time.Now().Add(rs.s.cfg.WriteTimeout))
}

// whole waits for the end of the generation and writes one JSON object.
func (rs *response) whole(ctx context.Context, st *Stream) {
	var text strings.Builder
	var lps []TokenLogprob
	for {
		d, err := st.Next(ctx)
		if err != nil {
			clientGone(rs.w)
			return // the client went away; Cancel runs
		}
		text.WriteString(d.Text)
		lps = append(lps, d.Logprobs...)
		if !d.Done {
			continue
		}
		rs.deadline()
		if d.Finish == FinishError || d.Finish == FinishCancelled {
			writeError(rs.w, rs.s.finishError(rs.w, d))
			return
		}
		choice := map[string]any{"index": 0, "finish_reason": d.Finish, "logprobs": rs.logprobsObject(lps)}
		if rs.chat {
			choice["message"] = map[string]any{"role": "assistant", "content": text.String()}
		} else {
			choice["text"] = text.String()
		}
		writeJSON(rs.w, http.StatusOK, map[string]any{"id": rs.id, "object": rs.object, "created": rs.created,
			"model": rs.s.cfg.ModelID, "choices": []any{choice},
			"usage": usage{d.PromptTokens, d.CompletionTokens, d.PromptTokens + d.CompletionTokens}})
		return
	}
}

// send writes one server-sent event (v as JSON, or the raw [DONE]) within
// WriteTimeout; false when the client cannot take it.
func (rs *response) send(v any) bool {
	var b []byte
	if raw, ok := v.(string); ok {
		b = []byte(raw)
	} else {
		var err error
		if b, err = json.Marshal(v); err != nil {
			return false
		}
	}
	buf := make([]byte, 0, len(b)+8)
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	rs.deadline()
	if _, err := rs.w.Write(buf); err != nil {
		clientGone(rs.w)
		return false
	}
	if err := rs.rc.Flush(); err != nil {
		clientGone(rs.w)
		return false
	}
	return true
}

// chunk is one streamed object. As OpenAI's: with include_usage every
// chunk carries "usage": null but the last one before [DONE], whose choices
// are empty and whose usage is the request's; without it no chunk has the
// key.
func (rs *response) chunk(text string, finish any, first bool, lps []TokenLogprob) map[string]any {
	choice := map[string]any{"index": 0, "finish_reason": finish, "logprobs": rs.logprobsObject(lps)}
	if rs.chat {
		delta := map[string]any{}
		if first {
			delta["role"] = "assistant"
		}
		if text != "" || first {
			delta["content"] = text
		}
		choice["delta"] = delta
	} else {
		choice["text"] = text
	}
	object := rs.object
	if rs.chat {
		object = "chat.completion.chunk"
	}
	c := map[string]any{"id": rs.id, "object": object, "created": rs.created, "model": rs.s.cfg.ModelID,
		"choices": []any{choice}}
	if rs.includeUsage {
		c["usage"] = nil
	}
	return c
}

// stream writes the generation as server-sent events, starting with first.
func (rs *response) stream(ctx context.Context, st *Stream, first Delta) {
	h := rs.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	rs.deadline()
	rs.w.WriteHeader(http.StatusOK)
	if rs.chat && !rs.send(rs.chunk("", nil, true, nil)) {
		return
	}
	next := &first
	for {
		var d Delta
		if next != nil {
			d, next = *next, nil
		} else {
			var err error
			if d, err = st.Next(ctx); err != nil {
				clientGone(rs.w)
				return
			}
		}
		if d.Done && (d.Finish == FinishError || d.Finish == FinishCancelled) {
			if (d.Text != "" || len(d.Logprobs) > 0) && !rs.send(rs.chunk(d.Text, nil, false, d.Logprobs)) {
				return
			}
			if rs.send(map[string]any{"error": rs.s.finishError(rs.w, d)}) {
				rs.send("[DONE]")
			}
			return
		}
		if (d.Text != "" || len(d.Logprobs) > 0) && !rs.send(rs.chunk(d.Text, nil, false, d.Logprobs)) {
			return
		}
		if !d.Done {
			continue
		}
		if !rs.send(rs.chunk("", d.Finish, false, nil)) {
			return
		}
		if rs.includeUsage {
			u := usage{d.PromptTokens, d.CompletionTokens, d.PromptTokens + d.CompletionTokens}
			c := rs.chunk("", nil, false, nil)
			c["choices"], c["usage"] = []any{}, u
			if !rs.send(c) {
				return
			}
		}
		rs.send("[DONE]")
		return
	}
}
