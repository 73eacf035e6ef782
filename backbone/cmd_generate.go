package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

func init() {
	register("generate", "decode a prompt on a GGUF model (default: the embedded tiny model)", func(args []string) int {
		return generateMain(args, os.Stdout, os.Stderr)
	})
}

// generateResult is the --json output of generate.
type generateResult struct {
	PromptTokens []int32 `json:"prompt_tokens"`
	Tokens       []int32 `json:"tokens"`
	Text         string  `json:"text"`          // decoded tokens; invalid UTF-8 bytes become U+FFFD
	PrefillTokS  float64 `json:"prefill_tok_s"` // prompt tokens / prefill seconds
	DecodeTokS   float64 `json:"decode_tok_s"`  // single-token forward passes / their seconds
}

// generateMain implements
//
//	backbone generate --model FILE --prompt TEXT --max-tokens N --temperature 0 [--top-k K --top-p P --seed S --threads T] [--json]
//
// writing text (or the JSON object) to stdout and diagnostics to stderr; it
// returns the exit code (2: bad usage, 1: failure).
func generateMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("generate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modelPath := fs.String("model", "", "GGUF model file (default: the embedded tiny model)")
	prompt := fs.String("prompt", "The capital of France is", "prompt text")
	maxTokens := fs.Int("max-tokens", 32, "tokens to generate")
	temp := fs.Float64("temperature", 0, "sampling temperature; 0 = greedy")
	topK := fs.Int("top-k", 0, "keep the K most likely tokens (0: all)")
	topP := fs.Float64("top-p", 1, "nucleus sampling threshold (1: off)")
	seed := fs.Uint64("seed", 0, "sampling seed")
	threads := fs.Int("threads", 0, "goroutines for matrix products (0: all CPUs)")
	special := fs.Bool("special", false, "parse special-token text (e.g. <|im_start|>) in the prompt")
	asJSON := fs.Bool("json", false, "print one JSON object instead of streaming text")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() != 0 || *maxTokens < 0 {
		fmt.Fprintln(stderr, "generate: unexpected arguments or negative --max-tokens")
		fs.Usage()
		return 2
	}
	out := stdout
	if *asJSON {
		out = io.Discard
	}
	res, err := generate(context.Background(), generateOptions{
		modelPath: *modelPath, prompt: *prompt, maxTokens: *maxTokens, threads: *threads, special: *special,
		sampler: model.SamplerOptions{Temperature: float32(*temp), TopK: *topK, TopP: float32(*topP), Seed: *seed},
	}, out)
	if err != nil {
		fmt.Fprintln(stderr, "generate:", err)
		return 1
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		if err := enc.Encode(res); err != nil {
			fmt.Fprintln(stderr, "generate:", err)
			return 1
		}
		return 0
	}
	fmt.Fprintf(stdout, "\n\nprefill: %d tokens, %.1f tok/s; decode: %d tokens, %.1f tok/s\n",
		len(res.PromptTokens), res.PrefillTokS, len(res.Tokens), res.DecodeTokS)
	return 0
}

type generateOptions struct {
	modelPath string
	prompt    string
	maxTokens int
	threads   int
	special   bool
	sampler   model.SamplerOptions
}

// generate prefills the prompt in one batch, then samples and feeds back one
// token at a time until maxTokens or an end-of-generation token, streaming
// complete UTF-8 text to out.
func generate(ctx context.Context, o generateOptions, out io.Writer) (*generateResult, error) {
	var f *gguf.File
	var err error
	if o.modelPath == "" {
		data, err := modelgen.Tiny()
		if err != nil {
			return nil, err
		}
		f, err = gguf.Parse(data)
		if err != nil {
			return nil, err
		}
	} else if f, err = gguf.Open(o.modelPath); err != nil {
		return nil, err
	}
	defer f.Close()
	m, err := model.Load(f)
	if err != nil {
		return nil, err
	}
	m.SetThreads(o.threads)
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return nil, err
	}
	res := &generateResult{PromptTokens: tok.Tokenize(o.prompt, true, o.special), Tokens: []int32{}}
	if len(res.PromptTokens) == 0 {
		return nil, errors.New("the prompt encodes to no tokens")
	}
	if o.maxTokens == 0 {
		return res, nil
	}
	vocab := m.Params().Vocab
	logits := make([]float32, vocab)
	seq := m.NewSequence()
	rows := make([]model.Row, len(res.PromptTokens))
	for i, t := range res.PromptTokens {
		rows[i] = model.Row{Seq: seq, Token: t, Pos: i, Logits: i == len(rows)-1}
	}
	start := time.Now()
	if err := m.Forward(ctx, rows, logits); err != nil {
		return nil, err
	}
	res.PrefillTokS = float64(len(rows)) / time.Since(start).Seconds()

	sampler := model.NewSampler(o.sampler)
	dec := tok.NewDecoder(false)
	decodeSteps := 0
	var decodeTime time.Duration
	for {
		next := sampler.Sample(logits)
		res.Tokens = append(res.Tokens, next)
		if _, err := io.WriteString(out, dec.Add(next)); err != nil {
			return nil, err
		}
		if len(res.Tokens) >= o.maxTokens || tok.IsEOG(next) || seq.Len() >= m.Params().Context {
			break
		}
		row := []model.Row{{Seq: seq, Token: next, Pos: seq.Len(), Logits: true}}
		t0 := time.Now()
		if err := m.Forward(ctx, row, logits); err != nil {
			return nil, err
		}
		decodeTime += time.Since(t0)
		decodeSteps++
	}
	if _, err := io.WriteString(out, dec.Flush()); err != nil {
		return nil, err
	}
	res.Text = tok.Decode(res.Tokens)
	if decodeSteps > 0 {
		res.DecodeTokS = float64(decodeSteps) / decodeTime.Seconds()
	}
	return res, nil
}
