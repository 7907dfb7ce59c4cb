#!/usr/bin/env bash
# Every benchmark under bench/ once, at its smallest size, so that a bench
# that no longer runs (a crash, an abort, a client API that moved) shows up
# here rather than when someone next runs it by hand (bench_api aborted at
# its first section for a week that way). Nothing here judges the numbers:
# they come from a shared machine; a bench's exit status says whether it
# ran. bench_api.sh and bench_download.sh exit 1 when a target is missed,
# which is a measurement, not a failure; any other status fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
: "${EXO_BIN:=$PWD/$BUILD/exo}"
export EXO_BIN BUILD
pass=0 fail=0
if ! make -s -j"$(nproc)" BUILD="$BUILD" bench >/dev/null; then
  echo "FAIL make bench"; echo "0 passed, 1 failed"; exit 1
fi
out=$(mktemp)
trap 'rm -f "$out"' EXIT

# smoke OK_STATUSES NAME COMMAND...: runs it (5 minutes at most), wants one
# of OK_STATUSES and some output
smoke() {
  local ok=$1 name=$2; shift 2
  local t0 rc
  t0=$(date +%s)
  timeout -k 5 300 "$@" >"$out" 2>&1
  rc=$?
  if [[ " $ok " == *" $rc "* ]] && [ -s "$out" ]; then
    pass=$((pass + 1)); echo "ok   $name ($(( $(date +%s) - t0 )) s)"
  else
    fail=$((fail + 1)); echo "FAIL $name: exit status $rc"; tail -n 15 "$out" | sed 's/^/     /'
  fi
}

B=$BUILD
smoke 0 bench_membw "$B/bench_membw" 2 1
smoke 0 bench_sampler "$B/bench_sampler" 5
smoke 0 bench_threadpool "$B/bench_threadpool" --rounds 1 --gen 4
smoke 0 bench_linear_attn "$B/bench_linear_attn" 2
smoke 0 bench_attention "$B/bench_attention" 2 512 2   # one context, 2 layers' caches
smoke 0 bench_matmul "$B/bench_matmul" 2 0.01 rows   # the batched GEMV; all sections take 25 s
smoke 0 bench_cuda_matmul "$B/bench_cuda_matmul" 0 1 1,8,16   # one line and status 0 without a GPU
smoke 0 bench_cuda_attention "$B/bench_cuda_attention" 0 512 2   # likewise
# bf16: tiny-llama's q4 columns cannot split two ways on a 64-wide group edge
smoke 0 bench_dist "$B/bench_dist" --synthetic tiny-llama --quant bf16 --gen-tokens 8 --prompt-tokens 8
smoke 0 bench_dist "$B/bench_dist" --synthetic tiny-llama --quant bf16 --device cuda --gen-tokens 8
smoke 0 bench_tokenizer.sh bench/bench_tokenizer.sh tests/fixtures/stories260K/README.md qwen3
smoke "0 1" bench_api.sh env SYNTH=0 bench/bench_api.sh --only latency
smoke "0 1" bench_download.sh env BENCH_DOWNLOAD_MB=32 BENCH_DOWNLOAD_FILES=2 bench/bench_download.sh
smoke 0 bench_busy_ttft.mjs node bench/bench_busy_ttft.mjs tiny-llama 4 64
smoke 0 bench_kv_budget.mjs node bench/bench_kv_budget.mjs tiny-llama 6 1.5
smoke 0 bench_prefix_reuse.mjs node bench/bench_prefix_reuse.mjs tiny-llama 300
smoke 0 bench_pipeline.mjs node bench/bench_pipeline.mjs tiny-llama 8
smoke 0 bench_events.mjs node bench/bench_events.mjs 2000
smoke 0 bench_cluster.mjs node bench/bench_cluster.mjs --events 500 --requests 20
smoke 0 bench_hostile.mjs bash -c 'ulimit -n 20000 2>/dev/null; BENCH_SECONDS=1 BENCH_FLOOD_CONNS=40 exec node bench/bench_hostile.mjs'

# every bench is above (a C bench with a script of its name runs through it):
# a new one must be added here
for f in bench/bench_*.c bench/bench_*.sh bench/bench_*.mjs; do
  n=$(basename "$f"); n=${n%.*}
  grep -qE "^smoke [0-9\" ]* $n(\.sh|\.mjs)? " "$0" || { fail=$((fail + 1)); echo "FAIL $f is not run by $0"; }
done
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
