// Helpers for the cluster suite (cluster.test.mjs): a tiny model built from
// the repository's fixtures, daemons that form clusters on loopback or in
// network namespaces, and waits on what their APIs report.
//
// Every cluster gets its own namespace name and discovery port, so suites
// running at the same time on one machine (and any real exo on the LAN)
// never see each other's nodes.
import { spawn, execFileSync } from 'node:child_process';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import * as D from '../e2e/daemon.mjs';

export const { REPO, EXO_BIN, sleep } = D;
export const MODEL_ID = 'exo-cluster/qwen3-tiny';

// A ChatML template (Qwen's turn markers) without the fixture model's
// thinking rules: enough for a chat through every API.
const TEMPLATE =
  "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}" +
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

// The qwen3 q4g64 parity fixture as MODELS/exo-cluster--qwen3-tiny.
export async function buildModel(modelsDir) {
  const dir = path.join(modelsDir, 'exo-cluster--qwen3-tiny');
  await fsp.mkdir(dir, { recursive: true });
  const fx = path.join(REPO, 'tests/fixtures/qwen3-q4g64');
  await fsp.copyFile(path.join(fx, 'model.safetensors'), path.join(dir, 'model.safetensors'));
  const cfg = JSON.parse(await fsp.readFile(path.join(fx, 'config.json'), 'utf8'));
  const id = (t) => D.QWEN_FIRST_SPECIAL + D.QWEN_SPECIALS.findIndex(([c]) => c === t);
  cfg.bos_token_id = id('<|endoftext|>');
  cfg.eos_token_id = id('<|im_end|>');
  await fsp.writeFile(path.join(dir, 'config.json'), JSON.stringify(cfg));
  await fsp.writeFile(path.join(dir, 'tokenizer.json'), JSON.stringify(D.qwenTokenizerJson()));
  const added = {};
  D.QWEN_SPECIALS.forEach(([content, special], i) => {
    added[String(D.QWEN_FIRST_SPECIAL + i)] = { content, lstrip: false, normalized: false, rstrip: false,
      single_word: false, special };
  });
  await fsp.writeFile(path.join(dir, 'tokenizer_config.json'), JSON.stringify({
    add_bos_token: false, added_tokens_decoder: added, bos_token: null, eos_token: '<|im_end|>',
    pad_token: '<|endoftext|>', model_max_length: 256, tokenizer_class: 'Qwen2Tokenizer',
    chat_template: TEMPLATE,
  }));
  return dir;
}

const rand = (lo, hi) => lo + Math.floor(Math.random() * (hi - lo));

// The sanitizer build runs several times slower (and CI runs it beside
// another suite on 2 cores): every wait stretches by this factor.
export const SLOW = /asan/.test(EXO_BIN) ? 3 : 1;

export async function getJson(base, p, timeoutMs = 5000) {
  const r = await fetch(base + p, { signal: AbortSignal.timeout(timeoutMs) });
  const text = await r.text();
  if (!r.ok) throw new Error(`GET ${base}${p}: ${r.status} ${text}`);
  return JSON.parse(text);
}

export async function postJson(base, p, body) {
  const r = await fetch(base + p, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body),
    signal: AbortSignal.timeout(10000),
  });
  const text = await r.text();
  let json;
  try { json = JSON.parse(text); } catch { json = undefined; }
  return { status: r.status, text, json };
}

// Polls fn until it returns a truthy value (returned) or timeoutMs passes
// (throws with the last value or error, described by what).
export async function until(what, fn, timeoutMs = 20000, everyMs = 100) {
  timeoutMs *= SLOW;
  const t0 = Date.now();
  let last;
  for (;;) {
    try {
      last = await fn();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() - t0 > timeoutMs)
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}: ${last?.stack ?? JSON.stringify(last)}`);
    await sleep(everyMs);
  }
}

// JSON with object keys sorted, for comparing States.
export function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (v && typeof v === 'object')
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(',')}}`;
  return JSON.stringify(v);
}

// ---- network namespaces -----------------------------------------------------------------

export function canUseNetns() {
  if (process.getuid?.() !== 0) return 'not root';
  try {
    execFileSync('ip', ['netns', 'list'], { stdio: 'ignore' });
  } catch {
    return 'no `ip netns` (iproute2)';
  }
  return null;
}

const sh = (args) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] });

// A bridge in this namespace with one veth to each of n new namespaces;
// node i has 10.<net>.0.<i+1>/24 (unless ipv4 is false: IPv6 link-local
// only), the bridge 10.<net>.0.254, so this process reaches every API.
export class Lan {
  constructor(n, { ipv4 = true, multicast = true } = {}) {
    this.tag = `x${process.pid % 10000}${rand(10, 99)}`;
    this.net = rand(100, 250);
    this.bridge = `br${this.tag}`;
    this.ns = [];
    this.ipv4 = ipv4;
    sh(['link', 'add', this.bridge, 'type', 'bridge']);
    if (ipv4) sh(['addr', 'add', `10.${this.net}.0.254/24`, 'dev', this.bridge]);
    sh(['link', 'set', this.bridge, 'up']);
    for (let i = 0; i < n; i++) {
      const ns = `ns${this.tag}${i}`, host = `h${this.tag}${i}`, peer = `p${this.tag}${i}`;
      sh(['netns', 'add', ns]);
      sh(['link', 'add', host, 'type', 'veth', 'peer', 'name', peer]);
      sh(['link', 'set', peer, 'netns', ns]);
      sh(['link', 'set', host, 'master', this.bridge]);
      sh(['link', 'set', host, 'up']);
      sh(['-n', ns, 'link', 'set', 'lo', 'up']);
      sh(['-n', ns, 'link', 'set', peer, 'name', 'eth0']);
      if (ipv4) sh(['-n', ns, 'addr', 'add', `10.${this.net}.0.${i + 1}/24`, 'dev', 'eth0']);
      if (!multicast) sh(['-n', ns, 'link', 'set', 'eth0', 'multicast', 'off']);
      sh(['-n', ns, 'link', 'set', 'eth0', 'up']);
      this.ns.push({ ns, host, ip: ipv4 ? `10.${this.net}.0.${i + 1}` : null });
    }
  }
  // Cuts node i off the LAN (its veth on the bridge goes down) or back on.
  setLink(i, up) { sh(['link', 'set', this.ns[i].host, up ? 'up' : 'down']); }
  destroy() {
    for (const { ns, host } of this.ns) {
      try { sh(['link', 'del', host]); } catch { /* gone with the namespace */ }
      try { sh(['netns', 'del', ns]); } catch { /* already gone */ }
    }
    try { sh(['link', 'del', this.bridge]); } catch { /* already gone */ }
  }
}

// ---- daemons -----------------------------------------------------------------------------

export class Node {
  constructor(cluster, name, proc, dataDir, apiHost, netns) {
    this.cluster = cluster;
    this.name = name;
    this.daemon = new D.Daemon(proc, dataDir);
    this.dataDir = dataDir;
    this.apiHost = apiHost;
    this.netns = netns; // set: the API is reached with `ip netns exec NS curl`
  }
  get base() { return `http://${this.apiHost}:${this.daemon.port}`; }
  get stderr() { return this.daemon.stderr; }
  async get(p) {
    if (!this.netns) return getJson(this.base, p);
    const out = execFileSync('ip', ['netns', 'exec', this.netns, 'curl', '-sf', '-m', '5', this.base + p]);
    return JSON.parse(out.toString());
  }
  async cluster_() { return this.get('/cluster'); }
  async state() { return this.get('/state'); }
  async id() { return this.get('/node_id'); }
  async stop(signal = 'SIGTERM') { return this.daemon.stop(signal); }
}

export class Cluster {
  constructor({ secret, ns, discoveryPort } = {}) {
    this.ns = ns ?? `test-${process.pid}-${rand(1e5, 1e6)}`;
    this.discoveryPort = discoveryPort ?? rand(40000, 60000);
    this.secret = secret;
    this.nodes = [];
  }

  // Starts `exo serve` (in network namespace `netns` if given) and waits for
  // its API. opts: {models (a models dir), extra (flags), dataDir, netns,
  // apiHost (where this process reaches the API), secret, ns}.
  async start(name, opts = {}) {
    const dataDir = opts.dataDir ?? await fsp.mkdtemp(path.join(os.tmpdir(), `exo-cl-${name}-`));
    const models = opts.models ?? path.join(dataDir, 'no-models');
    const secret = opts.secret !== undefined ? opts.secret : this.secret;
    // opts.defaults: no cluster flags at all (the default namespace and
    // ports), for daemons in network namespaces of their own
    const cluster = opts.defaults ? [] : ['--namespace', opts.ns ?? this.ns, '--discovery-port',
      String(this.discoveryPort), '--cluster-port', '0'];
    const args = ['serve', '--api-port', '0', '--host', opts.netns && !opts.viaNetns ? '0.0.0.0' : '127.0.0.1',
      '--data-dir', dataDir, '--models-dir', models, '--threads', '1', '--ctx', '2048', ...cluster,
      ...(secret ? ['--cluster-secret', secret] : []), ...(opts.extra ?? [])];
    const env = { ...process.env };
    for (const k of ['EXO_MODELS_DIRS', 'EXO_MODELS_READ_ONLY_DIRS', 'EXO_NAMESPACE', 'EXO_CLUSTER_SECRET',
      'EXO_BOOTSTRAP_PEERS'])
      delete env[k];
    const proc = opts.netns
      ? spawn('ip', ['netns', 'exec', opts.netns, EXO_BIN, ...args], { stdio: ['ignore', 'pipe', 'pipe'], env })
      : spawn(EXO_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
    const node = new Node(this, name, proc, dataDir, opts.apiHost ?? '127.0.0.1',
      opts.viaNetns ? opts.netns : undefined);
    this.nodes.push(node);
    await until(`${name}'s API`, () => {
      if (node.daemon.exitCode !== undefined) throw new Error(`${name} exited: ${node.stderr}`);
      const m = /API listening on http:\/\/[0-9.]+:(\d+)/.exec(node.stderr);
      if (m) node.daemon.port = +m[1];
      return m;
    }, 15000, 20);
    return node;
  }

  live() { return this.nodes.filter((n) => n.daemon.exitCode === undefined); }

  // Waits until every node in `nodes` sees all the others, they agree on one
  // master (not in an election, caught up), and returns its id.
  async converged(nodes = this.live(), timeoutMs = 20000) {
    const ids = await Promise.all(nodes.map((n) => n.id()));
    return until(`${nodes.length} nodes to agree on a master`, async () => {
      const views = await Promise.all(nodes.map((n) => n.cluster_()));
      const master = views[0].masterNodeId;
      for (const [i, v] of views.entries()) {
        const peers = new Set(v.peers.map((p) => p.nodeId));
        if (v.masterNodeId !== master || v.electionInProgress || !v.caughtUp) return false;
        if (!ids.every((id) => id === ids[i] || peers.has(id))) return false;
      }
      return ids.includes(master) ? master : false;
    }, timeoutMs);
  }

  // Waits until the nodes' States are equal (canonical JSON) and returns it.
  async sameState(nodes = this.live(), timeoutMs = 20000, check = () => true) {
    let last = [];
    try {
      return await until(`identical /state on ${nodes.length} nodes`, async () => {
        const states = await Promise.all(nodes.map((n) => n.state()));
        last = states;
        const c = states.map(canonical);
        return c.every((x) => x === c[0]) && check(states[0]) ? states[0] : false;
      }, timeoutMs, 200);
    } catch (e) {
      // say how they differ: each node's event count and what it holds, and
      // the first place where the first two States part
      const brief = last.map((st, i) => `${nodes[i].name}: idx ${st.lastEventAppliedIdx}, ` +
        `${Object.keys(st.nodeIdentities ?? {}).length} nodes, ${Object.keys(st.instances ?? {}).length} instances, ` +
        `${(st.topology?.connections ?? []).length} edges, check ${check(st)}`);
      if (last.length > 1) {
        const a = canonical(last[0]), b = canonical(last[1]);
        let k = 0;
        while (k < a.length && a[k] === b[k]) k++;
        brief.push(`first difference: ...${a.slice(Math.max(0, k - 120), k + 80)}\n  vs ...${b.slice(Math.max(0, k - 120), k + 80)}`);
      }
      e.message += `\n${brief.join('\n')}`;
      throw e;
    }
  }

  async stopAll() {
    await Promise.all(this.live().map((n) => n.stop('SIGKILL')));
    if (!process.env.EXO_CLUSTER_KEEP) // keep the data dirs (runner logs) to look at
      for (const n of this.nodes) await fsp.rm(n.dataDir, { recursive: true, force: true });
    this.nodes = [];
  }
}

// Places the model through `via` and waits until every node's State shows
// its runner Ready; returns the instance's node id.
export async function placeAndWait(via, nodes, modelId = MODEL_ID) {
  const r = await postJson(via.base, '/place_instance', { model_id: modelId });
  if (r.status !== 200) throw new Error(`place_instance: ${r.status} ${r.text}`);
  // the answer's card is the model's as /models lists it, wherever its files are
  const card = r.json.model_card;
  if (card?.id !== modelId || !(card.storage_size_megabytes >= 0) || !card.nodes?.length)
    throw new Error(`place_instance: model_card ${JSON.stringify(card)}`);
  return until(`a Ready runner of ${modelId} on every node`, async () => {
    let where = null;
    for (const n of nodes) {
      const st = await n.state();
      const inst = Object.values(st.instances).map((i) => Object.values(i)[0])
        .find((b) => b.shardAssignments.modelId === modelId);
      if (!inst) return false;
      const [[nodeId, runner]] = Object.entries(inst.shardAssignments.nodeToRunner);
      if (!st.runners[runner] || !('RunnerReady' in st.runners[runner])) return false;
      where = nodeId;
    }
    return where;
  }, 30000, 200);
}

export { D };
export const exists = (p) => fs.existsSync(p);

// The last lines of a node's daemon log and of each of its runners' logs
// (a fault between ranks is told in the runners' logs of every node).
async function logTails(n) {
  let out = `\n--- ${n.name} (${n.dataDir}):\n${n.stderr.split('\n').slice(-30).join('\n')}`;
  const dir = path.join(n.dataDir, 'cache/exo_log/runner_log');
  for (const f of (await fsp.readdir(dir).catch(() => [])).sort()) {
    const text = await fsp.readFile(path.join(dir, f), 'utf8').catch(() => '');
    if (text.trim()) out += `\n--- ${n.name} ${f}:\n${text.trimEnd().split('\n').slice(-20).join('\n')}`;
  }
  return out;
}

// Runs fn(cluster) and stops every daemon after; on failure the error says
// the tail of each daemon's and each runner's log.
export async function withCluster(opts, fn) {
  const cl = new Cluster(opts);
  try {
    await fn(cl);
  } catch (e) {
    if (!(e instanceof Error)) e = new Error(JSON.stringify(e));
    for (const n of cl.nodes) e.message += await logTails(n);
    throw e;
  } finally {
    await cl.stopAll();
  }
}
