#!/usr/bin/env bash
# End-to-end API suite (tests/e2e/): starts the real `exo serve` on loopback
# with fixture models and drives it with the official npm clients (openai,
# @anthropic-ai/sdk, ollama) and raw HTTP. Greedy output through every API
# must equal `exo run`. The npm packages come from tests/package-lock.json
# (scripts/setup.sh runs `npm ci` in tests/); without them this test fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/node_suite.sh
run_api_suite tests/e2e/api.test.mjs 600
