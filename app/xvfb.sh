#!/usr/bin/env bash
# app/xvfb.sh [OUT.png] — open the real contributor window under Xvfb
# (inside a D-Bus session when dbus-run-session exists, so the tray path
# runs too), connected to a loopback swarm (app/swarmtest: TLS
# gateway, hub, ledger, crediting, dispatcher with load, a real node with
# an SQLite wallet), let it work, then screenshot the screen with
# ImageMagick's `import`, check it is not blank and shows non-zero
# throughput and pending KVR, and write the window's area to OUT.png
# (default: a temp file). KVASIR_XVFB_MODE=fake uses a fake backend
# instead of the swarm; KVASIR_XVFB_SECONDS sets the time before the shot
# (default 25: the worker's first ping RTT comes after 20 s).
# Needs: xvfb xauth imagemagick (dbus-x11 optional) and the Fyne build deps.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-$(mktemp --suffix=.png)}
shot=$(mktemp --suffix=.png)
export MESA_SHADER_CACHE_DIR=$(mktemp -d)
export KVASIR_XVFB_SHOT=$shot KVASIR_XVFB_SECONDS=${KVASIR_XVFB_SECONDS:-25}
if [ "${KVASIR_XVFB_MODE:-swarm}" = swarm ]; then export KVASIR_XVFB_SWARM=1; fi
run=(xvfb-run -a -s "-screen 0 1024x768x24" go test ./app/ -run '^$' -count=1 -v)
if command -v dbus-run-session >/dev/null; then
  dbus-run-session -- "${run[@]}"
else
  "${run[@]}"
fi
# The window is 900x640 at the top left of the 1024x768 screen (no window manager).
convert "$shot" -crop 900x640+0+0 +repage "$out"
rm -f "$shot"
rm -rf "$MESA_SHADER_CACHE_DIR"
echo "screenshot: $out"
