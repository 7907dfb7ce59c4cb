#!/usr/bin/env bash
# End-to-end tool-call suite (tests/e2e/toolcalls.test.mjs): crafted bigram
# models (tests/e2e/crafted.mjs) whose greedy output is a tool call in each
# family's real markup (Qwen3.5 / Qwen3-Coder XML, Hermes JSON, GLM-4.6/4.7,
# Kimi K2, DeepSeek V3 / V3.1, GPT-OSS harmony, Llama 3 JSON; Gemma 3 as
# text), served by the real `exo serve` on loopback and read back through the
# official npm clients (openai, @anthropic-ai/sdk, ollama) as structured tool
# calls, streaming and not. The npm packages come from tests/package-lock.json
# (scripts/setup.sh runs `npm ci` in tests/); without them this test fails.
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/integration/node_suite.sh
run_api_suite tests/e2e/toolcalls.test.mjs 300
