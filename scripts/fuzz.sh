#!/usr/bin/env bash
# Runs every fuzz target in the module for FUZZTIME each (default 15s).
# Crashers are written by `go test` to the package's testdata/fuzz/ and then
# stay as regression inputs of the ordinary test run.
set -euo pipefail
cd "$(dirname "$0")/.."
t=${FUZZTIME:-15s}
grep -rl --include='*_test.go' '^func Fuzz' . | xargs -n1 dirname | sort -u | while read -r dir; do
  for f in $(grep -h '^func Fuzz' "$dir"/*_test.go | sed 's/func \(Fuzz[A-Za-z0-9_]*\).*/\1/'); do
    echo "== $dir $f ($t)"
    go test -run '^$' -fuzz "^$f\$" -fuzztime "$t" "$dir"
  done
done
