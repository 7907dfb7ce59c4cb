// Reliability suite: the real `exo serve` on loopback (stories260K placed)
// under each attack of issue 13 while a well-behaved client keeps being
// served; its latency is recorded, the daemon's memory is held to the
// budget, and the daemon must be alive and answering afterwards. Then 100k
// requests: the event log stays within its bound and holds no prompt, and a
// restart archives it and serves again.
//
// The daemon runs with short limits so the suite stays quick
// (EXO_HTTP_HEADER_TIMEOUT_S=2, EXO_HTTP_BODY_TIMEOUT_S=10,
// EXO_HTTP_MAX_PER_CLIENT=64, EXO_HTTP_MEMORY_MB=64): the mechanisms are the
// ones the defaults configure (docs/DAEMON.md, "Limits").
//
// Run: tests/integration/test_reliability.sh, or
//      node --test-reporter=./tests/e2e/reporter.mjs tests/reliability/reliability.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import fsp from 'node:fs/promises';
import * as D from '../e2e/daemon.mjs';
import * as A from './attacks.mjs';

const { STORIES_ID, sleep } = D;
const LIMITS = {
  EXO_HTTP_HEADER_TIMEOUT_S: '2', EXO_HTTP_BODY_TIMEOUT_S: '10', EXO_HTTP_MAX_PER_CLIENT: '64',
  EXO_HTTP_MEMORY_MB: '64',
};
const BUDGET = 64 << 20;
const T = { timeout: 120000 };
// Generous for CI on two shared cores (the attacker runs on them too);
// bench/bench_hostile.mjs measures against the 50 ms goal.
const P99_MS = 1500;

let tmp, models, daemon, base;

function withEnv(env, fn) {
  const saved = {};
  for (const [k, v] of Object.entries(env)) { saved[k] = process.env[k]; process.env[k] = v; }
  try { return fn(); } finally {
    for (const [k, v] of Object.entries(saved)) { if (v === undefined) delete process.env[k]; else process.env[k] = v; }
  }
}

async function alive() {
  const r = await fetch(`${base}/v1/models`);
  assert.equal(r.status, 200);
  const c = await D.postJson(base, '/v1/chat/completions', {
    model: STORIES_ID, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 4, temperature: 0,
  });
  assert.equal(c.status, 200, c.text);
  assert.equal(daemon.exitCode, undefined, 'the daemon exited');
}

function report(name, obj) {
  console.log(`# ${name}: ${JSON.stringify(obj)}`);
}

before(async () => {
  tmp = await D.tmpDir('exo-rel-');
  models = await D.buildModels(path.join(tmp, 'models'));
  daemon = await withEnv(LIMITS, () => D.startDaemon({ dataDir: path.join(tmp, 'data'), modelsDir: path.join(tmp, 'models') }));
  base = daemon.base;
  await D.placeInstance(base, STORIES_ID);
});

after(async () => {
  if (daemon) await daemon.stop();
  if (tmp && !process.env.EXO_E2E_KEEP) await fsp.rm(tmp, { recursive: true, force: true });
});

test('slowloris: trickled headers are cut at the header deadline, one address holds at most its share, others are served', T, async () => {
  const p = A.prober(base, { model: STORIES_ID });
  const sources = A.sourceAddrs(16);
  const att = await A.slowloris({ port: daemon.port, sources, perSource: 100, trickleMs: 500 });
  await sleep(1000); // the excess is closed at once, the rest at the 2 s header deadline
  const heldAtOnce = att.open();
  await sleep(2500);
  const stillOpen = att.open();
  const closed = att.closed();
  att.stop();
  const lat = await p.stop();
  report('slowloris', { attempted: 1600, heldAtOnce, stillOpenAfter3_5s: stillOpen, prober: lat });
  assert.ok(heldAtOnce <= 16 * 64, `one address may hold 64 connections; ${heldAtOnce} open`);
  assert.ok(heldAtOnce >= 16 * 32, `${heldAtOnce} open: too few to have tested the deadline`);
  assert.equal(stillOpen, 0, 'connections that never finish their headers must be closed');
  assert.ok(Math.max(...closed) < 4500, `closed late: ${Math.max(...closed)} ms`);
  assert.deepEqual(lat.errors, []);
  assert.ok(lat.p99 < P99_MS, `p99 ${lat.p99} ms`);
  await alive();
});

async function flood(sources) {
  const p = A.prober(base, { model: STORIES_ID });
  A.resetPeak(daemon.pid);
  const before = A.memOf(daemon.pid);
  const att = await A.bodyFlood({ port: daemon.port, sources, conns: 100,
    contentLength: 16 * 1024 * 1024 - 1, chunkBytes: 256 * 1024, intervalMs: 50 });
  await sleep(3000);
  await att.finish(); // refused bodies are drained, then answered
  const during = A.memOf(daemon.pid);
  const statuses = att.statuses();
  const refusal = att.socks.find((st) => /^HTTP\/1\.1 503/.test(st.data));
  att.stop();
  const lat = await p.stop();
  const r = { statuses, sentMiB: +(att.bytesSent() / 2 ** 20).toFixed(0), rssBeforeMiB: +(before.rss / 2 ** 20).toFixed(1),
    peakGrowthMiB: +((during.hwm - before.rss) / 2 ** 20).toFixed(1), budgetMiB: BUDGET / 2 ** 20, prober: lat };
  report(`body flood from ${sources.length} address(es)`, r);
  assert.ok(refusal && /Retry-After: \d+/i.test(refusal.data), 'a 503 says when to retry');
  assert.ok(during.hwm - before.rss < BUDGET + (32 << 20), `peak grew ${r.peakGrowthMiB} MiB`);
  return r;
}

test('body flood from one address: it holds at most its quarter of the request memory; others are served', T, async () => {
  const r = await flood(A.sourceAddrs(1, 60));
  // a 16 MiB body is a whole 16 MiB share: one fits (and is answered 400:
  // it is only spaces); of the other 99, those over the 64 connections an
  // address may open are closed at once (no status), the rest answered 503
  assert.equal(r.statuses[400], 1, JSON.stringify(r.statuses));
  assert.ok(r.statuses[503] + (r.statuses[0] || 0) === 99 && r.statuses[503] >= 60, JSON.stringify(r.statuses));
  assert.ok(r.peakGrowthMiB < 16 + 8, `one address held ${r.peakGrowthMiB} MiB`);
  assert.deepEqual(r.prober.errors, []);
  assert.ok(r.prober.p99 < P99_MS, `p99 ${r.prober.p99} ms`);
  await alive();
});

test('body flood from ten addresses: large bodies fill 3/4 of the budget, 503 + Retry-After past it; others are served', T, async () => {
  const r = await flood(A.sourceAddrs(10, 70));
  // three 16 MiB bodies fit in 48 MiB
  assert.equal(r.statuses[400], 3, JSON.stringify(r.statuses));
  assert.equal(r.statuses[503], 97, JSON.stringify(r.statuses));
  assert.ok(r.peakGrowthMiB < 48 + 8, `large bodies held ${r.peakGrowthMiB} MiB`);
  assert.deepEqual(r.prober.errors, []);
  assert.ok(r.prober.p99 < P99_MS, `p99 ${r.prober.p99} ms`);
  await alive();
});

test('a body that would parse into many times its size is refused (413) without the memory', T, async () => {
  // ~15.6 MB of tiny messages: a parse tree of ~18x its size unbounded
  const msg = '{"role":"user","content":"a"},';
  const n = Math.floor(15.6e6 / msg.length);
  const body = `{"model":"${STORIES_ID}","max_tokens":1,"messages":[${msg.repeat(n)}{"role":"user","content":"a"}]}`;
  A.resetPeak(daemon.pid);
  const before = A.memOf(daemon.pid);
  const t0 = Date.now();
  const r = await D.postJson(base, '/v1/chat/completions', body);
  const ms = Date.now() - t0;
  const peak = A.memOf(daemon.pid).hwm;
  report('amplifying body', { bytes: body.length, status: r.status, ms, peakGrowthMiB: ((peak - before.rss) / 2 ** 20).toFixed(1) });
  assert.equal(r.status, 413, r.text);
  assert.match(r.json.error.message, /too complex/);
  assert.ok(peak - before.rss < BUDGET + (32 << 20), `peak grew ${(peak - before.rss) / 2 ** 20} MiB`);
  await alive();
});

test('ambiguous framing is refused and the connection closed (RFC 9112)', T, async () => {
  const cases = [
    ['Content-Length with Transfer-Encoding', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n', 400],
    ['two different Content-Lengths', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n{}abc', 400],
    ['two equal Content-Lengths', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n{}', 400],
    ['a signed Content-Length', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: +2\r\n\r\n{}', 400],
    ['an unknown transfer coding', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n', 501],
    ['Transfer-Encoding in HTTP/1.0', 'POST /v1/chat/completions HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n', 400],
    ['no Host in HTTP/1.1', 'GET /v1/models HTTP/1.1\r\n\r\n', 400],
    ['two Hosts', 'GET /v1/models HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n', 400],
    ['whitespace before the colon', 'GET /v1/models HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\n', 400],
    ['a body over the limit, with Expect: 100-continue', 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\nExpect: 100-continue\r\n\r\n', 413],
  ];
  for (const [name, req, want] of cases) {
    const r = await A.rawRequest(daemon.port, req);
    assert.equal(r.status, want, `${name}: ${r.head}`);
    assert.ok(r.closed, `${name}: the connection must close`);
  }
  // well-formed chunked and Content-Length requests still work, kept alive
  const chunked = await A.rawRequest(daemon.port, 'GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n', { waitMs: 500 });
  assert.equal(chunked.status, 200);
  assert.ok(!chunked.closed);
  const body = JSON.stringify({ model: STORIES_ID, messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
  const hex = Buffer.byteLength(body).toString(16);
  const c = await A.rawRequest(daemon.port, `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n${hex}\r\n${body}\r\n0\r\n\r\n`, { waitMs: 3000 });
  assert.equal(c.status, 200, c.head);
});

test('a kept-alive connection left idle is closed at the header deadline', T, async () => {
  const r = await A.rawRequest(daemon.port, 'GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n', { waitMs: 4000 });
  assert.equal(r.status, 200);
  assert.ok(r.closed, 'idle keep-alive connection still open after 4 s');
});

test('access control: with an API key every route but CORS preflights needs it', T, async () => {
  const key = 'sk-test-0123456789';
  const d = await withEnv({ EXO_API_KEY: key }, () => D.startDaemon({ dataDir: path.join(tmp, 'data-key'), modelsDir: path.join(tmp, 'models') }));
  try {
    const get = (p, headers = {}) => fetch(d.base + p, { headers });
    for (const p of ['/v1/models', '/state', '/events', '/node_id', '/api/tags', '/ollama/api/tags']) {
      const r = await get(p);
      assert.equal(r.status, 401, `${p} without the key`);
      assert.equal(r.headers.get('www-authenticate'), 'Bearer');
      assert.equal((await get(p, { authorization: `Bearer ${key}x` })).status, 401, `${p} with a wrong key`);
    }
    const ok = await get('/v1/models', { authorization: `Bearer ${key}` });
    assert.equal(ok.status, 200);
    assert.equal((await get('/state', { 'x-api-key': key })).status, 200);
    assert.equal((await get('/events', { cookie: `exo_api_key=${encodeURIComponent(key)}` })).status, 200);
    const post = await fetch(`${d.base}/v1/chat/completions`, { method: 'POST', body: '{}', headers: { 'content-type': 'application/json' } });
    assert.equal(post.status, 401);
    assert.match((await post.json()).error.message, /API key/);
    // the dashboard asks for the key instead of showing anything
    const page = await get('/');
    assert.equal(page.status, 401);
    assert.match(page.headers.get('content-type'), /text\/html/);
    assert.match(await page.text(), /exo_api_key/);
    const pre = await fetch(`${d.base}/v1/chat/completions`, { method: 'OPTIONS',
      headers: { origin: 'http://x', 'access-control-request-method': 'POST' } });
    assert.equal(pre.status, 200);
  } finally {
    await d.stop();
  }
});

test('100k requests: the event log stays within its bound, holds no prompt, and a restart serves again', { timeout: 400000 }, async () => {
  const N = +(process.env.EXO_REL_REQUESTS || 100000);
  const dir = path.join(tmp, 'data-many');
  let d = await D.startDaemon({ dataDir: dir, modelsDir: path.join(tmp, 'models') });
  await D.placeInstance(d.base, STORIES_ID);
  const log = path.join(dir, 'event_log/master/events.bin');
  const secret = 'PROMPT-a1b2c3';
  const body = JSON.stringify({ model: STORIES_ID, messages: [{ role: 'user', content: `${secret} Once` }],
    max_tokens: 1, temperature: 0 });
  let done = 0, failed = 0, maxBytes = 0;
  const sampler = setInterval(async () => {
    try { maxBytes = Math.max(maxBytes, (await fsp.stat(log)).size); } catch { /* being swapped */ }
  }, 200);
  const t0 = Date.now();
  await Promise.all(Array.from({ length: 4 }, async () => {
    while (done + failed < N) {
      done++;
      const r = await fetch(`${d.base}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      await r.text();
      if (r.status !== 200) { failed++; done--; }
    }
  }));
  clearInterval(sampler);
  const secs = (Date.now() - t0) / 1000;
  const kept = await (await fetch(`${d.base}/events/page?limit=1`)).json(); // from the oldest kept event
  const files = await fsp.readdir(path.dirname(log));
  let onDisk = 0;
  for (const f of files) {
    const buf = await fsp.readFile(path.join(path.dirname(log), f));
    onDisk += buf.length;
    assert.ok(!buf.includes(secret), `${f} holds a prompt`);
  }
  const st = await D.getJson(d.base, '/state');
  report('100k requests', { requests: N, failed, seconds: secs, perSecond: Math.round(N / secs),
    logMaxMiB: +(maxBytes / 2 ** 20).toFixed(2), filesMiB: +(onDisk / 2 ** 20).toFixed(2), firstKeptEvent: kept.first,
    lastEventIdx: st.lastEventAppliedIdx });
  assert.equal(failed, 0);
  assert.ok(maxBytes < 16 * 2 ** 20 + 65536, `the log reached ${maxBytes} bytes`);
  assert.ok(st.lastEventAppliedIdx > 2 * N, 'each request made events');
  assert.ok(kept.first > st.lastEventAppliedIdx - 30000, `events before ${kept.first} are still kept`);
  // a restart: the session's log is archived (bounded), the node starts afresh and serves
  await d.stop();
  d = await D.startDaemon({ dataDir: dir, modelsDir: path.join(tmp, 'models') });
  try {
    await D.placeInstance(d.base, STORIES_ID);
    const r = await D.postJson(d.base, '/v1/chat/completions', JSON.parse(body));
    assert.equal(r.status, 200, r.text);
    const archives = (await fsp.readdir(path.dirname(log))).filter((f) => f.endsWith('.zst'));
    assert.equal(archives.length, 1);
    const a = await fsp.stat(path.join(path.dirname(log), archives[0]));
    report('after restart', { archiveKiB: +(a.size / 1024).toFixed(1) });
    assert.ok(a.size < 16 * 2 ** 20);
  } finally {
    await d.stop();
  }
});
