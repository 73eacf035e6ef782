package tokenizer

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// GGUF metadata keys of the tokenizer (llama.cpp src/llama-arch.cpp
// LLM_KV_TOKENIZER_*).
const (
	KeyModel  = "tokenizer.ggml.model"
	KeyPre    = "tokenizer.ggml.pre"
	KeyTokens = "tokenizer.ggml.tokens"
	KeyTypes  = "tokenizer.ggml.token_type"
	KeyMerges = "tokenizer.ggml.merges"
	KeyBOS    = "tokenizer.ggml.bos_token_id"
	KeyEOS    = "tokenizer.ggml.eos_token_id"
	KeyAddBOS = "tokenizer.ggml.add_bos_token"
	KeyAddEOS = "tokenizer.ggml.add_eos_token"
)

// ModelGPT2 is the only supported tokenizer.ggml.model (byte-level BPE).
const ModelGPT2 = "gpt2"

// defaultBPEID is llama.cpp's default BOS/EOS id for "gpt2" vocabularies.
const defaultBPEID = 11

// FromGGUF reads the tokenizer of a GGUF file: tokenizer.ggml.model must be
// "gpt2" (else ErrModel); tokens, merges and pre are required; token_type
// defaults to all normal; bos/eos_token_id default to 11 as in llama.cpp
// (disabled if out of range, and an out-of-range stored id keeps the
// default); add_bos/add_eos_token default to false. Errors wrap
// gguf.ErrMissingKey / gguf.ErrKeyType for absent or mistyped keys, or
// New's errors. The Tokenizer keeps no reference to f (f may be closed).
func FromGGUF(f *gguf.File) (*Tokenizer, error) {
	c, err := ConfigFromGGUF(f)
	if err != nil {
		return nil, err
	}
	return New(c)
}

// ConfigFromGGUF reads the Config that FromGGUF builds its Tokenizer from
// (same keys, defaults and errors, without New's validation). Tokens and
// Merges share f's slices: clone them before modifying.
func ConfigFromGGUF(f *gguf.File) (Config, error) {
	var c Config
	model, err := f.String(KeyModel)
	if err != nil {
		return c, fmt.Errorf("tokenizer: %w", err)
	}
	if model != ModelGPT2 {
		return c, fmt.Errorf("%w: %s = %q (supported: %q)", ErrModel, KeyModel, model, ModelGPT2)
	}
	if c.Pre, err = f.String(KeyPre); err != nil {
		return c, fmt.Errorf("tokenizer: %w (supported pre-tokenizers: %v)", err, SupportedPre)
	}
	if c.Tokens, err = f.Strings(KeyTokens); err != nil {
		return c, fmt.Errorf("tokenizer: %w", err)
	}
	if c.Merges, err = f.Strings(KeyMerges); err != nil {
		return c, fmt.Errorf("tokenizer: %w", err)
	}
	types, err := f.Ints(KeyTypes)
	switch {
	case errors.Is(err, gguf.ErrMissingKey):
	case err != nil:
		return c, fmt.Errorf("tokenizer: %w", err)
	default:
		c.Types = make([]int32, len(types))
		for i, v := range types {
			if v < math.MinInt32 || v > math.MaxInt32 {
				v = int64(TypeUndefined)
			}
			c.Types[i] = int32(v)
		}
	}
	n := uint64(len(c.Tokens))
	c.BOS, c.EOS = -1, -1
	if defaultBPEID < n {
		c.BOS, c.EOS = defaultBPEID, defaultBPEID
	}
	for _, k := range []struct {
		key string
		id  *int32
	}{{KeyBOS, &c.BOS}, {KeyEOS, &c.EOS}} {
		v, err := f.Uint(k.key)
		switch {
		case errors.Is(err, gguf.ErrMissingKey):
		case err != nil:
			return c, fmt.Errorf("tokenizer: %w", err)
		case v < n:
			*k.id = int32(v)
		}
	}
	for _, k := range []struct {
		key string
		b   *bool
	}{{KeyAddBOS, &c.AddBOS}, {KeyAddEOS, &c.AddEOS}} {
		v, err := f.Bool(k.key)
		switch {
		case errors.Is(err, gguf.ErrMissingKey):
		case err != nil:
			return c, fmt.Errorf("tokenizer: %w", err)
		default:
			*k.b = v
		}
	}
	return c, nil
}

// WriteGGUF stores c under the tokenizer.ggml.* keys that FromGGUF reads
// (model "gpt2"; token_type as int32; bos/eos as uint32, omitted when -1).
func (c Config) WriteGGUF(w *gguf.Writer) {
	w.SetString(KeyModel, ModelGPT2)
	w.SetString(KeyPre, c.Pre)
	w.SetStrings(KeyTokens, c.Tokens)
	types := c.Types
	if len(types) == 0 {
		types = make([]int32, len(c.Tokens))
		for i := range types {
			types[i] = TypeNormal
		}
	}
	w.SetInt32s(KeyTypes, types)
	w.SetStrings(KeyMerges, c.Merges)
	if c.BOS >= 0 {
		w.SetUint32(KeyBOS, uint32(c.BOS))
	}
	if c.EOS >= 0 {
		w.SetUint32(KeyEOS, uint32(c.EOS))
	}
	w.SetBool(KeyAddBOS, c.AddBOS)
	w.SetBool(KeyAddEOS, c.AddEOS)
}
