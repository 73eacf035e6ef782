#!/usr/bin/env bash
# Runs kvasir's benchmarks (every `func Benchmark` of the engine and the
# backbone), appends their raw output to docs/bench-raw.txt and regenerates
# docs/BENCHMARKS.md from it: one table per benchmark with the command that
# produced it, and the ratios computed from numbers of this same run
# (kernel GB/s over the measured memory bandwidth, decode tok/s x weight
# bytes per token over it, swarm over local tok/s, batching gains).
#
#   bash scripts/bench.sh               # ~25 min on a 2-core machine (estimate; +~7 min the first time: the models)
#   KVASIR_BENCH_QUICK=1 bash scripts/bench.sh   # each benchmark once: checks the script, numbers meaningless
#   KVASIR_BENCH_DOC_ONLY=1 bash scripts/bench.sh  # only regenerate the doc from docs/bench-raw.txt
#   KVASIR_BENCH_RAW=F KVASIR_BENCH_DOC=F KVASIR_BENCH_COMMIT=ID  # other output files; the commit to record
#   KVASIR_BENCH_CACHE=DIR   # where the generated real-size models are written once (default ~/.cache/kvasir-bench)
#   KVASIR_BENCH_REAL_REPS=N # alternating rounds of the side-by-side groups (default 2; 0 skips them)
#   KVASIR_BENCH_LAYERS_Q30=N KVASIR_BENCH_LAYERS_Q35=N  # their depths (default 32 of the 30B shape's 48
#                            # layers, 11.3 GB; 20 of the 35B shape's 40, ~9.5 GB: each fits in the page
#                            # cache of a 23 GiB machine with room to spare)
#   KVASIR_BENCH_BIG_LAYERS=N KVASIR_BENCH_BIG_REPS=N  # the larger-than-the-page-cache file (default the
#                            # 48-layer 30B shape, 16.9 GB) and its alternating rounds (default 2; 0 skips)
#   KVASIR_BENCH_DROP=auto|file|none  # before each of those rounds: auto drops the whole page cache when
#                            # /proc/sys/vm/drop_caches is writable (root), else evicts the file's own
#                            # pages (dd iflag=nocache); file always does the latter (a shared machine)
#   KVASIR_BENCH_GROUPS="expert real-q30 llama-q30"  # rerun only these groups: their old blocks
#                            # leave the raw file, the new ones are appended (the header notes it)
#   KVASIR_BENCH_GROUPS=backbone-step  # optional group, never in a full run: the backbone's own step with every
#                            # routed expert remote (BenchmarkBackboneStep) on backbone-only files of the 35B-A3B (40
#                            # layers) and 122B-A10B (48) shapes and on an 8-layer 35B-shape full file (local decode
#                            # split into routed experts and the rest) and its slice; writes those files once to the
#                            # cache folder (genmodel --backbone-only: ~0.9 + 2.9 GB, plus 4.4 + 0.2 GB; ~15 min on
#                            # 2 cores), then runs ~2-5 min; 64-row steps of 64 sequences hold 4.4 GB (35B) and 9.7 GB
#                            # (122B) of recurrent state: KVASIR_BENCH_BACKBONE_SEQS=16 divides that by 4
#   LLAMA_BENCH=PATH         # a llama-bench binary (llama.cpp, built outside this repo; default: llama-bench
#                            # on PATH): measured in the same rounds, alternating with kvasir, on the same
#                            # file and 2 threads. Without one the doc says llama.cpp was not measured.
#   LLAMA_BENCH_COMMIT=ID LLAMA_BENCH_NOTE=TEXT  # its source commit (when its build does not know it)
#                            # and how it was built, for the doc
#
# Groups against llama.cpp: real-q30/llama-q30 and real-q35/llama-q35 (tg32 and pp512 of both shapes,
# BenchmarkRealModel vs llama-bench, each file read into the page cache before each engine's round),
# big-kvasir/big-llama (decode of the 16.9 GB file, the page cache dropped before each engine's round:
# `backbone generate --json` vs `llama-bench -p 0 -n 32`). On a 2-core machine the side-by-side groups
# take ~4-5 min per shape and the big file ~3 min (estimates; each table gives the seconds it took), plus,
# the first time only, ~2-3 min per file to write the models (38 GB of disk in the cache folder; genmodel
# holds a model in memory while writing it: ~17 GB of RAM for the 48-layer one).
#
# The machine's load matters (shared CI boxes): the load average before and
# after each group is recorded and shown in the doc.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

RAW=${KVASIR_BENCH_RAW:-docs/bench-raw.txt}
DOC=${KVASIR_BENCH_DOC:-docs/BENCHMARKS.md}
QUICK=${KVASIR_BENCH_QUICK:-0}
GO=${GO:-go}
CACHE=${KVASIR_BENCH_CACHE:-$HOME/.cache/kvasir-bench}
REPS=${KVASIR_BENCH_REAL_REPS:-2}
[ "$QUICK" = 1 ] && [ "$REPS" -gt 1 ] 2>/dev/null && REPS=1
LLAMA_BENCH=${LLAMA_BENCH:-$(command -v llama-bench 2>/dev/null)}
TMPD=$(mktemp -d "${TMPDIR:-/tmp}/kvasir-bench.XXXXXX") || exit 1
trap 'rm -rf "$TMPD"' EXIT
BACKBONE=$TMPD/backbone

load() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || uptime | sed 's/.*load average[s]*: //'; }

# cpu_id: the CPU as lscpu names it and whether it has AVX-512 (the avx512f
# flag), for the tables of the side-by-side groups.
cpu_id() {
  local name avx=no
  name=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -n1)
  [ -n "$name" ] || name=$(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//')
  grep -qw avx512f /proc/cpuinfo 2>/dev/null && avx=yes
  echo "${name:-unknown} x $(nproc 2>/dev/null || echo '?'), AVX-512 (avx512f): $avx"
}

# meminfo: MemTotal, MemAvailable and Cached of /proc/meminfo in GB (1e9 bytes).
meminfo() {
  awk '/^(MemTotal|MemAvailable|Cached):/ { printf "%s%s %.1f GB", sep, $1, $2 * 1024 / 1e9; sep = ", " }' /proc/meminfo 2>/dev/null
}

# cached FILE: bytes of FILE in the page cache (fincore, util-linux), or "?".
cached() { fincore -b -n -o RES "$1" 2>/dev/null | tr -d ' ' | grep -E '^[0-9]+$' || echo '?'; }

# fsize FILE: its size in bytes.
fsize() { stat -c %s "$1" 2>/dev/null || wc -c <"$1"; }

# timed OUT CMD...: runs CMD; writes "SECONDS MAXRSS_KB" to OUT (wall time;
# peak resident set size from GNU time, "?" without it); CMD's exit status.
timed() {
  local out=$1 t0=$EPOCHREALTIME rc
  shift
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f 'timed: %e %M' -o "$out.t" "$@"
    rc=$?
    sed -n 's/^timed: //p' "$out.t" | tail -n1 >"$out"
  else
    "$@"
    rc=$?
    echo "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }') ?" >"$out"
  fi
  return "$rc"
}

# drop_cache FILE: empties the page cache before a larger-than-the-page-cache
# round and says how: all of it when this user may (root: echo 3 >
# /proc/sys/vm/drop_caches), else FILE's own pages (dd iflag=nocache:
# posix_fadvise DONTNEED, which any reader may ask). KVASIR_BENCH_DROP=file
# asks for the second on a shared machine, none for neither.
drop_cache() {
  local how=${KVASIR_BENCH_DROP:-auto}
  sync
  if [ "$how" = auto ] && [ -w /proc/sys/vm/drop_caches ] && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
    echo "dropped before the round (echo 3 > /proc/sys/vm/drop_caches)"
  elif [ "$how" != none ] && dd if="$1" iflag=nocache count=0 status=none 2>/dev/null; then
    echo "not dropped (/proc/sys/vm/drop_caches not writable$([ "$how" = file ] && echo ' or KVASIR_BENCH_DROP=file')): only the file's own pages evicted (dd iflag=nocache)"
  else
    echo "not dropped (KVASIR_BENCH_DROP=$how, or neither drop_caches nor dd iflag=nocache worked): the file may be partly cached"
  fi
}

# block_begin GROUP COMMAND / block_end GROUP RC: the lines around one
# measurement in the raw file (group, command, load and CPU, seconds taken).
block_begin() {
  BLOCK_T0=$EPOCHREALTIME
  {
    echo "### group: $1"
    echo "### command: $2"
    echo "### load-before: $(load)"
    echo "### cpu-id: $(cpu_id)"
  } >>"$RAW"
  echo "bench.sh: $1 ($2)" >&2
}
block_end() {
  {
    [ "$2" = 0 ] || echo "### FAILED: $1 (exit $2)"
    echo "### seconds: $(awk -v a="$BLOCK_T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')"
    echo "### load-after: $(load)"
  } >>"$RAW"
}

# llama_run GROUP MODEL NOTE LLAMA-BENCH-ARGS...: one llama-bench run (2
# threads, -r 2, CSV) on MODEL (NOTE, when not empty: a "### page-cache:"
# line for the block), its results written to the raw file as benchmark lines
# LlamaCpp/tg32 and LlamaCpp/pp512 (tok/s), so that the doc treats them like
# Go's, and LlamaCpp/process: the whole run's wall seconds and peak RSS (load
# and weight repacking included) and, from its -v log, the model's load time
# and its buffers (weights used from the mapping, weights repacked into its
# own memory).
llama_run() {
  local group=$1 model=$2 note=$3
  shift 3
  want "$group" || return 0
  local args=(-m "$model" -t 2 "$@" -r 2 -o csv -v)
  block_begin "$group" "$LLAMA_BENCH ${args[*]}"
  {
    [ -n "$note" ] && echo "### page-cache: $note"
    echo "### file-cached-before: $(cached "$model") of $(fsize "$model") bytes; $(meminfo)"
    [ -n "${LLAMA_BENCH_COMMIT:-}" ] && echo "### llama-bench-commit: $LLAMA_BENCH_COMMIT"
    [ -n "${LLAMA_BENCH_NOTE:-}" ] && echo "### llama-bench-note: $LLAMA_BENCH_NOTE"
  } >>"$RAW"
  local out rc
  timed "$TMPD/llama.time" "$LLAMA_BENCH" "${args[@]}" >"$TMPD/llama.csv" 2>"$TMPD/llama.err"
  rc=$?
  out=$(cat "$TMPD/llama.csv")
  printf '%s\n' "$out" | sed 's/^/# /' >>"$RAW"
  [ "$rc" = 0 ] || tail -n 5 "$TMPD/llama.err" | sed 's/^/# stderr: /' >>"$RAW"
  {
    printf '%s\n' "$out" | awk -F, '
      NR == 1 { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); col[h] = i }; next }
      { p = $col["n_prompt"]; g = $col["n_gen"]; ts = $col["avg_ts"]; bc = $col["build_commit"]
        gsub(/"/, "", p); gsub(/"/, "", g); gsub(/"/, "", ts); gsub(/"/, "", bc)
        if (bc != "" && bc != "unknown") print "### llama-bench-commit: " bc
        if (p + 0 > 0 && g + 0 == 0) printf "BenchmarkLlamaCpp/pp%d-2 \t 1 \t %s tok/s\n", p, ts
        if (g + 0 > 0 && p + 0 == 0) printf "BenchmarkLlamaCpp/tg%d-2 \t 1 \t %s tok/s\n", g, ts }'
    read -r secs kb <"$TMPD/llama.time"
    # -v log: "load_tensors: CPU_Mapped model buffer size = 347.42 MiB", "... CPU_REPACK ...", "llama_perf_context_print: load time = 6843.72 ms"
    [ "$rc" = 0 ] && awk -v secs="$secs" -v kb="$kb" '
      /model buffer size =/ && /CPU_Mapped/ && !m { m = 1; mapped = $(NF - 1) * 1048576 / 1e9 }
      /model buffer size =/ && /CPU_REPACK/ && !r { r = 1; repack = $(NF - 1) * 1048576 / 1e9 }
      /load time =/ && !l { l = 1; for (i = 1; i <= NF; i++) if ($i == "=") load = $(i + 1) / 1000 }
      END { printf "BenchmarkLlamaCpp/process-2 \t 1 \t %s wall_s", secs
        if (kb != "?") printf " \t %.2f peakRSS_GB", kb * 1024 / 1e9
        if (l) printf " \t %.2f load_s", load
        if (m) printf " \t %.2f mapped_GB", mapped
        if (r) printf " \t %.2f repacked_GB", repack
        printf "\n" }' "$TMPD/llama.err"
  } | tee -a "$RAW" >&2
  echo "### file-cached-after: $(cached "$model") of $(fsize "$model") bytes; $(meminfo)" >>"$RAW"
  block_end "$group" "$rc"
}

# model_file PRESET LAYERS: prints the path of the Q4_K file of that shape and
# depth in the cache folder (seed 1), writing it with backbone genmodel the
# first time (about 9 s and 0.35 GB of RAM and disk per layer of the 30B
# shape); fails in quick mode when it is not there yet.
model_file() {
  local model=$CACHE/$1-$2L-Q4_K-s1.gguf
  if [ ! -s "$model" ]; then
    if [ "$QUICK" = 1 ]; then
      echo "bench.sh: quick mode: $model not written, its runs skipped" >&2
      return 1
    fi
    mkdir -p "$CACHE" || return 1
    echo "bench.sh: writing $model once" >&2
    backbone_bin || return 1
    if ! "$BACKBONE" genmodel --preset "$1" --layers "$2" --type Q4_K --seed 1 --out "$model.part" >&2 ||
      ! mv "$model.part" "$model"; then
      rm -f "$model.part"
      echo "bench.sh: genmodel failed" >&2
      return 1
    fi
  fi
  echo "$model"
}

# backbone_bin: builds the backbone command once into the scratch folder
# ($BACKBONE), so that no round times the Go compiler.
backbone_bin() {
  [ -x "$BACKBONE" ] && return 0
  "$GO" build -o "$BACKBONE" ./backbone || { echo "bench.sh: go build ./backbone failed" >&2; return 1; }
}

# side_by_side TAG PRESET LAYERS: decode (tg32) and prefill (pp512) of a
# LAYERS-deep file of the PRESET shape on 2 threads, kvasir's
# BenchmarkRealModel (group real-TAG) and, with llama-bench, llama.cpp's on
# the same file (group llama-TAG), alternating, the file read into the page
# cache before each engine's round.
side_by_side() {
  local tag=$1 preset=$2 layers=$3 model
  want "real-$tag" || { want "llama-$tag" && [ -n "$LLAMA_BENCH" ]; } || return 0
  [ "$REPS" -gt 0 ] 2>/dev/null || return 0
  model=$(model_file "$preset" "$layers") || return 0
  for _ in $(seq "$REPS"); do
    if want "real-$tag"; then
      cat "$model" >/dev/null # into the page cache (llama-bench's repacked copy may have pushed it out)
      local before
      before="### file-cached-before: $(cached "$model") of $(fsize "$model") bytes; $(meminfo)"
      local t0=$EPOCHREALTIME
      run "real-$tag" ./engine/model 'BenchmarkRealModel' 4x 1 KVASIR_BENCH_MODEL="$model" KVASIR_BENCH_THREADS=2
      {
        echo "$before"
        echo "### cpu-id: $(cpu_id)"
        echo "### seconds: $(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", b - a }')"
      } >>"$RAW"
    fi
    if [ -n "$LLAMA_BENCH" ] && want "llama-$tag"; then
      cat "$model" >/dev/null
      llama_run "llama-$tag" "$model" "" -p 512 -n 32
    fi
  done
}

# big_file: decode of a file larger than the page cache but smaller than RAM
# (the 48-layer 30B shape, 16.9 GB; KVASIR_BENCH_BIG_LAYERS), the page cache
# dropped before each engine's round: kvasir's backbone generate (--resident
# auto: it locks the weights when they fit in available memory) in group
# big-kvasir, llama-bench -p 0 -n 32 in group big-llama, alternating.
big_file() {
  want big-kvasir || { want big-llama && [ -n "$LLAMA_BENCH" ]; } || return 0
  local reps=${KVASIR_BENCH_BIG_REPS:-2} model
  [ "$reps" -gt 0 ] 2>/dev/null || return 0
  [ "$QUICK" = 1 ] && reps=1
  model=$(model_file qwen3-30b-a3b "${KVASIR_BENCH_BIG_LAYERS:-48}") || return 0
  for _ in $(seq "$reps"); do
    if want big-kvasir && backbone_bin; then
      local drop rc
      drop=$(drop_cache "$model")
      block_begin big-kvasir "backbone generate --model $model --max-tokens 32 --threads 2 --json"
      {
        echo "### page-cache: $drop"
        echo "### file-cached-before: $(cached "$model") of $(fsize "$model") bytes; $(meminfo)"
      } >>"$RAW"
      timed "$TMPD/gen.time" "$BACKBONE" generate --model "$model" --max-tokens 32 --threads 2 --json >"$TMPD/gen.json" 2>"$TMPD/gen.err"
      rc=$?
      sed 's/^/# /' "$TMPD/gen.json" >>"$RAW"
      tail -n 5 "$TMPD/gen.err" | sed 's/^/# stderr: /' >>"$RAW"
      if [ "$rc" = 0 ]; then
        local secs kb
        read -r secs kb <"$TMPD/gen.time"
        sed -n 's/.*"resident":{"mode":"\([a-z]*\)".*/### resident-mode: \1/p' "$TMPD/gen.json" >>"$RAW"
        # generate --json: decode_tok_s, tokens (ids), peak_rss_bytes, resident.bytes (backbone/cmd_generate.go).
        awk -v secs="$secs" '
          function field(re,    s) { if (!match($0, re)) return ""; s = substr($0, RSTART, RLENGTH); sub(/.*:/, "", s); return s }
          { tps = field("\"decode_tok_s\":[-0-9.eE+]+"); rss = field("\"peak_rss_bytes\":[0-9]+")
            res = field("\"resident\":\\{\"mode\":\"[a-z]*\",\"bytes\":[0-9]+")
            n = 0; if (match($0, /"tokens":\[[^]]*\]/)) n = split(substr($0, RSTART + 10, RLENGTH - 11), t, ",")
            if (tps == "") next
            printf "BenchmarkGenerate/decode-2 \t 1 \t %s tok/s \t %d tokens \t %.2f peakRSS_GB \t %.2f resident_GB \t %s wall_s\n", tps, n, rss / 1e9, res / 1e9, secs }' "$TMPD/gen.json" | tee -a "$RAW" >&2
      fi
      echo "### file-cached-after: $(cached "$model") of $(fsize "$model") bytes; $(meminfo)" >>"$RAW"
      block_end big-kvasir "$rc"
    fi
    if [ -n "$LLAMA_BENCH" ] && want big-llama; then
      llama_run big-llama "$model" "$(drop_cache "$model")" -p 0 -n 32
    fi
  done
}

# backbone_step: BenchmarkBackboneStep (engine/model) on the files it writes
# once to the cache folder, one process per file (its memory metrics are the
# process's): the backbone-only files of the 35B-A3B (40 layers) and
# 122B-A10B (48 layers) shapes written directly (genmodel --backbone-only,
# no full file), an 8-layer 35B-shape full file (local decode: routed
# experts vs the rest) and its backbone-only slice. Only when
# KVASIR_BENCH_GROUPS names backbone-step.
backbone_step() {
  [[ " $GROUPS_ONLY " == *" backbone-step "* ]] || return 0
  local cache=${KVASIR_BENCH_CACHE:-$HOME/.cache/kvasir-bench} GROUPS_ONLY=""
  mkdir -p "$cache" || return 0
  local bo35=$cache/qwen3.5-35b-a3b-40L-Q4_K-s1-backbone.gguf bo122=$cache/qwen3.5-122b-a10b-48L-Q4_K-s1-backbone.gguf
  local full8=$cache/qwen3.5-35b-a3b-8L-Q4_K-s1.gguf bo8=$cache/qwen3.5-35b-a3b-8L-Q4_K-s1-backbone.gguf
  gen() { # gen FILE GENMODEL-ARGS...: write FILE once
    local f=$1; shift
    [ -s "$f" ] && return 0
    echo "bench.sh: writing $f once" >&2
    "$GO" run ./backbone genmodel "$@" --type Q4_K --seed 1 --out "$f.part" >&2 && mv "$f.part" "$f" ||
      { rm -f "$f.part"; echo "bench.sh: genmodel failed" >&2; return 1; }
  }
  gen "$bo35" --preset qwen3.5-35b-a3b --layers 40 --backbone-only || return 0
  gen "$bo122" --preset qwen3.5-122b-a10b --layers 48 --backbone-only || return 0
  gen "$full8" --preset qwen3.5-35b-a3b --layers 8 || return 0
  if [ ! -s "$bo8" ]; then
    "$GO" run ./backbone slice --model "$full8" --backbone-only --out "$bo8.part" >&2 && mv "$bo8.part" "$bo8" || return 0
  fi
  local seqs=${KVASIR_BENCH_BACKBONE_SEQS:-64} t=1x
  for x in "35b:$bo35" "122b:$bo122" "35b-8l:$full8" "35b-8l-bo:$bo8"; do
    cat "${x#*:}" >/dev/null # into the page cache
    run "backbone-step-${x%%:*}" ./engine/model 'BenchmarkBackboneStep' $t 1 KVASIR_BENCH_BACKBONE="${x#*:}" \
      KVASIR_BENCH_THREADS=2 KVASIR_BENCH_BACKBONE_SEQS="$seqs"
  done
}

# run LABEL PKG REGEX BENCHTIME [COUNT] [ENV=VALUE...]; with COUNT > 1 the
# doc shows the median of the COUNT results of each benchmark.
# want GROUP: whether this run measures GROUP (KVASIR_BENCH_GROUPS, default all).
want() { [ -z "$GROUPS_ONLY" ] || [[ " $GROUPS_ONLY " == *" $1 "* ]]; }

run() {
  local label=$1 pkg=$2 re=$3 t=$4 count=1
  want "$label" || return 0
  shift 4
  case "${1:-}" in [0-9]*) count=$1; shift ;; esac
  [ "$QUICK" = 1 ] && t=1x && count=1
  local cmd="go test -run '^\$' -bench '$re' -benchtime $t -count $count $pkg"
  [ $# -gt 0 ] && cmd="$* $cmd"
  {
    echo "### group: $label"
    echo "### command: $cmd"
    echo "### load-before: $(load)"
  } >>"$RAW"
  echo "bench.sh: $label ($cmd)" >&2
  env "$@" "$GO" test -run '^$' -bench "$re" -benchtime "$t" -count "$count" -timeout 30m "$pkg" 2>&1 | tee -a "$RAW" >&2
  local rc=${PIPESTATUS[0]}
  {
    [ "$rc" = 0 ] || echo "### FAILED: $label (exit $rc)"
    echo "### load-after: $(load)"
  } >>"$RAW"
}

GROUPS_ONLY=$(echo "${KVASIR_BENCH_GROUPS:-}" | tr ',' ' ')
# backbone-step stands for the groups backbone_step records.
[[ " $GROUPS_ONLY " == *" backbone-step "* ]] &&
  GROUPS_ONLY="$GROUPS_ONLY backbone-step-35b backbone-step-122b backbone-step-35b-8l backbone-step-35b-8l-bo"
commit_now() {
  if [ -n "${KVASIR_BENCH_COMMIT:-}" ]; then
    echo "$KVASIR_BENCH_COMMIT"
  else
    echo "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')"
  fi
}

if [ "${KVASIR_BENCH_DOC_ONLY:-0}" != 1 ]; then
  command -v "$GO" >/dev/null || { echo "bench.sh: Go is not installed" >&2; exit 1; }
  mkdir -p "$(dirname "$RAW")"
fi
if [ "${KVASIR_BENCH_DOC_ONLY:-0}" != 1 ] && [ -n "$GROUPS_ONLY" ] && [ -s "$RAW" ]; then
  # Partial rerun: drop the old blocks of the groups measured again.
  awk -v groups=" $GROUPS_ONLY " '
    /^### group: / { g = $0; sub(/^### group: /, "", g); skip = index(groups, " " g " ") > 0 }
    /^### (end|rerun): / { skip = 0 }
    !skip' "$RAW" >"$RAW.tmp" && mv "$RAW.tmp" "$RAW"
  echo "### rerun: $(date -u '+%Y-%m-%d %H:%M UTC') at $(commit_now) on $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//') x $(nproc 2>/dev/null || echo '?'): $GROUPS_ONLY" >>"$RAW"
elif [ "${KVASIR_BENCH_DOC_ONLY:-0}" != 1 ]; then
  GROUPS_ONLY=""
  {
    echo "### kvasir benchmarks, raw output of scripts/bench.sh"
    echo "### date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "### commit: $(commit_now)"
    echo "### go: $("$GO" version)"
    echo "### cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//') x $(nproc 2>/dev/null || echo '?')"
    echo "### quick: $QUICK"
  } >"$RAW"
fi
if [ "${KVASIR_BENCH_DOC_ONLY:-0}" != 1 ]; then

  run membw ./engine/quant 'BenchmarkMemBandwidth' 1s
  run matvec ./engine/quant 'BenchmarkMatVec' 300ms
  run vecdot ./engine/quant 'BenchmarkVecDot' 300ms
  run kernel ./engine/quant 'BenchmarkKernel' 300ms
  run stream ./engine/quant 'BenchmarkStream' 5x
  run model-membw ./engine/model 'BenchmarkMemoryBandwidth' 1s
  run model-fixture ./engine/model 'BenchmarkFixtureQ4KM' 2s
  run model-q30 ./engine/model 'BenchmarkQwen3_30B_A3B_4L' 2s
  run model-q35 ./engine/model 'BenchmarkQwen35_35B_A3B_4L|BenchmarkFixtureQwen35Q4KM' 2s
  run expert ./engine/expert 'BenchmarkLocalQwen3_30B' 2s
  run vulkan ./engine/vulkan 'BenchmarkDeviceBandwidth|BenchmarkExperts$|BenchmarkExpertsBatch' 1x
  side_by_side q30 qwen3-30b-a3b "${KVASIR_BENCH_LAYERS_Q30:-32}"
  side_by_side q35 qwen3.5-35b-a3b "${KVASIR_BENCH_LAYERS_Q35:-20}"
  big_file
  backbone_step
  run dispatch-rtt ./backbone/dispatch 'BenchmarkDispatchRTT13ms' 2s
  run dispatch-quorum ./backbone/dispatch 'BenchmarkQuorumRTT13ms' 2s 3
  run dispatch-decode ./backbone/dispatch 'BenchmarkFixtureDecode' 2s
  run swarm-decode ./backbone 'BenchmarkSwarmDecode13ms' 1s 3 KVASIR_BENCH_Q30=1
  # The same at depth, on the side-by-side groups' files (skipped without them): 400 steps each, in
  # alternating blocks; the 13 ms pause alone (idle, idle-spin) is the host's floor under the remote rows.
  run swarm-decode-deep ./backbone 'BenchmarkSwarmDecode13ms/(qwen3-30b-shape-32L|qwen3.5-35b-shape-20L)/(local|layer0-idle-13ms|layer0-idle-13ms-spin|layer0-echo-13ms-spin|layer0-remote-gateway-process|layer0-remote-processes)$' 400x 1 \
    KVASIR_BENCH_DEEP_Q30="$CACHE/qwen3-30b-a3b-${KVASIR_BENCH_LAYERS_Q30:-32}L-Q4_K-s1.gguf" \
    KVASIR_BENCH_DEEP_Q35="$CACHE/qwen3.5-35b-a3b-${KVASIR_BENCH_LAYERS_Q35:-20}L-Q4_K-s1.gguf"
  run gateway ./backbone/gateway 'BenchmarkSplice|BenchmarkRoundTrip' 500ms 3
  run serve-batching ./backbone/serve 'BenchmarkSwarmBatching' 2x
  run serve-real ./backbone/serve 'BenchmarkRealSwarm' 2x
  run ledger ./backbone/ledger 'BenchmarkAppend' 1s
  run credit ./backbone/credit 'BenchmarkCredit' 1s
  run gguf ./engine/gguf 'BenchmarkOpen' 1s
  run tokenizer ./engine/tokenizer 'BenchmarkEncode|BenchmarkDecoder' 1s
  [ -z "$GROUPS_ONLY" ] && echo "### end: $(date -u '+%Y-%m-%d %H:%M UTC'), load $(load)" >>"$RAW"
fi

# ---- docs/BENCHMARKS.md from the raw output ---------------------------------
awk -v raw="$RAW" '
function trim(s) { sub(/^[ \t]+/, "", s); sub(/[ \t]+$/, "", s); return s }
function num(name, unit) { return ((name, unit) in val) ? val[name, unit] + 0 : -1 }
function has(name, unit) { return ((name, unit) in val) }
function f(x, d) { if (x < 0) return "n/a"; return sprintf("%." d "f", x) }
function pct(x) { if (x < 0) return "n/a"; return sprintf("%.1f %%", 100 * x) }
function ratio(a, b) { return (a < 0 || b <= 0) ? -1 : a / b }
# rval(name, unit, r): the result of round r of a side-by-side group (-1: none).
function rval(name, unit, r) { return ((name, unit, r) in rv) ? rv[name, unit, r] + 0 : -1 }
# goal(x, g): whether x reaches the goal g.
# wgbs(t, wb): decode weight GB/s, tok/s x weight bytes per token (-1: either unknown).
function wgbs(t, wb) { return (t < 0 || wb < 0) ? -1 : t * wb / 1e9 }
function goal(x, g) { return (x < 0) ? "n/a" : (x >= g ? "yes" : "**no**") }
# memv(line, key): the GB figure of key (MemTotal, MemAvailable, Cached) in a file-cached line (-1: none).
function memv(s, key,    t) { if (!match(s, key ": [0-9.]+")) return -1; t = substr(s, RSTART, RLENGTH); sub(/.*: /, "", t); return t + 0 }
# incache(line): "C of F GB" from a file-cached line ("CACHED of SIZE bytes; ..."): the bytes of the file in the page cache.
function incache(s,    a) { split(s, a, " "); return (a[1] ~ /^[0-9]+$/ && a[3] + 0 > 0) ? sprintf("%.1f of %.1f GB", a[1] / 1e9, a[3] / 1e9) : "?" }
# fileGB(g): the size in GB of the file group g measured (-1: unknown).
function fileGB(g,    a) { if (!((g, 1, "before") in meta)) return -1; split(meta[g, 1, "before"], a, " "); return a[3] / 1e9 }
# dropped(g): how the page cache was emptied before the first round of group g, in a few words.
function dropped(g,    d) {
  d = meta[g, 1, "page-cache"]
  return (d ~ /^dropped/) ? "page cache dropped first" : (d ~ /file.s own pages evicted/) ? "its own pages evicted first" : "page cache not dropped"
}
# depth(g): "N layers" from the model file name in the command of group g.
function depth(g,    t) { if (!(g in cmd) || !match(cmd[g], /-[0-9]+L-Q4_K/)) return "?"; t = substr(cmd[g], RSTART + 1, RLENGTH - 1); sub(/L-.*/, "", t); return t }
# span(name, unit, d): "min - max" of the repeated results (one value: it alone).
function span(name, unit, d,    k, lo, hi, x) {
  if (!((name, unit) in nv)) return "n/a"
  lo = hi = vals[name, unit, 1] + 0
  for (k = 2; k <= nv[name, unit]; k++) { x = vals[name, unit, k] + 0; if (x < lo) lo = x; if (x > hi) hi = x }
  return (lo == hi) ? f(lo, d) : f(lo, d) " - " f(hi, d)
}
# table(group): every benchmark of the group, one column per metric.
function table(g,    i, j, n, u, nu, units, seen, line) {
  if (!(g in cmd)) { print "_not run_\n"; return }
  print "`" cmd[g] "`" (failed[g] ? " — **FAILED** (see docs/bench-raw.txt)" : "") (cmd[g] ~ /-count [2-9]/ ? " (medians)" : "") "  "
  print "load average before/after: " lb[g] " / " la[g] ((g in secs) ? "; " nsec[g] " round(s), " secs[g] " s in all" : "") "\n"
  nu = 0
  for (i = 1; i <= nb; i++) if (grp[i] == g) {
    n = split(units_of[names[i]], units, " ")
    for (j = 1; j <= n; j++) if (!(units[j] in seen)) { seen[units[j]] = 1; u[++nu] = units[j] }
  }
  if (nu == 0) { print "_no results_\n"; return }
  line = "| benchmark |"; for (j = 1; j <= nu; j++) line = line " " u[j] " |"; print line
  line = "|---|"; for (j = 1; j <= nu; j++) line = line "---:|"; print line
  for (i = 1; i <= nb; i++) if (grp[i] == g) {
    line = "| " names[i] " |"
    for (j = 1; j <= nu; j++) line = line " " (has(names[i], u[j]) ? val[names[i], u[j]] : "") " |"
    print line
  }
  print ""
}
/^### / { rest = $0; sub(/^### [a-z-]+: /, "", rest) }
/^### date: / { date = rest }
/^### commit: / { commit = rest }
/^### go: / { gover = rest }
/^### cpu: / { cpu = rest }
/^### quick: / { quick = rest }
/^### end: / { end = rest }
/^### llama-bench-commit: / { llcommit = rest }
/^### llama-bench-note: / { llnote = rest }
/^### rerun: / { reruns = reruns (reruns == "" ? "" : "; ") rest }
/^### group: / { g = rest; rnd[g]++ }
/^### cpu-id: / { cpuid[g] = rest }
/^### seconds: / { secs[g] += rest; nsec[g]++ }
/^### (page-cache|file-cached-before|file-cached-after|resident-mode): / { k = $2; sub(/:$/, "", k); sub(/^file-cached-/, "", k); meta[g, rnd[g], k] = rest }
/^### command: / { cmd[g] = rest }
/^### load-before: / { lb[g] = rest }
/^### load-after: / { la[g] = rest }
/^### FAILED/ { failed[g] = 1 }
/^Benchmark[^ \t]*[ \t]+[0-9]+[ \t]/ {
  name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
  # The same benchmark on several files: named after its group.
  perround = (g ~ /^(real|llama)-q3[05]$/ || g ~ /^big-(kvasir|llama)$/)
  if (perround) name = g "/" name
  if (!(name in idx)) { idx[name] = ++nb; names[nb] = name; grp[nb] = g }
  for (i = 3; i + 1 <= NF; i += 2) {
    u = $(i + 1); k = ++nv[name, u]; vals[name, u, k] = $i
    if (perround) rv[name, u, rnd[g]] = $i
    if (index(" " units_of[name] " ", " " u " ") == 0) units_of[name] = units_of[name] " " u
  }
}
END {
  # val[name, unit]: the result, or the median of repeated results (-count).
  for (key in nv) {
    n = nv[key]
    for (i = 1; i <= n; i++) srt[i] = vals[key, i]
    for (i = 2; i <= n; i++) for (j = i; j > 1 && srt[j - 1] + 0 > srt[j] + 0; j--) { x = srt[j]; srt[j] = srt[j - 1]; srt[j - 1] = x }
    val[key] = srt[int((n + 1) / 2)]
    if (n % 2 == 0) { # the mean of the middle two, without trailing zeros
      x = sprintf("%.4f", (srt[n / 2] + srt[n / 2 + 1]) / 2); sub(/0+$/, "", x); sub(/\.$/, "", x); val[key] = x
    }
  }
  print "# Benchmarks"
  print ""
  print "Generated by `make bench` (`scripts/bench.sh`) from `docs/bench-raw.txt`: every number and ratio below"
  print "comes from one run on one machine. Do not edit by hand; rerun the script."
  print ""
  print "| run | |"
  print "|---|---|"
  print "| date | " date " (ended " end ") |"
  print "| commit | " commit " |"
  print "| Go | " gover " |"
  print "| CPU | " cpu " |"
  if (reruns != "") print "| groups rerun since (their tables only) | " reruns " |"
  if (quick == "1") print "| **quick mode** | every benchmark ran once: numbers are not meaningful |"
  print ""
  bw = num("MemBandwidth/read/threads=2", "GB/s"); bw1 = num("MemBandwidth/read/threads=1", "GB/s")
  if (bw1 > bw) bw = bw1
  print "## Summary"
  print ""
  print "| measure | value |"
  print "|---|---:|"
  print "| memory bandwidth BW (read, best of 1 and 2 goroutines) | " f(bw, 2) " GB/s |"
  split("Q4_K Q6_K Q8_0", ts, " ")
  for (j = 1; j <= 3; j++)
    print "| " ts[j] " matvec 2048x2048, 1 row: weight GB/s / BW | " f(ratio(num("MatVec/" ts[j] "/2048x2048/m=1", "weight_GB/s"), bw), 2) " |"
  print "| Q4_K 512x2048 (a 35B-A3B routed expert'\''s gate) streamed by 2 goroutines, no barrier (the ceiling of a decode'\''s matrix x vector): GB/s / BW | " f(ratio(num("Stream/Q4_K/512x2048/threads=2", "GB/s"), bw), 2) " |"
  t = num("Qwen3_30B_A3B_4L/decode", "tok/s"); wb = num("Qwen3_30B_A3B_4L/decode", "weightB/tok")
  print "| decode, Qwen3-30B-A3B shapes (4 layers, Q4_K): tok/s x weight bytes/token / BW | " f(ratio(t * wb / 1e9, bw), 2) " |"
  t = num("FixtureQ4KM/decode", "tok/s"); wb = num("FixtureQ4KM/decode", "weightB/tok")
  print "| decode, fixture Q4_K_M: tok/s x weight bytes/token / BW | " f(ratio(t * wb / 1e9, bw), 2) " |"
  for (j = 1; j <= 3; j++) { x = (j == 1) ? "real-q30" : (j == 2) ? "real-q35" : "big-kvasir"; if (x in cpuid) { print "| CPU of the side-by-side runs (lscpu model name, AVX-512) | " cpuid[x] " |"; break } }
  split("q30 q35", tags, " ")
  sname["q30"] = "30B shape (qwen3moe)"; sname["q35"] = "35B shape (qwen35moe)"
  sfull["q30"] = 48; sfull["q35"] = 40
  for (j = 1; j <= 2; j++) {
    tg = tags[j]; kg = "real-" tg; lg = "llama-" tg
    kd = num(kg "/RealModel/tg32", "tok/s"); kp = num(kg "/RealModel/pp512", "tok/s"); rwb = num(kg "/RealModel/tg32", "weightB/tok")
    ld = num(lg "/LlamaCpp/tg32", "tok/s"); lp = num(lg "/LlamaCpp/pp512", "tok/s")
    nm = (!(kg in cmd) || (lg in cmd)) ? "" : " (llama.cpp not measured in this run)"
    sh = sname[tg] ", " depth(kg) " of " sfull[tg] " layers"
    print "| decode tg32, " sh ", 2 threads: kvasir / llama.cpp tok/s (goal >= 1.4)" nm " | " f(ratio(kd, ld), 2) " |"
    print "| prefill pp512, " sh ": kvasir / llama.cpp tok/s (goal >= 1.2)" nm " | " f(ratio(kp, lp), 2) " |"
    sbw = num(kg "/RealModel/membw", "read-GB/s"); sbn = "BW measured beside it"
    if (sbw <= 0) { sbw = bw; sbn = "BW" }
    rmb = num(kg "/RealModel/tg32", "memB/tok"); rtb = (rmb < 0 || rwb < 0) ? -1 : rwb + rmb
    kfw = num(kg "/RealModel/tg32", "bw-frac"); kft = num(kg "/RealModel/tg32", "traffic-frac"); kpn = " (each generation paired with the bandwidth read right before it, median)"
    if (kfw < 0) { kfw = ratio(wgbs(kd, rwb), sbw); kft = ratio(wgbs(kd, rtb), sbw); kpn = "" }
    print "| decode, " sh ": tok/s x weight bytes/token / " sbn ", kvasir" kpn " (goal >= 0.8) / llama.cpp | " f(kfw, 2) " / " f(ratio(wgbs(ld, rwb), sbw), 2) " |"
    print "| same with the sequence memory each token moves (recurrent state read and written, KV cache read): tok/s x (weight + memory) bytes/token / " sbn ", kvasir / llama.cpp | " f(kft, 2) " / " f(ratio(wgbs(ld, rtb), sbw), 2) " |"
  }
  bk = num("big-kvasir/Generate/decode", "tok/s"); bl = num("big-llama/LlamaCpp/tg32", "tok/s")
  print "| decode of a file larger than the page cache (" f(fileGB("big-kvasir"), 1) " GB, " dropped(("big-kvasir" in cmd) ? "big-kvasir" : "big-llama") "): kvasir / llama.cpp tok/s (goal >= 1.0)" ((!("big-kvasir" in cmd) || ("big-llama" in cmd)) ? "" : " (llama.cpp not measured in this run)") " | " f(ratio(bk, bl), 2) " |"
  l = num("SwarmDecode13ms/qwen3-30b-shape-4L/local", "tok/s")
  print "| swarm / local tok/s, 1 of 4 layers remote at 13 ms, 30B shapes: direct to hub | " f(ratio(num("SwarmDecode13ms/qwen3-30b-shape-4L/layer0-remote-hub-direct", "tok/s"), l), 3) " |"
  print "| same, through the TLS gateway | " f(ratio(num("SwarmDecode13ms/qwen3-30b-shape-4L/layer0-remote-gateway", "tok/s"), l), 3) " |"
  print "| dispatcher tok/s at 512 rows per step / at 1 row (13 ms RTT; reference: 77x) | " f(ratio(num("DispatchRTT13ms/rows=512", "tok/s"), num("DispatchRTT13ms/rows=1", "tok/s")), 1) "x |"
  print "| serve over the real swarm, 512 sequences / 1 (13 ms RTT, 1 lane) | " f(ratio(num("RealSwarm/lanes=1/seqs=512", "tok/s"), num("RealSwarm/lanes=1/seqs=1", "tok/s")), 1) "x |"
  print "| serve over the real swarm (2 workers, 13 ms RTT, 2 lanes) / local serve, 512 sequences (goal >= 0.8) | " f(ratio(num("RealSwarm/lanes=2/seqs=512", "tok/s"), num("RealSwarm/local/seqs=512", "tok/s")), 2) " |"
  print "| serve over the real swarm, 2 lanes / 1 lane (two-batch overlap), 512 sequences | " f(ratio(num("RealSwarm/lanes=2/seqs=512", "tok/s"), num("RealSwarm/lanes=1/seqs=512", "tok/s")), 2) "x |"
  dd = num("RoundTrip/direct", "ns/op"); gg = num("RoundTrip/gateway", "ns/op")
  print "| latency the gateway adds to a 64-byte round trip | " f((dd > 0 && gg > 0) ? (gg - dd) / 1000 : -1, 1) " us |"
  print "| gateway splice throughput (both directions) | " f(num("Splice", "MB/s"), 0) " MB/s |"
  print ""
  print "Measurements that need a setup this script does not make are summarised in \"Summary of the hand"
  print "measurements\" under \"Benchmarks measured by hand\" at the end (docs/BENCHMARKS-by-hand.md)."
  print ""
  print "The machine is shared: each table gives the load average (1, 5, 15 min) before and after it. With a load"
  print "above the core count the benchmarks got a fraction of the CPU, so wall-clock rates are low bounds;"
  print "the `GB/s_per_cpu` and `cpu-us/tok` columns (CPU time actually used) are steadier."
  print ""

  print "## Memory bandwidth"
  print ""
  print "The reference every ratio below uses: **BW = " f(bw, 2) " GB/s**, the best of the `read` rows (DotF32 of a"
  print "64 MiB buffer with itself, 1 or 2 goroutines: bytes read per second, as a decode reads weights)."
  print ""
  table("membw"); table("model-membw")

  print "## Kernels: matrix x vector per weight type (`engine/quant`)"
  print ""
  print "MatMul of a 2048- or 768-row weight matrix (2048 columns) by m activation rows on both cores, cycling"
  print "through 128 MiB of weight copies so that they stream from memory. `weight_GB/s` = weight bytes read per"
  print "second; the ratio is weight_GB/s / BW (1.0 = the kernel runs at memory speed)."
  print ""
  print "| benchmark | weight_GB/s | GB/s_per_cpu | weight_GB/s / BW |"
  print "|---|---:|---:|---:|"
  for (i = 1; i <= nb; i++) if (grp[i] == "matvec")
    print "| " names[i] " | " f(num(names[i], "weight_GB/s"), 2) " | " f(num(names[i], "GB/s_per_cpu"), 2) " | " f(ratio(num(names[i], "weight_GB/s"), bw), 2) " |"
  print ""
  print "<details><summary>raw table</summary>\n"; table("matvec"); print "</details>\n"
  print "One kernel, one goroutine, one cached 4096-wide row (compute speed without memory traffic; MB/s of weight"
  print "bytes):"
  print ""
  table("vecdot")
  print "The row kernels alone on one goroutine, per SIMD path (`KVASIR_SIMD` forces one; all give the same bits):"
  print "`cached` = a 256 x 2048 matrix in L2, `stream` = 768 MiB of 2048 x 2048 copies from memory; m = activation"
  print "rows (1: decode). `ns/blk` = per weight block and activation row (`cpu-ns/blk`: CPU time, steadier on a"
  print "shared machine); compare `stream` m=1 `weight_GB/s` with the 1-goroutine `read` bandwidth above."
  print ""
  table("kernel")
  print "The shapes of the 35B-A3B decode streamed with no barrier (`BenchmarkStream`): each of 1 or 2 goroutines"
  print "runs its own 256 MiB of copies of one matrix back to back (m = 1), beside `read` (DotF32 of each goroutine'\''s"
  print "256 MiB with itself): what the decode'\''s kernels stream when nothing else runs between the calls. A decode"
  print "step reads the same bytes in ~100 parallel regions per token with serial steps between them. This host'\''s"
  print "bandwidth moves by up to 2x from one minute to the next (the side-by-side groups pair each generation with"
  print "a read measured right before it for that reason), so compare these rows with each other, not across groups."
  print ""
  table("stream")

  print "## Side by side with llama.cpp: both shapes, files that fit in the page cache (`engine/model`)"
  print ""
  print "Each file: `backbone genmodel --preset P --layers N --type Q4_K --seed 1`, written once to the cache folder"
  print "(`~/.cache/kvasir-bench`), N chosen so that it fits in the page cache with room to spare"
  print "(`KVASIR_BENCH_LAYERS_Q30`, `KVASIR_BENCH_LAYERS_Q35`), read into the page cache before each engine'\''s round;"
  print "2 threads. kvasir: `BenchmarkRealModel` (tg32: 32 tokens decoded one at a time from an empty sequence; pp512:"
  print "a 512-token prompt as one batch), as llama.cpp'\''s `llama-bench -t 2 -p 512 -n 32` measures. The engines"
  print "alternate, kvasir first, two rounds each (" (llcommit != "" ? "llama.cpp " llcommit ", " : "") "built outside this repo" (llnote != "" ? ": " llnote : "") ")."
  print "Medians, with the range over the rounds. Decode reads every weight byte of the active experts and the"
  print "attention once per token, so its bound is BW / bytes per token; the llama.cpp fraction uses kvasir'\''s bytes per"
  print "token of the same file (both engines read the same weights). Compare machines by the fraction of BW."
  print "This machine'\''s bandwidth varies by a third from minute to minute (a shared host), so kvasir'\''s rounds measure it"
  print "right before tg32 (RealModel/membw) and before each of its generations (pairs: bw-frac, traffic-frac, the"
  print "medians over the pairs); the summary uses the pairs. A qwen35moe token also reads and writes its Gated DeltaNet"
  print "state (2 MB per layer of the 35B shape): the roofline rows count it with the weights."
  print ""
  for (j = 1; j <= 2; j++) {
    tg = tags[j]; kg = "real-" tg; lg = "llama-" tg
    kd = num(kg "/RealModel/tg32", "tok/s"); kp = num(kg "/RealModel/pp512", "tok/s"); rwb = num(kg "/RealModel/tg32", "weightB/tok")
    ld = num(lg "/LlamaCpp/tg32", "tok/s"); lp = num(lg "/LlamaCpp/pp512", "tok/s")
    lm = (lg in cmd)
    print "### " sname[tg] ", " depth(kg) " of " sfull[tg] " layers, Q4_K"
    print ""
    if (!(kg in cmd)) { print "_not run_\n"; continue }
    print "File: " f(fileGB(kg), 1) " GB; " incache(meta[kg, 1, "before"]) " in the page cache at the start of kvasir'\''s first round, MemTotal " f(memv(meta[kg, 1, "before"], "MemTotal"), 1) " GB, MemAvailable " f(memv(meta[kg, 1, "before"], "MemAvailable"), 1) " GB." (lm ? "" : " **llama.cpp was not measured in this run** (no llama-bench: `LLAMA_BENCH` unset and none on PATH).")
    print ""
    print "| | kvasir | llama.cpp | kvasir / llama.cpp | goal | met |"
    print "|---|---:|---:|---:|---:|---:|"
    print "| CPU (lscpu), 2 threads | " cpuid[kg] " | " (lm ? ((lg in cpuid) ? cpuid[lg] : "?") : "not measured") " | | | |"
    print "| decode tg32 tok/s | " f(kd, 2) " (" span(kg "/RealModel/tg32", "tok/s", 2) ") | " (lm ? f(ld, 2) " (" span(lg "/LlamaCpp/tg32", "tok/s", 2) ")" : "not measured") " | " f(ratio(kd, ld), 2) " | >= 1.4 | " goal(ratio(kd, ld), 1.4) " |"
    print "| prefill pp512 tok/s | " f(kp, 2) " (" span(kg "/RealModel/pp512", "tok/s", 2) ") | " (lm ? f(lp, 2) " (" span(lg "/LlamaCpp/pp512", "tok/s", 2) ")" : "not measured") " | " f(ratio(kp, lp), 2) " | >= 1.2 | " goal(ratio(kp, lp), 1.2) " |"
    print "| weight bytes read per decoded token | " f(rwb, 0) " | same file | | | |"
    print "| decode weight GB/s (tok/s x bytes/token) | " f(wgbs(kd, rwb), 2) " | " (lm ? f(wgbs(ld, rwb), 2) : "") " | | | |"
    sbw = num(kg "/RealModel/membw", "read-GB/s")
    print "| ... / BW (" f(bw, 2) " GB/s, membw group, before the rounds) | " f(ratio(wgbs(kd, rwb), bw), 2) " | " (lm ? f(ratio(wgbs(ld, rwb), bw), 2) : "") " | | >= 0.8 (kvasir) | " goal(ratio(wgbs(kd, rwb), bw), 0.8) " |"
    print "| ... / BW measured beside it (" f(sbw, 2) " GB/s, median of the rounds: RealModel/membw, right before tg32) | " f(ratio(wgbs(kd, rwb), sbw), 2) " | " (lm ? f(ratio(wgbs(ld, rwb), sbw), 2) : "") " | | >= 0.8 (kvasir) | " goal(ratio(wgbs(kd, rwb), sbw), 0.8) " |"
    rmb = num(kg "/RealModel/tg32", "memB/tok"); rtb = (rmb < 0 || rwb < 0) ? -1 : rwb + rmb
    kfw = num(kg "/RealModel/tg32", "bw-frac"); kft = num(kg "/RealModel/tg32", "traffic-frac")
    print "| ... kvasir: each generation / the read bandwidth right before it (" f(num(kg "/RealModel/tg32", "pair-read-GB/s"), 2) " GB/s, median of the pairs), median | " f(kfw, 2) " | | | >= 0.8 | " goal(kfw, 0.8) " |"
    print "| sequence memory moved per decoded token, mean of tg32 (recurrent state read and written, KV cache read; Model.MemoryBytesPerToken) | " f(rmb, 0) " | same model | | | |"
    print "| ... (weight + memory bytes) x tok/s / BW measured beside it: the whole step against the roofline | " f(ratio(wgbs(kd, rtb), sbw), 2) " | " (lm ? f(ratio(wgbs(ld, rtb), sbw), 2) : "") " | | | |"
    print "| ... the same per pair (kvasir), median | " f(kft, 2) " | | | | |"
    print "| decode bound BW / bytes per token (tok/s) | " f(rwb > 0 ? bw * 1e9 / rwb : -1, 1) " | | | | |"
    print "| kvasir CPU per token, decode / prefill (cpu-us/tok) | " f(num(kg "/RealModel/tg32", "cpu-us/tok"), 0) " / " f(num(kg "/RealModel/pp512", "cpu-us/tok"), 0) " | | | | |"
    print "| llama-bench process: wall s, peak RSS; load s; weights mapped + repacked GB | | " (lm ? f(num(lg "/LlamaCpp/process", "wall_s"), 1) " s, " f(num(lg "/LlamaCpp/process", "peakRSS_GB"), 2) " GB; " f(num(lg "/LlamaCpp/process", "load_s"), 1) " s; " f(num(lg "/LlamaCpp/process", "mapped_GB"), 2) " + " f(num(lg "/LlamaCpp/process", "repacked_GB"), 2) : "") " | | | |"
    print ""
    table(kg); if (lm) table(lg)
  }

  print "## A file larger than the page cache: decode, kvasir vs llama.cpp"
  print ""
  bg = "big-kvasir"; lg = "big-llama"; lm = (lg in cmd)
  if (!(bg in cmd) && !lm) print "_not run_\n"
  else {
    fg = (bg in cmd) ? bg : lg; fs = fileGB(fg); mt = memv(meta[fg, 1, "before"], "MemTotal"); ma = memv(meta[fg, 1, "before"], "MemAvailable")
    print "The file: `backbone genmodel --preset qwen3-30b-a3b --layers " depth(fg) " --type Q4_K --seed 1` (`KVASIR_BENCH_BIG_LAYERS`),"
    print "**" f(fs, 1) " GB**. The machine: CPU " cpuid[fg] "; **MemTotal " f(mt, 1) " GB**, **MemAvailable " f(ma, 1) " GB** at the"
    print "start of the first round (page cache: " meta[fg, 1, "page-cache"] "). The file is " f(ratio(fs, mt), 2) " of RAM and " f(ratio(fs, ma), 2) " of"
    if (fs < 0 || ma < 0) print "the memory available."
    else if (fs > ma) print "the memory available: **larger than what the page cache can hold**, though smaller than RAM" (fs < mt ? "" : " (**not**: larger than RAM too)") "."
    else if (2 * fs > ma) {
      print "the memory available: it fits in the page cache once, but not beside a private copy of its weights (file + copy"
      print "= " f(2 * fs, 1) " GB) nor beside other memory use of more than " f(ma - fs, 1) " GB: there the page cache cannot hold it and"
      print "every weight evicted is read from disk again when a token needs it."
    } else {
      print "the memory available: **the page cache can hold it (and a copy) here**, so this run did not measure the"
      print "larger-than-the-page-cache case; choose `KVASIR_BENCH_BIG_LAYERS` so that the file exceeds half of MemAvailable."
    }
    d = dropped(fg)
    if (d ~ /^page cache dropped/) print "The page cache was emptied before each engine'\''s round, so both engines started from the disk. kvasir:"
    else if (d ~ /evicted/) print "The page cache was not emptied (not root, or KVASIR_BENCH_DROP=file); the file'\''s own pages were evicted before each engine'\''s round, so both read it from the disk, but other files stayed cached. kvasir:"
    else print "**The page cache was not emptied** (`KVASIR_BENCH_DROP=none`, or neither way worked): the file may have been partly cached. kvasir:"
    print "`backbone generate --model FILE --max-tokens 32 --threads 2 --json` (default `--resident auto`: it locks the"
    print "weights in memory when they fit in available memory, else maps them and warns); llama.cpp: `llama-bench -m"
    print "FILE -t 2 -p 0 -n 32 -r 2` (its default mmap, then it repacks the Q4_K weights it can into its own buffers; its"
    print "-v log gives both sizes). Wall seconds and peak RSS (GNU time) cover the whole process: reading the file"
    print "from disk, locking or repacking, and the decode; `in page cache` = the file'\''s pages cached (fincore) before"
    print "and after the round." (lm ? "" : " **llama.cpp was not measured in this run** (no llama-bench: `LLAMA_BENCH` unset and none on PATH).")
    print ""
    print "| round | engine | decode tok/s | resident | peak RSS GB | wall s | in page cache before | after | kvasir / llama.cpp |"
    print "|---:|---|---:|---|---:|---:|---|---|---:|"
    print "| | CPU (lscpu), 2 threads: " cpuid[fg] " | | | | | | | |"
    nr = (rnd[bg] > rnd[lg]) ? rnd[bg] : rnd[lg]
    for (r = 1; r <= nr; r++) {
      k = rval(bg "/Generate/decode", "tok/s", r); l = rval(lg "/LlamaCpp/tg32", "tok/s", r)
      if (r <= rnd[bg])
        print "| " r " | kvasir | " f(k, 2) " (" rval(bg "/Generate/decode", "tokens", r) " tokens) | " ((bg, r, "resident-mode") in meta ? meta[bg, r, "resident-mode"] ", " f(rval(bg "/Generate/decode", "resident_GB", r), 2) " GB" : "?") " | " \
          f(rval(bg "/Generate/decode", "peakRSS_GB", r), 2) " | " f(rval(bg "/Generate/decode", "wall_s", r), 1) " | " incache(meta[bg, r, "before"]) " | " incache(meta[bg, r, "after"]) " | |"
      if (r <= rnd[lg])
        print "| " r " | llama.cpp | " f(l, 2) " | mapped " f(rval(lg "/LlamaCpp/process", "mapped_GB", r), 2) " GB + repacked " f(rval(lg "/LlamaCpp/process", "repacked_GB", r), 2) " GB, loaded in " f(rval(lg "/LlamaCpp/process", "load_s", r), 1) " s | " f(rval(lg "/LlamaCpp/process", "peakRSS_GB", r), 2) " | " f(rval(lg "/LlamaCpp/process", "wall_s", r), 1) " | " \
          incache(meta[lg, r, "before"]) " | " incache(meta[lg, r, "after"]) " | " f(ratio(k, l), 2) " |"
    }
    print ""
    bk = num(bg "/Generate/decode", "tok/s"); bl = num(lg "/LlamaCpp/tg32", "tok/s")
    print "Medians: kvasir " f(bk, 2) " tok/s, llama.cpp " f(bl, 2) " tok/s: **kvasir / llama.cpp = " f(ratio(bk, bl), 2) "** (goal >= 1.0: " goal(ratio(bk, bl), 1.0) ")."
    print ""
    table(bg); table(lg)
  }

  print "## The backbone'\''s own step, every routed expert remote (`engine/model`, optional group `backbone-step`)"
  print ""
  print "BenchmarkBackboneStep: the model of a backbone-only file with an expert Computer that answers at once, so a"
  print "step times only the backbone: attention / Gated DeltaNet, router, shared expert, norms, head and the remote"
  print "branch'\''s bookkeeping; at 1 row (a decode) and 64 rows (one row of each of 64 sequences). `local` rows: the"
  print "8-layer full file decoded with its own experts, `backbone-ms/step` = ms/step - `expert-ms/step` (wall time in"
  print "the routed experts, measured inside the step). Files from `genmodel --backbone-only` (no full file written)."
  print "Run only with `KVASIR_BENCH_GROUPS=backbone-step`; see docs/BENCHMARKS-by-hand.md for a recorded run."
  print ""
  table("backbone-step-35b"); table("backbone-step-122b"); table("backbone-step-35b-8l"); table("backbone-step-35b-8l-bo")

  print "## Model decode and prefill (`engine/model`)"
  print ""
  print "Decode is memory-bound: tok/s <= BW / (weight bytes read per token). The ratio is tok/s x weightB/tok / BW:"
  print "the fraction of the memory bandwidth the whole decode step achieves."
  print ""
  print "| model | decode tok/s | weightB/tok | bound BW/weightB (tok/s) | tok/s x weightB/tok / BW | prefill64 tok/s |"
  print "|---|---:|---:|---:|---:|---:|"
  split("FixtureQ4KM Qwen3_30B_A3B_4L FixtureQwen35Q4KM Qwen35_35B_A3B_4L", ms, " ")
  for (j = 1; j <= 4; j++) {
    d = ms[j] "/decode"; t = num(d, "tok/s"); wb = num(d, "weightB/tok")
    print "| " ms[j] " | " f(t, 1) " | " f(wb, 0) " | " f(wb > 0 ? bw * 1e9 / wb : -1, 1) " | " f(ratio(t * wb / 1e9, bw), 2) " | " f(num(ms[j] "/prefill64", "tok/s"), 1) " |"
  }
  print ""
  table("model-fixture"); table("model-q30"); table("model-q35")

  print "## Expert function (`engine/expert`)"
  print ""
  print "What a worker sells: one Qwen3-30B-A3B MoE layer (128 experts, d 2048, FFN 768, Q4_K, 340 MB) at batches"
  print "of 1 (a decode step, top-8), 8, 64 and 512 rows on 2 goroutines. GB/s counts each distinct expert'\''s"
  print "weights once per call; the ratio is expert weight GB/s / BW."
  print ""
  print "| benchmark | GB/s | rows/s | GB/s / BW |"
  print "|---|---:|---:|---:|"
  for (i = 1; i <= nb; i++) if (grp[i] == "expert")
    print "| " names[i] " | " f(num(names[i], "GB/s"), 2) " | " f(num(names[i], "rows/s"), 0) " | " f(ratio(num(names[i], "GB/s"), bw), 2) " |"
  print ""

  print "## Vulkan expert path next to the CPU path (`engine/vulkan`)"
  print ""
  print "The same expert computations on the first GPU (`--backend auto`'\''s pick), else the first Vulkan device: here"
  print "Mesa'\''s lavapipe, which runs the Vulkan kernels on these CPU cores — a correctness vehicle, not a speed"
  print "reference. rows/s counts (row, slot) pairs, weight-GB/s the used experts'\'' bytes once per call, bw-frac that"
  print "over the device'\''s copy bandwidth (DeviceBandwidth). `scripts/gpu-check.sh` runs these with the correctness"
  print "checks on a real GPU (goal there: bw-frac >= 0.5 on Q4_K at 64 rows and more)."
  print ""
  table("vulkan")

  print "## Dispatcher: rows per step behind a 13 ms round trip (`backbone/dispatch`)"
  print ""
  print "One MoE layer call of Qwen3-30B-A3B shapes (d 2048, top-8) through dispatcher -> hub -> 13 ms proxy ->"
  print "TLS gateway -> worker (cheap fake expert function): the protocol'\''s cost. Gain = tok/s at n rows / tok/s at"
  print "1 row (the reference deployment reached 77x at 512)."
  print ""
  print "| rows per step | tok/s | gain over 1 row |"
  print "|---:|---:|---:|"
  base = num("DispatchRTT13ms/rows=1", "tok/s")
  split("1 8 64 512", rs, " ")
  for (j = 1; j <= 4; j++) { t = num("DispatchRTT13ms/rows=" rs[j], "tok/s"); print "| " rs[j] " | " f(t, 1) " | " f(ratio(t, base), 1) "x |" }
  print ""
  table("dispatch-rtt")
  print "Fixture Q8_0 decode, local vs layer 0 on a worker behind the gateway at 13 ms:"
  print ""
  table("dispatch-decode")
  l = num("FixtureDecode/local", "tok/s"); s = num("FixtureDecode/swarm-layer0-gateway-13ms", "tok/s")
  print "swarm / local = " f(ratio(s, l), 3) "\n"

  print "## Swarm decode: local vs one layer remote at 13 ms, direct to the hub vs through the gateway (`backbone`)"
  print ""
  print "Greedy single-token decode; with layer 0'\''s experts on a worker (in-process, same CPUs) whose link has a"
  print "13 ms round trip injected: `hub-direct` = plain WebSocket to the hub, `gateway` = TLS gateway and its"
  print "authenticated splice. One round trip per token. The reference deployment measured 1.2 % overhead direct"
  print "(4.220 -> 4.169 tok/s on a 122B model, where a token takes ~240 ms) and ~28 % through a CDN edge; here a"
  print "token of the small models takes far less than 13 ms locally, so the same round trip weighs much more."
  print ""
  print "`tiny` is the embedded default (qwen35moe); `fixture-Q4_K_M` and `qwen3-30b-shape-4L` are qwen3moe. One layer"
  print "is remote, so added ms/token is the added ms per remote layer; on qwen35moe the shared expert is computed"
  print "while the routed experts are away."
  print ""
  print "| model | local tok/s | hub-direct tok/s | gateway tok/s | direct / local | gateway / local | added ms/token direct | added ms/token gateway |"
  print "|---|---:|---:|---:|---:|---:|---:|---:|"
  split("tiny fixture-Q4_K_M qwen3-30b-shape-4L fixture-qwen35moe-Q4_K_M qwen3.5-35b-shape-4L", ms, " ")
  for (j = 1; j <= 5; j++) {
    l = num("SwarmDecode13ms/" ms[j] "/local", "tok/s")
    dd = num("SwarmDecode13ms/" ms[j] "/layer0-remote-hub-direct", "tok/s")
    gg = num("SwarmDecode13ms/" ms[j] "/layer0-remote-gateway", "tok/s")
    print "| " ms[j] " | " f(l, 1) " | " f(dd, 1) " | " f(gg, 1) " | " f(ratio(dd, l), 3) " | " f(ratio(gg, l), 3) " | " \
      f((l > 0 && dd > 0) ? 1000 / dd - 1000 / l : -1, 2) " | " f((l > 0 && gg > 0) ? 1000 / gg - 1000 / l : -1, 2) " |"
  }
  print ""
  print "Idle spinning (issue 19, `--spin-wait`): the same remote layer with the worker a `backbone worker` process,"
  print "the CPUs of the dispatcher kept spinning at SCHED_IDLE through the wait (the default) and not (`-nospin`), in"
  print "the same run. added-beyond: the time a step adds beyond the echo round trip and the compute of the worker (goal"
  print "<= 0.5 ms)."
  print ""
  print "| model | step p50 ms, spinning | step p50 ms, not | added-beyond ms, spinning | added-beyond ms, not | spinner CPU ms per step |"
  print "|---|---:|---:|---:|---:|---:|"
  for (j = 1; j <= 5; j++) {
    sp = "SwarmDecode13ms/" ms[j] "/layer0-remote-gateway-process"; ns = sp "-nospin"
    if (!has(sp, "step-p50-ms")) continue
    print "| " ms[j] " | " f(num(sp, "step-p50-ms"), 2) " | " f(num(ns, "step-p50-ms"), 2) " | " f(num(sp, "added-beyond-ms"), 2) " | " \
      f(num(ns, "added-beyond-ms"), 2) " | " f(num(sp, "spin-cpu-ms/op"), 1) " |"
  }
  print ""
  table("swarm-decode")

  print "## Gateway splice (`backbone/gateway`)"
  print ""
  print "Splice: 1 MiB messages echoed through the TLS gateway (MB/s counts both directions). RoundTrip: a 64-byte"
  print "echo directly to the hub vs through the gateway; the difference is the latency the gateway adds."
  print ""
  table("gateway")
  dd = num("RoundTrip/direct", "ns/op"); gg = num("RoundTrip/gateway", "ns/op")
  print "gateway adds " f((dd > 0 && gg > 0) ? (gg - dd) / 1000 : -1, 1) " us per round trip (" f(ratio(gg, dd), 2) "x the direct one).\n"

  print "## Serve batching (`backbone/serve`)"
  print ""
  print "N concurrent one-token prompts x 16 tokens on the tiny model with every MoE layer behind a 13 ms round"
  print "trip: simulated (SwarmBatching: sleep then compute) and real (RealSwarm: dispatcher, hub, 13 ms proxy, TLS"
  print "gateway, two workers holding every expert). Gain = tok/s at N sequences / tok/s at 1; vs local = tok/s"
  print "over the real swarm / tok/s of the same server computing its experts in-process (RealSwarm/local)."
  print ""
  print "| benchmark | tok/s | gain over 1 sequence | vs local |"
  print "|---|---:|---:|---:|"
  split("SwarmBatching RealSwarm", bs, " ")
  for (j = 1; j <= 4; j++) { n = "RealSwarm/local/seqs=" rs[j]; if (has(n, "tok/s")) print "| " n " | " f(num(n, "tok/s"), 1) " | " f(ratio(num(n, "tok/s"), num("RealSwarm/local/seqs=1", "tok/s")), 1) "x | 1.00 |" }
  for (k = 1; k <= 2; k++) for (ln = 1; ln <= 2; ln++) {
    base = num(bs[k] "/lanes=" ln "/seqs=1", "tok/s")
    for (j = 1; j <= 4; j++) {
      n = bs[k] "/lanes=" ln "/seqs=" rs[j]; if (!has(n, "tok/s")) continue
      vs = (k == 2) ? f(ratio(num(n, "tok/s"), num("RealSwarm/local/seqs=" rs[j], "tok/s")), 2) : ""
      print "| " n " | " f(num(n, "tok/s"), 1) " | " f(ratio(num(n, "tok/s"), base), 1) "x | " vs " |"
    }
  }
  print ""
  table("serve-batching"); table("serve-real")

  print "## Ledger, crediting, GGUF, tokenizer"
  print ""
  table("ledger"); table("credit"); table("gguf"); table("tokenizer")
}
' "$RAW" >"$DOC"
# Sections measured by hand (PostgreSQL, the 16.9 GB file, verification
# rates) live in their own file and follow the generated tables.
HAND=${KVASIR_BENCH_HAND:-docs/BENCHMARKS-by-hand.md}
if [ -s "$HAND" ]; then
  { echo; sed '1s/^# /## /; 2,$s/^## /### /' "$HAND"; } >>"$DOC"
fi
echo "bench.sh: wrote $RAW and $DOC" >&2
