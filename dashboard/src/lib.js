// The dashboard's pure logic: formatting, the SSE parser for OpenAI chat
// streams, the reducer that turns stream events into an assistant message,
// and the mapping of GET /state and GET /v1/models into view models.
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

/** The State's node ids: every node any node_* map or lastSeen mentions. */
function nodeIdsOf(state) {
  const ids = new Set();
  for (const key of ['nodeIdentities', 'nodeMemory', 'nodeBackends', 'nodeSystem', 'lastSeen']) {
    const m = state && state[key];
    if (m && typeof m === 'object') for (const id of Object.keys(m)) ids.add(id);
  }
  return [...ids];
}

function inBytes(mem) {
  if (typeof mem === 'number') return mem;
  if (mem && typeof mem === 'object') {
    const v = mem.inBytes ?? mem.in_bytes;
    if (typeof v === 'number') return v;
  }
  return null;
}

/**
 * The cluster's nodes: [{id, name, isSelf, cpuCount, backends, ramTotal,
 * ramAvailable, ramUsed, usedFraction, lastSeen, runnerCount}], this node
 * first, then by name.
 */
export function buildNodesView(state, selfId) {
  const st = state || {};
  const identities = st.nodeIdentities || {};
  const memory = st.nodeMemory || {};
  const backends = st.nodeBackends || {};
  const lastSeen = st.lastSeen || {};
  const runnersPerNode = {};
  for (const inst of Object.values(st.instances || {})) {
    const [, body] = unwrapTagged(inst);
    const ntr = (body.shardAssignments && body.shardAssignments.nodeToRunner) || {};
    for (const n of Object.keys(ntr)) runnersPerNode[n] = (runnersPerNode[n] || 0) + 1;
  }
  const nodes = nodeIdsOf(st).map((id) => {
    const ident = identities[id] || {};
    const mem = memory[id] || {};
    const ramTotal = inBytes(mem.ramTotal ?? mem.ram_total);
    const ramAvailable = inBytes(mem.ramAvailable ?? mem.ram_available);
    const ramUsed = ramTotal !== null && ramAvailable !== null ? Math.max(0, ramTotal - ramAvailable) : null;
    const b = backends[id];
    return {
      id,
      name: (typeof ident.friendlyName === 'string' && ident.friendlyName) || shortId(id),
      isSelf: id === selfId,
      cpuCount: typeof ident.cpuCount === 'number' ? ident.cpuCount : null,
      backends: Array.isArray(b) ? b.map((x) => (typeof x === 'string' ? x : unwrapTagged(x)[0] || '?')) : [],
      ramTotal,
      ramAvailable,
      ramUsed,
      usedFraction: ramUsed !== null && ramTotal ? ramUsed / ramTotal : null,
      lastSeen: typeof lastSeen[id] === 'string' ? lastSeen[id] : null,
      runnerCount: runnersPerNode[id] || 0,
    };
  });
  nodes.sort((a, b) => (b.isSelf - a.isSelf) || a.name.localeCompare(b.name) || a.id.localeCompare(b.id));
  return nodes;
}

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
 * The instances: [{id, kind, kindLabel, modelId, sharding, phase, label,
 * progress, error, activeTasks, runners: [{runnerId, nodeId, nodeName,
 * shardKind, startLayer, endLayer, nLayers, deviceRank, worldSize, status}]}]
 * sorted by model then id. The instance's phase: failed if a runner failed,
 * else the least advanced runner's; progress weighs runners by their layers.
 */
export function buildInstancesView(state) {
  const st = state || {};
  const runners = st.runners || {};
  const identities = st.nodeIdentities || {};
  const tasks = Object.values(st.tasks || {});
  const out = [];
  for (const [key, inst] of Object.entries(st.instances || {})) {
    const [kind, body] = unwrapTagged(inst);
    const sa = body.shardAssignments || body.shard_assignments || {};
    const id = body.instanceId || body.instance_id || key;
    const rts = sa.runnerToShard || sa.runner_to_shard || {};
    const ntr = sa.nodeToRunner || sa.node_to_runner || {};
    const nodeOfRunner = {};
    for (const [n, r] of Object.entries(ntr)) nodeOfRunner[r] = n;
    const runnerIds = new Set([...Object.keys(rts), ...Object.values(ntr)]);
    const rows = [...runnerIds].map((runnerId) => {
      const [shardTag, shard] = unwrapTagged(rts[runnerId]);
      const nodeId = nodeOfRunner[runnerId] || null;
      const ident = (nodeId && identities[nodeId]) || {};
      const num = (a, b) => (typeof shard[a] === 'number' ? shard[a] : typeof shard[b] === 'number' ? shard[b] : null);
      return {
        runnerId,
        nodeId,
        nodeName: ident.friendlyName || (nodeId ? shortId(nodeId) : '—'),
        shardKind: (shardTag && SHARD_KINDS[shardTag]) || shardTag || null,
        startLayer: num('startLayer', 'start_layer'),
        endLayer: num('endLayer', 'end_layer'),
        nLayers: num('nLayers', 'n_layers'),
        deviceRank: num('deviceRank', 'device_rank'),
        worldSize: num('worldSize', 'world_size'),
        status: runnerStatusView(runners[runnerId]),
      };
    });
    rows.sort((a, b) => (a.deviceRank ?? 0) - (b.deviceRank ?? 0) || a.runnerId.localeCompare(b.runnerId));

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
      modelId: sa.modelId || sa.model_id || '?',
      sharding: body.sharding || (rows[0] && rows[0].shardKind) || null,
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
 * The models of GET /v1/models: [{id, name, family, quantization,
 * sizeBytes, contextLength, capabilities, instances, readyInstances, fits}]
 * by name; fits is false when the model is larger than all nodes' available
 * memory together.
 */
export function buildModelsView(modelsResponse, instances, nodes) {
  const list = Array.isArray(modelsResponse)
    ? modelsResponse
    : modelsResponse && Array.isArray(modelsResponse.data)
      ? modelsResponse.data
      : [];
  const available = (nodes || []).reduce((s, n) => s + (n.ramAvailable || 0), 0);
  const haveMemory = (nodes || []).some((n) => n.ramAvailable !== null && n.ramAvailable !== undefined);
  return list
    .filter((m) => m && typeof m.id === 'string')
    .map((m) => {
      const sizeBytes = megabytesToBytes(m.storage_size_megabytes);
      const insts = (instances || []).filter((i) => i.modelId === m.id);
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
      };
    })
    .sort((a, b) => a.name.localeCompare(b.name) || a.id.localeCompare(b.id));
}
