#!/usr/bin/env bash
# app/xvfb.sh [OUT.png] — open the real contributor window under Xvfb
# (inside a D-Bus session when dbus-run-session exists: a desktop with a
# session bus but no tray host, so closing the window must quit the app),
# as a first run (an empty config folder, the default gateway pointed at
# a loopback swarm: backbone/swarmtest's TLS gateway, hub, ledger, crediting,
# dispatcher with load; a real node with an SQLite wallet downloading its
# experts), let it work, then screenshot the screen with ImageMagick's
# `import`, check it is not blank and shows non-zero throughput, the live
# estimate and pending KVR, close the window and check the app quits, and
# write the window's area to OUT.png (default: a temp file).
# KVASIR_XVFB_WALLET_SHOT=FILE.png also shoots the wallet tab;
# KVASIR_XVFB_SETTINGS_SHOT=FILE.png the settings tab (and FILE_scrolled.png
# scrolled to "Compute on" when the window is too short to show it, and
# FILE_open.png with its list of devices open).
# KVASIR_XVFB_BACKEND=vulkan:0 makes the swarm mode's node compute on that
# device (lavapipe here: automatic never takes a software renderer).
# KVASIR_XVFB_MODE=fake uses a fake backend instead of the swarm;
# KVASIR_XVFB_SECONDS sets the time before the shot (default 45: the swarm's
# hub settles on its defaults, so credits follow the work by ~35 s);
# KVASIR_XVFB_SIZE=WxH the screen and window size (default 1280x800; the
# layout is also checked at 640x480).
# Needs: xvfb xauth imagemagick (dbus-x11 optional) and the Fyne build deps.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp --suffix=.png)}
shot=$(mktemp --suffix=.png)
export MESA_SHADER_CACHE_DIR=$(mktemp -d)
export GOENV=$(go env GOENV) GOPATH=$(go env GOPATH)
home=$(mktemp -d) # a new user: no saved settings, no identity, no wallet
export HOME=$home XDG_CONFIG_HOME=$home/.config XDG_RUNTIME_DIR=$home/run GOCACHE=$(go env GOCACHE) GOMODCACHE=$(go env GOMODCACHE)
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
size=${KVASIR_XVFB_SIZE:-1280x800}
export KVASIR_XVFB_SHOT=$shot KVASIR_XVFB_SECONDS=${KVASIR_XVFB_SECONDS:-45} KVASIR_XVFB_SIZE=$size
if [ "${KVASIR_XVFB_MODE:-swarm}" = swarm ]; then export KVASIR_XVFB_SWARM=1; fi
run=(xvfb-run -a -s "-screen 0 ${size}x24" go test ./app/ -run '^$' -count=1 -v)
if command -v dbus-run-session >/dev/null; then
  dbus-run-session -- "${run[@]}"
else
  "${run[@]}"
fi
# The window fills the screen from the top left (no window manager).
convert "$shot" -crop "${size}+0+0" +repage "$out"
rm -f "$shot"
rm -rf "$MESA_SHADER_CACHE_DIR" "$home"
echo "screenshot: $out"
