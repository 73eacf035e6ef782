package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/modelgen"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

func init() {
	register("genmodel", "write a qwen3moe or qwen35moe GGUF with deterministic random weights", func(args []string) int {
		return genmodelMain(args, os.Stdout, os.Stderr)
	})
}

// genmodelMain implements
//
//	backbone genmodel --preset P --layers N --type T --seed S [--fused-gate-up] [--nextn 1] [--backbone-only] --out FILE
//
// (P one of modelgen.Presets) and returns the exit code (2: bad usage, 1:
// failure). With --backbone-only it writes the backbone-only file
// (slice.WriteBackboneOnlyFrom, default options) of the model without
// writing or holding the full file: its tensors are drawn one layer of
// experts at a time (modelgen.Lazy), and the result is the same bytes as
// `backbone slice --backbone-only` of the full file genmodel writes
// without the flag.
func genmodelMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("genmodel", flag.ContinueOnError)
	fs.SetOutput(stderr)
	preset := fs.String("preset", modelgen.DefaultPreset, "model shape: "+strings.Join(modelgen.Presets, " | "))
	layers := fs.Int("layers", 0, "number of layers (0: the preset's)")
	typ := fs.String("type", "", "weight type: Q4_K, Q5_K, Q6_K, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16, F32, or Q4_K_M (mix); empty: the preset's")
	seed := fs.Uint64("seed", 1, "random seed")
	nextn := fs.Int("nextn", 0, "qwen35moe: multi-token-prediction blocks after the main layers (nextn_predict_layers, 0 or 1), as Qwen3.5's MTP head")
	fused := fs.Bool("fused-gate-up", false, "write each layer's routed experts' gate and up as one ffn_gate_up_exps tensor (same weights)")
	backboneOnly := fs.Bool("backbone-only", false, "write the model's backbone-only GGUF (no routed experts: what backbone slice --backbone-only makes of the full file) without writing or holding the full file")
	out := fs.String("out", "", "output GGUF file (required)")
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	if *out == "" || fs.NArg() != 0 {
		fmt.Fprintln(stderr, "genmodel: --out FILE is required and no positional arguments are accepted")
		fs.Usage()
		return 2
	}
	if err := gguf.CheckOutPath(*out); err != nil {
		fmt.Fprintln(stderr, "genmodel: --out:", err)
		return 2
	}
	s, err := modelgen.Preset(*preset)
	if err != nil {
		fmt.Fprintln(stderr, "genmodel:", err)
		return 2
	}
	switch {
	case *layers < 0 || *layers > modelgen.MaxLayers:
		fmt.Fprintf(stderr, "genmodel: --layers %d: want 1..%d (0: the preset's)\n", *layers, modelgen.MaxLayers)
		return 2
	case *layers > 0:
		s.Layers = *layers
	}
	if *typ != "" {
		if s.Type, s.Mix, err = modelgen.ParseType(*typ); err != nil {
			fmt.Fprintln(stderr, "genmodel:", err)
			return 2
		}
	}
	s.Seed = *seed
	s.FusedGateUp = *fused
	s.NextN = *nextn
	start := time.Now()
	if *backboneOnly {
		return genBackboneOnly(s, *out, start, stdout, stderr)
	}
	w, err := modelgen.Build(s)
	if err != nil {
		fmt.Fprintln(stderr, "genmodel:", err)
		return 1
	}
	if err := w.WriteFile(*out); err != nil {
		fmt.Fprintln(stderr, "genmodel:", err)
		return 1
	}
	st, err := os.Stat(*out)
	if err != nil {
		fmt.Fprintln(stderr, "genmodel:", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s (%d bytes) in %.2fs: %s\n", *out, st.Size(), time.Since(start).Seconds(), modelgen.Describe(s))
	return 0
}

// genBackboneOnly writes the backbone-only file of the model s to out
// (genmodel --backbone-only) and returns the exit code.
func genBackboneOnly(s modelgen.Spec, out string, start time.Time, stdout, stderr io.Writer) int {
	l, err := modelgen.NewLazy(s)
	if err != nil {
		fmt.Fprintln(stderr, "genmodel:", err)
		return 1
	}
	bo, err := slice.WriteBackboneOnlyFrom(l.File, l.Tensor, out, slice.BackboneOptions{SourceSize: l.Size})
	if err != nil {
		fmt.Fprintln(stderr, "genmodel:", err)
		return 1
	}
	st, err := os.Stat(out)
	if err != nil {
		fmt.Fprintln(stderr, "genmodel:", err)
		return 1
	}
	fmt.Fprintf(stdout, "wrote %s (%d bytes) in %.2fs: backbone-only file of %s (full file %d bytes, model id %s; %d routed experts, %d bytes, left out)\n",
		out, st.Size(), time.Since(start).Seconds(), modelgen.Describe(s), l.Size, bo.ModelID, bo.NLayer*bo.NExpert, bo.Bytes())
	return 0
}
