// Helpers for the end-to-end API suite (api.test.mjs): the fixture model
// directories, greedy references from `exo run`, starting / stopping the real
// daemon on loopback, and small raw-HTTP readers (SSE, NDJSON) that keep the
// exact wire bytes for framing checks.
import { spawn, execFile } from 'node:child_process';
import { promisify } from 'node:util';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const execFileP = promisify(execFile);

export const REPO = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
export const EXO_BIN = process.env.EXO_BIN || path.join(REPO, 'build/exo');
export const THREADS = 1;            // runner and `exo run` use the same thread count
export const CTX = 8192;             // the daemon's --ctx: long streams for cancel / crash tests

export const STORIES_ID = 'karpathy/stories260K';
export const QWEN_ID = 'exo-e2e/qwen3-tiny';
export const MOE_ID = 'exo-e2e/qwen3-moe-tiny';
export const LINEAR_ID = 'exo-e2e/qwen3.5-tiny';
export const SLIDING_ID = 'exo-e2e/gemma3-tiny';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// ---- fixture models --------------------------------------------------------------

// Llama-2 style template for stories260K (it ships none).
const STORIES_TEMPLATE =
  "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] | trim }} [/INST]" +
  "{% else %}{{ m['content'] }}{% endif %}{% endfor %}";

// GPT-2's byte -> printable unicode map (byte-level BPE).
export function bytesToUnicode() {
  const bs = [];
  for (let b = 33; b <= 126; b++) bs.push(b);
  for (let b = 161; b <= 172; b++) bs.push(b);
  for (let b = 174; b <= 255; b++) bs.push(b);
  const cs = bs.slice();
  let n = 0;
  for (let b = 0; b < 256; b++) {
    if (!bs.includes(b)) {
      bs.push(b);
      cs.push(256 + n++);
    }
  }
  const m = new Array(256);
  bs.forEach((b, i) => (m[b] = String.fromCodePoint(cs[i])));
  return m;
}

export const QWEN_SPECIALS = [
  // [content, special] as in Qwen3's tokenizer (think / tool_call are not "special")
  ['<|endoftext|>', true],
  ['<|im_start|>', true],
  ['<|im_end|>', true],
  ['<think>', false],
  ['</think>', false],
  ['<tool_call>', false],
  ['</tool_call>', false],
];
export const QWEN_FIRST_SPECIAL = 256;
const QWEN_VOCAB = 320;

// A byte-level BPE tokenizer.json for a 320-entry vocabulary: ids 0-255 are
// the 256 byte symbols (in byte order), 256-262 Qwen's added tokens, and the
// rest merges of common English pairs, so every id the random model can
// produce decodes to something.
export function qwenTokenizerJson() {
  const b2u = bytesToUnicode();
  const vocab = {};
  b2u.forEach((s, i) => (vocab[s] = i));
  const G = b2u[32]; // 'Ġ'
  const pairs = [
    [G, 't'], ['h', 'e'], ['i', 'n'], ['e', 'r'], ['a', 'n'], [G, 'a'], ['o', 'n'], ['r', 'e'],
    [G, 's'], ['e', 'n'], [G, 'w'], ['a', 't'], ['o', 'r'], [G, 'o'], ['i', 's'], ['e', 's'],
    ['i', 't'], [G, 'c'], [G, 'b'], [G, 'f'], [G, 'm'], [G, 'p'], [G, 'h'], [G, 'd'],
    ['o', 'u'], ['l', 'l'], ['n', 'd'], ['e', 'd'], ['a', 'r'], ['a', 'l'], ['s', 't'], ['l', 'e'],
    ['o', 'm'], ['i', 'c'], [G, 'l'], ['a', 's'], ['r', 'o'], ['c', 'e'], ['v', 'e'], [G, 'i'],
    ['i', 'o'], ['l', 'y'], ['c', 'h'], ['i', 'l'], ['g', 'h'], [G, 'n'], ['u', 't'], ['s', 'e'],
    ['Ġt', 'he'], ['in', 'g'], ['Ġa', 'nd'], ['Ġo', 'f'], ['o', 'w'], ['Ġt', 'o'], [G, 'e'],
    ['l', 'd'], ['e', 't'],
  ];
  const merges = [];
  let id = QWEN_FIRST_SPECIAL + QWEN_SPECIALS.length;
  for (const [a, b] of pairs) {
    if (!(a in vocab) || !(b in vocab)) throw new Error(`merge ${a} ${b}: part not in vocab`);
    if (a + b in vocab) throw new Error(`merge ${a} ${b}: duplicate`);
    vocab[a + b] = id++;
    merges.push(`${a} ${b}`);
  }
  if (id !== QWEN_VOCAB) throw new Error(`vocab has ${id} entries, want ${QWEN_VOCAB}`);
  return {
    version: '1.0',
    truncation: null,
    padding: null,
    added_tokens: QWEN_SPECIALS.map(([content, special], i) => ({
      id: QWEN_FIRST_SPECIAL + i, content, single_word: false, lstrip: false, rstrip: false,
      normalized: false, special,
    })),
    normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges,
    },
  };
}

async function run(file, args, opts = {}) {
  return execFileP(file, args, { maxBuffer: 64 << 20, encoding: 'utf8', ...opts });
}

// Builds MODELS/<org>--<name>/ for stories260K (converted from llama2.c) and
// the qwen3 q4g64 parity fixture with a tokenizer and Qwen3's real template.
export async function buildModels(modelsDir) {
  await fsp.mkdir(modelsDir, { recursive: true });
  const src = path.join(REPO, 'tests/fixtures/stories260K');
  if (!fs.existsSync(path.join(src, 'stories260K.bin')))
    throw new Error(`missing ${src}/stories260K.bin`);
  const stories = path.join(modelsDir, 'karpathy--stories260K');
  await run(EXO_BIN, ['convert-llama2c', path.join(src, 'stories260K.bin'), path.join(src, 'tok512.bin'), stories]);
  await fsp.writeFile(path.join(stories, 'chat_template.jinja'), STORIES_TEMPLATE);

  const fx = path.join(REPO, 'tests/fixtures/qwen3-q4g64');
  const qwen = path.join(modelsDir, 'exo-e2e--qwen3-tiny');
  await fsp.mkdir(qwen);
  await fsp.symlink(path.join(fx, 'model.safetensors'), path.join(qwen, 'model.safetensors'));
  const cfg = JSON.parse(await fsp.readFile(path.join(fx, 'config.json'), 'utf8'));
  const id = (t) => QWEN_FIRST_SPECIAL + QWEN_SPECIALS.findIndex(([c]) => c === t);
  cfg.bos_token_id = id('<|endoftext|>');
  cfg.eos_token_id = id('<|im_end|>'); // as Qwen3: the template's turn end stops generation
  await fsp.writeFile(path.join(qwen, 'config.json'), JSON.stringify(cfg, null, 2));
  await fsp.writeFile(path.join(qwen, 'tokenizer.json'), JSON.stringify(qwenTokenizerJson()));
  const template = await fsp.readFile(path.join(REPO, 'tests/fixtures/chat-templates/Qwen-Qwen3-0.6B.jinja'), 'utf8');
  const added = {};
  QWEN_SPECIALS.forEach(([content, special], i) => {
    added[String(QWEN_FIRST_SPECIAL + i)] = {
      content, lstrip: false, normalized: false, rstrip: false, single_word: false, special,
    };
  });
  await fsp.writeFile(path.join(qwen, 'tokenizer_config.json'), JSON.stringify({
    add_bos_token: false, add_prefix_space: false, added_tokens_decoder: added,
    bos_token: null, eos_token: '<|im_end|>', pad_token: '<|endoftext|>', errors: 'replace',
    model_max_length: 256, tokenizer_class: 'Qwen2Tokenizer', clean_up_tokenization_spaces: false,
    split_special_tokens: false, chat_template: template,
  }, null, 2));
  return { stories, qwen };
}

// MODELS/<dir>/: a parity fixture served with the qwen3-tiny dir's tokenizer
// and chat template (the fixtures share its 320-entry vocabulary), made by
// the test that serves it, so the listing tests see two models.
async function buildFixtureModel(modelsDir, fixture, dirName) {
  const fx = path.join(REPO, 'tests/fixtures', fixture);
  const qwen = path.join(modelsDir, 'exo-e2e--qwen3-tiny');
  const d = path.join(modelsDir, dirName);
  await fsp.mkdir(d);
  await fsp.symlink(path.join(fx, 'model.safetensors'), path.join(d, 'model.safetensors'));
  const cfg = JSON.parse(await fsp.readFile(path.join(fx, 'config.json'), 'utf8'));
  const qcfg = JSON.parse(await fsp.readFile(path.join(qwen, 'config.json'), 'utf8'));
  for (const c of [cfg, cfg.text_config].filter(Boolean)) {
    c.bos_token_id = qcfg.bos_token_id;
    c.eos_token_id = qcfg.eos_token_id;
  }
  await fsp.writeFile(path.join(d, 'config.json'), JSON.stringify(cfg, null, 2));
  for (const f of ['tokenizer.json', 'tokenizer_config.json'])
    await fsp.copyFile(path.join(qwen, f), path.join(d, f));
  return d;
}

// the qwen3_moe q4g64 fixture (its experts stacked as mlx-lm writes them)
export const buildMoeModel = (modelsDir) => buildFixtureModel(modelsDir, 'qwen3_moe-q4g64', 'exo-e2e--qwen3-moe-tiny');
// the qwen3_5 q4g64 fixture: Gated DeltaNet layers with a recurrent state,
// and full-attention ones
export const buildLinearModel = (modelsDir) => buildFixtureModel(modelsDir, 'qwen3_5-q4g64', 'exo-e2e--qwen3.5-tiny');
// the gemma3 q4g64 fixture: sliding-window layers (window 8) whose caches
// are rings, and full-attention ones
export const buildSlidingModel = (modelsDir) => buildFixtureModel(modelsDir, 'gemma3-q4g64', 'exo-e2e--gemma3-tiny');

// ---- greedy references -------------------------------------------------------------

// `exo run DIR --chat PROMPT --temperature 0`: the completion text (exo run
// ends it with one newline), the prompt / generated token counts, the finish
// reason and, with logprobs: N, per token {id, logprob, top: [[id, logprob]...]}.
export async function exoRun(dir, prompt, { maxTokens = 32, system, ctx, temperature = 0, seed, enableThinking,
  logprobs, ignoreEos, tokens: promptIds } = {}) {
  const args = ['run', dir, ...(promptIds ? ['--tokens', promptIds.join(',')] : ['--chat', prompt]),
    '--max-tokens', String(maxTokens), '--temperature', String(temperature), '--threads', String(THREADS), '--stats'];
  if (ignoreEos) args.push('--ignore-eos');
  if (system !== undefined) args.push('--system', system);
  if (ctx) args.push('--ctx', String(ctx));
  if (seed !== undefined) args.push('--seed', String(seed));
  if (enableThinking !== undefined) args.push('--enable-thinking', String(enableThinking));
  if (logprobs) args.push('--logprobs', String(logprobs));
  const out = await run(EXO_BIN, args, { encoding: 'buffer' });
  // the API sends JSON strings, so exo run must print valid UTF-8 too (U+FFFD
  // for broken byte sequences), not raw bytes a lenient decode would hide
  const stdout = new TextDecoder('utf-8', { fatal: true }).decode(out.stdout);
  const stderr = out.stderr.toString('utf8');
  if (!stdout.endsWith('\n')) throw new Error(`exo run output does not end with a newline: ${JSON.stringify(stdout)}`);
  const m = /prompt (\d+) tokens .* generated (\d+) tokens .* finish: (\w+)/.exec(stderr);
  if (!m) throw new Error(`exo run --stats: ${stderr}`);
  const tokens = [];
  for (const lm of stderr.matchAll(/\[token (\d+) logprob (\S+) top:([^\]]*)\]/g)) {
    tokens.push({ id: +lm[1], logprob: +lm[2],
      top: lm[3].trim().split(/\s+/).filter(Boolean).map((x) => x.split(':').map(Number)) });
  }
  return { text: stdout.slice(0, -1), promptTokens: +m[1], genTokens: +m[2], finish: m[3], tokens };
}

// The greedy reference for a whole conversation: the template rendered by
// `exo chat-template`, tokenized without adding special tokens again, then
// `exo run --tokens` (the path `exo run --chat` takes for one user message).
export async function exoRunMessages(dir, messages, { maxTokens = 32 } = {}) {
  const d = await fsp.mkdtemp(path.join(os.tmpdir(), 'exo-e2e-msgs-'));
  try {
    await fsp.writeFile(path.join(d, 'messages.json'), JSON.stringify(messages));
    const { stdout: rendered } = await run(EXO_BIN, ['chat-template', dir, '--messages', path.join(d, 'messages.json'),
      '--add-generation-prompt']);
    await fsp.writeFile(path.join(d, 'prompt.txt'), rendered);
    const { stdout: ids } = await run(EXO_BIN, ['tokenize', dir, '--file', path.join(d, 'prompt.txt'), '--no-special']);
    const tokens = ids.trim().split(/\s+/).map(Number);
    const r = await exoRun(dir, null, { maxTokens, tokens });
    if (r.promptTokens !== tokens.length) throw new Error('exo run --tokens: prompt length');
    return { ...r, rendered };
  } finally {
    await fsp.rm(d, { recursive: true, force: true });
  }
}

// Runs fns with at most `limit` in flight (the machine has 2 cores).
export async function pool(limit, fns) {
  const out = new Array(fns.length);
  let next = 0;
  const worker = async () => {
    while (next < fns.length) {
      const i = next++;
      out[i] = await fns[i]();
    }
  };
  await Promise.all(Array.from({ length: Math.min(limit, fns.length) }, worker));
  return out;
}

// ---- the daemon ------------------------------------------------------------------------

// Every daemon this process started, so none outlives it: on exit (or a
// SIGTERM / SIGINT, e.g. from `timeout`) its runners and then it are killed
// (SIGKILL also ends a runner a test had stopped with SIGSTOP).
const live = new Set();
function killAll() {
  for (const d of live) {
    for (const pid of runnerPids(d.pid)) { try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ } }
    try { d.proc.kill('SIGKILL'); } catch { /* gone */ }
  }
}
process.on('exit', killAll);
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => {
    killAll();
    process.exit(sig === 'SIGINT' ? 130 : 143);
  });
}

export class Daemon {
  constructor(proc, dataDir) {
    this.proc = proc;
    this.dataDir = dataDir;
    this.stderr = '';
    this.port = 0;
    this.exitCode = undefined;
    this.exitSignal = undefined;
    live.add(this);
    this.exited = new Promise((resolve) => {
      proc.on('exit', (code, signal) => {
        live.delete(this);
        this.exitCode = code;
        this.exitSignal = signal;
        resolve({ code, signal });
      });
    });
    proc.stderr.setEncoding('utf8');
    proc.stderr.on('data', (d) => { this.stderr += d; });
    proc.stdout.resume();
  }
  get base() { return `http://127.0.0.1:${this.port}`; }
  get pid() { return this.proc.pid; }

  async stop(signal = 'SIGTERM', timeoutMs = 10000) {
    if (this.exitCode !== undefined || this.exitSignal !== undefined && this.exitSignal !== null) return this.exited;
    this.proc.kill(signal);
    const t = setTimeout(() => this.proc.kill('SIGKILL'), timeoutMs);
    const r = await this.exited;
    clearTimeout(t);
    return r;
  }
}

export function spawnDaemon({ dataDir, modelsDir, ctx = CTX, extra = [] }) {
  // A node of its own: no multicast discovery (other tests' daemons run on
  // this machine too), any free cluster port.
  const args = ['serve', '--api-port', '0', '--host', '127.0.0.1', '--data-dir', dataDir,
    '--models-dir', modelsDir, '--threads', String(THREADS), '--ctx', String(ctx),
    '--no-discovery', '--cluster-port', '0', ...extra];
  const env = { ...process.env };
  delete env.EXO_MODELS_DIRS;
  delete env.EXO_MODELS_READ_ONLY_DIRS;
  const proc = spawn(EXO_BIN, args, { stdio: ['ignore', 'pipe', 'pipe'], env });
  return new Daemon(proc, dataDir);
}

export async function startDaemon(opts, timeoutMs = 15000) {
  const d = spawnDaemon(opts);
  const t0 = Date.now();
  for (;;) {
    const m = /API listening on http:\/\/127\.0\.0\.1:(\d+)/.exec(d.stderr);
    if (m) {
      d.port = +m[1];
      return d;
    }
    if (d.exitCode !== undefined) throw new Error(`exo serve exited ${d.exitCode}: ${d.stderr}`);
    if (Date.now() - t0 > timeoutMs) {
      await d.stop('SIGKILL');
      throw new Error(`exo serve did not start: ${d.stderr}`);
    }
    await sleep(20);
  }
}

export async function getJson(base, p) {
  const r = await fetch(base + p);
  const text = await r.text();
  if (!r.ok) throw new Error(`GET ${p}: ${r.status} ${text}`);
  return JSON.parse(text);
}

export async function postJson(base, p, body) {
  const r = await fetch(base + p, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json;
  try { json = JSON.parse(text); } catch { json = undefined; }
  return { status: r.status, headers: r.headers, text, json };
}

// runner id -> status name ("RunnerReady", ...) of the runners of a model's instances.
export async function runnersOf(base, modelId) {
  const st = await getJson(base, '/state');
  const out = {};
  for (const inst of Object.values(st.instances || {})) {
    const body = Object.values(inst)[0];
    if (body.shardAssignments.modelId !== modelId) continue;
    for (const rid of Object.keys(body.shardAssignments.runnerToShard)) {
      const s = st.runners?.[rid];
      out[rid] = s ? Object.keys(s)[0] : 'none';
    }
  }
  return out;
}

export async function waitReady(base, modelId, timeoutMs = 15000, { tolerateFailed = false } = {}) {
  const t0 = Date.now();
  let last;
  while (Date.now() - t0 < timeoutMs) {
    last = await runnersOf(base, modelId);
    const v = Object.values(last);
    if (v.length && v.every((s) => s === 'RunnerReady')) return Date.now() - t0;
    if (!tolerateFailed && v.some((s) => s === 'RunnerFailed')) throw new Error(`runner failed: ${JSON.stringify(await getJson(base, '/state/runners'))}`);
    await sleep(20);
  }
  throw new Error(`${modelId} not ready after ${timeoutMs} ms: ${JSON.stringify(last)}`);
}

export async function placeInstance(base, modelId) {
  const r = await postJson(base, '/place_instance', { model_id: modelId });
  if (r.status !== 200) throw new Error(`place_instance ${modelId}: ${r.status} ${r.text}`);
  await waitReady(base, modelId);
  return r.json;
}

// The runner processes the daemon started: pids of its children that map
// the given model directory's weights.
export function runnerPids(daemonPid, modelDirName) {
  const pids = [];
  for (const e of fs.readdirSync('/proc')) {
    if (!/^\d+$/.test(e)) continue;
    try {
      const stat = fs.readFileSync(`/proc/${e}/stat`, 'utf8');
      const ppid = +stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1];
      if (ppid !== daemonPid) continue;
      if (!modelDirName || fs.readFileSync(`/proc/${e}/maps`, 'utf8').includes(modelDirName)) pids.push(+e);
    } catch { /* gone meanwhile */ }
  }
  return pids;
}

// ---- raw HTTP readers ----------------------------------------------------------------

// Parses SSE text into {comments[], events[{event, data, raw}]} in order; a
// comment line ": x" becomes {comment: "x"} in `items` too.
export function parseSse(text) {
  const items = [];
  for (const block of text.split('\n\n')) {
    if (!block) continue;
    let event, data = [], comment;
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) comment = line.slice(1).trim();
      else if (line.startsWith('event:')) event = line.slice(6).trim();
      else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
    }
    if (comment !== undefined && !data.length && event === undefined) items.push({ comment });
    else items.push({ event, data: data.join('\n') });
  }
  return items;
}

// POSTs and reads the whole streamed body, recording when each piece came.
export async function rawPost(base, p, body, { headers = {}, signal } = {}) {
  const r = await fetch(base + p, {
    method: 'POST', headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body), signal,
  });
  const text = await r.text();
  return { status: r.status, headers: r.headers, text };
}

// Opens a streaming POST and reads it in the background, keeping the text
// and when each piece arrived (pieces: [{t: ms since open, text}]).
export async function openStream(base, p, body, { signal } = {}) {
  const ac = new AbortController();
  if (signal) signal.addEventListener('abort', () => ac.abort());
  const t0 = Date.now();
  const r = await fetch(base + p, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body), signal: ac.signal,
  });
  const reader = r.body.getReader();
  const dec = new TextDecoder();
  const st = {
    status: r.status, headers: r.headers, text: '', pieces: [], done: false, error: null, t0,
    waiters: new Set(),
  };
  const wake = () => { for (const w of st.waiters) w(); };
  st.finished = (async () => {
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const piece = dec.decode(value, { stream: true });
        st.text += piece;
        st.pieces.push({ t: Date.now() - t0, text: piece });
        wake();
      }
    } catch (e) {
      st.error = e;
    }
    st.done = true;
    wake();
    return st.text;
  })();
  // resolves true once pred(text) holds, false if the stream ended first
  st.until = (pred, timeoutMs = 20000) => new Promise((resolve, reject) => {
    const check = () => {
      if (pred(st.text)) { cleanup(); resolve(true); } else if (st.done) { cleanup(); resolve(false); }
    };
    const timer = setTimeout(() => { cleanup(); reject(new Error(`stream: condition not met in ${timeoutMs} ms; got ${st.text.slice(-300)}`)); }, timeoutMs);
    const cleanup = () => { clearTimeout(timer); st.waiters.delete(check); };
    st.waiters.add(check);
    check();
  });
  st.rest = () => st.finished;
  st.abort = () => { ac.abort(); return st.finished; };
  return st;
}

// The end of a suite: the daemon killed, its and its runners' logs left in
// EXO_E2E_LOG_DIR (where the shell entry point prints them on failure), the
// temp dir removed unless EXO_E2E_KEEP is set.
export async function finish(tmp, daemon) {
  if (daemon && daemon.exitCode === undefined) await daemon.stop('SIGKILL');
  if (tmp && process.env.EXO_E2E_LOG_DIR) {
    await fsp.writeFile(path.join(process.env.EXO_E2E_LOG_DIR, 'daemon.log'), daemon?.stderr ?? '').catch(() => {});
    await fsp.cp(path.join(tmp, 'data/cache/exo_log'), path.join(process.env.EXO_E2E_LOG_DIR, 'exo_log'),
      { recursive: true }).catch(() => {});
  }
  if (tmp && !process.env.EXO_E2E_KEEP) await fsp.rm(tmp, { recursive: true, force: true });
  else if (tmp) console.log(`# kept ${tmp}`);
}

export async function tmpDir(prefix = 'exo-e2e-') {
  return fsp.mkdtemp(path.join(os.tmpdir(), prefix));
}
