#!/usr/bin/env bash
# The download suite (tests/download/): `exo download` and the daemon's
# downloads against the hub imitation (tests/hub/hub.mjs) with injected
# faults: resume after drops, stalls and interrupts, retries (5xx, 429),
# checksums, a full disk (as root: a small tmpfs), tokens and gated repos,
# offline mode, --layers, and the daemon's add / place / cancel / delete.
# Driven by node:test; no npm packages needed.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/node_suite.sh
: "${EXO_BIN:=$PWD/build/exo}"
export EXO_BIN
[ -x "$EXO_BIN" ] || { echo "FAIL no binary at $EXO_BIN"; echo "0 passed, 1 failed"; exit 1; }
command -v node >/dev/null || { echo "FAIL needs node"; echo "0 passed, 1 failed"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout -k 10 600 node --test --test-concurrency=1 --test-reporter=./tests/e2e/reporter.mjs \
  tests/download/download.test.mjs >"$out" 2>&1
rc=$?
cat "$out"
node_suite_result "$out" "$rc"
