// Command demomodel runs the Go steps of the demo model's recipe
// (docs/demo-model.md); the training between them is
// scripts/train/train_demo.py. Run by hand, never by the tests:
//
//	bible -l100000 gen1:1-rev22:21 > kjv.txt              # Debian bible-kjv + bible-kjv-text
//	go run ./scripts/train/demomodel prep --kjv kjv.txt --vocab 2048 --dir DIR
//	nice python3 scripts/train/train_demo.py --dir DIR    # writes DIR/hparams.json, weights.*
//	go run ./scripts/train/demomodel export --dir DIR --out engine/demomodel/kjv-qwen35moe.gguf
//	go run ./scripts/train/demomodel check --model engine/demomodel/kjv-qwen35moe.gguf --dir DIR --out DIR2
//	/usr/bin/python3 scripts/train/train_demo.py --eval DIR2   # DIR2/torch_ref.json -> engine/demomodel/testdata
//
// The logic is engine/demomodel/train's; this file only parses flags.
package main

import (
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/kvasir-ai/kvasir/engine/demomodel"
	"github.com/kvasir-ai/kvasir/engine/demomodel/train"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/quant"
	"github.com/kvasir-ai/kvasir/engine/slice"
	"github.com/kvasir-ai/kvasir/engine/tokenizer"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: demomodel prep|export|check [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "prep":
		err = prep(os.Args[2:])
	case "export":
		err = export(os.Args[2:])
	case "check":
		err = check(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "demomodel: unknown step %q (prep, export, check)\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "demomodel:", err)
		os.Exit(1)
	}
}

func prep(args []string) error {
	fs := flag.NewFlagSet("prep", flag.ExitOnError)
	kjv := fs.String("kjv", "", "the output of `bible -l100000 gen1:1-rev22:21`")
	vocab := fs.Int("vocab", 2048, "vocabulary size, specials included")
	dir := fs.String("dir", "", "training folder to write")
	_ = fs.Parse(args)
	if *kjv == "" || *dir == "" {
		return fmt.Errorf("prep: --kjv and --dir are required")
	}
	f, err := os.Open(*kjv)
	if err != nil {
		return err
	}
	defer f.Close()
	chs, err := train.ParseKJV(f, train.KJVVerses)
	if err != nil {
		return err
	}
	tr, ho, err := train.Split(chs, train.HeldOutBook)
	if err != nil {
		return err
	}
	start := time.Now()
	st, err := train.Prepare(tr, ho, *vocab, *dir)
	if err != nil {
		return err
	}
	fmt.Printf("%d chapters; vocabulary %d; train %d bytes = %d tokens (%.2f bytes/token); held out (%s) %d bytes = %d tokens; %.1fs\n",
		len(chs), st.Vocab, st.TrainBytes, st.TrainTokens, float64(st.TrainBytes)/float64(st.TrainTokens),
		train.HeldOutBook, st.HeldOutBytes, st.HeldOutToks, time.Since(start).Seconds())
	return nil
}

func export(args []string) error {
	fs := flag.NewFlagSet("export", flag.ExitOnError)
	dir := fs.String("dir", "", "training folder (prep's, with the training script's weights)")
	typ := fs.String("type", "Q8_0", "type of the weight matrices (a ggml type name)")
	context := fs.Int("context", 4096, "context_length: the positions the engine accepts")
	out := fs.String("out", "", "GGUF file to write")
	_ = fs.Parse(args)
	if *dir == "" || *out == "" {
		return fmt.Errorf("export: --dir and --out are required")
	}
	t, err := quant.ParseType(*typ)
	if err != nil {
		return err
	}
	data, err := train.Export(*dir, t, *context)
	if err != nil {
		return err
	}
	if err := os.WriteFile(*out, data, 0o644); err != nil {
		return err
	}
	f, err := gguf.Parse(data)
	if err != nil {
		return err
	}
	id, _ := slice.ModelID(f)
	fmt.Printf("wrote %s: %d bytes, sha256 %x, model id %s\n", *out, len(data), sha256.Sum256(data), id)
	return nil
}

// check writes the inputs of the training script's --eval: the dequantized
// tensors of --model, the hyperparameters and the prompts with their
// token ids.
func check(args []string) error {
	fs := flag.NewFlagSet("check", flag.ExitOnError)
	model := fs.String("model", "", "GGUF file (export's)")
	dir := fs.String("dir", "", "training folder (for hparams.json)")
	out := fs.String("out", "", "folder to write (weights.bin, weights.json, hparams.json, prompts.json)")
	n := fs.Int("n", 32, "tokens to generate per prompt")
	_ = fs.Parse(args)
	if *model == "" || *dir == "" || *out == "" {
		return fmt.Errorf("check: --model, --dir and --out are required")
	}
	f, err := gguf.Open(*model)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := train.Dequantize(f, *out); err != nil {
		return err
	}
	hp, err := os.ReadFile(filepath.Join(*dir, train.FileHParams))
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(*out, train.FileHParams), hp, 0o644); err != nil {
		return err
	}
	tok, err := tokenizer.FromGGUF(f)
	if err != nil {
		return err
	}
	type prompt struct {
		Prompt string  `json:"prompt"`
		Tokens []int32 `json:"tokens"`
		N      int     `json:"n"`
	}
	var ps []prompt
	for _, p := range demomodel.Prompts {
		ps = append(ps, prompt{p, tok.Encode(p, false), *n})
	}
	js, err := json.MarshalIndent(ps, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*out, "prompts.json"), js, 0o644)
}
