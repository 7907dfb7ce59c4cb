#!/usr/bin/env bash
# README command 1: install, build, and start exo.
#
# With no arguments: the daemon on port 52415 with stories260K (the small
# trained model that ships in tests/fixtures) on disk and placed, so the
# dashboard's chat and the README's first curl answer at once, offline.
# With arguments: `exo` with those arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ $# -gt 0 ]; then
  exec ./build/exo "$@"
fi
models=build/models
stories=$models/karpathy--stories260K
if [ ! -f "$stories/config.json" ]; then
  mkdir -p "$models"
  rm -rf "$stories.tmp"
  ./build/exo convert-llama2c tests/fixtures/stories260K/stories260K.bin \
    tests/fixtures/stories260K/tok512.bin "$stories.tmp" >/dev/null
  # a Llama-2 style chat template (the checkpoint has none): a chat turn
  # becomes the opening of a story
  printf '%s' "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] | trim }}{% else %}{{ m['content'] }}{% endif %}{% endfor %}" \
    > "$stories.tmp/chat_template.jinja"
  mv "$stories.tmp" "$stories"
fi
exec ./build/exo --models-dir "$models" --place karpathy/stories260K
