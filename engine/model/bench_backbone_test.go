package model

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/kvasir-ai/kvasir/engine/cputime"
	"github.com/kvasir-ai/kvasir/engine/gguf"
)

// backboneModel is the GGUF file of BenchmarkBackboneStep, loaded once per
// process.
var backboneModel struct {
	once sync.Once
	f    *gguf.File
	m    *Model
	err  error
}

// instantExperts is the expert.Computer of BenchmarkBackboneStep: every
// routed expert is "remote" and answers at once, without writing its
// outputs (the model's expert output buffer keeps what it holds, zeros),
// so that a step times only the backbone's own work.
type instantExperts struct{}

func (instantExperts) ComputeExperts(context.Context, int, []float32, []int32, int, int, []float32) error {
	return nil
}

// BenchmarkBackboneStep measures the backbone's own step with every routed
// expert remote (issue 24): the model of the GGUF file named by
// KVASIR_BENCH_BACKBONE (skipped when unset), typically a backbone-only file
// (`backbone genmodel --preset qwen3.5-35b-a3b --layers 40 --type Q4_K --seed
// 1 --backbone-only`), its expert Computer a stand-in that answers at once
// (instantExperts). What is timed is attention or Gated DeltaNet, the
// router and its top-k, the shared expert, norms, the output head and the
// remote branch's bookkeeping in moe: all a backbone pays per step whatever
// its workers do. scripts/bench.sh's backbone-step group runs it on the
// 35B-A3B and 122B-A10B shapes, one file per process (the memory metrics are
// the process's).
//
// Sub-benchmarks, named after the file (general.name, layers, whether it
// is backbone-only):
//
//   - remote/rows=1: one sequence decoding one token per step (a decode).
//   - remote/rows=64: 64 rows per step, one per sequence of
//     KVASIR_BENCH_BACKBONE_SEQS (default 64) sequences, 64/SEQS rows of each
//     (a serving batch; fewer sequences hold less recurrent state).
//   - local/rows=1, local/rows=64 (a full file only): the same steps with
//     the model's own experts, the local decode; expert-ms/step is the wall
//     time spent in the routed experts (Model.localExpertTime) and
//     backbone-ms/step the rest, the local decode's part that corresponds
//     to the remote step.
//
// An iteration runs KVASIR_BENCH_BACKBONE_STEPS steps (default 8 at 1 row,
// 2 at 64), after one untimed iteration from empty sequences; threads:
// KVASIR_BENCH_THREADS (default 2). Metrics per step: ms/step (wall),
// cpu-ms/step (process CPU time; steadier on a loaded machine),
// weightB/step (the backbone's weight bytes one step reads:
// backboneBytesPerStep) and GB/s (weightB/step / wall time), state-MB (the
// sequences' KV and recurrent state), allocs/step (heap allocations), and
// at the end rss-MB, anon-MB (the
// process's resident memory, and its anonymous part: heap, workspace,
// states; the rest is the mapped file) and file-MB.
func BenchmarkBackboneStep(b *testing.B) {
	path := os.Getenv("KVASIR_BENCH_BACKBONE")
	if path == "" {
		b.Skip("KVASIR_BENCH_BACKBONE not set: no backbone file to measure")
	}
	backboneModel.once.Do(func() {
		f, err := gguf.Open(path)
		if err != nil {
			backboneModel.err = err
			return
		}
		backboneModel.f = f
		backboneModel.m, backboneModel.err = Load(f)
	})
	if backboneModel.err != nil {
		b.Fatal(backboneModel.err)
	}
	f, m := backboneModel.f, backboneModel.m
	threads := envInt(b, "KVASIR_BENCH_THREADS", 2)
	seqs := envInt(b, "KVASIR_BENCH_BACKBONE_SEQS", 64)
	if seqs > 64 || 64%seqs != 0 {
		b.Fatalf("KVASIR_BENCH_BACKBONE_SEQS=%d: want a divisor of 64", seqs)
	}
	m.SetThreads(threads)
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	_, backboneOnly := f.Value(keyBackboneOnly + "version")
	label := backboneLabel(f, m.Params().Layers, backboneOnly)
	kinds := []string{"remote"}
	if !backboneOnly {
		kinds = append(kinds, "local")
	}
	for _, kind := range kinds {
		for _, rows := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/%s/rows=%d", label, kind, rows), func(b *testing.B) {
				if kind == "remote" {
					m.SetExperts(instantExperts{})
				} else {
					m.SetExperts(nil)
				}
				defer m.SetExperts(nil)
				nseq, steps := 1, envInt(b, "KVASIR_BENCH_BACKBONE_STEPS", 8)
				if rows > 1 {
					nseq, steps = seqs, envInt(b, "KVASIR_BENCH_BACKBONE_STEPS", 2)
				}
				benchSteps(b, m, rows, nseq, steps, kind == "local")
				reportMemory(b, st.Size())
			})
		}
	}
}

// benchSteps times b.N iterations of steps Forward calls of rows rows (rows
// / nseq consecutive positions of each of nseq sequences, all with logits);
// the sequences start empty before an untimed first iteration and go on
// growing (resetting a recurrent state clears it: not a step's work).
// local reports the routed experts' share.
func benchSteps(b *testing.B, m *Model, rows, nseq, steps int, local bool) {
	ctx := context.Background()
	vocab := m.Params().Vocab
	logits := make([]float32, rows*vocab)
	seqList := make([]*Sequence, nseq)
	for i := range seqList {
		seqList[i] = m.NewSequence()
	}
	batch := make([]Row, rows)
	per := rows / nseq
	run := func() {
		for step := range steps {
			for i := range batch {
				s := seqList[i/per]
				batch[i] = Row{Seq: s, Token: int32((i*131 + s.Len()*17 + step + 1) % vocab), Pos: s.Len() + i%per, Logits: true}
			}
			if err := m.Forward(ctx, batch, logits); err != nil {
				b.Fatal(err)
			}
		}
	}
	run()
	var ms0, ms1 runtime.MemStats
	runtime.ReadMemStats(&ms0)
	b.ResetTimer()
	e0, cpu0 := m.localExpertTime, cputime.Used()
	for range b.N {
		run()
	}
	b.StopTimer()
	runtime.ReadMemStats(&ms1)
	n := float64(steps * b.N)
	wall := b.Elapsed().Seconds()
	b.ReportMetric(1e3*wall/n, "ms/step")
	if cpu0 != 0 {
		b.ReportMetric(float64((cputime.Used()-cpu0).Microseconds())/1e3/n, "cpu-ms/step")
	}
	wb := m.backboneBytesPerStep(rows)
	b.ReportMetric(float64(wb), "weightB/step")
	b.ReportMetric(float64(wb)*n/wall/1e9, "GB/s")
	b.ReportMetric(float64(rows)*n/wall, "rows/s")
	if local {
		ex := (m.localExpertTime - e0).Seconds()
		b.ReportMetric(1e3*ex/n, "expert-ms/step")
		b.ReportMetric(1e3*(wall-ex)/n, "backbone-ms/step")
	}
	var state int64 // the sequences' allocated memory: KV caches and recurrent states
	for _, s := range seqList {
		for _, l := range s.mem {
			state += 4 * int64(len(l.k)+len(l.v)+len(l.conv)+len(l.ssm))
		}
	}
	b.ReportMetric(float64(state)/1e6, "state-MB")
	b.ReportMetric(float64(ms1.Mallocs-ms0.Mallocs)/n, "allocs/step")
}

// backboneBytesPerStep returns the weight bytes a step of rows rows reads
// on the backbone: every layer's matrices but the routed experts
// (Block.weights: attention or DeltaNet, router, shared expert, dense FFN),
// the output head, and one embedding row per row. (Model.BytesPerToken
// adds ExpertsUsed routed experts per layer to the 1-row figure.)
func (m *Model) backboneBytesPerStep(rows int) int64 {
	var n int64
	for i := range m.Blocks {
		for _, w := range m.Blocks[i].weights() {
			n += int64(w.Bytes())
		}
	}
	n += int64(m.Output.Bytes())
	if rb, err := m.TokenEmbd.Type.RowBytes(m.p.Embd); err == nil {
		n += int64(rows * rb)
	}
	return n
}

// reportMemory reports the process's resident memory (VmRSS and its
// RssAnon part, Linux /proc/self/status; nothing elsewhere) and the file's
// size, in MB.
func reportMemory(b *testing.B, fileSize int64) {
	b.ReportMetric(float64(fileSize)/1e6, "file-MB")
	fh, err := os.Open("/proc/self/status")
	if err != nil {
		return
	}
	defer fh.Close()
	sc := bufio.NewScanner(fh)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		unit := map[string]string{"VmRSS": "rss-MB", "RssAnon": "anon-MB"}[k]
		if !ok || unit == "" {
			continue
		}
		kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		if err == nil {
			b.ReportMetric(kb*1024/1e6, unit)
		}
	}
}

// backboneLabel names a benchmark file: general.name without "kvasir-" and
// "-shape", its layer count, and "backbone-only" or "full".
func backboneLabel(f *gguf.File, layers int, backboneOnly bool) string {
	name, _ := f.String("general.name")
	name = strings.TrimSuffix(strings.TrimPrefix(name, "kvasir-"), "-shape")
	if name == "" {
		name = f.Architecture()
	}
	kind := "full"
	if backboneOnly {
		kind = "backbone-only"
	}
	return fmt.Sprintf("%s-%dL-%s", name, layers, kind)
}

// envInt returns the positive integer in the environment variable key, or
// def when it is unset.
func envInt(b *testing.B, key string, def int) int {
	s := os.Getenv(key)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		b.Fatalf("%s=%q: want a positive integer", key, s)
	}
	return n
}
