// Cluster benchmarks (real daemons on loopback; not a test: it prints
// figures, and says how they compare with the goals of the cluster issue).
//
//   agreement   seconds from spawning 5 daemons until all agree on one master
//               (goal: < 2 s)
//   failover    seconds from SIGKILL of the master until the 4 survivors
//               agree on a new one and hold one State without it (goal: < 3 s)
//   events      events per second the master orders and the slowest of 4
//               followers applies, driven through the master's API
//               (CreateInstance / DeleteInstance commands, InstanceCreated /
//               InstanceDeleted events), and the same load on a node alone:
//               the replication's cost as a ratio
//   routing     median latency of a 1-token chat request sent to the node
//               that runs the instance and to another node, and their
//               difference (goal: < 1 ms on loopback)
//
// Run: node bench/bench_cluster.mjs [--events N] [--requests N]
// (EXO_BIN selects the binary, default build/exo; npm packages from tests/).
import path from 'node:path';
import os from 'node:os';
import fsp from 'node:fs/promises';
import { performance } from 'node:perf_hooks';
import * as C from '../tests/cluster/cluster.mjs';

const arg = (name, dflt) => {
  const i = process.argv.indexOf(name);
  return i > 0 ? Number(process.argv[i + 1]) : dflt;
};
const N_EVENTS = arg('--events', 400);
const N_REQUESTS = arg('--requests', 60);
const ms = (x) => `${x.toFixed(1)} ms`;
const median = (v) => [...v].sort((a, b) => a - b)[Math.floor(v.length / 2)];

async function agreementAndFailover() {
  const cl = new C.Cluster();
  try {
    const t0 = performance.now();
    const nodes = await Promise.all(['a', 'b', 'c', 'd', 'e'].map((n) => cl.start(n)));
    const master = await cl.converged(nodes, 30000);
    const agree = performance.now() - t0;
    console.log(`agreement: 5 nodes agree on master ${master.slice(0, 8)} ${(agree / 1000).toFixed(2)} s after ` +
      `spawning them (goal < 2 s: ${agree < 2000 ? 'met' : 'MISSED'})`);
    await cl.sameState(nodes, 30000, (s) => Object.keys(s.nodeIdentities).length === 5);
    const ids = await Promise.all(nodes.map((n) => n.id()));
    const old = nodes[ids.indexOf(master)];
    const rest = nodes.filter((n) => n !== old);
    const t1 = performance.now();
    await old.stop('SIGKILL');
    await cl.converged(rest, 30000);
    const elected = performance.now() - t1;
    await cl.sameState(rest, 30000, (s) => !(master in s.nodeIdentities));
    const converged = performance.now() - t1;
    console.log(`failover: new master after ${(elected / 1000).toFixed(2)} s, one State without the old one ` +
      `after ${(converged / 1000).toFixed(2)} s (goal < 3 s: ${converged < 3000 ? 'met' : 'MISSED'})`);
    return { agree, elected, converged };
  } finally {
    await cl.stopAll();
  }
}

// Creates and deletes N single-shard instances through `via`'s API. They
// name a node that is not in the cluster, so no runner starts: the master
// deletes what the benchmark has not deleted yet within a second (an
// instance that lost its node). Returns the events per second applied by
// the slowest node, from the first command to the last event everywhere.
async function eventLoad(via, nodes) {
  const target = 'bench-absent-node';
  const idx = async (n) => (await n.get('/state/lastEventAppliedIdx'));
  const start = await idx(via);
  const t0 = performance.now();
  const ids = [];
  const inflight = 16;
  let next = 0;
  const create = async () => {
    while (next < N_EVENTS) {
      next++;
      const inst = { MlxRingInstance: { instanceId: crypto.randomUUID(), sharding: 'Pipeline',
        shardAssignments: { modelId: 'bench/absent', nodeToRunner: {}, runnerToShard: {} } } };
      const rid = crypto.randomUUID();
      const body = inst.MlxRingInstance;
      body.shardAssignments.nodeToRunner[target] = rid;
      body.shardAssignments.runnerToShard[rid] = { PipelineShardMetadata: { deviceRank: 0, worldSize: 1,
        startLayer: 0, endLayer: 1, nLayers: 1 } };
      const r = await C.postJson(via.base, '/instance', { instance: inst });
      if (r.status !== 200) throw new Error(`POST /instance: ${r.status} ${r.text}`);
      ids.push(body.instanceId);
    }
  };
  await Promise.all(Array.from({ length: inflight }, create));
  let k = 0;
  const del = async () => {
    while (k < ids.length) {
      const id = ids[k++];
      const r = await fetch(`${via.base}/instance/${id}`, { method: 'DELETE' });
      await r.text();
    }
  };
  await Promise.all(Array.from({ length: inflight }, del));
  await C.until('no instances left', async () => Object.keys((await via.state()).instances).length === 0,
    60000, 50);
  const end = await idx(via);
  await C.until('every node at the master\'s last event', async () =>
    (await Promise.all(nodes.map(idx))).every((i) => i >= end), 60000, 20);
  const secs = (performance.now() - t0) / 1000;
  return { events: end - start, secs, rate: (end - start) / secs };
}

async function events() {
  const alone = new C.Cluster();
  let single;
  try {
    const a = await alone.start('alone');
    single = await eventLoad(a, [a]);
  } finally {
    await alone.stopAll();
  }
  const cl = new C.Cluster();
  try {
    const nodes = await Promise.all(['a', 'b', 'c', 'd', 'e'].map((n) => cl.start(n)));
    const master = await cl.converged(nodes, 30000);
    await cl.sameState(nodes, 30000, (s) => Object.keys(s.nodeIdentities).length === 5);
    const ids = await Promise.all(nodes.map((n) => n.id()));
    const m = nodes[ids.indexOf(master)];
    const five = await eventLoad(m, nodes);
    console.log(`events: ${five.events} events ordered by the master and applied by 4 followers in ` +
      `${five.secs.toFixed(2)} s: ${five.rate.toFixed(0)} events/s; one node alone: ` +
      `${single.rate.toFixed(0)} events/s (${single.events} events); ratio ${(five.rate / single.rate).toFixed(2)}`);
    return { five, single };
  } finally {
    await cl.stopAll();
  }
}

async function routing() {
  const tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'exo-bench-cl-'));
  const models = path.join(tmp, 'models');
  await C.buildModel(models);
  const cl = new C.Cluster();
  try {
    const a = await cl.start('a', { models });
    const b = await cl.start('b');
    await cl.converged([a, b]);
    await C.placeAndWait(b, [a, b]);
    const req = { model: C.MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 1, temperature: 0 };
    const time = async (n) => {
      const t0 = performance.now();
      const r = await C.postJson(n.base, '/v1/chat/completions', req);
      if (r.status !== 200) throw new Error(r.text);
      return performance.now() - t0;
    };
    for (let i = 0; i < 5; i++) { await time(a); await time(b); } // warm
    const direct = [], routed = [];
    for (let i = 0; i < N_REQUESTS; i++) {
      direct.push(await time(a));
      routed.push(await time(b));
    }
    const d = median(direct), r = median(routed);
    console.log(`routing: 1-token request, median ${ms(d)} to the instance's node, ${ms(r)} through another ` +
      `node: +${ms(r - d)} (goal < 1 ms: ${r - d < 1 ? 'met' : 'MISSED'}), ratio ${(r / d).toFixed(2)}`);
    return { direct: d, routed: r };
  } finally {
    await cl.stopAll();
    await fsp.rm(tmp, { recursive: true, force: true });
  }
}

await agreementAndFailover();
await events();
await routing();
