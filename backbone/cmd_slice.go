package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/kvasir-ai/kvasir/backbone/run"
	"github.com/kvasir-ai/kvasir/engine/gguf"
	"github.com/kvasir-ai/kvasir/engine/model"
	"github.com/kvasir-ai/kvasir/engine/moeshape"
	"github.com/kvasir-ai/kvasir/engine/slice"
)

func init() {
	register("slice", "cut a worker's expert slice (or a backbone-only file) from a GGUF, or check a slice directory", func(args []string) int {
		return sliceMain(args, os.Stdout, os.Stderr)
	})
}

// sliceMain implements
//
//	backbone slice --model FILE --layers 0,1 [--experts 0-7,12] --out DIR
//	backbone slice --model FILE --backbone-only --out FILE.gguf [--hot-layers L --hot-experts E]
//	               [--source-url URL] [--chunk-size BYTES]
//	backbone slice --check DIR
//
// The first cuts the experts of the chosen layers (ranges allowed, or
// "all") into DIR (see engine/slice and docs/slices.md); the second writes
// a backbone-only GGUF (slice.WriteBackboneOnly: every tensor but the
// routed experts, plus the hot experts --hot-layers x --hot-experts, the
// full model's id and every expert's hashes and byte ranges); the third
// opens a slice directory, verifies every expert's SHA-256 and lists the
// bad ones. It returns the exit code: 2 for bad usage, 1 for a failure or
// (with --check) any bad expert.
func sliceMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("slice", flag.ContinueOnError)
	fs.SetOutput(stderr)
	modelPath := fs.String("model", "", "GGUF model file to cut from")
	layersFlag := fs.String("layers", "", `layers to cut: "0,1", "0-3,7" or "all" (required with --model)`)
	expertsFlag := fs.String("experts", "all", `experts of each layer: "0-7,12" or "all"`)
	out := fs.String("out", "", "slice directory to write (created; must be empty or hold a slice)")
	check := fs.String("check", "", "verify the slice directory DIR instead of cutting")
	backboneOnly := fs.Bool("backbone-only", false, "write a backbone-only GGUF to --out: every tensor but the routed experts (and the --hot-layers x --hot-experts ones), with the full model's id and every expert's SHA-256 and byte ranges")
	hotLayers := fs.String("hot-layers", "", `with --backbone-only: layers of the hot experts kept in the file ("0-3", "all")`)
	hotExperts := fs.String("hot-experts", "", `with --backbone-only: experts kept in each --hot-layers layer ("0,5")`)
	sourceURL := fs.String("source-url", "", "with --backbone-only: http(s) URL where the full model will be served, stored as the default --model-source")
	chunk := fs.String("chunk-size", "1MiB", "with --backbone-only: chunk size of the stored chunk hashes (workers verify downloads per chunk), 4KiB..16MiB")
	if err := fs.Parse(args); err != nil {
		return parseExit(err)
	}
	if fs.NArg() != 0 || (*check == "") == (*modelPath == "") {
		fmt.Fprintln(stderr, "slice: give either --model FILE --layers L --out DIR, or --check DIR")
		fs.Usage()
		return 2
	}
	if *check != "" {
		return sliceCheck(*check, stdout, stderr)
	}
	if *backboneOnly {
		return sliceBackboneOnly(*modelPath, *out, *hotLayers, *hotExperts, *sourceURL, *chunk, *layersFlag, stdout, stderr)
	}
	if *layersFlag == "" || *out == "" {
		fmt.Fprintln(stderr, "slice: --layers and --out are required with --model")
		return 2
	}
	f, err := gguf.Open(*modelPath)
	if err != nil {
		fmt.Fprintln(stderr, "slice:", err)
		return 1
	}
	defer f.Close()
	if err := knownArch(f); err != nil {
		fmt.Fprintf(stderr, "slice: %s: %v\n", *modelPath, err)
		return 1
	}
	sh, _ := moeshape.Read(f)
	nl, ne := sh.Layers, sh.Experts
	if nl == 0 || ne == 0 || nl > slice.MaxLayers || ne > slice.MaxExperts {
		fmt.Fprintf(stderr, "slice: %s: block_count %d, expert_count %d: not a Mixture-of-Experts model this can slice\n", *modelPath, nl, ne)
		return 1
	}
	layers, err := slice.ParseList(*layersFlag, int(nl))
	if err != nil {
		fmt.Fprintln(stderr, "slice: --layers:", err)
		return 2
	}
	experts, err := slice.ParseList(*expertsFlag, int(ne))
	if err != nil {
		fmt.Fprintln(stderr, "slice: --experts:", err)
		return 2
	}
	start := time.Now()
	m, err := slice.Cut(f, layers, experts, *out)
	if err != nil {
		fmt.Fprintln(stderr, "slice:", err)
		return 1
	}
	el := time.Since(start)
	fmt.Fprintf(stdout, "slice: %s\nslice: wrote %s in %.2f s (%.0f MB/s)\n", *out, m, el.Seconds(),
		float64(m.Bytes())/1e6/max(el.Seconds(), 1e-9))
	return 0
}

// sliceBackboneOnly is `backbone slice --backbone-only`.
func sliceBackboneOnly(modelPath, out, hotLayers, hotExperts, sourceURL, chunk, layers string, stdout, stderr io.Writer) int {
	if out == "" || layers != "" || (hotLayers == "") != (hotExperts == "") {
		fmt.Fprintln(stderr, "slice: --backbone-only needs --out FILE, takes no --layers, and --hot-layers with --hot-experts or neither")
		return 2
	}
	if sourceURL != "" && !strings.HasPrefix(sourceURL, "http://") && !strings.HasPrefix(sourceURL, "https://") {
		fmt.Fprintf(stderr, "slice: --source-url %q: want an http:// or https:// URL\n", sourceURL)
		return 2
	}
	cs, err := run.ParseBytes(chunk)
	if err != nil {
		fmt.Fprintln(stderr, "slice: --chunk-size:", err)
		return 2
	}
	if err := gguf.CheckOutPath(out); err != nil {
		fmt.Fprintln(stderr, "slice: --out:", err)
		return 2
	}
	f, err := gguf.Open(modelPath)
	if err != nil {
		fmt.Fprintln(stderr, "slice:", err)
		return 1
	}
	defer f.Close()
	if err := knownArch(f); err != nil {
		fmt.Fprintf(stderr, "slice: %s: %v\n", modelPath, err)
		return 1
	}
	sh, _ := moeshape.Read(f)
	nl, ne := sh.Layers, sh.Experts
	if nl == 0 || ne == 0 || nl > slice.MaxLayers || ne > slice.MaxExperts {
		fmt.Fprintf(stderr, "slice: %s: block_count %d, expert_count %d: not a Mixture-of-Experts model\n", modelPath, nl, ne)
		return 1
	}
	var hot [][2]int
	if hotLayers != "" {
		hl, err := slice.ParseList(hotLayers, int(nl))
		if err != nil {
			fmt.Fprintln(stderr, "slice: --hot-layers:", err)
			return 2
		}
		he, err := slice.ParseList(hotExperts, int(ne))
		if err != nil {
			fmt.Fprintln(stderr, "slice: --hot-experts:", err)
			return 2
		}
		all := func(v []int, n int) []int {
			if v != nil {
				return v
			}
			v = make([]int, n)
			for i := range v {
				v[i] = i
			}
			return v
		}
		for _, l := range all(hl, int(nl)) {
			for _, e := range all(he, int(ne)) {
				hot = append(hot, [2]int{l, e})
			}
		}
	}
	st, err := os.Stat(modelPath)
	if err != nil {
		fmt.Fprintln(stderr, "slice:", err)
		return 1
	}
	start := time.Now()
	bo, err := slice.WriteBackboneOnly(f, out, slice.BackboneOptions{Hot: hot, SourceURL: sourceURL, SourceSize: st.Size(), ChunkSize: int(cs)})
	if err != nil {
		fmt.Fprintln(stderr, "slice:", err)
		return 1
	}
	ost, err := os.Stat(out)
	if err != nil {
		fmt.Fprintln(stderr, "slice:", err)
		return 1
	}
	el := time.Since(start)
	fmt.Fprintf(stdout, "slice: %s: backbone-only file of %s (model id %s), %d bytes (full file %d; %d routed experts, %d bytes, left out, %d hot kept)\n",
		out, modelPath, bo.ModelID, ost.Size(), st.Size(), bo.NLayer*bo.NExpert-len(bo.Hot), bo.LeftOutBytes(), len(bo.Hot))
	fmt.Fprintf(stdout, "slice: hashed %d experts and wrote it in %.2f s (%.0f MB/s)\n", bo.NLayer*bo.NExpert, el.Seconds(),
		float64(st.Size())/1e6/max(el.Seconds(), 1e-9))
	return 0
}

// sliceCheck verifies the slice in dir and prints what it holds.
func sliceCheck(dir string, stdout, stderr io.Writer) int {
	start := time.Now()
	s, err := slice.Open(dir)
	if err != nil {
		fmt.Fprintln(stderr, "slice:", err)
		return 1
	}
	defer s.Close()
	el := time.Since(start)
	fmt.Fprintf(stdout, "slice: %s: model %s, %d experts verified (%d bytes) in %.2f s\n",
		dir, s.ModelID(), len(s.Holdings()), s.Bytes(), el.Seconds())
	for _, b := range s.Bad() {
		fmt.Fprintf(stdout, "slice: BAD layer %d expert %d: %v\n", b.Layer, b.Expert, b.Err)
	}
	if len(s.Bad()) > 0 {
		fmt.Fprintf(stderr, "slice: %d of %d experts are bad\n", len(s.Bad()), s.Manifest().Count())
		return 1
	}
	return 0
}

// knownArch refuses a file whose general.architecture this engine does not
// load (model.Architectures): its experts might not be the SwiGLU function
// the workers compute, so a slice of them would serve wrong outputs.
func knownArch(f *gguf.File) error {
	a := f.Architecture()
	if !slices.Contains(model.Architectures(), a) {
		return fmt.Errorf("%w: %q (this engine loads %s)", model.ErrArchitecture, a, strings.Join(model.Architectures(), ", "))
	}
	return nil
}
