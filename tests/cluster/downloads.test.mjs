// Downloads of a pipeline shard's files from the hub: two daemons with empty
// models dirs, each against its own imitation hub (tests/hub/hub.mjs) on one
// repository root, so the hubs' request logs tell the nodes apart.
//
// The checkpoint is the real stories260K (convert-llama2c, as scripts/run.sh
// makes it) split into 2 weight files with a model.safetensors.index.json:
// model-00001 the embedding + layers 0..2, model-00002 layers 3..4 + the
// final norm (+ lm_head). It is served twice: as converted (tied head: the
// last rank binds the embedding as its head, so it needs model-00001 too,
// proto/shard.h) and untied (lm_head.weight, a copy of the embedding, in
// model-00002: the ranks' files are disjoint). First, `exo run` shows both
// splits generate as the unsplit model (greedy), which proves the splitter.
// Then each is added by id (POST /models/add), placed over the 2 nodes
// (Pipeline, min_nodes 2) and, once Ready, answers a greedy chat as `exo run`
// on the unsplit model does. Per node, from its shard's layer range in
// /state and the index's weight_map: it holds every small file and exactly
// the weight files its layers need (byte-equal to the hub's), asked its hub
// for no other weight file, and /state's downloads show its shard's
// DownloadCompleted with the right layers, files and bytes.
//
// Run: tests/integration/test_cluster.sh, or
//      node --test --test-reporter=./tests/e2e/reporter.mjs tests/cluster/downloads.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { spawn, execFile } from 'node:child_process';
import { promisify } from 'node:util';
import * as C from './cluster.mjs';

const { until, D } = C;
const execFileP = promisify(execFile);
const T = { timeout: 90000 * C.SLOW };
const RING_TIMEOUT_MS = 4000 * C.SLOW;
const HUB = path.join(C.REPO, 'tests/hub/hub.mjs');
const FIXTURE = path.join(C.REPO, 'tests/fixtures/stories260K');
const TIED = 'test-org/stories-split';
const UNTIED = 'test-org/stories-split-untied';
const FILES = ['model-00001-of-00002.safetensors', 'model-00002-of-00002.safetensors'];
const SMALL = ['config.json', 'tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja',
  'model.safetensors.index.json'];
const PROMPT = 'Once upon a time';
const MAX_TOKENS = 16;
// the template the other suites give stories260K (it ships none)
const TEMPLATE =
  "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] | trim }} [/INST]" +
  "{% else %}{{ m['content'] }}{% endif %}{% endfor %}";

// What this suite needs from the machine; a test skips with the reason.
function missing() {
  if (!fs.existsSync(C.EXO_BIN)) return `no exo binary at ${C.EXO_BIN}`;
  for (const f of ['stories260K.bin', 'tok512.bin'])
    if (!fs.existsSync(path.join(FIXTURE, f))) return `missing fixture ${FIXTURE}/${f}`;
  if (!fs.existsSync(HUB)) return `missing ${HUB}`;
  return null;
}
const SKIP = missing();

let tmp, unsplit, hubRoot, reference;
const hubs = [];

// ---- safetensors -------------------------------------------------------------------------

function readSafetensors(file) {
  const buf = fs.readFileSync(file);
  const n = Number(buf.readBigUInt64LE(0));
  const header = JSON.parse(buf.subarray(8, 8 + n).toString('utf8'));
  const data = buf.subarray(8 + n);
  const tensors = {};
  for (const [name, t] of Object.entries(header)) {
    if (name === '__metadata__') continue;
    tensors[name] = { dtype: t.dtype, shape: t.shape, bytes: data.subarray(t.data_offsets[0], t.data_offsets[1]) };
  }
  return { metadata: header.__metadata__, tensors };
}

// Writes the tensors (in their order) to one file; returns the data bytes.
function writeSafetensors(file, tensors, metadata) {
  const header = metadata ? { __metadata__: metadata } : {};
  let off = 0;
  for (const [name, t] of Object.entries(tensors)) {
    header[name] = { dtype: t.dtype, shape: t.shape, data_offsets: [off, off + t.bytes.length] };
    off += t.bytes.length;
  }
  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const padded = Buffer.concat([json, Buffer.alloc((8 - (json.length % 8)) % 8, 0x20)]);
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(padded.length));
  fs.writeFileSync(file, Buffer.concat([len, padded, ...Object.values(tensors).map((t) => t.bytes)]));
  return off;
}

const layerOf = (name) => {
  const m = /(?:^|\.)layers\.(\d+)\./.exec(name);
  return m ? +m[1] : -1;
};

// The unsplit HF dir in `src` as a 2-file checkpoint in `dst`: layers < 3
// and the embedding in the first file, the rest in the second. untied: the
// head as its own tensor (a copy of the embedding) and tie_word_embeddings
// false.
function splitCheckpoint(src, dst, { untied = false } = {}) {
  fs.mkdirSync(dst, { recursive: true });
  for (const f of fs.readdirSync(src))
    if (f !== 'model.safetensors') fs.copyFileSync(path.join(src, f), path.join(dst, f));
  const { metadata, tensors } = readSafetensors(path.join(src, 'model.safetensors'));
  assert.ok(tensors['model.embed_tokens.weight'] && tensors['model.norm.weight'], 'stories260K tensor names');
  const cfg = JSON.parse(fs.readFileSync(path.join(src, 'config.json'), 'utf8'));
  assert.equal(cfg.num_hidden_layers, 5);
  if (untied) {
    assert.ok(!tensors['lm_head.weight'], 'the converted stories260K has a tied head');
    tensors['lm_head.weight'] = { ...tensors['model.embed_tokens.weight'] };
    cfg.tie_word_embeddings = false;
    fs.writeFileSync(path.join(dst, 'config.json'), JSON.stringify(cfg, null, 2));
  }
  const parts = [{}, {}];
  for (const [name, t] of Object.entries(tensors)) {
    const l = layerOf(name);
    parts[(l >= 0 ? l >= 3 : !name.includes('embed_tokens')) ? 1 : 0][name] = t;
  }
  const weightMap = {};
  let total = 0;
  parts.forEach((p, i) => {
    total += writeSafetensors(path.join(dst, FILES[i]), p, metadata);
    for (const name of Object.keys(p)) weightMap[name] = FILES[i];
  });
  fs.writeFileSync(path.join(dst, 'model.safetensors.index.json'),
    JSON.stringify({ metadata: { total_size: total }, weight_map: weightMap }, null, 2));
  // the split really is what this suite says it is
  const back = FILES.map((f) => readSafetensors(path.join(dst, f)).tensors);
  assert.deepEqual(Object.keys(back[0]).map(layerOf).filter((l) => l >= 0).sort(), [0, 0, 0, 0, 0, 0, 0, 0, 0,
    1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2]);
  assert.ok(back[0]['model.embed_tokens.weight'] && back[1]['model.norm.weight']);
  for (const [name, t] of Object.entries(tensors))
    assert.ok(Buffer.compare(back[FILES.indexOf(weightMap[name])][name].bytes, t.bytes) === 0, name);
}

// The weight files a pipeline shard [first, last) of `total` layers needs,
// by the rule the feature states: its layers' files, the embedding's on the
// first rank (and on the last when the head is tied to it), every other
// non-layer tensor's (final norm, head) on the last rank.
function neededFiles(weightMap, { first, last, total, tied }) {
  const need = new Set();
  for (const [name, file] of Object.entries(weightMap)) {
    const l = layerOf(name);
    const wanted = l >= 0 ? l >= first && l < last
      : name.includes('embed_tokens') ? first === 0 || (last === total && tied)
      : last === total;
    if (wanted) need.add(file);
  }
  return [...need].sort();
}

// ---- hubs --------------------------------------------------------------------------------

async function startHub(root) {
  const child = spawn(process.execPath, [HUB, '--root', root, '--port', '0'], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '', stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const hub = { child, stderr: () => stderr };
  hubs.push(hub);
  hub.port = await new Promise((resolve, reject) => {
    child.stdout.on('data', (d) => {
      stdout += d;
      if (stdout.includes('\n')) resolve(JSON.parse(stdout.split('\n')[0]).port);
    });
    child.once('exit', (code) => reject(new Error(`hub exited (${code}): ${stderr}`)));
  });
  hub.base = `http://127.0.0.1:${hub.port}`;
  hub.log = () => C.getJson(hub.base, '/_control/log');
  return hub;
}

async function stopHubs() {
  await Promise.all(hubs.splice(0).map((h) => new Promise((resolve) => {
    if (h.child.exitCode !== null || h.child.signalCode !== null) return resolve();
    h.child.once('exit', resolve);
    h.child.kill('SIGTERM');
    setTimeout(() => h.child.kill('SIGKILL'), 3000).unref();
  })));
}

// The repository file a logged request is for (resolve or CDN), or null.
function loggedFile(entry, repo) {
  for (const prefix of [`/${repo}/resolve/main/`, `/_cdn/${repo}/`])
    if (entry.path.startsWith(prefix)) return decodeURIComponent(entry.path.slice(prefix.length).split('?')[0]);
  return null;
}

// ---- setup -------------------------------------------------------------------------------

before(async () => {
  if (SKIP) return;
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'exo-cl-dl-'));
  unsplit = path.join(tmp, 'unsplit');
  await execFileP(C.EXO_BIN, ['convert-llama2c', path.join(FIXTURE, 'stories260K.bin'),
    path.join(FIXTURE, 'tok512.bin'), unsplit]);
  await fsp.writeFile(path.join(unsplit, 'chat_template.jinja'), TEMPLATE);
  hubRoot = path.join(tmp, 'hub');
  splitCheckpoint(unsplit, path.join(hubRoot, TIED));
  splitCheckpoint(unsplit, path.join(hubRoot, UNTIED), { untied: true });
  reference = await D.exoRun(unsplit, PROMPT, { maxTokens: MAX_TOKENS });
});

after(async () => {
  await stopHubs();
  if (tmp && !process.env.EXO_CLUSTER_KEEP) await fsp.rm(tmp, { recursive: true, force: true });
});

test('the 2-file split of stories260K generates as the unsplit model (exo run, greedy)', { ...T, skip: SKIP ?? false },
  async () => {
    assert.equal(reference.genTokens, MAX_TOKENS);
    assert.ok(reference.text.length > 0);
    for (const repo of [TIED, UNTIED]) {
      const got = await D.exoRun(path.join(hubRoot, repo), PROMPT, { maxTokens: MAX_TOKENS });
      assert.equal(got.text, reference.text, repo);
      assert.equal(got.promptTokens, reference.promptTokens, repo);
    }
  });

// Waits until the State has an edge each way between every two nodes.
async function meshed(nodes) {
  const ids = await Promise.all(nodes.map((n) => n.id()));
  await until('edges each way between the nodes', async () => {
    const have = new Set((await nodes[0].state()).topology.connections.map((e) => `${e.source}>${e.sink}`));
    return ids.every((a) => ids.every((b) => a === b || have.has(`${a}>${b}`)));
  }, 20000);
}

// Places `model` over >= 2 nodes (pipeline) and waits until every runner of
// its instance is Ready; returns {id, inst, st}.
async function placeReady(node, model) {
  const r = await C.postJson(node.base, '/place_instance', { model_id: model, sharding: 'Pipeline', min_nodes: 2 });
  assert.equal(r.status, 200, `place_instance: ${r.text}`);
  return until(`a Ready 2-node instance of ${model}`, async () => {
    const st = await node.state();
    for (const [id, wrapped] of Object.entries(st.instances)) {
      const inst = Object.values(wrapped)[0];
      if (inst.shardAssignments.modelId !== model) continue;
      const runners = Object.values(inst.shardAssignments.nodeToRunner);
      if (runners.length < 2) continue;
      for (const rid of runners) {
        const s = st.runners[rid];
        if (s && 'RunnerFailed' in s) throw new Error(`runner ${rid} failed: ${JSON.stringify(s)}`);
      }
      if (runners.every((rid) => st.runners[rid] && 'RunnerReady' in st.runners[rid])) return { id, inst, st };
    }
    return false;
  }, 45000, 200);
}

async function deleteInstance(node, id) {
  const r = await fetch(`${node.base}/instance/${id}`, { method: 'DELETE' });
  assert.equal(r.status, 200, await r.text());
  await until('the instance gone', async () => !(id in (await node.state()).instances), 20000);
}

async function chat(node, model) {
  const r = await C.postJson(node.base, '/v1/chat/completions', { model, temperature: 0, max_tokens: MAX_TOKENS,
    messages: [{ role: 'user', content: PROMPT }] });
  assert.equal(r.status, 200, r.text);
  return r.json.choices[0].message.content;
}

test('a pipeline over 2 nodes downloads, per node, only the weight files of its shard', { ...T, skip: SKIP ?? false },
  async (t) => {
    const cl = new C.Cluster();
    const prevEnv = { ...process.env };
    process.env.EXO_RING_TIMEOUT_MS = String(RING_TIMEOUT_MS);
    for (const k of ['HF_TOKEN', 'HF_HUB_OFFLINE']) delete process.env[k];
    try {
      // every node its own hub process (one root), its own empty models dir
      const nodes = [];
      for (const name of ['a', 'b']) {
        const hub = await startHub(hubRoot);
        const dataDir = await fsp.mkdtemp(path.join(tmp, `node-${name}-`));
        const models = path.join(dataDir, 'models');
        await fsp.mkdir(models);
        process.env.HF_ENDPOINT = hub.base;
        const node = await cl.start(name, { dataDir, models });
        Object.assign(node, { hub, models });
        nodes.push(node);
      }
      delete process.env.HF_ENDPOINT;
      const ids = await Promise.all(nodes.map((n) => n.id()));
      await cl.converged(nodes);
      await meshed(nodes);

      for (const repo of [TIED, UNTIED]) {
        const tied = repo === TIED;
        const add = await C.postJson(nodes[0].base, '/models/add', { model_id: repo });
        assert.equal(add.status, 200, `models/add ${repo}: ${add.text}`);
        // the answer names a command: the card reaches each node's State after it
        await until(`${repo}'s card in every node's State`, async () =>
          (await Promise.all(nodes.map((n) => n.state()))).every((s) => s.customModelCards?.[repo]), 10000);
        const { id, inst } = await placeReady(nodes[1], repo);

        // greedy chat through either node = exo run on the unsplit model
        assert.equal(await chat(nodes[0], repo), reference.text, `${repo} via a`);
        assert.equal(await chat(nodes[1], repo), reference.text, `${repo} via b`);

        const index = JSON.parse(await fsp.readFile(path.join(hubRoot, repo, 'model.safetensors.index.json'), 'utf8'));
        const shards = {};
        for (const [nodeId, rid] of Object.entries(inst.shardAssignments.nodeToRunner))
          shards[nodeId] = Object.values(inst.shardAssignments.runnerToShard[rid])[0];
        assert.deepEqual(Object.keys(shards).sort(), [...ids].sort(), 'one shard per node');
        const ranges = Object.values(shards).map((s) => [s.startLayer, s.endLayer]).sort((x, y) => x[0] - y[0]);
        assert.deepEqual([ranges[0][0], ranges[0][1], ranges[1][1]], [0, ranges[1][0], 5], `layers ${ranges}`);

        const st = await nodes[0].state();
        const dirName = repo.replace('/', '--');
        const needs = [];
        for (const [i, node] of nodes.entries()) {
          const s = shards[ids[i]];
          const what = `${repo}, node ${node.name} (rank ${s.deviceRank}, layers ${s.startLayer}..${s.endLayer})`;
          const need = neededFiles(index.weight_map, { first: s.startLayer, last: s.endLayer, total: 5, tied });
          needs.push(need);
          // on disk: every small file, exactly the needed weight files, no partial ones
          const dir = path.join(node.models, dirName);
          const onDisk = (await fsp.readdir(dir)).filter((f) => !f.startsWith('.'));
          for (const f of SMALL) assert.ok(onDisk.includes(f), `${what}: has ${f} (${onDisk})`);
          assert.deepEqual(onDisk.filter((f) => f.endsWith('.safetensors')).sort(), need,
            `${what}: the weight files on disk`);
          assert.deepEqual(onDisk.filter((f) => f.endsWith('.partial')), [], `${what}: partial files`);
          for (const f of [...SMALL, ...need])
            assert.ok((await fsp.readFile(path.join(dir, f))).equals(await fsp.readFile(path.join(hubRoot, repo, f))),
              `${what}: ${f} byte-equal to the hub's`);
          // the hub's log: its node fetched the needed weight files and made no
          // request at all (GET, HEAD, resolve or CDN) for any other
          const log = await node.hub.log();
          const asked = new Set(log.filter((e) => loggedFile(e, repo)?.endsWith('.safetensors'))
            .map((e) => loggedFile(e, repo)));
          assert.deepEqual([...asked].sort(), need, `${what}: weight files asked of its hub`);
          for (const f of need) {
            const bytes = log.filter((e) => e.path === `/_cdn/${repo}/${f}` && e.status < 300)
              .reduce((n, e) => n + e.bytes, 0);
            const size = (await fsp.stat(path.join(hubRoot, repo, f))).size;
            assert.ok(bytes >= size, `${what}: ${f}: ${bytes} bytes from the CDN, the file has ${size}`);
          }
          // /state: this node's download of its shard, completed
          const done = (st.downloads?.[ids[i]] ?? []).map((d) => d.DownloadCompleted)
            .filter((d) => d && d.modelId === repo);
          assert.equal(done.length, 1, `${what}: one DownloadCompleted in ${JSON.stringify(st.downloads?.[ids[i]])}`);
          const d = done[0];
          const sizes = await Promise.all([...SMALL, ...need].map(async (f) =>
            (await fsp.stat(path.join(hubRoot, repo, f))).size));
          const bytes = sizes.reduce((a, b) => a + b, 0);
          assert.deepEqual({ nodeId: d.nodeId, startLayer: d.startLayer, endLayer: d.endLayer, nLayers: d.nLayers,
            modelDirectory: d.modelDirectory, total: d.total, downloaded: d.downloaded, totalFiles: d.totalFiles,
            completedFiles: d.completedFiles },
          { nodeId: ids[i], startLayer: s.startLayer, endLayer: s.endLayer, nLayers: 5, modelDirectory: dir,
            total: bytes, downloaded: bytes, totalFiles: SMALL.length + need.length,
            completedFiles: SMALL.length + need.length }, `${what}: its DownloadCompleted`);
        }
        t.diagnostic(`${repo}: ` + nodes.map((n, i) => `${n.name} rank ${shards[ids[i]].deviceRank} layers ` +
          `${shards[ids[i]].startLayer}..${shards[ids[i]].endLayer}: ${needs[i].join(', ')}`).join('; '));
        // the first rank never needs model-00002 here; untied, the last never needs model-00001
        const rank = (k) => needs[nodes.findIndex((_, i) => shards[ids[i]].deviceRank === k)];
        if (ranges[0][1] <= 3) assert.ok(!rank(0).includes(FILES[1]), `${repo}: rank 0 takes ${rank(0)}`);
        if (!tied && ranges[1][0] >= 3) assert.deepEqual(rank(1), [FILES[1]], `${repo}: rank 1 takes ${rank(1)}`);
        if (tied) assert.ok(rank(1).includes(FILES[0]), `${repo}: the tied head is in ${FILES[0]}`);

        await deleteInstance(nodes[0], id);
      }
    } catch (e) {
      if (!(e instanceof Error)) e = new Error(JSON.stringify(e));
      for (const n of cl.nodes) e.message += `\n--- ${n.name} (${n.dataDir}):\n${n.stderr.split('\n').slice(-30).join('\n')}`;
      throw e;
    } finally {
      for (const k of Object.keys(process.env)) if (!(k in prevEnv)) delete process.env[k];
      Object.assign(process.env, prevEnv);
      await cl.stopAll();
      await stopHubs();
    }
  });
