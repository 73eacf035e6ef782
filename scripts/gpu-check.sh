#!/usr/bin/env bash
# scripts/gpu-check.sh — the Vulkan expert path's checks on this machine's
# Vulkan device (issue 18), in one run, with a report:
#
#   1. devices: what the Vulkan loader lists; the one checked is
#      $KVASIR_VULKAN_DEVICE, else the GPU `--backend auto` takes (a discrete,
#      then an integrated, then a virtual GPU), else device 0 (lavapipe on a
#      machine without a GPU: correctness only, not a speed reference);
#   2. correctness (engine/vulkan tests): every weight type (Q4_K, Q5_K, Q6_K,
#      Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, F16, BF16, F32; random layers, the Q4_K_M
#      mixes, generated models, fused gate_up) and the llama.cpp-made qwen3moe
#      and qwen35moe fixtures, CPU path vs Vulkan per output row: relative L2
#      <= 1/512 and cosine >= 0.9999 (rare activation-rounding flips within
#      1/128 allowed, unless --strict), the worst row of each case logged; the
#      device-memory quota, experts changing under a quota worker (Rebase), a
#      lost device answered from the CPU path, concurrent calls;
#   3. a swarm decode served by a Vulkan worker (backbone/dispatch tests: the
#      greedy tokens of a local decode, logits cosine >= 0.9999 at every step,
#      exact metering, a x1.01 liar caught and banned, a provisioned worker and
#      its lost-device twin), where that test binary is at hand;
#   4. the benchmark: the device's copy bandwidth; rows/s, weight GB/s and the
#      fraction of that bandwidth on Q4_K expert matmuls at 64 and 256 rows
#      (goal on a real GPU: >= 0.5), next to the CPU path.
#
# Usage:
#   scripts/gpu-check.sh [--strict] [--quick]
#       on a machine with Go (and the fixtures in ../shared/fixtures or
#       $KVASIR_FIXTURES): builds the test binaries and runs everything.
#   scripts/gpu-check.sh bundle DIR
#       builds DIR for a machine without Go (such as a lent GPU machine): the
#       two test binaries, the Q4_K_M fixtures of both architectures (the F16
#       and Q8_0 ones are left out for size: their cases are skipped) and the
#       Vulkan loader's .deb (libvulkan1), about 60 MB in all.
#   scripts/gpu-check.sh [--strict] [--quick] --from DIR
#       runs from such a DIR: unpacks the loader when the system has none and
#       points the loader at the NVIDIA driver's ICD file when no other is
#       installed.
#
# Environment: KVASIR_VULKAN_DEVICE (the device index), KVASIR_GPU_BANDWIDTH_GBS
# (the device's nominal memory bandwidth, e.g. 4800 for an H200: the report
# then gives the fraction of it too), KVASIR_VK_BENCH_EXPERTS (experts in the
# batch benchmark; default 128 on a GPU, 16 on a software driver), REPORT (the
# report's path; default ${OUT:-/tmp/kvasir-gpu-check}/gpu-check.md, the logs
# beside it). Exit status: 0 when every check passed (the speed goal is
# reported, not enforced), 1 when one failed, 2 on bad usage.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

strict= quick= from= bundle=
while [ $# -gt 0 ]; do
  case "$1" in
    --strict) strict=1 ;;
    --quick) quick=1 ;;
    --from) from=${2:?--from needs a folder}; shift ;;
    bundle) bundle=${2:?bundle needs a folder}; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

fixtures_here() {
  for d in "${KVASIR_FIXTURES:-}" "$root/../shared/fixtures" "$root/shared/fixtures"; do
    [ -n "$d" ] && [ -d "$d" ] && { (cd "$d" && pwd); return; }
  done
}

if [ -n "$bundle" ]; then
  command -v go >/dev/null || { echo "gpu-check: bundle needs Go" >&2; exit 2; }
  fx=$(fixtures_here)
  [ -n "$fx" ] || { echo "gpu-check: no fixtures (../shared/fixtures or \$KVASIR_FIXTURES)" >&2; exit 2; }
  mkdir -p "$bundle/bin" "$bundle/shared/fixtures/qwen35moe" "$bundle/gl" || exit 1
  echo "gpu-check: building the test binaries into $bundle/bin" >&2
  go test -c -ldflags='-s -w' -o "$bundle/bin/vulkan.test" ./engine/vulkan/ || exit 1
  go test -c -ldflags='-s -w' -o "$bundle/bin/dispatch.test" ./backbone/dispatch/ || exit 1
  cp "$fx/tiny-qwen3moe-Q4_K_M.gguf" "$bundle/shared/fixtures/" || exit 1
  cp "$fx/qwen35moe/tiny-qwen35moe-Q4_K_M.gguf" "$bundle/shared/fixtures/qwen35moe/" || exit 1
  if ! ls "$bundle"/gl/libvulkan1_*.deb >/dev/null 2>&1; then
    (cd "$bundle/gl" && apt-get download libvulkan1) || echo "gpu-check: could not download libvulkan1 (the GPU machine must then have a Vulkan loader)" >&2
  fi
  du -sh "$bundle" >&2
  echo "gpu-check: bundle ready; there: scripts/gpu-check.sh --from $bundle" >&2
  exit 0
fi

out=$(dirname "${REPORT:-${OUT:-/tmp/kvasir-gpu-check}/gpu-check.md}")
report=${REPORT:-$out/gpu-check.md}
mkdir -p "$out" || exit 1

if [ -n "$from" ]; then
  from=$(cd "$from" && pwd) || exit 2
  bin=$from/bin
  export KVASIR_FIXTURES=$from/shared/fixtures
  disp_dir=$from/run/backbone/dispatch # ../../../shared/fixtures is the bundle's
  mkdir -p "$disp_dir"
  if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1'; then
    for f in "$from"/gl/*.deb; do [ -e "$f" ] && dpkg -x "$f" /; done
    ldconfig 2>/dev/null
  fi
else
  command -v go >/dev/null || { echo "gpu-check: no Go here: build a bundle elsewhere and use --from DIR" >&2; exit 2; }
  bin=$out/bin
  mkdir -p "$bin"
  fx=$(fixtures_here)
  [ -n "$fx" ] && export KVASIR_FIXTURES=$fx
  echo "gpu-check: building the test binaries" >&2
  go test -c -o "$bin/vulkan.test" ./engine/vulkan/ || exit 1
  go test -c -o "$bin/dispatch.test" ./backbone/dispatch/ || exit 1
  disp_dir=$root/backbone/dispatch # as go test runs it
fi
# No ICD file of the system's own, but the NVIDIA driver's (lent GPU machines).
if [ -z "${VK_DRIVER_FILES:-}${VK_ICD_FILENAMES:-}" ] && ! ls /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json >/dev/null 2>&1 &&
  [ -e /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
fi
[ -n "$strict" ] && export KVASIR_VULKAN_STRICT=1
vt=$bin/vulkan.test
status=0
{
  echo "# Vulkan GPU check ($(date -u '+%Y-%m-%d %H:%M UTC'))"
  echo
  echo "Machine: $(hostname), $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ *//') x $(nproc)"
  command -v nvidia-smi >/dev/null && echo "nvidia-smi: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -1)"
  echo "Commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown); fixtures: ${KVASIR_FIXTURES:-none}; strict: ${strict:-no}"
  echo
} >"$report"

# 1. Devices.
"$vt" -test.run '^TestDevicesList$' -test.v -test.count=1 >"$out/devices.log" 2>&1
devs=$(sed -n 's/^ *computer_vk_test.go:[0-9]*: \([0-9][0-9]*: .*\)$/\1/p' "$out/devices.log")
if [ -z "$devs" ]; then
  { echo "## Devices"; echo; echo "No Vulkan device: see devices.log"; echo '```'; tail -5 "$out/devices.log"; echo '```'; } >>"$report"
  echo "gpu-check: no Vulkan device (devices.log)" >&2
  cat "$report"
  exit 1
fi
pick=${KVASIR_VULKAN_DEVICE:-}
if [ -z "$pick" ]; then
  for want in discrete integrated virtual; do
    pick=$(printf '%s\n' "$devs" | sed -n "s/^\([0-9]*\): .*(${want}, [0-9.]* GiB, Vulkan [^)]*)\$/\1/p" | head -1)
    [ -n "$pick" ] && break
  done
  pick=${pick:-0}
fi
export KVASIR_VULKAN_DEVICE=$pick
chosen=$(printf '%s\n' "$devs" | grep "^$pick: ")
software=
case "$chosen" in *"(cpu, "*) software=1 ;; esac
{
  echo "## Devices"
  echo
  printf '%s\n' "$devs" | sed 's/^/    /'
  echo
  echo "Checked: device $chosen${software:+ — a software driver: correctness only, not a speed reference}"
  echo
} >>"$report"
echo "gpu-check: device $chosen" >&2

# 2. Correctness.
echo "gpu-check: correctness (engine/vulkan)" >&2
"$vt" -test.run 'TestTypes|TestGenerated|TestFixtures|TestFusedGateUp|TestQuota|TestRebase|TestFault|TestConcurrent|TestNoLoader' \
  -test.v -test.count=1 -test.timeout 30m >"$out/correctness.log" 2>&1
rc=$?
cases=$(grep -c 'worst rel L2' "$out/correctness.log")
worst=$(grep -o 'worst rel L2 [0-9.e+-]*' "$out/correctness.log" | awk '{ if ($4+0 > m) m = $4+0 } END { printf "%.3g", m }')
worstcos=$(grep -o 'worst cosine [0-9.]*' "$out/correctness.log" | awk 'BEGIN { m = 1 } { if ($3+0 < m) m = $3+0 } END { printf "%.7f", m }')
flips=$(grep -c 'activation rounding flip' "$out/correctness.log")
fixt=$(grep -c 'layer [0-9]* (.*).*worst rel L2' "$out/correctness.log")
skipped=$(grep -E -- '--- SKIP' "$out/correctness.log" | sed 's/^ *--- SKIP: //; s/ (.*//' | tr '\n' ' ')
{
  echo "## Correctness: CPU path vs Vulkan, per output row"
  echo
  if [ $rc = 0 ]; then echo "PASS"; else echo "FAIL (exit $rc): see correctness.log"; fi
  echo
  echo "- $cases compared cases; worst relative L2 $worst (bound 1/512 = 0.00195; a flip may reach 1/128 = 0.0078), worst cosine $worstcos (bound 0.9999)"
  echo "- rows above 1/512 (activation-rounding flips): $flips${strict:+ (--strict: none allowed)}"
  echo "- fixture and generated-model layers compared: $fixt"
  [ -n "$skipped" ] && echo "- skipped: $skipped"
  echo
  echo '```'
  grep -E '^(--- |    --- )(PASS|FAIL)' "$out/correctness.log" | grep -v '^    ' | head -40
  grep -E 'worst rel L2' "$out/correctness.log" | sort -t' ' -k7 -g | tail -3 | sed 's/^ *//'
  echo '```'
  echo
} >>"$report"
[ $rc = 0 ] || status=1

# 3. A swarm decode served by a Vulkan worker.
if [ -x "$bin/dispatch.test" ]; then
  echo "gpu-check: swarm decode (backbone/dispatch)" >&2
  (cd "$disp_dir" && "$bin/dispatch.test" -test.run 'TestVulkanWorkerDecode|TestVulkanProvisionedWorker' -test.v -test.count=1 -test.timeout 10m) >"$out/swarm.log" 2>&1
  rc=$?
  {
    echo "## Swarm decode served by a Vulkan worker"
    echo
    if [ $rc = 0 ]; then echo "PASS"; else echo "FAIL (exit $rc): see swarm.log"; fi
    echo
    echo '```'
    grep -E '^(--- |    --- )(PASS|FAIL|SKIP)|logits cosine|tokens \[' "$out/swarm.log" | grep -v 'INFO' | sed 's/^ *//' | cut -c1-220 | head -30
    echo '```'
    echo
  } >>"$report"
  [ $rc = 0 ] || status=1
fi

# 4. Benchmark.
bt=2s
[ -n "$software" ] && bt=1x
[ -n "$quick" ] && bt=1x
echo "gpu-check: benchmark (benchtime $bt)" >&2
"$vt" -test.run '^$' -test.bench 'BenchmarkDeviceBandwidth|BenchmarkExpertsBatch|BenchmarkExperts$' -test.benchtime "$bt" \
  -test.timeout 30m >"$out/bench.log" 2>&1
rc=$?
nominal=${KVASIR_GPU_BANDWIDTH_GBS:-}
{
  echo "## Benchmark"
  echo
  [ $rc = 0 ] || echo "FAILED (exit $rc): see bench.log"
  echo "Command: vulkan.test -test.bench 'BenchmarkDeviceBandwidth|BenchmarkExpertsBatch|BenchmarkExperts\$' -test.benchtime $bt (device $pick)"
  echo
  copy=$(awk '/^BenchmarkDeviceBandwidth/ { for (i = 2; i < NF; i++) if ($(i+1) == "copy-GB/s") printf "%.1f", $i }' "$out/bench.log")
  [ -n "$copy" ] && echo "Device copy bandwidth (bytes read + written): $copy GB/s${nominal:+; nominal: $nominal GB/s}" && echo
  awk -v nominal="$nominal" '
    /^Benchmark/ {
      name = $1; sub(/-[0-9]+$/, "", name); sub(/^Benchmark/, "", name)
      rows = ""; gbs = ""; frac = ""; copy = ""; ms = ""
      for (i = 2; i < NF; i++) {
        if ($(i+1) == "ns/op") ms = sprintf("%.3f", $i / 1e6)
        if ($(i+1) == "rows/s") rows = sprintf("%.0f", $i)
        if ($(i+1) == "weight-GB/s") gbs = sprintf("%.3f", $i)
        if ($(i+1) == "bw-frac") frac = sprintf("%.3f", $i)
        if ($(i+1) == "copy-GB/s") copy = sprintf("%.1f", $i)
      }
      if (copy != "") next
      if (!hdr) {
        printf "| benchmark | ms/call | rows/s | weight GB/s | of copy bandwidth |%s\n", (nominal != "" ? " of " nominal " GB/s nominal |" : "")
        printf "|---|---:|---:|---:|---:|%s\n", (nominal != "" ? "---:|" : "")
        hdr = 1
      }
      nf = (nominal != "" && gbs != "" && name ~ /vulkan/) ? sprintf(" %.3f |", gbs / nominal) : (nominal != "" ? " |" : "")
      printf "| %s | %s | %s | %s | %s |%s\n", name, ms, rows, gbs, frac, nf
    }' "$out/bench.log"
  echo
  goal=$(awk '/^BenchmarkExpertsBatch\/Q4_K\/.*\/vulkan/ { for (i = 2; i < NF; i++) if ($(i+1) == "bw-frac") { if (m == "" || $i + 0 < m) m = $i + 0 } } END { print m }' "$out/bench.log")
  if [ -n "$goal" ]; then
    verdict=$(awk -v g="$goal" 'BEGIN { print (g >= 0.5 ? "met" : "not met") }')
    echo "Goal (>= 0.5 of the memory bandwidth on Q4_K expert matmuls at 64 rows and more): lowest fraction $goal — $verdict${software:+ (a software driver: not a speed reference)}"
  fi
  echo
} >>"$report"
[ $rc = 0 ] || status=1

echo "Logs: $out/{devices,correctness,swarm,bench}.log" >>"$report"
cat "$report"
exit $status
