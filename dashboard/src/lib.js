// The dashboard's pure logic: formatting, the SSE parser for OpenAI chat
// streams, the reducer that turns stream events into an assistant message,
// and the mapping of GET /state, GET /cluster, GET /instance/previews and
// GET /v1/models into view models (the cluster's nodes, the topology graph's
// geometry, where each instance's shards run, the placement options, the
// models with their download status, the downloads of every node).
// Nothing here touches the DOM, the network or the clock (times are passed
// in), so all of it is unit-tested under node (dashboard/test/).

// ---- formatting --------------------------------------------------------------------

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** 1536 -> "1.5 KiB"; null / NaN / negative -> "—". */
export function formatBytes(bytes, digits = 1) {
  if (typeof bytes !== 'number' || !Number.isFinite(bytes) || bytes < 0) return '—';
  let v = bytes;
  let u = 0;
  while (v >= 1024 && u < BYTE_UNITS.length - 1) {
    v /= 1024;
    u++;
  }
  if (u === 0) return `${Math.round(v)} B`;
  // 1023.96 KiB would print as "1024.0 KiB": carry it into the next unit.
  if (Number(v.toFixed(digits)) >= 1024 && u < BYTE_UNITS.length - 1) {
    v /= 1024;
    u++;
  }
  return `${v.toFixed(v >= 100 ? 0 : digits)} ${BYTE_UNITS[u]}`;
}

/** "1.1 / 23.5 GiB" (one unit when both share it), "512 MiB / 23.5 GiB", "— / 23.5 GiB". */
export function formatUsedOfTotal(used, total) {
  const u = formatBytes(used);
  const t = formatBytes(total);
  const [uv, uu] = u.split(' ');
  const [, tu] = t.split(' ');
  return uu && uu === tu ? `${uv} / ${t}` : `${u} / ${t}`;
}

/** /v1/models' storage_size_megabytes (MiB, as exo's Memory.in_mb) -> bytes. */
export function megabytesToBytes(mb) {
  return typeof mb === 'number' && Number.isFinite(mb) && mb >= 0 ? mb * 1024 * 1024 : null;
}

/** 0.4567 -> "46%". */
export function formatPercent(fraction) {
  if (typeof fraction !== 'number' || !Number.isFinite(fraction)) return '—';
  return `${Math.round(Math.min(1, Math.max(0, fraction)) * 100)}%`;
}

/** Tokens per second: 12.345 -> "12.3", 1234.5 -> "1,235", 0.1234 -> "0.12". */
export function formatRate(tps) {
  if (typeof tps !== 'number' || !Number.isFinite(tps) || tps < 0) return '—';
  if (tps >= 1000) return Math.round(tps).toLocaleString('en-US');
  if (tps >= 10) return tps.toFixed(1);
  return tps.toFixed(2);
}

/** 850 -> "850 ms", 1500 -> "1.50 s", 75000 -> "1m 15s". */
export function formatDuration(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
  const s = Math.round(ms / 1000);
  return `${Math.floor(s / 60)}m ${s % 60}s`;
}

/** 131072 -> "131k", 4096 -> "4k", 512 -> "512". */
export function formatContext(n) {
  if (typeof n !== 'number' || !Number.isFinite(n) || n <= 0) return '—';
  if (n >= 1024 * 1024) return `${Math.round(n / (1024 * 1024))}M`;
  if (n >= 1000) return `${Math.round(n / 1024)}k`;
  return String(n);
}

/** A count for people: 950 -> "950", 12345 -> "12.3k", 4567890 -> "4.6M". */
export function formatCount(n) {
  if (typeof n !== 'number' || !Number.isFinite(n) || n < 0) return '—';
  if (n >= 999500) return `${n >= 1e7 ? Math.round(n / 1e6) : (n / 1e6).toFixed(1).replace(/\.0$/, '')}M`;
  if (n >= 1000) return `${(n / 1e3).toFixed(1).replace(/\.0$/, '')}k`;
  return String(Math.round(n));
}

/** A uuid shortened for display: "25d2d2b1-3cc0-…" -> "25d2d2b1". */
export function shortId(id) {
  if (typeof id !== 'string') return '';
  const dash = id.indexOf('-');
  return dash > 0 ? id.slice(0, dash) : id.slice(0, 8);
}

// ---- errors --------------------------------------------------------------------------

/**
 * The message of an error response body: exo's `{"error": {"message"}}`,
 * FastAPI's `{"detail": "..." | [{msg}]}`, a plain `{"message"}`, else the
 * text itself, else "HTTP <status>".
 */
export function errorMessageFromBody(status, bodyText) {
  const fallback = status ? `HTTP ${status}` : 'request failed';
  if (typeof bodyText !== 'string' || !bodyText.trim()) return fallback;
  let body;
  try {
    body = JSON.parse(bodyText);
  } catch {
    const t = bodyText.trim();
    return t.length > 300 ? `${t.slice(0, 300)}…` : t;
  }
  return errorMessageFromJson(body) || fallback;
}

/** The message of an already-parsed error object, or null. */
export function errorMessageFromJson(body) {
  if (!body || typeof body !== 'object') return typeof body === 'string' && body ? body : null;
  const e = body.error;
  if (typeof e === 'string' && e) return e;
  if (e && typeof e === 'object') {
    if (typeof e.message === 'string' && e.message) return e.message;
    if (typeof e.type === 'string' && e.type) return e.type;
  }
  if (typeof body.detail === 'string' && body.detail) return body.detail;
  if (Array.isArray(body.detail)) {
    const msgs = body.detail
      .map((d) => (d && typeof d.msg === 'string' ? d.msg : typeof d === 'string' ? d : null))
      .filter(Boolean);
    if (msgs.length) return msgs.join('; ');
  }
  if (typeof body.message === 'string' && body.message) return body.message;
  return null;
}

// ---- server-sent events ----------------------------------------------------------------

/**
 * An incremental parser of a text/event-stream (the WHATWG "event stream
 * interpretation"), fed chunks as they come off the wire (strings or
 * Uint8Arrays; a multi-byte character or a CRLF may be split between
 * chunks). push() and end() return the complete items seen so far:
 *   {type: 'event', event, data, id}   a dispatched event (data lines joined by \n)
 *   {type: 'comment', text}            a ":" line (exo sends keep-alives,
 *                                      prefill progress and stats this way)
 */
export class SSEParser {
  constructor() {
    this.buf = '';
    this.data = [];
    this.eventType = '';
    this.lastId = '';
    this.decoder = null;
  }

  push(chunk) {
    if (typeof chunk !== 'string') {
      if (!this.decoder) this.decoder = new TextDecoder('utf-8');
      chunk = this.decoder.decode(chunk, { stream: true });
    }
    this.buf += chunk;
    return this.drain(false);
  }

  /** The stream ended: a last line without its newline, and an event
   * without its blank line, still count (lenient; the spec drops them). */
  end() {
    if (this.decoder) this.buf += this.decoder.decode();
    const out = this.drain(true);
    if (this.buf) {
      this.line(this.buf, out);
      this.buf = '';
    }
    this.dispatch(out);
    return out;
  }

  drain(final) {
    const out = [];
    let start = 0;
    const s = this.buf;
    for (let i = 0; i < s.length; i++) {
      const c = s.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      if (c === 13) {
        // A CR at the end of the chunk may be the first half of a CRLF.
        if (i + 1 === s.length && !final) break;
        this.line(s.slice(start, i), out);
        if (s.charCodeAt(i + 1) === 10) i++;
      } else {
        this.line(s.slice(start, i), out);
      }
      start = i + 1;
    }
    this.buf = s.slice(start);
    return out;
  }

  line(line, out) {
    if (line === '') {
      this.dispatch(out);
      return;
    }
    if (line.charCodeAt(0) === 58 /* ':' */) {
      out.push({ type: 'comment', text: line.slice(line.charCodeAt(1) === 32 ? 2 : 1) });
      return;
    }
    const colon = line.indexOf(':');
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? '' : line.slice(colon + 1);
    if (value.charCodeAt(0) === 32) value = value.slice(1);
    if (field === 'data') this.data.push(value);
    else if (field === 'event') this.eventType = value;
    else if (field === 'id' && !value.includes('\0')) this.lastId = value;
    // "retry" and unknown fields are ignored.
  }

  dispatch(out) {
    if (this.data.length) {
      out.push({
        type: 'event',
        event: this.eventType || 'message',
        data: this.data.join('\n'),
        id: this.lastId,
      });
    }
    this.data = [];
    this.eventType = '';
  }
}

// ---- OpenAI chat stream -> assistant message -----------------------------------------

/**
 * One SSE item of a /v1/chat/completions stream as an action:
 *   {kind: 'keepalive'} | {kind: 'prefill', processed, total}
 *   {kind: 'stats', stats} (exo's ": generation_stats {...}")
 *   {kind: 'done'} ("[DONE]") | {kind: 'error', message}
 *   {kind: 'delta', content, reasoning, toolCalls, finishReason, usage, model}
 *   {kind: 'ignore'} (anything else: unknown comments, empty chunks)
 */
export function chatActionFromSSE(item) {
  if (!item) return { kind: 'ignore' };
  if (item.type === 'comment') {
    const text = item.text.trim();
    if (text === 'keep-alive' || text === 'keepalive' || text === '') return { kind: 'keepalive' };
    const m = /^([a-z_]+)\s+(\{.*\})$/s.exec(text);
    if (!m) return { kind: 'ignore' };
    let body;
    try {
      body = JSON.parse(m[2]);
    } catch {
      return { kind: 'ignore' };
    }
    if (m[1] === 'prefill_progress') {
      return {
        kind: 'prefill',
        processed: Number(body.processed_tokens) || 0,
        total: Number(body.total_tokens) || 0,
      };
    }
    if (m[1] === 'generation_stats') return { kind: 'stats', stats: body };
    return { kind: 'ignore' };
  }
  if (item.type !== 'event') return { kind: 'ignore' };
  const data = item.data.trim();
  if (data === '[DONE]') return { kind: 'done' };
  let body;
  try {
    body = JSON.parse(data);
  } catch {
    return { kind: 'error', message: `malformed stream data: ${data.slice(0, 120)}` };
  }
  if (!body || typeof body !== 'object') return { kind: 'ignore' };
  if (body.error !== undefined && body.error !== null) {
    return { kind: 'error', message: errorMessageFromJson(body) || 'generation failed' };
  }
  const choice = Array.isArray(body.choices) ? body.choices[0] : undefined;
  const delta = (choice && (choice.delta || choice.message)) || {};
  const action = {
    kind: 'delta',
    content: typeof delta.content === 'string' ? delta.content : '',
    reasoning:
      typeof delta.reasoning_content === 'string'
        ? delta.reasoning_content
        : typeof delta.reasoning === 'string'
          ? delta.reasoning
          : '',
    toolCalls: Array.isArray(delta.tool_calls) ? delta.tool_calls : [],
    finishReason: (choice && choice.finish_reason) || null,
    usage: body.usage && typeof body.usage === 'object' ? body.usage : null,
    model: typeof body.model === 'string' ? body.model : null,
  };
  if (
    !action.content &&
    !action.reasoning &&
    !action.toolCalls.length &&
    !action.finishReason &&
    !action.usage
  ) {
    return { kind: 'ignore' };
  }
  return action;
}

/** A fresh assistant message, streaming since `now` (ms). */
export function newAssistantMessage(model, now) {
  return {
    role: 'assistant',
    model: model || null,
    content: '',
    reasoning: '',
    toolCalls: [],
    status: 'streaming', // streaming | done | stopped | error
    error: null,
    finishReason: null,
    usage: null,
    serverStats: null,
    prefill: null, // {processed, total} while the prompt is being processed
    tokens: 0, // deltas seen (one per token in exo's streams)
    startedAt: now,
    firstTokenAt: null,
    lastTokenAt: null,
    endedAt: null,
  };
}

/** The message after one action at time `now`; never mutates `msg`. */
export function reduceAssistant(msg, action, now) {
  if (!action || action.kind === 'ignore' || action.kind === 'keepalive') return msg;
  const m = { ...msg };
  switch (action.kind) {
    case 'prefill':
      if (m.firstTokenAt === null) m.prefill = { processed: action.processed, total: action.total };
      return m;
    case 'stats':
      m.serverStats = action.stats;
      return m;
    case 'error':
      m.error = action.message;
      m.status = 'error';
      m.prefill = null;
      m.endedAt = m.endedAt ?? now;
      return m;
    case 'done':
      if (m.status === 'streaming') m.status = 'done';
      m.prefill = null;
      m.endedAt = m.endedAt ?? now;
      return m;
    case 'delta': {
      const produced = action.content || action.reasoning || action.toolCalls.length;
      if (produced) {
        m.tokens += 1;
        if (m.firstTokenAt === null) m.firstTokenAt = now;
        m.lastTokenAt = now;
        m.prefill = null;
      }
      if (action.content) m.content += action.content;
      if (action.reasoning) m.reasoning += action.reasoning;
      if (action.toolCalls.length) m.toolCalls = mergeToolCalls(m.toolCalls, action.toolCalls);
      if (action.finishReason) m.finishReason = action.finishReason;
      if (action.usage) m.usage = action.usage;
      if (action.model && !m.model) m.model = action.model;
      return m;
    }
    default:
      return msg;
  }
}

/** OpenAI streams tool calls in pieces keyed by index; exo sends each whole. */
function mergeToolCalls(prev, parts) {
  const out = prev.map((t) => ({ ...t }));
  for (const p of parts) {
    const idx = typeof p.index === 'number' ? p.index : out.length;
    const fn = p.function || {};
    const cur = out[idx];
    if (!cur) {
      out[idx] = { id: p.id || '', name: fn.name || '', arguments: fn.arguments || '' };
    } else {
      if (p.id) cur.id = p.id;
      if (fn.name) cur.name += fn.name;
      if (fn.arguments) cur.arguments += fn.arguments;
    }
  }
  return out.filter(Boolean);
}

/** The message once the stream is over: stopped by the user, or cut off. */
export function finishAssistant(msg, how, now, message) {
  const m = { ...msg, prefill: null, endedAt: msg.endedAt ?? now };
  if (how === 'stopped') {
    if (m.status === 'streaming') m.status = 'stopped';
  } else if (how === 'error') {
    m.status = 'error';
    m.error = message || m.error || 'request failed';
  } else if (m.status === 'streaming') {
    // The connection closed without [DONE].
    if (m.finishReason) m.status = 'done';
    else {
      m.status = 'error';
      m.error = 'the stream ended unexpectedly';
    }
  }
  return m;
}

/**
 * Speed of a (finished or streaming) message from usage and timing:
 * {tokens, tps, ttftMs, promptTokens, elapsedMs, serverTps, serverPromptTps}.
 * tps is the decode rate: the tokens after the first over the time since the
 * first; when they all came at once (tiny models) it is tokens / total time.
 */
export function messageStats(msg, now) {
  const usage = msg.usage || {};
  const tokens =
    typeof usage.completion_tokens === 'number' ? usage.completion_tokens : msg.tokens;
  const end = msg.endedAt ?? msg.lastTokenAt ?? now ?? msg.startedAt;
  const elapsedMs = Math.max(0, end - msg.startedAt);
  const ttftMs = msg.firstTokenAt !== null ? msg.firstTokenAt - msg.startedAt : null;
  let tps = null;
  if (msg.firstTokenAt !== null && tokens > 0) {
    const last = msg.lastTokenAt ?? end;
    const decodeMs = last - msg.firstTokenAt;
    if (tokens > 1 && decodeMs >= 20) tps = ((tokens - 1) * 1000) / decodeMs;
    else if (elapsedMs > 0) tps = (tokens * 1000) / elapsedMs;
  }
  const s = msg.serverStats || {};
  return {
    tokens,
    tps,
    ttftMs,
    elapsedMs,
    promptTokens: typeof usage.prompt_tokens === 'number' ? usage.prompt_tokens : null,
    serverTps: typeof s.generation_tps === 'number' ? s.generation_tps : null,
    serverPromptTps: typeof s.prompt_tps === 'number' ? s.prompt_tps : null,
  };
}

/** "20 tokens · 35.2 tok/s · TTFT 120 ms" (pieces that are known). */
export function formatMessageStats(stats) {
  const parts = [];
  parts.push(`${stats.tokens} token${stats.tokens === 1 ? '' : 's'}`);
  if (stats.tps !== null) parts.push(`${formatRate(stats.tps)} tok/s`);
  if (stats.ttftMs !== null) parts.push(`TTFT ${formatDuration(stats.ttftMs)}`);
  return parts.join(' · ');
}

// ---- chat requests -------------------------------------------------------------------

/** The conversation as OpenAI messages: failed/empty assistant turns are dropped. */
export function toApiMessages(conversation, systemPrompt) {
  const out = [];
  if (typeof systemPrompt === 'string' && systemPrompt.trim()) {
    out.push({ role: 'system', content: systemPrompt.trim() });
  }
  for (const m of conversation) {
    if (m.role === 'user') out.push({ role: 'user', content: m.content });
    else if (m.role === 'assistant' && m.content) out.push({ role: 'assistant', content: m.content });
  }
  return out;
}

/** The body of POST /v1/chat/completions. */
export function buildChatRequest(model, conversation, options = {}) {
  const body = {
    model,
    messages: toApiMessages(conversation, options.systemPrompt),
    stream: true,
    stream_options: { include_usage: true },
  };
  const t = Number(options.temperature);
  if (options.temperature !== undefined && options.temperature !== '' && Number.isFinite(t) && t >= 0) {
    body.temperature = t;
  }
  const mt = Number(options.maxTokens);
  if (options.maxTokens !== undefined && options.maxTokens !== '' && Number.isInteger(mt) && mt > 0) {
    body.max_tokens = mt;
  }
  return body;
}

// ---- GET /state -> view models -------------------------------------------------------

/** exo's external tagging: {"Tag": {...}} -> [tag, body]; "Tag" -> [tag, {}]. */
export function unwrapTagged(v) {
  if (typeof v === 'string') return [v, {}];
  if (!v || typeof v !== 'object' || Array.isArray(v)) return [null, {}];
  const keys = Object.keys(v);
  if (keys.length !== 1) return [null, v];
  const body = v[keys[0]];
  return [keys[0], body && typeof body === 'object' ? body : {}];
}

const RUNNER_PHASES = {
  RunnerIdle: ['Idle', 'starting'],
  RunnerConnecting: ['Connecting', 'starting'],
  RunnerConnected: ['Connected', 'starting'],
  RunnerLoading: ['Loading', 'loading'],
  RunnerLoaded: ['Loaded', 'loading'],
  RunnerWarmingUp: ['Warming up', 'loading'],
  RunnerReady: ['Ready', 'ready'],
  RunnerRunning: ['Running', 'running'],
  RunnerShuttingDown: ['Shutting down', 'stopping'],
  RunnerShutdown: ['Shut down', 'stopping'],
  RunnerFailed: ['Failed', 'failed'],
};

/**
 * A runner status (tagged) as {tag, label, phase, progress, detail, error}:
 * phase is starting | loading | ready | running | stopping | failed |
 * unknown; progress is 0..1 while it loads (null when not applicable).
 */
export function runnerStatusView(status) {
  if (status === undefined || status === null) {
    return { tag: null, label: 'Pending', phase: 'starting', progress: 0, detail: '', error: null };
  }
  const [tag, body] = unwrapTagged(status);
  const known = tag && RUNNER_PHASES[tag];
  const label = known ? known[0] : tag ? tag.replace(/^Runner/, '').replace(/([a-z])([A-Z])/g, '$1 $2') : 'Unknown';
  const phase = known ? known[1] : 'unknown';
  const view = { tag, label, phase, progress: null, detail: '', error: null };
  if (tag === 'RunnerLoading') {
    const loaded = Number(body.layersLoaded ?? body.layers_loaded) || 0;
    const total = Number(body.totalLayers ?? body.total_layers) || 0;
    view.progress = total > 0 ? Math.min(1, loaded / total) : 0;
    view.detail = total > 0 ? `${loaded}/${total} layers` : '';
  } else if (tag === 'RunnerLoaded' || tag === 'RunnerWarmingUp') {
    view.progress = 1;
  } else if (phase === 'starting') {
    view.progress = 0;
  } else if (tag === 'RunnerFailed') {
    view.error = body.errorMessage ?? body.error_message ?? 'runner failed';
    if (typeof view.error !== 'string') view.error = JSON.stringify(view.error);
  }
  return view;
}

// Everything below reads data from the network: any field may be missing,
// null or of the wrong type (older daemons, nodes without GPUs, a State
// caught half-way through a node joining), and ids are used as Map keys,
// never as plain-object keys (an id "__proto__" must stay an id).

const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const objOf = (v) => (isObj(v) ? v : {});
const strOf = (v) => (typeof v === 'string' && v ? v : null);
const numOf = (v) => (typeof v === 'number' && Number.isFinite(v) ? v : null);
const clamp01 = (v) => Math.min(1, Math.max(0, v));
const own = (o, k) => (isObj(o) && Object.prototype.hasOwnProperty.call(o, k) ? o[k] : undefined);

// The node_* maps of the State, and lastSeen, keyed by node id.
const NODE_MAPS = [
  'nodeIdentities',
  'nodeMemory',
  'nodeDisk',
  'nodeSystem',
  'nodeNetwork',
  'nodeGpus',
  'nodeBackends',
  'nodeModels',
  'lastSeen',
];

/**
 * The cluster's node ids. nodeIdentities lists the members: a node that
 * times out leaves it (and every other node_* map), so when the State has it,
 * it alone decides. A State without it (an older daemon) falls back to every
 * node any node_* map, lastSeen or the topology mentions.
 */
export function clusterNodeIds(state) {
  const st = objOf(state);
  if (isObj(st.nodeIdentities)) return Object.keys(st.nodeIdentities);
  const ids = new Set();
  for (const key of NODE_MAPS) for (const id of Object.keys(objOf(st[key]))) ids.add(id);
  const topo = objOf(st.topology);
  if (Array.isArray(topo.nodes)) for (const id of topo.nodes) if (strOf(id)) ids.add(id);
  return [...ids];
}

/**
 * The name to show for each node (a Map id -> name): its friendly name, with
 * its short id added when several nodes share the name (every VM of a test
 * rig is "vm"), its short id when it has none.
 */
export function nodeNames(state) {
  const st = objOf(state);
  const idents = objOf(st.nodeIdentities);
  const base = new Map();
  const count = new Map();
  for (const id of clusterNodeIds(st)) {
    const name = strOf(objOf(own(idents, id)).friendlyName) || shortId(id);
    base.set(id, name);
    count.set(name, (count.get(name) || 0) + 1);
  }
  const out = new Map();
  for (const [id, name] of base) {
    out.set(id, count.get(name) > 1 && name !== shortId(id) ? `${name} (${shortId(id)})` : name);
  }
  return out;
}

function inBytes(mem) {
  if (typeof mem === 'number') return Number.isFinite(mem) && mem >= 0 ? mem : null;
  if (isObj(mem)) {
    const v = mem.inBytes ?? mem.in_bytes;
    if (typeof v === 'number' && Number.isFinite(v) && v >= 0) return v;
  }
  return null;
}

/** {total, available} (either may be null) as {total, available, used, fraction}. */
function usage(total, available) {
  const used = total !== null && available !== null ? Math.max(0, total - available) : null;
  return { total, available, used, fraction: used !== null && total ? clamp01(used / total) : null };
}

function namesOf(list) {
  if (!Array.isArray(list)) return [];
  return list.map((x) => (typeof x === 'string' ? x : unwrapTagged(x)[0])).filter((x) => typeof x === 'string' && x);
}

/**
 * The cluster's nodes, this node first, then by name:
 * [{id, shortId, name, displayName, isSelf, isMaster, cpuCount, cpuModel, os,
 *   backends, ramTotal, ramAvailable, ramUsed, usedFraction,
 *   diskTotal, diskAvailable, diskUsed, diskFraction,
 *   gpus: [{index, name, memoryTotal, memoryUsed, usedFraction}], weightRoom
 *   (free memory plus the GPUs' free memory: where placement puts weights),
 *   models, interfaces: [{name, ip, kind}], apiPort, clusterPort, lastSeen,
 *   runnerCount}].
 * name is the friendly name (or the short id); displayName tells apart
 * nodes with the same name. masterId comes from GET /cluster (the State does
 * not say who the master is).
 */
function weightRoom(ramAvailable, gpus) {
  const free = gpus.reduce((sum, g) => sum + (g.memoryTotal !== null && g.memoryUsed !== null
    ? Math.max(0, g.memoryTotal - g.memoryUsed) : 0), 0);
  return ramAvailable === null && !free ? null : (ramAvailable || 0) + free;
}

export function buildNodesView(state, selfId, masterId = null) {
  const st = objOf(state);
  const names = nodeNames(st);
  const runnersPerNode = new Map();
  for (const inst of Object.values(objOf(st.instances))) {
    const [, body] = unwrapTagged(inst);
    const sa = objOf(body.shardAssignments ?? body.shard_assignments);
    for (const n of shardNodes(sa).values()) {
      runnersPerNode.set(n, (runnersPerNode.get(n) || 0) + 1);
    }
  }
  const at = (key, id) => own(st[key], id);
  const nodes = clusterNodeIds(st).map((id) => {
    const ident = objOf(at('nodeIdentities', id));
    const mem = objOf(at('nodeMemory', id));
    const sys = objOf(at('nodeSystem', id));
    const disk = objOf(at('nodeDisk', id));
    const net = objOf(at('nodeNetwork', id));
    const ram = usage(inBytes(mem.ramTotal ?? mem.ram_total), inBytes(mem.ramAvailable ?? mem.ram_available));
    const dsk = usage(inBytes(disk.total), inBytes(disk.available));
    const gpuList = at('nodeGpus', id);
    const gpus = (Array.isArray(gpuList) ? gpuList : []).map((g, i) => {
      if (!isObj(g)) return null;
      const total = inBytes(g.memoryTotal ?? g.memory_total);
      const used = inBytes(g.memoryUsed ?? g.memory_used);
      return {
        index: numOf(g.index) ?? i,
        name: strOf(g.name) || 'GPU',
        memoryTotal: total,
        memoryUsed: used,
        usedFraction: total && used !== null ? clamp01(used / total) : null,
      };
    }).filter(Boolean);
    const models = at('nodeModels', id);
    const seen = at('lastSeen', id);
    return {
      id,
      shortId: shortId(id),
      name: strOf(ident.friendlyName) || shortId(id),
      displayName: names.get(id) || shortId(id),
      isSelf: id === selfId,
      isMaster: !!masterId && id === masterId,
      cpuCount: numOf(sys.cpuCount) ?? numOf(ident.cpuCount),
      cpuModel: strOf(sys.cpuModel ?? sys.cpu_model),
      os: strOf(sys.os),
      backends: namesOf(at('nodeBackends', id)),
      ramTotal: ram.total,
      ramAvailable: ram.available,
      ramUsed: ram.used,
      usedFraction: ram.fraction,
      diskTotal: dsk.total,
      diskAvailable: dsk.available,
      diskUsed: dsk.used,
      diskFraction: dsk.fraction,
      gpus,
      // what placement may fill with weights: free memory and the GPUs' free memory
      weightRoom: weightRoom(ram.available, gpus),
      models: Array.isArray(models) ? models.filter((m) => typeof m === 'string' && m).sort() : [],
      interfaces: (Array.isArray(net.interfaces) ? net.interfaces : []).filter(isObj).map((f) => ({
        name: strOf(f.name) || '',
        ip: strOf(f.ip) || '',
        kind: strOf(f.kind) || '',
      })),
      apiPort: numOf(net.apiPort) || null,
      clusterPort: numOf(net.clusterPort) || null,
      lastSeen: typeof seen === 'string' ? seen : null,
      runnerCount: runnersPerNode.get(id) || 0,
    };
  });
  nodes.sort((a, b) => (b.isSelf - a.isSelf) || a.name.localeCompare(b.name) || a.id.localeCompare(b.id));
  return nodes;
}

// ---- GET /cluster --------------------------------------------------------------------

/**
 * GET /cluster of the node serving the page as
 * {nodeId, namespace, masterId, masterName, isMaster, electing, caughtUp,
 *  sessionClock, clusterPort, peers: [{id, name, known, remote, dialed, rttUs}]},
 * or null without one (an older daemon). Peers are by name; `known` is false
 * for a peer the State does not list (yet).
 */
export function buildClusterView(cluster, nodes) {
  if (!isObj(cluster)) return null;
  const byId = new Map((nodes || []).map((n) => [n.id, n]));
  const nameOf = (id) => (byId.has(id) ? byId.get(id).displayName : shortId(id));
  const masterId = strOf(cluster.masterNodeId);
  const peers = (Array.isArray(cluster.peers) ? cluster.peers : [])
    .filter((p) => isObj(p) && strOf(p.nodeId))
    .map((p) => ({
      id: p.nodeId,
      name: nameOf(p.nodeId),
      known: byId.has(p.nodeId),
      remote: strOf(p.remote) || '',
      dialed: typeof p.dialed === 'boolean' ? p.dialed : null,
      rttUs: numOf(p.rttUs) !== null && p.rttUs >= 0 ? p.rttUs : null,
    }))
    .sort((a, b) => a.name.localeCompare(b.name) || a.id.localeCompare(b.id));
  return {
    nodeId: strOf(cluster.nodeId),
    namespace: strOf(cluster.namespace),
    masterId,
    masterName: masterId ? nameOf(masterId) : null,
    isMaster: cluster.isMaster === true,
    electing: cluster.electionInProgress === true,
    caughtUp: cluster.caughtUp !== false,
    sessionClock: numOf(cluster.sessionClock),
    clusterPort: numOf(cluster.clusterPort),
    peers,
  };
}

// ---- the topology --------------------------------------------------------------------

/** Microseconds: 130 -> "130 µs", 1500 -> "1.5 ms", 25300 -> "25 ms", 2.5e6 -> "2.50 s". */
export function formatLatency(us) {
  if (typeof us !== 'number' || !Number.isFinite(us) || us < 0) return '—';
  if (Math.round(us) < 1000) return `${Math.round(us)} µs`;
  const ms = us / 1000;
  if (Number(ms.toFixed(1)) < 10) return `${ms.toFixed(1)} ms`;
  if (Math.round(ms) < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(2)} s`;
}

const BIT_UNITS = ['bit/s', 'kbit/s', 'Mbit/s', 'Gbit/s', 'Tbit/s'];

/** Three significant digits: 284, 28.4, 2.84 (never "100.0" or "1000"). */
function sig3(v) {
  if (Math.round(v) >= 100) return String(Math.round(v));
  if (Number(v.toFixed(1)) >= 10) return v.toFixed(1);
  return v.toFixed(2);
}

/** BITS per second, in decimal units: 283665094 -> "284 Mbit/s", 1.65e9 -> "1.65 Gbit/s". */
export function formatBandwidth(bps) {
  if (typeof bps !== 'number' || !Number.isFinite(bps) || bps < 0) return '—';
  if (Math.round(bps) < 1000) return `${Math.round(bps)} bit/s`;
  let v = bps;
  let u = 0;
  while (u < BIT_UNITS.length - 1 && Number(sig3(v)) >= 1000) {
    v /= 1000;
    u++;
  }
  return `${sig3(v)} ${BIT_UNITS[u]}`;
}

/** The link's speed class, for its color: unknown | slow (<100 Mbit/s) |
 * medium (<1 Gbit/s) | fast (<10 Gbit/s) | fastest. */
export function bandwidthTier(bps) {
  if (typeof bps !== 'number' || !Number.isFinite(bps) || bps < 0) return 'unknown';
  if (bps < 1e8) return 'slow';
  if (bps < 1e9) return 'medium';
  if (bps < 1e10) return 'fast';
  return 'fastest';
}

/** The stroke width of a link: 1.5 up to 100 Mbit/s, +1.5 per factor of 10, 6 from 100 Gbit/s. */
export function edgeWidth(bps) {
  if (typeof bps !== 'number' || !Number.isFinite(bps) || bps <= 0) return 1.5;
  const steps = Math.min(3, Math.max(0, Math.log10(bps / 1e8)));
  return Math.round((1.5 + 1.5 * steps) * 100) / 100;
}

/** One measured connection of topology.connections, or null when it is not one. */
function connectionOf(c) {
  if (!isObj(c)) return null;
  const source = strOf(c.source);
  const sink = strOf(c.sink);
  if (!source || !sink || source === sink) return null;
  const lat = numOf(c.latencyUs ?? c.latency_us);
  const bw = numOf(c.bandwidthBps ?? c.bandwidth_bps);
  return {
    source,
    sink,
    address: strOf(c.address) || '',
    latencyUs: lat !== null && lat >= 0 ? lat : null,
    bandwidthBps: bw !== null && bw >= 0 ? bw : null,
  };
}

/** Best first: a measured bandwidth before none, higher bandwidth, then a
 * measured latency before none, lower latency, then by address. */
export function compareConnections(a, b) {
  const ab = a.bandwidthBps;
  const bb = b.bandwidthBps;
  if ((ab === null) !== (bb === null)) return ab === null ? 1 : -1;
  if (ab !== null && ab !== bb) return bb - ab;
  const al = a.latencyUs;
  const bl = b.latencyUs;
  if ((al === null) !== (bl === null)) return al === null ? 1 : -1;
  if (al !== null && al !== bl) return al - bl;
  return a.address < b.address ? -1 : a.address > b.address ? 1 : 0;
}

/**
 * The links between the given nodes, one per pair that measured anything,
 * from topology.connections (directed: measured by the source, one per
 * address): [{a, b, ab, ba, best, latencyUs, bandwidthBps, count}]. a comes
 * before b in nodeIds; ab is a's measurements of b, best first (one per
 * address), ba is b's of a; best is the better of the two directions' best,
 * and gives the link its latency and bandwidth. Connections to nodes not in
 * nodeIds (gone) and to themselves are dropped.
 */
export function buildLinks(topology, nodeIds) {
  const conns = Array.isArray(topology) ? topology : objOf(topology).connections;
  const index = new Map((nodeIds || []).map((id, i) => [id, i]));
  const pairs = new Map();
  for (const raw of Array.isArray(conns) ? conns : []) {
    const c = connectionOf(raw);
    if (!c || !index.has(c.source) || !index.has(c.sink)) continue;
    const forward = index.get(c.source) < index.get(c.sink);
    const a = forward ? c.source : c.sink;
    const b = forward ? c.sink : c.source;
    const key = `${a}\u0000${b}`;
    let p = pairs.get(key);
    if (!p) pairs.set(key, (p = { a, b, ab: new Map(), ba: new Map() }));
    const dir = forward ? p.ab : p.ba;
    const prev = dir.get(c.address);
    if (!prev || compareConnections(c, prev) < 0) dir.set(c.address, c);
  }
  const links = [...pairs.values()].map((p) => {
    const ab = [...p.ab.values()].sort(compareConnections);
    const ba = [...p.ba.values()].sort(compareConnections);
    const best = [ab[0], ba[0]].filter(Boolean).sort(compareConnections)[0];
    return {
      a: p.a,
      b: p.b,
      ab,
      ba,
      best,
      latencyUs: best.latencyUs,
      bandwidthBps: best.bandwidthBps,
      count: ab.length + ba.length,
    };
  });
  links.sort((x, y) => index.get(x.a) - index.get(y.a) || index.get(x.b) - index.get(y.b));
  return links;
}

/**
 * n points on a circle, as large as fits in width x height less padX / padY
 * on each side, centered on their bounding box: one in the middle, two side
 * by side, three or more clockwise from the top. [{x, y}], to 0.1.
 */
export function circleLayout(n, width, height, padX = 0, padY = 0) {
  if (!(n > 0)) return [];
  const cx = width / 2;
  const cy = height / 2;
  const round = (v) => Math.round(v * 10) / 10;
  if (n === 1) return [{ x: round(cx), y: round(cy) }];
  const start = n === 2 ? Math.PI : -Math.PI / 2;
  const unit = [];
  for (let i = 0; i < n; i++) {
    const t = start + (2 * Math.PI * i) / n;
    // cos/sin of multiples of 90 degrees are not exactly 0 in floating point
    unit.push({ x: Math.abs(Math.cos(t)) < 1e-9 ? 0 : Math.cos(t), y: Math.abs(Math.sin(t)) < 1e-9 ? 0 : Math.sin(t) });
  }
  const xs = unit.map((p) => p.x);
  const ys = unit.map((p) => p.y);
  const spanX = Math.max(...xs) - Math.min(...xs);
  const spanY = Math.max(...ys) - Math.min(...ys);
  const innerW = Math.max(0, width - 2 * padX);
  const innerH = Math.max(0, height - 2 * padY);
  const scale = Math.min(spanX > 1e-9 ? innerW / spanX : Infinity, spanY > 1e-9 ? innerH / spanY : Infinity);
  const midX = (Math.max(...xs) + Math.min(...xs)) / 2;
  const midY = (Math.max(...ys) + Math.min(...ys)) / 2;
  return unit.map((p) => ({ x: round(cx + (p.x - midX) * scale), y: round(cy + (p.y - midY) * scale) }));
}

/**
 * Where each edge's label goes: on its edge, the middle first, then further
 * out, at the first spot whose box (boxW x boxH) overlaps no node (radius
 * nodeR) and no label placed before it; else the spot that overlaps least.
 * segments: [{x1, y1, x2, y2}], nodes: [{x, y}] -> [{x, y}].
 */
export function placeEdgeLabels(segments, nodes, { nodeR = 24, boxW = 64, boxH = 18 } = {}) {
  const placed = [];
  const ts = [0.5, 0.4, 0.6, 0.32, 0.68, 0.25, 0.75];
  // how far two boxes (or a box and a node) overlap, 0 when apart
  const overlap = (x, y, ox, oy, w, h) => Math.max(0, w - Math.abs(x - ox)) * Math.max(0, h - Math.abs(y - oy));
  const cost = (x, y) => {
    let c = 0;
    for (const n of nodes) c += overlap(x, y, n.x, n.y, boxW / 2 + nodeR, boxH / 2 + nodeR);
    for (const p of placed) c += overlap(x, y, p.x, p.y, boxW, boxH);
    return c;
  };
  for (const s of segments) {
    let best = null;
    for (const t of ts) {
      const x = s.x1 + (s.x2 - s.x1) * t;
      const y = s.y1 + (s.y2 - s.y1) * t;
      const c = cost(x, y);
      if (!best || c < best.c) best = { x, y, c };
      if (c === 0) break;
    }
    const p = { x: Math.round(best.x * 10) / 10, y: Math.round(best.y * 10) / 10 };
    placed.push(p);
  }
  return placed;
}

function directionLine(from, to, list) {
  if (!list.length) return `${from} → ${to}: not measured`;
  const b = list[0];
  const parts = [formatLatency(b.latencyUs), formatBandwidth(b.bandwidthBps)].filter((x) => x !== '—');
  const more = list.length > 1 ? ` (best of ${list.length} addresses)` : '';
  return `${from} → ${to}: ${parts.join(', ') || 'no figures'}${b.address ? ` via ${b.address}` : ''}${more}`;
}

/** The tooltip of a link: the pair, then each direction's best connection. */
export function linkTitle(link, names) {
  const an = (names && names.get(link.a)) || shortId(link.a);
  const bn = (names && names.get(link.b)) || shortId(link.b);
  return [`${an} ↔ ${bn}`, directionLine(an, bn, link.ab), directionLine(bn, an, link.ba)].join('\n');
}

/**
 * What the topology SVG draws, from the nodes of buildNodesView and the
 * State's topology: {width, height, nodeR, labels, cx, cy, nodes: [{id, name,
 * shortId, isSelf, isMaster, usedFraction, x, y, above}], links: [{...link,
 * aName, bName, x1, y1, x2, y2, lx, ly, width, tier, label, title}],
 * connections}. above: the node's text goes above it (it is in the top half).
 * labels: false when there are too many nodes for their names to fit.
 */
export function buildTopologyView(state, nodes, { width = 560 } = {}) {
  const list = nodes || [];
  const n = list.length;
  const nodeR = n <= 6 ? 24 : n <= 12 ? 16 : 10;
  const labels = n <= 12;
  const height = n === 0 ? 0 : n <= 2 ? 170 : n === 3 ? 330 : n <= 6 ? 440 : 520;
  const padX = labels ? 70 : nodeR + 8;
  const padY = labels ? nodeR + 48 : nodeR + 8;
  const points = circleLayout(n, width, height, padX, padY);
  const cy = height / 2;
  const viewNodes = list.map((node, i) => ({
    id: node.id,
    name: node.name,
    displayName: node.displayName || node.name,
    shortId: node.shortId || shortId(node.id),
    isSelf: !!node.isSelf,
    isMaster: !!node.isMaster,
    usedFraction: node.usedFraction ?? null,
    x: points[i].x,
    y: points[i].y,
    above: n > 2 && points[i].y < cy - 1,
  }));
  const at = new Map(viewNodes.map((v) => [v.id, v]));
  const names = new Map(list.map((node) => [node.id, node.displayName || node.name || shortId(node.id)]));
  const links = buildLinks(objOf(state).topology, list.map((node) => node.id));
  const segs = links.map((l) => ({ x1: at.get(l.a).x, y1: at.get(l.a).y, x2: at.get(l.b).x, y2: at.get(l.b).y }));
  const spots = placeEdgeLabels(segs, viewNodes, { nodeR });
  return {
    width,
    height,
    nodeR,
    labels,
    nodes: viewNodes,
    links: links.map((l, i) => ({
      ...l,
      aName: names.get(l.a),
      bName: names.get(l.b),
      ...segs[i],
      lx: spots[i].x,
      ly: spots[i].y,
      width: edgeWidth(l.bandwidthBps),
      tier: bandwidthTier(l.bandwidthBps),
      label: l.latencyUs !== null ? formatLatency(l.latencyUs) : formatBandwidth(l.bandwidthBps),
      title: linkTitle(l, names),
    })),
    connections: links.reduce((s, l) => s + l.count, 0),
  };
}

// ---- instances -------------------------------------------------------------------------

const INSTANCE_KINDS = { MlxRingInstance: 'MLX Ring', MlxJacclInstance: 'MLX Jaccl' };
const SHARD_KINDS = {
  PipelineShardMetadata: 'Pipeline',
  TensorShardMetadata: 'Tensor',
  CfgShardMetadata: 'CFG',
};
const ACTIVE_TASK = new Set(['Pending', 'Running']);

function taskStatusOf(task) {
  const [, body] = unwrapTagged(task);
  const s = body.taskStatus ?? body.task_status;
  return typeof s === 'string' ? s : unwrapTagged(s)[0];
}

/**
 * An instance (tagged, as in the State or a placement preview) as
 * {kind, id, modelId, sharding, shards: [{runnerId, nodeId, device, nodeName,
 * nodeGone, shardKind, startLayer, endLayer, nLayers, deviceRank, worldSize,
 * status}]} with the shards by rank. names: nodeNames(); members: the
 * cluster's node ids (a shard on another node is nodeGone); runners: the
 * State's runners (statuses).
 */
/*
 * runner id -> node id of an instance's shardAssignments: each shard's own
 * nodeId (a node with a rank per GPU holds several), else exo's
 * nodeToRunner (one runner a node).
 */
function shardNodes(sa) {
  const out = new Map();
  for (const [n, r] of Object.entries(objOf(sa.nodeToRunner ?? sa.node_to_runner)))
    if (typeof r === 'string') out.set(r, n);
  for (const [r, tagged] of Object.entries(objOf(sa.runnerToShard ?? sa.runner_to_shard))) {
    const [, shard] = unwrapTagged(tagged);
    const n = strOf(shard && (shard.nodeId ?? shard.node_id));
    if (n) out.set(r, n);
  }
  return out;
}

function parseInstance(inst, key, names, members, runners) {
  const [kind, body] = unwrapTagged(inst);
  const sa = objOf(body.shardAssignments ?? body.shard_assignments);
  const rts = objOf(sa.runnerToShard ?? sa.runner_to_shard);
  const nodeOfRunner = shardNodes(sa);
  const runnerIds = new Set([...Object.keys(rts), ...nodeOfRunner.keys()]);
  const shards = [...runnerIds].map((runnerId) => {
    const [shardTag, shard] = unwrapTagged(own(rts, runnerId));
    const nodeId = nodeOfRunner.get(runnerId) || null;
    const num = (a, b) => numOf(shard[a]) ?? numOf(shard[b]);
    return {
      runnerId,
      nodeId,
      device: strOf(shard.device) || null,
      nodeName: nodeId ? names.get(nodeId) || shortId(nodeId) : '—',
      nodeGone: !!nodeId && !members.has(nodeId),
      shardKind: (shardTag && SHARD_KINDS[shardTag]) || shardTag || null,
      startLayer: num('startLayer', 'start_layer'),
      endLayer: num('endLayer', 'end_layer'),
      nLayers: num('nLayers', 'n_layers'),
      deviceRank: num('deviceRank', 'device_rank'),
      worldSize: num('worldSize', 'world_size'),
      status: runnerStatusView(own(runners, runnerId)),
    };
  });
  shards.sort((a, b) => (a.deviceRank ?? 0) - (b.deviceRank ?? 0) || a.runnerId.localeCompare(b.runnerId));
  return {
    kind,
    id: strOf(body.instanceId ?? body.instance_id) || key,
    modelId: strOf(sa.modelId ?? sa.model_id) || '?',
    sharding: strOf(body.sharding) || (shards[0] && shards[0].shardKind) || null,
    shards,
  };
}

/** "layers 0–4 of 28" for the half-open range [start, end) of n. */
export function formatLayers(start, end, n) {
  if (typeof start !== 'number' || typeof end !== 'number') return '';
  const last = Math.max(start, end - 1);
  const of = typeof n === 'number' ? ` of ${n}` : '';
  return last === start ? `layer ${start}${of}` : `layers ${start}–${last}${of}`;
}

/**
 * The instances: [{id, kind, kindLabel, modelId, sharding, phase, label,
 * progress, error, activeTasks, runners: [{runnerId, nodeId, nodeName,
 * nodeGone, shardKind, startLayer, endLayer, nLayers, deviceRank, worldSize,
 * status}]}] sorted by model then id; runners are the shards by rank. The
 * instance's phase: failed if a runner failed, else the least advanced
 * runner's; progress weighs runners by their layers.
 */
export function buildInstancesView(state) {
  const st = objOf(state);
  const names = nodeNames(st);
  const members = new Set(clusterNodeIds(st));
  const tasks = Object.values(objOf(st.tasks));
  const out = [];
  for (const [key, inst] of Object.entries(objOf(st.instances))) {
    const { kind, id, modelId, sharding, shards: rows } = parseInstance(inst, key, names, members, st.runners);
    const order = ['failed', 'stopping', 'unknown', 'starting', 'loading', 'ready', 'running'];
    let phase = rows.length ? 'running' : 'starting';
    let error = null;
    for (const r of rows) {
      if (order.indexOf(r.status.phase) < order.indexOf(phase)) phase = r.status.phase;
      if (r.status.error && !error) error = r.status.error;
    }
    // "running" only says one runner is busy; the instance as a whole is ready.
    if (phase === 'running') phase = 'ready';
    if (phase === 'ready' && rows.some((r) => r.status.phase === 'running')) phase = 'running';
    let weight = 0;
    let done = 0;
    for (const r of rows) {
      const layers = r.startLayer !== null && r.endLayer !== null ? Math.max(1, r.endLayer - r.startLayer) : 1;
      const p = r.status.phase === 'ready' || r.status.phase === 'running' ? 1 : r.status.progress ?? 0;
      weight += layers;
      done += layers * p;
    }
    const labels = {
      failed: 'Failed',
      stopping: 'Shutting down',
      unknown: 'Unknown',
      starting: 'Starting',
      loading: 'Loading',
      ready: 'Ready',
      running: 'Generating',
    };
    const activeTasks = tasks.filter((t) => {
      const [, tb] = unwrapTagged(t);
      return (tb.instanceId || tb.instance_id) === id && ACTIVE_TASK.has(taskStatusOf(t));
    }).length;
    out.push({
      id,
      kind,
      kindLabel: (kind && INSTANCE_KINDS[kind]) || kind || 'Instance',
      modelId,
      sharding,
      phase,
      label: labels[phase],
      progress: phase === 'starting' || phase === 'loading' ? (weight ? done / weight : 0) : null,
      error,
      activeTasks,
      runners: rows,
    });
  }
  out.sort((a, b) => a.modelId.localeCompare(b.modelId) || a.id.localeCompare(b.id));
  return out;
}

/**
 * The instances deleted lately, newest first: [{id, modelId, reason, when}]
 * from /state's deletedInstances (instance id -> {instanceId, modelId,
 * reason, deletedAt}, oldest first). reason and when (Unix ms) are null
 * where the daemon recorded none (instances deleted before it did).
 */
export function buildDeletedInstancesView(state) {
  const out = [];
  for (const [key, d] of Object.entries(objOf(objOf(state).deletedInstances))) {
    if (!isObj(d)) continue;
    const when = typeof d.deletedAt === 'string' ? Date.parse(d.deletedAt) : NaN;
    out.push({
      id: typeof d.instanceId === 'string' ? d.instanceId : key,
      modelId: typeof d.modelId === 'string' ? d.modelId : null,
      reason: typeof d.reason === 'string' && d.reason ? d.reason : null,
      when: Number.isFinite(when) ? when : null,
    });
  }
  return out.reverse();
}

/** How long ago, coarsely: "just now", "42 s ago", "5 min ago", "3 h ago", "2 d ago". */
export function formatAgo(when, now) {
  if (typeof when !== 'number' || typeof now !== 'number' || !Number.isFinite(when) || !Number.isFinite(now)) return '';
  const s = Math.max(0, Math.round((now - when) / 1000));
  if (s < 5) return 'just now';
  if (s < 60) return `${s} s ago`;
  if (s < 3600) return `${Math.floor(s / 60)} min ago`;
  if (s < 86400) return `${Math.floor(s / 3600)} h ago`;
  return `${Math.floor(s / 86400)} d ago`;
}

// ---- placement previews ----------------------------------------------------------------

const META_LABELS = { MlxRing: 'MLX Ring', MlxJaccl: 'MLX Jaccl' };

/** "Pipeline · MLX Ring · 2 nodes". */
export function placementLabel(p) {
  const nodes = typeof p.nodeCount === 'number' ? `${p.nodeCount} node${p.nodeCount === 1 ? '' : 's'}` : null;
  return [p.sharding, META_LABELS[p.instanceMeta] || p.instanceMeta, nodes].filter(Boolean).join(' · ');
}

/**
 * GET /instance/previews?model_id=X as
 * {modelId, valid: [{key, modelId, sharding, instanceMeta, nodeCount, label,
 *   nodes: [{id, name, deltaBytes, ramAvailable, room, fits}], totalBytes, fits,
 *   predictedTps, shards, request}],
 *  invalid: [{error, options: [{key, sharding, instanceMeta, nodeCount, label}]}]}.
 * Valid options come by node count, then sharding and instance meta; invalid
 * ones are grouped by their error (one message often rules out several).
 * request is the body of POST /place_instance that launches the option.
 * nodes (of buildNodesView) give names and free memory; fits is false when
 * a node would need more than it has free, its GPUs' free memory counted
 * (room). nodeCount counts ranks: a node with several GPUs is a rank per GPU.
 */
export function buildPreviewsView(response, nodes, modelId = null) {
  const list = Array.isArray(response) ? response : objOf(response).previews;
  const byId = new Map((nodes || []).map((n) => [n.id, n]));
  const names = new Map((nodes || []).map((n) => [n.id, n.displayName || n.name]));
  const members = new Set(byId.keys());
  const valid = [];
  const groups = new Map();
  const seen = new Set();
  for (const p of Array.isArray(list) ? list : []) {
    if (!isObj(p)) continue;
    const sharding = strOf(p.sharding);
    const instanceMeta = strOf(p.instance_meta ?? p.instanceMeta);
    const nodeCount = numOf(p.node_count ?? p.nodeCount);
    const mid = strOf(p.model_id ?? p.modelId) || modelId;
    const key = `${sharding}/${instanceMeta}/${nodeCount}`;
    const error = p.error === null || p.error === undefined ? null : errorMessageFromJson(p.error) || String(p.error);
    const base = { key, sharding, instanceMeta, nodeCount };
    base.label = placementLabel(base);
    const ranksOn = (inst) => new Set(inst.shards.map((s) => s.nodeId).filter(Boolean)).size;
    if (error !== null || !isObj(p.instance)) {
      const msg = error || 'no placement';
      if (!groups.has(msg)) groups.set(msg, []);
      groups.get(msg).push(base);
      continue;
    }
    if (seen.has(key)) continue;
    seen.add(key);
    const inst = parseInstance(p.instance, '', names, members, {});
    const delta = objOf(p.memory_delta_by_node ?? p.memoryDeltaByNode);
    const nodeIds = new Set([...inst.shards.map((s) => s.nodeId).filter(Boolean), ...Object.keys(delta)]);
    const rows = [...nodeIds].map((id) => {
      const d = own(delta, id);
      const deltaBytes = typeof d === 'number' && Number.isFinite(d) ? d : inBytes(d);
      const ramAvailable = byId.has(id) ? byId.get(id).ramAvailable : null;
      const room = byId.has(id) ? byId.get(id).weightRoom ?? ramAvailable : null;
      return {
        id,
        name: names.get(id) || shortId(id),
        deltaBytes,
        ramAvailable,
        room,
        fits: deltaBytes === null || room === null || deltaBytes <= room,
      };
    });
    const rank = new Map(inst.shards.map((s, i) => [s.nodeId, i]));
    rows.sort((a, b) => (rank.get(a.id) ?? 1e9) - (rank.get(b.id) ?? 1e9) || a.name.localeCompare(b.name));
    const request = { model_id: mid };
    if (sharding) request.sharding = sharding;
    if (instanceMeta) request.instance_meta = instanceMeta;
    if (nodeCount !== null) request.min_nodes = nodeCount;
    // a node with several GPUs takes a rank per GPU: say so where ranks outnumber nodes
    const nodesUsed = ranksOn(inst);
    if (nodesUsed && nodesUsed < inst.shards.length)
      base.label = placementLabel({ ...base, nodeCount: null }) +
        ` · ${inst.shards.length} ranks on ${nodesUsed} node${nodesUsed === 1 ? '' : 's'}`;
    valid.push({
      ...base,
      modelId: mid,
      nodeCount: nodeCount ?? (rows.length || null),
      nodes: rows,
      totalBytes: rows.reduce((s, r) => s + (r.deltaBytes || 0), 0),
      // decode tokens/s the daemon predicts from its nodes' measured
      // bandwidth and links (null: not measured)
      predictedTps: numOf(p.predicted_tokens_per_second ?? p.predictedTokensPerSecond),
      fits: rows.every((r) => r.fits),
      shards: inst.shards,
      request,
    });
  }
  const order = (a, b) =>
    (a.nodeCount ?? 0) - (b.nodeCount ?? 0) ||
    String(a.sharding).localeCompare(String(b.sharding)) ||
    String(a.instanceMeta).localeCompare(String(b.instanceMeta));
  valid.sort(order);
  const invalid = [...groups].map(([error, options]) => ({ error, options: options.sort(order) }));
  return { modelId, valid, invalid };
}

/** Whether an instance (of buildInstancesView) can take a chat request. */
export function isServing(inst) {
  return inst.phase === 'ready' || inst.phase === 'running';
}

/**
 * The chat's model choices: one per model that has an instance,
 * [{modelId, ready, label}] (ready ones first).
 */
export function chatModelOptions(instances, models) {
  const names = {};
  for (const m of models || []) names[m.id] = m.name || m.id;
  const by = new Map();
  for (const inst of instances) {
    const o = by.get(inst.modelId) || { modelId: inst.modelId, ready: false, phase: inst.phase, progress: null };
    if (isServing(inst)) o.ready = true;
    else if (!o.ready) {
      o.phase = inst.phase;
      o.progress = inst.progress;
    }
    by.set(inst.modelId, o);
  }
  return [...by.values()]
    .map((o) => {
      let suffix = '';
      if (!o.ready) {
        suffix =
          o.phase === 'failed'
            ? ' (failed)'
            : o.progress !== null
              ? ` (loading ${formatPercent(o.progress)})`
              : ` (${o.phase})`;
      }
      return { modelId: o.modelId, ready: o.ready, label: `${names[o.modelId] || o.modelId}${suffix}` };
    })
    .sort((a, b) => b.ready - a.ready || a.modelId.localeCompare(b.modelId));
}

/** The model to select: the current one while it still has an instance,
 * else the first ready one, else the first. */
export function pickChatModel(options, current) {
  if (current && options.some((o) => o.modelId === current)) return current;
  const ready = options.find((o) => o.ready);
  return ready ? ready.modelId : options.length ? options[0].modelId : null;
}

/**
 * The models: those of GET /v1/models (the catalogue, the custom cards and
 * what is on disk), then those other nodes have on disk that it does not
 * list (the State's nodeModels; a node without a models dir can still
 * launch them):
 * [{id, name, family, quantization, sizeBytes, contextLength, capabilities,
 *   instances, readyInstances, fits, local, onNodes, status, isCustom,
 *   downloadFraction, downloadFailed, downloadingOn}], those on disk first,
 *   then those downloading, then the downloadable ones, each by name.
 * local: this node lists it; onNodes: the names of the nodes that have it on
 * disk; fits is false when the model is larger than all nodes' available
 * memory together (GPUs' free memory counted). status, downloadFraction, downloadFailed, downloadingOn:
 * modelDownloadState of its card's status and its rows of `downloads`
 * (buildDownloadsView: the State is fresher than the list, reloaded less
 * often).
 */
export function buildModelsView(modelsResponse, instances, nodes, downloads = []) {
  const list = Array.isArray(modelsResponse)
    ? modelsResponse
    : modelsResponse && Array.isArray(modelsResponse.data)
      ? modelsResponse.data
      : [];
  const available = (nodes || []).reduce((s, n) => s + (n.weightRoom ?? n.ramAvailable ?? 0), 0);
  const haveMemory = (nodes || []).some((n) => (n.weightRoom ?? n.ramAvailable ?? null) !== null);
  const where = new Map(); // model id -> names of the nodes with it on disk
  for (const n of nodes || []) {
    for (const id of Array.isArray(n.models) ? n.models : []) {
      if (!where.has(id)) where.set(id, []);
      where.get(id).push(n.displayName || n.name || n.id);
    }
  }
  const local = list.filter((m) => m && typeof m.id === 'string');
  const listed = new Set(local.map((m) => m.id));
  const remote = [...where.keys()].filter((id) => !listed.has(id)).map((id) => ({ id, remote: true }));
  const rowsOf = new Map(); // model id -> its download rows
  for (const r of Array.isArray(downloads) ? downloads : []) {
    if (!r || typeof r.modelId !== 'string') continue;
    if (!rowsOf.has(r.modelId)) rowsOf.set(r.modelId, []);
    rowsOf.get(r.modelId).push(r);
  }
  return local
    .concat(remote)
    .map((m) => {
      const sizeBytes = megabytesToBytes(m.storage_size_megabytes);
      const insts = (instances || []).filter((i) => i.modelId === m.id);
      const dl = modelDownloadState(m.remote === true ? 'downloaded' : m.status, rowsOf.get(m.id) || []);
      return {
        id: m.id,
        name: (typeof m.name === 'string' && m.name) || m.id,
        family: typeof m.family === 'string' ? m.family : '',
        quantization: typeof m.quantization === 'string' ? m.quantization : '',
        sizeBytes,
        contextLength: typeof m.context_length === 'number' ? m.context_length : null,
        capabilities: Array.isArray(m.capabilities) ? m.capabilities.filter((c) => typeof c === 'string') : [],
        instances: insts.length,
        readyInstances: insts.filter(isServing).length,
        fits: !haveMemory || sizeBytes === null || sizeBytes <= available,
        local: m.remote !== true,
        onNodes: where.get(m.id) || [],
        status: dl.status,
        isCustom: m.is_custom === true,
        downloadFraction: dl.fraction,
        downloadFailed: dl.failed,
        downloadingOn: dl.nodes,
      };
    })
    .sort(
      (a, b) =>
        MODEL_STATUS_ORDER.indexOf(a.status) - MODEL_STATUS_ORDER.indexOf(b.status) ||
        a.name.localeCompare(b.name) ||
        a.id.localeCompare(b.id),
    );
}

// ---- downloads and the model catalogue -------------------------------------------------

/** Bytes per second: 1536 -> "1.5 KiB/s", 0 -> "0 B/s"; not a speed -> "—". */
export function formatSpeed(bps) {
  const b = formatBytes(bps);
  return b === '—' ? b : `${b}/s`;
}

/** Time left: 4200 -> "5s" (whole seconds, up), 185000 -> "3m 05s",
 * 7_500_000 -> "2h 05m", 2 days and 3 hours -> "2d 3h"; not a time -> "—". */
export function formatEta(ms) {
  if (typeof ms !== 'number' || !Number.isFinite(ms) || ms < 0) return '—';
  const s = Math.ceil(ms / 1000);
  const pad = (n) => String(n).padStart(2, '0');
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${pad(s % 60)}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${pad(Math.floor((s % 3600) / 60))}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

const HF_PART = /^[A-Za-z0-9._-]+$/;
const HF_ID_MAX = 255; // the daemon keeps ids in 256 bytes

/**
 * A Hugging Face model id typed by the user, checked before it is sent
 * (POST /models/add): {ok: true, id} or {ok: false, error}. Spaces around it
 * and a pasted "https://huggingface.co/org/name" (or "hf.co/...", with a
 * trailing "/") are accepted and give "org/name". The id is org/name, both
 * parts of [A-Za-z0-9._-], neither starting with '.', with no ".." and no
 * "--" (the daemon stores org/name as the directory org--name), as the
 * daemon's own check.
 */
export function validateHfModelId(input) {
  if (typeof input !== 'string') return { ok: false, error: 'Enter a model id: org/name' };
  let id = input.trim();
  const url = /^(?:https?:\/\/)?(?:www\.)?(?:huggingface\.co|hf\.co)\/(.*)$/i.exec(id);
  if (url) id = url[1];
  id = id.replace(/\/+$/, '');
  if (!id) return { ok: false, error: 'Enter a model id: org/name' };
  const parts = id.split('/');
  if (parts.length !== 2 || !parts[0] || !parts[1]) {
    return { ok: false, error: `"${id}" is not of the form org/name` };
  }
  for (const p of parts) {
    if (!HF_PART.test(p)) {
      return { ok: false, error: `"${p}" may only hold letters, digits, ".", "_" and "-"` };
    }
    if (p.startsWith('.')) return { ok: false, error: `"${p}" may not start with "."` };
  }
  if (id.includes('..')) return { ok: false, error: 'a model id may not contain ".."' };
  if (id.includes('--')) return { ok: false, error: 'a model id may not contain "--"' };
  if (id.length > HF_ID_MAX) return { ok: false, error: `a model id is at most ${HF_ID_MAX} characters` };
  return { ok: true, id };
}

/** "org/name" as URL path segments, each encoded: "org/name%20x". */
export function modelPath(modelId) {
  return String(modelId).split('/').map(encodeURIComponent).join('/');
}

const DOWNLOAD_TAGS = {
  DownloadPending: ['pending', 'Queued'],
  DownloadOngoing: ['ongoing', 'Downloading'],
  DownloadCompleted: ['completed', 'Downloaded'],
  DownloadFailed: ['failed', 'Failed'],
};
const DOWNLOAD_ORDER = ['ongoing', 'pending', 'failed', 'completed', 'unknown'];

/** A byte count or a count of files: a finite number >= 0, else 0. */
const count = (v) => (typeof v === 'number' && Number.isFinite(v) && v > 0 ? v : 0);

/**
 * One tagged entry of state.downloads[nodeId] as a row, or null when it is
 * not one: {nodeId, modelId, tag, status (pending | ongoing | completed |
 * failed | unknown), label, total, downloaded, downloadedThisSession,
 * fraction, percent, completedFiles, totalFiles, speed, etaMs, readOnly,
 * errorMessage, startLayer, endLayer, nLayers, partial, modelDirectory}.
 * Byte counts are >= 0 with downloaded <= total; fraction is 0 when the
 * total is not known yet (0), 1 when completed; percent is whole (floored:
 * 100 only once completed). etaMs: the daemon's, else the bytes left over
 * the speed, null when neither is known or it is not downloading.
 */
export function parseDownloadEntry(entry, nodeId) {
  const [tag, body] = unwrapTagged(entry);
  if (!tag || !isObj(entry)) return null;
  const g = (camel, snake) => (body[camel] !== undefined ? body[camel] : body[snake]);
  const modelId = strOf(g('modelId', 'model_id'));
  if (!modelId) return null;
  const [status, label] = DOWNLOAD_TAGS[tag] || ['unknown', tag.replace(/^Download/, '') || tag];
  const total = count(g('total', 'total'));
  let downloaded = count(g('downloaded', 'downloaded'));
  if (total > 0 && downloaded > total) downloaded = total;
  const done = status === 'completed';
  const fraction = done ? 1 : total > 0 ? clamp01(downloaded / total) : 0;
  const percent = done ? 100 : Math.min(99, Math.floor(fraction * 100));
  const speed = count(g('speed', 'speed'));
  const eta = numOf(g('etaMs', 'eta_ms'));
  let etaMs = null;
  if (status === 'ongoing') {
    if (eta !== null && eta > 0) etaMs = eta;
    else if (speed > 0 && total > downloaded) etaMs = ((total - downloaded) / speed) * 1000;
    else if (total > 0 && downloaded >= total) etaMs = 0;
  }
  const startLayer = numOf(g('startLayer', 'start_layer'));
  const endLayer = numOf(g('endLayer', 'end_layer'));
  const nLayers = numOf(g('nLayers', 'n_layers'));
  const err = g('errorMessage', 'error_message');
  return {
    nodeId: strOf(nodeId) || strOf(g('nodeId', 'node_id')) || '',
    modelId,
    tag,
    status,
    label,
    total,
    downloaded,
    downloadedThisSession: count(g('downloadedThisSession', 'downloaded_this_session')),
    fraction,
    percent,
    completedFiles: count(g('completedFiles', 'completed_files')),
    totalFiles: count(g('totalFiles', 'total_files')),
    speed: status === 'ongoing' ? speed : 0,
    etaMs,
    readOnly: g('readOnly', 'read_only') === true,
    errorMessage: typeof err === 'string' ? err : err ? errorMessageFromJson(err) || String(err) : '',
    startLayer,
    endLayer,
    nLayers,
    // a shard of the model (a pipeline stage), not all of its layers
    partial:
      startLayer !== null && endLayer !== null && nLayers !== null && nLayers > 0 && (startLayer > 0 || endLayer < nLayers),
    modelDirectory: strOf(g('modelDirectory', 'model_directory')) || '',
  };
}

/**
 * state.downloads (node id -> [tagged entry], one per model on that node) as
 * the Downloads panel's rows: parseDownloadEntry's fields plus {key,
 * nodeName, nodeGone, layers (text, '' unless partial), files ("3/7", ''
 * when unknown), canCancel (pending or ongoing), canDelete (completed and
 * not read-only), canRetry (failed)}. Downloading first, then queued,
 * failed, completed; then by model and node.
 */
export function buildDownloadsView(state) {
  const st = objOf(state);
  const names = nodeNames(st);
  const rows = [];
  for (const [nodeId, list] of Object.entries(objOf(st.downloads))) {
    const entries = Array.isArray(list) ? list : isObj(list) ? Object.values(list) : [];
    for (const e of entries) {
      const r = parseDownloadEntry(e, nodeId);
      if (!r) continue;
      rows.push({
        ...r,
        key: `${r.nodeId}\u0000${r.modelId}`,
        nodeName: names.get(r.nodeId) || shortId(r.nodeId),
        nodeGone: !names.has(r.nodeId),
        layers: r.partial ? formatLayers(r.startLayer, r.endLayer, r.nLayers) : '',
        files: r.totalFiles > 0 ? `${Math.min(r.completedFiles, r.totalFiles)}/${r.totalFiles}` : '',
        canCancel: r.status === 'pending' || r.status === 'ongoing',
        canDelete: r.status === 'completed' && !r.readOnly,
        canRetry: r.status === 'failed',
      });
    }
  }
  rows.sort(
    (a, b) =>
      DOWNLOAD_ORDER.indexOf(a.status) - DOWNLOAD_ORDER.indexOf(b.status) ||
      a.modelId.localeCompare(b.modelId) ||
      a.nodeName.localeCompare(b.nodeName) ||
      a.nodeId.localeCompare(b.nodeId),
  );
  return rows;
}

/** "1.2 / 4.5 GiB · 12.3 MiB/s · ETA 3m 05s · files 3/7 · layers 0–13 of 28":
 * what is known of a row of parseDownloadEntry (speed and ETA while it
 * downloads, the layers when it is a shard). */
export function downloadDetails(row) {
  const parts = [];
  if (row.total > 0) parts.push(formatUsedOfTotal(row.downloaded, row.total));
  else if (row.downloaded > 0) parts.push(formatBytes(row.downloaded));
  if (row.status === 'ongoing') {
    parts.push(formatSpeed(row.speed));
    if (row.etaMs !== null) parts.push(`ETA ${formatEta(row.etaMs)}`);
  }
  if (row.totalFiles > 0) parts.push(`files ${Math.min(row.completedFiles, row.totalFiles)}/${row.totalFiles}`);
  if (row.partial) parts.push(formatLayers(row.startLayer, row.endLayer, row.nLayers));
  return parts.join(' · ');
}

/** "Downloading 45%", "Queued", "Downloaded", "Failed". */
export function downloadStatusText(row) {
  return row.status === 'ongoing' ? `${row.label} ${row.percent}%` : row.label;
}

/** "2 downloading · 1 queued · 1 failed · 3 done" (the counts not 0). */
export function downloadsSummary(rows) {
  const n = (s) => rows.filter((r) => r.status === s).length;
  return [
    [n('ongoing'), 'downloading'],
    [n('pending'), 'queued'],
    [n('failed'), 'failed'],
    [n('completed'), 'done'],
  ]
    .filter(([k]) => k > 0)
    .map(([k, w]) => `${k} ${w}`)
    .join(' · ');
}

const MODEL_STATUS = new Set(['downloaded', 'downloading', 'downloadable']);
const MODEL_STATUS_ORDER = ['downloaded', 'downloading', 'downloadable'];

/**
 * A model's download status from its card's status (GET /v1/models; a card
 * without one, from an older daemon that lists only what is on disk, is
 * "downloaded") and its rows of buildDownloadsView, which are fresher: a
 * completed download of all its layers makes it downloaded, one under way
 * makes it downloading. {status, fraction (of the downloads under way, all
 * bytes together; null when none), failed (none under way, one failed),
 * nodes (the names of the nodes downloading it)}.
 */
export function modelDownloadState(cardStatus, rows) {
  const list = Array.isArray(rows) ? rows : [];
  const card = MODEL_STATUS.has(cardStatus) ? cardStatus : cardStatus === undefined || cardStatus === null ? 'downloaded' : 'downloadable';
  const active = list.filter((r) => r.status === 'ongoing' || r.status === 'pending');
  const whole = list.some((r) => r.status === 'completed' && !r.partial);
  let status = card;
  if (whole) status = 'downloaded';
  else if (active.length && card !== 'downloaded') status = 'downloading';
  let fraction = null;
  if (active.length) {
    const total = active.reduce((s, r) => s + r.total, 0);
    const done = active.reduce((s, r) => s + r.downloaded, 0);
    fraction = total > 0 ? clamp01(done / total) : 0;
  }
  return {
    status,
    fraction,
    failed: !active.length && status !== 'downloaded' && list.some((r) => r.status === 'failed'),
    nodes: active.map((r) => r.nodeName || shortId(r.nodeId)),
  };
}

/** A model's badge: {text, kind (a pill class)}: "downloaded" (ok),
 * "downloading 45%" (busy; "downloading" when no bytes are known),
 * "download failed" (bad), "downloadable". */
export function modelStatusBadge(status, fraction = null, failed = false) {
  if (status === 'downloaded') return { text: 'downloaded', kind: 'ok' };
  if (status === 'downloading') {
    const pct = typeof fraction === 'number' && Number.isFinite(fraction) ? Math.min(99, Math.floor(clamp01(fraction) * 100)) : null;
    return { text: pct === null ? 'downloading' : `downloading ${pct}%`, kind: 'busy' };
  }
  if (failed) return { text: 'download failed', kind: 'bad' };
  return { text: 'downloadable', kind: '' };
}
