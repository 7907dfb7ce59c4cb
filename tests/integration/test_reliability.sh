#!/usr/bin/env bash
# Reliability suite (tests/reliability/): the real `exo serve` on loopback
# under slowloris, body floods, amplifying bodies, ambiguous framing, idle
# connections and access control, while a normal client keeps being served.
# Attackers use source addresses 127.0.x.y, all loopback on Linux.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/node_suite.sh
: "${EXO_BIN:=$PWD/build/exo}"
export EXO_BIN
command -v node >/dev/null || { echo "FAIL node missing (run scripts/setup.sh)"; echo "0 passed, 1 failed"; exit 1; }
[ -x "$EXO_BIN" ] || { echo "FAIL no binary at $EXO_BIN"; echo "0 passed, 1 failed"; exit 1; }
# each attack holds up to ~1,700 sockets
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
out="$logs/out.txt"
timeout -k 10 420 node --test-reporter=./tests/e2e/reporter.mjs \
  tests/reliability/reliability.test.mjs >"$out" 2>&1
rc=$?
cat "$out"
node_suite_result "$out" "$rc"
