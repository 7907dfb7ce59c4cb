#!/usr/bin/env bash
# The cluster suite (tests/cluster/): several real `exo serve` daemons on
# loopback, and in network namespaces joined by a bridge when run as root
# (cluster.test.mjs; distributed.test.mjs: one model split across them;
# failures.test.mjs: instances that fail, stall or lose their node;
# eventlog.test.mjs: the log compacted behind snapshots, a late joiner).
# Driven by node:test with the npm API clients from tests/package-lock.json.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/node_suite.sh
: "${EXO_BIN:=$PWD/build/exo}"
export EXO_BIN
[ -x "$EXO_BIN" ] || { echo "FAIL no binary at $EXO_BIN"; echo "0 passed, 1 failed"; exit 1; }
for p in openai @anthropic-ai/sdk ollama; do
  [ -f "tests/node_modules/$p/package.json" ] || { echo "FAIL missing npm package $p (run scripts/setup.sh)"; echo "0 passed, 1 failed"; exit 1; }
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout -k 10 1500 node --test --test-concurrency=1 --test-reporter=./tests/e2e/reporter.mjs tests/cluster/cluster.test.mjs \
  tests/cluster/distributed.test.mjs tests/cluster/downloads.test.mjs tests/cluster/failures.test.mjs \
  tests/cluster/eventlog.test.mjs >"$out" 2>&1
rc=$?
cat "$out"
node_suite_result "$out" "$rc"
