#!/usr/bin/env bash
# Checks that what phones and other machines run compiles there: the engine
# (with its NEON kernels), the worker, the wallet, the mobile API and the
# headless node for android/arm64 and ios/arm64 with cgo off (the pure-Go
# parts; a main package for iOS needs Xcode's external linker), darwin/arm64
# and linux/arm64. Without cgo the wallet links the pure-Go SQLite driver
# (modernc.org/sqlite), so phones keep the same wallet file as desktops.
set -euo pipefail
cd "$(dirname "$0")/.."
pkgs=(./engine/... ./mobile/ ./wallet/... ./app/node/ ./app/headless/ ./app/status/ ./app/limits/ ./app/instance/ ./app/autostart/)
for target in android/arm64 ios/arm64 darwin/arm64 linux/arm64 windows/amd64; do
  os=${target%/*}; arch=${target#*/}
  echo "  $target"
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch go build "${pkgs[@]}"
done
CGO_ENABLED=0 GOOS=linux GOARCH=arm64 go vet ./engine/...
# The headless server must build without the GUI libraries.
CGO_ENABLED=0 go build -o /dev/null ./backbone
CGO_ENABLED=0 go build -tags nogui -o /dev/null .
# A Termux-style worker: the headless binary for android/arm64 and linux/arm64, no cgo.
CGO_ENABLED=0 GOOS=android GOARCH=arm64 go build -tags nogui -o /dev/null .
CGO_ENABLED=0 GOOS=linux GOARCH=arm64 go build -tags nogui -o /dev/null .
