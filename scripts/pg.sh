#!/usr/bin/env bash
# A throw-away PostgreSQL server for the tests of the money path on
# PostgreSQL (backbone/ledger, backbone/credit, backbone/pgstore).
#
#   eval "$(bash scripts/pg.sh start)"   # exports KVASIR_TEST_PG_DSN and KVASIR_TEST_PG_DIR
#   go test ./backbone/credit/ ...        # tests read KVASIR_TEST_PG_DSN, skip when it is unset
#   bash scripts/pg.sh stop "$KVASIR_TEST_PG_DIR"
#
# start: finds Debian's PostgreSQL server binaries (installs the `postgresql`
# package with apt when run as root and they are missing), runs initdb into a
# new temporary folder (as the `postgres` user when run as root: the server
# refuses to run as root), starts the server on a free port of 127.0.0.1 with
# its Unix socket in that folder, and prints the export lines. Trust
# authentication is safe here only because nothing but loopback can connect.
# When it cannot start a server it prints why on stderr, prints nothing on
# stdout and exits 3; the tests then skip with a message naming the variable.
#
# stop DIR: stops the server (fast shutdown) and removes DIR.
set -euo pipefail

die() { echo "pg.sh: $*" >&2; exit 3; }

find_bindir() {
  local d
  if command -v pg_config >/dev/null 2>&1; then
    d=$(pg_config --bindir 2>/dev/null || true)
    [ -x "$d/postgres" ] && [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  fi
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
    [ -x "$d/postgres" ] && [ -x "$d/initdb" ] && { echo "$d"; return 0; }
  done
  d=$(dirname "$(command -v initdb 2>/dev/null || echo /nonexistent/initdb)")
  [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ] && { echo "$d"; return 0; }
  return 1
}

start() {
  local bindir
  if ! bindir=$(find_bindir); then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "pg.sh: installing the postgresql package" >&2
      export DEBIAN_FRONTEND=noninteractive
      { apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql; } >&2 ||
        die "apt-get install postgresql failed"
      bindir=$(find_bindir) || die "postgresql installed but no server binaries found"
    else
      die "no PostgreSQL server binaries (install Debian's postgresql package: sudo apt-get install postgresql)"
    fi
  fi
  local dir run=()
  dir=$(mktemp -d "${TMPDIR:-/tmp}/kvasir-pg.XXXXXX")
  chmod 0755 "$dir"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || die "running as root and there is no postgres user to run the server as"
    chown postgres: "$dir"
    if command -v runuser >/dev/null; then run=(runuser -u postgres --); else run=(su postgres -s /bin/sh -c); fi
  fi
  as_server() {
    if [ "${run[0]:-}" = su ]; then "${run[@]}" "$(printf '%q ' "$@")"; elif [ ${#run[@]} -gt 0 ]; then "${run[@]}" "$@"; else "$@"; fi
  }
  as_server "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
    as_server "$bindir/initdb" -D "$dir/data" -U postgres --auth=trust -E UTF8 --no-locale >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; rm -rf "$dir"; die "initdb failed"; }
  local port ok=""
  for _ in $(seq 1 20); do
    port=$((20000 + RANDOM % 40000))
    if as_server "$bindir/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
      -o "-p $port -k $dir -c listen_addresses=127.0.0.1 -c max_connections=300 -c fsync=on -c synchronous_commit=on" \
      start >/dev/null 2>&1; then
      ok=1
      break
    fi
  done
  if [ -z "$ok" ]; then
    tail -20 "$dir/server.log" >&2 || true
    rm -rf "$dir"
    die "the server did not start"
  fi
  echo "export KVASIR_TEST_PG_DSN='postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable'"
  echo "export KVASIR_TEST_PG_DIR='$dir'"
  echo "pg.sh: PostgreSQL $("$bindir/postgres" --version | awk '{print $3}') on 127.0.0.1:$port, data in $dir" >&2
}

stop() {
  local dir=${1:-${KVASIR_TEST_PG_DIR:-}}
  [ -n "$dir" ] && [ -d "$dir/data" ] || die "stop: no server folder (${dir:-unset})"
  local bindir
  bindir=$(find_bindir) || die "no pg_ctl"
  if [ "$(id -u)" = 0 ]; then
    runuser -u postgres -- "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  else
    "$bindir/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  start) start ;;
  stop) stop "${2:-}" ;;
  *) echo "usage: $0 start | stop DIR" >&2; exit 2 ;;
esac
