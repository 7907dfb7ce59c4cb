// End-to-end suite: the real `exo serve` on loopback with two fixture models
// (stories260K, converted from llama2.c, and the tiny random qwen3 q4g64
// parity fixture with a byte-level BPE tokenizer and Qwen3's real chat
// template, built in a temp dir by daemon.mjs), driven by the official npm
// clients (openai, @anthropic-ai/sdk, ollama) and by raw HTTP for framing,
// errors, cancellation and crashes.
//
// Ground truth: `exo run MODEL --chat PROMPT --temperature 0` (same thread
// count). Every API, streaming or not, must return exactly its text, finish
// reason and token counts. Covered: listing endpoints; greedy parity for
// both models (also with a system prompt, non-ASCII prompts, EOS endings,
// thinking disabled, multi-turn conversations in each API's message shapes);
// seeded sampling; logprobs; max_tokens; stop sequences; bench; SSE / NDJSON
// framing (keep-alive, prefill progress, Claude and Responses event
// sequences, incomplete items); 4xx errors in each family's format (also what
// the real APIs refuse: ranges, empty messages / input, roles, block and item
// types); GET /v1/models/{id}; Ollama at /api/* too; /v1/cancel and client
// disconnects (also while queued, and at most one token late, checked with
// the runner stopped by SIGSTOP); FIFO queueing without cross-talk;
// keep-alives on idle streams; runner SIGKILL mid-request (error to every
// client, runner recreated); instance deletion; the pid-file lock; SIGTERM.
//
// Run: tests/integration/test_e2e_api.sh, or
//      node --test-reporter=./tests/e2e/reporter.mjs tests/e2e/api.test.mjs
// (EXO_BIN selects the binary, default build/exo; EXO_E2E_KEEP=1 keeps the
// temp dir; EXO_E2E_LOG_DIR receives the daemon's and runners' logs).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import path from 'node:path';
import fsp from 'node:fs/promises';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { Ollama } from 'ollama';
import * as D from './daemon.mjs';

const { STORIES_ID, QWEN_ID, sleep } = D;
const T_TEST = { timeout: 60000 };

let tmp, models, daemon, base, openai, anthropic, ollama;
const refs = new Map();

// ---- references --------------------------------------------------------------------

const P = {
  stories: 'Once upon a time',
  storiesStop: 'Tell me a story about a dog',
  qwen: 'Hello, who are you?',
  qwenSys: 'Name three colors.',
  qwenLp: 'Yes or no', // its first 12 greedy tokens are ASCII bytes or merges
  qwenEos: 'hello world', // the random model emits <|im_end|> after 6 tokens
  sys: 'You are a pirate. Answer briefly.',
  unicode: 'Grüße, 世界! 👋 naïve café — “quotes” \\ "back" \t tab',
};
const N_PARITY = 32;
const CONC_STORIES = ['The cat sat', 'Lily had a red ball', 'Tom went to the park', 'A big dog barked',
  'The sun was hot', 'Sam found a box', 'The bird sang', 'Mom baked a cake'];
const CONC_QWEN = ['alpha', 'What is 2+2?', 'Tell me a joke', 'zzz', 'Why is the sky blue?',
  'List some fruits', 'hello world', 'Translate: chat'];
const N_CONC = 20;
const CONC_FIFO = ['One day a frog', 'The old tree', 'Ben and Anna played', 'A little fish swam',
  'The toy car was fast', 'Sue liked her hat'];
const N_FIFO = 120;
const SAMPLED = { temperature: 0.8, seed: 42 };

const dirOf = (model) => (model === STORIES_ID ? models.stories : models.qwen);
// opts: {system, temperature, seed, enableThinking, logprobs} as exoRun takes them
const key = (model, prompt, max, opts = {}) =>
  JSON.stringify([model, prompt, max, Object.entries(opts).filter(([, v]) => v !== undefined).sort()]);
function ref(model, prompt, max, opts = {}) {
  const r = refs.get(key(model, prompt, max, opts));
  assert.ok(r, `no reference for ${key(model, prompt, max, opts)}`);
  return r;
}

before(async () => {
  tmp = await D.tmpDir();
  models = await D.buildModels(path.join(tmp, 'models'));
  const want = [
    [STORIES_ID, P.stories, N_PARITY], [STORIES_ID, P.stories, 5], [STORIES_ID, P.stories, 8],
    [STORIES_ID, P.stories, 64], [STORIES_ID, P.storiesStop, 64],
    [STORIES_ID, P.unicode, 24], [QWEN_ID, P.unicode, 24],
    [QWEN_ID, P.qwen, N_PARITY], [QWEN_ID, P.qwen, 5], [QWEN_ID, P.qwenSys, 24, { system: P.sys }],
    [QWEN_ID, P.qwen, 24, { enableThinking: false }],
    [STORIES_ID, P.stories, 24, SAMPLED], [QWEN_ID, P.qwen, 24, SAMPLED],
    [STORIES_ID, P.stories, 12, { logprobs: 3 }], [QWEN_ID, P.qwen, 12, { logprobs: 3 }],
    [QWEN_ID, P.qwenLp, 12, { logprobs: 3 }], [QWEN_ID, P.qwenEos, 24], [QWEN_ID, P.qwenEos, 24, { ignoreEos: true }],
    ...CONC_STORIES.map((p) => [STORIES_ID, p, N_CONC]),
    ...CONC_QWEN.map((p) => [QWEN_ID, p, N_CONC]),
    ...CONC_FIFO.map((p) => [STORIES_ID, p, N_FIFO]),
  ];
  const got = await D.pool(2, want.map(([m, p, n, o = {}]) => () =>
    D.exoRun(dirOf(m), p, { maxTokens: n, ...o })));
  want.forEach(([m, p, n, o = {}], i) => refs.set(key(m, p, n, o), got[i]));

  // one request at a time per runner (--no-batch): the queueing tests below
  // (FIFO order, cancels of queued requests, a runner killed with requests
  // queued) are about that path; batching.test.mjs drives the batched one
  daemon = await D.startDaemon({ dataDir: path.join(tmp, 'data'), modelsDir: path.join(tmp, 'models'),
    extra: ['--no-batch'] });
  base = daemon.base;
  await D.placeInstance(base, STORIES_ID);
  await D.placeInstance(base, QWEN_ID);
  openai = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'e2e', maxRetries: 0, timeout: 30000 });
  anthropic = new Anthropic({ baseURL: base, apiKey: 'e2e', maxRetries: 0, timeout: 30000 });
  ollama = new Ollama({ host: `${base}/ollama` });
});

after(() => D.finish(tmp, daemon));

// ---- one call per API, normalised -----------------------------------------------------
// Each returns {text, finish: 'stop'|'length'|..., promptTokens, genTokens, raw}.

const CLAUDE_FINISH = { end_turn: 'stop', stop_sequence: 'stop', max_tokens: 'length' };

async function viaOpenAI(model, prompt, { max, system, stream, stop, temperature = 0, seed, thinking } = {}) {
  const messages = [];
  if (system !== undefined) messages.push({ role: 'system', content: system });
  messages.push({ role: 'user', content: prompt });
  const params = { model, messages, max_tokens: max, temperature };
  if (stop) params.stop = stop;
  if (seed !== undefined) params.seed = seed;
  if (thinking !== undefined) params.enable_thinking = thinking; // exo extension
  if (!stream) {
    const r = await openai.chat.completions.create(params);
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices.length, 1);
    assert.equal(r.choices[0].message.role, 'assistant');
    return { text: r.choices[0].message.content, finish: r.choices[0].finish_reason,
      promptTokens: r.usage.prompt_tokens, genTokens: r.usage.completion_tokens, raw: r };
  }
  const s = await openai.chat.completions.create({ ...params, stream: true, stream_options: { include_usage: true } });
  let text = '', finish = null, usage = null, ids = new Set(), nFinish = 0;
  for await (const ch of s) {
    ids.add(ch.id);
    const c = ch.choices?.[0];
    if (c?.delta?.content) text += c.delta.content;
    if (c?.finish_reason) { finish = c.finish_reason; nFinish++; }
    if (ch.usage) usage = ch.usage;
  }
  assert.equal(ids.size, 1, 'every chunk carries the same id');
  assert.equal(nFinish, 1, 'exactly one chunk has a finish_reason');
  assert.ok(usage, 'stream_options.include_usage: a chunk carries usage');
  return { text, finish, promptTokens: usage.prompt_tokens, genTokens: usage.completion_tokens, raw: usage };
}

async function viaClaude(model, prompt, { max, system, stream, stop, temperature = 0, thinking } = {}) {
  const params = { model, max_tokens: max, temperature, messages: [{ role: 'user', content: prompt }] };
  if (system !== undefined) params.system = system;
  if (stop) params.stop_sequences = stop;
  if (thinking !== undefined) params.thinking = thinking ? { type: 'enabled', budget_tokens: 1024 } : { type: 'disabled' };
  if (!stream) {
    const r = await anthropic.messages.create(params);
    assert.equal(r.type, 'message');
    assert.equal(r.role, 'assistant');
    assert.match(r.id, /^msg_/);
    const text = r.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
    return { text, finish: CLAUDE_FINISH[r.stop_reason] ?? r.stop_reason, stopReason: r.stop_reason,
      stopSequence: r.stop_sequence, promptTokens: r.usage.input_tokens, genTokens: r.usage.output_tokens, raw: r };
  }
  const s = anthropic.messages.stream(params);
  let text = '';
  for await (const ev of s) {
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
  }
  const m = await s.finalMessage();
  assert.equal(m.content.filter((b) => b.type === 'text').map((b) => b.text).join(''), text,
    'the SDK\'s accumulated message equals the streamed deltas');
  return { text, finish: CLAUDE_FINISH[m.stop_reason] ?? m.stop_reason, stopReason: m.stop_reason,
    stopSequence: m.stop_sequence, promptTokens: m.usage.input_tokens, genTokens: m.usage.output_tokens, raw: m };
}

function responsesFinish(r) {
  if (r.status === 'completed') return 'stop';
  if (r.status === 'incomplete' && r.incomplete_details?.reason === 'max_output_tokens') return 'length';
  return r.status;
}

async function viaResponses(model, prompt, { max, system, stream, stop, temperature = 0, seed, thinking } = {}) {
  const params = { model, input: prompt, max_output_tokens: max, temperature };
  if (system !== undefined) params.instructions = system;
  if (stop) params.stop = stop; // exo extension
  if (seed !== undefined) params.seed = seed; // exo extension
  if (thinking !== undefined) params.reasoning = { effort: thinking ? 'medium' : 'none' };
  if (!stream) {
    const r = await openai.responses.create(params);
    assert.equal(r.object, 'response');
    assert.match(r.id, /^resp_/);
    return { text: r.output_text, finish: responsesFinish(r), promptTokens: r.usage.input_tokens,
      genTokens: r.usage.output_tokens, raw: r };
  }
  const s = await openai.responses.create({ ...params, stream: true });
  let text = '', final = null, lastSeq = -1;
  const types = [];
  for await (const ev of s) {
    types.push(ev.type);
    assert.equal(ev.sequence_number, lastSeq + 1, `sequence_number after ${lastSeq}`);
    lastSeq = ev.sequence_number;
    if (ev.type === 'response.output_text.delta') text += ev.delta;
    if (ev.type === 'response.completed' || ev.type === 'response.incomplete') final = ev.response;
  }
  assert.ok(final, `a terminal response event (got ${types.join(',')})`);
  assert.equal(final.output_text, text);
  return { text, finish: responsesFinish(final), promptTokens: final.usage.input_tokens,
    genTokens: final.usage.output_tokens, raw: final };
}

async function viaOllamaChat(model, prompt, { max, system, stream, stop, temperature = 0, seed, thinking } = {}) {
  const messages = [];
  if (system !== undefined) messages.push({ role: 'system', content: system });
  messages.push({ role: 'user', content: prompt });
  const options = { temperature, num_predict: max };
  if (stop) options.stop = stop;
  if (seed !== undefined) options.seed = seed;
  const think = thinking;
  if (!stream) {
    const r = await ollama.chat({ model, messages, stream: false, options, think });
    assert.equal(r.done, true);
    return { text: r.message.content, finish: r.done_reason, promptTokens: r.prompt_eval_count,
      genTokens: r.eval_count, raw: r };
  }
  let text = '', last = null, n = 0;
  for await (const part of await ollama.chat({ model, messages, stream: true, options, think })) {
    assert.equal(last?.done ?? false, false, 'no line after done');
    text += part.message.content;
    last = part;
    n++;
  }
  assert.equal(last.done, true);
  return { text, finish: last.done_reason, promptTokens: last.prompt_eval_count, genTokens: last.eval_count, raw: last };
}

async function viaOllamaGenerate(model, prompt, { max, system, stream, stop, temperature = 0, seed, thinking } = {}) {
  const req = { model, prompt, options: { temperature, num_predict: max } };
  if (system !== undefined) req.system = system;
  if (stop) req.options.stop = stop;
  if (seed !== undefined) req.options.seed = seed;
  if (thinking !== undefined) req.think = thinking;
  if (!stream) {
    const r = await ollama.generate({ ...req, stream: false });
    assert.equal(r.done, true);
    return { text: r.response, finish: r.done_reason, promptTokens: r.prompt_eval_count, genTokens: r.eval_count, raw: r };
  }
  let text = '', last = null;
  for await (const part of await ollama.generate({ ...req, stream: true })) {
    text += part.response;
    last = part;
  }
  assert.equal(last.done, true);
  return { text, finish: last.done_reason, promptTokens: last.prompt_eval_count, genTokens: last.eval_count, raw: last };
}

const APIS = {
  'openai chat': viaOpenAI,
  'claude messages': viaClaude,
  'openai responses': viaResponses,
  'ollama chat': viaOllamaChat,
  'ollama generate': viaOllamaGenerate,
};
const FINISH_OF_RUN = { stop: 'stop', length: 'length' };

// runOpts: exoRun's options for the reference; apiOpts: the wrappers' options
async function checkParity(t, model, prompt, max, runOpts = {}, apiOpts = {}, apis = Object.keys(APIS)) {
  const r = ref(model, prompt, max, runOpts);
  for (const name of apis) {
    const fn = APIS[name];
    for (const stream of [false, true]) {
      await t.test(`${name} ${stream ? 'stream' : 'non-stream'}`, async () => {
        const got = await fn(model, prompt, { max, system: runOpts.system, stream, ...apiOpts });
        assert.equal(got.text, r.text, 'greedy text equals exo run');
        assert.equal(got.finish, FINISH_OF_RUN[r.finish], 'finish reason');
        assert.equal(got.genTokens, r.genTokens, 'completion token count');
        // (streamed Claude: message_start says input_tokens 0, as exo does; the SDK
        // takes the count from message_delta)
        assert.equal(got.promptTokens, r.promptTokens, 'prompt token count');
      });
    }
  }
}

// ---- node and model listing ----------------------------------------------------------

test('node, models and Ollama listing endpoints', T_TEST, async () => {
  const nodeId = await D.getJson(base, '/node_id');
  assert.equal(typeof nodeId, 'string');
  const m = await openai.models.list();
  const ids = m.data.map((x) => x.id);
  assert.ok(ids.includes(STORIES_ID) && ids.includes(QWEN_ID), `models: ${ids}`);
  const tags = await ollama.list();
  const names = tags.models.map((x) => x.name);
  assert.ok(names.includes(STORIES_ID) && names.includes(QWEN_ID), `tags: ${names}`);
  const ps = await ollama.ps();
  assert.deepEqual(ps.models.map((x) => x.name).sort(), [QWEN_ID, STORIES_ID].sort());
  const show = await ollama.show({ model: QWEN_ID });
  assert.equal(show.details.family, 'qwen3');
  const v = await fetch(`${base}/ollama/api/version`).then((r) => r.json());
  assert.equal(typeof v.version, 'string');
  const st = await D.getJson(base, '/state');
  const instId = Object.keys(st.instances)[0];
  const inst = await D.getJson(base, `/instance/${instId}`);
  assert.ok(Object.values(inst)[0].instanceId === instId);
  const miss = await fetch(`${base}/instance/00000000-0000-4000-8000-000000000000`);
  assert.equal(miss.status, 404);
  const events = await D.getJson(base, '/events');
  assert.ok(Array.isArray(events) && events.length > 0);
  assert.ok(events.some((e) => 'InstanceCreated' in e), 'the event log holds InstanceCreated');
  const runners = await D.getJson(base, '/state/runners');
  assert.equal(Object.keys(runners).length, 2);
  assert.equal((await fetch(`${base}/state/no/such/path`)).status, 404);
  // Ollama's own error format on its state endpoints
  for (const [body, status] of [[{ model: 'nobody/nothing' }, 404], [{}, 400]]) {
    const r = await D.postJson(base, '/ollama/api/show', body);
    assert.equal(r.status, status, r.text);
    assert.equal(typeof r.json.error, 'string');
  }
  assert.equal((await fetch(`${base}/ollama/api/version`, { method: 'HEAD' })).status, 200);
  // placement errors: 4xx with the OpenAI-style error object, nothing created
  for (const [body, status] of [['{"model_id": ', 400], [{}, 400], [{ model_id: 'nobody/nothing' }, 404],
    [{ model_id: STORIES_ID, sharding: 'Diagonal' }, 400], [{ model_id: STORIES_ID, min_nodes: 0 }, 400]]) {
    const r = await D.postJson(base, '/place_instance', body);
    assert.equal(r.status, status, `${JSON.stringify(body)}: ${r.text}`);
    assert.equal(typeof r.json?.error?.message, 'string', r.text);
  }
  assert.equal(Object.keys((await D.getJson(base, '/state')).instances).length, 2);
});

test('placement preview, POST /instance, GET/DELETE /instance/{id}, /events?since', T_TEST, async () => {
  const nodeId = await D.getJson(base, '/node_id');
  const q = (o) => new URLSearchParams(o).toString();
  const pl = await fetch(`${base}/instance/placement?${q({ model_id: STORIES_ID })}`);
  assert.equal(pl.status, 200);
  const inst = await pl.json();
  const body = inst.MlxRingInstance;
  assert.ok(body, JSON.stringify(inst));
  const shards = Object.values(body.shardAssignments.runnerToShard).map((x) => x.PipelineShardMetadata);
  assert.equal(shards.length, 1);
  assert.deepEqual([shards[0].startLayer, shards[0].endLayer, shards[0].nLayers], [0, 5, 5]);
  assert.deepEqual(Object.keys(body.shardAssignments.nodeToRunner), [nodeId]);
  assert.equal((await fetch(`${base}/instance/placement?${q({ model_id: 'nobody/nothing' })}`)).status, 404);
  const two = await fetch(`${base}/instance/placement?${q({ model_id: STORIES_ID, min_nodes: 2 })}`);
  assert.equal(two.status, 400);
  assert.match((await two.json()).error.message, /min_nodes/);

  const pv = await D.getJson(base, `/instance/previews?${q({ model_id: STORIES_ID })}`);
  const ok = pv.previews.filter((x) => x.instance && x.error === null);
  assert.ok(ok.length >= 1, JSON.stringify(pv));
  assert.ok(ok[0].memory_delta_by_node[nodeId] > 0);
  const keys = pv.previews.map((x) => JSON.stringify([x.sharding, x.instance_meta, x.error]));
  assert.equal(new Set(keys).size, keys.length, 'previews are deduplicated');

  const before = (await D.getJson(base, '/events/page')).count;
  const bad = await D.postJson(base, '/instance', { instance: { Bogus: {} } });
  assert.equal(bad.status, 400);
  const made = await D.postJson(base, '/instance', { instance: inst });
  assert.equal(made.status, 200, made.text);
  assert.equal(made.json.message, 'Command received.');
  const id = body.instanceId;
  const t0 = Date.now();
  for (;;) {
    const st = await D.getJson(base, '/state');
    const rid = Object.keys(body.shardAssignments.runnerToShard)[0];
    if (st.instances[id] && st.runners[rid] && 'RunnerReady' in st.runners[rid]) break;
    assert.ok(Date.now() - t0 < 15000, 'the created instance gets a Ready runner');
    await D.sleep(50);
  }
  assert.equal(Object.values(await D.getJson(base, `/instance/${id}`))[0].instanceId, id);
  const since = await D.getJson(base, `/events?since=${before}`);
  assert.ok(since.length > 0 && 'InstanceCreated' in since[0], JSON.stringify(since[0]));
  assert.equal((await fetch(`${base}/events?since=-1`)).status, 400);
  // pages: at most 1000 events, and the page says where the next one starts
  const pg = await D.getJson(base, `/events/page?since=${before}&limit=2`);
  assert.equal(pg.since, before);
  assert.ok(pg.events.length <= 2 && pg.events.length > 0);
  assert.equal(pg.next, before + pg.events.length);
  assert.equal(pg.first, 0, 'nothing compacted yet');
  assert.deepEqual(pg.events, since.slice(0, pg.events.length));
  assert.ok((await D.getJson(base, '/events?limit=100000')).length <= 1000);
  const end = await D.getJson(base, `/events/page?since=${pg.count + 5}`);
  assert.deepEqual([end.events.length, end.next, end.more], [0, end.count, false]);
  // two instances of one model now: requests still get their greedy text
  const r = await viaOpenAI(STORIES_ID, P.stories, { max: 8 });
  assert.equal(r.text, ref(STORIES_ID, P.stories, 8).text);
  const del = await fetch(`${base}/instance/${id}`, { method: 'DELETE' });
  assert.equal(del.status, 200);
  assert.equal((await del.json()).instance_id, id);
  for (const t1 = Date.now(); (await fetch(`${base}/instance/${id}`)).status !== 404;) {
    assert.ok(Date.now() - t1 < 5000, 'deleted instance disappears');
    await D.sleep(20);
  }
  assert.equal((await fetch(`${base}/instance/${id}`, { method: 'DELETE' })).status, 404);
  assert.equal(Object.keys((await D.getJson(base, '/state')).instances).length, 2);
});

// ---- greedy parity: every client, both modes, both models -----------------------------

test('greedy parity with exo run: stories260K', T_TEST, async (t) => {
  await checkParity(t, STORIES_ID, P.stories, N_PARITY);
});

test('greedy parity with exo run: qwen3 tiny (byte-level BPE, Qwen3 template)', T_TEST, async (t) => {
  await checkParity(t, QWEN_ID, P.qwen, N_PARITY);
});

test('greedy parity when the model ends with EOS (<|im_end|>): finish stop / end_turn / completed', T_TEST, async (t) => {
  assert.equal(ref(QWEN_ID, P.qwenEos, 24).finish, 'stop', 'the reference ends at EOS');
  await checkParity(t, QWEN_ID, P.qwenEos, 24);
});

test('greedy parity with a system prompt / instructions (qwen3 tiny)', T_TEST, async (t) => {
  await checkParity(t, QWEN_ID, P.qwenSys, 24, { system: P.sys });
});

test('greedy parity with non-ASCII, escapes and emoji in the prompt (both models)', T_TEST, async (t) => {
  await t.test('stories260K', (t2) => checkParity(t2, STORIES_ID, P.unicode, 24));
  await t.test('qwen3 tiny', (t2) => checkParity(t2, QWEN_ID, P.unicode, 24));
});

test('thinking disabled reaches the template as in exo run --enable-thinking false (qwen3 tiny)', T_TEST, async (t) => {
  const on = ref(QWEN_ID, P.qwen, N_PARITY), off = ref(QWEN_ID, P.qwen, 24, { enableThinking: false });
  assert.ok(off.promptTokens > on.promptTokens, 'the template added the empty think block');
  await checkParity(t, QWEN_ID, P.qwen, 24, { enableThinking: false }, { thinking: false });
});

test('seeded sampling (temperature 0.8, seed 42) equals exo run --seed', T_TEST, async (t) => {
  // Claude Messages has no seed parameter
  const apis = ['openai chat', 'openai responses', 'ollama chat', 'ollama generate'];
  await t.test('stories260K', (t2) => checkParity(t2, STORIES_ID, P.stories, 24, SAMPLED, SAMPLED, apis));
  await t.test('qwen3 tiny', (t2) => checkParity(t2, QWEN_ID, P.qwen, 24, SAMPLED, SAMPLED, apis));
});

// exo run --logprobs prints ids; the API names tokens by text.
async function logprobsOf(model, prompt, max) {
  const res = await openai.chat.completions.create({ model, temperature: 0, max_tokens: max, logprobs: true,
    top_logprobs: 3, messages: [{ role: 'user', content: prompt }] });
  return { res, lp: res.choices[0].logprobs.content };
}

test('logprobs equal exo run --logprobs (OpenAI chat)', T_TEST, async (t) => {
  // prompts whose first 12 greedy tokens each decode to text of their own
  for (const [model, prompt] of [[STORIES_ID, P.stories], [QWEN_ID, P.qwenLp]]) {
    await t.test(`${model}: logprob and top_logprobs values, token texts`, async () => {
      const r = ref(model, prompt, 12, { logprobs: 3 });
      const { lp } = await logprobsOf(model, prompt, 12);
      assert.equal(lp.length, r.tokens.length, 'one entry per generated token');
      assert.equal(lp.map((x) => x.token).join(''), r.text, 'token texts concatenate to the completion');
      lp.forEach((x, i) => {
        const want = r.tokens[i];
        assert.ok(Math.abs(x.logprob - want.logprob) < 1e-4, `token ${i}: logprob ${x.logprob} vs ${want.logprob}`);
        assert.equal(x.top_logprobs.length, 3);
        x.top_logprobs.forEach((y, k) => assert.ok(Math.abs(y.logprob - want.top[k][1]) < 1e-4, `token ${i} top ${k}`));
        assert.deepEqual(x.bytes, [...Buffer.from(x.token)]);
      });
    });
  }
  // Alternatives are decoded in context: decoding a top_logprobs id on its own with a
  // SentencePiece decoder strips its leading space (the chosen token " ", id 410 "▁",
  // appeared in top_logprobs as "").
  await t.test('top_logprobs[0] names the chosen token when it is the best one', async () => {
    const r = ref(STORIES_ID, P.stories, 12, { logprobs: 3 });
    const { lp } = await logprobsOf(STORIES_ID, P.stories, 12);
    lp.forEach((x, i) => {
      if (r.tokens[i].top[0][0] === r.tokens[i].id)
        assert.equal(x.top_logprobs[0].token, x.token, `token ${i}: top_logprobs[0] names the chosen token`);
    });
  });
  // A token whose text the detokenizer holds back (the first bytes of a UTF-8 sequence,
  // ids 229 166 here) keeps its logprobs entry: the output parser must not attach a
  // token's metadata only to a chunk emitted while that token is fed (that gave 10
  // entries for 12 tokens).
  await t.test('every token keeps its logprobs entry, also when its text is held back', async () => {
    const r = ref(QWEN_ID, P.qwen, 12, { logprobs: 3 });
    const { res, lp } = await logprobsOf(QWEN_ID, P.qwen, 12);
    assert.equal(res.usage.completion_tokens, 12);
    assert.equal(lp.map((x) => x.token).join(''), r.text, 'token texts concatenate to the completion');
    // exo run prints 5 decimals: compare within that rounding, not by
    // rounding both sides (a value ending in ...5 rounds either way)
    assert.equal(lp.length, r.tokens.length, 'one entry per generated token');
    lp.forEach((x, i) => assert.ok(Math.abs(x.logprob - r.tokens[i].logprob) < 1e-5,
      `token ${i}: logprob ${x.logprob} vs ${r.tokens[i].logprob} (entries in order)`));
  });
  // An entry names its token as the top_logprobs alternative for the same id does
  // (decoded after its predecessor, leading space included): the entry used to
  // carry the piece of content instead ("upon" beside " upon"; "" for a held-back
  // byte beside its alternative's text).
  await t.test('an entry\'s token equals the top_logprobs entry of the same token id', async () => {
    for (const [model, prompt] of [[STORIES_ID, P.stories], [QWEN_ID, P.qwen], [QWEN_ID, P.qwenLp]]) {
      const r = ref(model, prompt, 12, { logprobs: 3 });
      const { lp } = await logprobsOf(model, prompt, 12);
      let matched = 0;
      lp.forEach((x, i) => {
        const k = r.tokens[i].top.findIndex(([id]) => id === r.tokens[i].id);
        if (k < 0) return;
        matched++;
        assert.equal(x.top_logprobs[k].token, x.token, `${model} token ${i}`);
        assert.deepEqual(x.top_logprobs[k].bytes, x.bytes, `${model} token ${i} bytes`);
      });
      assert.ok(matched >= 6, `${model}: the chosen token is among the top 3 often enough (${matched})`);
    }
  });
});

test('max_tokens ends with finish length in every API', T_TEST, async (t) => {
  for (const model of [STORIES_ID, QWEN_ID]) {
    const r = ref(model, model === STORIES_ID ? P.stories : P.qwen, 5);
    if (r.finish !== 'length') continue; // an EOS within 5 tokens: nothing to check
    for (const [name, fn] of Object.entries(APIS)) {
      await t.test(`${model} ${name}`, async () => {
        const got = await fn(model, model === STORIES_ID ? P.stories : P.qwen, { max: 5, stream: name.includes('ollama') });
        assert.equal(got.finish, 'length');
        assert.equal(got.genTokens, 5);
        assert.equal(got.text, r.text);
        if (name === 'claude messages') assert.equal(got.stopReason, 'max_tokens');
      });
    }
  }
});

// ---- stop sequences ---------------------------------------------------------------------

test('stop sequences: text ends before the stop string, never contains it', T_TEST, async (t) => {
  const full = ref(STORIES_ID, P.storiesStop, 64).text;
  // a stop string that starts mid-text and spans several tokens, and a one-char one
  const at = Math.max(8, full.indexOf(' ', 12));
  const stops = [full.slice(at, at + 7), full.trim().slice(-1) === '.' ? '.' : full[at + 1]];
  for (const stop of stops) {
    const expect = full.slice(0, full.indexOf(stop));
    assert.ok(expect.length < full.length, `stop ${JSON.stringify(stop)} occurs in ${JSON.stringify(full)}`);
    for (const [name, fn] of Object.entries(APIS)) {
      for (const stream of [false, true]) {
        await t.test(`${JSON.stringify(stop)} ${name} ${stream ? 'stream' : 'non-stream'}`, async () => {
          const got = await fn(STORIES_ID, P.storiesStop, { max: 64, stream, stop: [stop] });
          assert.equal(got.text, expect);
          assert.ok(!got.text.includes(stop));
          assert.equal(got.finish, 'stop');
          if (name === 'claude messages') {
            assert.equal(got.stopReason, 'stop_sequence');
            assert.equal(got.stopSequence, stop);
          }
        });
      }
    }
  }
  await t.test('OpenAI: a single string; several stops, the earliest match wins; a stop that never occurs', async () => {
    const r = await openai.chat.completions.create({ model: STORIES_ID, temperature: 0, max_tokens: 64,
      messages: [{ role: 'user', content: P.storiesStop }], stop: stops[0] });
    assert.equal(r.choices[0].message.content, full.slice(0, full.indexOf(stops[0])));
    const later = full.slice(full.indexOf(stops[0]) + 10, full.indexOf(stops[0]) + 14);
    const both = await viaOpenAI(STORIES_ID, P.storiesStop, { max: 64, stop: [later, stops[0]] });
    assert.equal(both.text, full.slice(0, Math.min(full.indexOf(stops[0]), full.indexOf(later))));
    const never = await viaClaude(STORIES_ID, P.storiesStop, { max: 64, stop: ['@@never@@'] });
    assert.equal(never.text, full);
    assert.equal(never.stopReason, ref(STORIES_ID, P.storiesStop, 64).finish === 'length' ? 'max_tokens' : 'end_turn');
    assert.equal(never.stopSequence, null);
  });
  // byte-level output with replacement characters: the stop string starts at
  // the first U+FFFD, which the detokenizer produces from held-back bytes
  const q = ref(QWEN_ID, P.qwen, N_PARITY).text;
  const at2 = q.indexOf('\ufffd');
  assert.ok(at2 > 0, `the qwen reference has a replacement character: ${JSON.stringify(q)}`);
  const qstop = q.slice(at2, at2 + 2);
  for (const [name, fn] of Object.entries(APIS)) {
    await t.test(`qwen3 tiny ${JSON.stringify(qstop)} ${name}`, async () => {
      const got = await fn(QWEN_ID, P.qwen, { max: N_PARITY, stream: true, stop: [qstop] });
      assert.equal(got.text, q.slice(0, at2));
      assert.equal(got.finish, 'stop');
    });
  }
});

// A conversation (system, user, assistant, user) in each API's own shapes:
// content parts / blocks / input items. The reference renders the same
// messages with `exo chat-template`, tokenizes them and runs `exo run --tokens`.
test('multi-turn conversations in each API\'s message shapes equal exo run on the rendered template', T_TEST, async (t) => {
  const sys = 'You are a storyteller.', u1 = 'Tell me about a cat.', a1 = 'The cat was big and soft.',
    u2 = 'What did the cat do next?';
  const canonical = [{ role: 'system', content: sys }, { role: 'user', content: u1 },
    { role: 'assistant', content: a1 }, { role: 'user', content: u2 }];
  const max = 24;
  for (const model of [STORIES_ID, QWEN_ID]) {
    const r = await D.exoRunMessages(dirOf(model), canonical, { maxTokens: max });
    const shapes = {
      'openai chat (content parts)': async () => {
        const res = await openai.chat.completions.create({ model, max_tokens: max, temperature: 0, messages: [
          { role: 'system', content: sys }, { role: 'user', content: [{ type: 'text', text: u1 }] },
          { role: 'assistant', content: a1 }, { role: 'user', content: u2 }] });
        return [res.choices[0].message.content, res.usage.prompt_tokens];
      },
      'claude (system blocks, content blocks)': async () => {
        const res = await anthropic.messages.create({ model, max_tokens: max, temperature: 0,
          system: [{ type: 'text', text: sys }], messages: [
            { role: 'user', content: [{ type: 'text', text: u1 }] },
            { role: 'assistant', content: [{ type: 'text', text: a1 }] }, { role: 'user', content: u2 }] });
        return [res.content.map((b) => b.text).join(''), res.usage.input_tokens];
      },
      'responses (input items)': async () => {
        const res = await openai.responses.create({ model, max_output_tokens: max, temperature: 0, input: [
          { type: 'message', role: 'system', content: sys },
          { type: 'message', role: 'user', content: [{ type: 'input_text', text: u1 }] },
          { type: 'message', role: 'assistant', content: [{ type: 'output_text', text: a1 }] },
          { role: 'user', content: u2 }] });
        return [res.output_text, res.usage.input_tokens];
      },
      'responses (instructions)': async () => {
        const res = await openai.responses.create({ model, max_output_tokens: max, temperature: 0, instructions: sys,
          input: [{ role: 'user', content: u1 }, { role: 'assistant', content: a1 }, { role: 'user', content: u2 }] });
        return [res.output_text, res.usage.input_tokens];
      },
      'ollama chat': async () => {
        const res = await ollama.chat({ model, messages: canonical, stream: false, options: { temperature: 0, num_predict: max } });
        return [res.message.content, res.prompt_eval_count];
      },
    };
    for (const [name, fn] of Object.entries(shapes)) {
      await t.test(`${model} ${name}`, async () => {
        const [text, promptTokens] = await fn();
        assert.equal(text, r.text);
        assert.equal(promptTokens, r.promptTokens);
      });
    }
  }
});

test('bench endpoint: EOS is not a stop, generation_stats in the body', T_TEST, async () => {
  const r = ref(QWEN_ID, P.qwenEos, 24, { ignoreEos: true });
  assert.equal(r.genTokens, 24);
  const res = await D.postJson(base, '/bench/chat/completions', chatBody(QWEN_ID, P.qwenEos, 24));
  assert.equal(res.status, 200, res.text);
  assert.equal(res.json.choices[0].message.content, r.text);
  assert.equal(res.json.choices[0].finish_reason, 'length');
  assert.equal(res.json.usage.completion_tokens, 24);
  const gs = res.json.generation_stats;
  assert.equal(gs.prompt_tokens, r.promptTokens);
  assert.equal(gs.generation_tokens, 24);
  assert.ok(gs.generation_tps > 0 && gs.prompt_tps > 0);
});

// ---- wire framing (raw HTTP) -----------------------------------------------------------

const chatBody = (model, prompt, max, extra = {}) =>
  ({ model, messages: [{ role: 'user', content: prompt }], max_tokens: max, temperature: 0, ...extra });

test('OpenAI chat SSE framing: keep-alive first, chunks, usage, [DONE]', T_TEST, async () => {
  const r0 = ref(STORIES_ID, P.stories, 8);
  const r = await D.rawPost(base, '/v1/chat/completions',
    chatBody(STORIES_ID, P.stories, 8, { stream: true, stream_options: { include_usage: true } }));
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  assert.equal(r.headers.get('cache-control'), 'no-cache');
  assert.equal(r.headers.get('x-accel-buffering'), 'no');
  assert.ok(r.text.startsWith(': keep-alive\n\n'), 'SSE starts with a keep-alive comment');
  assert.ok(r.text.endsWith('data: [DONE]\n\n'), 'ends with [DONE]');
  const items = D.parseSse(r.text);
  const data = items.filter((i) => i.data !== undefined && i.data !== '[DONE]').map((i) => JSON.parse(i.data));
  assert.ok(data.length >= 2);
  let text = '';
  for (const d of data) {
    assert.equal(d.object, 'chat.completion.chunk');
    assert.equal(d.model, STORIES_ID);
    assert.equal(d.id, data[0].id);
    text += d.choices[0].delta.content ?? '';
  }
  const last = data.at(-1);
  assert.equal(last.choices[0].finish_reason, 'length');
  assert.equal(last.usage.completion_tokens, 8);
  assert.equal(last.usage.total_tokens, last.usage.prompt_tokens + 8);
  assert.equal(text, r0.text);
  assert.equal(items.filter((i) => i.data === '[DONE]').length, 1);
});

test('OpenAI chat SSE: prefill progress comments during a long prompt', T_TEST, async () => {
  const long = 'Once upon a time there was a little girl who liked to play in the park with her dog. '.repeat(40);
  const r = await D.rawPost(base, '/v1/chat/completions', chatBody(STORIES_ID, long, 4, { stream: true }));
  assert.equal(r.status, 200);
  assert.ok(r.text.startsWith(': keep-alive\n\n'));
  const items = D.parseSse(r.text);
  const prog = items.filter((i) => i.comment?.startsWith('prefill_progress'))
    .map((i) => JSON.parse(i.comment.slice('prefill_progress'.length)));
  const data = items.filter((i) => i.data && i.data !== '[DONE]').map((i) => JSON.parse(i.data));
  const usage = data.at(-1).usage;
  assert.ok(usage.prompt_tokens > 1024, `long prompt (${usage.prompt_tokens} tokens)`);
  assert.ok(prog.length >= 2, `prefill_progress comments: ${prog.length}`);
  for (let i = 1; i < prog.length; i++) assert.ok(prog[i].processed_tokens > prog[i - 1].processed_tokens);
  assert.ok(prog.every((p) => p.total_tokens === usage.prompt_tokens));
  // progress comes before the first token
  const firstData = items.findIndex((i) => i.data);
  const lastProg = items.findLastIndex((i) => i.comment?.startsWith('prefill_progress'));
  assert.ok(lastProg < firstData);
});

test('Claude SSE: full event sequence', T_TEST, async () => {
  const r0 = ref(STORIES_ID, P.stories, 8);
  const r = await D.rawPost(base, '/v1/messages', { ...chatBody(STORIES_ID, P.stories, 8), stream: true });
  assert.equal(r.status, 200);
  assert.match(r.headers.get('content-type'), /^text\/event-stream/);
  assert.ok(r.text.startsWith(': keep-alive\n\n'));
  const evs = D.parseSse(r.text).filter((i) => i.event);
  const names = evs.map((e) => e.event);
  for (const e of evs) assert.equal(JSON.parse(e.data).type, e.event, 'event name = data.type');
  assert.equal(names[0], 'message_start');
  assert.equal(names[1], 'content_block_start');
  const deltas = names.slice(2, -3);
  assert.ok(deltas.length >= 1 && deltas.every((n) => n === 'content_block_delta'), names.join(','));
  assert.deepEqual(names.slice(-3), ['content_block_stop', 'message_delta', 'message_stop']);
  const d = evs.map((e) => JSON.parse(e.data));
  assert.match(d[0].message.id, /^msg_/);
  assert.equal(d[0].message.role, 'assistant');
  assert.deepEqual(d[0].message.content, []);
  assert.deepEqual(d[1].content_block, { type: 'text', text: '' });
  assert.equal(d[1].index, 0);
  const text = d.slice(2, -3).map((x) => { assert.equal(x.delta.type, 'text_delta'); return x.delta.text; }).join('');
  assert.equal(text, r0.text);
  assert.equal(d.at(-2).delta.stop_reason, 'max_tokens');
  assert.equal(d.at(-2).usage.output_tokens, 8);
});

test('Responses SSE: event order and increasing sequence_number', T_TEST, async () => {
  const r0 = ref(STORIES_ID, P.stories, 8);
  const r = await D.rawPost(base, '/v1/responses',
    { model: STORIES_ID, input: P.stories, max_output_tokens: 8, temperature: 0, stream: true });
  assert.equal(r.status, 200);
  assert.ok(r.text.startsWith(': keep-alive\n\n'));
  const evs = D.parseSse(r.text).filter((i) => i.event);
  const d = evs.map((e) => JSON.parse(e.data));
  d.forEach((x, i) => {
    assert.equal(x.type, evs[i].event);
    assert.equal(x.sequence_number, i, 'sequence_number counts from 0 by 1');
  });
  const names = d.map((x) => x.type);
  assert.deepEqual(names.slice(0, 4), ['response.created', 'response.in_progress',
    'response.output_item.added', 'response.content_part.added']);
  assert.deepEqual(names.slice(-4), ['response.output_text.done', 'response.content_part.done',
    'response.output_item.done', 'response.incomplete']);
  // cut short by max_output_tokens: the message item is incomplete, as OpenAI's
  assert.equal(d.at(-2).item.status, 'incomplete');
  assert.equal(d.at(-1).response.output[0].status, 'incomplete');
  assert.equal(d.at(-1).response.incomplete_details.reason, 'max_output_tokens');
  const text = d.filter((x) => x.type === 'response.output_text.delta').map((x) => x.delta).join('');
  assert.equal(text, r0.text);
  assert.equal(d.at(-1).response.output_text, r0.text);
  assert.match(d[0].response.id, /^resp_/);
});

test('Ollama NDJSON framing: chat and generate', T_TEST, async () => {
  const r0 = ref(STORIES_ID, P.stories, 8);
  for (const [p, body, field] of [
    ['/ollama/api/chat', { model: STORIES_ID, messages: [{ role: 'user', content: P.stories }] }, (x) => x.message.content],
    ['/ollama/api/generate', { model: STORIES_ID, prompt: P.stories }, (x) => x.response],
  ]) {
    // stream defaults to true in Ollama
    const r = await D.rawPost(base, p, { ...body, options: { temperature: 0, num_predict: 8 } });
    assert.equal(r.status, 200);
    assert.match(r.headers.get('content-type'), /^application\/x-ndjson/);
    assert.ok(!r.text.includes('keep-alive'), 'no SSE comments in NDJSON');
    assert.ok(r.text.endsWith('\n'));
    const lines = r.text.trimEnd().split('\n').map((l) => JSON.parse(l));
    assert.ok(lines.length >= 2);
    lines.slice(0, -1).forEach((l) => assert.equal(l.done, false));
    const last = lines.at(-1);
    assert.equal(last.done, true);
    assert.equal(last.done_reason, 'length');
    assert.equal(last.eval_count, 8);
    assert.equal(last.prompt_eval_count, r0.promptTokens);
    for (const k of ['total_duration', 'prompt_eval_duration', 'eval_duration']) assert.equal(typeof last[k], 'number', k);
    lines.forEach((l) => assert.ok(!Number.isNaN(Date.parse(l.created_at)), l.created_at));
    assert.equal(lines.map(field).join(''), r0.text, p);
    lines.forEach((l) => assert.equal(l.model, STORIES_ID));
  }
});

test('Ollama preload (no messages / empty prompt) answers done_reason load without generating', T_TEST, async () => {
  for (const [p, body, field] of [
    ['/ollama/api/chat', { model: STORIES_ID, messages: [] }, (x) => x.message.content],
    ['/ollama/api/generate', { model: STORIES_ID, prompt: '' }, (x) => x.response],
    ['/ollama/api/generate', { model: STORIES_ID }, (x) => x.response],
  ]) {
    const t0 = Date.now();
    const r = await D.rawPost(base, p, body);
    assert.equal(r.status, 200, r.text);
    const j = JSON.parse(r.text.trim());
    assert.equal(j.done, true);
    assert.equal(j.done_reason, 'load');
    assert.equal(field(j), '');
    assert.ok(Date.now() - t0 < 1000, 'answered at once');
  }
  const missing = await D.rawPost(base, '/ollama/api/chat', { model: 'nobody/nothing', messages: [] });
  assert.equal(missing.status, 404);
});

// The openai SDK's models.retrieve: GET /v1/models/{id}, ids with a slash.
test('GET /v1/models/{id}: models.retrieve, OpenAI\'s 404 for an unknown id', T_TEST, async () => {
  for (const id of [STORIES_ID, QWEN_ID]) {
    const m = await openai.models.retrieve(id);
    assert.equal(m.id, id);
    assert.equal(m.object, 'model');
    assert.equal(typeof m.created, 'number');
    assert.equal(m.owned_by, 'exo');
  }
  await assert.rejects(openai.models.retrieve('nobody/nothing'),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && e.code === 'model_not_found' &&
      /nobody\/nothing/.test(e.message));
  const r = await fetch(`${base}/v1/models/nobody/nothing`);
  assert.equal(r.status, 404);
  const j = await r.json();
  assert.equal(j.error.type, 'invalid_request_error');
  assert.equal(j.error.param, 'model');
  assert.equal(j.error.code, 'model_not_found');
});

// Ollama's own paths: an unmodified client whose host is the daemon (no /ollama prefix).
test('Ollama API at /api/*: the npm client with the daemon as its host', T_TEST, async () => {
  const o = new Ollama({ host: base });
  const names = (await o.list()).models.map((x) => x.name);
  assert.ok(names.includes(STORIES_ID) && names.includes(QWEN_ID), `tags: ${names}`);
  assert.deepEqual((await o.ps()).models.map((x) => x.name).sort(), [QWEN_ID, STORIES_ID].sort());
  assert.equal((await o.show({ model: QWEN_ID })).details.family, 'qwen3');
  assert.equal(typeof (await o.version()).version, 'string');
  const r0 = ref(STORIES_ID, P.stories, 8);
  const opts = { temperature: 0, num_predict: 8 };
  const msgs = [{ role: 'user', content: P.stories }];
  const chat = await o.chat({ model: STORIES_ID, messages: msgs, stream: false, options: opts });
  assert.equal(chat.message.content, r0.text);
  assert.equal(chat.done_reason, 'length');
  let text = '';
  for await (const part of await o.chat({ model: STORIES_ID, messages: msgs, stream: true, options: opts })) text += part.message.content;
  assert.equal(text, r0.text);
  text = '';
  for await (const part of await o.generate({ model: STORIES_ID, prompt: P.stories, stream: true, options: opts })) text += part.response;
  assert.equal(text, r0.text);
  assert.equal((await o.generate({ model: STORIES_ID, prompt: P.stories, options: opts })).response, r0.text);
  // errors in Ollama's format at these paths too
  await assert.rejects(o.chat({ model: 'nobody/nothing', messages: msgs }), (e) => e.status_code === 404);
  for (const [pth, body, status] of [['/api/chat', { model: 'nobody/nothing', messages: msgs }, 404],
    ['/api/generate', '{"model":', 400], ['/api/show', { model: 'nobody/nothing' }, 404]]) {
    const r = await D.rawPost(base, pth, body);
    assert.equal(r.status, status, `${pth}: ${r.text}`);
    assert.equal(typeof JSON.parse(r.text).error, 'string', r.text);
  }
  // the /ollama prefix still serves
  assert.equal((await D.getJson(base, '/ollama/api/version')).version, (await o.version()).version);
});

// ---- errors -------------------------------------------------------------------------------

const FAMILIES = {
  openai: {
    path: '/v1/chat/completions', ok: chatBody(STORIES_ID, 'hi', 2), wrong: { model: STORIES_ID, messages: 'hi' },
    unknown: chatBody('nobody/nothing', 'hi', 2),
    check(status, j) {
      assert.equal(typeof j.error?.message, 'string');
      assert.equal(typeof j.error.type, 'string');
      assert.ok('param' in j.error);
      assert.equal(j.error.code, status);
    },
  },
  claude: {
    path: '/v1/messages', ok: chatBody(STORIES_ID, 'hi', 2), wrong: { ...chatBody(STORIES_ID, 'hi', 2), max_tokens: 'ten' },
    unknown: chatBody('nobody/nothing', 'hi', 2),
    check(status, j) {
      assert.equal(j.type, 'error');
      assert.equal(typeof j.error?.type, 'string');
      assert.equal(typeof j.error.message, 'string');
      if (status === 404) assert.equal(j.error.type, 'not_found_error');
      if (status === 400) assert.equal(j.error.type, 'invalid_request_error');
    },
  },
  responses: {
    path: '/v1/responses', ok: { model: STORIES_ID, input: 'hi', max_output_tokens: 2 },
    wrong: { model: STORIES_ID, input: 42 }, unknown: { model: 'nobody/nothing', input: 'hi' },
    check(status, j) {
      assert.equal(typeof j.error?.message, 'string');
      assert.equal(typeof j.error.type, 'string');
      assert.equal(j.error.code, status);
    },
  },
  'ollama chat': {
    path: '/ollama/api/chat', ok: { model: STORIES_ID, messages: [{ role: 'user', content: 'hi' }], stream: false, options: { num_predict: 2 } },
    wrong: { model: STORIES_ID, messages: [{ role: 'user', content: 'hi' }], options: { num_predict: 'many' } },
    unknown: { model: 'nobody/nothing', messages: [{ role: 'user', content: 'hi' }] },
    check(status, j) { assert.equal(typeof j.error, 'string'); assert.ok(j.error.length > 0); },
  },
  'ollama generate': {
    path: '/ollama/api/generate', ok: { model: STORIES_ID, prompt: 'hi', stream: false, options: { num_predict: 2 } },
    wrong: { model: STORIES_ID, prompt: ['hi'] }, unknown: { model: 'nobody/nothing', prompt: 'hi' },
    check(status, j) { assert.equal(typeof j.error, 'string'); assert.ok(j.error.length > 0); },
  },
};

function bigBody() {
  const n = (16 << 20) + 1024;
  const head = Buffer.from('{"model":"karpathy/stories260K","messages":[{"role":"user","content":"');
  const tail = Buffer.from('"}],"max_tokens":2,"prompt":"x","input":"x"}');
  const b = Buffer.alloc(n, 'a');
  head.copy(b, 0);
  tail.copy(b, n - tail.length);
  return b;
}

test('errors: 4xx in each API\'s own format, and the daemon keeps serving', T_TEST, async (t) => {
  const big = bigBody();
  for (const [fam, f] of Object.entries(FAMILIES)) {
    const valid = JSON.stringify(f.ok);
    const invalidUtf8 = Buffer.concat([Buffer.from(valid.replace('"hi"', '"h')), Buffer.from([0xff, 0xfe, 0xc3]),
      Buffer.from(valid.slice(valid.indexOf('"hi"') + 3))]);
    const cases = [
      ['malformed JSON', '{"model": "karpathy/stories260K", "messages": [', 400],
      ['not an object', '[1, 2, 3]', 400],
      ['empty body', '', 400],
      ['wrong types', JSON.stringify(f.wrong), 400],
      ['unknown model', JSON.stringify(f.unknown), 404],
      ['invalid UTF-8', invalidUtf8, 400],
      ['body over 16 MiB', big, 413],
    ];
    for (const [name, body, status] of cases) {
      await t.test(`${fam}: ${name} -> ${status}`, async () => {
        const r = await D.rawPost(base, f.path, body);
        assert.equal(r.status, status, r.text.slice(0, 300));
        assert.match(r.headers.get('content-type') ?? '', /application\/json/);
        f.check(status, JSON.parse(r.text));
      });
    }
    await t.test(`${fam}: still serving`, async () => {
      const r = await D.rawPost(base, f.path, f.ok);
      assert.equal(r.status, 200, r.text.slice(0, 300));
    });
  }
  await t.test('claude: max_tokens is required', async () => {
    const r = await D.rawPost(base, '/v1/messages', { model: STORIES_ID, messages: [{ role: 'user', content: 'hi' }] });
    assert.equal(r.status, 400);
    FAMILIES.claude.check(400, JSON.parse(r.text));
  });
  await t.test('unknown route 404, unknown cancel id 404', async () => {
    assert.equal((await fetch(`${base}/v1/nothing-here`)).status, 404);
    const c = await D.rawPost(base, '/v1/cancel/00000000-0000-4000-8000-000000000000', '');
    assert.equal(c.status, 404);
    FAMILIES.openai.check(404, JSON.parse(c.text));
  });
});

// What the real APIs refuse with a 400 (ranges, required fields, roles, block and
// item types), in each API's own error format; the SDKs raise BadRequestError.
test('requests the real APIs refuse: 400 in each API\'s format', T_TEST, async (t) => {
  const u = [{ role: 'user', content: 'hi' }];
  const cases = {
    openai: [
      ['temperature 5', chatBody(STORIES_ID, 'hi', 2, { temperature: 5 })],
      ['temperature -1', chatBody(STORIES_ID, 'hi', 2, { temperature: -1 })],
      ['top_p 1.5', chatBody(STORIES_ID, 'hi', 2, { top_p: 1.5 })],
      ['presence_penalty 3', chatBody(STORIES_ID, 'hi', 2, { presence_penalty: 3 })],
      ['frequency_penalty -3', chatBody(STORIES_ID, 'hi', 2, { frequency_penalty: -3 })],
      ['n 0', chatBody(STORIES_ID, 'hi', 2, { n: 0 })],
      ['max_tokens 0', chatBody(STORIES_ID, 'hi', 0)],
      ['empty messages', { model: STORIES_ID, messages: [] }],
      ['unknown role', { model: STORIES_ID, messages: [{ role: 'robot', content: 'hi' }] }],
      ['unknown content part', { model: STORIES_ID, messages: [{ role: 'user', content: [{ type: 'audio' }] }] }],
      ['logprobs not a boolean', chatBody(STORIES_ID, 'hi', 2, { logprobs: 'yes' })],
    ],
    claude: [
      ['empty messages', { model: STORIES_ID, max_tokens: 5, messages: [] }],
      ['temperature 5', { model: STORIES_ID, max_tokens: 5, messages: u, temperature: 5 }],
      ['temperature 1.5', { model: STORIES_ID, max_tokens: 5, messages: u, temperature: 1.5 }],
      ['top_p 2', { model: STORIES_ID, max_tokens: 5, messages: u, top_p: 2 }],
      ['max_tokens 0', { model: STORIES_ID, max_tokens: 0, messages: u }],
      ['no max_tokens', { model: STORIES_ID, messages: u }],
      ['system role in messages', { model: STORIES_ID, max_tokens: 5, messages: [{ role: 'system', content: 'x' }] }],
      ['unknown block type', { model: STORIES_ID, max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'bogus' }] }] }],
      ['stop_sequences a string', { model: STORIES_ID, max_tokens: 5, messages: u, stop_sequences: 'Z' }],
      ['system a number', { model: STORIES_ID, max_tokens: 5, messages: u, system: 5 }],
    ],
    responses: [
      ['empty input', { model: STORIES_ID, input: [] }],
      ['temperature 3', { model: STORIES_ID, input: 'hi', temperature: 3 }],
      ['top_p -1', { model: STORIES_ID, input: 'hi', top_p: -1 }],
      ['max_output_tokens 0', { model: STORIES_ID, input: 'hi', max_output_tokens: 0 }],
      ['unknown item type', { model: STORIES_ID, input: [{ type: 'bogus_item' }] }],
      ['unknown role', { model: STORIES_ID, input: [{ role: 'robot', content: 'hi' }] }],
    ],
  };
  for (const [fam, list] of Object.entries(cases)) {
    for (const [name, body] of list) {
      await t.test(`${fam}: ${name} -> 400`, async () => {
        const r = await D.rawPost(base, FAMILIES[fam].path, body);
        assert.equal(r.status, 400, r.text.slice(0, 300));
        FAMILIES[fam].check(400, JSON.parse(r.text));
      });
    }
  }
  await t.test('the edges of the ranges are accepted', async () => {
    for (const [p, body] of [
      ['/v1/chat/completions', chatBody(STORIES_ID, 'hi', 1, { temperature: 2, top_p: 1, presence_penalty: -2, n: 1 })],
      ['/v1/messages', { model: STORIES_ID, max_tokens: 1, messages: u, temperature: 1, top_p: 1, top_k: 0 }],
      ['/v1/responses', { model: STORIES_ID, input: 'hi', max_output_tokens: 1, temperature: 2, top_p: 0.5 }],
    ]) {
      const r = await D.rawPost(base, p, body);
      assert.equal(r.status, 200, `${p}: ${r.text.slice(0, 300)}`);
    }
  });
  await t.test('SDKs raise BadRequestError', async () => {
    await assert.rejects(anthropic.messages.create({ model: STORIES_ID, max_tokens: 5, messages: [] }),
      (e) => e instanceof Anthropic.BadRequestError && e.status === 400 && e.error?.error?.type === 'invalid_request_error');
    await assert.rejects(anthropic.messages.create({ model: STORIES_ID, max_tokens: 5, messages: u, temperature: 5 }),
      (e) => e instanceof Anthropic.BadRequestError && /temperature/.test(e.message));
    await assert.rejects(openai.responses.create({ model: STORIES_ID, input: [] }),
      (e) => e instanceof OpenAI.BadRequestError && /input/.test(e.message));
    await assert.rejects(openai.chat.completions.create(chatBody(STORIES_ID, 'hi', 2, { temperature: 5 })),
      (e) => e instanceof OpenAI.BadRequestError && /temperature/.test(e.message));
  });
});

test('errors surface as the SDKs\' typed errors', T_TEST, async () => {
  await assert.rejects(openai.chat.completions.create(chatBody('nobody/nothing', 'hi', 2)),
    (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && /No instance found/.test(e.message));
  await assert.rejects(openai.chat.completions.create({ model: STORIES_ID, messages: 'hi' }),
    (e) => e instanceof OpenAI.BadRequestError && e.status === 400);
  await assert.rejects(openai.responses.create({ model: 'nobody/nothing', input: 'hi' }),
    (e) => e instanceof OpenAI.NotFoundError);
  await assert.rejects(anthropic.messages.create(chatBody('nobody/nothing', 'hi', 2)),
    (e) => e instanceof Anthropic.NotFoundError && e.status === 404 && e.error?.error?.type === 'not_found_error');
  await assert.rejects(anthropic.messages.create({ ...chatBody(STORIES_ID, 'hi', 2), max_tokens: 'x' }),
    (e) => e instanceof Anthropic.BadRequestError);
  await assert.rejects(ollama.chat({ model: 'nobody/nothing', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status_code === 404 && /No instance found/.test(e.error ?? e.message));
  // and a good request right after
  const got = await viaOpenAI(STORIES_ID, P.stories, { max: 8 });
  assert.equal(got.text, ref(STORIES_ID, P.stories, 8).text);
});

// A prompt over the context is the request's fault: a 4xx the SDKs do not retry (they
// retry a 5xx twice), in each API's error shape, streaming or not.
test('a prompt longer than the context: 400 in every API, typed SDK errors, 4xx stream errors', T_TEST, async (t) => {
  const long = 'Once upon a time there was a little cat. '.repeat(Math.ceil(D.CTX / 4));
  const bodies = {
    openai: chatBody(STORIES_ID, long, 2), claude: chatBody(STORIES_ID, long, 2),
    responses: { model: STORIES_ID, input: long, max_output_tokens: 2 },
    'ollama chat': { model: STORIES_ID, messages: [{ role: 'user', content: long }], stream: false, options: { num_predict: 2 } },
    'ollama generate': { model: STORIES_ID, prompt: long, stream: false, options: { num_predict: 2 } },
  };
  for (const [fam, f] of Object.entries(FAMILIES)) {
    await t.test(`${fam}: 400 naming the context`, async () => {
      const r = await D.rawPost(base, f.path, bodies[fam]);
      assert.equal(r.status, 400, r.text.slice(0, 300));
      const j = JSON.parse(r.text);
      f.check(400, j);
      assert.match(JSON.stringify(j), /more than the context of 8192 tokens/);
    });
  }
  await t.test('SDKs: BadRequestError, no retries', async () => {
    const t0 = Date.now();
    await assert.rejects(openai.chat.completions.create(bodies.openai),
      (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /context/.test(e.message));
    await assert.rejects(anthropic.messages.create(bodies.claude),
      (e) => e instanceof Anthropic.BadRequestError && e.error?.error?.type === 'invalid_request_error');
    await assert.rejects(openai.responses.create(bodies.responses), (e) => e instanceof OpenAI.BadRequestError);
    // a retried 5xx would wait ~0.5-8 s of backoff first
    assert.ok(Date.now() - t0 < 2000, `took ${Date.now() - t0} ms`);
  });
  await t.test('streams: the error event carries the 4xx type', async () => {
    let r = await D.rawPost(base, '/v1/chat/completions', { ...bodies.openai, stream: true });
    const oa = sseData(r.text).find((x) => x.error);
    assert.deepEqual([oa?.error.type, oa?.error.code], ['invalid_request_error', 400], r.text.slice(0, 300));
    assert.match(r.text, /data: \[DONE\]\n\n$/);
    r = await D.rawPost(base, '/v1/messages', { ...bodies.claude, stream: true });
    const cl = D.parseSse(r.text).filter((e) => e.event === 'error').map((e) => JSON.parse(e.data));
    assert.equal(cl.length, 1, r.text.slice(0, 300));
    assert.equal(cl[0].error.type, 'invalid_request_error');
    r = await D.rawPost(base, '/v1/responses', { ...bodies.responses, stream: true });
    const rs = D.parseSse(r.text).filter((e) => e.event === 'response.failed').map((e) => JSON.parse(e.data));
    assert.equal(rs.length, 1, r.text.slice(0, 300));
    assert.equal(rs[0].response.error.code, 'invalid_prompt');
    assert.match(rs[0].response.error.message, /more than the context/);
  });
  await t.test('the runner keeps serving', async () => {
    const got = await viaOpenAI(STORIES_ID, P.stories, { max: 8 });
    assert.equal(got.text, ref(STORIES_ID, P.stories, 8).text);
  });
});

// ---- cancellation -------------------------------------------------------------------------

async function tasksGone(maxMs) {
  const t0 = Date.now();
  for (;;) {
    const st = await D.getJson(base, '/state');
    if (Object.keys(st.tasks ?? {}).length === 0) return Date.now() - t0;
    if (Date.now() - t0 > maxMs) return Infinity;
    await sleep(10);
  }
}

async function taskCount() {
  return Object.keys((await D.getJson(base, '/state')).tasks ?? {}).length;
}

// Tests that count tasks in the State start from none: the previous test's
// last task may still be waiting for its runner's Done frame after the
// client saw [DONE], and pausing the runner then would keep it forever.
async function noTasksLeft() {
  assert.notEqual(await tasksGone(5000), Infinity, 'the previous test left tasks running');
}

async function waitTaskCount(n, maxMs = 2000) {
  const t0 = Date.now();
  while ((await taskCount()) !== n) {
    if (Date.now() - t0 > maxMs) throw new Error(`State has ${await taskCount()} tasks, want ${n}`);
    await sleep(5);
  }
}

function storiesRunner() {
  const pids = D.runnerPids(daemon.pid, 'karpathy--stories260K');
  assert.equal(pids.length, 1, 'one stories260K runner process');
  return pids[0];
}

// Runs fn with the stories runner stopped (SIGSTOP), resuming it whatever happens.
async function withRunnerPaused(fn) {
  const pid = storiesRunner();
  process.kill(pid, 'SIGSTOP');
  try {
    return await fn(pid);
  } finally {
    process.kill(pid, 'SIGCONT');
  }
}

// complete SSE data events of a (possibly unfinished) stream
const sseData = (text) => D.parseSse(text.slice(0, text.lastIndexOf('\n\n') + 2))
  .filter((e) => e.data && e.data !== '[DONE]').map((e) => JSON.parse(e.data));

const LONG = 8000; // tokens: ~30 s of stories260K at ctx 8192 on 2 cores; every test cuts it short

test('POST /v1/cancel/{id} ends a long stream quickly (OpenAI, Claude, Responses)', T_TEST, async (t) => {
  const cases = [
    ['openai', '/v1/chat/completions', { ...chatBody(STORIES_ID, P.stories, LONG), stream: true },
      (txt) => { const m = /data: (\{.*\})/.exec(txt); return m && JSON.parse(m[1]).id; }],
    ['claude', '/v1/messages', { ...chatBody(STORIES_ID, P.stories, LONG), stream: true },
      (txt) => { const m = /"id":"msg_([^"]+)"/.exec(txt); return txt.includes('text_delta') && m && m[1]; }],
    ['responses', '/v1/responses', { model: STORIES_ID, input: P.stories, max_output_tokens: LONG, temperature: 0, stream: true },
      (txt) => { const m = /"id":"resp_([^"]+)"/.exec(txt); return txt.includes('output_text.delta') && m && m[1]; }],
  ];
  for (const [name, p, body, idOf] of cases) {
    await t.test(name, async () => {
      const s = await D.openStream(base, p, body);
      assert.equal(s.status, 200);
      assert.ok(await s.until((b) => idOf(b) && b.split('\n\n').length > 8), 'stream started');
      const id = idOf(s.text);
      const t0 = Date.now();
      const c = await D.postJson(base, `/v1/cancel/${id}`, '');
      assert.equal(c.status, 200, c.text);
      assert.deepEqual(c.json, { message: 'Command cancelled.', command_id: id });
      await s.rest();
      const ms = Date.now() - t0;
      assert.ok(ms < 1000, `stream ended ${ms} ms after the cancel`);
      const evs = D.parseSse(s.text);
      const data = evs.filter((e) => e.data && e.data !== '[DONE]').map((e) => JSON.parse(e.data));
      if (name === 'openai') {
        assert.equal(evs.at(-1).data, '[DONE]');
        const fin = data.at(-1);
        assert.ok(['stop', 'cancelled'].includes(fin.choices[0].finish_reason), JSON.stringify(fin));
        assert.ok(fin.usage.completion_tokens < LONG);
      } else if (name === 'claude') {
        assert.deepEqual(evs.filter((e) => e.event).slice(-3).map((e) => e.event),
          ['content_block_stop', 'message_delta', 'message_stop']);
        assert.ok(data.at(-2).usage.output_tokens < LONG);
      } else {
        assert.ok(['response.completed', 'response.incomplete'].includes(data.at(-1).type), data.at(-1).type);
        data.forEach((x, i) => assert.equal(x.sequence_number, i));
      }
      assert.ok((await tasksGone(1000)) < 1000, 'task removed from the State');
      const again = await D.postJson(base, `/v1/cancel/${id}`, '');
      assert.equal(again.status, 404, 'a finished command cannot be cancelled again');
    });
  }

  // With the runner stopped, every token it had produced has reached the client;
  // after the cancel it may finish the token it was computing, and no more.
  await t.test('at most one more token after the cancel (runner paused around it)', async () => {
    const s = await D.openStream(base, '/v1/chat/completions',
      { ...chatBody(STORIES_ID, P.stories, LONG), stream: true, logprobs: true });
    await s.until((b) => sseData(b).length >= 5);
    let n0, id;
    await withRunnerPaused(async () => {
      await sleep(150);
      const data = sseData(s.text);
      n0 = data.reduce((n, d) => n + (d.choices[0].logprobs?.content?.length ?? 0), 0);
      id = data[0].id;
      const c = await D.postJson(base, `/v1/cancel/${id}`, '');
      assert.equal(c.status, 200);
      await sleep(50);
    });
    await s.rest();
    const data = sseData(s.text);
    const fin = data.at(-1);
    const delivered = data.reduce((n, d) => n + (d.choices[0].logprobs?.content?.length ?? 0), 0);
    assert.ok(fin.usage.completion_tokens <= n0 + 1,
      `${fin.usage.completion_tokens} tokens generated, ${n0} delivered before the cancel`);
    assert.equal(delivered, fin.usage.completion_tokens, 'every generated token was delivered');
  });
});

test('client disconnect cancels the generation; the next request is served at once', T_TEST, async (t) => {
  const thenServed = async () => {
    const gone = await tasksGone(1500);
    assert.ok(gone < 1000, `task left the State ${gone} ms after the disconnect`);
    assert.equal(Object.values(await D.runnersOf(base, STORIES_ID))[0], 'RunnerReady');
    const t0 = Date.now();
    const got = await viaOpenAI(STORIES_ID, P.stories, { max: 8 });
    const ms = Date.now() - t0;
    assert.equal(got.text, ref(STORIES_ID, P.stories, 8).text);
    assert.ok(ms < 1000, `next request took ${ms} ms`);
  };
  await t.test('OpenAI SDK stream: break out of the loop', async () => {
    const s = await openai.chat.completions.create({ ...chatBody(STORIES_ID, P.stories, LONG), stream: true });
    let n = 0;
    for await (const ch of s) { if (++n === 5) break; } // break aborts the request
    assert.equal(n, 5);
    await thenServed();
  });
  await t.test('OpenAI SDK stream: AbortController', async () => {
    const ac = new AbortController();
    const s = await openai.chat.completions.create({ ...chatBody(STORIES_ID, P.stories, LONG), stream: true },
      { signal: ac.signal });
    let n = 0;
    for await (const ch of s) { if (++n === 5) ac.abort(); }
    await thenServed();
  });
  await t.test('Claude SDK stream aborted', async () => {
    const s = anthropic.messages.stream(chatBody(STORIES_ID, P.stories, LONG));
    let n = 0;
    for await (const ev of s) { if (ev.type === 'content_block_delta' && ++n === 5) { s.abort(); break; } }
    await thenServed();
  });
  await t.test('Responses SDK stream aborted', async () => {
    const s = await openai.responses.create({ model: STORIES_ID, input: P.stories, max_output_tokens: LONG,
      temperature: 0, stream: true });
    let n = 0;
    for await (const ev of s) { if (ev.type === 'response.output_text.delta' && ++n === 5) break; }
    await thenServed();
  });
  await t.test('Ollama client stream aborted', async () => {
    const it = await ollama.chat({ model: STORIES_ID, messages: [{ role: 'user', content: P.stories }], stream: true,
      options: { temperature: 0, num_predict: LONG } });
    let n = 0;
    try { for await (const part of it) { if (++n === 5) it.abort(); } } catch (e) { assert.equal(e.name, 'AbortError'); }
    await thenServed();
  });
  await t.test('non-streaming request aborted', async () => {
    const ac = new AbortController();
    const p = D.rawPost(base, '/v1/chat/completions', chatBody(STORIES_ID, P.stories, LONG), { signal: ac.signal });
    for (let i = 0; i < 200; i++) { // until it runs
      const st = await D.getJson(base, '/state');
      if (Object.values(st.tasks ?? {}).some((x) => Object.values(x)[0].taskStatus === 'Running')) break;
      await sleep(10);
    }
    await sleep(100);
    ac.abort();
    await assert.rejects(p);
    await thenServed();
  });
  // Disconnect while the runner is stopped: once it resumes it must drop the
  // request at its next token, not run the remaining ~4000.
  await t.test('disconnect while the runner is paused: dropped at its next token', async () => {
    const s = await D.openStream(base, '/v1/chat/completions', { ...chatBody(STORIES_ID, P.stories, LONG), stream: true });
    await s.until((b) => sseData(b).length >= 5);
    let t0;
    await withRunnerPaused(async () => {
      await sleep(50);
      await s.abort();
      // the node has seen the disconnect once the task is no longer Running
      for (let i = 0; i < 100; i++) {
        const st = await D.getJson(base, '/state');
        if (!Object.values(st.tasks ?? {}).some((x) => Object.values(x)[0].taskStatus === 'Running')) break;
        await sleep(10);
      }
      t0 = Date.now();
    });
    const gone = await tasksGone(3000);
    const ms = Date.now() - t0;
    assert.ok(gone !== Infinity && ms < 1000, `runner finished ${ms} ms after resuming`);
    await thenServed();
  });
});

// Three requests queue behind a stopped runner; the second's client goes
// away and the third is cancelled by id. Once the runner resumes only the
// first runs: the others end without a token, and nothing is left behind.
test('queued requests: a disconnect or /v1/cancel removes them before they run', T_TEST, async () => {
  let first, second, third, t0;
  await noTasksLeft();
  await withRunnerPaused(async () => {
    first = await D.openStream(base, '/v1/chat/completions', { ...chatBody(STORIES_ID, P.stories, 8), stream: true });
    await waitTaskCount(1);
    second = await D.openStream(base, '/v1/messages', { ...chatBody(STORIES_ID, P.stories, LONG), stream: true });
    await waitTaskCount(2);
    third = await D.openStream(base, '/v1/responses',
      { model: STORIES_ID, input: P.stories, max_output_tokens: LONG, temperature: 0, stream: true });
    await waitTaskCount(3);
    assert.ok(await second.until((b) => b.includes('message_start')));
    await second.abort();
    assert.ok(await third.until((b) => /"id":"resp_[^"]+"/.test(b)));
    const id = /"id":"resp_([^"]+)"/.exec(third.text)[1];
    const c = await D.postJson(base, `/v1/cancel/${id}`, '');
    assert.equal(c.status, 200, c.text);
    t0 = Date.now();
  });
  await Promise.all([first.rest(), third.rest()]);
  const d1 = sseData(first.text);
  assert.equal(d1.map((x) => x.choices[0].delta.content ?? '').join(''), ref(STORIES_ID, P.stories, 8).text);
  const d3 = sseData(third.text);
  assert.ok(!d3.some((x) => x.type === 'response.output_text.delta'), 'the cancelled request produced no text');
  assert.ok(['response.completed', 'response.incomplete'].includes(d3.at(-1).type), d3.at(-1).type);
  assert.equal(d3.at(-1).response.usage?.output_tokens ?? 0, 0);
  const gone = await tasksGone(3000);
  assert.ok(gone !== Infinity && Date.now() - t0 < 1000, `queue drained ${Date.now() - t0} ms after resuming`);
  assert.equal(Object.values(await D.runnersOf(base, STORIES_ID))[0], 'RunnerReady');
});

// ---- concurrency and queueing -------------------------------------------------------------

test('8 concurrent requests to one instance: each gets exactly its greedy output', T_TEST, async (t) => {
  for (const [model, prompts] of [[STORIES_ID, CONC_STORIES], [QWEN_ID, CONC_QWEN]]) {
    await t.test(model, async () => {
      const apis = Object.entries(APIS);
      const jobs = prompts.map((p, i) => {
        const [name, fn] = apis[i % apis.length];
        const stream = i % 2 === 0;
        return fn(model, p, { max: N_CONC, stream }).then((got) => ({ p, name, stream, got }));
      });
      const results = await Promise.all(jobs);
      for (const { p, name, stream, got } of results) {
        const r = ref(model, p, N_CONC);
        assert.equal(got.text, r.text, `${name} ${stream ? 'stream' : ''} for ${JSON.stringify(p)}`);
        assert.equal(got.genTokens, r.genTokens);
        assert.equal(got.promptTokens, r.promptTokens);
      }
      assert.ok((await tasksGone(1000)) < 1000);
    });
  }
  await t.test('both instances at once', async () => {
    const jobs = [...CONC_STORIES.slice(0, 4).map((p) => [STORIES_ID, p]), ...CONC_QWEN.slice(0, 4).map((p) => [QWEN_ID, p])]
      .map(([m, p], i) => viaOpenAI(m, p, { max: N_CONC, stream: i % 2 === 1 }).then((g) => [m, p, g]));
    for (const [m, p, g] of await Promise.all(jobs)) assert.equal(g.text, ref(m, p, N_CONC).text);
  });
});

// The runner is stopped while six streams queue up, one at a time, so their
// order is known. Idle SSE streams must get ': keep-alive' comments every
// 10 s (as during a long prefill), NDJSON none; once resumed the requests run
// first come first served, each with its exact output.
test('queued behind a stalled runner: keep-alive every 10 s, FIFO order, exact outputs', { timeout: 60000 }, async (t) => {
  const content = {
    openai: '"content"', claude: 'text_delta', responses: 'output_text.delta', ollama: '"content":"',
  };
  const specs = CONC_FIFO.map((p, i) => {
    const kind = ['openai', 'claude', 'responses', 'ollama'][i % 4];
    const body = kind === 'responses'
      ? { model: STORIES_ID, input: p, max_output_tokens: N_FIFO, temperature: 0, stream: true }
      : kind === 'ollama'
        ? { model: STORIES_ID, messages: [{ role: 'user', content: p }], options: { temperature: 0, num_predict: N_FIFO } }
        : { ...chatBody(STORIES_ID, p, N_FIFO), stream: true };
    const pth = { openai: '/v1/chat/completions', claude: '/v1/messages', responses: '/v1/responses', ollama: '/ollama/api/chat' }[kind];
    return { kind, p, pth, body };
  });
  const streams = [];
  await noTasksLeft();
  const logMark = (await D.getJson(base, '/events/page')).count;
  await withRunnerPaused(async () => {
    for (const [i, sp] of specs.entries()) {
      streams.push(await D.openStream(base, sp.pth, sp.body));
      await waitTaskCount(i + 1);
    }
    const lastOpen = Date.now();
    await sleep(11500);
    assert.ok(Date.now() - lastOpen >= 11000);
    await t.test('SSE streams: keep-alive comments while idle; NDJSON: none', () => {
      streams.forEach((s, i) => {
        const kind = specs[i].kind;
        const kas = s.pieces.filter((x) => x.text.includes(': keep-alive'));
        assert.ok(!s.text.includes(content[kind]), `${kind}: no tokens while the runner is stopped`);
        if (kind === 'ollama') {
          assert.equal(kas.length, 0);
        } else {
          assert.ok(s.text.startsWith(': keep-alive\n\n'), `${kind} starts with a keep-alive`);
          const n = (s.text.match(/: keep-alive\n\n/g) ?? []).length;
          assert.ok(n >= 2, `${kind}: ${n} keep-alive comments after ${Date.now() - s.t0} ms idle`);
          const late = kas.filter((x) => x.t >= 9000);
          assert.ok(late.length >= 1, `${kind}: a keep-alive after ~10 s (at ${kas.map((x) => x.t)})`);
        }
      });
    });
  });
  await Promise.all(streams.map((s) => s.rest()));
  await t.test('every request gets its exact greedy output', () => {
    streams.forEach((s, i) => {
      const { kind, p } = specs[i];
      let text;
      if (kind === 'ollama') {
        text = s.text.trimEnd().split('\n').map((l) => JSON.parse(l).message.content).join('');
      } else {
        const d = sseData(s.text);
        text = kind === 'openai' ? d.map((x) => x.choices[0].delta.content ?? '').join('')
          : kind === 'claude' ? d.filter((x) => x.type === 'content_block_delta').map((x) => x.delta.text).join('')
            : d.filter((x) => x.type === 'response.output_text.delta').map((x) => x.delta).join('');
      }
      assert.equal(text, ref(STORIES_ID, p, N_FIFO).text, `${kind} ${JSON.stringify(p)}`);
    });
  });
  await t.test('first come, first served', async () => {
    // The order the runner finished them in, from the daemon's own event log
    // (client-side arrival times can reorder under CPU load): each task's
    // Complete event must come in the order the tasks were created.
    // (the last Complete event may trail the client's [DONE] by a moment:
    // the runner's Done frame follows its final chunk)
    // The log keeps no prompts (params are redacted), so the tasks are
    // known by order: each request was opened only once the previous one's
    // task existed, so the k-th TaskCreated since the mark is request k.
    let created = [], completed = [];
    for (const t1 = Date.now(); ;) {
      created = []; completed = [];
      for (const e of await D.getJson(base, `/events?since=${logMark}`)) {
        if (e.TaskCreated?.task?.TextGeneration) {
          assert.deepEqual(e.TaskCreated.task.TextGeneration.taskParams, { redacted: true }, 'no prompt in the log');
          if (created.length < CONC_FIFO.length) created.push({ i: created.length, taskId: e.TaskCreated.taskId });
        } else if (e.TaskStatusUpdated?.taskStatus === 'Complete') {
          const c = created.find((x) => x.taskId === e.TaskStatusUpdated.taskId);
          if (c) completed.push(c.i);
        }
      }
      if (completed.length >= CONC_FIFO.length || Date.now() - t1 > 3000) break;
      await sleep(20);
    }
    assert.deepEqual(created.map((c) => c.i), CONC_FIFO.map((_, i) => i), 'created in the order sent');
    assert.deepEqual(completed, CONC_FIFO.map((_, i) => i), 'completed in the order created');
    // and no file of the event log holds a prompt (log, snapshots, archives)
    const dir = path.join(daemon.dataDir, 'event_log/master');
    for (const f of await fsp.readdir(dir)) {
      const bytes = await fsp.readFile(path.join(dir, f));
      for (const p of CONC_FIFO) assert.ok(!bytes.includes(p), `${f} holds the prompt ${JSON.stringify(p)}`);
    }
  });
});

// ---- runner crash -------------------------------------------------------------------------

test('runner killed mid-request: every client gets an error naming the exit; the runner is recreated', T_TEST, async (t) => {
  const qwenPids = D.runnerPids(daemon.pid, 'qwen3-q4g64');
  assert.equal(qwenPids.length, 1, 'found the qwen runner process');
  const sse = (pth, body) => D.openStream(base, pth, { ...body, stream: true });
  const queuedKinds = {
    'claude stream': () => sse('/v1/messages', chatBody(STORIES_ID, 'hi', 50)),
    'responses stream': () => sse('/v1/responses', { model: STORIES_ID, input: 'hi', max_output_tokens: 50 }),
    'ollama stream': () => D.openStream(base, '/ollama/api/chat', { model: STORIES_ID, messages: [{ role: 'user', content: 'hi' }], options: { num_predict: 50 } }),
    'openai non-stream': () => D.rawPost(base, '/v1/chat/completions', chatBody(STORIES_ID, 'hi', 50)),
    'claude non-stream': () => D.rawPost(base, '/v1/messages', chatBody(STORIES_ID, 'hi', 50)),
    'ollama non-stream': () => D.rawPost(base, '/ollama/api/generate', { model: STORIES_ID, prompt: 'hi', stream: false }),
  };
  const RX = /runner exited \(signal 9\)/;
  const checkQueued = async (name, h) => {
    const r = h.rest ? { status: h.status, text: await h.rest() } : await h;
    if (name === 'claude stream') {
      const e = D.parseSse(r.text).find((x) => x.event === 'error');
      assert.ok(e, `${name}: an error event`);
      assert.equal(JSON.parse(e.data).type, 'error');
      assert.match(JSON.parse(e.data).error.message, RX);
    } else if (name === 'responses stream') {
      const d = sseData(r.text);
      assert.equal(d.at(-1).type, 'response.failed');
      assert.equal(d.at(-1).response.status, 'failed');
      assert.match(d.at(-1).response.error.message, RX);
      d.forEach((x, i) => assert.equal(x.sequence_number, i));
    } else if (name === 'ollama stream') {
      const last = JSON.parse(r.text.trimEnd().split('\n').at(-1));
      assert.match(last.error, RX, r.text);
    } else {
      assert.equal(r.status, 500, `${name}: ${r.text}`);
      const j = JSON.parse(r.text);
      if (name.startsWith('openai')) { assert.match(j.error.message, RX); assert.equal(j.error.code, 500); }
      else if (name.startsWith('claude')) { assert.equal(j.type, 'error'); assert.match(j.error.message, RX); }
      else assert.match(j.error, RX);
    }
  };
  // the request that is running when the runner dies, in each family
  const running = {
    'openai SDK stream': async (kill) => {
      const s = await openai.chat.completions.create({ ...chatBody(STORIES_ID, P.stories, LONG), stream: true });
      const it = s[Symbol.asyncIterator]();
      for (let i = 0; i < 3; i++) assert.equal((await it.next()).done, false);
      await kill();
      await assert.rejects(async () => { for (;;) if ((await it.next()).done) break; },
        (e) => e instanceof OpenAI.APIError && RX.test(e.message));
    },
    'claude SDK stream': async (kill) => {
      const s = anthropic.messages.stream(chatBody(STORIES_ID, P.stories, LONG));
      let n = 0;
      await assert.rejects(async () => {
        for await (const ev of s) if (ev.type === 'content_block_delta' && ++n === 3) await kill();
      }, (e) => e instanceof Anthropic.APIError && RX.test(e.message));
    },
    // responses.stream() accumulates the items: a failed response must hold
    // whole items (it threw a TypeError on the null an open message left)
    'responses SDK stream': async (kill) => {
      const s = openai.responses.stream({ model: STORIES_ID, input: P.stories, max_output_tokens: LONG, temperature: 0 });
      let n = 0, failed = null, itemDone = null;
      for await (const ev of s) {
        if (ev.type === 'response.output_text.delta' && ++n === 3) await kill();
        if (ev.type === 'response.output_item.done') itemDone = ev.item;
        if (ev.type === 'response.failed') failed = ev;
      }
      assert.ok(failed, 'a response.failed event');
      assert.match(failed.response.error.message, RX);
      assert.equal(itemDone?.status, 'incomplete', 'the open message is done as incomplete');
      const fin = await s.finalResponse();
      assert.equal(fin.status, 'failed');
      assert.match(fin.error.message, RX);
      fin.output.forEach((item) => assert.equal(typeof item.type, 'string'));
      assert.equal(fin.output.find((x) => x.type === 'message').status, 'incomplete');
      assert.ok(fin.output_text.length > 0, 'the text before the crash is kept');
    },
    'responses raw stream': async (kill) => {
      const s = await sse('/v1/responses', { model: STORIES_ID, input: P.stories, max_output_tokens: LONG, temperature: 0 });
      await s.until((b) => b.includes('output_text.delta'));
      await kill();
      await s.rest();
      const d = sseData(s.text);
      assert.equal(d.at(-1).type, 'response.failed', d.map((x) => x.type).slice(-5).join(','));
      assert.match(d.at(-1).response.error.message, RX);
    },
    // Ollama streams end with an {"error": ...} line, which the official client raises
    'ollama client stream': async (kill) => {
      const it = await ollama.chat({ model: STORIES_ID, messages: [{ role: 'user', content: P.stories }], stream: true,
        options: { temperature: 0, num_predict: LONG } });
      let n = 0;
      await assert.rejects(async () => { for await (const part of it) if (++n === 3) await kill(); },
        (e) => RX.test(e.message));
    },
    'ollama raw stream': async (kill) => {
      const s = await D.openStream(base, '/ollama/api/generate', { model: STORIES_ID, prompt: P.stories,
        options: { temperature: 0, num_predict: LONG } });
      await s.until((b) => b.split('\n').length > 4);
      await kill();
      await s.rest();
      const lines = s.text.trimEnd().split('\n').map((l) => JSON.parse(l));
      assert.match(lines.at(-1).error, RX, s.text.slice(-300));
      lines.slice(0, -1).forEach((l) => assert.equal(l.done, false));
    },
  };
  for (const [name, run] of Object.entries(running)) {
    await t.test(`${name} running, others queued`, async (t2) => {
      await noTasksLeft();
      const pid = storiesRunner();
      const queued = {};
      const kill = async () => {
        for (const [q, open] of Object.entries(queuedKinds)) queued[q] = open();
        await waitTaskCount(1 + Object.keys(queuedKinds).length);
        process.kill(pid, 'SIGKILL');
      };
      await run(kill);
      for (const [q, h] of Object.entries(queued)) await t2.test(q, async () => checkQueued(q, await h));
      // recreated: Ready again in a new process, serving the same output
      await D.waitReady(base, STORIES_ID, 10000, { tolerateFailed: true });
      const pid2 = storiesRunner();
      assert.notEqual(pid2, pid, 'a new runner process');
      assert.ok((await tasksGone(1000)) < 1000, 'no task left behind');
      const got = await viaClaude(STORIES_ID, P.stories, { max: N_PARITY, stream: true });
      assert.equal(got.text, ref(STORIES_ID, P.stories, N_PARITY).text);
    });
  }
  await t.test('the other instance is untouched', async () => {
    assert.deepEqual(D.runnerPids(daemon.pid, 'qwen3-q4g64'), qwenPids);
    const gotQ = await viaOpenAI(QWEN_ID, P.qwen, { max: N_PARITY });
    assert.equal(gotQ.text, ref(QWEN_ID, P.qwen, N_PARITY).text);
  });
});

// ---- instance deletion and lifecycle ----------------------------------------------------------

// Deleting an instance ends its running request (cancelled: finish stop) and
// fails the queued one, at once; then the model is not served any more.
test('a mixture-of-experts model (qwen3_moe, MLX q4 experts) serves exo run\'s text, and leaves', T_TEST, async () => {
  await noTasksLeft();
  const dir = await D.buildMoeModel(path.join(tmp, 'models'));
  const ref = await D.exoRun(dir, P.qwen, { maxTokens: 16 });
  await D.placeInstance(base, D.MOE_ID);
  for (const stream of [false, true]) {
    const r = await viaOpenAI(D.MOE_ID, P.qwen, { max: 16, stream });
    assert.equal(r.text, ref.text, `stream ${stream}`);
    assert.equal(r.genTokens, ref.genTokens);
    assert.equal(r.promptTokens, ref.promptTokens);
  }
  const st = await D.getJson(base, '/state');
  const [id] = Object.entries(st.instances).find(([, v]) => Object.values(v)[0].shardAssignments.modelId === D.MOE_ID);
  assert.equal((await fetch(`${base}/instance/${id}`, { method: 'DELETE' })).status, 200);
  for (let i = 0; i < 200 && (await D.getJson(base, '/state')).instances[id]; i++) await sleep(10);
});

test('DELETE /instance: open streams end, the model is no longer served (404)', T_TEST, async () => {
  await noTasksLeft();
  const st = await D.getJson(base, '/state');
  const [id] = Object.entries(st.instances).find(([, v]) => Object.values(v)[0].shardAssignments.modelId === QWEN_ID);
  const running = await D.openStream(base, '/v1/chat/completions', { ...chatBody(QWEN_ID, P.qwen, LONG), stream: true });
  await running.until((b) => sseData(b).length >= 5);
  const queued = await D.openStream(base, '/v1/messages', { ...chatBody(QWEN_ID, P.qwen, LONG), stream: true });
  await waitTaskCount(2);
  assert.ok(!running.done, 'still generating');
  const t0 = Date.now();
  const r = await fetch(`${base}/instance/${id}`, { method: 'DELETE' });
  assert.equal(r.status, 200);
  const j = await r.json();
  assert.equal(j.instance_id, id);
  await Promise.all([running.rest(), queued.rest()]);
  assert.ok(Date.now() - t0 < 1000, `streams ended ${Date.now() - t0} ms after the delete`);
  const fin = sseData(running.text).at(-1);
  assert.ok(fin.error || ['stop', 'cancelled'].includes(fin.choices?.[0]?.finish_reason), JSON.stringify(fin));
  if (!fin.error) assert.ok(fin.usage.completion_tokens < LONG);
  const qe = D.parseSse(queued.text).find((e) => e.event === 'error');
  assert.ok(qe, `the queued request gets an error event: ${queued.text.slice(-300)}`);
  for (let i = 0; i < 200; i++) {
    const st2 = await D.getJson(base, '/state');
    if (!st2.instances[id]) break;
    await sleep(10);
  }
  assert.equal((await D.getJson(base, '/state')).instances[id], undefined);
  assert.equal((await fetch(`${base}/instance/${id}`)).status, 404);
  await assert.rejects(openai.chat.completions.create(chatBody(QWEN_ID, 'hi', 2)), (e) => e.status === 404);
  for (let i = 0; i < 300 && D.runnerPids(daemon.pid, 'qwen3-q4g64').length; i++) await sleep(10);
  assert.deepEqual(D.runnerPids(daemon.pid, 'qwen3-q4g64'), [], 'its runner exited');
  assert.ok((await tasksGone(1000)) < 1000);
  const ps = await ollama.ps();
  assert.deepEqual(ps.models.map((x) => x.name), [STORIES_ID]);
});

test('a second daemon on the same data dir exits 1', T_TEST, async () => {
  const d2 = D.spawnDaemon({ dataDir: daemon.dataDir, modelsDir: path.join(tmp, 'models') });
  const t = setTimeout(() => d2.proc.kill('SIGKILL'), 10000);
  const { code } = await d2.exited;
  clearTimeout(t);
  assert.equal(code, 1, d2.stderr);
  assert.ok(!/API listening/.test(d2.stderr));
  // the first one is unaffected
  assert.equal((await D.rawPost(base, '/v1/chat/completions', chatBody(STORIES_ID, 'hi', 2))).status, 200);
});

test('SIGTERM: open streams end, the daemon exits 0 and releases the data dir', T_TEST, async () => {
  const s = await D.openStream(base, '/v1/chat/completions', { ...chatBody(STORIES_ID, P.stories, LONG), stream: true });
  assert.ok(await s.until((b) => b.includes('"content"')));
  const runners = D.runnerPids(daemon.pid);
  assert.ok(runners.length >= 1);
  const t0 = Date.now();
  daemon.proc.kill('SIGTERM');
  const kill = setTimeout(() => daemon.proc.kill('SIGKILL'), 10000);
  const { code, signal } = await daemon.exited;
  clearTimeout(kill);
  assert.equal(signal, null, `exited by ${signal}`);
  assert.equal(code, 0, daemon.stderr.slice(-2000));
  assert.ok(Date.now() - t0 < 5000, `shutdown took ${Date.now() - t0} ms`);
  await s.rest();
  const d = sseData(s.text);
  assert.match(d.at(-1).error?.message ?? '', /shutting down/, `the stream ends with an error: ${s.text.slice(-300)}`);
  const alive = runners.filter((pid) => { try { process.kill(pid, 0); return true; } catch { return false; } });
  assert.deepEqual(alive, [], 'no runner left behind');
  // the pid-file lock is released: a new daemon starts on the same data dir
  const d3 = await D.startDaemon({ dataDir: daemon.dataDir, modelsDir: path.join(tmp, 'models') });
  const nodeId = await D.getJson(d3.base, '/node_id');
  assert.equal(typeof nodeId, 'string');
  const { code: c3 } = await d3.stop('SIGTERM');
  assert.equal(c3, 0);
});
