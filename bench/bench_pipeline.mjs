// A pipeline of two real daemons on loopback (one CPU thread each), its
// decoding requests going round as one group (EXO_PIPE_SPLIT=0) against two
// groups taking turns (the default), in this run (one, two, two, one):
// aggregate tokens/s at 1, 4 and 16 streams (wall clock, prefill of their
// short prompts included) and the ratio of the means; and how soon 8 new
// one-token requests are answered while 8 streams decode. A benchmark, not a test (issue 16;
// bench_dist times the same schedule through the dist API alone, this the
// runner's, requests and all).
//
//   node bench/bench_pipeline.mjs [PRESET [TOKENS]]
//
// PRESET (default llama-3.2-1b) is built with `exo synth-model --quant q4`
// and the byte-level tokenizer of the end-to-end tests; the daemons place
// it (/place_instance, a pipeline over both), so the last rank, which also
// reads the head, keeps fewer layers. Each stream asks TOKENS (default 64) tokens from the
// /bench route (which ignores EOS). EXO_BIN selects the binary.
import os from 'node:os';
import path from 'node:path';
import fsp from 'node:fs/promises';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import * as C from '../tests/cluster/cluster.mjs';
import { text } from './synth_daemon.mjs';

const run = promisify(execFile);
const preset = process.argv[2] || 'llama-3.2-1b';
const tokens = Number(process.argv[3] || 64);
const STREAMS = [1, 4, 16];

// the layer ranges of a Ready pipeline of `id` over both nodes
async function placed(node, id) {
  let ranges = null;
  await C.until('the pipeline Ready', async () => {
    const st = await node.state();
    for (const wrapped of Object.values(st.instances)) {
      const inst = Object.values(wrapped)[0];
      const shards = Object.values(inst.shardAssignments.runnerToShard || {});
      if (inst.shardAssignments.modelId !== id || shards.length !== 2) continue;
      if (!Object.keys(inst.shardAssignments.runnerToShard)
        .every((rid) => st.runners[rid] && 'RunnerReady' in st.runners[rid])) return false;
      ranges = shards.map((s) => Object.values(s)[0]).sort((a, b) => a.deviceRank - b.deviceRank)
        .map((s) => s.endLayer - s.startLayer);
      return true;
    }
    return false;
  }, 300000, 200);
  return ranges;
}

// tokens/s of n streams decoding together, their prompts short and apart
async function streams(base, model, n) {
  const t0 = Date.now();
  const all = await Promise.all(Array.from({ length: n }, (_, k) => C.D.postJson(base, '/bench/chat/completions', {
    model, messages: [{ role: 'user', content: text(24, 7 + k) }], max_tokens: tokens, temperature: 0 })));
  const seconds = (Date.now() - t0) / 1000;
  let made = 0;
  for (const r of all) {
    if (r.status !== 200) throw new Error(`bench: ${r.status} ${r.text}`);
    made += r.json.usage.completion_tokens;
  }
  return made / seconds;
}

// seconds until each of 8 new one-token requests is answered while 8
// streams decode (their prompts' chunks against the decoding groups)
async function busyFirstTokens(base, model) {
  const busy = Array.from({ length: 8 }, (_, k) => C.D.postJson(base, '/bench/chat/completions', {
    model, messages: [{ role: 'user', content: text(24, 100 + k) }], max_tokens: 4 * tokens, temperature: 0 }));
  await new Promise((resolve) => setTimeout(resolve, 3000)); // all 8 decoding
  const t0 = Date.now();
  const firsts = await Promise.all(Array.from({ length: 8 }, async (_, k) => {
    const r = await C.D.postJson(base, '/bench/chat/completions', {
      model, messages: [{ role: 'user', content: text(200, 200 + k) }], max_tokens: 1, temperature: 0 });
    if (r.status !== 200) throw new Error(`bench: ${r.status} ${r.text}`);
    return (Date.now() - t0) / 1000;
  }));
  for (const r of await Promise.all(busy))
    if (r.status !== 200) throw new Error(`bench: ${r.status} ${r.text}`);
  firsts.sort((a, b) => a - b);
  return { median: firsts[4], last: firsts[7] }; // the upper median of 8
}

async function measure(models, id, split) {
  process.env.EXO_PIPE_SPLIT = split;
  process.env.EXO_BATCH = String(Math.max(...STREAMS));
  const cl = new C.Cluster();
  try {
    const nodes = [await cl.start('a', { models }), await cl.start('b', { models })];
    await cl.converged(nodes);
    const ids = await Promise.all(nodes.map((n) => n.id()));
    await C.until('edges each way', async () => {
      const have = new Set((await nodes[0].state()).topology.connections.map((e) => `${e.source}>${e.sink}`));
      return have.has(`${ids[0]}>${ids[1]}`) && have.has(`${ids[1]}>${ids[0]}`);
    }, 20000);
    const made = await C.postJson(nodes[0].base, '/place_instance',
      { model_id: id, sharding: 'Pipeline', min_nodes: 2 });
    if (made.status !== 200) throw new Error(`place_instance: ${made.status} ${made.text}`);
    const layers = await placed(nodes[0], id);
    await streams(nodes[0].base, id, 2); // warm: scratch and caches made
    const out = {};
    for (const n of STREAMS)
      out[n] = await streams(nodes[0].base, id, n);
    const firsts = await busyFirstTokens(nodes[0].base, id);
    return { out, layers, firsts };
  } finally {
    await cl.stopAll();
  }
}

const tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'exo-bench-pipe-'));
try {
  const models = path.join(tmp, 'models');
  const { qwen } = await C.D.buildModels(models);
  const id = `exo-bench/${preset}`;
  const dir = path.join(models, id.replace('/', '--'));
  await run(C.EXO_BIN, ['synth-model', preset, dir, '--quant', 'q4', '--tokenizer', qwen]);
  // one, two, two, one: this host's memory speed drifts over minutes, and
  // the order cancels a steady drift
  const runs = [];
  for (const split of ['0', '', '', '0'])
    runs.push(await measure(models, id, split));
  console.log(`${preset} q4 (random weights), a pipeline of 2 daemons on loopback, layers split ` +
    `${runs.map((r) => r.layers.join(' + ')).join(', ')} (as placed), 1 thread each, ${tokens} tokens a stream, ` +
    `${os.cpus().length} CPUs:`);
  const f = (x) => x.toFixed(1).padStart(6);
  for (const n of STREAMS) {
    const [a, b, c, d] = runs.map((r) => r.out[n]);
    console.log(`  ${String(n).padStart(2)} streams: one group ${f(a)} ${f(d)} tok/s, ` +
      `two groups taking turns ${f(b)} ${f(c)} tok/s = ${((b + c) / (a + d)).toFixed(2)}x`);
  }
  const [a, b, c, d] = runs.map((r) => r.firsts);
  const g = (x) => `${x.median.toFixed(2)}/${x.last.toFixed(2)}`;
  console.log(`  8 new requests of 200 characters while 8 streams decode, seconds to each's one token, ` +
    `median (the 5th of 8)/last: one group ${g(a)} ${g(d)}, two groups ${g(b)} ${g(c)} = ` +
    `${((b.median + c.median) / (a.median + d.median)).toFixed(2)}x the median`);
} finally {
  await fsp.rm(tmp, { recursive: true, force: true });
}
