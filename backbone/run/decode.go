package run

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"math"
	"time"

	"github.com/kvasir-ai/kvasir/engine/model"
)

// DecodeOptions are the settings of one Decode.
type DecodeOptions struct {
	// Prompt is the text to continue; it is tokenized with BOS as the
	// model's tokenizer wants.
	Prompt string
	// MaxTokens is the most tokens to sample; 0 samples none (and runs no
	// forward pass).
	MaxTokens int
	// Special parses special-token text (e.g. <|im_start|>) in Prompt.
	Special bool
	// Sampler chooses each token (model.SamplerOptions; zero: greedy).
	Sampler model.SamplerOptions
	// OnToken, if set, is called after each sampled token (i counts from
	// 0), before the next forward pass.
	OnToken func(i int, tok int32)
}

// Result is what Decode did. Its JSON field names are those of `backbone
// generate --json`.
type Result struct {
	// PromptTokens are the prompt's token ids.
	PromptTokens []int32 `json:"prompt_tokens"`
	// Tokens are the sampled token ids, the end-of-generation token
	// included.
	Tokens []int32 `json:"tokens"`
	// Text is Tokens decoded; invalid UTF-8 bytes become U+FFFD in JSON.
	Text string `json:"text"`
	// PrefillTokS is prompt tokens / prefill seconds.
	PrefillTokS float64 `json:"prefill_tok_s"`
	// DecodeTokS is single-token forward passes / their seconds.
	DecodeTokS float64 `json:"decode_tok_s"`
	// LogitsSHA256 is the hex SHA-256 over every logits vector the decode
	// computed (prefill's last row, then each step's; vocab float32 each,
	// little-endian): equal hashes mean bit-identical logits.
	LogitsSHA256 string `json:"logits_sha256"`
	// MaxStepMs is the longest single-token forward pass, ms (a stall shows
	// here).
	MaxStepMs float64 `json:"max_step_ms"`
}

// Decode prefills o.Prompt in one batch on a new sequence of m, then
// samples and feeds back one token at a time until o.MaxTokens, an
// end-of-generation token or the context length, streaming complete UTF-8
// text to out (nil: nowhere) as it goes. The experts are whatever
// m.Engine() has installed; ctx cancels the forward passes. Errors: the
// prompt encodes to no tokens, or those of Forward and of writing to out.
func Decode(ctx context.Context, m *Model, o DecodeOptions, out io.Writer) (*Result, error) {
	if out == nil {
		out = io.Discard
	}
	eng, tok := m.m, m.tok
	res := &Result{PromptTokens: tok.Tokenize(o.Prompt, true, o.Special), Tokens: []int32{}}
	if len(res.PromptTokens) == 0 {
		return nil, errors.New("the prompt encodes to no tokens")
	}
	h := sha256.New()
	res.LogitsSHA256 = hex.EncodeToString(h.Sum(nil))
	if o.MaxTokens == 0 {
		return res, nil
	}
	vocab := eng.Params().Vocab
	logits := make([]float32, vocab)
	raw := make([]byte, 4*vocab)
	hashLogits := func() {
		for i, v := range logits {
			binary.LittleEndian.PutUint32(raw[4*i:], math.Float32bits(v))
		}
		h.Write(raw)
	}
	seq := eng.NewSequence()
	rows := make([]model.Row, len(res.PromptTokens))
	for i, t := range res.PromptTokens {
		rows[i] = model.Row{Seq: seq, Token: t, Pos: i, Logits: i == len(rows)-1}
	}
	start := time.Now()
	if err := eng.Forward(ctx, rows, logits); err != nil {
		return nil, err
	}
	res.PrefillTokS = float64(len(rows)) / time.Since(start).Seconds()
	hashLogits()

	sampler := model.NewSampler(o.Sampler)
	dec := tok.NewDecoder(false)
	decodeSteps := 0
	var decodeTime, maxStep time.Duration
	for {
		next := sampler.Sample(logits)
		res.Tokens = append(res.Tokens, next)
		if _, err := io.WriteString(out, dec.Add(next)); err != nil {
			return nil, err
		}
		if o.OnToken != nil {
			o.OnToken(len(res.Tokens)-1, next)
		}
		if len(res.Tokens) >= o.MaxTokens || tok.IsEOG(next) || seq.Len() >= eng.Params().Context {
			break
		}
		row := []model.Row{{Seq: seq, Token: next, Pos: seq.Len(), Logits: true}}
		t0 := time.Now()
		if err := eng.Forward(ctx, row, logits); err != nil {
			return nil, err
		}
		step := time.Since(t0)
		decodeTime += step
		maxStep = max(maxStep, step)
		decodeSteps++
		hashLogits()
	}
	if _, err := io.WriteString(out, dec.Flush()); err != nil {
		return nil, err
	}
	res.Text = tok.Decode(res.Tokens)
	res.LogitsSHA256 = hex.EncodeToString(h.Sum(nil))
	res.MaxStepMs = float64(maxStep) / 1e6
	if decodeSteps > 0 {
		res.DecodeTokS = float64(decodeSteps) / decodeTime.Seconds()
	}
	return res, nil
}
