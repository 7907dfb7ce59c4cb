#!/usr/bin/env bash
# The cluster suite (tests/cluster/): several real `exo serve` daemons on
# loopback, and in network namespaces joined by a bridge when run as root
# (cluster.test.mjs; distributed.test.mjs: one model split across them).
# Driven by node:test with the npm API clients from tests/package-lock.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${EXO_BIN:=$PWD/build/exo}"
export EXO_BIN
[ -x "$EXO_BIN" ] || { echo "FAIL no binary at $EXO_BIN"; echo "0 passed, 1 failed"; exit 1; }
for p in openai @anthropic-ai/sdk ollama; do
  [ -f "tests/node_modules/$p/package.json" ] || { echo "FAIL missing npm package $p (run scripts/setup.sh)"; echo "0 passed, 1 failed"; exit 1; }
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout -k 10 1500 node --test --test-concurrency=1 --test-reporter=./tests/e2e/reporter.mjs tests/cluster/cluster.test.mjs \
  tests/cluster/distributed.test.mjs tests/cluster/downloads.test.mjs >"$out" 2>&1
rc=$?
cat "$out"
line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n 1)
if [ "$rc" -ne 0 ]; then
  [ "$rc" -eq 124 ] && echo "FAIL the suite timed out"
  sed -n '/^failed:$/,/^[0-9]* passed, [0-9]* failed$/p' "$out" | grep -v -E '^[0-9]+ passed'
  if [ -z "$line" ] || [ "$(echo "$line" | awk '{print $3}')" -eq 0 ]; then
    line="$(echo "${line:-0 passed}" | awk '{print $1}') passed, 1 failed"
  fi
  echo "$line"
  exit 1
fi
[ -n "$line" ] || { echo "0 passed, 1 failed"; exit 1; }
