// Requests admitted by the cache memory they need, under a KV budget,
// through the daemon: N requests at once, each a short prompt and a small
// max_tokens, on a runner whose budget holds BUDGET contexts. Prints how
// many ran side by side (a whole context each would allow floor(BUDGET))
// and how much the runner's resident memory grew over its idle size while
// they ran, against the budget. A benchmark, not a test: the figures are
// ratios (issue 16: admission by free KV memory, memory within the budget).
//
//   node bench/bench_kv_budget.mjs [PRESET [REQUESTS [BUDGET_CONTEXTS [SHARED]]]]
//
// PRESET (default llama-3.2-1b, q4 synthetic weights) at a context of 4096;
// REQUESTS (default 24) of about 200 prompt tokens and 64 generated;
// BUDGET_CONTEXTS (default 1.5); SHARED (default 0): every prompt starts
// with the same text of about that many tokens (a system prompt), before
// its own 200, so a request can share the pages of that prefix a running
// one computed (the paged KV cache). EXO_BATCH is set to REQUESTS. EXO_BIN
// selects the binary (default build/exo).
import os from 'node:os';
import fs from 'node:fs';
import * as D from '../tests/e2e/daemon.mjs';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { text } from './synth_daemon.mjs';

const run = promisify(execFile);

const preset = process.argv[2] || 'llama-3.2-1b';
const nReq = Number(process.argv[3] || 24);
const contexts = Number(process.argv[4] || 1.5);
const shared = Number(process.argv[5] || 0);
const CTX = 4096, MAX_TOKENS = 64;

const TOKEN = /"logprob":/g;
const count = (t) => (t.match(TOKEN) || []).length;

// resident bytes of a process (VmRSS)
function rss(pid) {
  const m = /VmRSS:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) * 1024 : 0;
}

// Bytes of caches a context of a dense model keeps: K and V in f32 of every
// layer's KV heads at each position (engine/model.c, exo_model_seq_bytes).
function contextBytes(dir) {
  const c = JSON.parse(fs.readFileSync(path.join(dir, 'config.json'), 'utf8'));
  const hd = c.head_dim || c.hidden_size / c.num_attention_heads;
  return 2 * c.num_hidden_layers * c.num_key_value_heads * hd * 4 * CTX;
}

const tmp = await D.tmpDir('exo-bench-kv-');
let daemon;
try {
  process.env.EXO_BATCH = String(nReq);
  const models = path.join(tmp, 'models');
  const { qwen } = await D.buildModels(models);
  const id = `exo-bench/${preset}`, dir = path.join(models, id.replace('/', '--'));
  await run(D.EXO_BIN, ['synth-model', preset, dir, '--quant', 'q4', '--tokenizer', qwen]);
  const perContext = contextBytes(dir);
  const budget = Math.floor(contexts * perContext);
  daemon = await D.startDaemon({ dataDir: path.join(tmp, 'data'), modelsDir: models, ctx: CTX,
    extra: ['--threads', String(os.availableParallelism()), '--kv-budget', String(budget)] });
  await D.placeInstance(daemon.base, id);
  const [runner] = D.runnerPids(daemon.pid);
  await D.sleep(500);
  const idle = rss(runner);
  let peak = idle;
  const sampler = setInterval(() => { try { peak = Math.max(peak, rss(runner)); } catch { /* gone */ } }, 10);
  const spans = [];
  const t0 = Date.now();
  await Promise.all(Array.from({ length: nReq }, async (_, i) => {
    const s = await D.openStream(daemon.base, '/v1/chat/completions', {
      model: id, messages: [{ role: 'user', content: (shared ? text(shared, 1) + '\n\n' : '') + text(200, 7 + i) }],
      max_tokens: MAX_TOKENS,
      temperature: 0, stream: true, logprobs: true });
    await s.until((b) => count(b) > 0, 600000);
    const first = Date.now();
    await s.rest();
    spans.push([first, Date.now()]);
  }));
  const wall = Date.now() - t0;
  clearInterval(sampler);
  // the most requests streaming at one moment
  const edges = spans.flatMap(([a, b]) => [[a, 1], [b, -1]]).sort((x, y) => x[0] - y[0] || x[1] - y[1]);
  let now = 0, most = 0;
  for (const [, d] of edges) most = Math.max(most, (now += d));
  const MB = (b) => (b / 1e6).toFixed(1);
  console.log(`model            ${preset} (q4), context ${CTX}: ${MB(perContext)} MB of caches a context`);
  console.log(`budget           ${MB(budget)} MB (${contexts} contexts): a context a request would run ` +
    `${Math.max(1, Math.floor(contexts))} at once`);
  console.log(`requests         ${nReq} of ${shared ? `~${shared} shared + ` : ''}~200 prompt + ${MAX_TOKENS} ` +
    `generated tokens: ${most} streamed side by ` +
    `side (x${(most / Math.max(1, Math.floor(contexts))).toFixed(1)}), all done in ${(wall / 1000).toFixed(1)} s`);
  console.log(`runner memory    grew ${MB(peak - idle)} MB over its idle ${MB(idle)} MB while they ran: ` +
    `${(100 * (peak - idle) / budget).toFixed(0)}% of the budget (caches, activations and scratch together)`);
} finally {
  if (daemon) await daemon.stop('SIGKILL');
  await fs.promises.rm(tmp, { recursive: true, force: true });
}
