// The bounded event log in a real cluster: with a snapshot every 20 events
// (EXO_EVENT_LOG_CHECKPOINT_EVERY), a master's log is compacted while it
// serves chats; GET /events pages from the oldest kept event and answers
// 410 (with where to start) for older ones; a node that joins later gets
// the State as a Snapshot message, not events, and then follows the
// session like any node; no file of either node's log holds a prompt.
//
// Run: tests/integration/test_cluster.sh, or
//      node --test-reporter=./tests/e2e/reporter.mjs tests/cluster/eventlog.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import os from 'node:os';
import path from 'node:path';
import fsp from 'node:fs/promises';
import OpenAI from 'openai';
import * as C from './cluster.mjs';

const { MODEL_ID, until } = C;
const T = { timeout: 90000 * C.SLOW };
let tmp, models;

process.env.EXO_EVENT_LOG_CHECKPOINT_EVERY = '20'; // the daemons inherit it

before(async () => {
  tmp = await fsp.mkdtemp(path.join(os.tmpdir(), 'exo-evlog-'));
  models = path.join(tmp, 'models');
  await C.buildModel(models);
});

after(async () => {
  if (!process.env.EXO_CLUSTER_KEEP) await fsp.rm(tmp, { recursive: true, force: true });
});

async function chat(base, content) {
  const client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'x', maxRetries: 0 });
  const r = await client.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content }],
    max_tokens: 4, temperature: 0 });
  return r.choices[0].message.content;
}

async function logFiles(node) {
  const dir = path.join(node.dataDir, 'event_log/master');
  const out = [];
  for (const f of await fsp.readdir(dir)) out.push([f, await fsp.readFile(path.join(dir, f))]);
  return out;
}

test('loopback: the log is compacted behind snapshots, /events pages past it, a late joiner gets a Snapshot', T,
  async () => {
    await C.withCluster({}, async (cl) => {
      const a = await cl.start('a', { models });
      await cl.converged([a]);
      await C.placeAndWait(a, [a]);
      const prompts = [];
      for (let i = 0; i < 12; i++) {
        prompts.push(`secret prompt number ${i}`);
        await chat(a.base, prompts[i]);
      }
      // once the snapshot in flight is written, the log keeps about two
      // intervals (plus what arrived while it was written). A slow disk
      // (fsync behind other I/O) can hold one snapshot while several
      // intervals of events pass; the next one then starts when it is done,
      // and the bound holds again after one more interval: more chats make it.
      let more = 0, lastChat = Date.now();
      const pg = await until('a compacted log of about two intervals', async () => {
        const p = await a.get('/events/page');
        if (p.first > 0 && p.count - p.first <= 2 * 20 + 10) return p;
        if (Date.now() - lastChat > 1000) {
          prompts.push(`secret prompt number ${prompts.length}`);
          await chat(a.base, prompts.at(-1));
          lastChat = Date.now();
          more++;
        }
        return false;
      });
      if (more) console.log(`# a slow snapshot: ${more} more chats before the log was back within bounds`);
      assert.equal(pg.since, pg.first, 'by default pages start at the oldest kept event');
      const gone = await fetch(`${a.base}/events?since=0`);
      assert.equal(gone.status, 410);
      const body = await gone.json();
      // the node keeps logging (node info, statuses), so another compaction
      // may have moved the oldest kept event on since pg was read
      assert.ok(body.error.first >= pg.first, JSON.stringify(body));
      assert.match(body.error.message, /compacted/);
      let page;
      for (let i = 0; i < 5 && !page; i++) { // from where the 410 says, racing compaction
        const first = i ? (await a.get('/events/page')).first : body.error.first;
        const r = await fetch(`${a.base}/events?since=${first}&limit=5`);
        if (r.status === 200) page = await r.json();
        else assert.equal(r.status, 410);
      }
      assert.equal(page?.length, 5);

      // a node that joins now needs events 0.. that exist only in the snapshot
      const b = await cl.start('b', { models });
      await cl.converged([a, b], 30000);
      await cl.sameState([a, b], 30000);
      assert.match(b.stderr, /adopted the master's State/);
      // and it follows the session from there (a chat through b, served by a)
      assert.equal(typeof await chat(b.base, 'one more secret prompt'), 'string');
      prompts.push('one more secret prompt');
      await cl.sameState([a, b], 30000, (st) => Object.keys(st.tasks).length === 0);
      const pb = await b.get('/events/page');
      assert.ok(pb.first > 0 && pb.count >= pg.count, JSON.stringify({ ...pb, events: undefined }));

      for (const n of [a, b])
        for (const [f, bytes] of await logFiles(n))
          for (const p of prompts) assert.ok(!bytes.includes(p), `${n.name}: ${f} holds ${JSON.stringify(p)}`);
      const files = (await logFiles(a)).map(([f]) => f);
      assert.ok(files.includes('events.bin.snap'), files.join(' '));
    });
  });
