#!/usr/bin/env bash
# stories260K (Karpathy's tiny trained Llama, llama2.c format) converted with
# `exo convert-llama2c` must generate the golden greedy ids that llama2.c's
# own run.c produces (tests/fixtures/stories260K/README.md), from --tokens 1 and from
# --prompt "Once upon a time"; bad inputs to the converter must fail cleanly.
set -uo pipefail
cd "$(dirname "$0")/../.."
src=tests/fixtures/stories260K
pass=0 fail=0
ok()  { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if [ ! -f "$src/stories260K.bin" ]; then echo "no $src"; echo "0 passed, 1 failed"; exit 1; fi

"$EXO_BIN" convert-llama2c "$src/stories260K.bin" "$src/tok512.bin" "$tmp/s" && ok convert || bad convert
golden="403 407 261 378 432 383 286 261 376 298 315 421 395 317 426 338 401 396 267 337 410 408 419 292 411 322 265 282 295 433 426 385"
got=$("$EXO_BIN" run "$tmp/s" --tokens 1 --max-tokens 32 --print-ids --ignore-eos)
[ "$got" = "$golden" ] && ok "golden ids from --tokens 1" || bad "golden ids: got '$got'"

# The same story from the text prompt (tokenizer: "Once upon a time" = 1 403 407 261 378).
ids=$("$EXO_BIN" tokenize "$tmp/s" --text "Once upon a time" 2>/dev/null)
[ "$ids" = "1 403 407 261 378" ] && ok "tokenize prompt" || bad "tokenize prompt: '$ids'"
text=$("$EXO_BIN" run "$tmp/s" --prompt "Once upon a time" --max-tokens 28 --ignore-eos)
want=", there was a little girl named Lily. She loved to play outside in the park. One"
case "$text" in *"$want"*) ok "story text from --prompt";; *) bad "story text: '$text'";; esac

# --chat: the model has no chat template, so attach a Llama-2 style one (our
# own, for this test). The chat path must equal rendering the template with
# `exo chat-template`, tokenizing it without adding special tokens again, and
# generating from those ids.
printf '%s' "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] | trim }} [/INST]{% else %}{{ m['content'] }}{% endif %}{% endfor %}" > "$tmp/s/chat_template.jinja"
echo '[{"role":"user","content":"Once upon a time"}]' > "$tmp/msgs.json"
rendered=$("$EXO_BIN" chat-template "$tmp/s" --messages "$tmp/msgs.json" --add-generation-prompt)
[ "$rendered" = "<s>[INST] Once upon a time [/INST]" ] && ok "chat template rendered" || bad "chat template: '$rendered'"
chat_ids=$("$EXO_BIN" tokenize "$tmp/s" --text "$rendered" --no-special | tr -s ' \n' ',' | sed 's/,$//')
a=$("$EXO_BIN" run "$tmp/s" --chat "Once upon a time" --max-tokens 20 --print-ids --ignore-eos)
b=$("$EXO_BIN" run "$tmp/s" --tokens "$chat_ids" --max-tokens 20 --print-ids --ignore-eos)
[ -n "$a" ] && [ "$a" = "$b" ] && ok "--chat = template + tokenize + --tokens" || bad "--chat: '$a' vs '$b' (ids $chat_ids)"
rm "$tmp/s/chat_template.jinja"

# thread counts must not change greedy output
got1=$("$EXO_BIN" run "$tmp/s" --tokens 1 --max-tokens 32 --print-ids --ignore-eos --threads 1)
[ "$got1" = "$golden" ] && ok "1 thread" || bad "1 thread: $got1"

# seeded sampling is reproducible, and different seeds differ
a=$("$EXO_BIN" run "$tmp/s" --tokens 1 --max-tokens 40 --temperature 1 --seed 7 --print-ids --ignore-eos)
b=$("$EXO_BIN" run "$tmp/s" --tokens 1 --max-tokens 40 --temperature 1 --seed 7 --print-ids --ignore-eos)
c=$("$EXO_BIN" run "$tmp/s" --tokens 1 --max-tokens 40 --temperature 1 --seed 8 --print-ids --ignore-eos)
[ "$a" = "$b" ] && ok "same seed same output" || bad "same seed differs"
[ "$a" != "$c" ] && ok "other seed other output" || bad "seeds 7 and 8 agree"

# Stops at an end-of-sequence id. llama2.c separates stories with BOS (1),
# so with eos_token_id [2, 1] (the list form) generation ends after the
# first story; the ids printed must be exactly the greedy prefix before it.
all=$("$EXO_BIN" run "$tmp/s" --tokens 1 --max-tokens 400 --print-ids --ignore-eos)
cp -r "$tmp/s" "$tmp/eos"
sed -i 's/"eos_token_id": 2/"eos_token_id": [2, 1]/' "$tmp/eos/config.json"
got=$("$EXO_BIN" run "$tmp/eos" --tokens 1 --max-tokens 400 --print-ids)
n=$(echo "$got" | wc -w)
prefix=$(echo "$all" | tr ' ' '\n' | awk '$1 == 1 {exit} {print}' | tr '\n' ' ' | sed 's/ $//')
[ "$n" -lt 400 ] && [ "$got" = "$prefix" ] && ok "stops at eos list ($n tokens)" || bad "eos: got $n tokens"

# Broken inputs: clear errors, non-zero exit, no output directory content.
head -c 1000 "$src/stories260K.bin" > "$tmp/trunc.bin"
if "$EXO_BIN" convert-llama2c "$tmp/trunc.bin" "$src/tok512.bin" "$tmp/bad" 2>"$tmp/err"; then bad "truncated checkpoint accepted"
else grep -q "bytes" "$tmp/err" && [ ! -e "$tmp/bad/model.safetensors" ] && ok "truncated checkpoint rejected" || bad "truncated: $(cat "$tmp/err")"; fi
head -c 3000 "$src/tok512.bin" > "$tmp/trunc_tok.bin"
if "$EXO_BIN" convert-llama2c "$src/stories260K.bin" "$tmp/trunc_tok.bin" "$tmp/bad2" 2>"$tmp/err"; then bad "truncated tokenizer accepted"
else [ ! -e "$tmp/bad2/tokenizer.json" ] && [ ! -e "$tmp/bad2/config.json" ] && ok "truncated tokenizer rejected" || bad "truncated tokenizer left files"; fi
echo '{"model_type":' > "$tmp/s/config.json"
if "$EXO_BIN" run "$tmp/s" --tokens 1 --max-tokens 2 2>"$tmp/err"; then bad "broken config accepted"
else grep -q "config.json" "$tmp/err" && ok "broken config.json rejected: $(head -c 120 "$tmp/err")" || bad "config error unclear: $(cat "$tmp/err")"; fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
