// Benchmark: the daemon under hostile clients, with its default limits.
// Prints, against their goals: the p99 latency of a well-behaved client
// (alternating GET /v1/models and a 4-token stories260K chat, one at a
// time) while thousands of slowloris connections are held, against 50 ms;
// and the daemon's peak RSS growth under a body flood, against its request
// memory budget (256 MiB). Not a test: run by hand,
//   node bench/bench_hostile.mjs        (EXO_BIN: default build/exo; BENCH_SECONDS
//   per measurement, 10; BENCH_FLOOD_CONNS bodies in the flood, 400)
// Needs a high descriptor limit (`ulimit -n 20000`).
import path from 'node:path';
import fsp from 'node:fs/promises';
import * as D from '../tests/e2e/daemon.mjs';
import * as A from '../tests/reliability/attacks.mjs';

const SECONDS = +(process.env.BENCH_SECONDS || 10);
const FLOOD_CONNS = +(process.env.BENCH_FLOOD_CONNS || 400); // bodies of 16 MiB at once
const BUDGET = 256 << 20;

async function probe(base, ms) {
  const p = A.prober(base, { model: D.STORIES_ID, pauseMs: 10 });
  await A.sleep(ms);
  return p.stop();
}

const fmt = (l) => `p50 ${l.p50.toFixed(1)} ms, p99 ${l.p99.toFixed(1)} ms, max ${l.max.toFixed(1)} ms over ${l.n} requests, ${l.errors.length} errors`;

const tmp = await D.tmpDir('exo-bench-hostile-');
try {
  await D.buildModels(path.join(tmp, 'models'));
  const d = await D.startDaemon({ dataDir: path.join(tmp, 'data'), modelsDir: path.join(tmp, 'models') });
  await D.placeInstance(d.base, D.STORIES_ID);

  const idle = await probe(d.base, SECONDS * 1000);
  console.log(`idle:       ${fmt(idle)}`);

  // 24 addresses x 128 connections (the per-address cap), re-opened as the
  // 20 s header deadline closes them, each trickling a header line a second
  const att = await A.slowloris({ port: d.port, sources: A.sourceAddrs(24), perSource: 128, trickleMs: 1000 });
  await A.sleep(1000);
  const held = att.open();
  const lat = await probe(d.base, SECONDS * 1000);
  const heldEnd = att.open();
  att.stop();
  console.log(`slowloris:  ${held} connections held (${heldEnd} at the end): ${fmt(lat)}`);
  console.log(`            p99 / 50 ms goal = ${(lat.p99 / 50).toFixed(2)} (<= 1 meets it); p99 vs idle: ${(lat.p99 / idle.p99).toFixed(2)}x`);

  A.resetPeak(d.pid);
  const before = A.memOf(d.pid);
  const flood = await A.bodyFlood({ port: d.port, sources: A.sourceAddrs(32, 100), conns: FLOOD_CONNS,
    contentLength: 16 * 1024 * 1024 - 1, chunkBytes: 512 * 1024, intervalMs: 20 });
  const fl = await probe(d.base, SECONDS * 1000);
  await flood.finish(20000);
  const peak = A.memOf(d.pid).hwm;
  flood.stop();
  const grew = peak - before.rss;
  console.log(`body flood: ${FLOOD_CONNS} x 16 MiB bodies from 32 addresses, ${(flood.bytesSent() / 2 ** 20).toFixed(0)} MiB sent, statuses ${JSON.stringify(flood.statuses())}`);
  console.log(`            peak RSS growth ${(grew / 2 ** 20).toFixed(1)} MiB / budget ${BUDGET / 2 ** 20} MiB = ${(grew / BUDGET).toFixed(2)} (<= 1 meets it)`);
  console.log(`            meanwhile: ${fmt(fl)}`);
  await d.stop();
} finally {
  await fsp.rm(tmp, { recursive: true, force: true });
}
