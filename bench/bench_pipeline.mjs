// A pipeline of two real daemons on loopback (one CPU thread each), its
// decoding requests going round as one group (EXO_PIPE_SPLIT=0) against two
// groups taking turns (the default), in this run (one, two, two, one):
// aggregate tokens/s at 1, 4 and 16 streams (wall clock, prefill of their
// short prompts included) and the ratio of the means. A benchmark, not a test (issue 16;
// bench_dist times the same schedule through the dist API alone, this the
// runner's, requests and all).
//
//   node bench/bench_pipeline.mjs [PRESET [TOKENS]]
//
// PRESET (default llama-3.2-1b) is built with `exo synth-model --quant q4`
// and the byte-level tokenizer of the end-to-end tests; its layers are
// split in halves. Each stream asks TOKENS (default 64) tokens from the
// /bench route (which ignores EOS). EXO_BIN selects the binary.
import os from 'node:os';
import path from 'node:path';
import fsp from 'node:fs/promises';
import crypto from 'node:crypto';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import * as C from '../tests/cluster/cluster.mjs';
import { text } from './synth_daemon.mjs';

const run = promisify(execFile);
const preset = process.argv[2] || 'llama-3.2-1b';
const tokens = Number(process.argv[3] || 64);
const STREAMS = [1, 4, 16];

async function ready(node, instanceId) {
  await C.until('the pipeline Ready', async () => {
    const st = await node.state();
    const inst = st.instances[instanceId] && Object.values(st.instances[instanceId])[0];
    return inst && Object.keys(inst.shardAssignments.runnerToShard)
      .every((rid) => st.runners[rid] && 'RunnerReady' in st.runners[rid]);
  }, 300000, 200);
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

async function measure(models, id, layers, split) {
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
    const rids = ids.map(() => crypto.randomUUID()), half = Math.floor(layers / 2);
    const range = [[0, half], [half, layers]];
    const instanceId = crypto.randomUUID();
    const inst = { MlxRingInstance: { instanceId, sharding: 'Pipeline', shardAssignments: {
      modelId: id, nodeToRunner: Object.fromEntries(ids.map((x, i) => [x, rids[i]])),
      runnerToShard: Object.fromEntries(rids.map((r, i) => [r, { PipelineShardMetadata: {
        modelCard: { modelId: id }, deviceRank: i, worldSize: 2, startLayer: range[i][0],
        endLayer: range[i][1], nLayers: layers, nodeId: ids[i] } }])) } } };
    const made = await C.postJson(nodes[0].base, '/instance', { instance: inst });
    if (made.status !== 200) throw new Error(`instance: ${made.status} ${made.text}`);
    await ready(nodes[0], instanceId);
    await streams(nodes[0].base, id, 2); // warm: scratch and caches made
    const out = {};
    for (const n of STREAMS)
      out[n] = await streams(nodes[0].base, id, n);
    return out;
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
  const layers = JSON.parse(await fsp.readFile(path.join(dir, 'config.json'), 'utf8')).num_hidden_layers;
  console.log(`${preset} q4 (random weights), a pipeline of 2 daemons on loopback, layers split ` +
    `${Math.floor(layers / 2)} + ${layers - Math.floor(layers / 2)}, 1 thread each, ${tokens} tokens a stream, ` +
    `${os.cpus().length} CPUs:`);
  // one, two, two, one: this host's memory speed drifts over minutes, and
  // the order cancels a steady drift
  const runs = [];
  for (const split of ['0', '', '', '0'])
    runs.push(await measure(models, id, layers, split));
  const f = (x) => x.toFixed(1).padStart(6);
  for (const n of STREAMS) {
    const one = (runs[0][n] + runs[3][n]) / 2, two = (runs[1][n] + runs[2][n]) / 2;
    console.log(`  ${String(n).padStart(2)} streams: one group ${f(runs[0][n])} ${f(runs[3][n])} tok/s, ` +
      `two groups taking turns ${f(runs[1][n])} ${f(runs[2][n])} tok/s = ${(two / one).toFixed(2)}x`);
  }
} finally {
  await fsp.rm(tmp, { recursive: true, force: true });
}
