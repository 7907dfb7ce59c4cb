// Tests for the hub imitation (hub.mjs): `node --test tests/hub/`.
// Starts the hub as a child process on a temp directory and talks to it with
// fetch, except for path-traversal cases, which go through node:http so the
// client cannot normalise the ".." away first.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import http from 'node:http';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const HUB = path.join(path.dirname(fileURLToPath(import.meta.url)), 'hub.mjs');
const TOKEN = 'hf_test_secret';
const MODEL_SIZE = 3 * 1024 * 1024;

const sha256 = (b) => crypto.createHash('sha256').update(b).digest('hex');
const gitSha1 = (b) => crypto.createHash('sha1').update(`blob ${b.length}\0`).update(b).digest('hex');
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- fixture ---------------------------------------------------------------------

const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-hub-test-'));
const files = {
  'config.json': Buffer.from(JSON.stringify({ model_type: 'llama', hidden_size: 64 }, null, 2)),
  'model.safetensors': crypto.randomBytes(MODEL_SIZE),
  'sub/tokenizer.json': Buffer.from(JSON.stringify({ version: '1.0', model: { type: 'BPE' } })),
};
for (const [p, data] of Object.entries(files)) {
  fs.mkdirSync(path.join(tmp, 'test-org/tiny', path.dirname(p)), { recursive: true });
  fs.writeFileSync(path.join(tmp, 'test-org/tiny', p), data);
}
fs.mkdirSync(path.join(tmp, 'test-org/gated'), { recursive: true });
fs.writeFileSync(path.join(tmp, 'test-org/gated/.gated'), '');
fs.writeFileSync(path.join(tmp, 'test-org/gated/config.json'), '{}');
const MODEL = files['model.safetensors'];

// ---- hub processes ---------------------------------------------------------------

async function startHub(args) {
  const child = spawn(process.execPath, [HUB, '--root', tmp, ...args], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const port = await new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => {
      stdout += d;
      if (stdout.includes('\n')) resolve(JSON.parse(stdout.split('\n')[0]).port);
    });
    child.once('exit', (code) => reject(new Error(`hub exited (${code}): ${stderr}`)));
  });
  return {
    child,
    port,
    base: `http://127.0.0.1:${port}`,
    stdout: () => stdout,
    stderr: () => stderr,
    stop: () => new Promise((resolve) => {
      if (child.exitCode !== null) return resolve(child.exitCode);
      child.once('exit', (code, sig) => resolve(code ?? sig));
      child.kill('SIGTERM');
    }),
  };
}

let hub; // no token
let tokHub; // --token TOKEN
before(async () => {
  [hub, tokHub] = await Promise.all([startHub([]), startHub(['--token', TOKEN])]);
});
after(async () => {
  await Promise.all([hub?.stop(), tokHub?.stop()]);
  fs.rmSync(tmp, { recursive: true, force: true });
});

// fetch + whole body; the body is always consumed so keep-alive sockets are reused.
async function get(url, opts = {}) {
  const r = await fetch(url.startsWith('http') ? url : hub.base + url, opts);
  return { r, body: Buffer.from(await r.arrayBuffer()) };
}

// Reads as much of a body as arrives; a cut connection is an error, not a throw.
async function readPartial(r) {
  const chunks = [];
  let error = null;
  try {
    for await (const c of r.body) chunks.push(Buffer.from(c));
  } catch (err) {
    error = err;
  }
  return { bytes: Buffer.concat(chunks), error };
}

function raw(method, p, headers = {}) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: hub.port, method, path: p, headers, agent: false }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on('error', reject);
    req.end();
  });
}

async function control(p, body) {
  const r = await fetch(hub.base + p, body === undefined ? {} : { method: 'POST', body: JSON.stringify(body) });
  assert.equal(r.status, 200, `${p}: ${r.status}`);
  return r.json();
}
const reset = () => control('/_control/reset', {});
const addFaults = (list) => control('/_control/faults', list);

// The log's status / bytes are filled when the server sees the response end,
// which for an aborted client is a moment after the client gave up.
async function logWhen(pred, ms = 2000) {
  const t0 = Date.now();
  for (;;) {
    const log = await control('/_control/log');
    if (pred(log) || Date.now() - t0 > ms) return log;
    await sleep(20);
  }
}

const CDN = '/_cdn/test-org/tiny/model.safetensors';
const RESOLVE = '/test-org/tiny/resolve/main';

// ---- API ---------------------------------------------------------------------------

test('prints exactly one {"port":N} line', async () => {
  assert.equal(hub.stdout(), `{"port":${hub.port}}\n`);
  assert.ok(hub.port > 0);
});

test('tree: shape, git blob sha1 and LFS sha256 oids', async () => {
  for (const q of ['recursive=true', 'recursive=1']) {
    const { r, body } = await get(`/api/models/test-org/tiny/tree/main?${q}`);
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /application\/json/);
    const tree = JSON.parse(body);
    assert.deepEqual(tree.map((e) => e.path), ['config.json', 'model.safetensors', 'sub', 'sub/tokenizer.json']);
    const byPath = Object.fromEntries(tree.map((e) => [e.path, e]));

    assert.deepEqual(byPath['config.json'], {
      type: 'file', oid: gitSha1(files['config.json']), size: files['config.json'].length, path: 'config.json',
    });
    assert.equal(byPath['sub/tokenizer.json'].oid, gitSha1(files['sub/tokenizer.json']));
    assert.equal(byPath['sub/tokenizer.json'].lfs, undefined);

    const dir = byPath.sub;
    assert.equal(dir.type, 'directory');
    assert.equal(dir.size, 0);
    assert.match(dir.oid, /^[0-9a-f]{40}$/);

    const m = byPath['model.safetensors'];
    const pointer = Buffer.from(`version https://git-lfs.github.com/spec/v1\noid sha256:${sha256(MODEL)}\nsize ${MODEL_SIZE}\n`);
    assert.deepEqual(m, {
      type: 'file', oid: gitSha1(pointer), size: MODEL_SIZE,
      lfs: { oid: sha256(MODEL), size: MODEL_SIZE, pointerSize: pointer.length }, path: 'model.safetensors',
    });
  }
});

test('tree: non-recursive, subdirectory, bad revision', async () => {
  let tree = JSON.parse((await get('/api/models/test-org/tiny/tree/main')).body);
  assert.deepEqual(tree.map((e) => e.path), ['config.json', 'model.safetensors', 'sub']);
  tree = JSON.parse((await get('/api/models/test-org/tiny/tree/main/sub?recursive=true')).body);
  assert.deepEqual(tree.map((e) => e.path), ['sub/tokenizer.json']);
  const { r, body } = await get('/api/models/test-org/tiny/tree/v1.0?recursive=true');
  assert.equal(r.status, 404);
  assert.equal(r.headers.get('x-error-code'), 'RevisionNotFound');
  assert.ok(JSON.parse(body).error);
  assert.equal((await get('/api/models/test-org/tiny/tree/main/nope')).r.status, 404);
  assert.equal((await get('/api/models/test-org/tiny/tree/%C3%A9t%C3%A9')).r.status, 404, 'non-ASCII revision');
});

test('tree: --tree-page pages with a Link to the next; a bad cursor is 400', async () => {
  const h = await startHub(['--tree-page', '1']);
  const all = JSON.parse((await get(`${hub.base}/api/models/test-org/tiny/tree/main?recursive=true`)).body)
    .map((e) => e.path);
  const seen = [];
  let url = `${h.base}/api/models/test-org/tiny/tree/main?recursive=true`;
  while (url) {
    const { r, body } = await get(url);
    assert.equal(r.status, 200);
    const page = JSON.parse(body);
    assert.equal(page.length, 1);
    seen.push(...page.map((e) => e.path));
    const link = r.headers.get('link');
    url = link ? /^<([^>]+)>; rel="next"$/.exec(link)[1] : null;
    if (url) assert.ok(url.startsWith(`${h.base}/api/models/test-org/tiny/tree/main?recursive=true&cursor=`), url);
  }
  assert.deepEqual(seen, all, 'the pages are the whole tree, in order');
  const cursor = Buffer.from('99').toString('base64url');
  const bad = await get(`${h.base}/api/models/test-org/tiny/tree/main?cursor=${cursor}`);
  assert.equal(bad.r.status, 400);
  const away = await startHub(['--tree-page', '1', '--link-origin', 'http://example.invalid:1']);
  const r = (await get(`${away.base}/api/models/test-org/tiny/tree/main`)).r;
  assert.ok(r.headers.get('link').startsWith('<http://example.invalid:1/api/models/test-org/tiny/tree/main?cursor='),
    r.headers.get('link'));
  assert.equal(await h.stop(), 0);
  assert.equal(await away.stop(), 0);
});

test('model search: substring of the id, author, sort by downloads, limit', async () => {
  for (const [id, n] of [['srch-a/Alpha-Model', 3], ['srch-a/beta-model', 30], ['srch-b/Gamma-MODEL', 10]]) {
    fs.mkdirSync(path.join(tmp, id), { recursive: true });
    fs.writeFileSync(path.join(tmp, id, '.downloads'), String(n));
  }
  const ids = async (q) => JSON.parse((await get(`/api/models?${q}`)).body).map((m) => m.id);
  assert.deepEqual(await ids('search=-model&sort=downloads&direction=-1'),
    ['srch-a/beta-model', 'srch-b/Gamma-MODEL', 'srch-a/Alpha-Model']);
  assert.deepEqual(await ids('search=MODEL&author=srch-a&sort=downloads'), ['srch-a/beta-model', 'srch-a/Alpha-Model']);
  assert.deepEqual(await ids('search=-model&sort=downloads&limit=1'), ['srch-a/beta-model']);
  assert.deepEqual(await ids('search=-model&author=nobody'), []);
  const m = JSON.parse((await get('/api/models?search=gamma')).body)[0];
  assert.equal(m.downloads, 10);
  assert.equal(m.author, undefined, 'the list has no author without full=true, as the hub\'s');
  assert.equal((await get('/api/models?search=x&limit=0')).r.status, 400);
  assert.equal((await get(`${tokHub.base}/api/models?search=x`)).r.status, 401, 'a token hub wants the token');
});

test('model info', async () => {
  const { r, body } = await get('/api/models/test-org/tiny');
  assert.equal(r.status, 200);
  const info = JSON.parse(body);
  assert.equal(info.id, 'test-org/tiny');
  assert.equal(info.modelId, 'test-org/tiny');
  assert.match(info.sha, /^[0-9a-f]{40}$/);
  assert.deepEqual(info.siblings, [
    { rfilename: 'config.json' }, { rfilename: 'model.safetensors' }, { rfilename: 'sub/tokenizer.json' },
  ]);
  const again = JSON.parse((await get('/api/models/test-org/tiny')).body);
  assert.equal(again.sha, info.sha, 'sha is stable');
  const res = await get(`${RESOLVE}/config.json`);
  assert.equal(res.r.headers.get('x-repo-commit'), info.sha);
});

test('resolve: small file with ETag, HEAD, nested and encoded paths', async () => {
  const cfg = files['config.json'];
  const { r, body } = await get(`${RESOLVE}/config.json`);
  assert.equal(r.status, 200);
  assert.deepEqual(body, cfg);
  assert.equal(r.headers.get('etag'), `"${gitSha1(cfg)}"`);
  assert.equal(r.headers.get('content-length'), String(cfg.length));
  assert.equal(r.headers.get('accept-ranges'), 'bytes');
  assert.match(r.headers.get('x-repo-commit'), /^[0-9a-f]{40}$/);

  const h = await get(`${RESOLVE}/config.json`, { method: 'HEAD' });
  assert.equal(h.r.status, 200);
  assert.equal(h.body.length, 0);
  assert.equal(h.r.headers.get('content-length'), String(cfg.length));
  assert.equal(h.r.headers.get('etag'), `"${gitSha1(cfg)}"`);

  for (const p of ['sub/tokenizer.json', 'sub%2Ftokenizer.json']) {
    const n = await get(`${RESOLVE}/${p}`);
    assert.equal(n.r.status, 200, p);
    assert.deepEqual(n.body, files['sub/tokenizer.json']);
  }

  const part = await get(`${RESOLVE}/config.json`, { headers: { range: 'bytes=2-5' } });
  assert.equal(part.r.status, 206);
  assert.equal(part.r.headers.get('content-range'), `bytes 2-5/${cfg.length}`);
  assert.deepEqual(part.body, cfg.subarray(2, 6));
});

test('resolve: LFS file redirects to the CDN with X-Linked-* headers', async () => {
  const etag = `"${sha256(MODEL)}"`;
  for (const method of ['HEAD', 'GET']) {
    const { r, body } = await get(`${RESOLVE}/model.safetensors`, { method, redirect: 'manual' });
    assert.equal(r.status, 302, method);
    assert.equal(body.length, 0);
    assert.equal(r.headers.get('location'), CDN);
    assert.equal(r.headers.get('x-linked-size'), String(MODEL_SIZE));
    assert.equal(r.headers.get('x-linked-etag'), etag);
    assert.equal(r.headers.get('etag'), etag);
    assert.match(r.headers.get('x-repo-commit'), /^[0-9a-f]{40}$/);
  }
  const { r, body } = await get(`${RESOLVE}/model.safetensors`); // follows the relative redirect
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('etag'), etag);
  assert.equal(r.headers.get('content-type'), 'application/octet-stream');
  assert.equal(r.headers.get('content-length'), String(MODEL_SIZE));
  assert.ok(body.equals(MODEL));
});

test('CDN: Range 206 / 416', async () => {
  let { r, body } = await get(CDN, { headers: { range: 'bytes=10-19' } });
  assert.equal(r.status, 206);
  assert.equal(r.headers.get('content-range'), `bytes 10-19/${MODEL_SIZE}`);
  assert.equal(r.headers.get('content-length'), '10');
  assert.equal(r.headers.get('accept-ranges'), 'bytes');
  assert.deepEqual(body, MODEL.subarray(10, 20));

  ({ r, body } = await get(CDN, { headers: { range: `bytes=${MODEL_SIZE - 8}-` } }));
  assert.equal(r.status, 206);
  assert.equal(r.headers.get('content-range'), `bytes ${MODEL_SIZE - 8}-${MODEL_SIZE - 1}/${MODEL_SIZE}`);
  assert.deepEqual(body, MODEL.subarray(MODEL_SIZE - 8));

  ({ r, body } = await get(CDN, { headers: { range: `bytes=100-${MODEL_SIZE + 1000}` } }));
  assert.equal(r.status, 206);
  assert.equal(body.length, MODEL_SIZE - 100);

  ({ r } = await get(CDN, { headers: { range: `bytes=${MODEL_SIZE}-` } }));
  assert.equal(r.status, 416);
  assert.equal(r.headers.get('content-range'), `bytes */${MODEL_SIZE}`);

  ({ r, body } = await get(CDN));
  assert.equal(r.status, 200);
  assert.equal(body.length, MODEL_SIZE);
});

test('path traversal and empty / dot segments are 400', async () => {
  const bad = [
    `${RESOLVE}/../../../etc/passwd`,
    `${RESOLVE}/%2e%2e/%2e%2e/test-org/tiny/config.json`,
    `${RESOLVE}/sub/..%2F..%2F..%2Fconfig.json`,
    `${RESOLVE}/sub//tokenizer.json`,
    `${RESOLVE}/./config.json`,
    `${RESOLVE}/config.json/`,
    '/_cdn/test-org/tiny/..%2f..%2fgated/config.json',
    '/_cdn/test-org/../test-org/tiny/config.json',
    '/../tiny/resolve/main/config.json',
    '/api/models/test-org/tiny/tree/main/..',
  ];
  for (const p of bad) {
    const r = await raw('GET', p);
    assert.equal(r.status, 400, p);
  }
});

test('404s carry x-error-code', async () => {
  for (const p of ['/api/models/nobody/none', '/api/models/nobody/none/tree/main', '/nobody/none/resolve/main/x', '/_cdn/nobody/none/x']) {
    const { r, body } = await get(p);
    assert.equal(r.status, 404, p);
    assert.equal(r.headers.get('x-error-code'), 'RepoNotFound', p);
    assert.deepEqual(JSON.parse(body), { error: 'Repository not found' });
  }
  for (const p of [`${RESOLVE}/missing.bin`, `${RESOLVE}/sub`, '/_cdn/test-org/tiny/missing.bin']) {
    const { r } = await get(p);
    assert.equal(r.status, 404, p);
    assert.equal(r.headers.get('x-error-code'), 'EntryNotFound', p);
  }
  const ctl = await get('/test-org/gated/resolve/main/.gated', { headers: { authorization: 'Bearer x' } });
  assert.equal(ctl.r.status, 403); // gated first; the token hub below checks .gated is not served
  for (const p of ['/', '/nothing', '/api/whoami', '/test-org/tiny/blob/main/config.json']) {
    assert.equal((await get(p)).r.status, 404, p);
  }
  assert.equal((await get(`${RESOLVE}/config.json`, { method: 'POST', body: 'x' })).r.status, 404);
});

test('--token: 401 without the right bearer; gated repos need it', async () => {
  const b = tokHub.base;
  for (const auth of [undefined, 'Bearer wrong', TOKEN]) {
    for (const p of ['/api/models/test-org/tiny', `${RESOLVE}/config.json`, CDN]) {
      const { r, body } = await get(b + p, { headers: auth ? { authorization: auth } : {} });
      assert.equal(r.status, 401, `${p} ${auth}`);
      assert.deepEqual(JSON.parse(body), { error: 'Invalid credentials in Authorization header' });
    }
  }
  const ok = { headers: { authorization: `Bearer ${TOKEN}` } };
  assert.equal((await get(`${b}${RESOLVE}/config.json`, ok)).r.status, 200);
  assert.equal((await get(b + CDN, ok)).r.status, 200);
  const gated = await get(`${b}/api/models/test-org/gated/tree/main`, ok);
  assert.equal(gated.r.status, 200);
  assert.deepEqual(JSON.parse(gated.body).map((e) => e.path), ['config.json'], '.gated is not listed');
  assert.equal((await get(`${b}/test-org/gated/resolve/main/config.json`, ok)).r.status, 200);
  assert.equal((await get(`${b}/test-org/gated/resolve/main/.gated`, ok)).r.status, 404);
});

test('gated repo without --token is always 403', async () => {
  for (const headers of [{}, { authorization: `Bearer ${TOKEN}` }]) {
    for (const p of ['/api/models/test-org/gated', '/test-org/gated/resolve/main/config.json']) {
      const { r, body } = await get(p, { headers });
      assert.equal(r.status, 403, p);
      assert.equal(r.headers.get('x-error-code'), 'GatedRepo');
      assert.deepEqual(JSON.parse(body), { error: 'Access to model test-org/gated is restricted' });
    }
  }
});

// ---- faults ------------------------------------------------------------------------

test('fault status: code, Retry-After, RateLimit, times', async () => {
  await reset();
  await addFaults([{ match: 'config.json', kind: 'status', code: 503, retry_after: 7 }]);
  let { r } = await get(`${RESOLVE}/config.json`);
  assert.equal(r.status, 503);
  assert.equal(r.headers.get('retry-after'), '7');
  assert.equal((await get(`${RESOLVE}/config.json`)).r.status, 200, 'times defaults to 1');

  await addFaults([{ match: '/api/models/test-org/tiny', kind: 'status', code: 429, retry_after: 3 }]);
  ({ r } = await get('/api/models/test-org/tiny/tree/main'));
  assert.equal(r.status, 429);
  assert.equal(r.headers.get('retry-after'), '3');
  assert.equal(r.headers.get('ratelimit'), '"api";r=0;t=3');

  await addFaults([{ match: CDN, kind: 'status', code: 500, times: 2 }]);
  const statuses = [];
  for (let i = 0; i < 3; i++) statuses.push((await get(CDN, { headers: { range: 'bytes=0-0' } })).r.status);
  assert.deepEqual(statuses, [500, 500, 206]);

  await addFaults([{ match: 'tokenizer', kind: 'status', code: 502, times: -1 }]);
  for (let i = 0; i < 4; i++) assert.equal((await get(`${RESOLVE}/sub/tokenizer.json`)).r.status, 502);
  assert.equal((await control('/_control/faults')).length, 1);
  await reset();
  assert.equal((await get(`${RESOLVE}/sub/tokenizer.json`)).r.status, 200);
});

test('fault: HEAD only with head:true', async () => {
  await reset();
  await addFaults([{ match: 'config.json', kind: 'status', code: 500 }]);
  assert.equal((await get(`${RESOLVE}/config.json`, { method: 'HEAD' })).r.status, 200);
  assert.equal((await get(`${RESOLVE}/config.json`)).r.status, 500, 'the HEAD did not use it up');
  await addFaults([{ match: 'config.json', kind: 'status', code: 500, head: true }]);
  assert.equal((await get(`${RESOLVE}/config.json`, { method: 'HEAD' })).r.status, 500);
});

test('fault drop: full Content-Length, fewer bytes, connection cut', async () => {
  await reset();
  await addFaults([{ match: 'model.safetensors', kind: 'drop', after_bytes: 100000 }]);
  const r = await fetch(`${hub.base}${RESOLVE}/model.safetensors`); // the 302 does not use the fault up
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('content-length'), String(MODEL_SIZE));
  const { bytes, error } = await readPartial(r);
  assert.ok(error, 'the body ends early');
  assert.equal(bytes.length, 100000);
  assert.deepEqual(bytes, MODEL.subarray(0, 100000));
  assert.equal((await get(CDN)).body.length, MODEL_SIZE, 'times: 1');

  await addFaults([{ match: 'model', kind: 'drop', after_bytes: 10 }]);
  const p = await readPartial(await fetch(hub.base + CDN, { headers: { range: 'bytes=1000-' } }));
  assert.ok(p.error);
  assert.deepEqual(p.bytes, MODEL.subarray(1000, 1010), 'after_bytes counts from the range start');
});

test('fault corrupt: exactly one byte flipped', async () => {
  await reset();
  await addFaults([
    { match: CDN, kind: 'corrupt', offset: 12345 },
    { match: CDN, kind: 'corrupt' },
    { match: 'config.json', kind: 'corrupt', offset: 3 },
  ]);
  const diffs = (a, b) => {
    const out = [];
    for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) out.push(i);
    return out;
  };
  for (const off of [12345, MODEL_SIZE / 2]) {
    const { r, body } = await get(CDN);
    assert.equal(r.status, 200);
    assert.equal(body.length, MODEL_SIZE);
    assert.deepEqual(diffs(body, MODEL), [off]);
    assert.equal(body[off], MODEL[off] ^ 0xff);
  }
  const cfg = await get(`${RESOLVE}/config.json`);
  assert.deepEqual(diffs(cfg.body, files['config.json']), [3]);
  assert.deepEqual((await get(CDN)).body, MODEL, 'all used up');

  await addFaults([{ match: CDN, kind: 'corrupt', offset: 5 }]);
  const part = await get(CDN, { headers: { range: 'bytes=100-199' } });
  assert.deepEqual(part.body, MODEL.subarray(100, 200), 'offset outside the range');
  assert.equal((await control('/_control/faults')).length, 0, 'but the fault was spent');
});

test('fault stall: headers and after_bytes, then silence', async () => {
  await reset();
  await addFaults([{ match: CDN, kind: 'stall', after_bytes: 65536 }]);
  const ac = new AbortController();
  const t0 = Date.now();
  const timer = setTimeout(() => ac.abort(), 500);
  const r = await fetch(hub.base + CDN, { signal: ac.signal });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('content-length'), String(MODEL_SIZE));
  const { bytes, error } = await readPartial(r);
  clearTimeout(timer);
  assert.ok(error, 'aborted');
  assert.ok(Date.now() - t0 >= 450);
  assert.equal(bytes.length, 65536);
  const log = await logWhen((l) => l[0]?.status !== null);
  assert.equal(log.length, 1);
  assert.equal(log[0].status, 200);
  assert.equal(log[0].bytes, 65536);

  // With `seconds` the hub cuts the connection itself.
  await addFaults([{ match: CDN, kind: 'stall', after_bytes: 0, seconds: 0.3 }]);
  const t1 = Date.now();
  const p = await readPartial(await fetch(hub.base + CDN));
  assert.ok(p.error);
  assert.equal(p.bytes.length, 0);
  assert.ok(Date.now() - t1 >= 250);
});

test('fault slow: throttled to bytes_per_second', async () => {
  await reset();
  const rate = 2 * 1024 * 1024;
  const n = 1024 * 1024;
  await addFaults([{ match: CDN, kind: 'slow', bytes_per_second: rate }]);
  const t0 = performance.now();
  const { r, body } = await get(CDN, { headers: { range: `bytes=0-${n - 1}` } });
  const s = (performance.now() - t0) / 1000;
  assert.equal(r.status, 206);
  assert.deepEqual(body, MODEL.subarray(0, n));
  const want = n / rate;
  assert.ok(s > want * 0.9 && s < want * 1.6, `took ${s.toFixed(3)} s, want ~${want} s`);
});

test('bad fault lists are refused', async () => {
  for (const bad of [[{ kind: 'status', code: 500 }], [{ match: 'x', kind: 'explode' }],
    [{ match: 'x', kind: 'status' }], [{ match: 'x', kind: 'slow' }]]) {
    const r = await fetch(`${hub.base}/_control/faults`, { method: 'POST', body: JSON.stringify(bad) });
    assert.equal(r.status, 400, JSON.stringify(bad));
    await r.arrayBuffer();
  }
});

// ---- log ---------------------------------------------------------------------------

test('request log', async () => {
  await reset();
  const headers = { 'user-agent': 'hub-test/1.0', authorization: 'Bearer abc' };
  await get('/api/models/test-org/tiny/tree/main?recursive=true', { headers });
  await get(`${RESOLVE}/model.safetensors`, { headers: { ...headers, range: 'bytes=0-99' } });
  await get(`${RESOLVE}/config.json`, { method: 'HEAD' });
  await get('/api/models/nobody/none');
  await control('/_control/faults'); // control requests are not logged
  const log = await logWhen((l) => l.length === 5 && l.every((e) => e.status !== null));
  assert.deepEqual(log.map((e) => [e.method, e.path, e.status]), [
    ['GET', '/api/models/test-org/tiny/tree/main', 200],
    ['GET', `${RESOLVE}/model.safetensors`, 302],
    ['GET', CDN, 206],
    ['HEAD', `${RESOLVE}/config.json`, 200],
    ['GET', '/api/models/nobody/none', 404],
  ]);
  assert.equal(log[0].user_agent, 'hub-test/1.0');
  assert.equal(log[0].auth, 'Bearer abc');
  assert.equal(log[0].range, null);
  assert.ok(log[0].bytes > 0);
  assert.equal(log[1].bytes, 0);
  assert.equal(log[2].range, 'bytes=0-99');
  assert.equal(log[2].bytes, 100);
  assert.equal(log[3].auth, null);
  assert.equal(log[3].bytes, 0);
  await reset();
  assert.deepEqual(await control('/_control/log'), []);
});

test('SIGTERM stops the hub', async () => {
  const h = await startHub(['--lfs-threshold', '10']);
  const tree = JSON.parse((await get(`${h.base}/api/models/test-org/tiny/tree/main?recursive=true`)).body);
  assert.ok(tree.find((e) => e.path === 'config.json').lfs, '--lfs-threshold makes small files LFS');
  assert.equal(await h.stop(), 0);
  assert.equal(h.stderr(), '');
});
