package serve

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Bounds of the logprobs fields, as OpenAI's API sets them.
const (
	// MaxLogprobsCompletions bounds /v1/completions' "logprobs" (the
	// number of alternatives per token).
	MaxLogprobsCompletions = 5
	// MaxLogprobsChat bounds /v1/chat/completions' "top_logprobs".
	MaxLogprobsChat = 20
	// MaxLogitBias bounds the magnitude of a "logit_bias" value.
	MaxLogitBias = 100
	// MaxLogitBiasEntries bounds the tokens one request may bias.
	MaxLogitBiasEntries = 1024
)

// TokenLogprob is one sampled token with its log-probability and, when
// asked, the most likely alternatives at its position. Log-probabilities
// are those of the model's distribution, log_softmax(logits) in float64,
// before logit_bias, temperature, top-k and top-p (what vLLM reports by
// default and llama-server's "post_sampling_probs": false; OpenAI's
// reference is the same model distribution).
type TokenLogprob struct {
	Token   int32
	Logprob float64
	Top     []TopLogprob // the Job.TopLogprobs most likely tokens, most likely first (ties: lower id)
}

// TopLogprob is one alternative of a TokenLogprob.
type TopLogprob struct {
	Token   int32
	Logprob float64
}

// logprobsOf returns the TokenLogprob of token t under logits, with the n
// most likely alternatives. It reads logits only.
func logprobsOf(logits []float32, t int32, n int) TokenLogprob {
	maxv := math.Inf(-1)
	for _, x := range logits {
		maxv = max(maxv, float64(x))
	}
	var sum float64
	for _, x := range logits {
		sum += math.Exp(float64(x) - maxv)
	}
	lse := maxv + math.Log(sum)
	lp := TokenLogprob{Token: t, Logprob: float64(logits[t]) - lse}
	if n <= 0 {
		return lp
	}
	// The n largest by a bounded insertion (n <= MaxLogprobsChat).
	top := make([]TopLogprob, 0, n+1)
	for i, x := range logits {
		v := float64(x) - lse
		if len(top) == n && v <= top[n-1].Logprob {
			continue
		}
		k := sort.Search(len(top), func(j int) bool { return top[j].Logprob < v })
		top = append(top, TopLogprob{})
		copy(top[k+1:], top[k:])
		top[k] = TopLogprob{Token: int32(i), Logprob: v}
		if len(top) > n {
			top = top[:n]
		}
	}
	lp.Top = top
	return lp
}

// logitBias parses a request's "logit_bias": token ids (as JSON object
// keys) to values in [-MaxLogitBias, MaxLogitBias] added to the logits
// before sampling (as OpenAI, vLLM and llama-server do).
func (s *Server) logitBias(m map[string]float64) (map[int32]float32, *apiError) {
	if len(m) == 0 {
		return nil, nil
	}
	if len(m) > MaxLogitBiasEntries {
		return nil, badRequest("logit_bias", "invalid_value", "at most %d biased tokens (got %d)", MaxLogitBiasEntries, len(m))
	}
	out := make(map[int32]float32, len(m))
	for k, v := range m {
		id, err := strconv.ParseInt(k, 10, 32)
		if err != nil || id < 0 || id >= int64(s.p.Vocab) {
			return nil, badRequest("logit_bias", "invalid_value", "logit_bias key %q is not a token id in [0, %d)", k, s.p.Vocab)
		}
		if !(v >= -MaxLogitBias && v <= MaxLogitBias) {
			return nil, badRequest("logit_bias", "invalid_value", "logit_bias[%s] must be in [-%d, %d] (got %v)", k, MaxLogitBias, MaxLogitBias, v)
		}
		out[int32(id)] = float32(v)
	}
	return out, nil
}

// chatLogprobs applies chat's "logprobs" (bool) and "top_logprobs" to j.
func chatLogprobs(j *Job, on *bool, top *intParam) *apiError {
	if top != nil && (*top < 0 || *top > MaxLogprobsChat) {
		return badRequest("top_logprobs", "invalid_value", "top_logprobs must be in [0, %d] (got %d)", MaxLogprobsChat, *top)
	}
	if on == nil || !*on {
		if top != nil && *top > 0 {
			return badRequest("top_logprobs", "invalid_value", "top_logprobs needs \"logprobs\": true")
		}
		return nil
	}
	j.Logprobs = true
	if top != nil {
		j.TopLogprobs = int(*top)
	}
	return nil
}

// logprobsObject renders lps as the endpoint's "logprobs" value: null when
// not asked for; chat: {"content": [{"token","logprob","bytes","top_logprobs"}]};
// completions: {"tokens","token_logprobs","top_logprobs","text_offset"}, the
// offsets counted in bytes from the start of the completion text.
func (rs *response) logprobsObject(lps []TokenLogprob) any {
	if !rs.logprobs {
		return nil
	}
	tok := rs.s.tok
	piece := func(id int32) string { return tok.Decode([]int32{id}) }
	if rs.chat {
		content := make([]any, 0, len(lps))
		for _, lp := range lps {
			top := make([]any, 0, len(lp.Top))
			for _, a := range lp.Top {
				top = append(top, chatEntry(piece(a.Token), a.Logprob, nil))
			}
			content = append(content, chatEntry(piece(lp.Token), lp.Logprob, top))
		}
		return map[string]any{"content": content}
	}
	tokens := make([]string, len(lps))
	raw := make([]string, len(lps))
	values := make([]float64, len(lps))
	tops := make([]any, len(lps))
	offsets := make([]int, len(lps))
	for i, lp := range lps {
		raw[i] = piece(lp.Token)
		tokens[i], values[i], offsets[i] = tokenText(raw[i]), lp.Logprob, rs.offset
		rs.offset += len(raw[i])
		top := make(map[string]float64, len(lp.Top))
		for _, a := range lp.Top {
			if k := tokenText(piece(a.Token)); !hasKey(top, k) {
				top[k] = a.Logprob
			}
		}
		tops[i] = top
	}
	return map[string]any{"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}
}

// tokenText is a token's text as the completions logprobs show it: the
// text itself when it is valid UTF-8, else "bytes:" and its bytes as \xNN
// escapes (OpenAI's form for a token holding part of a character).
func tokenText(piece string) string {
	if utf8.ValidString(piece) {
		return piece
	}
	var b strings.Builder
	b.WriteString("bytes:")
	for i := range len(piece) {
		fmt.Fprintf(&b, "\\x%02x", piece[i])
	}
	return b.String()
}

func hasKey(m map[string]float64, k string) bool {
	_, ok := m[k]
	return ok
}

// chatEntry is one chat logprobs entry; "bytes" are the token's UTF-8
// bytes (a token may hold part of a character: its text then shows U+FFFD
// and the bytes tell the truth).
func chatEntry(text string, lp float64, top []any) map[string]any {
	b := make([]int, len(text))
	for i := range len(text) {
		b[i] = int(text[i])
	}
	if !utf8.ValidString(text) {
		text = string([]rune(text)) // invalid bytes become U+FFFD, as JSON would
	}
	e := map[string]any{"token": text, "logprob": lp, "bytes": b}
	if top != nil {
		e["top_logprobs"] = top
	}
	return e
}

// applyBias adds j's logit_bias to the logits row in place (after the
// logprobs were read from it).
func applyBias(logits []float32, bias map[int32]float32) {
	for id, b := range bias {
		logits[id] += b
	}
}
