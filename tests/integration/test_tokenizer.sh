#!/usr/bin/env bash
# Differential test of the C tokenizer against HF's Rust `tokenizers` (npm)
# on nine real tokenizer.json files, plus llama.cpp's vocab vectors, the
# `exo tokenize`/`exo detokenize` CLI, and a load-time guard.
#
# Per family: tests/tokenizer/oracle.js writes the expected ids/decodes for
# generated edge cases, every added token embedded in text, invalid UTF-8,
# and every paragraph of the corpora; tests/tokenizer/check.c (linked against
# the build's libexo.a) compares encode, encode with specials, decode, decode
# skipping specials, and the streaming detokenizer. Zero mismatches to pass.
#
# Data: tests/fixtures/tokenizer-vectors, tests/fixtures/corpora (see
# tests/fixtures/DATA.md); tokenizer.json files come from npm.
# env: EXO_BIN (default build/exo), BUILD (default: the folder of EXO_BIN),
#      TOKENIZER_FAMILIES.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 2
EXO_BIN=${EXO_BIN:-build/exo}
BUILD=${BUILD:-$(dirname "$EXO_BIN")}
FAMILIES=${TOKENIZER_FAMILIES:-qwen3 qwen2_5 llama3_2 llama3 gemma3 gptoss deepseek_v3 mistral_nemo llama2}
CACHE=tests/.cache/tokenizers
pass=0 fail=0
ok() { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }

if [ ! -f "$BUILD/libexo.a" ]; then bad "no $BUILD/libexo.a (set BUILD)"; finish; fi
if ! command -v npm >/dev/null || ! command -v node >/dev/null; then
  echo "test_tokenizer: node/npm not available; nothing to compare against"; finish
fi

# the checker, linked against the library under test
CHECK=$BUILD/tests/tokenizer/check
mkdir -p "$(dirname "$CHECK")"
if ! ${CC:-cc} -std=c17 -D_GNU_SOURCE -O2 -g -Isrc tests/tokenizer/check.c "$BUILD/libexo.a" -o "$CHECK" \
     $(pkg-config --cflags --libs jansson libpcre2-8 libutf8proc) -lm -pthread; then
  bad "building tests/tokenizer/check.c"; finish
fi

tests/tokenizer/fetch.sh $FAMILIES || bad "fetching tokenizers from npm (see above)"
if [ ! -d tests/node_modules/tokenizers ]; then
  (cd tests && { npm ci --no-audit --no-fund >/dev/null 2>&1 || npm install --no-audit --no-fund >/dev/null 2>&1; })
fi
[ -d tests/node_modules/tokenizers ] || { bad "npm package 'tokenizers' unavailable"; finish; }

CORPORA=()
CORPORA+=(tests/fixtures/corpora/tinyshakespeare.txt)
if tests/tokenizer/fetch.sh corpora >/dev/null 2>&1; then
  CORPORA+=(tests/.cache/corpora/moby-dick.txt tests/.cache/corpora/state-of-the-union-4th.txt)
fi

for name in $FAMILIES; do
  dir=$CACHE/$name
  [ -f "$dir/tokenizer.json" ] || { bad "$name: tokenizer.json missing"; continue; }
  cases=$dir/cases.jsonl
  if [ ! -s "$cases" ] || [ tests/tokenizer/oracle.js -nt "$cases" ] || [ "$dir/tokenizer.json" -nt "$cases" ] ||
     [ "$(cat "$dir/cases.corpora" 2>/dev/null)" != "${CORPORA[*]:-}" ]; then
    if ! node tests/tokenizer/oracle.js "$dir" "$cases.tmp" "${CORPORA[@]}"; then
      bad "$name: oracle"; continue
    fi
    mv "$cases.tmp" "$cases"
    echo "${CORPORA[*]:-}" > "$dir/cases.corpora"
  fi
  if out=$("$CHECK" oracle "$dir" "$cases" 2>&1); then ok "$(echo "$out" | tail -1)"; else bad "$name:"; echo "$out" | tail -40; fi
done

# llama.cpp vectors (no BOS): qwen2 for Qwen2.5/3, llama-bpe for Llama 3.x
VECTORS=tests/fixtures/tokenizer-vectors
if [ -d "$VECTORS" ]; then
  for pair in qwen2:qwen3 qwen2:qwen2_5 llama-bpe:llama3 llama-bpe:llama3_2; do
    v=${pair%%:*} name=${pair#*:}
    [ -f "$CACHE/$name/tokenizer.json" ] || continue
    if out=$("$CHECK" vectors "$CACHE/$name" "$VECTORS/$v.inp" "$VECTORS/$v.out" 2>&1); then
      ok "$name $(echo "$out" | tail -1)"
    else bad "$name vectors"; echo "$out" | tail -20; fi
  done
fi

# stories260K converted to a HF dir by `exo convert-llama2c` (SentencePiece-
# style BPE built from llama2.c's tok512.bin): the same oracle comparison,
# plus the golden prompt ids from tests/fixtures/stories260K/README.md
ST=$BUILD/stories260K-hf
S260=tests/fixtures/stories260K
if [ -x "$EXO_BIN" ]; then
  rm -rf "$ST"
  if "$EXO_BIN" convert-llama2c "$S260/stories260K.bin" "$S260/tok512.bin" "$ST" >/dev/null 2>&1; then
    if node tests/tokenizer/oracle.js "$ST" "$ST/cases.jsonl" "${CORPORA[@]}" &&
       out=$("$CHECK" oracle "$ST" "$ST/cases.jsonl" 2>&1); then ok "stories260K $(echo "$out" | tail -1)"
    else bad "stories260K oracle"; echo "${out:-}" | tail -40; fi
    got=$("$EXO_BIN" tokenize "$ST" --text "Once upon a time" 2>&1)
    [ "$got" = "1 403 407 261 378" ] && ok "stories260K: Once upon a time" || bad "stories260K: got '$got'"
  else
    echo "test_tokenizer: exo convert-llama2c unavailable or failed; stories260K skipped"
  fi
fi

# the CLI
if [ -x "$EXO_BIN" ] && [ -f "$CACHE/qwen3/tokenizer.json" ]; then
  want=$(cd tests && node -e '
    const {Tokenizer}=require("tokenizers");const t=Tokenizer.fromFile(process.argv[1]);
    t.encode("Hello, world! <|im_start|>user\n你好 🌍",null,{addSpecialTokens:false}).then(e=>console.log(JSON.stringify(e.getIds())))' \
    "../$CACHE/qwen3/tokenizer.json")
  got=$("$EXO_BIN" tokenize "$CACHE/qwen3" --text $'Hello, world! <|im_start|>user\n你好 🌍' --no-special --json)
  [ "$got" = "$want" ] && ok "exo tokenize --json" || bad "exo tokenize --json: got $got want $want"
  ids=$(echo "$got" | tr -d '[]')
  dec=$("$EXO_BIN" detokenize "$CACHE/qwen3" --ids "$ids")
  [ "$dec" = $'Hello, world! <|im_start|>user\n你好 🌍' ] && ok "exo detokenize" || bad "exo detokenize: got '$dec'"
  printf 'a b' > "$BUILD/tok_cli_input.txt"
  got=$("$EXO_BIN" tokenize "$CACHE/llama3_2" --file "$BUILD/tok_cli_input.txt")
  [ "$got" = "128000 64 293" ] && ok "exo tokenize --file (BOS added)" || bad "exo tokenize --file: got '$got'"
  "$EXO_BIN" tokenize /nonexistent --text x >/dev/null 2>&1; [ $? -eq 1 ] && ok "exo tokenize: missing dir fails" || bad "exo tokenize: missing dir"
fi

# load time: the budget is 150 ms for Qwen3 on an idle core; the guard is
# looser because CI machines are shared
if [ -f "$CACHE/qwen3/tokenizer.json" ]; then
  ms=$("$CHECK" load "$CACHE/qwen3" 5)
  if awk -v t="$ms" 'BEGIN { exit !(t < 400) }'; then ok "qwen3 load ${ms} ms"; else bad "qwen3 load ${ms} ms"; fi
fi
finish
