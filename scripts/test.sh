#!/usr/bin/env bash
# README command 2: install what is missing, then build and run every test
# (unit, integration, ASan+UBSan, bounded fuzzing).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
make -j"$(nproc)" test
