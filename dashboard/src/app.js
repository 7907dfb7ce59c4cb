// The exo dashboard: cluster overview, model launcher and chat.
// Plain DOM, no framework. Every piece of text from the daemon or a model is
// set with textContent / text nodes (never innerHTML). The logic that can be
// tested without a browser lives in lib.js.

import {
  SSEParser,
  buildChatRequest,
  buildInstancesView,
  buildModelsView,
  buildNodesView,
  chatActionFromSSE,
  chatModelOptions,
  errorMessageFromBody,
  finishAssistant,
  formatBytes,
  formatContext,
  formatMessageStats,
  formatPercent,
  formatRate,
  isServing,
  messageStats,
  newAssistantMessage,
  pickChatModel,
  reduceAssistant,
  shortId,
} from './lib.js';

const POLL_MS = 2000;
const MODELS_EVERY = 5; // polls between two reloads of /v1/models
const STORE_KEY = 'exo-dashboard-chat';

// API paths are relative to the page (served at "/"), so a reverse proxy
// that mounts the daemon under a prefix keeps working.
const API = {
  state: 'state',
  nodeId: 'node_id',
  models: 'v1/models',
  place: 'place_instance',
  instance: (id) => `instance/${encodeURIComponent(id)}`,
  chat: 'v1/chat/completions',
};

const ui = {
  state: null,
  nodeId: null,
  models: null, // the /v1/models list (raw)
  modelsError: null,
  connected: null, // null: not yet known
  polls: 0,
  launching: new Set(),
  deleting: new Set(),
  launchErrors: new Map(),
  filter: '',
  chat: {
    model: null,
    messages: [],
    streaming: null, // {controller, index}
  },
  views: { nodes: [], instances: [], models: [] },
};

const $ = (id) => document.getElementById(id);
const now = () => (typeof performance !== 'undefined' ? performance.now() : Date.now());

// ---- DOM helpers ---------------------------------------------------------------------

/** h('div', {class: 'x', onclick: f}, 'text', child) — strings become text nodes. */
function h(tag, props, ...children) {
  const el = document.createElement(tag);
  if (props) {
    for (const [k, v] of Object.entries(props)) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = String(v);
      else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else if (k === 'disabled' || k === 'hidden' || k === 'open' || k === 'value' || k === 'title' || k === 'type') {
        el[k] = v;
      } else el.setAttribute(k, String(v));
    }
  }
  appendAll(el, children);
  return el;
}

function appendAll(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.appendChild(typeof c === 'object' ? c : document.createTextNode(String(c)));
  }
}

function progressBar(fraction, extraClass) {
  const fill = h('div', { class: 'fill' });
  const pct = Math.round(Math.min(1, Math.max(0, fraction || 0)) * 1000) / 10;
  fill.style.width = `${pct}%`;
  return h('div', {
    class: extraClass ? `bar ${extraClass}` : 'bar',
    role: 'progressbar',
    'aria-valuemin': 0,
    'aria-valuemax': 100,
    'aria-valuenow': Math.round(pct),
  }, fill);
}

/** Rebuilds `el` only when its view model changed (keeps focus and hover
 * on buttons between polls). */
function renderInto(el, vm, build) {
  const sig = JSON.stringify(vm);
  if (el.__sig === sig) return;
  el.__sig = sig;
  const children = build(vm);
  el.replaceChildren(...[children].flat(Infinity).filter(Boolean));
}

function toast(message, kind = 'error') {
  const box = $('toasts');
  if (!box) return;
  const t = h('div', { class: `toast ${kind}`, role: kind === 'error' ? 'alert' : 'status', text: message });
  const close = () => t.remove();
  t.addEventListener('click', close);
  box.appendChild(t);
  setTimeout(close, kind === 'error' ? 9000 : 4000);
}

// ---- API -----------------------------------------------------------------------------

async function api(method, path, body) {
  let res;
  try {
    res = await fetch(path, {
      method,
      headers: body !== undefined ? { 'Content-Type': 'application/json' } : undefined,
      body: body !== undefined ? JSON.stringify(body) : undefined,
    });
  } catch (e) {
    throw new Error(`cannot reach the exo daemon (${e && e.message ? e.message : e})`);
  }
  const text = await res.text();
  if (!res.ok) throw new Error(errorMessageFromBody(res.status, text));
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    throw new Error(`bad JSON from ${path}`);
  }
}

async function loadModels() {
  try {
    const r = await api('GET', API.models);
    ui.models = r && Array.isArray(r.data) ? r.data : [];
    ui.modelsError = null;
  } catch (e) {
    ui.modelsError = e.message;
  }
}

async function loadNodeId() {
  try {
    const id = await api('GET', API.nodeId);
    if (typeof id === 'string') ui.nodeId = id;
  } catch {
    /* retried on the next reconnect */
  }
}

async function poll() {
  const wasConnected = ui.connected;
  try {
    ui.state = await api('GET', API.state);
    ui.connected = true;
    if (wasConnected !== true || !ui.nodeId) await loadNodeId();
    if (wasConnected !== true || ui.models === null || ui.polls % MODELS_EVERY === 0) await loadModels();
  } catch (e) {
    ui.connected = false;
    ui.connError = e.message;
  }
  ui.polls++;
  render();
}

/** Polls /state every pollMs (after the previous poll ended); returns stop(). */
function startPolling(pollMs) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    try {
      await poll();
    } finally {
      if (!stopped) timer = setTimeout(tick, pollMs);
    }
  };
  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}

// ---- actions -------------------------------------------------------------------------

async function launch(modelId) {
  if (ui.launching.has(modelId)) return;
  ui.launching.add(modelId);
  ui.launchErrors.delete(modelId);
  render();
  try {
    await api('POST', API.place, { model_id: modelId });
    toast(`Launching ${modelId}`, 'ok');
    if (!ui.chat.model) ui.chat.model = modelId;
    await poll();
  } catch (e) {
    ui.launchErrors.set(modelId, e.message);
    toast(`Launch failed: ${e.message}`);
  } finally {
    ui.launching.delete(modelId);
    render();
  }
}

async function removeInstance(id) {
  if (ui.deleting.has(id)) return;
  ui.deleting.add(id);
  render();
  try {
    await api('DELETE', API.instance(id));
    toast(`Deleting instance ${shortId(id)}`, 'ok');
    await poll();
  } catch (e) {
    toast(`Delete failed: ${e.message}`);
  } finally {
    ui.deleting.delete(id);
    render();
  }
}

// ---- rendering: cluster ---------------------------------------------------------------

function render() {
  const st = ui.state;
  ui.views.nodes = st ? buildNodesView(st, ui.nodeId) : [];
  ui.views.instances = st ? buildInstancesView(st) : [];
  ui.views.models = buildModelsView(ui.models || [], ui.views.instances, ui.views.nodes);
  renderHeader();
  renderNodes();
  renderInstances();
  renderModels();
  renderChatModels();
  if (!ui.chat.messages.length) renderMessages();
  updateComposer();
}

function renderHeader() {
  const conn = $('conn');
  const text = $('conn-text');
  if (ui.connected === true) {
    conn.dataset.state = 'ok';
    text.textContent = 'connected';
    conn.title = '';
  } else if (ui.connected === false) {
    conn.dataset.state = 'down';
    text.textContent = 'offline, retrying';
    conn.title = ui.connError || '';
  }
  const nid = $('node-id');
  nid.textContent = ui.nodeId ? `node ${shortId(ui.nodeId)}` : '';
  nid.title = ui.nodeId ? `this node: ${ui.nodeId}` : '';
}

function renderNodes() {
  const nodes = ui.views.nodes;
  const cpus = nodes.reduce((s, n) => s + (n.cpuCount || 0), 0);
  const total = nodes.reduce((s, n) => s + (n.ramTotal || 0), 0);
  const avail = nodes.reduce((s, n) => s + (n.ramAvailable || 0), 0);
  $('cluster-summary').textContent = nodes.length
    ? `${nodes.length} node${nodes.length === 1 ? '' : 's'} · ${cpus} CPUs · ${formatBytes(avail)} free of ${formatBytes(total)}`
    : '';
  renderInto($('nodes'), { nodes, has: !!ui.state }, ({ nodes: list, has }) => {
    if (!has) return h('p', { class: 'empty', text: ui.connected === false ? 'Cannot reach the daemon.' : 'Loading…' });
    if (!list.length) return h('p', { class: 'empty', text: 'No nodes have reported yet.' });
    return list.map(nodeCard);
  });
}

function nodeCard(n) {
  const frac = n.usedFraction ?? 0;
  const memClass = `mem${frac > 0.95 ? ' full' : frac > 0.8 ? ' high' : ''}`;
  return h('div', { class: 'node' },
    h('div', { class: 'node-head' },
      h('span', { class: 'node-name', text: n.name }),
      n.isSelf ? h('span', { class: 'pill self', text: 'this node' }) : null,
      h('span', { class: 'mono', title: n.id, text: shortId(n.id) })),
    h('div', { class: 'node-meta' },
      n.cpuCount !== null ? h('span', { class: 'pill', text: `${n.cpuCount} CPU${n.cpuCount === 1 ? '' : 's'}` }) : null,
      n.backends.map((b) => h('span', { class: 'pill', text: b })),
      n.runnerCount ? h('span', { class: 'pill busy', text: `${n.runnerCount} runner${n.runnerCount === 1 ? '' : 's'}` }) : null),
    n.ramTotal !== null
      ? [
          progressBar(frac, memClass),
          h('div', { class: 'node-mem' },
            h('span', { text: `${formatBytes(n.ramUsed)} used of ${formatBytes(n.ramTotal)}` }),
            h('span', { text: `${formatBytes(n.ramAvailable)} free` })),
        ]
      : h('div', { class: 'node-mem', text: 'memory not reported' }));
}

const PHASE_PILL = {
  ready: 'ok',
  running: 'busy',
  loading: 'busy',
  starting: 'warn',
  stopping: 'warn',
  unknown: 'warn',
  failed: 'bad',
};

function renderInstances() {
  const list = ui.views.instances;
  const ready = list.filter(isServing).length;
  $('instances-summary').textContent = list.length ? `${list.length} placed · ${ready} ready` : '';
  const deleting = [...ui.deleting];
  renderInto($('instances'), { list, deleting, has: !!ui.state }, ({ list: insts, has }) => {
    if (!has) return h('p', { class: 'empty', text: '—' });
    if (!insts.length) return h('p', { class: 'empty', text: 'No instances. Launch a model below.' });
    return insts.map(instanceCard);
  });
}

function instanceCard(inst) {
  const busy = ui.deleting.has(inst.id);
  const sub = [inst.kindLabel, inst.sharding, `${inst.runners.length} runner${inst.runners.length === 1 ? '' : 's'}`]
    .filter(Boolean)
    .join(' · ');
  return h('div', { class: `instance ${inst.phase}` },
    h('div', { class: 'instance-head' },
      h('span', { class: 'instance-model', text: inst.modelId }),
      h('span', { class: `pill ${PHASE_PILL[inst.phase] || ''}`, text: inst.progress !== null && inst.phase === 'loading' ? `${inst.label} ${formatPercent(inst.progress)}` : inst.label }),
      h('button', {
        type: 'button',
        class: 'btn btn-danger btn-small',
        disabled: busy,
        title: `Delete instance ${inst.id}`,
        text: busy ? 'Deleting…' : 'Delete',
        onclick: () => removeInstance(inst.id),
      })),
    h('div', { class: 'instance-sub' },
      h('span', { text: sub }),
      ' · ',
      h('span', { class: 'mono', title: inst.id, text: shortId(inst.id) }),
      inst.activeTasks ? ` · ${inst.activeTasks} active request${inst.activeTasks === 1 ? '' : 's'}` : null),
    inst.progress !== null ? progressBar(inst.progress) : null,
    h('ul', { class: 'runners' }, inst.runners.map(runnerRow)));
}

function runnerRow(r) {
  const layers =
    r.startLayer !== null && r.endLayer !== null
      ? `layers ${r.startLayer}–${Math.max(r.startLayer, r.endLayer - 1)}${r.nLayers !== null ? ` of ${r.nLayers}` : ''}`
      : '';
  const where = [r.nodeName, layers].filter(Boolean).join(' · ');
  const status = [r.status.label, r.status.detail].filter(Boolean).join(' ');
  return h('li', { class: 'runner', title: `runner ${r.runnerId}` },
    h('span', { text: where }),
    h('span', { class: `pill ${PHASE_PILL[r.status.phase] || ''}`, text: status }),
    r.status.phase === 'loading' && r.status.progress !== null ? progressBar(r.status.progress) : null,
    r.status.error ? h('div', { class: 'error-text', text: r.status.error }) : null);
}

// ---- rendering: models -----------------------------------------------------------------

function renderModels() {
  const all = ui.views.models;
  const q = ui.filter.trim().toLowerCase();
  const list = q
    ? all.filter((m) => [m.id, m.name, m.family, m.quantization].some((s) => s && s.toLowerCase().includes(q)))
    : all;
  $('models-summary').textContent = ui.models ? `${all.length} on disk` : '';
  const vm = {
    list,
    q,
    launching: [...ui.launching],
    errors: [...ui.launchErrors],
    loaded: ui.models !== null,
    error: ui.modelsError,
  };
  renderInto($('models'), vm, () => {
    const out = [];
    if (vm.error) out.push(h('p', { class: 'error-text', text: `Cannot load models: ${vm.error}` }));
    if (!vm.loaded) {
      if (!vm.error) out.push(h('p', { class: 'empty', text: 'Loading…' }));
      return out;
    }
    if (!all.length) {
      out.push(h('p', { class: 'empty', text: 'No models on disk. Put Hugging Face model folders in a models dir (<models dir>/<org>--<name>/).' }));
    } else if (!list.length) {
      out.push(h('p', { class: 'empty', text: 'No model matches the filter.' }));
    }
    return out.concat(list.map(modelRow));
  });
}

function modelRow(m) {
  const busy = ui.launching.has(m.id);
  const err = ui.launchErrors.get(m.id);
  const tags = [
    m.family ? h('span', { class: 'pill', text: m.family }) : null,
    m.quantization ? h('span', { class: 'pill', text: m.quantization }) : null,
    m.sizeBytes !== null ? h('span', { class: 'pill', text: formatBytes(m.sizeBytes) }) : null,
    m.contextLength !== null ? h('span', { class: 'pill', title: `${m.contextLength} tokens of context`, text: `ctx ${formatContext(m.contextLength)}` }) : null,
    m.capabilities.filter((c) => c !== 'text').map((c) => h('span', { class: 'pill', text: c })),
    m.readyInstances
      ? h('span', { class: 'pill ok', text: m.readyInstances === 1 ? 'running' : `running ×${m.readyInstances}` })
      : m.instances
        ? h('span', { class: 'pill busy', text: 'starting' })
        : null,
    !m.fits ? h('span', { class: 'pill warn', title: 'larger than the free memory of all nodes together', text: 'may not fit' }) : null,
  ];
  return h('div', { class: 'model' },
    h('div', { class: 'model-name', text: m.name }),
    h('div', { class: 'model-actions' },
      h('button', {
        type: 'button',
        class: 'btn btn-primary btn-small',
        disabled: busy,
        title: `Place an instance of ${m.id}`,
        text: busy ? 'Launching…' : 'Launch',
        onclick: () => launch(m.id),
      })),
    h('div', { class: 'model-id', text: m.id }),
    h('div', { class: 'model-tags' }, tags),
    err ? h('div', { class: 'error-text', text: err }) : null);
}

// ---- chat: model picker and composer ---------------------------------------------------

function renderChatModels() {
  const sel = $('chat-model');
  const options = chatModelOptions(ui.views.instances, ui.models || []);
  const streamingModel = ui.chat.streaming ? ui.chat.model : null;
  ui.chat.model = streamingModel || pickChatModel(options, ui.chat.model);
  const vm = { options, model: ui.chat.model };
  renderInto(sel, vm, () => {
    if (!options.length) return h('option', { value: '', text: 'No running model: launch one' });
    return options.map((o) => h('option', { value: o.modelId, text: o.label }));
  });
  if (ui.chat.model !== null && sel.value !== ui.chat.model) sel.value = ui.chat.model;
  sel.disabled = !options.length || !!ui.chat.streaming;
}

function selectedOption() {
  return chatModelOptions(ui.views.instances, ui.models || []).find((o) => o.modelId === ui.chat.model) || null;
}

function updateComposer() {
  const streaming = !!ui.chat.streaming;
  const opt = selectedOption();
  const text = $('prompt').value.trim();
  $('send').disabled = streaming || !opt || !text;
  $('send').hidden = streaming;
  $('stop').hidden = !streaming;
  const hint = $('chat-hint');
  let msg = '';
  let warn = false;
  if (streaming) msg = 'Generating… (Esc or Stop to cancel)';
  else if (!ui.views.instances.length) msg = 'Launch a model to chat with it.';
  else if (opt && !opt.ready) {
    msg = 'This model is still loading: the reply will start once it is ready.';
    warn = true;
  }
  hint.textContent = msg;
  hint.className = warn ? 'hint warn' : 'hint';
}

// ---- chat: messages --------------------------------------------------------------------

/** One message's DOM, built once and updated in place while it streams. */
function messageView(msg, index) {
  if (msg.role === 'user') {
    return {
      root: h('div', { class: 'msg user' },
        h('div', { class: 'msg-role', text: 'You' }),
        h('div', { class: 'msg-text', text: msg.content })),
      update() {},
    };
  }
  const v = {};
  v.thinkingText = h('div', { class: 'thinking-text' });
  v.thinkingSummary = h('summary', { text: 'Thinking' });
  v.thinking = h('details', { class: 'thinking', hidden: true }, v.thinkingSummary, v.thinkingText);
  v.prefillLabel = h('span');
  v.prefillBar = progressBar(0);
  v.prefill = h('div', { class: 'prefill', hidden: true }, v.prefillLabel, v.prefillBar);
  v.waiting = h('div', { class: 'waiting', text: 'Waiting for the model', hidden: true });
  v.text = h('div', { class: 'msg-text' });
  v.tools = h('div', { hidden: true });
  v.error = h('div', { class: 'msg-error', hidden: true, role: 'alert' });
  v.stats = h('span');
  v.state = h('span');
  v.copy = h('button', {
    type: 'button',
    class: 'btn btn-ghost',
    text: 'Copy',
    hidden: true,
    onclick: () => copyText(ui.chat.messages[index] && ui.chat.messages[index].content, v.copy),
  });
  v.meta = h('div', { class: 'msg-meta' }, v.stats, v.state, v.copy);
  v.roleLabel = h('div', { class: 'msg-role', text: msg.model || 'assistant' });
  v.root = h('div', { class: 'msg assistant' }, v.roleLabel, v.thinking, v.prefill, v.waiting, v.text, v.tools, v.error, v.meta);
  v.openedThinking = false;
  v.closedThinking = false;
  v.update = (m) => updateAssistantView(v, m);
  v.update(msg);
  return v;
}

function updateAssistantView(v, m) {
  const streaming = m.status === 'streaming';
  v.root.className = `msg assistant${streaming ? ' streaming' : ''}`;
  // thinking: opens while the model thinks, closes once (when the answer starts)
  v.thinking.hidden = !m.reasoning;
  if (v.thinkingText.textContent !== m.reasoning) v.thinkingText.textContent = m.reasoning;
  if (m.reasoning && streaming && !m.content && !v.openedThinking) {
    v.openedThinking = true;
    v.thinking.open = true;
  }
  if (m.content && v.openedThinking && !v.closedThinking) {
    v.closedThinking = true;
    v.thinking.open = false;
  }
  v.thinkingSummary.textContent = streaming && !m.content && m.reasoning ? 'Thinking…' : 'Thoughts';
  // prompt processing
  if (m.prefill && m.prefill.total > 0) {
    v.prefill.hidden = false;
    v.prefillLabel.textContent = `Processing prompt: ${m.prefill.processed} / ${m.prefill.total} tokens`;
    v.prefillBar.firstChild.style.width = `${Math.round((m.prefill.processed / m.prefill.total) * 100)}%`;
  } else {
    v.prefill.hidden = true;
  }
  v.waiting.hidden = !(streaming && !m.prefill && !m.content && !m.reasoning && !m.toolCalls.length);
  if (v.text.textContent !== m.content) v.text.textContent = m.content;
  // tool calls
  v.tools.hidden = !m.toolCalls.length;
  if (m.toolCalls.length) {
    v.tools.replaceChildren(...m.toolCalls.map((t) => h('div', { class: 'tool-call', text: `${t.name}(${t.arguments})` })));
  }
  v.error.hidden = !m.error;
  v.error.textContent = m.error || '';
  // stats line
  const st = messageStats(m, now());
  let stats = '';
  if (st.tokens > 0 && (!streaming || m.firstTokenAt !== null)) stats = formatMessageStats(st);
  if (!streaming && st.serverTps !== null) v.stats.title = `daemon: ${formatRate(st.serverTps)} tok/s decode, ${formatRate(st.serverPromptTps)} tok/s prefill`;
  if (stats && st.promptTokens !== null && !streaming) stats += ` · ${st.promptTokens} prompt tokens`;
  v.stats.textContent = stats;
  const stateText = {
    streaming: '',
    done: m.finishReason === 'length' ? 'stopped at the token limit' : '',
    stopped: 'stopped',
    error: '',
  }[m.status];
  v.state.textContent = stateText && stats ? `· ${stateText}` : stateText;
  v.copy.hidden = streaming || !m.content;
}

async function copyText(text, button) {
  if (!text) return;
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = 'Copied';
    setTimeout(() => (button.textContent = 'Copy'), 1200);
  } catch {
    toast('Copy failed: the clipboard is not available here');
  }
}

let messageViews = [];

function renderMessages() {
  const box = $('messages');
  const msgs = ui.chat.messages;
  messageViews = msgs.map((m, i) => messageView(m, i));
  if (!msgs.length) {
    renderInto(box, { empty: true, instances: ui.views.instances.length > 0 }, ({ instances }) =>
      h('div', { class: 'chat-empty' },
        h('strong', { text: 'Chat with your cluster' }),
        instances
          ? 'Pick a running model above and send a message.'
          : 'Launch a model from the list, wait until it is ready, then send a message.'));
    return;
  }
  box.__sig = null;
  box.replaceChildren(...messageViews.map((v) => v.root));
  box.scrollTop = box.scrollHeight;
}

let pendingFrame = null;
let stickToBottom = true;

function scheduleMessageUpdate(index) {
  if (pendingFrame !== null) return;
  const box = $('messages');
  stickToBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 60;
  const run = () => {
    pendingFrame = null;
    const v = messageViews[index];
    if (v) v.update(ui.chat.messages[index]);
    if (stickToBottom) box.scrollTop = box.scrollHeight;
  };
  pendingFrame = typeof requestAnimationFrame === 'function' ? requestAnimationFrame(run) : setTimeout(run, 16);
}

function flushMessageUpdate(index) {
  if (pendingFrame !== null) {
    if (typeof cancelAnimationFrame === 'function') cancelAnimationFrame(pendingFrame);
    clearTimeout(pendingFrame);
    pendingFrame = null;
  }
  const v = messageViews[index];
  if (v) v.update(ui.chat.messages[index]);
}

function chatSettings() {
  return {
    systemPrompt: $('system-prompt').value,
    temperature: $('temperature').value,
    maxTokens: $('max-tokens').value,
  };
}

async function sendMessage(text) {
  const model = ui.chat.model;
  if (!model || ui.chat.streaming) return;
  ui.chat.messages.push({ role: 'user', content: text });
  const body = buildChatRequest(model, ui.chat.messages, chatSettings());
  const index = ui.chat.messages.push(newAssistantMessage(model, now())) - 1;
  const controller = new AbortController();
  ui.chat.streaming = { controller, index };
  renderMessages();
  render();

  const apply = (fn) => {
    ui.chat.messages[index] = fn(ui.chat.messages[index]);
    scheduleMessageUpdate(index);
  };
  let reader = null;
  try {
    const res = await fetch(API.chat, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'text/event-stream' },
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) {
      const errText = await res.text();
      apply((m) => finishAssistant(m, 'error', now(), errorMessageFromBody(res.status, errText)));
      return;
    }
    const type = (res.headers && res.headers.get('content-type')) || '';
    if (!type.includes('text/event-stream') || !res.body) {
      // Not a stream (a proxy or an old daemon): one JSON body.
      const t = await res.text();
      apply((m) => reduceAssistant(m, chatActionFromSSE({ type: 'event', data: t }), now()));
      apply((m) => reduceAssistant(m, { kind: 'done' }, now()));
      return;
    }
    reader = res.body.getReader();
    const parser = new SSEParser();
    let finished = false;
    while (!finished) {
      const { value, done } = await reader.read();
      const items = done ? parser.end() : parser.push(value);
      for (const item of items) {
        const action = chatActionFromSSE(item);
        apply((m) => reduceAssistant(m, action, now()));
        if (action.kind === 'done') finished = true;
      }
      if (done) break;
    }
    apply((m) => finishAssistant(m, 'eof', now()));
  } catch (e) {
    if (controller.signal.aborted) apply((m) => finishAssistant(m, 'stopped', now()));
    else apply((m) => finishAssistant(m, 'error', now(), `connection failed: ${e && e.message ? e.message : e}`));
  } finally {
    if (reader) reader.cancel().catch(() => {});
    ui.chat.streaming = null;
    flushMessageUpdate(index);
    saveChat();
    render();
    if (typeof document.hasFocus !== 'function' || document.hasFocus()) $('prompt').focus();
  }
}

function stopGeneration() {
  if (ui.chat.streaming) ui.chat.streaming.controller.abort();
}

function newChat() {
  stopGeneration();
  ui.chat.messages = [];
  saveChat();
  renderMessages();
  render();
}

// ---- persistence -----------------------------------------------------------------------

function saveChat() {
  try {
    localStorage.setItem(STORE_KEY, JSON.stringify({ model: ui.chat.model, messages: ui.chat.messages }));
  } catch {
    /* private mode or full: the chat just is not kept */
  }
}

function loadChat() {
  try {
    const raw = localStorage.getItem(STORE_KEY);
    if (!raw) return;
    const saved = JSON.parse(raw);
    if (!saved || !Array.isArray(saved.messages)) return;
    ui.chat.model = typeof saved.model === 'string' ? saved.model : null;
    ui.chat.messages = saved.messages
      .filter((m) => m && (m.role === 'user' || m.role === 'assistant') && typeof m.content === 'string')
      .map((m) =>
        m.role === 'assistant'
          ? { ...newAssistantMessage(m.model, 0), ...m, status: m.status === 'streaming' ? 'stopped' : m.status }
          : { role: 'user', content: m.content });
  } catch {
    /* a broken entry: start empty */
  }
}

// ---- wiring ----------------------------------------------------------------------------

function wire() {
  $('model-filter').addEventListener('input', (e) => {
    ui.filter = e.target.value;
    renderModels();
  });
  $('models-refresh').addEventListener('click', async () => {
    await loadModels();
    render();
  });
  $('chat-model').addEventListener('change', (e) => {
    ui.chat.model = e.target.value || null;
    saveChat();
    updateComposer();
  });
  $('new-chat').addEventListener('click', newChat);
  $('stop').addEventListener('click', stopGeneration);
  $('prompt').addEventListener('input', updateComposer);
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      submit();
    } else if (e.key === 'Escape' && ui.chat.streaming) {
      e.preventDefault();
      stopGeneration();
    }
  });
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    submit();
  });
}

function submit() {
  const box = $('prompt');
  const text = box.value.trim();
  if (!text || ui.chat.streaming || !selectedOption()) return;
  box.value = '';
  sendMessage(text);
}

/** Mounts the dashboard on the page's elements; returns {stop} (tests). */
export function start(options = {}) {
  loadChat();
  wire();
  renderMessages();
  render();
  const stopPolling = startPolling(options.pollMs || POLL_MS);
  return {
    stop() {
      stopPolling();
      stopGeneration();
    },
  };
}

if (typeof document !== 'undefined' && document.getElementById('composer')) start();
