#!/usr/bin/env bash
# Differential test of `exo chat-template` against Python jinja2 (what
# transformers runs) and @huggingface/jinja: every real template in
# tests/fixtures/chat-templates and in the fetched tokenizer_config.json files, times
# generated conversations and flags, plus the language-feature corpus in
# tests/templates/features.txt. Byte-for-byte; see tests/templates/README.md.
#
# env: EXO_BIN (default build/exo), CHAT_TEMPLATE_WORK (scratch dir).
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
EXO_BIN=${EXO_BIN:-build/exo}
if [ ! -x "$EXO_BIN" ]; then echo "test_chat_templates: no exo binary at $EXO_BIN"; echo "0 passed, 1 failed"; exit 1; fi
if [ ! -x /usr/bin/python3 ] || ! /usr/bin/python3 -c 'import jinja2' 2>/dev/null; then
  echo "test_chat_templates: needs /usr/bin/python3 with jinja2 (Debian python3-jinja2)"; echo "0 passed, 1 failed"; exit 1
fi
TEMPLATES=tests/fixtures/chat-templates
tests/templates/fetch_configs.sh || echo "test_chat_templates: warning: some tokenizer configs could not be fetched"
NODE_FLAG=
if ! command -v node >/dev/null || [ ! -d tests/node_modules/@huggingface/jinja ]; then
  (cd tests && npm install --no-audit --no-fund >/dev/null 2>&1) || true
  [ -d tests/node_modules/@huggingface/jinja ] || { echo "test_chat_templates: @huggingface/jinja unavailable; jinja2 only"; NODE_FLAG=--no-node; }
fi
WORK=${CHAT_TEMPLATE_WORK:-}
if [ -z "$WORK" ]; then WORK=$(mktemp -d); trap 'rm -rf "$WORK"' EXIT; fi
/usr/bin/python3 tests/templates/run_diff.py "$EXO_BIN" "$TEMPLATES" tests/.cache/chat-configs "$WORK" $NODE_FLAG
