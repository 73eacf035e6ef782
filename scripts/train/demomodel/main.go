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
//	go run ./scripts/train/demomodel llamaref --bin /opt/llama.cpp/build/bin --out engine/demomodel/testdata/llamacpp_ref.json
//
// The logic is engine/demomodel/train's; this file only parses flags.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
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
		fmt.Fprintln(os.Stderr, "usage: demomodel prep|export|check|llamaref [flags]")
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
	case "llamaref":
		err = llamaref(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "demomodel: unknown step %q (prep, export, check, llamaref)\n", os.Args[1])
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

// llamaref runs llama.cpp's llama-tokenize (--ids) and llama-simple (-n
// 32, greedy) from --bin on the embedded model for each of
// demomodel.Prompts, and with --dumper a small program of ours linked to
// libllama that prints each greedy step's gap and top-8 logits, and writes
// their output as the test data of engine/demomodel's
// TestLlamaCppReference. llama.cpp and the dumper are built outside the
// repository (engine/demomodel/testdata/README.md).
func llamaref(args []string) error {
	fs := flag.NewFlagSet("llamaref", flag.ExitOnError)
	bin := fs.String("bin", "", "folder of llama.cpp's llama-tokenize and llama-simple")
	model := fs.String("model", filepath.Join("engine", "demomodel", demomodel.FileName), "GGUF file")
	n := fs.Int("n", 32, "tokens to generate")
	out := fs.String("out", "", "JSON file to write")
	dumper := fs.String("dumper", "", "optional: a program linked to libllama, run as DUMPER MODEL TOK,TOK,... N, printing JSON {greedy, gaps, top} (testdata/README.md)")
	_ = fs.Parse(args)
	if *bin == "" || *out == "" {
		return fmt.Errorf("llamaref: --bin and --out are required")
	}
	type ref struct {
		Prompt   string         `json:"prompt"`
		Tokens   []int32        `json:"tokens"`
		Text     string         `json:"text"`
		Greedy   []int32        `json:"greedy"`
		Gaps     []float64      `json:"gaps"`
		Top      [][][2]float64 `json:"top"`
		Commands [][]string     `json:"commands"`
	}
	var refs []ref
	for _, p := range demomodel.Prompts {
		tc := []string{filepath.Join(*bin, "llama-tokenize"), "-m", *model, "-p", p, "--ids", "--log-disable"}
		b, err := exec.Command(tc[0], tc[1:]...).Output()
		if err != nil {
			return fmt.Errorf("%v: %w", tc, err)
		}
		var ids []int32
		if err := json.Unmarshal(bytes.TrimSpace(b), &ids); err != nil {
			return fmt.Errorf("llama-tokenize printed %q: %w", b, err)
		}
		sc := []string{filepath.Join(*bin, "llama-simple"), "-m", *model, "-n", strconv.Itoa(*n), p}
		b, err = exec.Command(sc[0], sc[1:]...).Output()
		if err != nil {
			return fmt.Errorf("%v: %w", sc, err)
		}
		text, ok := strings.CutPrefix(strings.TrimSuffix(string(b), "\n"), p)
		if !ok {
			return fmt.Errorf("llama-simple printed %q, which does not start with the prompt", b)
		}
		r := ref{Prompt: p, Tokens: ids, Text: text, Commands: [][]string{tc, sc}}
		if *dumper != "" {
			toks := make([]string, len(ids))
			for i, id := range ids {
				toks[i] = strconv.Itoa(int(id))
			}
			dc := []string{*dumper, *model, strings.Join(toks, ","), strconv.Itoa(*n)}
			b, err = exec.Command(dc[0], dc[1:]...).Output()
			if err != nil {
				return fmt.Errorf("%v: %w", dc, err)
			}
			if err := json.Unmarshal(b, &r); err != nil {
				return fmt.Errorf("%s printed %q: %w", *dumper, b, err)
			}
			r.Commands = append(r.Commands, dc)
		}
		refs = append(refs, r)
	}
	js, err := json.MarshalIndent(refs, "", " ")
	if err != nil {
		return err
	}
	return os.WriteFile(*out, append(js, '\n'), 0o644)
}
