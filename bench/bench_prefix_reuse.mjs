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
// the binary (default build/exo).
import path from 'node:path';
import fsp from 'node:fs/promises';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import * as D from '../tests/e2e/daemon.mjs';

const preset = process.argv[2] || 'qwen3-0.6b';
const prefixTokens = Number(process.argv[3] || 2000);
const run = promisify(execFile);

// a prompt of n ASCII characters from a seed (each one token or so)
function text(n, seed) {
  let s = '', x = seed;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    s += i % 6 === 5 ? ' ' : String.fromCharCode(97 + (x >>> 16) % 26);
  }
  return s;
}

async function ttft(base, model, prompt) {
  const t0 = performance.now();
  const s = await D.openStream(base, '/v1/chat/completions', {
    model, messages: [{ role: 'user', content: prompt }], max_tokens: 2, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  await s.until((b) => /"content":"[^"]/.test(b), 600000);
  const ms = performance.now() - t0;
  await s.rest();
  const usage = D.parseSse(s.text).filter((e) => e.data && e.data !== '[DONE]').map((e) => JSON.parse(e.data))
    .find((e) => e.usage)?.usage;
  return { ms, prompt: usage?.prompt_tokens, cached: usage?.prompt_tokens_details?.cached_tokens };
}

const tmp = await D.tmpDir('exo-bench-prefix-');
let daemon;
try {
  const models = path.join(tmp, 'models');
  const { qwen } = await D.buildModels(models);
  const id = `exo-bench/${preset}`;
  await run(D.EXO_BIN, ['synth-model', preset, path.join(models, id.replace('/', '--')), '--quant', 'q4',
    '--tokenizer', qwen]);
  daemon = await D.startDaemon({ dataDir: path.join(tmp, 'data'), modelsDir: models,
    ctx: prefixTokens + 512 });
  await D.placeInstance(daemon.base, id);
  const prefix = text(prefixTokens, 1);
  const first = await ttft(daemon.base, id, `${prefix} What comes first?`);
  const shared = await ttft(daemon.base, id, `${prefix} And what comes next?`);
  const other = await ttft(daemon.base, id, `${text(prefixTokens, 2)} What comes first?`);
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
