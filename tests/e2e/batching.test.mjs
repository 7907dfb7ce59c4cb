// Continuous batching as a property, through the OpenAI chat API of the
// real `exo serve`: a random workload of requests (arrival times, prompt
// lengths from a few tokens to several prefill chunks, cut in slices
// while other requests decode, greedy or seeded
// sampling, max_tokens), some cancelled with POST /v1/cancel/{id} and some
// disconnected part way, on two fixture models at once. Every request that
// runs to its end must return exactly what it returns alone (the same
// requests again, one at a time, on the same daemon: sequential
// generation, in which a long prompt finds its prefix computed by its first
// run: prefix reuse must not change a token either), with the same finish
// reason and token counts; a cancelled or disconnected one must have
// streamed a prefix of its text; afterwards the State holds no task and
// both runners are Ready.
//
// The workload comes from a seed: EXO_BATCH_SEEDS (comma-separated), else
// a fixed list, so a failure can be replayed. Each case prints its seed.
//
// Run: tests/integration/test_batching.sh, or
//      node --test-reporter=./tests/e2e/reporter.mjs tests/e2e/batching.test.mjs
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import fsp from 'node:fs/promises';
import * as D from './daemon.mjs';

const { STORIES_ID, QWEN_ID, sleep } = D;
const SEEDS = (process.env.EXO_BATCH_SEEDS || '1,2,3,4,5').split(',').map(Number);
const N_REQ = 14;
const WORDS = ('the cat dog sun park ball tree little big red happy ran jumped saw found girl boy mom home ' +
  'day night rain sky fish bird cake box hat toy car sang played laughed').split(' ');

let tmp, daemon, base;

before(async () => {
  // A prompt's chunks go in slices of 32 rows (their least) while other
  // requests decode, however fast the machine: the property below then
  // also holds that slices give the bits of whole chunks.
  process.env.EXO_PREFILL_SLICE_MS = '1';
  tmp = await D.tmpDir('exo-batch-');
  const { qwen } = await D.buildModels(path.join(tmp, 'models'));
  served[QWEN_ID] = Promise.resolve(qwen); // placed below, with stories
  daemon = await D.startDaemon({ dataDir: path.join(tmp, 'data'), modelsDir: path.join(tmp, 'models') });
  base = daemon.base;
  await D.placeInstance(base, STORIES_ID);
  await D.placeInstance(base, QWEN_ID);
});

after(() => D.finish(tmp, daemon));

// mulberry32: a small seeded generator, the same workload for the same seed
function rng(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function workload(seed) {
  const r = rng(seed);
  const pick = (a) => a[Math.floor(r() * a.length)];
  const reqs = [];
  for (let i = 0; i < N_REQ; i++) {
    // a fifth of the prompts span several 128-token prefill chunks
    const words = r() < 0.2 ? 150 + Math.floor(r() * 250) : 1 + Math.floor(r() * 30);
    const prompt = Array.from({ length: words }, () => pick(WORDS)).join(' ');
    const sampled = r() < 0.5;
    const roll = r();
    reqs.push({
      i, prompt,
      model: r() < 0.5 ? STORIES_ID : QWEN_ID,
      max: 8 + Math.floor(r() * 72),
      sampling: sampled ? { temperature: 0.5 + r(), seed: Math.floor(r() * 1e9) } : { temperature: 0 },
      at: Math.floor(r() * 200), // ms after the first
      end: roll < 0.15 ? 'cancel' : roll < 0.3 ? 'disconnect' : 'finish',
      after: 1 + Math.floor(r() * 3), // content chunks before a cancel or disconnect
    });
  }
  return reqs;
}

const body = (q) => ({
  model: q.model, messages: [{ role: 'user', content: q.prompt }], max_tokens: q.max, ...q.sampling,
  stream: true, stream_options: { include_usage: true },
});

// complete SSE data events of a stream so far
const events = (text) => D.parseSse(text.slice(0, text.lastIndexOf('\n\n') + 2))
  .filter((e) => e.data && e.data !== '[DONE]').map((e) => JSON.parse(e.data));
const textOf = (evs) => evs.map((e) => e.choices?.[0]?.delta?.content ?? '').join('');
const contentChunks = (text) => events(text).filter((e) => e.choices?.[0]?.delta?.content).length;

// One request as the workload says: {text, finish, usage} of what it
// streamed. A disconnect reads until its chunks are in and aborts the fetch
// there (its body is never awaited again).
async function run(q) {
  const ac = new AbortController();
  const r = await fetch(`${base}/v1/chat/completions`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body(q)), signal: ac.signal,
  });
  assert.equal(r.status, 200, `request ${q.i}: ${r.status}`);
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  let text = '', cancelled = false;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done)
        break;
      text += dec.decode(value, { stream: true });
      if (q.end === 'finish' || contentChunks(text) < q.after)
        continue;
      if (q.end === 'disconnect') {
        ac.abort();
        break;
      }
      if (!cancelled) {
        cancelled = true;
        const c = await D.postJson(base, `/v1/cancel/${events(text)[0].id}`, '');
        assert.ok([200, 404].includes(c.status), `cancel ${q.i}: ${c.status} ${c.text}`); // 404: it had ended
      }
    }
  } catch (e) {
    if (e.name !== 'AbortError')
      throw e;
  }
  const evs = events(text);
  const fin = evs.find((e) => e.choices?.[0]?.finish_reason);
  const usage = evs.find((e) => e.usage)?.usage;
  return { text: textOf(evs), finish: fin?.choices[0].finish_reason, usage };
}

async function tasksGone(maxMs) {
  const t0 = Date.now();
  while (Object.keys((await D.getJson(base, '/state')).tasks ?? {}).length) {
    if (Date.now() - t0 > maxMs) return false;
    await sleep(20);
  }
  return true;
}

for (const seed of SEEDS) {
  test(`seed ${seed}: ${N_REQ} requests side by side return what each returns alone`, { timeout: 240000 },
    async () => {
      const reqs = workload(seed);
      const t0 = Date.now();
      const together = await Promise.all(reqs.map(async (q) => {
        await sleep(q.at - (Date.now() - t0));
        return run(q);
      }));
      assert.ok(await tasksGone(10000), 'tasks left in the State after the workload');
      // a task leaves the State when its request ends (a disconnect ends it
      // at once), the runner reports Ready when it has wound the request
      // down: a moment later under load
      for (const id of [STORIES_ID, QWEN_ID]) {
        let st = [];
        for (const t1 = Date.now(); Date.now() - t1 < 10000; await sleep(20))
          if ((st = Object.values(await D.runnersOf(base, id))).join() === 'RunnerReady')
            break;
        assert.deepEqual(st, ['RunnerReady'], `${id} runner`);
      }
      // sequential generation: the same requests, one at a time, to their end
      for (const q of reqs) {
        const alone = await run({ ...q, end: 'finish' });
        const got = together[q.i];
        const what = `seed ${seed}, request ${q.i} (${q.model}, ${q.prompt.split(' ').length} words, ` +
          `max ${q.max}, ${JSON.stringify(q.sampling)}, ${q.end})`;
        if (q.end === 'finish') {
          assert.equal(got.text, alone.text, `${what}: text`);
          assert.equal(got.finish, alone.finish, `${what}: finish reason`);
          // the same counts; cached_tokens may differ (the second time, a
          // long prompt finds its prefix computed: the text must not care)
          for (const k of ['prompt_tokens', 'completion_tokens', 'total_tokens'])
            assert.equal(got.usage?.[k], alone.usage?.[k], `${what}: usage.${k}`);
        } else {
          // a request ended inside a character (a byte-level token of its
          // first bytes) flushes those bytes as U+FFFD (detok_stream.c),
          // where alone the character goes on
          const streamed = got.text.replace(/\uFFFD+$/u, '');
          assert.ok(alone.text.startsWith(streamed), `${what}: streamed "${got.text}", alone "${alone.text}"`);
        }
      }
    });
}

// A fixture model built and placed once, by the first test that asks: its dir.
const served = {};
function serve(id, build) {
  served[id] ??= build(path.join(tmp, 'models')).then(async (dir) => {
    await D.placeInstance(base, id);
    return dir;
  });
  return served[id];
}

// A greedy chat completion of `model`, its JSON (the bench route ignores
// the end-of-sequence token).
async function chat(model, content, max_tokens, route = '/v1/chat/completions') {
  const r = await D.postJson(base, route, { model, messages: [{ role: 'user', content }], max_tokens, temperature: 0 });
  assert.equal(r.status, 200, r.text);
  return r.json;
}

// Prefix reuse on a model with a recurrent state (Gated DeltaNet): the
// runner keeps the state where the first prompt's last chunk began, so a
// second prompt sharing that much takes it (cached_tokens, the whole
// 128-token chunk) and answers what `exo run` answers it from scratch.
test('a linear-attention model reuses a shared prompt prefix', { timeout: 120000 }, async () => {
  const dir = await serve(D.LINEAR_ID, D.buildLinearModel);
  const words = Array.from({ length: 160 }, (_, i) => WORDS[(i * 7) % WORDS.length]).join(' ');
  const ask = (prompt) => chat(D.LINEAR_ID, prompt, 8);
  const a = await ask(`${words} first`);
  const b = await ask(`${words} second`);
  assert.equal(a.usage.prompt_tokens_details.cached_tokens, 0);
  const cached = b.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 128 && cached % 128 === 0 && cached < b.usage.prompt_tokens,
    `reused ${cached} of ${b.usage.prompt_tokens} prompt tokens`);
  const want = await D.exoRun(dir, `${words} second`, { maxTokens: 8 });
  assert.equal(b.choices[0].message.content, want.text);
});

// A dense model on the CPU takes a computed prefix up to any position
// (model.h exo_model_exact_rows), not in whole 128-token chunks only: a
// prompt that goes on from another's words takes all of them but the chat
// template's ending (less what leaves the rest of its chunk a call of 17
// rows at least), and answers as `exo run` from scratch. The first
// prompt's length is picked so its last chunk is no short one (those are
// not kept: computed from 0 they take another kernel).
test('a dense model takes a shared prefix up to any position', { timeout: 120000 }, async () => {
  const dir = await served[QWEN_ID];
  let words, first;
  for (let n = 150; ; n += 7) {
    words = Array.from({ length: n }, (_, i) => WORDS[(i * 13 + 5) % WORDS.length]).join(' ');
    first = await chat(QWEN_ID, words, 4);
    const tail = first.usage.prompt_tokens % 128;
    if (tail >= 60 && tail <= 100) break;
    assert.ok(n < 400, 'a prompt length whose last chunk is long enough');
  }
  const again = await chat(QWEN_ID, `${words} cat sun`, 4);
  const cached = again.usage.prompt_tokens_details.cached_tokens;
  const n = first.usage.prompt_tokens;
  assert.ok(cached > n - 40 && cached < n, `reused ${cached} of ${again.usage.prompt_tokens} (the first: ${n})`);
  const want = await D.exoRun(dir, `${words} cat sun`, { maxTokens: 4 });
  assert.equal(again.choices[0].message.content, want.text);
});

// Requests sent together with one long prompt prefix (a system prompt):
// prompts prefill in order of admission, and each takes the prefix the one
// before it computed (its whole pages shared) just before its own first
// chunk, so the prefix is computed once; the answers are those of each
// request alone.
test('requests sent together compute a shared prefix once', { timeout: 120000 }, async () => {
  // qwen3's caches are all pages; gemma3's sliding layers keep rings, which
  // go over whole with the pages
  for (const [id, build] of [[QWEN_ID, null], [D.SLIDING_ID, D.buildSlidingModel]]) {
    await serve(id, build);
    const words = Array.from({ length: 400 }, (_, i) => WORDS[(i * 11) % WORDS.length]).join(' ');
    const ask = (tail) => chat(id, `${words} ${tail}`, 6);
    const tails = ['one', 'two', 'three', 'four'];
    const together = await Promise.all(tails.map(ask));
    const cached = together.map((j) => j.usage.prompt_tokens_details.cached_tokens);
    const prompt = together[0].usage.prompt_tokens;
    assert.ok(prompt >= 384, `${id}: a prefix of ${prompt} tokens`);
    // all but the first to prefill take every whole 128-token chunk of the
    // shared part (the tails differ only in the prompt's last tokens)
    const whole = Math.floor((prompt - 16) / 128) * 128;
    const reused = cached.filter((c) => c >= whole).length;
    assert.ok(reused >= tails.length - 1, `${id}: cached tokens ${cached.join(', ')} of ${prompt}`);
    for (let i = 0; i < tails.length; i++) {
      const alone = await ask(tails[i]);
      assert.equal(together[i].choices[0].message.content, alone.choices[0].message.content, `${id}: request ${i}`);
    }
  }
});

// The prefix cache keeps prompts beyond the one each of the 8 batch slots
// keeps: after 10 different long prompts, one at a time, the first two
// (whose slots went on to others) come back with a new ending, take their
// prefixes from the cache, and answer as `exo run` from scratch. On qwen3
// (caches all pages), gemma3 (sliding layers keep rings) and qwen3.5
// (Gated DeltaNet layers keep a recurrent state): an entry keeps copies of
// rings and states beside the pages (a state at the entry's length, where
// its last prompt chunk began: the prompts are some 1090 tokens, so that
// chunk begins at 1024, before the words that change).
test('the prefix cache keeps more prompts than there are slots, on every kind of cache', { timeout: 240000 },
  async () => {
    const models = [[QWEN_ID, null], [D.SLIDING_ID, D.buildSlidingModel], [D.LINEAR_ID, D.buildLinearModel]];
    for (const [id, build] of models) {
      const dir = await serve(id, build);
      const prompt = (k) => Array.from({ length: 330 }, (_, i) => WORDS[(i * 3 + k * 7 + 2) % WORDS.length]).join(' ');
      for (let k = 0; k < 10; k++)
        await chat(id, `${prompt(k)} first`, 4);
      for (let k = 0; k < 2; k++) {
        const again = await chat(id, `${prompt(k)} again`, 4);
        const cached = again.usage.prompt_tokens_details.cached_tokens;
        // on the linear-attention model whole chunks (its state is kept
        // where its last chunk began)
        assert.ok(cached >= 1024 && (id !== D.LINEAR_ID || cached % 128 === 0),
          `${id}, prompt ${k}: reused ${cached} of ${again.usage.prompt_tokens}`);
        const want = await D.exoRun(dir, `${prompt(k)} again`, { maxTokens: 4 });
        assert.equal(again.choices[0].message.content, want.text, `${id}, prompt ${k}`);
      }
    }
  });

// A prompt goes into the prefix cache when its prefill ends, not when its
// request does: a sliding ring holds the window a prompt's end reads only
// until the answer has moved past its spare slots (552-slot rings here, a
// window of 8), so an entry kept after a 700-token answer would hold
// nothing of it. The long answer through the bench route (which ignores
// the end-of-sequence token), then ten other prompts, then the first with
// a new ending: its prefix comes from the cache.
test('a prompt stays in the prefix cache however long its answer', { timeout: 180000 }, async () => {
  const dir = await serve(D.SLIDING_ID, D.buildSlidingModel);
  const prompt = (k) => Array.from({ length: 330 }, (_, i) => WORDS[(i * 5 + k * 7 + 4) % WORDS.length]).join(' ');
  const first = await chat(D.SLIDING_ID, `${prompt(0)} first`, 700, '/bench/chat/completions');
  assert.equal(first.usage.completion_tokens, 700);
  for (let k = 1; k <= 10; k++)
    await chat(D.SLIDING_ID, `${prompt(k)} first`, 4);
  const again = await chat(D.SLIDING_ID, `${prompt(0)} again`, 4);
  const cached = again.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= 1024, `reused ${cached} of ${again.usage.prompt_tokens}`);
  const want = await D.exoRun(dir, `${prompt(0)} again`, { maxTokens: 4 });
  assert.equal(again.choices[0].message.content, want.text);
});

// `exo serve --no-batch`: the runner takes one request at a time, so of two
// sent together the one served second begins after the other's end. Which
// one goes first is not fixed (the second is sent 5 ms later, but the two
// race through the API and the master), so the check is on whichever began
// first. Both run 240 tokens through the bench route, which ignores the
// end-of-sequence token, so both spans are long enough to tell apart.
test('--no-batch: requests run one after the other', { timeout: 60000 }, async () => {
  const d = await D.startDaemon({ dataDir: path.join(tmp, 'data-nb'), modelsDir: path.join(tmp, 'models'),
    extra: ['--no-batch'] });
  try {
    await D.placeInstance(d.base, STORIES_ID);
    const stamps = async (prompt) => {
      const s = await D.openStream(d.base, '/bench/chat/completions', {
        model: STORIES_ID, messages: [{ role: 'user', content: prompt }], max_tokens: 240, temperature: 0,
        stream: true });
      await s.rest();
      const content = s.pieces.filter((p) => /"content":"[^"]/.test(p.text));
      return { first: s.t0 + content[0].t, last: s.t0 + content[content.length - 1].t };
    };
    const both = await Promise.all([stamps('Once upon a time'), sleep(5).then(() => stamps('The dog'))]);
    const [a, b] = both.sort((x, y) => x.first - y.first);
    // These are the client's arrival times, which jitter by a few ms on a
    // loaded machine (the first's last piece can arrive after the second's
    // first was sent), so the check is that the second began once the first
    // was nearly done: batched, it would begin a step or two after it
    // arrived, some 5% into the first's 240 tokens.
    const span = a.last - a.first, began = b.first - a.first;
    assert.ok(began >= 0.8 * span, `the second began at ${began} ms, the first ended at ${span} ms`);
  } finally {
    await d.stop('SIGKILL');
  }
});

// `exo serve --kv-budget`: a budget that holds no context fails every load
// (the instance is deleted after 5 tries), saying why; a size that is not
// one stops the daemon at its arguments.
test('--kv-budget: too small fails the load, saying so; a bad size is refused', { timeout: 90000 }, async () => {
  const bad = D.spawnDaemon({ dataDir: path.join(tmp, 'data-kvbad'), modelsDir: path.join(tmp, 'models'),
    extra: ['--kv-budget', '4X'] });
  const { code } = await bad.exited;
  assert.equal(code, 2);
  assert.match(bad.stderr, /--kv-budget: '4X' is not a size/);
  const d = await D.startDaemon({ dataDir: path.join(tmp, 'data-kv'), modelsDir: path.join(tmp, 'models'),
    extra: ['--kv-budget', '1K'] });
  try {
    const r = await D.postJson(d.base, '/place_instance', { model_id: STORIES_ID });
    assert.equal(r.status, 200, r.text);
    let gone = [];
    for (const t0 = Date.now(); !gone.length && Date.now() - t0 < 40000; await sleep(50))
      gone = Object.values((await D.getJson(d.base, '/state')).deletedInstances || {});
    assert.equal(gone.length, 1, 'the instance is deleted');
    assert.match(gone[0].reason, /the KV budget of 0\.0 MB holds no context of 8192 tokens \(\d+\.\d MB of caches\)/);
  } finally {
    await d.stop('SIGKILL');
  }
});

// Admission by what a request holds, not its whole max_tokens: with a
// context of 1024 and a KV budget of about 1.6 contexts (stories260K keeps
// 1280 bytes a position), four 900-token answers start side by side,
// their sequences grow as they decode, and when the budget runs out the
// youngest gives its caches back and computes them again once memory
// frees (its prompt in chunks, then each token it had decoded as the
// decode row it was). Every answer is what it is alone, and the runner
// says it preempted.
test('over-committed admission: requests preempted when the caches run short answer as they do alone',
  { timeout: 180000 }, async () => {
    const dir = path.join(tmp, 'data-preempt');
    const d = await D.startDaemon({ dataDir: dir, modelsDir: path.join(tmp, 'models'),
      extra: ['-v', '--ctx', '1024', '--kv-budget', '2M'] });
    try {
      await D.placeInstance(d.base, STORIES_ID);
      const reqs = [0, 1, 2, 3].map((k) => ({
        model: STORIES_ID, messages: [{ role: 'user', content: `${WORDS[k]} ${WORDS[k + 5]} ${WORDS[k + 9]}` }],
        max_tokens: 900, ...(k % 2 ? { temperature: 0.9, seed: 11 + k, repetition_penalty: 1.2 } : { temperature: 0 }),
      }));
      const together = await Promise.all(reqs.map((q) => D.postJson(d.base, '/bench/chat/completions', q)));
      const logDir = path.join(dir, 'cache/exo_log/runner_log');
      let log = '';
      for (const f of await fsp.readdir(logDir))
        log += await fsp.readFile(path.join(logDir, f), 'utf8');
      const preempted = (log.match(/preempted after \d+ decoded tokens/g) || []).length;
      assert.ok(preempted >= 1, `no request was preempted:\n${log.slice(-3000)}`);
      for (const [k, q] of reqs.entries()) {
        const alone = await D.postJson(d.base, '/bench/chat/completions', q);
        assert.equal(together[k].status, 200, together[k].text);
        assert.equal(alone.status, 200, alone.text);
        assert.equal(together[k].json.usage.completion_tokens, 900);
        assert.equal(together[k].json.choices[0].message.content, alone.json.choices[0].message.content,
          `request ${k} (${preempted} preemptions)`);
      }
    } finally {
      await d.stop('SIGKILL');
    }
  });
