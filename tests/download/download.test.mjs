// Black-box tests of Hugging Face downloads: `exo download` (the CLI) and
// the daemon's downloads (POST /models/add, /place_instance, /download/*,
// /state), against the hub imitation tests/hub/hub.mjs with its fault
// injection and request log. Run by tests/integration/test_download.sh:
//
//   node --test --test-concurrency=1 --test-reporter=./tests/e2e/reporter.mjs \
//        tests/download/download.test.mjs
//
// EXO_BIN: the binary under test (default build/exo).
// The model served is stories260K (tests/fixtures/stories260K, converted as
// scripts/run.sh does), plus random big files where a test needs bytes in
// flight. Every child (hubs, CLIs, daemons, their runners) is killed in the
// after hook; the temp dir is removed.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const HUB_JS = path.join(REPO, 'tests/hub/hub.mjs');
const SRC_BIN = path.resolve(REPO, process.env.EXO_BIN || 'build/exo');
const STORIES_FIX = path.join(REPO, 'tests/fixtures/stories260K');
const TOKEN = 'hf_exo_download_test_token';
const MiB = 1 << 20;
const STORIES_TEMPLATE =
  "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] | trim }}" +
  "{% else %}{{ m['content'] }}{% endif %}{% endfor %}";

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const sha256 = (b) => crypto.createHash('sha256').update(b).digest('hex');

let TMP; // the suite's temp dir
let EXO; // the binary under test
let HUB_ROOT; // repos: HUB_ROOT/<org>/<name>/
let STORIES_SRC; // the converted stories260K HF dir (a template for repos)
let hub; // the main hub (no token)
let tokHub; // a hub started with --token TOKEN
let seq = 0;

// ---- children ----------------------------------------------------------------------

const children = new Set();
function track(proc) {
  children.add(proc);
  proc.once('exit', () => children.delete(proc));
  return proc;
}
// The children of pid (runners of a daemon), from /proc.
function childPids(pid) {
  const out = [];
  for (const e of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${e}/stat`, 'utf8');
      if (+stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1] === pid) out.push(+e);
    } catch { /* gone meanwhile */ }
  }
  return out;
}
function killAll() {
  for (const p of children) {
    for (const c of childPids(p.pid)) { try { process.kill(c, 'SIGKILL'); } catch { /* gone */ } }
    try { p.kill('SIGKILL'); } catch { /* gone */ }
  }
}
process.on('exit', killAll);
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => {
    killAll();
    process.exit(sig === 'SIGINT' ? 130 : 143);
  });
}

// ---- the environment every exo child gets --------------------------------------------

function exoEnv(extra = {}) {
  const env = { ...process.env };
  for (const k of ['HF_TOKEN', 'HF_HOME', 'HF_HUB_OFFLINE', 'HF_ENDPOINT', 'EXO_MODELS_DIRS',
    'EXO_MODELS_READ_ONLY_DIRS', 'EXO_HOME', 'EXO_DEFAULT_MODELS_DIR', 'XDG_DATA_HOME', 'XDG_CACHE_HOME',
    'EXO_DOWNLOAD_ATTEMPTS', 'EXO_DOWNLOAD_STALL_S', 'EXO_DOWNLOAD_BACKOFF_MS']) delete env[k];
  Object.assign(env, {
    HOME: path.join(TMP, 'home'), // no ~/.cache/huggingface/token, no user models dir
    HF_ENDPOINT: hub.base,
    EXO_DOWNLOAD_BACKOFF_MS: '20',
    EXO_NAMESPACE: `exo-dl-test-${process.pid}`,
  }, extra);
  for (const [k, v] of Object.entries(env)) if (v === undefined) delete env[k];
  return env;
}

// ---- the hub -----------------------------------------------------------------------------

async function startHub(args = []) {
  const child = track(spawn(process.execPath, [HUB_JS, '--root', HUB_ROOT, '--port', '0', ...args],
    { stdio: ['ignore', 'pipe', 'pipe'] }));
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
  const base = `http://127.0.0.1:${port}`;
  const control = async (method, p, body) => {
    const r = await fetch(base + p, { method, body: body === undefined ? undefined : JSON.stringify(body) });
    const text = await r.text();
    if (!r.ok) throw new Error(`hub ${method} ${p}: ${r.status} ${text}`);
    return JSON.parse(text);
  };
  return {
    base,
    child,
    stderr: () => stderr,
    faults: (list) => control('POST', '/_control/faults', list),
    reset: () => control('POST', '/_control/reset', {}),
    log: () => control('GET', '/_control/log'),
  };
}

// Log helpers. The CDN path of an LFS file, the resolve path of any file.
const cdnPath = (id, file) => `/_cdn/${id}/${file}`;
const resolvePath = (id, file) => `/${id}/resolve/main/${file}`;
const treePath = (id) => `/api/models/${id}/tree/main`;
const rangeStart = (e) => {
  const m = /^bytes=(\d+)-$/.exec(e.range ?? '');
  return m ? +m[1] : null;
};
const fmtLog = (log) => log.map((e) => `${e.method} ${e.path} ${e.range ?? ''} -> ${e.status} (${e.bytes} B)`).join('\n');

// ---- repos ---------------------------------------------------------------------------------

// A repo of the hub: stories260K's files (unless stories is false) plus
// random files {name: size}. Returns {id, dir}.
function makeRepo(prefix, { stories = true, extra = {}, gated = false } = {}) {
  const id = `${prefix}/m${++seq}`;
  const dir = path.join(HUB_ROOT, id);
  fs.mkdirSync(dir, { recursive: true });
  if (stories) {
    for (const f of fs.readdirSync(STORIES_SRC)) fs.copyFileSync(path.join(STORIES_SRC, f), path.join(dir, f));
  }
  for (const [name, size] of Object.entries(extra)) fs.writeFileSync(path.join(dir, name), crypto.randomBytes(size));
  if (gated) fs.writeFileSync(path.join(dir, '.gated'), '');
  return { id, dir };
}

// The files of a dir, recursively (relative paths), skipping nothing.
function listFiles(dir, rel = '') {
  const out = [];
  for (const e of fs.readdirSync(path.join(dir, rel), { withFileTypes: true })) {
    const p = rel ? `${rel}/${e.name}` : e.name;
    if (e.isDirectory()) out.push(...listFiles(dir, p));
    else out.push(p);
  }
  return out.sort();
}

const dirName = (id) => id.replace('/', '--');
const readMeta = (modelDir) => {
  try {
    return JSON.parse(fs.readFileSync(path.join(modelDir, '.exo-download.json'), 'utf8'));
  } catch {
    return null;
  }
};
const size = (p) => { try { return fs.statSync(p).size; } catch { return -1; } };

// Every file of the repo is in modelDir with the same bytes, and nothing in
// flight is left.
function assertSameFiles(repoDir, modelDir, files = listFiles(repoDir).filter((f) => !f.startsWith('.'))) {
  for (const f of files) {
    const want = fs.readFileSync(path.join(repoDir, f));
    const p = path.join(modelDir, f);
    assert.ok(fs.existsSync(p), `${f} missing in ${modelDir}: ${listFiles(modelDir).join(', ')}`);
    const got = fs.readFileSync(p);
    assert.equal(got.length, want.length, `${f}: size`);
    assert.ok(got.equals(want), `${f}: bytes differ from the hub's`);
  }
  const partials = listFiles(modelDir).filter((f) => f.endsWith('.partial'));
  assert.deepEqual(partials, [], 'no .partial file left');
}

// ---- a 2-file checkpoint -----------------------------------------------------------------

function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  return { header, data: buf.subarray(8 + n) };
}

function writeSafetensors(file, header, chunks) {
  let json = JSON.stringify(header);
  // the data starts 8-byte aligned: the header is padded with spaces
  json += ' '.repeat((8 - ((8 + Buffer.byteLength(json)) % 8)) % 8);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(Buffer.byteLength(json)));
  fs.writeFileSync(file, Buffer.concat([len, Buffer.from(json), ...chunks]));
}

const SPLIT_FILES = ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'];

// Splits dir/model.safetensors into the embedding + layers 0-2 and layers
// 3-4 + everything else, with model.safetensors.index.json.
function splitCheckpoint(dir) {
  const src = path.join(dir, 'model.safetensors');
  const { header, data } = readSafetensors(src);
  const part = (name) => {
    const m = /\.layers\.(\d+)\./.exec(name);
    if (m) return +m[1] <= 2 ? 0 : 1;
    return name.includes('embed_tokens') ? 0 : 1;
  };
  const weightMap = {};
  let total = 0;
  for (let p = 0; p < 2; p++) {
    const h = header.__metadata__ ? { __metadata__: header.__metadata__ } : {};
    const chunks = [];
    let off = 0;
    for (const name of Object.keys(header).filter((k) => k !== '__metadata__' && part(k) === p)) {
      const t = header[name];
      const [s, e] = t.data_offsets;
      chunks.push(data.subarray(s, e));
      h[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + (e - s)] };
      off += e - s;
      total += e - s;
      weightMap[name] = SPLIT_FILES[p];
    }
    writeSafetensors(path.join(dir, SPLIT_FILES[p]), h, chunks);
  }
  fs.writeFileSync(path.join(dir, 'model.safetensors.index.json'),
    JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2));
  fs.rmSync(src);
  return weightMap;
}

// ---- the CLI -----------------------------------------------------------------------------

// Runs `exo download ...`; resolves {code, signal, stdout, stderr, ms}.
// onSpawn(proc) may act on the running process (e.g. signal it).
function exoDownload(args, { env = {}, timeoutMs = 60000, onSpawn } = {}) {
  return new Promise((resolve) => {
    const t0 = performance.now();
    const proc = track(spawn(EXO, ['download', ...args], { env: exoEnv(env), stdio: ['ignore', 'pipe', 'pipe'] }));
    let stdout = '';
    let stderr = '';
    proc.stdout.on('data', (d) => (stdout += d));
    proc.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => proc.kill('SIGKILL'), timeoutMs);
    proc.once('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, ms: performance.now() - t0 });
    });
    onSpawn?.(proc);
  });
}

const tail = (r) => `exit ${r.code}${r.signal ? ` (${r.signal})` : ''}; stderr: ${r.stderr.slice(-1500)}`;

// A fresh models dir for one test.
const modelsDir = () => fs.mkdtempSync(path.join(TMP, 'models-'));

async function waitFor(what, fn, timeoutMs = 20000, stepMs = 25) {
  const t0 = Date.now();
  let last;
  while (Date.now() - t0 < timeoutMs) {
    last = await fn();
    if (last) return last;
    await sleep(stepMs);
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
}

// ---- the daemon ------------------------------------------------------------------------------

class Daemon {
  constructor(proc) {
    this.proc = proc;
    this.stderr = '';
    this.port = 0;
    this.nodeId = null;
    this.exit = undefined;
    this.exited = new Promise((resolve) => proc.once('exit', (code, signal) => {
      this.exit = { code, signal };
      resolve(this.exit);
    }));
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => (this.stderr += d));
    proc.stdout.resume();
  }
  get base() { return `http://127.0.0.1:${this.port}`; }
  async stop(signal = 'SIGTERM') {
    if (this.exit) return this.exit;
    const runners = childPids(this.proc.pid);
    this.proc.kill(signal);
    const t = setTimeout(() => this.proc.kill('SIGKILL'), 10000);
    const r = await this.exited;
    clearTimeout(t);
    for (const pid of runners) { try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ } }
    return r;
  }
  async get(p) {
    const r = await fetch(this.base + p);
    const text = await r.text();
    if (!r.ok) throw new Error(`GET ${p}: ${r.status} ${text}`);
    return JSON.parse(text);
  }
  async req(method, p, body) {
    const r = await fetch(this.base + p, {
      method, headers: { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await r.text();
    let json;
    try { json = JSON.parse(text); } catch { json = undefined; }
    return { status: r.status, text, json };
  }
  post(p, body) { return this.req('POST', p, body); }
  state() { return this.get('/state'); }
}

const daemons = new Set();
async function startDaemon({ dataDir, models, offline = false, env = {} }) {
  const args = ['serve', '--api-port', '0', '--host', '127.0.0.1', '--data-dir', dataDir, '--models-dir', models,
    '--no-discovery', '--cluster-port', '0', '--threads', '1', ...(offline ? ['--offline'] : [])];
  const d = new Daemon(track(spawn(EXO, args, { env: exoEnv(env), stdio: ['ignore', 'pipe', 'pipe'] })));
  daemons.add(d);
  await waitFor('the daemon to listen', async () => {
    if (d.exit) throw new Error(`exo serve exited ${JSON.stringify(d.exit)}: ${d.stderr}`);
    const m = /API listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(d.stderr);
    const n = /node ([0-9a-f]+) started/.exec(d.stderr);
    if (m && n) {
      d.port = +m[1];
      d.nodeId = n[1];
      return true;
    }
    return false;
  }, 15000);
  // placement needs the node's compute backend in the State (node info comes
  // a moment after the API is up)
  await waitFor('the node\'s compute backend in /state', async () => {
    const st = await d.state();
    return (st.nodeBackends?.[d.nodeId]?.length ?? 0) > 0;
  }, 15000, 50);
  return d;
}

// The download entries of a model in /state: [{kind, ...body}].
function downloadsOf(st, modelId) {
  const out = [];
  for (const list of Object.values(st.downloads ?? {})) {
    for (const item of list) {
      const [kind, body] = Object.entries(item)[0];
      if (body.modelId === modelId) out.push({ kind, ...body });
    }
  }
  return out;
}

// {runnerId: {status, body}} of the runners of a model's instances.
function runnersOf(st, modelId) {
  const out = {};
  for (const inst of Object.values(st.instances ?? {})) {
    const body = Object.values(inst)[0];
    if (body.shardAssignments?.modelId !== modelId) continue;
    for (const rid of Object.keys(body.shardAssignments.runnerToShard ?? {})) {
      const s = st.runners?.[rid];
      out[rid] = s ? { status: Object.keys(s)[0], body: Object.values(s)[0] } : { status: 'none' };
    }
  }
  return out;
}

function instancesOf(st, modelId) {
  return Object.values(st.instances ?? {}).filter((inst) => Object.values(inst)[0].shardAssignments?.modelId === modelId);
}

async function waitDownload(d, modelId, kind, timeoutMs = 30000) {
  let st;
  try {
    return await waitFor(`${modelId}: ${kind}`, async () => {
      st = await d.state();
      return downloadsOf(st, modelId).find((x) => x.kind === kind);
    }, timeoutMs, 50);
  } catch (e) {
    throw new Error(`${e.message}; downloads: ${JSON.stringify(st?.downloads)}; log: ${d.stderr.slice(-1500)}`);
  }
}

async function waitReady(d, modelId, timeoutMs = 30000) {
  let st;
  try {
    await waitFor(`${modelId} ready`, async () => {
      st = await d.state();
      const rs = Object.values(runnersOf(st, modelId));
      return rs.length > 0 && rs.every((r) => r.status === 'RunnerReady');
    }, timeoutMs, 50);
  } catch (e) {
    throw new Error(`${e.message}; runners: ${JSON.stringify(st?.runners)}; downloads: ${JSON.stringify(st?.downloads)}; ` +
      `log: ${d.stderr.slice(-1500)}`);
  }
}

async function chat(d, modelId) {
  const r = await d.post('/v1/chat/completions', {
    model: modelId, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 12, temperature: 0,
  });
  assert.equal(r.status, 200, `chat: ${r.text}`);
  const content = r.json?.choices?.[0]?.message?.content;
  assert.equal(typeof content, 'string', `chat: ${r.text}`);
  assert.ok(content.trim().length > 0, `chat: empty content: ${r.text}`);
  return content;
}

async function modelEntry(d, modelId, query = '') {
  const list = await d.get(`/v1/models${query}`);
  return list.data.find((m) => m.id === modelId);
}

// POST /models/add answers once the command is sent; the card is in the
// State (and placeable) a moment later.
async function addModel(d, modelId) {
  const r = await d.post('/models/add', { model_id: modelId });
  assert.equal(r.status, 200, `/models/add ${modelId}: ${r.text}`);
  await waitFor(`${modelId} in /v1/models`, async () => (await modelEntry(d, modelId))?.is_custom === true, 5000);
  return r.json;
}

async function place(d, modelId) {
  const r = await d.post('/place_instance', { model_id: modelId });
  assert.equal(r.status, 200, `/place_instance ${modelId}: ${r.text}`);
  return r.json;
}

// ---- set-up --------------------------------------------------------------------------------


before(async () => {
  TMP = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-dl-test-'));
  fs.mkdirSync(path.join(TMP, 'home'));
  HUB_ROOT = path.join(TMP, 'hub');
  fs.mkdirSync(HUB_ROOT);
  EXO = SRC_BIN;
  assert.ok(fs.existsSync(EXO) && fs.statSync(EXO).mode & 0o111, `no exo binary at ${EXO} (make)`);
  // stories260K as scripts/run.sh makes it
  STORIES_SRC = path.join(TMP, 'stories260K');
  execFileSync(EXO, ['convert-llama2c', path.join(STORIES_FIX, 'stories260K.bin'), path.join(STORIES_FIX, 'tok512.bin'),
    STORIES_SRC], { stdio: 'pipe' });
  fs.writeFileSync(path.join(STORIES_SRC, 'chat_template.jinja'), STORIES_TEMPLATE);
  for (const f of ['config.json', 'model.safetensors', 'tokenizer.json', 'tokenizer_config.json'])
    assert.ok(fs.existsSync(path.join(STORIES_SRC, f)), `convert-llama2c made no ${f}`);
  [hub, tokHub] = await Promise.all([startHub(), startHub(['--token', TOKEN])]);
});

after(async () => {
  await Promise.all([...daemons].map((d) => d.stop('SIGKILL')));
  killAll();
  await sleep(100);
  if (TMP) {
    // a tmpfs a failed test left mounted
    try {
      for (const line of fs.readFileSync('/proc/mounts', 'utf8').split('\n')) {
        const mnt = line.split(' ')[1];
        if (mnt && mnt.startsWith(TMP + '/')) execFileSync('umount', ['-l', mnt], { stdio: 'ignore' });
      }
    } catch { /* not mounted */ }
    fs.rmSync(TMP, { recursive: true, force: true });
  }
});

// ---- CLI ---------------------------------------------------------------------------------------

test('cli: a clean download is byte-identical, recorded complete, nothing in flight left', async () => {
  await hub.reset();
  const repo = makeRepo('clean', { extra: { 'extra.safetensors': 3 * MiB } });
  fs.mkdirSync(path.join(repo.dir, 'sub/deeper'), { recursive: true });
  fs.writeFileSync(path.join(repo.dir, 'sub/deeper/notes.txt'), 'a file in a subfolder\n');
  // original/ (the checkpoint in its first format) is never downloaded, as exo does
  fs.mkdirSync(path.join(repo.dir, 'original'));
  fs.writeFileSync(path.join(repo.dir, 'original/consolidated.safetensors'), crypto.randomBytes(64 * 1024));
  const models = modelsDir();
  const r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  const dir = path.join(models, dirName(repo.id));
  assert.equal(r.stdout.trim(), dir, 'stdout is the model dir');
  assertSameFiles(repo.dir, dir, listFiles(repo.dir).filter((f) => !f.startsWith('original/')));
  assert.ok(!fs.existsSync(path.join(dir, 'original')), 'original/ skipped');
  const meta = readMeta(dir);
  assert.equal(meta?.complete, true, `metadata: ${JSON.stringify(meta)}`);
  assert.equal(meta.model_id, repo.id);
  const repoFiles = listFiles(repo.dir);
  assert.deepEqual(meta.files.map((f) => f.path).sort(), repoFiles, 'the metadata lists every repo file');
  for (const f of meta.files) {
    const bytes = fs.readFileSync(path.join(repo.dir, f.path));
    assert.equal(f.size, bytes.length, `${f.path}: size in metadata`);
    if (f.path.endsWith('.safetensors')) assert.equal(f.sha256, sha256(bytes), `${f.path}: sha256 in metadata`);
    else assert.match(f.git_oid ?? '', /^[0-9a-f]{40}$/, `${f.path}: git oid in metadata`);
  }
  const log = await hub.log();
  for (const f of repoFiles) {
    const gets = log.filter((e) => e.method === 'GET' && e.path === resolvePath(repo.id, f));
    assert.equal(gets.length, f.startsWith('original/') ? 0 : 1, `${f} resolved once:\n${fmtLog(log)}`);
  }
});

// Once a dir whose .exo-download.json said complete was taken as on disk
// without looking at its files, so a deleted weight file was never fetched.
test('cli: a file deleted from a complete download is fetched again', async () => {
  await hub.reset();
  const repo = makeRepo('heal');
  const models = modelsDir();
  let r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  const dir = path.join(models, dirName(repo.id));
  fs.rmSync(path.join(dir, 'model.safetensors'));
  await hub.reset();
  r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  assertSameFiles(repo.dir, dir);
  const log = await hub.log();
  assert.equal(log.filter((e) => e.path === cdnPath(repo.id, 'model.safetensors')).length, 1,
    `the missing file is fetched:\n${fmtLog(log)}`);
  assert.equal(log.filter((e) => e.path === resolvePath(repo.id, 'config.json')).length, 0,
    `the files still there are not:\n${fmtLog(log)}`);
});

test('cli: a file list in pages is followed to its end; a next page elsewhere is not', async () => {
  // huggingface.co lists 1000 entries a page; these hubs list 2
  const paged = await startHub(['--tree-page', '2']);
  const repo = makeRepo('paged', { extra: { 'a.txt': 10, 'b.txt': 20 } });
  fs.mkdirSync(path.join(repo.dir, 'sub'));
  fs.writeFileSync(path.join(repo.dir, 'sub/c.txt'), 'in a folder\n');
  const models = modelsDir();
  let r = await exoDownload([repo.id, '--models-dir', models], { env: { HF_ENDPOINT: paged.base } });
  assert.equal(r.code, 0, tail(r));
  const dir = path.join(models, dirName(repo.id));
  assertSameFiles(repo.dir, dir);
  assert.deepEqual(readMeta(dir).files.map((f) => f.path).sort(), listFiles(repo.dir), 'every page\'s files');
  const entries = listFiles(repo.dir).length + 1; // and the folder
  const pages = (await paged.log()).filter((e) => e.path === treePath(repo.id));
  assert.equal(pages.length, Math.ceil(entries / 2), `${entries} entries, 2 a page:\n${fmtLog(pages)}`);

  // A listing whose next page is on another host would take the token
  // there: refused, and nothing is downloaded from a partial list.
  const elsewhere = await startHub(['--tree-page', '2', '--link-origin', 'http://127.0.0.2:9']);
  const other = modelsDir();
  r = await exoDownload([repo.id, '--models-dir', other], { env: { HF_ENDPOINT: elsewhere.base, HF_TOKEN: TOKEN } });
  assert.notEqual(r.code, 0, 'a list that leaves the endpoint fails');
  assert.match(r.stderr, /next page is outside/, tail(r));
  assert.deepEqual(listFiles(other).filter((f) => !f.endsWith('.json') && !f.includes('lock')), [],
    `no file fetched from a partial list: ${listFiles(other).join(', ')}`);
  paged.child.kill('SIGKILL');
  elsewhere.child.kill('SIGKILL');
});

test('cli: a connection dropped mid-file resumes with a Range request', async () => {
  await hub.reset();
  const repo = makeRepo('drop', { extra: { 'extra.safetensors': 8 * MiB } });
  const cut = 3 * MiB;
  await hub.faults([{ match: 'extra.safetensors', kind: 'drop', after_bytes: cut, times: 1 }]);
  const models = modelsDir();
  const r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  const dir = path.join(models, dirName(repo.id));
  assertSameFiles(repo.dir, dir);
  assert.equal(readMeta(dir)?.complete, true);
  const log = await hub.log();
  const cdn = log.filter((e) => e.path === cdnPath(repo.id, 'extra.safetensors'));
  assert.ok(cdn.length >= 2, `a second request after the drop:\n${fmtLog(log)}`);
  assert.equal(cdn[0].range, null, 'the first request has no Range');
  const resumed = cdn.slice(1).map(rangeStart).filter((n) => n !== null);
  assert.ok(resumed.some((n) => n > 0 && n <= cut), `a resume "Range: bytes=N-" with 0 < N <= ${cut}:\n${fmtLog(log)}`);
  // the resume did not download the whole file again
  const served = cdn.reduce((n, e) => n + e.bytes, 0);
  assert.ok(served < 8 * MiB + cut, `bytes served ${served}: the file was fetched again from 0`);
});

test('cli: 503 twice, then success (file list and file retried)', async () => {
  await hub.reset();
  const repo = makeRepo('s503');
  await hub.faults([
    { match: treePath(repo.id), kind: 'status', code: 503, times: 1 },
    { match: 'model.safetensors', kind: 'status', code: 503, times: 2 },
  ]);
  const models = modelsDir();
  const r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  const dir = path.join(models, dirName(repo.id));
  assertSameFiles(repo.dir, dir);
  assert.equal(readMeta(dir)?.complete, true);
  const log = await hub.log();
  const tree = log.filter((e) => e.path === treePath(repo.id));
  assert.deepEqual(tree.map((e) => e.status), [503, 200], `tree retried:\n${fmtLog(log)}`);
  const res = log.filter((e) => e.path === resolvePath(repo.id, 'model.safetensors'));
  assert.deepEqual(res.map((e) => e.status), [503, 503, 302], `resolve retried:\n${fmtLog(log)}`);
});

test('cli: 429 with Retry-After: 1 waits at least a second, then succeeds', async () => {
  await hub.reset();
  const repo = makeRepo('s429');
  await hub.faults([{ match: 'model.safetensors', kind: 'status', code: 429, retry_after: 1, times: 1 }]);
  const models = modelsDir();
  const r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  assertSameFiles(repo.dir, path.join(models, dirName(repo.id)));
  const log = await hub.log();
  const res = log.filter((e) => e.path === resolvePath(repo.id, 'model.safetensors'));
  assert.deepEqual(res.map((e) => e.status), [429, 302], `retried after the 429:\n${fmtLog(log)}`);
  // EXO_DOWNLOAD_BACKOFF_MS is 20: only Retry-After makes it wait this long
  assert.ok(r.ms >= 1000, `took ${r.ms.toFixed(0)} ms: the retry did not wait for Retry-After`);
});

test('cli: a corrupt byte is re-downloaded; corrupt forever fails with a checksum error', async () => {
  await hub.reset();
  const repo = makeRepo('corrupt');
  await hub.faults([{ match: 'model.safetensors', kind: 'corrupt', times: 1 }]);
  let models = modelsDir();
  let r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  let dir = path.join(models, dirName(repo.id));
  assertSameFiles(repo.dir, dir);
  assert.equal(readMeta(dir)?.complete, true);
  let log = await hub.log();
  assert.equal(log.filter((e) => e.path === cdnPath(repo.id, 'model.safetensors')).length, 2,
    `fetched twice (corrupt, then good):\n${fmtLog(log)}`);

  await hub.reset();
  await hub.faults([{ match: 'model.safetensors', kind: 'corrupt', times: -1 }]);
  models = modelsDir();
  r = await exoDownload([repo.id, '--models-dir', models], { env: { EXO_DOWNLOAD_ATTEMPTS: '2' } });
  assert.equal(r.code, 1, tail(r));
  assert.match(r.stderr, /exo download: .*checksum/i, tail(r));
  dir = path.join(models, dirName(repo.id));
  assert.ok(!fs.existsSync(path.join(dir, 'model.safetensors')), 'no final-named model.safetensors');
  assert.notEqual(readMeta(dir)?.complete, true, 'not marked complete');
  log = await hub.log();
  assert.equal(log.filter((e) => e.path === cdnPath(repo.id, 'model.safetensors')).length, 2,
    `EXO_DOWNLOAD_ATTEMPTS=2: two tries:\n${fmtLog(log)}`);
});

test('cli: a stalled transfer is aborted after EXO_DOWNLOAD_STALL_S and resumed', async () => {
  await hub.reset();
  const repo = makeRepo('stall', { extra: { 'extra.safetensors': 4 * MiB } });
  const cut = 1 * MiB;
  await hub.faults([{ match: 'extra.safetensors', kind: 'stall', after_bytes: cut, times: 1 }]);
  const models = modelsDir();
  const r = await exoDownload([repo.id, '--models-dir', models], { env: { EXO_DOWNLOAD_STALL_S: '1' }, timeoutMs: 30000 });
  assert.equal(r.code, 0, tail(r));
  assertSameFiles(repo.dir, path.join(models, dirName(repo.id)));
  assert.ok(r.ms >= 900, `took ${r.ms.toFixed(0)} ms: the stall was not waited for`);
  const log = await hub.log();
  const cdn = log.filter((e) => e.path === cdnPath(repo.id, 'extra.safetensors'));
  assert.equal(cdn.length, 2, `one stalled request, one resumed:\n${fmtLog(log)}`);
  const n = rangeStart(cdn[1]);
  assert.ok(n !== null && n > 0 && n <= cut, `the second attempt resumes (Range bytes=N-, 0 < N <= ${cut}):\n${fmtLog(log)}`);
});

test('cli: a full disk fails with a disk-space message and publishes nothing incomplete', async (t) => {
  if (process.getuid?.() !== 0) return t.skip('needs root to mount a tmpfs');
  await hub.reset();
  const mnt = fs.mkdtempSync(path.join(TMP, 'tmpfs-'));
  try {
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=2m', 'tmpfs', mnt], { stdio: 'pipe' });
  } catch (e) {
    return t.skip(`mount failed: ${e.message}`);
  }
  try {
    // (a) the files cannot fit: refused before any big transfer
    const big = makeRepo('full', { stories: false, extra: { 'model.safetensors': 4 * MiB } });
    fs.copyFileSync(path.join(STORIES_SRC, 'config.json'), path.join(big.dir, 'config.json'));
    // the default models dir is the tmpfs too (else the download goes there)
    const env = { EXO_DEFAULT_MODELS_DIR: mnt };
    let r = await exoDownload([big.id, '--models-dir', mnt], { env });
    assert.equal(r.code, 1, tail(r));
    assert.match(r.stderr, /exo download: .*(disk space|no space left)/i, tail(r));
    let dir = path.join(mnt, dirName(big.id));
    assert.ok(!fs.existsSync(path.join(dir, 'model.safetensors')), 'no final-named model.safetensors');
    assert.notEqual(readMeta(dir)?.complete, true, 'not marked complete');
    fs.rmSync(dir, { recursive: true, force: true });

    // (b) the disk fills up during the transfer (someone else writes):
    // ENOSPC on write, no retry, the partial file kept for a resume
    const mid = makeRepo('fullmid', { stories: false, extra: { 'model.safetensors': 1536 * 1024 } });
    fs.copyFileSync(path.join(STORIES_SRC, 'config.json'), path.join(mid.dir, 'config.json'));
    await hub.faults([{ match: 'model.safetensors', kind: 'slow', bytes_per_second: 1 * MiB, times: 1 }]);
    dir = path.join(mnt, dirName(mid.id));
    const partial = path.join(dir, 'model.safetensors.partial');
    r = await exoDownload([mid.id, '--models-dir', mnt], {
      env,
      onSpawn: async () => {
        try {
          await waitFor('bytes in the partial file', () => size(partial) > 256 * 1024, 10000);
        } catch { return; } // the assertions below report it
        // fill the rest of the tmpfs
        const fd = fs.openSync(path.join(mnt, 'filler'), 'w');
        const chunk = Buffer.alloc(64 * 1024);
        try { for (;;) fs.writeSync(fd, chunk); } catch { /* ENOSPC */ } finally { fs.closeSync(fd); }
      },
    });
    assert.equal(r.code, 1, tail(r));
    assert.match(r.stderr, /exo download: .*(disk space|no space left)/i, tail(r));
    assert.ok(!fs.existsSync(path.join(dir, 'model.safetensors')), 'no final-named model.safetensors');
    assert.notEqual(readMeta(dir)?.complete, true, 'not marked complete');
    assert.ok(size(partial) > 0, 'the partial file is kept for a resume');
    const log = await hub.log();
    assert.equal(log.filter((e) => e.path === cdnPath(mid.id, 'model.safetensors')).length, 1,
      `a full disk is not retried:\n${fmtLog(log)}`);
  } finally {
    try { execFileSync('umount', ['-l', mnt], { stdio: 'ignore' }); } catch { /* ignore */ }
  }
});

test('cli: 401 / 403 gated / 404 fail at once with a clear message; a token is sent where needed', async () => {
  const repo = makeRepo('auth');
  // 401: no token
  await tokHub.reset();
  let r = await exoDownload([repo.id, '--models-dir', modelsDir()], { env: { HF_ENDPOINT: tokHub.base } });
  assert.equal(r.code, 1, tail(r));
  assert.match(r.stderr, /exo download: .*401/, tail(r));
  assert.match(r.stderr, /HF_TOKEN/, tail(r));
  let log = await tokHub.log();
  assert.equal(log.length, 1, `a 401 is not retried:\n${fmtLog(log)}`);

  // the right token: every hub request carries it
  await tokHub.reset();
  const models = modelsDir();
  r = await exoDownload([repo.id, '--models-dir', models], { env: { HF_ENDPOINT: tokHub.base, HF_TOKEN: TOKEN } });
  assert.equal(r.code, 0, tail(r));
  assertSameFiles(repo.dir, path.join(models, dirName(repo.id)));
  log = await tokHub.log();
  const apiRes = log.filter((e) => e.path.startsWith('/api/') || e.path.includes('/resolve/'));
  assert.ok(apiRes.some((e) => e.path.startsWith('/api/')) && apiRes.some((e) => e.path.includes('/resolve/')),
    fmtLog(log));
  for (const e of apiRes) assert.equal(e.auth, `Bearer ${TOKEN}`, `${e.path}: Authorization header`);

  // 403: a gated repo
  await hub.reset();
  const gated = makeRepo('gated', { gated: true });
  r = await exoDownload([gated.id, '--models-dir', modelsDir()]);
  assert.equal(r.code, 1, tail(r));
  assert.match(r.stderr, /exo download: .*403/, tail(r));
  assert.match(r.stderr, /gated/i, tail(r));
  log = await hub.log();
  assert.equal(log.length, 1, `a 403 is not retried:\n${fmtLog(log)}`);

  // 404: no such repo
  await hub.reset();
  r = await exoDownload(['nobody/no-such-model', '--models-dir', modelsDir()]);
  assert.equal(r.code, 1, tail(r));
  assert.match(r.stderr, /exo download: .*404/, tail(r));
  log = await hub.log();
  assert.equal(log.length, 1, `a 404 is not retried:\n${fmtLog(log)}`);
});

test('cli: offline uses the disk only and never opens a connection', async () => {
  await hub.reset();
  const repo = makeRepo('offline');
  const models = modelsDir();
  let r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  const dir = path.join(models, dirName(repo.id));

  await hub.reset();
  r = await exoDownload([repo.id, '--models-dir', models, '--offline']);
  assert.equal(r.code, 0, tail(r));
  assert.equal(r.stdout.trim(), dir);
  r = await exoDownload([repo.id, '--models-dir', models], { env: { HF_HUB_OFFLINE: '1' } });
  assert.equal(r.code, 0, tail(r));
  assert.equal(r.stdout.trim(), dir);
  assert.deepEqual(await hub.log(), [], 'offline: no request to the hub');

  // a model that is not on disk
  const missing = makeRepo('offline');
  for (const env of [{}, { HF_HUB_OFFLINE: '1' }]) {
    r = await exoDownload([missing.id, '--models-dir', models, ...(env.HF_HUB_OFFLINE ? [] : ['--offline'])], { env });
    assert.equal(r.code, 1, tail(r));
    assert.match(r.stderr, /exo download: .*not found locally in offline mode/, tail(r));
    assert.ok(!fs.existsSync(path.join(models, dirName(missing.id))), 'no model dir made offline');
  }
  assert.deepEqual(await hub.log(), [], 'offline: no request to the hub');

  // --delete removes it (no hub either); then it is not on disk
  r = await exoDownload([repo.id, '--models-dir', models, '--delete']);
  assert.equal(r.code, 0, tail(r));
  assert.ok(!fs.existsSync(dir), 'deleted');
  r = await exoDownload([repo.id, '--models-dir', models, '--delete']);
  assert.equal(r.code, 1, tail(r));
  assert.match(r.stderr, /exo download: .*not on disk/, tail(r));
  assert.deepEqual(await hub.log(), [], '--delete: no request to the hub');
});

test('cli: SIGINT / SIGTERM keep the partial file (exit 130); the next run resumes it', async () => {
  await hub.reset();
  const repo = makeRepo('resume', { extra: { 'extra.safetensors': 20 * MiB } });
  const models = modelsDir();
  const dir = path.join(models, dirName(repo.id));
  const partial = path.join(dir, 'extra.safetensors.partial');
  let have = 0;
  for (const sig of ['SIGINT', 'SIGTERM']) {
    await hub.reset();
    await hub.faults([{ match: 'extra.safetensors', kind: 'slow', bytes_per_second: 2 * MiB, times: 1 }]);
    const r = await exoDownload([repo.id, '--models-dir', models], {
      onSpawn: (proc) => setTimeout(() => proc.kill(sig), 1200),
    });
    assert.equal(r.code, 130, `${sig}: ${tail(r)}`);
    assert.equal(r.stdout, '', 'no model dir printed');
    const now = size(partial);
    assert.ok(now > have, `${sig}: the partial file grew (${have} -> ${now})`);
    assert.ok(now < 20 * MiB, 'not complete');
    assert.ok(!fs.existsSync(path.join(dir, 'extra.safetensors')), 'no final-named file');
    assert.notEqual(readMeta(dir)?.complete, true);
    if (have > 0) { // the second run resumed the first one's bytes
      const log = await hub.log();
      const cdn = log.filter((e) => e.path === cdnPath(repo.id, 'extra.safetensors'));
      assert.equal(rangeStart(cdn[0] ?? {}), have, `resumed at ${have}:\n${fmtLog(log)}`);
    }
    have = now;
  }

  await hub.reset(); // no slow fault now
  const r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  assertSameFiles(repo.dir, dir);
  assert.equal(readMeta(dir)?.complete, true);
  const log = await hub.log();
  const cdn = log.filter((e) => e.path === cdnPath(repo.id, 'extra.safetensors'));
  assert.equal(cdn.length, 1, fmtLog(log));
  const n = rangeStart(cdn[0]);
  assert.ok(n !== null && n >= have, `resumed with Range bytes=N-, N >= ${have}:\n${fmtLog(log)}`);
  assert.equal(cdn[0].bytes, 20 * MiB - n, 'only the rest was sent');
  // the small files already there are not fetched again
  assert.equal(log.filter((e) => e.path === resolvePath(repo.id, 'config.json')).length, 0, fmtLog(log));
});

// Once the file list's retries slept out every Retry-After (up to 300 s)
// whatever asked them to stop: a signal, a cancel, a shutdown.
test('cli: SIGINT during a rate-limit wait on the file list exits at once', async () => {
  await hub.reset();
  const repo = makeRepo('ratecancel');
  await hub.faults([{ match: treePath(repo.id), kind: 'status', code: 429, retry_after: 3, times: -1 }]);
  const r = await exoDownload([repo.id, '--models-dir', modelsDir()], {
    env: { EXO_DOWNLOAD_ATTEMPTS: '2' },
    onSpawn: (proc) => setTimeout(() => proc.kill('SIGINT'), 500),
  });
  assert.equal(r.code, 130, tail(r));
  assert.ok(r.ms < 500 + 1200, `exited ${(r.ms - 500).toFixed(0)} ms after SIGINT: the 429 wait was not interrupted`);
});

// Two downloads of one model into one dir share "<file>.partial": once with
// no lock, the slower one's rename failed although the file was complete.
test('cli: two concurrent downloads of one model into one dir both succeed', async () => {
  await hub.reset();
  const repo = makeRepo('concurrent', { extra: { 'extra.safetensors': 6 * MiB } });
  await hub.faults([{ match: 'extra.safetensors', kind: 'slow', bytes_per_second: 6 * MiB, times: 2 }]);
  const models = modelsDir();
  const first = exoDownload([repo.id, '--models-dir', models]);
  await sleep(300);
  const second = exoDownload([repo.id, '--models-dir', models]);
  const [a, b] = await Promise.all([first, second]);
  assert.equal(a.code, 0, tail(a));
  assert.equal(b.code, 0, tail(b));
  const dir = path.join(models, dirName(repo.id));
  assertSameFiles(repo.dir, dir);
  assert.equal(readMeta(dir)?.complete, true);
});

test('cli: --layers fetches only the shard\'s weight files; a whole download completes the dir', async () => {
  await hub.reset();
  const repo = makeRepo('split');
  const weightMap = splitCheckpoint(repo.dir);
  // the helper's split is right: every tensor is in the file the index names
  for (const f of SPLIT_FILES) {
    const { header } = readSafetensors(path.join(repo.dir, f));
    for (const k of Object.keys(header)) if (k !== '__metadata__') assert.equal(weightMap[k], f);
  }
  assert.match(weightMap['model.embed_tokens.weight'], /00001/);
  assert.match(weightMap['model.norm.weight'], /00002/);

  const models = modelsDir();
  const dir = path.join(models, dirName(repo.id));
  let r = await exoDownload([repo.id, '--models-dir', models, '--layers', '0:2']);
  assert.equal(r.code, 0, tail(r));
  assert.equal(r.stdout.trim(), dir);
  assertSameFiles(repo.dir, dir, ['config.json', 'model.safetensors.index.json', 'tokenizer.json', SPLIT_FILES[0]]);
  assert.ok(!fs.existsSync(path.join(dir, SPLIT_FILES[1])), 'layers 0-1 do not need the second file');
  assert.equal(readMeta(dir)?.complete, false, 'a shard\'s files are not the whole model');
  let log = await hub.log();
  assert.equal(log.filter((e) => e.path.endsWith(SPLIT_FILES[1])).length, 0, `second file never asked for:\n${fmtLog(log)}`);

  // the same shard again: on disk, nothing fetched
  await hub.reset();
  r = await exoDownload([repo.id, '--models-dir', models, '--layers', '0:2']);
  assert.equal(r.code, 0, tail(r));
  log = await hub.log();
  assert.equal(log.filter((e) => e.path.includes('.safetensors')).length, 0, `shard on disk: no weights fetched:\n${fmtLog(log)}`);

  // the whole model: only the missing file comes
  await hub.reset();
  r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  assertSameFiles(repo.dir, dir);
  assert.equal(readMeta(dir)?.complete, true);
  log = await hub.log();
  assert.equal(log.filter((e) => e.path.endsWith(SPLIT_FILES[0])).length, 0, `first file not fetched again:\n${fmtLog(log)}`);
  assert.ok(log.some((e) => e.path === cdnPath(repo.id, SPLIT_FILES[1])), fmtLog(log));

  // the last shard of a tied model needs the embedding too: both files
  const models2 = modelsDir();
  const dir2 = path.join(models2, dirName(repo.id));
  r = await exoDownload([repo.id, '--models-dir', models2, '--layers', '3:5']);
  assert.equal(r.code, 0, tail(r));
  assertSameFiles(repo.dir, dir2, SPLIT_FILES);
  assert.equal(readMeta(dir2)?.complete, true, 'every file is there: complete');

  // and the split checkpoint is a working model: the same greedy text as the original
  const gen = (d) => execFileSync(EXO, ['run', d, '--chat', 'Once upon a time', '--max-tokens', '8', '--temperature', '0',
    '--threads', '1'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  assert.equal(gen(dir), gen(STORIES_SRC));
});

// ---- daemon ------------------------------------------------------------------------------------

test('daemon: first run from nothing: add, place, download, chat', async () => {
  await hub.reset();
  const repo = makeRepo('first');
  const models = modelsDir();
  const d = await startDaemon({ dataDir: fs.mkdtempSync(path.join(TMP, 'data-')), models });
  try {
    assert.equal(await modelEntry(d, repo.id), undefined, 'not listed before it is added');
    const added = await addModel(d, repo.id);
    assert.equal(added.status, 'downloadable');
    assert.equal(added.is_custom, true);
    const e = await waitFor('the custom card', () => modelEntry(d, repo.id), 5000);
    assert.equal(e.status, 'downloadable');
    assert.equal(e.is_custom, true);
    assert.equal(await modelEntry(d, repo.id, '?status=downloaded'), undefined);

    // an unknown repo cannot be added
    const bad = await d.post('/models/add', { model_id: 'nobody/no-such-model' });
    assert.ok(bad.status >= 400 && bad.status < 500, `${bad.status} ${bad.text}`);
    assert.match(bad.json?.error?.message ?? '', /404/, bad.text);
    const gated = makeRepo('first', { gated: true });
    const forbidden = await d.post('/models/add', { model_id: gated.id });
    assert.equal(forbidden.status, 403, forbidden.text);
    assert.match(forbidden.json?.error?.message ?? '', /gated/i, forbidden.text);

    await place(d, repo.id);
    const done = await waitDownload(d, repo.id, 'DownloadCompleted');
    assert.equal(done.modelDirectory, path.join(models, dirName(repo.id)));
    assert.equal(done.downloaded, done.total);
    assert.equal(done.completedFiles, done.totalFiles);
    await waitReady(d, repo.id);
    await chat(d, repo.id);
    assertSameFiles(repo.dir, path.join(models, dirName(repo.id)));
    assert.equal((await modelEntry(d, repo.id))?.status, 'downloaded');
    assert.ok(await modelEntry(d, repo.id, '?status=downloaded'), 'listed by ?status=downloaded');
    // a model a runner has loaded is not deleted (the node refuses the
    // command it was sent: the HTTP answer is only "command received")
    const del = await d.req('DELETE', `/download/${d.nodeId}/${repo.id}`);
    assert.ok(del.status < 500, `${del.status} ${del.text}`);
    await sleep(500);
    assert.ok(fs.existsSync(path.join(models, dirName(repo.id), 'model.safetensors')), 'the model in use stays');
    await chat(d, repo.id);
  } finally {
    await d.stop();
  }
});

test('daemon: /models/search: mlx-community\'s most downloaded first, anyone\'s where it has none', async () => {
  await hub.reset();
  const repo = (id, downloads) => {
    const dir = path.join(HUB_ROOT, id);
    fs.mkdirSync(dir, { recursive: true });
    fs.writeFileSync(path.join(dir, 'config.json'), '{}');
    fs.writeFileSync(path.join(dir, '.downloads'), String(downloads));
    fs.writeFileSync(path.join(dir, '.likes'), String(downloads % 7));
  };
  repo('mlx-community/Findable-4bit', 5);
  repo('mlx-community/Findable-8bit', 50);
  repo('someone/Findable-bf16', 500);
  repo('someone/Elsewhere-Only', 3);
  const d = await startDaemon({ dataDir: fs.mkdtempSync(path.join(TMP, 'data-')), models: modelsDir() });
  try {
    let r = await d.req('GET', '/models/search?query=findable');
    assert.equal(r.status, 200, r.text);
    assert.deepEqual(r.json.map((m) => m.id), ['mlx-community/Findable-8bit', 'mlx-community/Findable-4bit'],
      'mlx-community only, most downloaded first');
    assert.deepEqual(r.json[0], { id: 'mlx-community/Findable-8bit', author: 'mlx-community', downloads: 50,
      likes: 1, last_modified: null, tags: ['safetensors', 'text-generation'] });
    r = await d.req('GET', '/models/search?query=ELSEWHERE');
    assert.deepEqual(r.json.map((m) => m.id), ['someone/Elsewhere-Only'], 'anyone\'s where mlx-community has none');
    assert.equal(r.json[0].author, 'someone', 'the author from the id, which the hub\'s list does not send');
    r = await d.req('GET', '/models/search?query=findable&limit=1');
    assert.deepEqual(r.json.map((m) => m.id), ['mlx-community/Findable-8bit']);
    r = await d.req('GET', '/models/search?query=no-such-thing-anywhere');
    assert.equal(r.status, 200);
    assert.deepEqual(r.json, []);
    for (const bad of ['0', '101', 'x', '']) {
      r = await d.req('GET', `/models/search?query=a&limit=${bad}`);
      assert.equal(r.status, 400, `limit=${bad}: ${r.text}`);
    }
    const log = (await hub.log()).filter((e) => e.path === '/api/models');
    assert.equal(log.length, 6,
      `one request a search, two where the first found nothing, none for a bad limit:\n${fmtLog(log)}`);
    await hub.faults([{ match: '/api/models', kind: 'status', code: 500, times: -1 }]);
    r = await d.req('GET', '/models/search?query=findable');
    assert.equal(r.status, 502, r.text);
    assert.match(r.json?.error?.message ?? '', /500/, r.text);
    await hub.reset();
  } finally {
    await d.stop();
  }
  const off = await startDaemon({
    dataDir: fs.mkdtempSync(path.join(TMP, 'data-')), models: modelsDir(), offline: true,
  });
  try {
    await hub.reset();
    const r = await off.req('GET', '/models/search?query=findable');
    assert.equal(r.status, 503, r.text);
    assert.match(r.json?.error?.message ?? '', /offline/i, r.text);
    assert.equal((await hub.log()).length, 0, 'offline: no request');
  } finally {
    await off.stop();
  }
});

test('daemon: kill -9 mid-download, restart, place again: the download resumes', async () => {
  await hub.reset();
  const repo = makeRepo('crash');
  const models = modelsDir();
  const dataDir = fs.mkdtempSync(path.join(TMP, 'data-'));
  const partial = path.join(models, dirName(repo.id), 'model.safetensors.partial');
  await hub.faults([{ match: 'model.safetensors', kind: 'slow', bytes_per_second: 200 * 1024, times: 1 }]);
  let d = await startDaemon({ dataDir, models });
  await addModel(d, repo.id);
  await place(d, repo.id);
  await waitFor('bytes in the partial file', () => size(partial) > 100 * 1024, 15000);
  assert.equal((await modelEntry(d, repo.id))?.status, 'downloading', '/v1/models while it downloads');
  assert.ok(downloadsOf(await d.state(), repo.id).some((x) => x.kind === 'DownloadOngoing'), 'DownloadOngoing in /state');
  await d.stop('SIGKILL');
  const have = size(partial);
  assert.ok(have > 0 && have < size(path.join(repo.dir, 'model.safetensors')), `partial ${have}`);
  assert.notEqual(readMeta(path.join(models, dirName(repo.id)))?.complete, true);

  await hub.reset();
  d = await startDaemon({ dataDir, models });
  try {
    const st = await d.state();
    assert.equal(instancesOf(st, repo.id).length, 0, 'a restarted node starts from an empty State');
    assert.notEqual((await modelEntry(d, repo.id))?.status, 'downloaded', 'a half download is not a model');
    await addModel(d, repo.id);
    await place(d, repo.id);
    const done = await waitDownload(d, repo.id, 'DownloadCompleted');
    const modelSize = size(path.join(repo.dir, 'model.safetensors'));
    assert.equal(done.downloaded, done.total, JSON.stringify(done));
    assert.equal(done.downloadedThisSession, modelSize - have,
      `this session fetched only the rest of model.safetensors: ${JSON.stringify(done)}`);
    await waitReady(d, repo.id);
    await chat(d, repo.id);
    assertSameFiles(repo.dir, path.join(models, dirName(repo.id)));
    const log = await hub.log();
    const cdn = log.filter((e) => e.path === cdnPath(repo.id, 'model.safetensors'));
    assert.equal(cdn.length, 1, fmtLog(log));
    assert.equal(rangeStart(cdn[0]), have, `resumed at the partial file's length:\n${fmtLog(log)}`);
  } finally {
    await d.stop();
  }
});

test('daemon: offline, a model not on disk fails with "offline" and no request; one on disk answers', async () => {
  await hub.reset();
  const repo = makeRepo('offd');
  const models = modelsDir();
  const r = await exoDownload([repo.id, '--models-dir', models]);
  assert.equal(r.code, 0, tail(r));
  await hub.reset();
  const d = await startDaemon({ dataDir: fs.mkdtempSync(path.join(TMP, 'data-')), models, offline: true });
  try {
    // a custom card needs the hub: refused offline
    const add = await d.post('/models/add', { model_id: repo.id });
    assert.ok(add.status >= 400 && add.status < 500, `${add.status} ${add.text}`);
    assert.match(add.json?.error?.message ?? '', /offline/i, add.text);
    // a catalogue model
    const missing = 'mlx-community/Qwen3-0.6B-4bit';
    await place(d, missing);
    let st;
    let why;
    try {
      why = await waitFor('the failure', async () => {
        st = await d.state();
        const msgs = [
          ...Object.values(runnersOf(st, missing)).filter((x) => x.status === 'RunnerFailed').map((x) => x.body?.errorMessage),
          ...downloadsOf(st, missing).filter((x) => x.kind === 'DownloadFailed').map((x) => x.errorMessage),
        ].filter(Boolean);
        return msgs.find((m) => /offline/i.test(m)) ?? false;
      }, 15000, 50);
    } catch (e) {
      throw new Error(`${e.message}: runners ${JSON.stringify(st?.runners)} downloads ${JSON.stringify(st?.downloads)}`);
    }
    assert.match(why, /offline/i);
    assert.ok(!fs.existsSync(path.join(models, dirName(missing))), 'no model dir made offline');

    await place(d, repo.id);
    await waitReady(d, repo.id);
    await chat(d, repo.id);
    assert.deepEqual(await hub.log(), [], 'an offline daemon sends nothing to the hub');
  } finally {
    await d.stop();
  }
});

test('daemon: the same model asked for three times (place + two starts) is fetched once', async () => {
  await hub.reset();
  const repo = makeRepo('twice');
  const models = modelsDir();
  const d = await startDaemon({ dataDir: fs.mkdtempSync(path.join(TMP, 'data-')), models });
  try {
    await addModel(d, repo.id);
    await hub.reset(); // /models/add read config.json and the file list
    await hub.faults([{ match: 'model.safetensors', kind: 'slow', bytes_per_second: 1 * MiB, times: 1 }]);
    await place(d, repo.id);
    for (let i = 0; i < 2; i++) {
      const s = await d.post('/download/start', { model_id: repo.id });
      assert.equal(s.status, 200, s.text);
    }
    await waitReady(d, repo.id);
    await waitDownload(d, repo.id, 'DownloadCompleted');
    await sleep(500); // a second download, if one was (wrongly) started, has had time to ask
    await chat(d, repo.id);
    const log = await hub.log();
    for (const f of listFiles(repo.dir)) {
      const n = log.filter((e) => e.method === 'GET' && e.path === resolvePath(repo.id, f)).length;
      assert.equal(n, 1, `${f} fetched ${n} times:\n${fmtLog(log)}`);
    }
    assert.equal(log.filter((e) => e.path === cdnPath(repo.id, 'model.safetensors')).length, 1, fmtLog(log));
    assertSameFiles(repo.dir, path.join(models, dirName(repo.id)));
  } finally {
    await d.stop();
  }
});

// Under ASan (EXO_BIN=build-asan/exo) this once caught a failed or cancelled
// download's message copied 64 KiB past its 4.6 KB struct on the stack.
test('daemon: cancel keeps the partial file, start resumes; delete removes; read-only refuses', async () => {
  await hub.reset();
  const repo = makeRepo('cancel');
  const models = modelsDir();
  // a read-only models dir holding another model
  const ro = fs.mkdtempSync(path.join(TMP, 'ro-'));
  const roId = 'ro/stories260K';
  fs.cpSync(STORIES_SRC, path.join(ro, dirName(roId)), { recursive: true });
  const dir = path.join(models, dirName(repo.id));
  const partial = path.join(dir, 'model.safetensors.partial');
  const d = await startDaemon({ dataDir: fs.mkdtempSync(path.join(TMP, 'data-')), models,
    env: { EXO_MODELS_READ_ONLY_DIRS: ro } });
  try {
    await hub.faults([{ match: 'model.safetensors', kind: 'slow', bytes_per_second: 256 * 1024, times: 1 }]);
    let s = await d.post('/download/start', { model_id: repo.id });
    assert.equal(s.status, 200, s.text);
    await waitFor('bytes in the partial file', () => size(partial) > 64 * 1024, 15000);
    s = await d.post('/download/cancel', { model_id: repo.id });
    assert.equal(s.status, 200, s.text);
    const failed = await waitDownload(d, repo.id, 'DownloadFailed', 10000);
    assert.match(failed.errorMessage ?? '', /cancel/i);
    const have = size(partial);
    assert.ok(have > 0, 'the partial file is kept');
    assert.ok(!fs.existsSync(path.join(dir, 'model.safetensors')));
    await sleep(300);
    assert.equal(size(partial), have, 'a cancelled download writes no more');

    await hub.reset();
    s = await d.post('/download/start', { model_id: repo.id });
    assert.equal(s.status, 200, s.text);
    await waitDownload(d, repo.id, 'DownloadCompleted');
    assertSameFiles(repo.dir, dir);
    const log = await hub.log();
    const cdn = log.filter((e) => e.path === cdnPath(repo.id, 'model.safetensors'));
    assert.equal(cdn.length, 1, fmtLog(log));
    assert.equal(rangeStart(cdn[0]), have, `resumed after the cancel:\n${fmtLog(log)}`);

    // delete
    s = await d.req('DELETE', `/download/${d.nodeId}/${repo.id}`);
    assert.equal(s.status, 200, s.text);
    await waitFor('the model dir to go', () => !fs.existsSync(dir), 5000);
    await waitFor('the download entry to go', async () => downloadsOf(await d.state(), repo.id).length === 0, 5000);
    assert.equal(await modelEntry(d, repo.id, '?status=downloaded'), undefined);

    // a read-only dir's model is not deleted
    assert.ok(await modelEntry(d, roId, '?status=downloaded'), 'the read-only model is listed');
    s = await d.req('DELETE', `/download/${d.nodeId}/${roId}`);
    assert.equal(s.status, 400, s.text);
    await sleep(300);
    assert.ok(fs.existsSync(path.join(ro, dirName(roId), 'model.safetensors')), 'the read-only copy stays');
  } finally {
    await d.stop();
  }
});

// As 'cli: SIGINT during a rate-limit wait', for the daemon's cancel.
test('daemon: cancel is prompt while the file list is rate-limited', async () => {
  await hub.reset();
  const repo = makeRepo('ratecanceld');
  const d = await startDaemon({ dataDir: fs.mkdtempSync(path.join(TMP, 'data-')), models: modelsDir(),
    env: { EXO_DOWNLOAD_ATTEMPTS: '2' } });
  try {
    await hub.faults([{ match: treePath(repo.id), kind: 'status', code: 429, retry_after: 3, times: -1 }]);
    let s = await d.post('/download/start', { model_id: repo.id });
    assert.equal(s.status, 200, s.text);
    await waitFor('the rate-limited file list', async () => (await hub.log()).some((e) => e.status === 429), 5000);
    const t0 = performance.now();
    s = await d.post('/download/cancel', { model_id: repo.id });
    assert.equal(s.status, 200, s.text);
    const failed = await waitDownload(d, repo.id, 'DownloadFailed', 4000);
    const ms = performance.now() - t0;
    assert.match(failed.errorMessage ?? '', /cancel/i);
    assert.ok(ms < 1000, `the cancel took ${ms.toFixed(0)} ms to show`);
  } finally {
    await d.stop();
  }
});
