// GET /events under load: does reading the event log slow generation?
// Starts one daemon with the cluster suite's tiny model, grows its log to
// EVENTS events with short chats, then times a 4-token chat alone and while
// 16 clients fetch GET /events in a loop (what they get per call: the first
// page, as a client without pagination would ask).
//
// Run: EXO_BIN=build/exo node bench/bench_events.mjs [EVENTS]
import os from 'node:os';
import path from 'node:path';
import fsp from 'node:fs/promises';
import { Worker } from 'node:worker_threads';
import * as C from '../tests/cluster/cluster.mjs';

const EVENTS = +(process.argv[2] ?? 10000);
const tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'exo-bench-events-'));
const models = path.join(tmp, 'models');
await C.buildModel(models);
const cl = new C.Cluster();
const body = (content) => ({ model: C.MODEL_ID, messages: [{ role: 'user', content }], max_tokens: 4, temperature: 0 });
try {
  const a = await cl.start('a', { models });
  await cl.converged([a]);
  await C.placeAndWait(a, [a]);
  const chat = async (i) => {
    const t0 = performance.now();
    const r = await C.postJson(a.base, '/v1/chat/completions', body(`hello ${i}`));
    if (r.status !== 200) throw new Error(r.text);
    return performance.now() - t0;
  };
  const t0 = Date.now();
  let i = 0;
  for (;;) {
    const idx = (await a.state()).lastEventAppliedIdx;
    if (idx >= EVENTS) break;
    await Promise.all([0, 1, 2, 3].map(() => chat(i++)));
  }
  console.log(`log at ${(await a.state()).lastEventAppliedIdx + 1} events after ${i} chats (${Date.now() - t0} ms)`);
  const stats = (xs) => {
    const s = [...xs].sort((x, y) => x - y);
    return `median ${s[s.length >> 1].toFixed(1)} ms, max ${s[s.length - 1].toFixed(1)} ms`;
  };
  const alone = [];
  for (let k = 0; k < 10; k++) alone.push(await chat(`alone ${k}`));
  console.log(`chat alone: ${stats(alone)}`);
  // the 16 clients in a worker thread: their JSON parsing must not delay
  // this thread's view of the chat's answer
  const w = new Worker(`
    const { parentPort, workerData } = require('node:worker_threads');
    let stop = false, calls = 0, events = 0;
    parentPort.on('message', () => { stop = true; });
    const hammer = async () => {
      while (!stop) {
        const j = await (await fetch(workerData + '/events')).json();
        calls++;
        events += j.length;
      }
    };
    Promise.all(Array.from({ length: 16 }, hammer)).then(() => parentPort.postMessage({ calls, events }));
  `, { eval: true, workerData: a.base });
  await C.sleep(500);
  const busy = [];
  const tb = Date.now();
  for (let k = 0; k < 10; k++) busy.push(await chat(`busy ${k}`));
  const secs = (Date.now() - tb) / 1000;
  const done = new Promise((resolve) => w.once('message', resolve));
  w.postMessage('stop');
  const { calls, events } = await done;
  await w.terminate();
  console.log(`chat with 16 /events clients: ${stats(busy)}; /events: ${(calls / secs).toFixed(0)} calls/s, ` +
    `${(events / calls).toFixed(0)} events per call`);
  const dir = path.join(a.dataDir, 'event_log/master');
  for (const f of await fsp.readdir(dir)) console.log(`  ${f}: ${(await fsp.stat(path.join(dir, f))).size} bytes`);
} finally {
  await cl.stopAll();
  await fsp.rm(tmp, { recursive: true, force: true });
}
