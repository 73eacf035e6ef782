// Package demomodel embeds kvasir's default model: a tiny qwen35moe (4
// layers: 3 Gated DeltaNet, 1 gated attention; 8 routed experts top-2 and
// a shared expert; d_model 128; Q8_0) trained on the King James Bible with
// a 2048-token BPE vocabulary of the project's own trainer. `backbone
// demo`, `generate`, `serve` (without --model), the workers' --model-tiny
// and the app's test swarm run it, so what they print is readable English
// in the style of its corpus. How it was made (scripts/train/train_demo.py,
// engine/demomodel/train) and what it scores is docs/demo-model.md.
//
// The file is fixed: Bytes checks its SHA-256 and File also its model id
// (engine/slice.ModelID) before anything uses it. The generated
// random-weight models (engine/modelgen) stay for tests and benchmarks.
package demomodel

import (
	"crypto/sha256"
	_ "embed" // the GGUF file below
	"encoding/hex"
	"errors"
	"fmt"
	"sync"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

// FileName is the embedded file's name (in this folder).
const FileName = "kjv-qwen35moe.gguf"

// SHA256 is the hex SHA-256 of the embedded file's bytes.
const SHA256 = "d0f6869a96b652fed4cd6cca0bdf2623878884810efc336e1abe233a243b4f4f"

// ID is the embedded model's id (engine/slice.ModelID: its name, shape and
// tensor layout), the model id workers and the hub know it by.
const ID = "kvasir-kjv-qwen35moe@d7def71e26336442"

// ErrChecksum reports embedded bytes whose SHA-256 or model id is not the
// one fixed in this package (a file replaced without updating SHA256 and
// ID, or corrupted).
var ErrChecksum = errors.New("demomodel: the embedded model is not the one fixed in the code")

//go:embed kjv-qwen35moe.gguf
var embedded []byte

var check = sync.OnceValue(func() error { return verify(embedded, SHA256) })

// verify returns nil when data's SHA-256 is want (hex), else an
// ErrChecksum error naming both.
func verify(data []byte, want string) error {
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != want {
		return fmt.Errorf("%w: %s has SHA-256 %s, want %s", ErrChecksum, FileName, got, want)
	}
	return nil
}

// Bytes returns the embedded GGUF file (callers must not modify it) after
// checking, once, that its SHA-256 is SHA256. Errors wrap ErrChecksum.
func Bytes() ([]byte, error) {
	if err := check(); err != nil {
		return nil, err
	}
	return embedded, nil
}

// File parses the embedded file (Bytes) and checks that its model id is
// ID. Errors wrap ErrChecksum, or are gguf.Parse's.
func File() (*gguf.File, error) {
	data, err := Bytes()
	if err != nil {
		return nil, err
	}
	f, err := gguf.Parse(data)
	if err != nil {
		return nil, err
	}
	if id, _ := slice.ModelID(f); id != ID {
		return nil, fmt.Errorf("%w: %s has model id %s, want %s", ErrChecksum, FileName, id, ID)
	}
	return f, nil
}
