#!/usr/bin/env bash
# Continuous batching through the API (tests/e2e/batching.test.mjs): random
# workloads of concurrent requests, cancels and disconnects; each request's
# output equals what it gives alone.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/node_suite.sh
run_api_suite tests/e2e/batching.test.mjs 600
