#!/usr/bin/env bash
# Checks that the packages phones run compile for android/arm64 and ios/arm64
# with cgo off (the pure-Go parts), and that the engine vets for arm64 (NEON).
set -euo pipefail
cd "$(dirname "$0")/.."
pure=(./engine/...)
for d in engine/worker mobile; do
  if ls "$d"/*.go >/dev/null 2>&1; then pure+=("./$d/"); fi
done
for target in android/arm64 ios/arm64 darwin/arm64 linux/arm64; do
  os=${target%/*}; arch=${target#*/}
  echo "  $target: ${pure[*]}"
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go vet "${pure[@]}"
done
