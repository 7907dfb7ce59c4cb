// app.js without a browser: static checks of the sources, then a smoke run
// of the whole page on a tiny fake DOM with a fake fetch (no daemon, no
// network). Imported before `document` exists, app.js does not start itself.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { start } from '../src/app.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SRC = path.join(HERE, '..', 'src');
const read = (f) => fs.readFileSync(path.join(SRC, f), 'utf8');

// ---- static checks -----------------------------------------------------------------------

test('no HTML is ever built from strings (model text is escaped by construction)', () => {
  for (const f of fs.readdirSync(SRC).filter((f) => /\.m?js$/.test(f))) {
    const code = read(f).replace(/^\s*\/\/.*$/gm, '');
    for (const bad of ['innerHTML', 'outerHTML', 'insertAdjacentHTML', 'document.write', 'eval(', 'new Function', 'createContextualFragment', 'DOMParser']) {
      assert.equal(code.includes(bad), false, `${f} uses ${bad}`);
    }
  }
});

test('every element id app.js looks up exists in index.html', () => {
  const html = read('index.html');
  const ids = new Set([...html.matchAll(/\bid="([^"]+)"/g)].map((m) => m[1]));
  const used = [...read('app.js').matchAll(/\$\('([^']+)'\)/g)].map((m) => m[1]);
  assert.ok(used.length > 15);
  for (const id of used) assert.ok(ids.has(id), `#${id} is not in index.html`);
});

test('index.html loads its assets from dashboard/ as a module', () => {
  const html = read('index.html');
  assert.match(html, /<script type="module" src="dashboard\/app\.js"><\/script>/);
  assert.match(html, /<link rel="stylesheet" href="dashboard\/style\.css">/);
  assert.match(html, /<meta name="color-scheme" content="light dark">/);
  assert.match(read('style.css'), /@media \(prefers-color-scheme: dark\)/);
});

// ---- a fake DOM, just what app.js uses -----------------------------------------------------

class FakeNode {
  constructor() {
    this.parentNode = null;
    this.childNodes = [];
  }
  get firstChild() {
    return this.childNodes[0] || null;
  }
  get textContent() {
    return this.childNodes.map((c) => c.textContent).join('');
  }
  set textContent(v) {
    this.replaceChildren();
    if (v !== '' && v !== null && v !== undefined) this.appendChild(new FakeText(String(v)));
  }
  appendChild(c) {
    assert.ok(c instanceof FakeNode, `appendChild(${typeof c})`);
    if (c.parentNode) c.remove();
    c.parentNode = this;
    this.childNodes.push(c);
    return c;
  }
  append(...cs) {
    for (const c of cs) this.appendChild(typeof c === 'string' ? new FakeText(c) : c);
  }
  replaceChildren(...cs) {
    for (const c of this.childNodes) c.parentNode = null;
    this.childNodes = [];
    this.append(...cs);
  }
  remove() {
    if (!this.parentNode) return;
    const sib = this.parentNode.childNodes;
    sib.splice(sib.indexOf(this), 1);
    this.parentNode = null;
  }
}

class FakeText extends FakeNode {
  constructor(data) {
    super();
    this.data = data;
  }
  get textContent() {
    return this.data;
  }
  set textContent(v) {
    this.data = String(v);
  }
}

class FakeElement extends FakeNode {
  constructor(tag) {
    super();
    this.tagName = tag.toUpperCase();
    this.attrs = {};
    this.style = {};
    this.dataset = {};
    this.listeners = {};
    this.className = '';
    this.hidden = false;
    this.disabled = false;
    this.open = false;
    this.value = '';
    this.title = '';
    this.type = '';
    this.scrollTop = 0;
    this.scrollHeight = 100;
    this.clientHeight = 100;
  }
  setAttribute(k, v) {
    this.attrs[k] = String(v);
    if (k === 'class') this.className = String(v); // SVG elements get their class this way
  }
  getAttribute(k) {
    return this.attrs[k] ?? null;
  }
  addEventListener(type, f) {
    (this.listeners[type] ||= []).push(f);
  }
  dispatch(type, props = {}) {
    const ev = { type, target: this, defaultPrevented: false, preventDefault() { this.defaultPrevented = true; }, ...props };
    for (const f of this.listeners[type] || []) f(ev);
    return ev;
  }
  click() {
    if (!this.disabled) this.dispatch('click');
  }
  focus() {}
  get innerHTML() {
    throw new Error('innerHTML read');
  }
  set innerHTML(v) {
    throw new Error('innerHTML written');
  }
}

function makeDocument() {
  const byId = new Map();
  const body = new FakeElement('body');
  for (const m of read('index.html').matchAll(/<(\w+)\b([^>]*)\bid="([^"]+)"([^>]*)>/g)) {
    const el = new FakeElement(m[1]);
    el.id = m[3];
    const attrs = m[2] + m[4];
    if (/\shidden\b/.test(attrs)) el.hidden = true;
    if (/\sdisabled\b/.test(attrs)) el.disabled = true;
    body.appendChild(el);
    byId.set(m[3], el);
  }
  return {
    body,
    getElementById: (id) => byId.get(id) || null,
    createElement: (tag) => new FakeElement(tag),
    createElementNS: (ns, tag) => {
      assert.equal(ns, 'http://www.w3.org/2000/svg');
      const el = new FakeElement(tag);
      el.namespaceURI = ns;
      return el;
    },
    createTextNode: (data) => new FakeText(data),
    hasFocus: () => false,
  };
}

function findAll(root, pred, out = []) {
  for (const c of root.childNodes) {
    if (c instanceof FakeElement) {
      if (pred(c)) out.push(c);
      findAll(c, pred, out);
    }
  }
  return out;
}
const byClass = (root, cls) => findAll(root, (e) => e.className.split(' ').includes(cls));
const button = (root, text) => findAll(root, (e) => e.tagName === 'BUTTON' && e.textContent === text);

async function waitFor(pred, what, ms = 3000) {
  const t0 = Date.now();
  for (;;) {
    if (pred()) return;
    if (Date.now() - t0 > ms) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

// ---- the daemon, faked -------------------------------------------------------------------

const SELF = '25d2d2b1-3cc0-4918-a21a-956ed124c610';
const OTHER = '9b1f0c2e7a4d4c1e8f001234567890ab';
const GONE = 'deadbeef00000000000000000000dead'; // timed out: only stale maps mention it
const READY_ID = 'aac087a5-78ff-4976-9c90-52d070c84c9b';
const STATE = {
  instances: {
    [READY_ID]: {
      MlxRingInstance: {
        instanceId: READY_ID,
        shardAssignments: {
          modelId: 'karpathy/stories260K',
          runnerToShard: { r1: { PipelineShardMetadata: { deviceRank: 0, worldSize: 1, startLayer: 0, endLayer: 5, nLayers: 5 } } },
          nodeToRunner: { [SELF]: 'r1' },
        },
        sharding: 'Pipeline',
      },
    },
    'i-loading': {
      MlxRingInstance: {
        instanceId: 'i-loading',
        shardAssignments: {
          modelId: 'org/Loading-Model',
          runnerToShard: { r2: { PipelineShardMetadata: { deviceRank: 0, worldSize: 1, startLayer: 0, endLayer: 6, nLayers: 6 } } },
          nodeToRunner: { [SELF]: 'r2' },
        },
        sharding: 'Pipeline',
      },
    },
  },
  runners: { r1: { RunnerReady: { prefillServerPort: null } }, r2: { RunnerLoading: { layersLoaded: 3, totalLayers: 6 } } },
  tasks: {},
  lastSeen: { [SELF]: '2026-11-29T23:46:53.949Z', [OTHER]: '2026-11-29T23:46:53.000Z' },
  nodeIdentities: { [SELF]: { friendlyName: 'vm', cpuCount: 2 }, [OTHER]: { friendlyName: 'gpu-box <b>', cpuCount: 16 } },
  nodeMemory: {
    [SELF]: { ramTotal: { inBytes: 25276502016 }, ramAvailable: { inBytes: 24192163840 } },
    [OTHER]: { ramTotal: { inBytes: 68719476736 }, ramAvailable: { inBytes: 34359738368 } },
    [GONE]: { ramTotal: { inBytes: 1 }, ramAvailable: { inBytes: 1 } },
  },
  nodeSystem: { [OTHER]: { cpuModel: 'AMD EPYC 9654', os: 'Linux 6.8 x86_64', cpuCount: 16 } },
  nodeDisk: { [OTHER]: { total: { inBytes: 2 * 2 ** 40 }, available: { inBytes: 2 ** 40 } } },
  nodeGpus: { [SELF]: [], [OTHER]: [{ index: 0, name: 'NVIDIA H200', memoryTotal: 150754820096, memoryUsed: 2 ** 30 }] },
  nodeBackends: { [SELF]: ['Cpu'], [OTHER]: ['Cpu', 'Cuda'] },
  nodeModels: { [SELF]: ['karpathy/stories260K'], [OTHER]: null },
  topology: {
    nodes: [SELF, OTHER],
    connections: [
      { source: SELF, sink: OTHER, address: '10.0.0.2:5000', latencyUs: 420, bandwidthBps: 9.4e8 },
      { source: SELF, sink: OTHER, address: '[fe80::2]:5000', latencyUs: 380, bandwidthBps: 2.5e10 },
      { source: OTHER, sink: SELF, address: '10.0.0.1:5000', latencyUs: 450, bandwidthBps: 9.1e8 },
      { source: OTHER, sink: GONE, address: '10.0.0.9:5000', latencyUs: 1, bandwidthBps: 1e12 },
    ],
  },
  deletedInstances: {
    'i-crashed': { instanceId: 'i-crashed', modelId: 'org/Crashy <b>', reason: 'runner for org/Crashy <b> failed 5 times in a row: runner exited (signal 9)', deletedAt: '2026-11-29T23:40:00.000Z' },
  },
  lastEventAppliedIdx: 8,
};
const CLUSTER = {
  nodeId: SELF,
  namespace: 'home-lab',
  masterNodeId: OTHER,
  sessionClock: 3,
  isMaster: false,
  electionInProgress: false,
  caughtUp: true,
  clusterPort: 5000,
  peers: [{ nodeId: OTHER, remote: '10.0.0.2:5000', dialed: true, rttUs: 412 }],
};
const shard = (rank, world, start, end) => ({ PipelineShardMetadata: { deviceRank: rank, worldSize: world, startLayer: start, endLayer: end, nLayers: 5 } });
const PREVIEWS = {
  previews: [
    {
      model_id: 'karpathy/stories260K', sharding: 'Pipeline', instance_meta: 'MlxRing', node_count: 2,
      instance: { MlxRingInstance: { instanceId: 'p2', shardAssignments: { modelId: 'karpathy/stories260K', runnerToShard: { a: shard(0, 2, 0, 3), b: shard(1, 2, 3, 5) }, nodeToRunner: { [SELF]: 'a', [OTHER]: 'b' } }, sharding: 'Pipeline' } },
      error: null, memory_delta_by_node: { [SELF]: 629146, [OTHER]: 419430 },
    },
    {
      model_id: 'karpathy/stories260K', sharding: 'Pipeline', instance_meta: 'MlxRing', node_count: 1,
      instance: { MlxRingInstance: { instanceId: 'p1', shardAssignments: { modelId: 'karpathy/stories260K', runnerToShard: { c: shard(0, 1, 0, 5) }, nodeToRunner: { [SELF]: 'c' } }, sharding: 'Pipeline' } },
      error: null, memory_delta_by_node: { [SELF]: 1048576 },
    },
    { model_id: 'karpathy/stories260K', sharding: 'Tensor', instance_meta: 'MlxRing', node_count: 2, instance: null, error: 'karpathy/stories260K does not support tensor sharding', memory_delta_by_node: {} },
    { model_id: 'karpathy/stories260K', sharding: 'Pipeline', instance_meta: 'MlxJaccl', node_count: 2, instance: null, error: 'MlxJaccl needs <RDMA> links', memory_delta_by_node: {} },
    { model_id: 'karpathy/stories260K', sharding: 'Tensor', instance_meta: 'MlxJaccl', node_count: 2, instance: null, error: 'MlxJaccl needs <RDMA> links', memory_delta_by_node: {} },
  ],
};
const MODELS = {
  object: 'list',
  data: [
    { id: 'karpathy/stories260K', name: 'stories260K', storage_size_megabytes: 1, family: 'llama', quantization: 'fp32', context_length: 512, capabilities: ['text'] },
    { id: 'bad/model', name: 'Bad <img src=x onerror=alert(1)>', storage_size_megabytes: 10, capabilities: ['text'] },
  ],
};

const enc = new TextEncoder();
const chunk = (delta, extra = {}) =>
  `data: ${JSON.stringify({ id: 'c', object: 'chat.completion.chunk', created: 1, model: 'karpathy/stories260K', choices: [{ index: 0, delta, logprobs: null, finish_reason: extra.finish_reason ?? null }], ...(extra.usage ? { usage: extra.usage } : {}) })}\n\n`;

function sseResponse(pieces, { hang = false, signal } = {}) {
  const body = new ReadableStream({
    async start(ctrl) {
      for (const p of pieces) {
        // byte chunks that cut lines (and characters) in half
        const bytes = enc.encode(p);
        const mid = Math.floor(bytes.length / 2);
        ctrl.enqueue(bytes.subarray(0, mid));
        await new Promise((r) => setTimeout(r, 2));
        ctrl.enqueue(bytes.subarray(mid));
      }
      if (!hang) ctrl.close();
      else signal.addEventListener('abort', () => ctrl.error(new DOMException('The operation was aborted.', 'AbortError')));
    },
  });
  return new Response(body, { status: 200, headers: { 'content-type': 'text/event-stream' } });
}

test('the page, end to end on a fake DOM and a fake daemon', async (t) => {
  const realSetTimeout = globalThis.setTimeout;
  globalThis.setTimeout = (f, ms, ...a) => {
    const h = realSetTimeout(f, ms, ...a);
    if (ms >= 1000) h.unref?.(); // toasts: do not keep the test alive
    return h;
  };
  const store = new Map();
  globalThis.localStorage = {
    getItem: (k) => (store.has(k) ? store.get(k) : null),
    setItem: (k, v) => store.set(k, String(v)),
  };
  const doc = makeDocument();
  globalThis.document = doc;
  const $ = (id) => doc.getElementById(id);

  const calls = [];
  let daemonUp = true;
  let cluster = CLUSTER; // null: an older daemon without /cluster
  let state = STATE;
  let models = MODELS;
  let chat = null; // (opts) => Response
  globalThis.fetch = async (url, opts = {}) => {
    const method = opts.method || 'GET';
    calls.push({ url, method, body: opts.body ? JSON.parse(opts.body) : undefined });
    if (!daemonUp) throw new TypeError('fetch failed');
    const json = (status, body) => new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json' } });
    if (url === 'state') return json(200, state);
    if (url === 'cluster') return cluster ? json(200, cluster) : json(404, { error: { message: 'Not Found' } });
    if (url.startsWith('instance/previews?')) {
      const id = new URLSearchParams(url.slice(url.indexOf('?') + 1)).get('model_id');
      if (id === 'karpathy/stories260K') return json(200, PREVIEWS);
      return json(404, { error: { message: `model ${id} is not on disk on any node`, type: 'not_found_error', param: null, code: 404 } });
    }
    if (url === 'node_id') return json(200, SELF);
    if (url === 'v1/models') return json(200, models);
    if (url === 'models/add') {
      const { model_id: id } = JSON.parse(opts.body);
      if (id === 'bad-org/missing') return json(404, { error: { message: 'could not fetch the config of <bad-org/missing> from Hugging Face (HTTP 404)', type: 'not_found_error' } });
      const card = { id, name: id.split('/')[1], status: 'downloadable', is_custom: true, storage_size_megabytes: 700 };
      models = { ...models, data: [...models.data, card] };
      return json(200, card);
    }
    if (url.startsWith('models/search?')) {
      const q = new URLSearchParams(url.slice(url.indexOf('?') + 1));
      if (q.get('query') === 'offline') return json(503, { error: { message: 'model search: offline mode (HF_HUB_OFFLINE): not fetched' } });
      if (q.get('query') === 'nothing') return json(200, []);
      return json(200, [
        { id: 'mlx-community/Qwen3-4B-4bit', author: 'mlx-community', downloads: 123456, likes: 12, last_modified: null, tags: [] },
        { id: 'mlx-community/Qwen3-4B-8bit', author: 'mlx-community', downloads: 950, likes: 0, last_modified: null, tags: [] },
      ]);
    }
    if (url.startsWith('models/custom/') && method === 'DELETE') {
      const id = url.slice('models/custom/'.length);
      models = { ...models, data: models.data.filter((m) => m.id !== id) };
      return json(200, { message: 'removed' });
    }
    if (url === 'download/start' || url === 'download/cancel') return json(200, { command_id: 'c1' });
    if (url.startsWith('download/') && method === 'DELETE') {
      return json(400, { error: { message: 'the models dir of this node is <read-only>', type: 'invalid_request_error' } });
    }
    if (url === 'place_instance') {
      const { model_id: id } = JSON.parse(opts.body);
      if (id === 'bad/model') return json(400, { error: { message: 'Not enough memory for <bad/model>', type: 'Bad Request', param: null, code: 400 } });
      const { min_nodes: k } = JSON.parse(opts.body);
      if (k > 1) return json(400, { error: { message: `${id} needs ${k} nodes, and running one model across several nodes is not built yet (see /instance/previews)`, type: 'invalid_request_error', param: null, code: 400 } });
      return json(200, { message: 'Command received.', command_id: 'x' });
    }
    if (url.startsWith('instance/') && method === 'DELETE') return json(200, { message: 'Command received.', instance_id: url.slice(9) });
    if (url === 'v1/chat/completions') return chat(opts);
    return json(404, { error: { message: 'Not Found' } });
  };

  const app = start({ pollMs: 20 });
  t.after(() => {
    app.stop();
    globalThis.setTimeout = realSetTimeout;
    delete globalThis.document;
    delete globalThis.fetch;
    delete globalThis.localStorage;
  });

  await t.test('cluster, instances and models render from /state and /v1/models', async () => {
    await waitFor(() => $('nodes').textContent.includes('vm') && $('models').textContent.includes('stories260K'), 'the first poll');
    assert.equal($('conn').dataset.state, 'ok');
    assert.equal($('node-id').textContent, 'node vm · 25d2d2b1');
    // the node that timed out (only a stale map mentions it) is not counted
    assert.equal($('cluster-summary').textContent, '2 nodes · 18 CPUs · 1 GPU · 54.5 GiB free of 87.5 GiB');
    const nodeCards = byClass($('nodes'), 'node');
    assert.equal(nodeCards.length, 2);
    const [self, other] = nodeCards.map((c) => c.textContent);
    for (const s of ['vm', 'this node', '25d2d2b1', '2 CPUs', 'Cpu', 'Memory', '1.0 / 23.5 GiB', '2 runners', 'Models on disk:', 'karpathy/stories260K']) assert.ok(self.includes(s), s);
    assert.ok(!self.includes('master'));
    for (const s of ['gpu-box <b>', '★ master', '9b1f0c2e', 'AMD EPYC 9654 · 16 CPUs', 'Linux 6.8 x86_64', '32.0 / 64.0 GiB', 'GPU 0 · NVIDIA H200', '1.0 / 140 GiB', 'Models disk', '1.0 / 2.0 TiB', 'Cuda', 'No models on disk']) {
      assert.ok(other.includes(s), s);
    }
    assert.equal(findAll($('nodes'), (e) => e.tagName === 'B').length, 0);
    assert.equal(nodeCards[1].attrs['data-node'], OTHER);

    // the master, the namespace, the peers (GET /cluster)
    const status = $('cluster-status').textContent;
    for (const s of ['★ master gpu-box <b>', 'this node follows', 'namespace home-lab', 'session 3', 'Peers of this node (1)', '10.0.0.2:5000', 'outgoing', 'rtt 412 µs']) {
      assert.ok(status.includes(s), s);
    }
    assert.ok(!status.includes('electing'));

    // the topology: two nodes, one link (the one to the gone node is dropped)
    const svg = findAll($('topology'), (e) => e.tagName === 'SVG');
    assert.equal(svg.length, 1);
    assert.equal(svg[0].namespaceURI, 'http://www.w3.org/2000/svg');
    assert.equal(byClass($('topology'), 'topo-node').length, 2);
    const links = byClass($('topology'), 'link');
    assert.equal(links.length, 1);
    assert.ok(links[0].className.includes('tier-fastest')); // 25 Gbit/s over [fe80::2]
    const label = byClass($('topology'), 'link-label')[0];
    assert.equal(findAll(label, (e) => e.tagName === 'TEXT')[0].textContent, '380 µs');
    const tip = findAll(links[0], (e) => e.tagName === 'TITLE')[0].textContent;
    assert.ok(tip.includes('vm → gpu-box <b>: 380 µs, 25.0 Gbit/s via [fe80::2]:5000 (best of 2 addresses)'), tip);
    assert.ok(tip.includes('gpu-box <b> → vm: 450 µs, 910 Mbit/s via 10.0.0.1:5000'), tip);
    const table = byClass($('topology'), 'links-table')[0].textContent;
    for (const s of ['vm → gpu-box <b>', '★ [fe80::2]:5000', '10.0.0.2:5000', '940 Mbit/s', 'gpu-box <b> → vm']) assert.ok(table.includes(s), s);
    assert.ok(!table.includes('10.0.0.9'));

    assert.equal($('instances-summary').textContent, '2 placed · 1 ready');
    const cards = byClass($('instances'), 'instance');
    assert.equal(cards.length, 2);
    cards.reverse(); // sorted by model id: karpathy/… first
    assert.ok(cards[0].textContent.includes('org/Loading-Model'));
    assert.ok(cards[0].textContent.includes('Loading 50%'));
    assert.ok(cards[0].textContent.includes('Loading 3/6 layers'));
    assert.ok(cards[0].textContent.includes('#0vmlayers 0–5 of 6'));
    const bars = findAll(cards[0], (e) => e.attrs.role === 'progressbar');
    assert.equal(bars[0].firstChild.style.width, '50%');
    assert.ok(cards[1].textContent.includes('karpathy/stories260K'));
    assert.ok(cards[1].textContent.includes('Ready'));
    assert.ok(cards[1].textContent.includes('MLX Ring · Pipeline · 1 runner · on 1 node'));
    // a deleted instance says why it went (daemon text stays text)
    const gone = byClass($('instances'), 'deleted-instance');
    assert.equal(gone.length, 1);
    for (const s of ['org/Crashy <b>', 'failed 5 times in a row: runner exited (signal 9)', 'ago']) assert.ok(gone[0].textContent.includes(s), s);
    assert.equal(findAll($('instances'), (e) => e.tagName === 'B').length, 0);
    assert.ok($('instances').textContent.includes('Recently deleted (1)'));

    const rows = byClass($('models'), 'model');
    assert.equal(rows.length, 2);
    // text from the daemon stays text
    assert.ok(rows[0].textContent.includes('Bad <img src=x onerror=alert(1)>'));
    assert.equal(findAll($('models'), (e) => e.tagName === 'IMG').length, 0);
    assert.ok(rows[1].textContent.includes('running'));
    assert.ok(rows[1].textContent.includes('ctx 512'));
  });

  const modelRow = (id) => byClass($('models'), 'model').find((r) => r.textContent.includes(id));

  await t.test('Launch without previews: the reason, then a launch with defaults', async () => {
    button(modelRow('bad/model'), 'Launch')[0].click();
    await waitFor(() => modelRow('bad/model').textContent.includes('Launch with defaults'), 'the previews error');
    assert.ok(modelRow('bad/model').textContent.includes('No placement preview: model bad/model is not on disk on any node'));
    assert.equal(calls.filter((c) => c.url === 'place_instance').length, 0); // nothing launched blindly
    button(modelRow('bad/model'), 'Launch with defaults')[0].click();
    await waitFor(() => $('models').textContent.includes('Not enough memory for <bad/model>'), 'the launch error');
    assert.deepEqual(calls.filter((c) => c.url === 'place_instance').map((c) => [c.method, c.body]), [['POST', { model_id: 'bad/model' }]]);
    assert.ok($('toasts').textContent.includes('Launch failed: Not enough memory for <bad/model>'));
    button(modelRow('bad/model'), 'Cancel')[0].click();
    assert.ok(!modelRow('bad/model').textContent.includes('Where to run it'));
  });

  await t.test('Launch shows the placement options; each launches its own', async () => {
    button(modelRow('karpathy/stories260K'), 'Launch')[0].click();
    await waitFor(() => byClass(modelRow('karpathy/stories260K'), 'placement').length === 2, 'the options');
    assert.ok(calls.some((c) => c.url === 'instance/previews?model_id=karpathy%2Fstories260K'));
    const opts = byClass(modelRow('karpathy/stories260K'), 'placement');
    // fewest nodes first; the ranks, nodes, layers and memory of each
    assert.ok(opts[0].textContent.includes('Pipeline · MLX Ring · 1 node'));
    assert.ok(opts[0].textContent.includes('#0vmlayers 0–4 of 5+1.0 MiB of 22.5 GiB free'));
    assert.ok(opts[1].textContent.includes('Pipeline · MLX Ring · 2 nodes'));
    assert.ok(opts[1].textContent.includes('#0vmlayers 0–2 of 5'));
    assert.ok(opts[1].textContent.includes('#1gpu-box <b>layers 3–4 of 5+410 KiB of 171 GiB free'), opts[1].textContent); // its GPU's free memory counted
    // the invalid ones, grouped by their reason
    const invalid = byClass(modelRow('karpathy/stories260K'), 'placement-invalid')[0];
    assert.ok(invalid.textContent.startsWith('3 options not possible'));
    const groups = byClass(invalid, 'invalid-group').map((g) => g.textContent);
    assert.deepEqual(groups, [
      'karpathy/stories260K does not support tensor shardingTensor · MLX Ring · 2 nodes',
      'MlxJaccl needs <RDMA> linksPipeline · MLX Jaccl · 2 nodesTensor · MLX Jaccl · 2 nodes',
    ]);
    // over two nodes: the daemon's refusal shows on that option
    button(opts[1], 'Launch')[0].click();
    await waitFor(() => modelRow('karpathy/stories260K').textContent.includes('not built yet'), 'the refusal');
    const failed = byClass(modelRow('karpathy/stories260K'), 'placement')[1];
    assert.ok(failed.className.includes('failed'));
    assert.ok(byClass(failed, 'error-text')[0].textContent.includes('needs 2 nodes, and running one model across several nodes is not built yet'));
    assert.deepEqual(calls.filter((c) => c.url === 'place_instance').at(-1).body, {
      model_id: 'karpathy/stories260K', sharding: 'Pipeline', instance_meta: 'MlxRing', min_nodes: 2,
    });
    // on one node: launched, the options close
    button(byClass(modelRow('karpathy/stories260K'), 'placement')[0], 'Launch')[0].click();
    await waitFor(() => $('toasts').textContent.includes('Launching karpathy/stories260K'), 'the launch toast');
    assert.deepEqual(calls.filter((c) => c.url === 'place_instance').at(-1).body, {
      model_id: 'karpathy/stories260K', sharding: 'Pipeline', instance_meta: 'MlxRing', min_nodes: 1,
    });
    await waitFor(() => !modelRow('karpathy/stories260K').textContent.includes('Where to run it'), 'the options closing');
  });

  await t.test('an election, a node leaving, an older daemon without /cluster', async () => {
    cluster = { ...CLUSTER, masterNodeId: null, electionInProgress: true, caughtUp: false };
    await waitFor(() => $('cluster-status').textContent.includes('electing a master…'), 'the election');
    assert.ok($('cluster-status').textContent.includes('catching up…'));
    assert.ok(!$('nodes').textContent.includes('master'));
    // the other node times out: it leaves nodeIdentities (and the rest)
    const { [OTHER]: _gone, ...idents } = STATE.nodeIdentities;
    state = { ...STATE, nodeIdentities: idents };
    cluster = { ...CLUSTER, masterNodeId: SELF, isMaster: true, peers: [] };
    await waitFor(() => byClass($('nodes'), 'node').length === 1, 'the node leaving');
    assert.equal(byClass($('topology'), 'topo-node').length, 1);
    assert.equal(byClass($('topology'), 'link').length, 0);
    assert.ok($('topology').textContent.includes('A cluster of one node'));
    assert.ok($('cluster-status').textContent.includes('this node is the master'));
    assert.ok($('cluster-status').textContent.includes('no peers'));
    assert.ok($('nodes').textContent.includes('★ master'));
    // a daemon without /cluster: still connected, no master claimed
    cluster = null;
    await waitFor(() => $('cluster-status').textContent.includes('not available'), 'no /cluster');
    assert.equal($('conn').dataset.state, 'ok');
    assert.ok(!$('nodes').textContent.includes('master'));
    state = STATE;
    cluster = CLUSTER;
    await waitFor(() => byClass($('nodes'), 'node').length === 2, 'back to two nodes');
  });

  await t.test('Delete sends DELETE /instance/{id}', async () => {
    const card = byClass($('instances'), 'instance').find((c) => c.textContent.includes('karpathy/stories260K'));
    button(card, 'Delete')[0].click();
    await waitFor(() => calls.some((c) => c.method === 'DELETE'), 'the delete');
    assert.deepEqual(calls.filter((c) => c.method === 'DELETE').map((c) => c.url), [`instance/${READY_ID}`]);
  });

  await t.test('the chat picks the ready model and streams a reply', async () => {
    assert.equal($('chat-model').value, 'karpathy/stories260K');
    assert.deepEqual(findAll($('chat-model'), (e) => e.tagName === 'OPTION').map((o) => o.textContent), ['stories260K', 'org/Loading-Model (loading 50%)']);
    assert.equal($('send').disabled, true); // nothing typed
    chat = () =>
      sseResponse([
        ': keep-alive\n\n',
        ': prefill_progress {"model":"karpathy/stories260K","processed_tokens":3,"total_tokens":6}\n\n',
        chunk({ role: 'assistant', reasoning_content: 'Thinking about <b>it</b>' }),
        chunk({ role: 'assistant', content: 'Once <script>alert(1)</script>' }),
        chunk({ role: 'assistant', content: ' upon a time “é”' }),
        chunk({}, { finish_reason: 'stop', usage: { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 } }),
        ': generation_stats {"prompt_tps":100.5,"generation_tps":50.25,"prompt_tokens":7,"generation_tokens":3,"peak_memory_usage":1}\n\n',
        'data: [DONE]\n\n',
      ]);
    $('temperature').value = '0.5';
    $('prompt').value = 'Tell me <b>a story</b>';
    $('prompt').dispatch('input');
    assert.equal($('send').disabled, false);
    $('prompt').dispatch('keydown', { key: 'Enter', shiftKey: false, isComposing: false });
    assert.equal($('prompt').value, '');
    await waitFor(() => $('send').hidden === false && $('messages').textContent.includes('upon a time'), 'the reply');

    const req = calls.find((c) => c.url === 'v1/chat/completions');
    assert.deepEqual(req.body, {
      model: 'karpathy/stories260K',
      messages: [{ role: 'user', content: 'Tell me <b>a story</b>' }],
      stream: true,
      stream_options: { include_usage: true },
      temperature: 0.5,
    });
    const msgs = byClass($('messages'), 'msg');
    assert.equal(msgs.length, 2);
    assert.equal(byClass(msgs[0], 'msg-text')[0].textContent, 'Tell me <b>a story</b>');
    const reply = msgs[1];
    assert.equal(byClass(reply, 'msg-text')[0].textContent, 'Once <script>alert(1)</script> upon a time “é”');
    assert.equal(findAll($('messages'), (e) => ['B', 'SCRIPT'].includes(e.tagName)).length, 0);
    const thinking = byClass(reply, 'thinking')[0];
    assert.equal(thinking.hidden, false);
    assert.equal(thinking.tagName, 'DETAILS');
    assert.equal(byClass(reply, 'thinking-text')[0].textContent, 'Thinking about <b>it</b>');
    assert.equal(byClass(reply, 'prefill')[0].hidden, true);
    const meta = byClass(reply, 'msg-meta')[0].textContent;
    assert.match(meta, /^3 tokens · [\d.,]+ tok\/s · TTFT \d/);
    assert.ok(meta.includes('7 prompt tokens'));
    assert.equal(byClass(reply, 'msg-error')[0].hidden, true);
    assert.equal($('stop').hidden, true);
    const saved = JSON.parse(localStorage.getItem('exo-dashboard-chat'));
    assert.equal(saved.messages.length, 2);
    assert.equal(saved.messages[1].content, 'Once <script>alert(1)</script> upon a time “é”');
  });

  await t.test('an error event is shown inline; the history is sent back', async () => {
    chat = () => sseResponse([chunk({ content: 'Par' }), 'data: {"error":{"message":"runner crashed","type":"InternalServerError","code":500}}\n\n', 'data: [DONE]\n\n']);
    $('prompt').value = 'again';
    $('composer').dispatch('submit');
    await waitFor(() => byClass($('messages'), 'msg').length === 4 && $('send').hidden === false, 'the error reply');
    const reply = byClass($('messages'), 'msg')[3];
    const err = byClass(reply, 'msg-error')[0];
    assert.equal(err.hidden, false);
    assert.equal(err.textContent, 'runner crashed');
    assert.equal(byClass(reply, 'msg-text')[0].textContent, 'Par');
    const req = calls.filter((c) => c.url === 'v1/chat/completions').at(-1);
    assert.deepEqual(req.body.messages.map((m) => m.role), ['user', 'assistant', 'user']);
    assert.equal(req.body.messages[1].content, 'Once <script>alert(1)</script> upon a time “é”');
  });

  await t.test('an HTTP error body is shown inline', async () => {
    chat = () => new Response('{"error":{"message":"No instance found for model karpathy/stories260K","type":"not_found_error","param":null,"code":404}}', { status: 404 });
    $('prompt').value = 'hello?';
    $('composer').dispatch('submit');
    await waitFor(() => byClass($('messages'), 'msg').length === 6 && $('send').hidden === false, 'the 404 reply');
    const reply = byClass($('messages'), 'msg')[5];
    assert.equal(byClass(reply, 'msg-error')[0].textContent, 'No instance found for model karpathy/stories260K');
  });

  await t.test('Stop aborts the request', async () => {
    let signal = null;
    chat = (opts) => {
      signal = opts.signal;
      return sseResponse([': keep-alive\n\n', chunk({ content: 'Never' }), chunk({ content: ' ending' })], { hang: true, signal: opts.signal });
    };
    $('prompt').value = 'go on forever';
    $('composer').dispatch('submit');
    await waitFor(() => $('messages').textContent.includes('Never ending'), 'the first tokens');
    assert.equal($('stop').hidden, false);
    assert.equal($('send').hidden, true);
    assert.equal($('chat-model').disabled, true);
    $('stop').click();
    await waitFor(() => $('send').hidden === false, 'the stop');
    assert.equal(signal.aborted, true);
    const reply = byClass($('messages'), 'msg')[7];
    assert.ok(byClass(reply, 'msg-meta')[0].textContent.includes('stopped'));
    assert.equal(byClass(reply, 'msg-error')[0].hidden, true);
    assert.equal(byClass(reply, 'msg-text')[0].textContent, 'Never ending');
  });

  await t.test('New chat clears the conversation', async () => {
    $('new-chat').click();
    assert.equal(byClass($('messages'), 'msg').length, 0);
    assert.ok($('messages').textContent.includes('Chat with your cluster'));
    assert.equal(JSON.parse(localStorage.getItem('exo-dashboard-chat')).messages.length, 0);
  });

  await t.test('downloads: the panel, the badges, Download, Cancel, Retry, Delete; adding and removing a model', async () => {
    assert.ok($('downloads').textContent.includes('No downloads'));
    assert.equal($('downloads-summary').textContent, '');
    const GiB = 2 ** 30;
    const dl = (tag, body) => ({ [tag]: { startLayer: 0, endLayer: 6, nLayers: 6, modelDirectory: '/m', total: 4 * GiB, downloaded: GiB, downloadedThisSession: GiB, completedFiles: 3, totalFiles: 7, speed: 12.5 * 2 ** 20, etaMs: 245000, readOnly: false, errorMessage: '', ...body } });
    state = {
      ...STATE,
      downloads: {
        [SELF]: [
          dl('DownloadOngoing', { nodeId: SELF, modelId: 'org/Loading-Model', endLayer: 3 }),
          dl('DownloadCompleted', { nodeId: SELF, modelId: 'karpathy/stories260K', total: 2 ** 20, downloaded: 2 ** 20 }),
          dl('DownloadCompleted', { nodeId: SELF, modelId: 'ro/model', readOnly: true }),
        ],
        [OTHER]: [dl('DownloadFailed', { nodeId: OTHER, modelId: 'mlx-community/Qwen3-0.6B-4bit', total: 0, downloaded: 0, errorMessage: 'HTTP 401 <unauthorized>' })],
      },
    };
    models = {
      object: 'list',
      data: [
        ...MODELS.data.map((m) => ({ ...m, status: 'downloaded' })),
        { id: 'mlx-community/Qwen3-0.6B-4bit', name: 'Qwen3-0.6B-4bit', status: 'downloadable', storage_size_megabytes: 400, is_custom: false },
        { id: 'me/custom-model', name: 'custom-model', status: 'downloadable', is_custom: true },
      ],
    };
    $('models-refresh').click();
    await waitFor(() => byClass($('downloads'), 'download').length === 4 && modelRow('me/custom-model'), 'the downloads and the catalogue');

    // the panel: under way first
    assert.equal($('downloads-summary').textContent, '1 downloading · 1 failed · 2 done');
    const rows = byClass($('downloads'), 'download');
    const [ongoing, failed, done, ro] = rows;
    assert.ok(ongoing.textContent.includes('org/Loading-Model'));
    for (const x of ['on vm', 'Downloading 25%', '1.0 / 4.0 GiB · 12.5 MiB/s · ETA 4m 05s · files 3/7 · layers 0–2 of 6']) assert.ok(ongoing.textContent.includes(x), x);
    assert.equal(findAll(ongoing, (e) => e.attrs.role === 'progressbar')[0].firstChild.style.width, '25%');
    assert.equal(button(ongoing, 'Cancel').length, 1);
    assert.equal(button(ongoing, 'Delete').length, 0);
    assert.ok(failed.textContent.includes('on gpu-box <b>'));
    assert.equal(byClass(failed, 'error-text')[0].textContent, 'HTTP 401 <unauthorized>');
    assert.equal(button(failed, 'Retry').length, 1);
    assert.ok(done.textContent.includes('karpathy/stories260K'));
    assert.equal(button(done, 'Delete').length, 1);
    assert.ok(ro.textContent.includes('read-only'));
    assert.equal(button(ro, 'Delete').length, 0);
    assert.equal(findAll($('downloads'), (e) => ['B', 'UNAUTHORIZED'].includes(e.tagName)).length, 0);

    // the loading instance's runner waits for its node's download
    const loading = byClass($('instances'), 'instance').find((c) => c.textContent.includes('org/Loading-Model'));
    assert.ok(loading.textContent.includes('downloading 25%'));

    // the models: a badge each, Download for downloadable ones, Remove for custom ones
    assert.ok(modelRow('karpathy/stories260K').textContent.includes('downloaded'));
    assert.equal(button(modelRow('karpathy/stories260K'), 'Download').length, 0);
    const qwen = modelRow('mlx-community/Qwen3-0.6B-4bit');
    assert.ok(qwen.textContent.includes('download failed'));
    assert.ok(qwen.textContent.includes('400 MiB'));
    assert.equal(button(qwen, 'Launch').length, 1);
    assert.equal(button(qwen, 'Remove').length, 0);
    const custom = modelRow('me/custom-model');
    for (const x of ['downloadable', 'custom']) assert.ok(custom.textContent.includes(x), x);
    assert.equal(button(custom, 'Remove').length, 1);
    assert.ok($('models-summary').textContent.includes('2 on disk · 2 to download'), $('models-summary').textContent);
    // the downloadable ones come after those on disk
    assert.deepEqual(byClass($('models'), 'model').map((r) => byClass(r, 'model-id')[0].textContent), [
      'bad/model', 'karpathy/stories260K', 'me/custom-model', 'mlx-community/Qwen3-0.6B-4bit',
    ]);

    // the status filter
    $('model-status-filter').value = 'downloadable';
    $('model-status-filter').dispatch('change');
    assert.equal(byClass($('models'), 'model').length, 2);
    $('model-status-filter').value = '';
    $('model-status-filter').dispatch('change');
    assert.equal(byClass($('models'), 'model').length, 4);

    // Download: to this node
    button(qwen, 'Download')[0].click();
    await waitFor(() => calls.some((c) => c.url === 'download/start'), 'the download');
    assert.deepEqual(calls.filter((c) => c.url === 'download/start').map((c) => [c.method, c.body]), [['POST', { model_id: 'mlx-community/Qwen3-0.6B-4bit', target_node_id: SELF }]]);
    await waitFor(() => $('toasts').textContent.includes('Downloading mlx-community/Qwen3-0.6B-4bit to vm'), 'the download toast');

    // Launch of a model not on disk: the picker says it is downloaded first
    button(modelRow('mlx-community/Qwen3-0.6B-4bit'), 'Launch')[0].click();
    await waitFor(() => modelRow('mlx-community/Qwen3-0.6B-4bit').textContent.includes('Launch with defaults'), 'the picker');
    assert.ok(modelRow('mlx-community/Qwen3-0.6B-4bit').textContent.includes('Not on disk yet: the nodes it runs on download it first'));
    button(modelRow('mlx-community/Qwen3-0.6B-4bit'), 'Cancel')[0].click();

    // Cancel and Retry in the panel
    button(byClass($('downloads'), 'download')[0], 'Cancel')[0].click();
    await waitFor(() => calls.some((c) => c.url === 'download/cancel'), 'the cancel');
    assert.deepEqual(calls.find((c) => c.url === 'download/cancel').body, { model_id: 'org/Loading-Model', target_node_id: SELF });
    await waitFor(() => button(byClass($('downloads'), 'download')[1], 'Retry').length === 1, 'the panel after the cancel');
    button(byClass($('downloads'), 'download')[1], 'Retry')[0].click();
    await waitFor(() => calls.filter((c) => c.url === 'download/start').length === 2, 'the retry');
    assert.deepEqual(calls.filter((c) => c.url === 'download/start')[1].body, { model_id: 'mlx-community/Qwen3-0.6B-4bit', target_node_id: OTHER });

    // Delete asks first; the daemon's refusal is shown
    const asked = [];
    globalThis.confirm = (m) => (asked.push(m), false);
    await waitFor(() => button(byClass($('downloads'), 'download')[2], 'Delete').length === 1, 'the panel after the retry');
    button(byClass($('downloads'), 'download')[2], 'Delete')[0].click();
    assert.deepEqual(asked, ['Delete the files of karpathy/stories260K on vm?']);
    assert.equal(calls.filter((c) => c.url.startsWith('download/') && c.method === 'DELETE').length, 0);
    globalThis.confirm = () => true;
    button(byClass($('downloads'), 'download')[2], 'Delete')[0].click();
    await waitFor(() => $('toasts').textContent.includes('Delete failed: the models dir of this node is <read-only>'), 'the refusal');
    assert.deepEqual(calls.filter((c) => c.url.startsWith('download/') && c.method === 'DELETE').map((c) => c.url), [`download/${SELF}/karpathy/stories260K`]);

    // Add: checked before it is sent, then the daemon's error, then added
    const adds = () => calls.filter((c) => c.url === 'models/add');
    $('add-model-id').value = 'not an id';
    $('add-model').dispatch('submit');
    assert.equal($('add-model-error').hidden, false);
    assert.ok($('add-model-error').textContent.includes('not of the form org/name'));
    $('add-model-id').value = 'org/na--me';
    $('add-model').dispatch('submit');
    assert.ok($('add-model-error').textContent.includes('"--"'));
    assert.equal(adds().length, 0);
    $('add-model-id').dispatch('input');
    assert.equal($('add-model-error').hidden, true);
    $('add-model-id').value = 'bad-org/missing';
    $('add-model').dispatch('submit');
    await waitFor(() => $('add-model-error').hidden === false, 'the add error');
    assert.equal($('add-model-error').textContent, 'could not fetch the config of <bad-org/missing> from Hugging Face (HTTP 404)');
    assert.equal($('add-model-id').value, 'bad-org/missing'); // kept, to fix it
    assert.equal($('add-model-btn').disabled, false);
    $('add-model-id').value = ' https://huggingface.co/new-org/New-Model ';
    $('add-model').dispatch('submit');
    await waitFor(() => modelRow('new-org/New-Model'), 'the new model');
    assert.deepEqual(adds().map((c) => c.body), [{ model_id: 'bad-org/missing' }, { model_id: 'new-org/New-Model' }]);
    assert.equal($('add-model-id').value, '');
    assert.equal($('add-model-error').hidden, true);
    assert.ok(modelRow('new-org/New-Model').textContent.includes('custom'));

    // Search Hugging Face: the results under the box; a pick fills the box
    const searches = () => calls.filter((c) => c.url.startsWith('models/search?'));
    $('add-model-id').value = ' qwen3 4b ';
    $('add-model-search').dispatch('click');
    await waitFor(() => $('add-model-results').hidden === false, 'the search results');
    assert.equal(searches().at(-1).url, 'models/search?query=qwen3%204b&limit=10');
    const results = findAll($('add-model-results'), (e) => e.tagName === 'BUTTON');
    assert.equal(results.length, 2);
    assert.ok(results[0].textContent.includes('mlx-community/Qwen3-4B-4bit'));
    assert.ok(results[0].textContent.includes('123.5k downloads'), results[0].textContent);
    assert.equal($('add-model-search').disabled, false);
    results[1].click();
    assert.equal($('add-model-id').value, 'mlx-community/Qwen3-4B-8bit');
    assert.equal($('add-model-results').hidden, true);
    $('add-model-id').value = 'nothing';
    $('add-model-search').dispatch('click');
    await waitFor(() => $('add-model-results').hidden === false, 'an empty answer');
    assert.ok($('add-model-results').textContent.includes('No model on Hugging Face matches'));
    $('add-model-id').value = 'offline';
    $('add-model-search').dispatch('click');
    await waitFor(() => $('add-model-error').hidden === false, 'the search error');
    assert.ok($('add-model-error').textContent.includes('offline mode'), $('add-model-error').textContent);
    assert.equal($('add-model-results').hidden, true);
    $('add-model-id').value = '';
    $('add-model-id').dispatch('input');

    // Remove a custom model
    button(modelRow('me/custom-model'), 'Remove')[0].click();
    await waitFor(() => !modelRow('me/custom-model'), 'the removal');
    assert.ok(calls.some((c) => c.method === 'DELETE' && c.url === 'models/custom/me/custom-model'));
    delete globalThis.confirm;

    state = STATE;
    models = MODELS;
    $('models-refresh').click();
    await waitFor(() => $('downloads').textContent.includes('No downloads') && !modelRow('new-org/New-Model'), 'back to no downloads');
  });

  await t.test('a daemon that goes away shows as offline, then comes back', async () => {
    daemonUp = false;
    await waitFor(() => $('conn').dataset.state === 'down', 'offline');
    assert.equal($('conn-text').textContent, 'offline, retrying');
    daemonUp = true;
    await waitFor(() => $('conn').dataset.state === 'ok', 'back online');
  });
});
