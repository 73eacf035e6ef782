#!/usr/bin/env bash
# scripts/arm64-swarm.sh [QEMU] — an arm64 worker process serves an amd64
# backbone, and the logits are compared bit for bit.
#
# On loopback: `backbone generate` (this machine's arch) with a dispatch
# listener, a hub (SQLite ledger) and a TLS gateway (self-signed), and a
# `backbone worker` built for linux/arm64 (CGO_ENABLED=0: NEON kernels)
# run under qemu-aarch64 user-mode emulation, holding every expert of the
# model. The decode must take every expert output from the arm64 worker
# (experts_local = 0, experts_remote = rows x layers x k), the dispatcher's
# spot checks (exact bits for a CPU worker) must not reject it, and the
# greedy tokens and the SHA-256 of every logit must equal a local decode of
# the same model on this machine. Models: the llama.cpp qwen35moe fixture
# (Q4_K_M) when ../shared/fixtures has it, and a generated qwen3moe Q4_K_M
# (backbone genmodel --preset tiny).
#
# QEMU defaults to qemu-aarch64-static on PATH; without it the script
# skips with a message (exit 0). Takes about 1-3 minutes under emulation.
set -euo pipefail
cd "$(dirname "$0")/.."

qemu=${1:-$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)}
if [ -z "$qemu" ]; then
  echo "SKIP arm64 swarm: qemu-aarch64-static not found (apt-get install qemu-user-static)"
  exit 0
fi

tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT

echo "  building backbone for $(go env GOOS)/$(go env GOARCH) and (CGO_ENABLED=0) linux/arm64"
go build -o "$tmp/backbone" ./backbone
GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go build -o "$tmp/backbone-arm64" ./backbone

# await FILE REGEX SECONDS: print the first match of REGEX's group 1 in FILE.
await() {
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    if grep -qE "$2" "$1" 2>/dev/null; then
      sed -nE "s/.*$2.*/\1/p" "$1" | head -n1
      return 0
    fi
    sleep 0.1
  done
  echo "arm64-swarm: timed out waiting for /$2/ in $1:" >&2
  cat "$1" >&2
  return 1
}

# field JSON NAME: a top-level number, string or array of numbers of a
# one-line JSON object (generate --json's output).
field() { sed -nE 's/.*"'"$2"'":("([^"]*)"|\[[^]]*\]|[0-9]+).*/\1/p' <<<"$1" | tr -d '"'; }

# check NAME MODEL PROMPT
check() {
  local name=$1 model=$2 prompt=$3 d=$tmp/$1
  mkdir -p "$d"
  echo "  $name: slicing every layer, local decode on $(go env GOARCH)"
  "$tmp/backbone" slice --model "$model" --layers all --out "$d/slice" >/dev/null
  local args=(generate --model "$model" --prompt "$prompt" --max-tokens 8 --temperature 0 --json --threads 1)
  local local_json
  local_json=$("$tmp/backbone" "${args[@]}" 2>"$d/local.log" | grep '^{')

  "$tmp/backbone" "${args[@]}" --dispatch-listen 127.0.0.1:0 --wait-workers 1 --wait-timeout 300s \
    --min-deadline 60s --ban-file "" >"$d/swarm.json" 2>"$d/generate.log" &
  local gen=$!
  pids+=("$gen")
  local disp hub gw
  disp=$(await "$d/generate.log" 'dispatch listening on ([0-9.:]+)' 120)
  "$tmp/backbone" hub --listen 127.0.0.1:0 --backbone "$disp" --ledger "$d/ledger.sqlite" \
    --secret-file "$d/secret" --create-secret 2>"$d/hub.log" &
  pids+=($!)
  hub=$(await "$d/hub.log" 'hub: listening on ([0-9.:]+),' 30)
  "$tmp/backbone" gateway --listen 127.0.0.1:0 --hub "$hub" --self-signed-out "$d/tls" \
    --secret-file "$d/secret" 2>"$d/gateway.log" &
  pids+=($!)
  gw=$(await "$d/gateway.log" 'gateway: listening on ([0-9.:]+) ' 30)
  echo "  $name: arm64 worker under $(basename "$qemu") -> wss://$gw -> hub $hub -> backbone $disp"
  "$qemu" "$tmp/backbone-arm64" worker --gateway "wss://$gw" --slice "$d/slice" --ca "$d/tls/gateway.crt" \
    --key "$d/worker.key" --threads 2 >"$d/worker.log" 2>&1 &
  pids+=($!)
  if ! wait "$gen"; then
    echo "arm64-swarm: $name: the swarm decode failed:" >&2
    tail -n 20 "$d/generate.log" "$d/worker.log" >&2
    return 1
  fi
  local swarm_json
  swarm_json=$(grep '^{' "$d/swarm.json")
  local lt st ll sl remote loc
  lt=$(field "$local_json" tokens); st=$(field "$swarm_json" tokens)
  ll=$(field "$local_json" logits_sha256); sl=$(field "$swarm_json" logits_sha256)
  remote=$(field "$swarm_json" experts_remote); loc=$(field "$swarm_json" experts_local)
  echo "  $name: tokens $st; logits sha256 arm64-swarm ${sl:0:16}… local ${ll:0:16}…; experts remote $remote, local $loc"
  if [ "$lt" != "$st" ] || [ "$ll" != "$sl" ] || [ -z "$sl" ] || [ "$loc" != 0 ] || [ "${remote:-0}" = 0 ]; then
    echo "arm64-swarm: FAIL: $name: the arm64 worker's decode differs from the local one (or was not all remote)" >&2
    tail -n 20 "$d/generate.log" "$d/worker.log" >&2
    return 1
  fi
}

status=0
fixture=../shared/fixtures/qwen35moe/tiny-qwen35moe-Q4_K_M.gguf
if [ -f "$fixture" ]; then
  check qwen35moe-fixture "$fixture" "The capital of France is" || status=1
else
  echo "  SKIP qwen35moe fixture: $fixture absent"
fi
"$tmp/backbone" genmodel --preset tiny --type Q4_K_M --seed 7 --out "$tmp/gen.gguf" >/dev/null
check generated-qwen3moe "$tmp/gen.gguf" "Workers anywhere" || status=1
[ "$status" = 0 ] && echo "arm64-swarm: ok (bit-identical logits from an arm64 worker)"
exit "$status"
