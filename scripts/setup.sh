#!/usr/bin/env bash
# Installs everything exo needs to build, run and test on Debian 12, then
# builds. Idempotent: packages already present are not fetched again.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PKGS=(build-essential pkg-config ca-certificates
  libjansson-dev libpcre2-dev libutf8proc-dev libdnnl-dev
  libmicrohttpd-dev libcurl4-openssl-dev libssl-dev libuv1-dev libmsgpack-dev libzstd-dev libsodium-dev iproute2 curl
  libcriterion-dev clang-14 libclang-rt-14-dev python3-jinja2 python3-numpy nodejs npm)

missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
# nodejs/npm may come from elsewhere on the machine; only install if absent.
if command -v node >/dev/null && command -v npm >/dev/null; then
  tmp=(); for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || tmp+=("$p"); done
  missing=("${tmp[@]+"${tmp[@]}"}")
fi
if ((${#missing[@]})); then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# npm packages used by the tests as oracles (tokenizers, jinja, API clients).
if [ -f tests/package.json ] && [ ! -d tests/node_modules ] || \
   { [ -f tests/package-lock.json ] && [ tests/package-lock.json -nt tests/node_modules ]; }; then
  (cd tests && npm ci --no-audit --no-fund --loglevel=error)
fi

make -j"$(nproc)" >/dev/null
# The web dashboard (no npm dependencies): writes dashboard/dist, which the
# daemon serves at /.
(cd dashboard && npm run --silent build)
