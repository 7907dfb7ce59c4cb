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
