package run

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/spec"
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
	// Draft is the source of speculative drafts (package spec; "" or
	// spec.ModeNone: plain decoding). Output tokens and logits are the
	// same with any mode, at any temperature for a given seed.
	Draft spec.Mode
	// DraftMax is the most draft tokens verified per forward (<= 0:
	// spec.DefaultMax).
	DraftMax int
}

// Result is what Decode did. Its JSON field names are those of `backbone
// generate --json`.
type Result struct {
	// PromptTokens are the prompt's token ids.
	PromptTokens []int32 `json:"prompt_tokens"`
	// Tokens are the sampled token ids, the end-of-generation token
	// included.
	Tokens []int32 `json:"tokens"`
	// Text is Tokens decoded as the text output streams them (a
	// tokenizer.Decoder): valid UTF-8, an invalid or cut-off sequence
	// shown as one U+FFFD, as serve's completions show it.
	Text string `json:"text"`
	// PrefillTokS is prompt tokens / prefill seconds.
	PrefillTokS float64 `json:"prefill_tok_s"`
	// DecodeTokS is the tokens the decode forwards produced (every token
	// but the first, which the prefill's logits give) / those forwards'
	// seconds; without drafts one token per forward.
	DecodeTokS float64 `json:"decode_tok_s"`
	// LogitsSHA256 is the hex SHA-256 over every logits vector the decode
	// computed (prefill's last row, then each step's; vocab float32 each,
	// little-endian): equal hashes mean bit-identical logits.
	LogitsSHA256 string `json:"logits_sha256"`
	// MaxStepMs is the longest decode forward pass, ms (a stall shows
	// here).
	MaxStepMs float64 `json:"max_step_ms"`
	// Finish is why decoding stopped: "stop" (an end-of-generation
	// token), "length" (MaxTokens; also with MaxTokens 0) or "context"
	// (the model's context length was reached first).
	Finish string `json:"finish_reason"`
	// Draft is the draft mode used (DecodeOptions.Draft; "none" without).
	Draft spec.Mode `json:"draft"`
	// Drafted and accepted draft tokens and the decode's forward passes.
	spec.Stats
}

// Decode prefills o.Prompt in one batch on a new sequence of m, then
// samples until o.MaxTokens, an end-of-generation token or the context
// length, streaming complete UTF-8 text to out (nil: nowhere) as it goes.
// Without drafts each forward feeds back the one sampled token; with
// o.Draft each forward verifies the sampled token and up to o.DraftMax
// drafts after it (package spec: same tokens and logits, fewer forwards).
// The experts are whatever m.Engine() has installed; ctx cancels the
// forward passes. With spec.ModeMTP the drafts come from the model's
// multi-token-prediction head (model.MTPDrafter, shown every forward's
// rows and hidden states); its time counts in the decode's. Errors: the
// prompt encodes to no tokens, ModeMTP on a model without an MTP head
// (model.ErrNoMTP) or an unknown mode, or those of Forward, Hidden, the
// MTP drafter, Checkpoint and Truncate and of writing to out.
func Decode(ctx context.Context, m *Model, o DecodeOptions, out io.Writer) (*Result, error) {
	if out == nil {
		out = io.Discard
	}
	eng, tok := m.m, m.tok
	res := &Result{PromptTokens: tok.Tokenize(o.Prompt, true, o.Special), Tokens: []int32{}, Draft: o.Draft}
	if res.Draft == "" {
		res.Draft = spec.ModeNone
	}
	if len(res.PromptTokens) == 0 {
		return nil, errors.New("the prompt encodes to no tokens")
	}
	draftMax := o.DraftMax
	if draftMax <= 0 {
		draftMax = spec.DefaultMax
	}
	var draft func(dst, hist []int32, max int) []int32
	var mtp *model.MTPDrafter
	switch res.Draft {
	case spec.ModeNone:
	case spec.ModeNGram:
		draft = spec.NGram
	case spec.ModeMTP:
		d, err := eng.NewMTPDrafter()
		if err != nil {
			return nil, fmt.Errorf("draft mode mtp: %w (use ngram)", err)
		}
		mtp = d
	default:
		return nil, fmt.Errorf("draft mode %q: want none, ngram or mtp", res.Draft)
	}
	h := sha256.New()
	res.LogitsSHA256 = hex.EncodeToString(h.Sum(nil))
	vocab, ctxLen := eng.Params().Vocab, eng.Params().Context
	if n := len(res.PromptTokens); n > ctxLen {
		return nil, fmt.Errorf("the prompt has %d tokens; the model's context is %d", n, ctxLen)
	}
	res.Finish = "length"
	if o.MaxTokens == 0 {
		return res, nil
	}
	logits := make([]float32, (draftMax+1)*vocab)
	raw := make([]byte, 4*vocab)
	hashLogits := func(lg []float32) {
		for i, v := range lg {
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
	if err := eng.Forward(ctx, rows, logits[:vocab]); err != nil {
		return nil, err
	}
	res.PrefillTokS = float64(len(rows)) / time.Since(start).Seconds()
	hashLogits(logits[:vocab])
	// observe shows the MTP drafter the rows of the Forward just run
	// (tokens and output-normed hidden states).
	var hidden []float32
	var rowToks []int32
	observe := func(rows []model.Row) error {
		if mtp == nil {
			return nil
		}
		e := eng.Params().Embd
		if cap(hidden) < len(rows)*e {
			hidden = make([]float32, len(rows)*e)
		}
		hidden = hidden[:len(rows)*e]
		rowToks = rowToks[:0]
		for _, r := range rows {
			rowToks = append(rowToks, r.Token)
		}
		if err := eng.Hidden(hidden); err != nil {
			return err
		}
		return mtp.Observe(rows[0].Pos, rowToks, hidden)
	}
	if err := observe(rows); err != nil {
		return nil, err
	}

	sampler := model.NewSampler(o.Sampler)
	dec := tok.NewDecoder(false)
	var text strings.Builder // what dec streams: Result.Text
	var decodeTime, maxStep time.Duration
	hist := append([]int32{}, res.PromptTokens...)
	var drafts []int32
	// emit appends a chosen token and reports whether decoding stops at
	// it: o.MaxTokens, an end-of-generation token, or its position (the
	// prompt's length plus its index) outside the context.
	emit := func(t int32) (bool, error) {
		res.Tokens = append(res.Tokens, t)
		hist = append(hist, t)
		piece := dec.Add(t)
		text.WriteString(piece)
		if _, err := io.WriteString(out, piece); err != nil {
			return true, err
		}
		if o.OnToken != nil {
			o.OnToken(len(res.Tokens)-1, t)
		}
		return len(res.Tokens) >= o.MaxTokens || tok.IsEOG(t) || len(hist)-1 >= ctxLen, nil
	}
	next := sampler.Sample(logits[:vocab])
	for {
		stop, err := emit(next)
		if err != nil {
			return nil, err
		}
		if stop {
			break
		}
		// Drafts: at most what MaxTokens and the context leave after next.
		drafts = drafts[:0]
		var draftTime time.Duration
		if k := min(draftMax, o.MaxTokens-len(res.Tokens), ctxLen-1-seq.Len()); k > 0 {
			switch {
			case draft != nil:
				drafts = draft(drafts, hist, k)
			case mtp != nil:
				t0 := time.Now()
				if drafts, err = mtp.Draft(ctx, drafts, next, k); err != nil {
					return nil, err
				}
				draftTime = time.Since(t0)
			}
		}
		base := seq.Len()
		rows = rows[:0]
		rows = append(rows, model.Row{Seq: seq, Token: next, Pos: base, Logits: true})
		for i, d := range drafts {
			rows = append(rows, model.Row{Seq: seq, Token: d, Pos: base + 1 + i, Logits: true})
		}
		if len(drafts) > 0 {
			if err := seq.Checkpoint(); err != nil {
				return nil, err
			}
		}
		t0 := time.Now()
		if err := eng.Forward(ctx, rows, logits[:len(rows)*vocab]); err != nil {
			return nil, err
		}
		if err := observe(rows); err != nil {
			return nil, err
		}
		step := time.Since(t0) + draftTime
		decodeTime += step
		maxStep = max(maxStep, step)
		res.Forwards++
		res.Drafted += len(drafts)
		// Row i's logits choose the token after rows[i]: keep drafts while
		// they equal the choice, then the choice that differs (or the
		// choice after the last draft) is the next token.
		kept := 0
		for i := range rows {
			lg := logits[i*vocab : (i+1)*vocab]
			hashLogits(lg)
			next = sampler.Sample(lg)
			if i == len(drafts) || next != drafts[i] {
				break
			}
			kept++
			res.Accepted++
			if stop, err = emit(next); err != nil {
				return nil, err
			}
			if stop {
				break
			}
		}
		if len(drafts) > 0 {
			if err := seq.Truncate(base + 1 + kept); err != nil {
				return nil, err
			}
			if mtp != nil {
				if err := mtp.Truncate(base + 1 + kept); err != nil {
					return nil, err
				}
			}
		}
		if stop {
			break
		}
	}
	tail := dec.Flush()
	text.WriteString(tail)
	if _, err := io.WriteString(out, tail); err != nil {
		return nil, err
	}
	switch last := res.Tokens[len(res.Tokens)-1]; {
	case tok.IsEOG(last):
		res.Finish = "stop"
	case len(res.Tokens) < o.MaxTokens:
		res.Finish = "context"
	}
	res.Text = text.String()
	res.LogitsSHA256 = hex.EncodeToString(h.Sum(nil))
	res.MaxStepMs = float64(maxStep) / 1e6
	if res.Forwards > 0 {
		res.DecodeTokS = float64(len(res.Tokens)-1) / decodeTime.Seconds()
	}
	return res, nil
}
