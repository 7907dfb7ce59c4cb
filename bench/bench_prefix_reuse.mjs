// Prefix reuse through the daemon: time to first token of a request whose
// prompt shares a long prefix with an earlier one, against the earlier
// one's and against an unrelated prompt of the same length, all in this
// run. A benchmark, not a test: it prints the times and their ratios
// (issue 16's goal: the shared-prefix request within 10% of the first).
//
//   node bench/bench_prefix_reuse.mjs [PRESET [PREFIX_TOKENS]]
//
// PRESET (default qwen3-0.6b) is built with `exo synth-model --quant q4`
// and the byte-level tokenizer and Qwen3 chat template of the end-to-end
// tests, so a prompt of N ASCII letters is about N tokens. EXO_BIN selects
// the binary (default build/exo), EXO_BENCH_THREADS the runner's threads
// (default: every core).
import fsp from 'node:fs/promises';
import * as D from '../tests/e2e/daemon.mjs';
import { text, startSynthDaemon, BENCH_THREADS } from './synth_daemon.mjs';

const preset = process.argv[2] || 'qwen3-0.6b';
const prefixTokens = Number(process.argv[3] || 2000);

async function ttft(base, model, prompt) {
  const t0 = performance.now();
  const s = await D.openStream(base, '/v1/chat/completions', {
    model, messages: [{ role: 'user', content: prompt }], max_tokens: 2, temperature: 0, stream: true,
    stream_options: { include_usage: true }, logprobs: true,
  });
  // a chunk per token once logprobs are asked for, even for a token whose
  // text is empty (the synthetic model's ids past the small tokenizer's)
  await s.until((b) => /"logprob":/.test(b), 600000);
  const ms = performance.now() - t0;
  await s.rest();
  const usage = D.parseSse(s.text).filter((e) => e.data && e.data !== '[DONE]').map((e) => JSON.parse(e.data))
    .find((e) => e.usage)?.usage;
  return { ms, prompt: usage?.prompt_tokens, cached: usage?.prompt_tokens_details?.cached_tokens };
}

const tmp = await D.tmpDir('exo-bench-prefix-');
let daemon;
try {
  let id;
  ({ daemon, id } = await startSynthDaemon(tmp, preset, { ctx: prefixTokens + 512 }));
  const prefix = text(prefixTokens, 1);
  const first = await ttft(daemon.base, id, `${prefix} What comes first?`);
  const shared = await ttft(daemon.base, id, `${prefix} And what comes next?`);
  const other = await ttft(daemon.base, id, `${text(prefixTokens, 2)} What comes first?`);
  console.log(`${preset} q4, ${BENCH_THREADS} threads, a ${prefixTokens}-token prefix`);
  const line = (name, r) => console.log(`${name.padEnd(28)} ${r.ms.toFixed(0).padStart(7)} ms to the first token ` +
    `(${r.prompt} prompt tokens, ${r.cached ?? 0} cached)`);
  line('first request', first);
  line('shared prefix', shared);
  line('unrelated prompt', other);
  console.log(`shared prefix / first: ${(shared.ms / first.ms).toFixed(3)} (goal <= 0.10); ` +
    `unrelated / first: ${(other.ms / first.ms).toFixed(3)}`);
} finally {
  if (daemon) await daemon.stop('SIGKILL');
  await fsp.rm(tmp, { recursive: true, force: true });
}
