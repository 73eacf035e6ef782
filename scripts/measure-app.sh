#!/usr/bin/env bash
# scripts/measure-app.sh [BIN] — the contributor window's resident memory
# (anonymous / file-backed) and CPU, connected to a loopback swarm
# (scripts/measure/swarm: backbone/swarmtest, hub on its defaults) under Xvfb
# with software GL: idle 20-35 s after start (connected, no work), then
# working (a load from 40 s) 60-75 s after start; --threads 1. It also
# measures the same worker without a window (--headless) and the smallest
# Fyne window (scripts/measure/hello), to tell what Fyne needs from what
# the worker holds. BIN defaults to a fresh `go build .`. Needs Xvfb.
# The machine's other load shows in the CPU figures: compare runs made
# one after the other.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
bin=${1:-$out/kvasir}
[ -n "${1:-}" ] || go build -o "$bin" .
go build -o "$out/swarm" ./scripts/measure/swarm
go build -o "$out/hello" ./scripts/measure/hello
measure() { # label args...
  local label=$1; shift
  local disp=:$((70 + RANDOM % 20)) tmp; tmp=$(mktemp -d)
  (
  export HOME=$tmp XDG_CONFIG_HOME=$tmp/.config XDG_RUNTIME_DIR=$tmp/run MESA_SHADER_CACHE_DIR=$tmp/mesa
  mkdir -p "$XDG_RUNTIME_DIR"; chmod 700 "$XDG_RUNTIME_DIR"
  Xvfb "$disp" -screen 0 1280x800x24 >/dev/null 2>&1 & xp=$!
  "$out/swarm" -dir "$tmp/swarm" -load-after 40s > "$tmp/swarm.out" 2>&1 & sp=$!
  for _ in $(seq 100); do [ -s "$tmp/swarm.out" ] && break; sleep 0.2; done
  read -r url ca < "$tmp/swarm.out"
  DISPLAY=$disp DBUS_SESSION_BUS_ADDRESS=unix:path=/nonexistent KVASIR_DEFAULT_GATEWAY=$url SSL_CERT_FILE=$ca \
    "$@" > "$tmp/app.log" 2>&1 & ap=$!
  tick() { awk '{print $14+$15}' "/proc/$ap/stat"; }
  mem() { grep -E 'VmRSS|RssAnon|RssFile' "/proc/$ap/status" | awk '{printf "%s %d MB  ", $1, $2/1000}'; }
  sample() {
    sleep $(( $1 - SECONDS )); local t0 t1; t0=$(tick); sleep $(( $2 - $1 )); t1=$(tick)
    echo "$label, $3: $(mem)CPU $(( (t1 - t0) * 100 / $(getconf CLK_TCK) / ($2 - $1) ))%"
  }
  SECONDS=0
  sample 20 35 "idle (connected, no work)"
  sample 60 75 "working (load)"
  kill $ap; wait $ap 2>/dev/null || true; kill -INT $sp; wait $sp 2>/dev/null || true; kill $xp; wait $xp 2>/dev/null || true
  )
  rm -rf "$tmp"
}
measure window "$bin" --threads 1
measure headless "$bin" --headless --threads 1
measure "smallest Fyne window" "$out/hello"
rm -rf "$out"
