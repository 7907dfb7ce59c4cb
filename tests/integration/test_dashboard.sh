#!/usr/bin/env bash
# The web dashboard: its build and unit tests (dashboard/, node:test), then
# the daemon serving the built files: GET / is index.html, assets under
# /dashboard/ with their content types, and nothing outside the dashboard
# directory is reachable (traversal, hidden files, encoded dots).
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${EXO_BIN:=$PWD/build/exo}"
pass=0 fail=0
ok()  { pass=$((pass+1)); echo "ok   $1"; }
bad() { fail=$((fail+1)); echo "FAIL $1"; }

if out=$(cd dashboard && npm run --silent build 2>&1); then ok "npm run build"; else bad "npm run build: $out"; fi
if out=$(cd dashboard && npm test --silent 2>&1); then
  ok "dashboard unit tests ($(grep -Eo 'pass [0-9]+' <<<"$out" | tail -1))"
else
  bad "dashboard unit tests:"; echo "$out" | tail -30
fi

tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -rf "$tmp"' EXIT
echo "outside" > "$tmp/secret.txt"
EXO_DASHBOARD_DIR=$PWD/dashboard/dist "$EXO_BIN" serve --api-port 0 --host 127.0.0.1 \
  --data-dir "$tmp/data" --models-dir "$tmp/models" --no-worker --no-discovery --cluster-port 0 2>"$tmp/log" &
pid=$!
port=""
for _ in $(seq 100); do
  port=$(grep -o '127.0.0.1:[0-9]*' "$tmp/log" | head -1 | cut -d: -f2)
  [ -n "$port" ] && break
  sleep 0.05
done
[ -n "$port" ] || { bad "daemon did not start: $(cat "$tmp/log")"; echo "$pass passed, $fail failed"; exit 1; }
get() { curl -s --path-as-is -o "$tmp/body" -w '%{http_code} %{content_type}' "http://127.0.0.1:$port$1"; }

r=$(get /)
if [[ $r == "200 text/html"* ]] && cmp -s "$tmp/body" dashboard/dist/index.html; then ok "GET / serves index.html"
else bad "GET /: $r"; fi
for f in $(cd dashboard/dist && find . -type f ! -name index.html | sed 's|^\./||'); do
  r=$(get "/dashboard/$f")
  want=application/octet-stream
  case $f in *.js) want=text/javascript;; *.css) want=text/css;; *.html) want=text/html;; *.svg) want=image/svg+xml;; esac
  if [[ $r == "200 $want"* ]] && cmp -s "$tmp/body" "dashboard/dist/$f"; then ok "GET /dashboard/$f ($want)"
  else bad "GET /dashboard/$f: $r"; fi
done
for u in "/dashboard/../README.md" "/dashboard/%2e%2e/README.md" "/dashboard/..%2fREADME.md" \
         "/dashboard//index.html" "/dashboard/.gitignore" "/dashboard/" "/dashboard/nope.js" \
         "/dashboard/$(printf 'a%.0s' $(seq 300)).js"; do
  r=$(get "$u")
  if [[ $r == 404* ]] && ! grep -q "outside\|exo in C" "$tmp/body"; then ok "GET $u -> 404"
  else bad "GET $u -> $r"; fi
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
