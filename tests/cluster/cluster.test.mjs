// The cluster suite: real `exo serve` daemons that find each other, elect a
// master, replicate one State and serve each other's instances.
//
// On loopback (every machine): 3 daemons discover each other by multicast
// with no flags but their ports and test namespace; they agree on one master
// and show identical /state; a request to any node streams from the instance
// on another through the OpenAI chat, Claude, Responses and Ollama clients,
// greedy output equal to the instance's own node; cancel and client
// disconnect stop the remote runner; killing the master elects a new one and
// the States converge; a restarted node keeps its id and catches up; nodes
// of another namespace stay apart; a node with another cluster secret never
// joins; forged bytes on a node's cluster port change nothing.
// In network namespaces (root only; skipped otherwise, with the reason):
// discovery over a bridge with no cluster flags at all, IPv6-only links, a node cut off and brought back
// (timed out, then rejoins and catches up), bootstrap peers with multicast
// switched off.
//
// Run: tests/integration/test_cluster.sh, or
//      node --test-reporter=./tests/e2e/reporter.mjs tests/cluster/cluster.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import os from 'node:os';
import path from 'node:path';
import fsp from 'node:fs/promises';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import * as C from './cluster.mjs';

const { MODEL_ID, until, sleep } = C;
const T = { timeout: 90000 * C.SLOW };
let tmp, models;

before(async () => {
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'exo-cluster-'));
  models = path.join(tmp, 'models');
  await C.buildModel(models);
});

after(async () => {
  if (!process.env.EXO_CLUSTER_KEEP) await fsp.rm(tmp, { recursive: true, force: true });
});

const { withCluster } = C;

const chat = (content) => [{ role: 'user', content }];

// Greedy text of a streamed chat completion through the OpenAI client.
async function openaiText(base, prompt, max = 24) {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'x', maxRetries: 0 });
  const s = await client.chat.completions.create({ model: MODEL_ID, messages: chat(prompt), max_tokens: max,
    temperature: 0, stream: true });
  let text = '';
  for await (const c of s) text += c.choices[0]?.delta?.content ?? '';
  return text;
}

test('loopback: discovery, one master, one State, any node serves any instance', T, async () => {
  await withCluster({}, async (cl) => {
    const a = await cl.start('a', { models }); // only a has the model on disk
    const b = await cl.start('b');
    const c = await cl.start('c');
    const api = await cl.start('api-only', { extra: ['--no-worker'] }); // serves requests, runs nothing
    const master = await cl.converged([a, b, c, api]);
    const ids = await Promise.all([a, b, c].map((n) => n.id()));
    assert.ok([...ids, await api.id()].includes(master));
    for (const id of ids) assert.match(id, /^[0-9a-f]{32}$/, 'node ids derive from the node key');

    // every node reports itself, and the States agree
    const st = await cl.sameState([a, b, c, api], 20000, (s) => Object.keys(s.nodeIdentities).length === 4 &&
      s.nodeModels[ids[0]]?.includes(MODEL_ID));
    const apiId = await api.id();
    assert.deepEqual(Object.keys(st.nodeMemory).sort(), [...ids, apiId].sort());
    assert.deepEqual(st.nodeBackends[apiId], [], 'a node without a worker offers no backend');

    // every node lists the model a has on disk, and where it is
    for (const n of [b, c]) {
      const list = await n.get('/v1/models');
      const m = list.data.find((x) => x.id === MODEL_ID);
      assert.ok(m, `${n.name} lists ${MODEL_ID}: ${JSON.stringify(list.data.map((x) => x.id))}`);
      assert.deepEqual(m.nodes, [ids[0]]);
      assert.ok(m.storage_size_megabytes >= 0 && m.family === 'qwen3', JSON.stringify(m));
    }

    // placed through c, which does not have the model: it lands on a
    const where = await C.placeAndWait(c, [a, b, c, api]);
    assert.equal(where, ids[0]);

    // the same greedy text from every node, through every API
    const want = await openaiText(a.base, 'Hello there');
    assert.ok(want.length > 0);
    for (const n of [b, c, api]) assert.equal(await openaiText(n.base, 'Hello there'), want, `via ${n.name}`);

    const anthropic = new Anthropic({ baseURL: b.base, apiKey: 'x', maxRetries: 0 });
    let claude = '';
    const cs = anthropic.messages.stream({ model: MODEL_ID, max_tokens: 24, temperature: 0,
      messages: chat('Hello there') });
    for await (const ev of cs)
      if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') claude += ev.delta.text;
    assert.equal(claude, want, 'Claude messages via b');

    const responses = new OpenAI({ baseURL: `${c.base}/v1`, apiKey: 'x', maxRetries: 0 });
    let resp = '';
    const rs = await responses.responses.create({ model: MODEL_ID, input: 'Hello there', max_output_tokens: 24,
      temperature: 0, stream: true });
    for await (const ev of rs) if (ev.type === 'response.output_text.delta') resp += ev.delta;
    assert.equal(resp, want, 'Responses via c');

    const ollama = new Ollama({ host: `${b.base}/ollama` });
    assert.ok((await ollama.ps()).models.some((m) => m.name === MODEL_ID), 'b lists the instance on a as running');
    let ol = '';
    for await (const part of await ollama.chat({ model: MODEL_ID, messages: chat('Hello there'), stream: true,
      options: { temperature: 0, num_predict: 24 } }))
      ol += part.message.content;
    assert.equal(ol, want, 'Ollama via b');

    // non-streaming too
    const plain = await new OpenAI({ baseURL: `${b.base}/v1`, apiKey: 'x', maxRetries: 0 }).chat.completions
      .create({ model: MODEL_ID, messages: chat('Hello there'), max_tokens: 24, temperature: 0 });
    assert.equal(plain.choices[0].message.content, want);

    // cancel: a long generation from b, cancelled by /v1/cancel on b; then a
    // client that goes away from c; the runner on a is free again after each
    const long = { model: MODEL_ID, messages: chat('Count forever'), max_tokens: 2000, stream: true };
    const r = await fetch(`${b.base}/bench/chat/completions`, { method: 'POST', body: JSON.stringify(long),
      headers: { 'content-type': 'application/json' } });
    const reader = r.body.getReader();
    const first = new TextDecoder().decode((await reader.read()).value);
    const cmd = /"id":"([0-9a-f-]{36})"/.exec(first)?.[1] ?? await until('the stream id', async () => {
      const chunk = new TextDecoder().decode((await reader.read()).value ?? new Uint8Array());
      return /"id":"([0-9a-f-]{36})"/.exec(chunk)?.[1];
    });
    const cancel = await C.postJson(b.base, `/v1/cancel/${cmd}`, {});
    assert.equal(cancel.status, 200, cancel.text);
    let rest = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      rest += new TextDecoder().decode(value);
    }
    assert.match(rest, /\[DONE\]/, 'the cancelled stream ends');
    await until('no tasks left on any node', async () =>
      (await Promise.all([a, b, c, api].map((n) => n.state()))).every((s) => Object.keys(s.tasks).length === 0));

    const ac = new AbortController();
    const r2 = await fetch(`${c.base}/bench/chat/completions`, { method: 'POST', body: JSON.stringify(long),
      headers: { 'content-type': 'application/json' }, signal: ac.signal });
    await r2.body.getReader().read();
    ac.abort();
    await until('the abandoned request to be cancelled everywhere', async () =>
      (await Promise.all([a, b, c].map((n) => n.state()))).every((s) => Object.keys(s.tasks).length === 0));
    assert.equal(await openaiText(c.base, 'Hello there'), want, 'the runner serves again');
    await cl.sameState([a, b, c, api]);
  });
});

test('loopback: killing the master elects a new one; a restarted node keeps its id', T, async () => {
  await withCluster({}, async (cl) => {
    const nodes = [];
    for (const name of ['a', 'b', 'c']) nodes.push(await cl.start(name, { models }));
    const master = await cl.converged(nodes);
    const ids = await Promise.all(nodes.map((n) => n.id()));
    await cl.sameState(nodes, 20000, (s) => Object.keys(s.nodeIdentities).length === 3);
    const old = nodes[ids.indexOf(master)];
    const survivors = nodes.filter((n) => n !== old);
    const t0 = Date.now();
    await old.stop('SIGKILL');
    const next = await cl.converged(survivors);
    const failover = Date.now() - t0;
    assert.notEqual(next, master);
    const st = await cl.sameState(survivors, 20000, (s) => !(master in s.nodeIdentities));
    assert.equal(Object.keys(st.nodeIdentities).length, 2, 'the dead master is not in the new session');
    console.log(`# failover: new master ${next.slice(0, 8)} and one State in ${failover} ms`);

    // a restart with the same data dir comes back with the same id and joins
    const back = await cl.start('a-again', { models, dataDir: old.dataDir });
    assert.equal(await back.id(), master, 'the node id survives a restart');
    await cl.converged([...survivors, back]);
    await cl.sameState([...survivors, back], 20000, (s) => Object.keys(s.nodeIdentities).length === 3);
  });
});

test('loopback: namespaces and secrets keep clusters apart; forged bytes change nothing', T, async () => {
  await withCluster({ secret: 'right' }, async (cl) => {
    const a = await cl.start('a');
    const b = await cl.start('b');
    await cl.converged([a, b]);
    const stranger = await cl.start('other-ns', { ns: `${cl.ns}-other`, secret: 'right' });
    const wrong = await cl.start('wrong-secret', { secret: 'wrong' });
    const aPort = (await a.cluster_()).clusterPort;
    // the wrong secret also dials a directly (as --bootstrap-peers would)
    const dialer = await cl.start('wrong-dialer', { secret: 'also-wrong', extra: ['--bootstrap-peers', `127.0.0.1:${aPort}`] });
    await sleep(4000);
    for (const n of [stranger, wrong, dialer]) {
      const v = await n.cluster_();
      assert.equal(v.peers.length, 0, `${n.name} has peers ${JSON.stringify(v.peers)}`);
      assert.equal(v.masterNodeId, await n.id(), `${n.name} is alone`);
    }
    const va = await a.cluster_();
    assert.equal(va.peers.length, 1, 'a is linked with b only');
    assert.match(a.stderr, /authentication failed|another namespace or cluster secret/,
      'a says why the wrong secret was refused');

    // forged bytes on a's cluster port: garbage, a hello with a bad version,
    // a valid-looking hello followed by garbage
    const forge = (bytes) => new Promise((resolve) => {
      const s = net.connect(aPort, '127.0.0.1', () => s.write(bytes));
      s.resume(); // read what a sends, or 'close' never comes
      s.on('error', () => resolve('error'));
      s.on('close', () => resolve('closed'));
      setTimeout(() => { s.destroy(); resolve('timeout'); }, 8000);
    });
    const hello = Buffer.alloc(80);
    hello.write('EXOL', 0);
    hello.writeUInt16LE(1, 4);
    const badVersion = Buffer.from(hello);
    badVersion.writeUInt16LE(99, 4);
    const results = await Promise.all([forge(Buffer.from('GET / HTTP/1.1\r\n\r\n'.repeat(20))),
      forge(badVersion), forge(Buffer.concat([hello, Buffer.alloc(24), Buffer.from([255, 255, 255, 127])]))]);
    for (const r of results) assert.notEqual(r, 'timeout', 'a forged connection is closed, not kept');
    assert.equal((await a.cluster_()).peers.length, 1);
    await cl.sameState([a, b]);
  });
});

// ---- network namespaces --------------------------------------------------------------------

const netnsSkip = C.canUseNetns();

test('netns: discovery over a bridge; the master cut off, the rest carry on, it rejoins with nothing lost', { ...T,
  timeout: 120000 * C.SLOW, skip: netnsSkip ?? false }, async () => {
  const lan = new C.Lan(3);
  try {
    await withCluster({}, async (cl) => {
      // each node has a network of its own: no cluster flags at all (the
      // default namespace, discovery and cluster ports), as a user runs exo
      const nodes = [];
      for (let i = 0; i < 3; i++)
        nodes.push(await cl.start(`n${i}`, { models, netns: lan.ns[i].ns, apiHost: lan.ns[i].ip, defaults: true }));
      await cl.converged(nodes);
      const ids = await Promise.all(nodes.map((n) => n.id()));
      // the nodes measure each other's LAN addresses (probes run every 10 s)
      await until('an edge to node 0 measured', async () => (await nodes[1].state()).topology.connections
        .some((e) => e.address.startsWith(`${lan.ns[0].ip}:`) && e.bandwidthBps > 0), 30000, 250);
      await cl.sameState(nodes, 20000, (s) => Object.keys(s.nodeIdentities).length === 3);
      const st = await nodes[0].state();
      const edge = st.topology.connections.find((e) => e.address.startsWith('10.') && e.bandwidthBps > 0);
      assert.ok(edge.latencyUs > 0 && edge.bandwidthBps > 0, JSON.stringify(edge));

      // cut the master off (the hardest case: it comes back with a State of
      // its own): the others elect another and time it out
      const masterBefore = (await nodes[0].cluster_()).masterNodeId;
      const cut = ids.indexOf(masterBefore);
      const rest = nodes.filter((_, i) => i !== cut);
      lan.setLink(cut, false);
      await cl.converged(rest, 20000);
      await cl.sameState(rest, 30000, (s) => !(masterBefore in s.nodeIdentities));
      // work happens on the majority side meanwhile: an instance is placed
      await C.placeAndWait(rest[0], rest);
      // back on the LAN: one cluster, whose State is the majority's (nothing
      // it did is lost), the old master included again
      lan.setLink(cut, true);
      const master = await cl.converged(nodes, 30000);
      assert.notEqual(master, masterBefore, 'the larger side\'s master stays master');
      await cl.sameState(nodes, 30000, (s) => Object.keys(s.nodeIdentities).length === 3 &&
        Object.keys(s.instances).length === 1);
    });
  } finally {
    lan.destroy();
  }
});

test('netns: IPv6 link-local only', { ...T, skip: netnsSkip ?? false }, async () => {
  const lan = new C.Lan(2, { ipv4: false });
  try {
    await withCluster({}, async (cl) => {
      // no IPv4 on the LAN: the API is reached through the namespace's loopback
      const nodes = [];
      for (let i = 0; i < 2; i++)
        nodes.push(await cl.start(`v6-${i}`, { netns: lan.ns[i].ns, apiHost: '127.0.0.1', viaNetns: true }));
      const got = await until('the two IPv6-only nodes to link and agree', async () => {
        const v = [await nodes[0].cluster_(), await nodes[1].cluster_()];
        return v[0].peers.length === 1 && v[1].peers.length === 1 && v[0].masterNodeId === v[1].masterNodeId &&
          v[0].peers[0].remote.includes('fe80') ? v : false;
      }, 30000, 250);
      assert.match(got[0].peers[0].remote, /fe80/, 'linked over IPv6 link-local');
    });
  } finally {
    lan.destroy();
  }
});

test('netns: bootstrap peers where multicast is off', { ...T, skip: netnsSkip ?? false }, async () => {
  const lan = new C.Lan(3, { multicast: false });
  try {
    await withCluster({}, async (cl) => {
      const first = await cl.start('boot0', { netns: lan.ns[0].ns, apiHost: lan.ns[0].ip,
        extra: ['--cluster-port', '52414'] });
      const nodes = [first];
      for (let i = 1; i < 3; i++)
        nodes.push(await cl.start(`boot${i}`, { netns: lan.ns[i].ns, apiHost: lan.ns[i].ip,
          extra: ['--bootstrap-peers', `${lan.ns[0].ip}:52414`] }));
      // b and c only know a; they find each other through a's State (the
      // nodes it reports) and link directly
      await cl.converged(nodes, 30000);
      await cl.sameState(nodes, 20000, (s) => Object.keys(s.nodeIdentities).length === 3);
    });
  } finally {
    lan.destroy();
  }
});
