# Sourced by the integration scripts that run node:test files with
# tests/e2e/reporter.mjs: turns a run's output and exit status into the
# "N passed, N failed" line tests/integration/run.sh adds up. A timeout or a
# crash before the reporter's summary counts as a failure, and the failing
# tests are printed again last, where run.sh's tail shows them.
#
#   node --test ... >"$out" 2>&1; rc=$?; cat "$out"
#   node_suite_result "$out" "$rc"; exit $?
node_suite_result() {
  local out=$1 rc=$2 line
  line=$(grep -E '^[0-9]+ passed, [0-9]+ failed$' "$out" | tail -n 1)
  if [ "$rc" -ne 0 ]; then
    [ "$rc" -eq 124 ] && echo "FAIL the suite timed out"
    sed -n '/^failed:$/,/^[0-9]* passed, [0-9]* failed$/p' "$out" | grep -v -E '^[0-9]+ passed'
    if [ -z "$line" ] || [ "$(echo "$line" | awk '{print $3}')" -eq 0 ]; then
      line="$(echo "${line:-0 passed}" | awk '{print $1}') passed, 1 failed"
    fi
    echo "$line"
    return 1
  fi
  [ -n "$line" ] || { echo "0 passed, 1 failed"; return 1; }
  return 0
}

# Runs one end-to-end file against a daemon it starts (EXO_BIN), with the
# npm clients it needs, and prints the daemon's and runners' log tails when
# it fails:  run_api_suite tests/e2e/FILE.test.mjs TIMEOUT_S; exit $?
run_api_suite() {
  local file=$1 limit=$2 missing="" p logs out rc f
  : "${EXO_BIN:=$PWD/build/exo}"
  export EXO_BIN
  command -v node >/dev/null || missing="node"
  for p in openai @anthropic-ai/sdk ollama; do
    [ -f "tests/node_modules/$p/package.json" ] || missing="$missing $p"
  done
  if [ -n "$missing" ]; then
    echo "FAIL missing:$missing (run scripts/setup.sh, or: cd tests && npm ci)"
    echo "0 passed, 1 failed"
    return 1
  fi
  [ -x "$EXO_BIN" ] || { echo "FAIL no binary at $EXO_BIN"; echo "0 passed, 1 failed"; return 1; }
  logs=$(mktemp -d)
  out="$logs/out.txt"
  # in-process (no --test runner child), so `timeout` reaches the process that owns the daemon
  EXO_E2E_LOG_DIR=$logs timeout -k 10 "$limit" node --test-reporter=./tests/e2e/reporter.mjs \
    "$file" >"$out" 2>&1
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
  rc=$?
  rm -rf "$logs"
  return $rc
}
