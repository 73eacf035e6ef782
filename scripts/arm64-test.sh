#!/usr/bin/env bash
# scripts/arm64-test.sh [QEMU] — run the arm64 code paths: the tests of
# engine/quant (the NEON kernels, held to the pure-Go ones), engine/expert,
# engine/model (with the llama.cpp fixture comparisons), engine/wire,
# engine/worker and wallet (on the pure-Go SQLite driver) built for
# linux/arm64 with CGO_ENABLED=0 and run under qemu-aarch64 user-mode
# emulation; then an arm64 worker process serving an amd64 backbone with
# bit-identical logits (scripts/arm64-swarm.sh) and the modelgen golden
# hashes on arm64 (scripts/arm64-modelgen.sh).
#
# The runs use -test.short. Left out by that here: engine/model
# TestGeneratedTypes for 7 of its 9 weight types (Q8_0 and Q4_K_M run; the
# kernels of the others are held to the pure-Go ones by engine/quant's
# tests). Left out on purpose: wallet TestSecretService (the OS keyring
# over D-Bus, nothing arm64-specific; it runs natively). Everything else in
# these packages runs, including the crash test, whose child process is
# started through qemu (KVASIR_TEST_EXEC_WRAPPER).
#
# QEMU defaults to qemu-aarch64-static on PATH; without it the script
# skips with a message. About 5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

qemu=${1:-$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)}
if [ -z "$qemu" ]; then
  echo "SKIP arm64: qemu-aarch64-static not found (apt-get install qemu-user-static)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

status=0
run() { # run PKG [test flags...]
  local pkg=$1 name
  shift
  name=$(echo "$pkg" | tr / _)
  GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go test -c -o "$tmp/$name.test" "./$pkg"
  local t0=$SECONDS
  if (cd "$pkg" && KVASIR_TEST_EXEC_WRAPPER="$qemu" "$qemu" "$tmp/$name.test" -test.short -test.count=1 -test.timeout=15m "$@" \
    >"$tmp/$name.log" 2>&1); then
    echo "  ok   $pkg (linux/arm64, $((SECONDS - t0)) s)"
  else
    echo "  FAIL $pkg (linux/arm64):"
    tail -n 40 "$tmp/$name.log"
    status=1
  fi
}

echo "== linux/arm64 tests under $(basename "$qemu")"
run engine/quant
run engine/expert
run engine/model
run engine/wire
run engine/worker
run wallet -test.skip '^TestSecretService$'
run wallet/dbfile
run wallet/walletapi

echo "== an arm64 worker process serving an amd64 backbone"
bash scripts/arm64-swarm.sh "$qemu" || status=1

echo "== modelgen golden hashes on arm64"
bash scripts/arm64-modelgen.sh || status=1

exit "$status"
