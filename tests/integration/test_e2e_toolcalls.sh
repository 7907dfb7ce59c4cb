#!/usr/bin/env bash
# End-to-end tool-call suite (tests/e2e/toolcalls.test.mjs): crafted bigram
# models (tests/e2e/crafted.mjs) whose greedy output is a tool call in each
# family's real markup (Qwen3.5 / Qwen3-Coder XML, Hermes JSON, GLM-4.6/4.7,
# Kimi K2, DeepSeek V3 / V3.1, GPT-OSS harmony, Llama 3 JSON; Gemma 3 as
# text), served by the real `exo serve` on loopback and read back through the
# official npm clients (openai, @anthropic-ai/sdk, ollama) as structured tool
# calls, streaming and not. The npm packages come from tests/package-lock.json
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
EXO_E2E_LOG_DIR=$logs timeout -k 10 300 node --test-reporter=./tests/e2e/reporter.mjs \
  tests/e2e/toolcalls.test.mjs >"$out" 2>&1
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
