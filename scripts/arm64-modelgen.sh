#!/usr/bin/env bash
# Checks that engine/modelgen writes byte-identical models on arm64: it
# cross-compiles the package's tests for linux/arm64 and runs the golden
# SHA-256 tests (TestGoldenSHA256, TestTinyIsGolden, TestNormalDraws) under
# qemu-aarch64 user-mode emulation, then (on an x86-64 host whose CPU has
# AVX2/FMA) once more built with GOAMD64=v3, where Go may also fuse x*y+z
# into FMA instructions. The hashes in engine/modelgen/golden_test.go are
# those of a plain amd64 build, so a pass means the same bytes everywhere.
#
# Needs qemu-aarch64-static (Debian: qemu-user-static); as root with apt-get
# it is installed, otherwise the arm64 run is skipped with a message.
# Takes about 2 minutes under emulation.
set -euo pipefail
cd "$(dirname "$0")/.."

tests='^(TestGoldenSHA256|TestTinyIsGolden|TestNormalDraws)$'

qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
if [ -z "$qemu" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "arm64-modelgen: installing qemu-user-static"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq --no-install-recommends qemu-user-static >/dev/null; }
  qemu=$(command -v qemu-aarch64-static || command -v qemu-aarch64 || true)
fi

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

status=0
if [ -n "$qemu" ]; then
  echo "== modelgen golden tests on linux/arm64 under $(basename "$qemu")"
  GOOS=linux GOARCH=arm64 CGO_ENABLED=0 go test -c -o "$tmp/modelgen.arm64.test" ./engine/modelgen
  (cd engine/modelgen && "$qemu" "$tmp/modelgen.arm64.test" -test.run "$tests" -test.count=1 -test.v) |
    grep -E '^(--- |ok|PASS|FAIL)|golden_test' || status=1
else
  echo "SKIP arm64: qemu-aarch64-static not found (install qemu-user-static)"
fi

if [ "$(go env GOHOSTARCH)" = amd64 ] && grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo &&
  grep -qw bmi2 /proc/cpuinfo && grep -qw movbe /proc/cpuinfo; then
  echo "== modelgen golden tests built with GOAMD64=v3 (FMA fusion allowed)"
  GOAMD64=v3 go test -count=1 -run "$tests" ./engine/modelgen || status=1
else
  echo "SKIP GOAMD64=v3: not an x86-64-v3 host"
fi

if [ "$status" != 0 ]; then
  echo "arm64-modelgen: FAIL: generated models differ from the amd64 golden hashes"
  exit 1
fi
echo "arm64-modelgen: ok"
