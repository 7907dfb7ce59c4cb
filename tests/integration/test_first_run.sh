#!/usr/bin/env bash
# The first five minutes of a new user: in a fresh clone of this repository
# (what `git clone` gives: the committed files, no build), `./scripts/run.sh`
# with no arguments must build and start a daemon on port 52415 that lists
# stories260K, places it by itself and answers the README's first curl,
# offline and with nothing in the user's data dir. The daemon runs with a
# HOME of its own and a namespace of its own (no other exo on the LAN joins
# it). The Debian packages are installed already (set-up checks them); the
# tests' npm oracles are copied in so the clone's set-up needs no network
# (a user's set-up runs `npm ci` for them).
set -uo pipefail
cd "$(dirname "$0")/../.."
pass=0 fail=0
ok()  { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }
finish() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; exit $?; }
command -v curl >/dev/null || { bad "needs curl"; finish; }
if curl -s -m 2 -o /dev/null localhost:52415/ 2>/dev/null; then
  bad "port 52415 is taken by another daemon: stop it to run this test"; finish
fi
home=$(mktemp -d)
log=$home/run.log
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$home"
}
trap cleanup EXIT
repo=$PWD
if git -C "$repo" rev-parse --git-dir >/dev/null 2>&1; then
  git clone -q "$repo" "$home/exo" || { bad "git clone failed"; finish; }
  if [ -d "$repo/tests/node_modules" ]; then
    cp -a "$repo/tests/node_modules" "$home/exo/tests/" && touch "$home/exo/tests/node_modules"
  fi
  cd "$home/exo"
  ok "a fresh clone of HEAD ($(git rev-parse --short HEAD))"
fi
# Where no GPU answers, the clone builds without the CUDA plugin (CUDA=0):
# such a daemon could not load it anyway, the plugin's build is checked by
# the main build, and it is over half of this test's time on 2 cores.
no_gpu=()
nvidia-smi -L >/dev/null 2>&1 || no_gpu=(CUDA=0)
env -u EXO_MODELS_DIRS -u EXO_MODELS_READ_ONLY_DIRS -u EXO_HOME -u XDG_DATA_HOME -u XDG_CACHE_HOME \
  HOME="$home" EXO_NAMESPACE="first-run-$$-$RANDOM" "${no_gpu[@]}" ./scripts/run.sh >"$log" 2>&1 &
pid=$!
up=0
for _ in $(seq 1 1200); do # set-up and a full build first: up to 10 minutes
  if curl -s -m 2 -o /dev/null localhost:52415/v1/models; then up=1; break; fi
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.5
done
[ "$up" = 1 ] && ok "the daemon answers on port 52415" || { bad "no daemon on 52415: $(tail -5 "$log")"; finish; }
curl -s -m 5 localhost:52415/v1/models | grep -q '"karpathy/stories260K"' && ok "/v1/models lists stories260K" ||
  bad "/v1/models: $(curl -s -m 5 localhost:52415/v1/models | head -c 300)"
body='{"model": "karpathy/stories260K", "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 24}'
answer=
for _ in $(seq 1 120); do # the instance is placed at start: it loads in a few seconds
  answer=$(curl -s -m 30 localhost:52415/v1/chat/completions -H 'content-type: application/json' -d "$body")
  echo "$answer" | grep -q '"content"' && break
  sleep 0.5
done
text=$(echo "$answer" | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["message"]["content"])' 2>/dev/null)
[ -n "$text" ] && ok "the README's curl is answered: '${text:0:60}...'" || bad "no answer: ${answer:0:300}"
# it is a story, not noise: the trained model's greedy words
/usr/bin/python3 - "$answer" <<'PY' && ok "a completion with usage" || bad "usage missing"
import json, sys
r = json.loads(sys.argv[1])
u = r["usage"]
sys.exit(0 if u["completion_tokens"] > 0 and u["prompt_tokens"] > 0 else 1)
PY
grep -q -- '--place: placing karpathy/stories260K' "$log" && ok "placed by the daemon itself" || bad "not placed by --place"
finish
