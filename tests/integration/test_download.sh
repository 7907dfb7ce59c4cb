#!/usr/bin/env bash
# The download suite (tests/download/): `exo download` and the daemon's
# downloads against the hub imitation (tests/hub/hub.mjs) with injected
# faults: resume after drops, stalls and interrupts, retries (5xx, 429),
# checksums, a full disk (as root: a small tmpfs), tokens and gated repos,
# offline mode, --layers, and the daemon's add / place / cancel / delete.
# Driven by node:test; no npm packages needed.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${EXO_BIN:=$PWD/build/exo}"
export EXO_BIN
# build/exo may be mid-rebuild: wait a while for it to appear (the suite
# itself waits until it stops changing and copies it)
for _ in $(seq 1 120); do [ -x "$EXO_BIN" ] && break; sleep 1; done
[ -x "$EXO_BIN" ] || { echo "FAIL no binary at $EXO_BIN"; echo "0 passed, 1 failed"; exit 1; }
command -v node >/dev/null || { echo "FAIL needs node"; echo "0 passed, 1 failed"; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout -k 10 600 node --test --test-concurrency=1 --test-reporter=./tests/e2e/reporter.mjs \
  tests/download/download.test.mjs >"$out" 2>&1
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
