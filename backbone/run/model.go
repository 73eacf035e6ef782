// Package run is the backbone's model at work, shared by the commands that
// decode (backbone generate, serve and demo): loading a GGUF model with its
// tokenizer and swarm identity (Load), starting the swarm's dispatcher for
// it and waiting for workers (StartSwarm), and decoding one prompt on one
// sequence (Decode); serving the OpenAI-compatible API over it (ServeAPI,
// with its experts local or over the swarm, ServeExperts); the flags these
// commands share (SwarmFlags, AddAPIFlags, ParseBytes) and their reports
// (WorkersJSON, ProcessRSS). The commands in backbone/cmd_*.go parse flags
// and wire these together; the HTTP API's continuous batching is
// backbone/serve.
//
// Of the engine's model it uses model.Load, Model.NewSequence, Forward,
// Params().Vocab, Context, Layers, Embd, Experts and ExpertsUsed, and
// LocalExperts; sequences are only ever created, never truncated, so it
// works the same for architectures whose sequences cannot be rewound.
package run

import (
	"errors"
	"fmt"

	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// Model is a model ready to decode: the open GGUF file, the engine's model
// over it, its tokenizer and the model id workers announce.
type Model struct {
	f   *gguf.File
	m   *model.Model
	tok *tokenizer.Tokenizer
	id  string
	bo  *slice.BackboneOnly // set for a backbone-only file
}

// Load opens the GGUF file at path (mapped), or the embedded tiny model
// when path is "" (OpenFile), and loads model and tokenizer (FromFile).
// Close releases the file.
func Load(path string) (*Model, error) {
	f, err := OpenFile(path)
	if err != nil {
		return nil, err
	}
	m, err := FromFile(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return m, nil
}

// OpenFile opens the GGUF file at path (mapped), or parses the embedded
// default model (engine/demomodel: a tiny qwen35moe trained on the King
// James Bible, its SHA-256 and model id checked) when path is "". Errors
// are those of gguf.Open, or demomodel.File's (demomodel.ErrChecksum,
// gguf.Parse's).
func OpenFile(path string) (*gguf.File, error) {
	if path != "" {
		return gguf.Open(path)
	}
	return demomodel.File()
}

// FromFile loads model and tokenizer from the open file f, which the
// result's Close closes; on error the caller still owns f. A backbone-only
// file (engine/slice.WriteBackboneOnly) loads with only its hot experts,
// which are checked against its stored hashes; its ID is the full model's.
// Errors are those of model.Load, tokenizer.FromGGUF and
// slice.ReadBackboneOnly, or slice.ErrCorrupt for a hot expert whose bytes
// differ from its hash.
func FromFile(f *gguf.File) (*Model, error) {
	m, err := model.Load(f)
	if err != nil {
		return nil, err
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, err
	}
	id, _ := slice.ModelID(f)
	lm := &Model{f: f, m: m, tok: tok, id: id}
	if slice.IsBackboneOnly(f) {
		if lm.bo, err = slice.ReadBackboneOnly(f); err != nil {
			return nil, err
		}
		if err := lm.bo.CheckHot(m.LocalExperts().Layer); err != nil {
			return nil, err
		}
		lm.id = lm.bo.ModelID
	}
	return lm, nil
}

// BackboneOnly describes the full model a backbone-only file stands for
// (its experts' hashes, sizes and byte ranges); nil for a full file.
func (m *Model) BackboneOnly() *slice.BackboneOnly { return m.bo }

// ErrNeedsSwarm is returned by CheckLocal for a backbone-only model.
var ErrNeedsSwarm = errors.New("the model file is backbone-only (its routed experts live on workers): serve it with --dispatch-listen")

// CheckLocal returns ErrNeedsSwarm (wrapped, with the expert count) when m
// cannot decode with its own experts alone: a backbone-only file.
func (m *Model) CheckLocal() error {
	if m.bo == nil {
		return nil
	}
	return fmt.Errorf("%w (%d of %d experts held here)", ErrNeedsSwarm, len(m.bo.Hot), m.bo.NLayer*m.bo.NExpert)
}

// File is the model's GGUF file: its metadata, and the tensors slices,
// provisioning catalogs and more engine instances are made from. It stays
// open until Close.
func (m *Model) File() *gguf.File { return m.f }

// Engine is the engine's model: its experts (SetExperts), threads
// (SetThreads) and forward pass.
func (m *Model) Engine() *model.Model { return m.m }

// Tokenizer is the model's tokenizer (from the GGUF file).
func (m *Model) Tokenizer() *tokenizer.Tokenizer { return m.tok }

// ID is the model id workers announce in HELLO (engine/slice.ModelID of
// the file, or of the full model for a backbone-only file); "" if the file
// has none.
func (m *Model) ID() string { return m.id }

// Close closes the model's file; the engine model must not be used after.
func (m *Model) Close() error { return m.f.Close() }
