#!/usr/bin/env bash
# Download throughput: `exo download` against curl fetching the same files
# from the same loopback hub (tests/hub/hub.mjs) in the same run, and the
# downloader's memory while it runs.
#
#   bench/bench_download.sh                 2 GiB in 4 safetensors files
#   BENCH_DOWNLOAD_MB=4096 BENCH_DOWNLOAD_FILES=8 bench/bench_download.sh
#
# The peers: curl --parallel (as many transfers at a time as exo runs), -L for
# the hub's LFS redirects, writing files; and the same followed by a sync of
# its files, since exo fsyncs every file before taking it as downloaded (a
# crash never leaves a complete-looking file that is not on disk). exo also
# hashes every byte (SHA-256); curl does not. Each side runs
# three times, alternating, after a sync, best run kept; the files are in the page cache for
# both. Memory: exo's resident set sampled every 50 ms; "flat" means the
# peak stays far below the bytes moved (it streams; nothing is buffered
# whole).
set -euo pipefail
cd "$(dirname "$0")/.."
: "${EXO_BIN:=$PWD/build/exo}"
MB=${BENCH_DOWNLOAD_MB:-2048}
FILES=${BENCH_DOWNLOAD_FILES:-4}
PAR=${BENCH_DOWNLOAD_PARALLEL:-$FILES}
[ -x "$EXO_BIN" ] || { echo "build exo first (make)"; exit 2; }

tmp=$(mktemp -d)
hub_pid=""
cleanup() { [ -n "$hub_pid" ] && kill "$hub_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

repo="$tmp/root/bench/big"
mkdir -p "$repo"
echo '{"model_type":"llama","num_hidden_layers":1,"hidden_size":8}' > "$repo/config.json"
per=$((MB / FILES))
for i in $(seq 1 "$FILES"); do
  head -c $((per << 20)) /dev/urandom > "$repo/model-$i.safetensors"
done
node tests/hub/hub.mjs --root "$tmp/root" --port 0 > "$tmp/hub.out" 2> "$tmp/hub.err" &
hub_pid=$!
for _ in $(seq 100); do grep -q port "$tmp/hub.out" 2>/dev/null && break; sleep 0.05; done
port=$(grep -o '[0-9][0-9]*' "$tmp/hub.out" | head -1)
base="http://127.0.0.1:$port"
# the hub hashes lazily: list once so neither side pays for it
curl -sf "$base/api/models/bench/big/tree/main?recursive=true" > /dev/null

# $1 = sync: the files are also synced to disk before the clock stops, the
# durability exo gives every file before it takes it as downloaded
run_curl() {
  rm -rf "$tmp/curl"; mkdir -p "$tmp/curl"
  local args=()
  for i in $(seq 1 "$FILES"); do
    args+=(-o "$tmp/curl/model-$i.safetensors" "$base/bench/big/resolve/main/model-$i.safetensors")
  done
  local t0 t1
  t0=$(date +%s.%N)
  curl -sfL --no-progress-meter --parallel --parallel-max "$PAR" "${args[@]}" 2>/dev/null
  [ "${1:-}" = sync ] && sync "$tmp"/curl/*
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

run_exo() {
  rm -rf "$tmp/exo"
  local t0 t1 pid rss
  t0=$(date +%s.%N)
  HF_ENDPOINT="$base" "$EXO_BIN" download bench/big --models-dir "$tmp/exo" --parallel "$PAR" --quiet \
    > /dev/null 2> "$tmp/exo.err" &
  pid=$!
  : > "$tmp/rss"
  while kill -0 "$pid" 2>/dev/null; do
    rss=$(awk '/VmRSS/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    [ -n "$rss" ] && echo "$rss" >> "$tmp/rss"
    sleep 0.05
  done
  wait "$pid" || { cat "$tmp/exo.err" >&2; exit 1; }
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}

best_curl=999999 best_sync=999999 best_exo=999999
for _ in 1 2 3; do
  # each run starts with no dirty pages of the previous one left to write
  sync; c=$(run_curl); sync; cs=$(run_curl sync); sync; e=$(run_exo)
  best_curl=$(echo "if ($c < $best_curl) $c else $best_curl" | bc)
  best_sync=$(echo "if ($cs < $best_sync) $cs else $best_sync" | bc)
  best_exo=$(echo "if ($e < $best_exo) $e else $best_exo" | bc)
done
cmp -s "$tmp/exo/bench--big/model-1.safetensors" "$repo/model-1.safetensors" || { echo "exo's copy differs"; exit 1; }
curl_mbs=$(echo "scale=1; $MB / $best_curl" | bc)
sync_mbs=$(echo "scale=1; $MB / $best_sync" | bc)
exo_mbs=$(echo "scale=1; $MB / $best_exo" | bc)
ratio=$(echo "scale=2; $exo_mbs / $curl_mbs" | bc)
ratio_sync=$(echo "scale=2; $exo_mbs / $sync_mbs" | bc)
peak_rss_kb=$(sort -n "$tmp/rss" | tail -1)
rss_samples=$(wc -l < "$tmp/rss")
rss_first=$(sed -n "$(( rss_samples / 10 + 1 ))p" "$tmp/rss")
rss_last=$(sed -n "$(( rss_samples * 9 / 10 + 1 ))p" "$tmp/rss")
echo "download $MB MiB in $FILES files, $PAR at a time, loopback hub:"
echo "  curl --parallel          ${curl_mbs} MiB/s  (best of 3; ends in the page cache)"
echo "  curl --parallel + sync   ${sync_mbs} MiB/s  (best of 3; on disk, as exo's files are)"
echo "  exo download             ${exo_mbs} MiB/s  (best of 3; sha256 + fsync included)"
echo "  ratio exo / curl+sync    ${ratio_sync}  (goal >= 0.9)"
echo "  ratio exo / curl         ${ratio}"
echo "  exo RSS (last run): peak $((peak_rss_kb / 1024)) MiB; at 10% of the run $((rss_first / 1024)) MiB, at 90% $((rss_last / 1024)) MiB ($rss_samples samples)"
