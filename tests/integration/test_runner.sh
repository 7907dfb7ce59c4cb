#!/usr/bin/env bash
# `exo runner` is started by the daemon's supervisor (tests/unit/
# test_runner_supervisor.c drives real runners end to end); here only its
# command line: it refuses to start without a usable --fd, and it exits
# quietly when its socket is not a socket or is closed.
set -uo pipefail
cd "$(dirname "$0")/../.."
pass=0 fail=0
ok()  { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }

"$EXO_BIN" runner >/dev/null 2>&1; [ $? -eq 2 ] && ok "no --fd: exit 2" || bad "no --fd"
"$EXO_BIN" runner --fd 97 >/dev/null 2>&1; [ $? -eq 2 ] && ok "closed fd: exit 2" || bad "closed fd"
"$EXO_BIN" runner --fd x >/dev/null 2>&1; [ $? -eq 2 ] && ok "bad fd value: exit 2" || bad "bad fd value"
"$EXO_BIN" runner --fd 0 --bogus >/dev/null 2>&1; [ $? -eq 2 ] && ok "unknown flag: exit 2" || bad "unknown flag"
# stdin from /dev/null: not a socket, so the peer counts as gone at once
timeout 10 "$EXO_BIN" runner --fd 0 </dev/null >/dev/null 2>&1; rc=$?
[ $rc -eq 0 ] && ok "non-socket fd: exits 0" || bad "non-socket fd: rc=$rc"
"$EXO_BIN" --help | grep -q '^  runner ' && ok "listed as internal" || bad "not in help"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
