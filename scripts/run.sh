#!/usr/bin/env bash
# README command 1: install, build, and start exo with the given arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec ./build/exo "$@"
