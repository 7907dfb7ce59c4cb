#!/usr/bin/env bash
# Tokenizer benchmark: exo's C tokenizer vs HF's Rust `tokenizers` (npm) on
# the same text in the same run, single-threaded (RAYON_NUM_THREADS=1 for HF).
# Reports load time (best of 5) and encode throughput per tokenizer family:
# the whole file as one string, and paragraph by paragraph (split at blank
# lines, one encode call each: prompt-sized inputs), best of 3.
#
#   bench/bench_tokenizer.sh [FILE] [family...]     (BUILD=build by default)
#
# Needs the tokenizer files (tests/tokenizer/fetch.sh) and tests/node_modules.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
FILE=${1:-}
[ -n "$FILE" ] || FILE=tests/fixtures/corpora/tinyshakespeare.txt
[ -f "$FILE" ] || { echo "bench_tokenizer: no input file" >&2; exit 2; }
FILE=$(realpath "$FILE")
shift || true
FAMILIES=${*:-qwen3 llama3_2 gemma3 deepseek_v3}
BIN=$BUILD/bench/bench_tokenizer
mkdir -p "$(dirname "$BIN")"
${CC:-cc} -std=c17 -D_GNU_SOURCE -O2 -g -Isrc bench/bench_tokenizer.c "$BUILD/libexo.a" -o "$BIN" \
  $(pkg-config --libs jansson libpcre2-8 libutf8proc) -lm -pthread
tests/tokenizer/fetch.sh $FAMILIES >/dev/null
[ -d tests/node_modules/tokenizers ] || (cd tests && npm ci --no-audit --no-fund >/dev/null)
bytes=$(stat -c %s "$FILE")
echo "input: $FILE ($bytes bytes); machine load: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-13s %9s %9s %9s %9s %10s %10s %15s\n' family exo_load hf_load exo_MB/s hf_MB/s exo_para hf_para tokens
for name in $FAMILIES; do
  dir=tests/.cache/tokenizers/$name
  read -r _ c_load _ c_mbps _ c_tok _ _ _ c_para < <("$BIN" "$dir" "$FILE" 3)
  read -r h_load h_mbps h_tok h_para < <(cd tests && RAYON_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false node -e '
    const {Tokenizer}=require("tokenizers"); const fs=require("fs");
    const [tj, file] = process.argv.slice(1);
    const text=fs.readFileSync(file,"utf8"); const bytes=Buffer.byteLength(text);
    let load=1e9, t;
    for (let i=0;i<5;i++){ const t0=process.hrtime.bigint(); t=Tokenizer.fromFile(tj);
      load=Math.min(load, Number(process.hrtime.bigint()-t0)/1e6); }
    (async()=>{ let best=1e9, n=0;
      for (let i=0;i<3;i++){ const t0=process.hrtime.bigint();
        const e=await t.encode(text,null,{addSpecialTokens:false}); n=e.getIds().length;
        best=Math.min(best, Number(process.hrtime.bigint()-t0)/1e9); }
      const paras=[]; for (let p=0;p<text.length;){ let q=text.indexOf("\n\n",p); q=q<0?text.length:q+2; paras.push(text.slice(p,q)); p=q; }
      let pbest=1e9;
      for (let i=0;i<3;i++){ const t0=process.hrtime.bigint();
        await t.encodeBatch(paras,{addSpecialTokens:false});
        pbest=Math.min(pbest, Number(process.hrtime.bigint()-t0)/1e9); }
      console.log(load.toFixed(1), (bytes/best/1e6).toFixed(2), n, (bytes/pbest/1e6).toFixed(2)); })();' "../$dir/tokenizer.json" "$FILE")
  printf '%-13s %7sms %7sms %9s %9s %10s %10s %15s\n' "$name" "$c_load" "$h_load" "$c_mbps" "$h_mbps" "$c_para" "$h_para" "$c_tok/$h_tok"
done
