#!/usr/bin/env bash
# Runs every integration test: tests/integration/test_*.sh and *.py with
# EXO_BIN pointing at the built binary. Each test prints its own
# 'N passed, N failed' line; this script sums them and fails if any failed.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${EXO_BIN:=$PWD/build/exo}"
export EXO_BIN
total_pass=0 total_fail=0
for t in tests/integration/test_*.sh tests/integration/test_*.py; do
  [ -e "$t" ] || continue
  echo "== $t"
  start=$(date +%s)
  out=$("$t" 2>&1); rc=$?
  echo "$out" | tail -n 40
  line=$(echo "$out" | grep -E '^[0-9]+ passed, [0-9]+ failed' | tail -n 1)
  p=$(echo "$line" | awk '{print $1}'); f=$(echo "$line" | awk '{print $3}')
  if [ -z "$line" ]; then p=0; f=1; echo "   (no result line)"; fi
  if [ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ]; then f=1; fi
  total_pass=$((total_pass + ${p:-0})); total_fail=$((total_fail + ${f:-0}))
  echo "   $t: rc=$rc, $(( $(date +%s) - start )) s"
done
echo "integration: $total_pass passed, $total_fail failed"
[ "$total_fail" -eq 0 ]
