#!/usr/bin/env bash
# End-to-end API suite (tests/e2e/): starts the real `exo serve` on loopback
# with fixture models and drives it with the official npm clients (openai,
# @anthropic-ai/sdk, ollama) and raw HTTP. Greedy output through every API
# must equal `exo run`. The npm packages come from tests/package-lock.json
# (scripts/setup.sh runs `npm ci` in tests/); without them this test fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/node_suite.sh
: "${EXO_BIN:=$PWD/build/exo}"
export EXO_BIN

missing=""
command -v node >/dev/null || missing="node"
for p in openai @anthropic-ai/sdk ollama; do
  [ -f "tests/node_modules/$p/package.json" ] || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "FAIL missing:$missing (run scripts/setup.sh, or: cd tests && npm ci)"
  echo "0 passed, 1 failed"
  exit 1
fi
[ -x "$EXO_BIN" ] || { echo "FAIL no binary at $EXO_BIN"; echo "0 passed, 1 failed"; exit 1; }

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
out="$logs/out.txt"
# in-process (no --test runner child), so `timeout` reaches the process that owns the daemon
EXO_E2E_LOG_DIR=$logs timeout -k 10 600 node --test-reporter=./tests/e2e/reporter.mjs \
  tests/e2e/api.test.mjs >"$out" 2>&1
rc=$?
cat "$out"
if [ "$rc" -ne 0 ]; then
  if [ -f "$logs/daemon.log" ]; then
    echo "--- daemon log (tail)"; tail -n 20 "$logs/daemon.log"
  fi
  for f in "$logs"/exo_log/runner_log/*.log; do
    [ -s "$f" ] && { echo "--- $f (tail)"; tail -n 10 "$f"; }
  done
fi
node_suite_result "$out" "$rc"
