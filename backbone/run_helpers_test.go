package main

import (
	"context"
	"io"
	"log/slog"

	"github.com/kvasir-ai/kvasir/backbone/dispatch"
	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

// The command tests and benchmarks in this package load, dispatch and
// decode through the names below, which they used before model loading,
// the swarm start and the decode loop moved to package run; each is a thin
// view of run's API, so the tests exercise exactly what the commands run.

// loadedModel is a run.Model with its parts at hand.
type loadedModel struct {
	*run.Model
	m   *model.Model
	tok *tokenizer.Tokenizer
	id  string
}

func viewModel(rm *run.Model) *loadedModel {
	return &loadedModel{Model: rm, m: rm.Engine(), tok: rm.Tokenizer(), id: rm.ID()}
}

// loadGenModel is run.Load.
func loadGenModel(path string) (*loadedModel, error) {
	rm, err := run.Load(path)
	if err != nil {
		return nil, err
	}
	return viewModel(rm), nil
}

// startDispatcher is run.StartSwarm on listen without waiting for workers,
// tune having the last word on the dispatcher's configuration.
func startDispatcher(lm *loadedModel, listen string, log *slog.Logger, tune func(*dispatch.Config)) (*dispatch.Dispatcher, error) {
	return run.StartSwarm(context.Background(), lm.Model, run.SwarmConfig{Listen: listen, Logger: log, Tune: tune})
}

// decodeOptions are run.DecodeOptions.
type decodeOptions struct {
	prompt    string
	maxTokens int
	special   bool
	sampler   model.SamplerOptions
	onToken   func(i int, tok int32)
}

// decode is run.Decode.
func decode(ctx context.Context, lm *loadedModel, o decodeOptions, out io.Writer) (*run.Result, error) {
	return run.Decode(ctx, lm.Model, run.DecodeOptions{Prompt: o.prompt, MaxTokens: o.maxTokens, Special: o.special,
		Sampler: o.sampler, OnToken: o.onToken}, out)
}
