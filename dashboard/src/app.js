// The exo dashboard: the cluster (its nodes, the links between them, the
// master and the election), where each instance's shards run, the model
// catalogue (download status, downloads, custom Hugging Face models) and
// launcher with placement previews, every node's downloads, and chat. Plain DOM and SVG, no
// framework. Every piece of text from the daemon or a model is set with
// textContent / text nodes (never innerHTML). The logic that can be tested
// without a browser lives in lib.js.

import {
  SSEParser,
  buildChatRequest,
  buildClusterView,
  buildDeletedInstancesView,
  buildDownloadsView,
  buildInstancesView,
  buildModelsView,
  buildNodesView,
  buildPreviewsView,
  buildTopologyView,
  chatActionFromSSE,
  chatModelOptions,
  downloadDetails,
  downloadStatusText,
  downloadsSummary,
  errorMessageFromBody,
  finishAssistant,
  formatAgo,
  formatBandwidth,
  formatBytes,
  formatContext,
  formatCount,
  formatLatency,
  formatLayers,
  formatMessageStats,
  formatPercent,
  formatRate,
  formatUsedOfTotal,
  isServing,
  messageStats,
  modelPath,
  modelStatusBadge,
  newAssistantMessage,
  pickChatModel,
  reduceAssistant,
  shortId,
  validateHfModelId,
} from './lib.js';

const POLL_MS = 2000;
const MODELS_EVERY = 5; // polls between two reloads of /v1/models
const STORE_KEY = 'exo-dashboard-chat';

// API paths are relative to the page (served at "/"), so a reverse proxy
// that mounts the daemon under a prefix keeps working.
const API = {
  state: 'state',
  nodeId: 'node_id',
  cluster: 'cluster',
  models: 'v1/models',
  place: 'place_instance',
  previews: (modelId) => `instance/previews?model_id=${encodeURIComponent(modelId)}`,
  instance: (id) => `instance/${encodeURIComponent(id)}`,
  chat: 'v1/chat/completions',
  addModel: 'models/add',
  search: (query) => `models/search?query=${encodeURIComponent(query)}&limit=10`,
  customModel: (modelId) => `models/custom/${modelPath(modelId)}`,
  downloadStart: 'download/start',
  downloadCancel: 'download/cancel',
  downloadDelete: (nodeId, modelId) => `download/${encodeURIComponent(nodeId)}/${modelPath(modelId)}`,
};

const ui = {
  state: null,
  nodeId: null,
  cluster: null, // GET /cluster of this node (null: not known, or an older daemon)
  clusterError: null,
  models: null, // the /v1/models list (raw)
  modelsError: null,
  connected: null, // null: not yet known
  polls: 0,
  launching: new Set(),
  deleting: new Set(),
  launchErrors: new Map(),
  // model id -> the open placement picker: {status: loading | ok | error,
  // data (GET /instance/previews), error, launching (an option's key),
  // errors: {option key: message}}
  placing: new Map(),
  openDetails: new Set(), // the <details> (by key) the user opened: rebuilds keep them open
  filter: '',
  statusFilter: '', // '' (all) | downloaded | downloading | downloadable
  // download actions under way, by key: "start <model>", "cancel <node> <model>",
  // "delete <node> <model>", "remove <model>" (a custom card)
  busy: new Set(),
  adding: false, // POST /models/add under way
  addError: null,
  searching: false, // GET /models/search under way
  searchResults: null, // its answer: [{id, downloads, likes}], shown under the box
  chat: {
    model: null,
    messages: [],
    streaming: null, // {controller, index}
  },
  views: { nodes: [], instances: [], models: [], downloads: [], cluster: null, topology: null },
};

const $ = (id) => document.getElementById(id);
/** o[k] if o has it as its own (keys from the daemon are never read off a prototype). */
const own = (o, k) => (o && Object.prototype.hasOwnProperty.call(o, k) ? o[k] : undefined);
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

const SVG_NS = 'http://www.w3.org/2000/svg';

/** svg('line', {x1: 0, ...}, children): an SVG element; attributes set as
 * given, `text` as its textContent, `title` as a <title> child (a tooltip). */
function svg(tag, props, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(props || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === 'text') el.textContent = String(v);
    else if (k === 'title') {
      const t = document.createElementNS(SVG_NS, 'title');
      t.textContent = String(v);
      el.appendChild(t);
    } else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, String(v));
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

/** A <details> that stays open (or closed) across the rebuilds of its panel. */
function keptDetails(key, props, ...children) {
  const el = h('details', { ...props, open: ui.openDetails.has(key) }, ...children);
  el.addEventListener('toggle', () => {
    if (el.open) ui.openDetails.add(key);
    else ui.openDetails.delete(key);
  });
  return el;
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

async function loadCluster() {
  try {
    ui.cluster = await api('GET', API.cluster);
    ui.clusterError = null;
  } catch (e) {
    ui.cluster = null;
    ui.clusterError = e.message;
  }
}

async function poll() {
  const wasConnected = ui.connected;
  try {
    // /cluster failing (an older daemon) does not make the daemon offline
    const [state] = await Promise.all([api('GET', API.state), loadCluster()]);
    ui.state = state;
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

/** Opens (or closes) a model's placement picker: the options of
 * GET /instance/previews, each launched by its own button. */
async function togglePlacements(modelId) {
  if (ui.placing.has(modelId)) {
    ui.placing.delete(modelId);
    renderModels();
    return;
  }
  const p = { status: 'loading', data: null, error: null, launching: null, errors: Object.create(null) };
  ui.placing.set(modelId, p);
  ui.launchErrors.delete(modelId);
  renderModels();
  try {
    p.data = await api('GET', API.previews(modelId));
    p.status = 'ok';
  } catch (e) {
    p.status = 'error';
    p.error = e.message;
  }
  renderModels();
}

/** POST /place_instance with `request` (an option of the picker, or just
 * {model_id} where the daemon has no previews); `key` is the option's. */
async function launch(modelId, request, key = '') {
  const p = ui.placing.get(modelId);
  if (ui.launching.has(modelId)) return;
  ui.launching.add(modelId);
  ui.launchErrors.delete(modelId);
  if (p) {
    p.launching = key;
    delete p.errors[key];
  }
  render();
  try {
    await api('POST', API.place, request);
    toast(`Launching ${modelId}`, 'ok');
    if (!ui.chat.model) ui.chat.model = modelId;
    ui.placing.delete(modelId);
    await poll();
  } catch (e) {
    if (p && ui.placing.get(modelId) === p) p.errors[key] = e.message;
    else ui.launchErrors.set(modelId, e.message);
    toast(`Launch failed: ${e.message}`);
  } finally {
    ui.launching.delete(modelId);
    if (p) p.launching = null;
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

// ---- actions: downloads and the catalogue -----------------------------------------------

/** The key of a download action in ui.busy. */
const busyKey = (kind, nodeId, modelId) => `${kind} ${nodeId || ''} ${modelId}`;

/** Asks before something is destroyed (yes where the page has no dialog). */
const confirmed = (message) => typeof globalThis.confirm !== 'function' || globalThis.confirm(message) === true;

/** Runs one action (once at a time per key): the button shows it busy, a
 * toast tells how it went, then the models (when they may have changed)
 * and the State are reloaded. Resolves true when it succeeded. */
async function act(key, run, { ok, fail, models = true }) {
  if (ui.busy.has(key)) return false;
  ui.busy.add(key);
  render();
  try {
    await run();
    if (ok) toast(ok, 'ok');
    if (models) await loadModels();
    await poll();
    return true;
  } catch (e) {
    toast(`${fail}: ${e.message}`);
    return false;
  } finally {
    ui.busy.delete(key);
    render();
  }
}

const nodeLabel = (nodeId) => {
  const n = ui.views.nodes.find((x) => x.id === nodeId);
  return n ? n.displayName : shortId(nodeId);
};

/** POST /download/start: to `nodeId`, by default this node (the one serving
 * the page; the daemon's default too when its id is not known yet). */
function startDownload(modelId, nodeId = ui.nodeId) {
  const body = { model_id: modelId };
  if (nodeId) body.target_node_id = nodeId;
  return act(busyKey('start', nodeId, modelId), () => api('POST', API.downloadStart, body), {
    ok: `Downloading ${modelId}${nodeId ? ` to ${nodeLabel(nodeId)}` : ''}`,
    fail: 'Download failed',
    models: false,
  });
}

function cancelDownload(row) {
  return act(
    busyKey('cancel', row.nodeId, row.modelId),
    () => api('POST', API.downloadCancel, { model_id: row.modelId, target_node_id: row.nodeId }),
    { ok: `Cancelled the download of ${row.modelId} on ${row.nodeName}`, fail: 'Cancel failed' },
  );
}

/** DELETE /download/{node}/{org}/{name}: the model's files on that node. */
function deleteDownload(row) {
  if (!confirmed(`Delete the files of ${row.modelId} on ${row.nodeName}?`)) return Promise.resolve(false);
  return act(busyKey('delete', row.nodeId, row.modelId), () => api('DELETE', API.downloadDelete(row.nodeId, row.modelId)), {
    ok: `Deleted ${row.modelId} from ${row.nodeName}`,
    fail: 'Delete failed',
  });
}

/** DELETE /models/custom/{org}/{name}: a model the user added. */
function removeCustomModel(modelId) {
  if (!confirmed(`Remove ${modelId} from the models list? (Files already downloaded stay on disk.)`)) return Promise.resolve(false);
  return act(busyKey('remove', '', modelId), () => api('DELETE', API.customModel(modelId)), {
    ok: `Removed ${modelId}`,
    fail: 'Remove failed',
  });
}

/** POST /models/add with the id typed in the "Add a Hugging Face model"
 * box, checked first; its error stays under the box until the next try. */
async function addModel() {
  if (ui.adding) return;
  const input = $('add-model-id');
  const v = validateHfModelId(input.value);
  if (!v.ok) {
    ui.addError = v.error;
    renderAddModel();
    return;
  }
  ui.adding = true;
  ui.addError = null;
  renderAddModel();
  try {
    const card = await api('POST', API.addModel, { model_id: v.id });
    const id = card && typeof card.id === 'string' ? card.id : v.id;
    input.value = '';
    toast(`Added ${id}`, 'ok');
    await loadModels();
  } catch (e) {
    ui.addError = e.message;
  } finally {
    ui.adding = false;
    render();
  }
}

/** GET /models/search with the words in the add box: Hugging Face models
 * (mlx-community's first, most downloaded first); picking one puts its id
 * in the box, to add. */
async function searchModels() {
  if (ui.searching || ui.adding) return;
  ui.searching = true;
  ui.addError = null;
  renderAddModel();
  try {
    const found = await api('GET', API.search($('add-model-id').value.trim()));
    ui.searchResults = Array.isArray(found) ? found.filter((m) => m && typeof m.id === 'string') : [];
  } catch (e) {
    ui.searchResults = null;
    ui.addError = e.message;
  } finally {
    ui.searching = false;
    renderAddModel();
  }
}

function pickSearchResult(id) {
  $('add-model-id').value = id;
  ui.searchResults = null;
  renderAddModel();
}

// ---- rendering: cluster ---------------------------------------------------------------

function render() {
  const st = ui.state;
  const cluster = ui.cluster && typeof ui.cluster === 'object' ? ui.cluster : null;
  const selfId = ui.nodeId || (cluster && typeof cluster.nodeId === 'string' ? cluster.nodeId : null);
  // while an election runs, the daemon still names the old master: no badge
  const masterId = cluster && cluster.electionInProgress !== true ? cluster.masterNodeId : null;
  ui.views.nodes = st ? buildNodesView(st, selfId, masterId) : [];
  ui.views.cluster = buildClusterView(cluster, ui.views.nodes);
  ui.views.topology = st ? buildTopologyView(st, ui.views.nodes, { width: topologyWidth() }) : null;
  ui.views.instances = st ? buildInstancesView(st) : [];
  ui.views.deleted = st ? buildDeletedInstancesView(st) : [];
  ui.views.downloads = st ? buildDownloadsView(st) : [];
  ui.views.models = buildModelsView(ui.models || [], ui.views.instances, ui.views.nodes, ui.views.downloads);
  renderHeader();
  renderClusterStatus();
  renderTopology();
  renderNodes();
  renderInstances();
  renderDownloads();
  renderAddModel();
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
  const self = ui.views.nodes.find((n) => n.isSelf);
  const id = ui.nodeId || (self && self.id);
  const nid = $('node-id');
  nid.textContent = id ? `node ${self && self.name !== self.shortId ? `${self.name} · ` : ''}${shortId(id)}` : '';
  nid.title = id ? `this node (the one serving this page): ${id}` : '';
}

/** The master, the election and this node's peers (GET /cluster). */
function renderClusterStatus() {
  const c = ui.views.cluster;
  const vm = { c, err: c ? null : ui.clusterError, has: !!ui.state };
  renderInto($('cluster-status'), vm, () => {
    if (!c) {
      // an older daemon without /cluster, or not loaded yet: say nothing
      // misleading about masters
      return vm.err && vm.has ? h('p', { class: 'muted small', title: vm.err, text: 'Cluster status not available from this daemon.' }) : null;
    }
    const pills = [];
    if (c.electing) pills.push(h('span', { class: 'pill warn electing', text: 'electing a master…' }));
    else if (c.masterId) {
      pills.push(h('span', { class: 'pill master', title: `master: ${c.masterId}` }, '★ master ', h('strong', { text: c.masterName })));
    } else pills.push(h('span', { class: 'pill warn', text: 'no master' }));
    pills.push(h('span', { class: `pill${c.isMaster ? ' self' : ''}`, text: c.isMaster ? 'this node is the master' : 'this node follows' }));
    if (!c.caughtUp) pills.push(h('span', { class: 'pill busy', title: 'this node is still catching up with the master\'s events', text: 'catching up…' }));
    if (c.namespace) pills.push(h('span', { class: 'pill', title: 'the cluster namespace: nodes only join nodes of the same one' }, 'namespace ', h('span', { class: 'mono', text: c.namespace })));
    if (c.sessionClock !== null) pills.push(h('span', { class: 'pill', title: 'the election clock: it grows with each election', text: `session ${c.sessionClock}` }));
    const peers = c.peers.length
      ? h('ul', { class: 'peers' },
          c.peers.map((p) =>
            h('li', { class: 'peer', title: `peer ${p.id}` },
              h('span', { class: 'peer-name' },
                p.name,
                p.known ? null : h('span', { class: 'pill warn', title: 'the State does not list this node (yet)', text: 'not in the State' })),
              h('span', { class: 'mono muted', text: p.remote }),
              p.dialed === null ? null : h('span', { class: 'muted', title: p.dialed ? 'this node dialed it' : 'it dialed this node', text: p.dialed ? 'outgoing' : 'incoming' }),
              h('span', { class: 'peer-rtt', title: 'round trip of the link\'s keep-alive', text: p.rttUs !== null ? `rtt ${formatLatency(p.rttUs)}` : 'rtt —' }))))
      : h('p', { class: 'muted small', text: 'This node has no peers: it is a cluster of one.' });
    return [
      h('div', { class: 'cluster-pills' }, pills),
      c.peers.length ? h('div', { class: 'peers-title', text: `Peers of this node (${c.peers.length})` }) : null,
      peers,
    ];
  });
}

/** The graph's width in SVG units: its box's width in pixels (text keeps its
 * size on a narrow screen), 320 to 560. */
function topologyWidth() {
  const box = $('nodes'); // always shown, as wide as the graph's box
  const w = box && typeof box.clientWidth === 'number' ? box.clientWidth - 18 : 0;
  return w > 0 ? Math.max(320, Math.min(560, Math.round(w))) : 560;
}

/** The topology graph: nodes on a circle, a line per linked pair. */
function renderTopology() {
  const t = ui.views.topology;
  renderInto($('topology'), { t }, () => {
    if (!t || !t.nodes.length) return null;
    const parts = [];
    const legend = [];
    for (const l of t.links) {
      parts.push(svg('g', { class: `link tier-${l.tier}`, title: l.title },
        // a wide transparent line under the visible one makes it easy to hover
        svg('line', { class: 'link-hit', x1: l.x1, y1: l.y1, x2: l.x2, y2: l.y2 }),
        svg('line', { class: 'link-line', x1: l.x1, y1: l.y1, x2: l.x2, y2: l.y2, 'stroke-width': l.width })));
    }
    for (const l of t.links) {
      parts.push(svg('g', { class: `link-label tier-${l.tier}`, title: l.title },
        svg('rect', { x: l.lx - 30, y: l.ly - 9, width: 60, height: 18, rx: 9 }),
        svg('text', { x: l.lx, y: l.ly, 'text-anchor': 'middle', 'dominant-baseline': 'central', text: l.label })));
    }
    const r = t.nodeR;
    const circ = 2 * Math.PI * (r - 3);
    for (const n of t.nodes) {
      const frac = n.usedFraction ?? 0;
      const memClass = frac > 0.95 ? 'full' : frac > 0.8 ? 'high' : '';
      const tags = [n.isMaster ? '★ master' : null, n.isSelf ? 'this node' : null].filter(Boolean).join(' · ');
      const lines = t.labels ? [[n.name, 'node-label-name'], [n.shortId, 'node-label-id'], tags ? [tags, 'node-label-tags'] : null].filter(Boolean) : [];
      const step = 14;
      // text goes away from the middle: above the nodes at the top, below the others
      const y0 = n.above ? n.y - r - 8 - (lines.length - 1) * step : n.y + r + 16;
      parts.push(svg('g', {
        class: `topo-node${n.isSelf ? ' self' : ''}${n.isMaster ? ' master' : ''}`,
        title: `${n.displayName}\n${n.id}${n.usedFraction !== null ? `\nmemory ${formatPercent(n.usedFraction)} used` : ''}${tags ? `\n${tags}` : ''}`,
        tabindex: 0,
        onclick: () => focusNodeCard(n.id),
      },
        svg('circle', { class: 'node-disc', cx: n.x, cy: n.y, r }),
        n.usedFraction !== null
          ? svg('circle', {
              class: `node-mem ${memClass}`,
              cx: n.x,
              cy: n.y,
              r: r - 3,
              'stroke-dasharray': `${(circ * frac).toFixed(2)} ${circ.toFixed(2)}`,
              transform: `rotate(-90 ${n.x} ${n.y})`,
            })
          : null,
        svg('text', { class: 'node-glyph', x: n.x, y: n.y, 'text-anchor': 'middle', 'dominant-baseline': 'central', text: n.usedFraction !== null ? formatPercent(n.usedFraction) : '?' }),
        lines.map(([text, cls], i) => svg('text', { class: cls, x: n.x, y: y0 + i * step, 'text-anchor': 'middle', text }))));
    }
    for (const [tier, text] of [['slow', '< 100 Mbit/s'], ['medium', '< 1 Gbit/s'], ['fast', '< 10 Gbit/s'], ['fastest', '≥ 10 Gbit/s'], ['unknown', 'not measured']]) {
      if (t.links.some((l) => l.tier === tier)) legend.push(h('span', { class: `legend-item tier-${tier}` }, h('span', { class: 'swatch' }), text));
    }
    const graph = svg('svg', {
      class: 'topology-svg',
      viewBox: `0 0 ${t.width} ${t.height}`,
      role: 'img',
      'aria-label': `cluster topology: ${t.nodes.length} node${t.nodes.length === 1 ? '' : 's'}, ${t.links.length} link${t.links.length === 1 ? '' : 's'}`,
    }, parts);
    let note = null;
    if (t.nodes.length === 1) note = 'A cluster of one node: no links to show.';
    else if (!t.links.length) note = 'No links measured yet.';
    return [
      graph,
      note ? h('p', { class: 'muted small center', text: note }) : null,
      legend.length
        ? h('div', { class: 'legend', title: 'One line per linked pair: its best measured connection. Width and color: bandwidth; label: latency. Hover a line for both directions.' },
            h('span', { text: 'Bandwidth:' }), legend, h('span', { text: '· label: latency' }))
        : null,
      t.links.length ? linksDetails(t) : null,
    ];
  });
}

/** Every measured connection, per direction (measured by its source), the best marked. */
function linksDetails(t) {
  const rows = [];
  for (const l of t.links) {
    for (const [from, to, list] of [[l.aName, l.bName, l.ab], [l.bName, l.aName, l.ba]]) {
      rows.push(h('tr', { class: 'dir' }, h('th', { colspan: 3, scope: 'rowgroup', text: `${from} → ${to}${list.length ? '' : ': not measured'}` })));
      list.forEach((c, i) => {
        rows.push(h('tr', { class: i === 0 ? 'best' : '' },
          h('td', { class: 'mono', title: i === 0 ? 'the best connection of this direction' : '', text: `${i === 0 ? '★ ' : ''}${c.address || '—'}` }),
          h('td', { class: 'num', text: formatLatency(c.latencyUs) }),
          h('td', { class: 'num', text: formatBandwidth(c.bandwidthBps) })));
      });
    }
  }
  return keptDetails('links', { class: 'links' },
    h('summary', { text: `Links: ${t.links.length} pair${t.links.length === 1 ? '' : 's'}, ${t.connections} measured connection${t.connections === 1 ? '' : 's'}` }),
    h('div', { class: 'table-wrap' },
      h('table', { class: 'links-table' },
        h('thead', null, h('tr', null, h('th', { text: 'Address' }), h('th', { class: 'num', text: 'Latency' }), h('th', { class: 'num', text: 'Bandwidth' }))),
        h('tbody', null, rows))));
}

function focusNodeCard(id) {
  const card = [...$('nodes').childNodes].find((c) => c.dataset && c.dataset.node === id);
  if (!card) return;
  if (typeof card.scrollIntoView === 'function') card.scrollIntoView({ block: 'nearest', behavior: 'smooth' });
  card.classList && card.classList.add('flash');
  setTimeout(() => card.classList && card.classList.remove('flash'), 1200);
}

function renderNodes() {
  const nodes = ui.views.nodes;
  const cpus = nodes.reduce((s, n) => s + (n.cpuCount || 0), 0);
  const total = nodes.reduce((s, n) => s + (n.ramTotal || 0), 0);
  const avail = nodes.reduce((s, n) => s + (n.ramAvailable || 0), 0);
  const gpus = nodes.reduce((s, n) => s + n.gpus.length, 0);
  $('cluster-summary').textContent = nodes.length
    ? `${nodes.length} node${nodes.length === 1 ? '' : 's'} · ${cpus} CPUs${gpus ? ` · ${gpus} GPU${gpus === 1 ? '' : 's'}` : ''} · ${formatBytes(avail)} free of ${formatBytes(total)}`
    : '';
  renderInto($('nodes'), { nodes, has: !!ui.state }, ({ nodes: list, has }) => {
    if (!has) return h('p', { class: 'empty', text: ui.connected === false ? 'Cannot reach the daemon.' : 'Loading…' });
    if (!list.length) return h('p', { class: 'empty', text: 'No nodes have reported yet.' });
    return list.map(nodeCard);
  });
}

/** A labelled usage bar: "Memory   1.0 / 23.5 GiB", the free space in its tooltip. */
function meter(label, used, total, fraction, free, what) {
  const frac = fraction ?? 0;
  const cls = `mem${frac > 0.95 ? ' full' : frac > 0.8 ? ' high' : ''}`;
  const title = [
    what,
    `${formatBytes(used)} used of ${formatBytes(total)}${fraction !== null ? ` (${formatPercent(fraction)})` : ''}`,
    free !== null && free !== undefined ? `${formatBytes(free)} free` : null,
  ].filter(Boolean).join('\n');
  return h('div', { class: 'meter', title },
    h('div', { class: 'meter-head' },
      h('span', { class: 'meter-label', text: label }),
      h('span', { class: 'meter-value', text: formatUsedOfTotal(used, total) })),
    progressBar(frac, cls));
}

const MODELS_SHOWN = 4;

function nodeCard(n) {
  const cpu = [n.cpuModel, n.cpuCount !== null ? `${n.cpuCount} CPU${n.cpuCount === 1 ? '' : 's'}` : null].filter(Boolean).join(' · ');
  const models = n.models.slice(0, MODELS_SHOWN);
  const more = n.models.length - models.length;
  return h('div', { class: `node${n.isSelf ? ' is-self' : ''}${n.isMaster ? ' is-master' : ''}`, 'data-node': n.id },
    h('div', { class: 'node-head' },
      h('span', { class: 'node-name', title: n.displayName, text: n.name }),
      n.isMaster ? h('span', { class: 'pill master', title: 'the cluster\'s master: it orders the events of the whole cluster', text: '★ master' }) : null,
      n.isSelf ? h('span', { class: 'pill self', title: 'the node serving this page', text: 'this node' }) : null,
      h('span', { class: 'mono node-short', title: n.id, text: n.shortId })),
    cpu ? h('div', { class: 'node-line', text: cpu }) : null,
    n.os ? h('div', { class: 'node-line muted', text: n.os }) : null,
    n.ramTotal !== null
      ? meter('Memory', n.ramUsed, n.ramTotal, n.usedFraction, n.ramAvailable)
      : h('div', { class: 'node-line muted', text: 'memory not reported' }),
    n.gpus.map((g) =>
      g.memoryTotal !== null
        ? meter(`GPU ${g.index} · ${g.name}`, g.memoryUsed, g.memoryTotal, g.usedFraction, null)
        : h('div', { class: 'node-line', text: `GPU ${g.index} · ${g.name}` })),
    n.diskTotal !== null
      ? meter('Models disk', n.diskUsed, n.diskTotal, n.diskFraction, n.diskAvailable, 'the disk that holds the models dir')
      : null,
    h('div', { class: 'node-meta' },
      n.backends.map((b) => h('span', { class: 'pill', title: 'compute backend', text: b })),
      n.runnerCount ? h('span', { class: 'pill busy', text: `${n.runnerCount} runner${n.runnerCount === 1 ? '' : 's'}` }) : null),
    h('div', { class: 'node-models' },
      h('span', { class: 'muted', text: n.models.length ? 'Models on disk:' : 'No models on disk' }),
      models.map((m) => h('span', { class: 'pill model-pill', title: m, text: m })),
      more > 0 ? h('span', { class: 'pill', title: n.models.slice(MODELS_SHOWN).join('\n'), text: `+${more} more` }) : null));
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
  // a runner whose node is still downloading its shard shows that download
  const dls = ui.views.downloads.filter((d) => d.status !== 'completed').map((d) => [d.key, d.status, d.percent]);
  // the recently deleted ones say why they went (a runner that kept
  // failing, a node that left, a user); "ago" moves once a minute
  const minute = Math.floor(Date.now() / 60000);
  renderInto($('instances'), { list, deleting, dls, has: !!ui.state, deleted: ui.views.deleted, minute }, ({ list: insts, has, deleted }) => {
    if (!has) return h('p', { class: 'empty', text: '—' });
    const gone = deleted.length ? deletedList(deleted) : null;
    if (!insts.length) return [h('p', { class: 'empty', text: 'No instances. Launch a model below.' }), gone];
    return [...insts.map(instanceCard), gone];
  });
}

function deletedList(deleted) {
  const now = Date.now();
  return h('div', { class: 'deleted-instances' },
    h('div', { class: 'deleted-title small muted', text: `Recently deleted (${deleted.length})` }),
    h('ul', {}, deleted.map((d) => h('li', { class: 'deleted-instance', title: `instance ${d.id}${d.when !== null ? `\ndeleted ${new Date(d.when).toLocaleString()}` : ''}` },
      h('span', { class: 'instance-model', text: d.modelId || 'unknown model' }),
      ' ',
      h('span', { class: 'mono muted', text: shortId(d.id) }),
      d.when !== null ? h('span', { class: 'muted', text: ` · ${formatAgo(d.when, now)}` }) : null,
      h('div', { class: 'error-text', text: d.reason || 'no reason recorded' })))));
}

function instanceCard(inst) {
  const busy = ui.deleting.has(inst.id);
  const nodesUsed = new Set(inst.runners.map((r) => r.nodeId).filter(Boolean)).size;
  const sub = [
    inst.kindLabel,
    inst.sharding,
    `${inst.runners.length} runner${inst.runners.length === 1 ? '' : 's'}`,
    nodesUsed ? `on ${nodesUsed} node${nodesUsed === 1 ? '' : 's'}` : null,
  ]
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
    h('ul', { class: 'runners' }, inst.runners.map((r) => runnerRow(r, inst.modelId))));
}

const DOWNLOAD_PILL = { ongoing: 'busy', pending: 'warn', failed: 'bad', completed: 'ok', unknown: 'warn' };

/** One shard: its rank, the node it runs on, its layers, its runner's
 * status, and while it is not ready, its node's download of the model. */
function runnerRow(r, modelId) {
  const status = [r.status.label, r.status.detail].filter(Boolean).join(' ');
  const waiting = r.status.phase !== 'ready' && r.status.phase !== 'running';
  const dl = waiting && r.nodeId
    ? ui.views.downloads.find((d) => d.nodeId === r.nodeId && d.modelId === modelId && d.status !== 'completed')
    : null;
  return h('li', { class: 'runner', title: `runner ${r.runnerId}${r.nodeId ? `\nnode ${r.nodeId}` : ''}` },
    h('span', { class: 'rank', title: r.worldSize !== null ? `rank ${r.deviceRank} of ${r.worldSize}` : 'rank', text: r.deviceRank !== null ? `#${r.deviceRank}` : '#?' }),
    h('span', { class: 'runner-where' },
      h('span', { class: 'runner-node', text: r.nodeName }),
      r.device ? h('span', { class: 'muted', title: 'the device this rank runs on', text: r.device }) : null,
      r.nodeGone ? h('span', { class: 'pill bad', title: 'this node has left the cluster', text: 'node gone' }) : null,
      h('span', { class: 'muted', text: formatLayers(r.startLayer, r.endLayer, r.nLayers) })),
    h('span', { class: `pill ${PHASE_PILL[r.status.phase] || ''}`, text: status }),
    r.status.phase === 'loading' && r.status.progress !== null ? progressBar(r.status.progress) : null,
    dl
      ? h('div', { class: 'runner-download small' },
          h('span', { class: `pill ${DOWNLOAD_PILL[dl.status] || ''}`, title: `this node fetches the model first\n${downloadDetails(dl)}`, text: `${dl.status === 'pending' ? 'download queued' : dl.status === 'failed' ? 'download failed' : `downloading ${dl.percent}%`}` }),
          h('span', { class: 'muted', text: downloadDetails(dl) }))
      : null,
    dl && dl.status === 'ongoing' ? progressBar(dl.fraction) : null,
    dl && dl.status === 'failed' && dl.errorMessage ? h('div', { class: 'error-text', text: dl.errorMessage }) : null,
    r.status.error ? h('div', { class: 'error-text', text: r.status.error }) : null);
}

// ---- rendering: downloads --------------------------------------------------------------

function renderDownloads() {
  const rows = ui.views.downloads;
  $('downloads-summary').textContent = downloadsSummary(rows);
  const busy = [...ui.busy];
  renderInto($('downloads'), { rows, busy, has: !!ui.state }, ({ has }) => {
    if (!has) return h('p', { class: 'empty', text: '—' });
    if (!rows.length) {
      return h('p', { class: 'empty', text: 'No downloads. Download a model from the list below, or launch one that is not on disk yet.' });
    }
    return rows.map(downloadRow);
  });
}

/** One (node, model): status, progress, speed, ETA, files, layers, and
 * Cancel (under way), Delete (downloaded, not read-only) or Retry (failed). */
function downloadRow(d) {
  const cancelling = ui.busy.has(busyKey('cancel', d.nodeId, d.modelId));
  const deleting = ui.busy.has(busyKey('delete', d.nodeId, d.modelId));
  const retrying = ui.busy.has(busyKey('start', d.nodeId, d.modelId));
  const details = downloadDetails(d);
  return h('div', { class: `download ${d.status}`, 'data-node': d.nodeId, 'data-model': d.modelId },
    h('div', { class: 'download-head' },
      h('span', { class: 'download-model', title: d.modelDirectory || d.modelId, text: d.modelId }),
      h('span', { class: 'download-node', title: d.nodeId }, h('span', { class: 'muted', text: 'on ' }), h('span', { class: 'runner-node', text: d.nodeName })),
      d.nodeGone ? h('span', { class: 'pill bad', title: 'this node is not in the cluster', text: 'node gone' }) : null,
      d.readOnly ? h('span', { class: 'pill', title: 'in a read-only models dir: it cannot be deleted from here', text: 'read-only' }) : null,
      h('span', { class: `pill ${DOWNLOAD_PILL[d.status] || ''}`, text: downloadStatusText(d) }),
      d.canCancel
        ? h('button', {
            type: 'button',
            class: 'btn btn-small',
            disabled: cancelling,
            title: `Stop downloading ${d.modelId} on ${d.nodeName} (POST /download/cancel)`,
            text: cancelling ? 'Cancelling…' : 'Cancel',
            onclick: () => cancelDownload(d),
          })
        : null,
      d.canRetry
        ? h('button', {
            type: 'button',
            class: 'btn btn-small',
            disabled: retrying,
            title: `Download ${d.modelId} to ${d.nodeName} again`,
            text: retrying ? 'Retrying…' : 'Retry',
            onclick: () => startDownload(d.modelId, d.nodeId),
          })
        : null,
      d.canDelete
        ? h('button', {
            type: 'button',
            class: 'btn btn-danger btn-small',
            disabled: deleting,
            title: `Delete the files of ${d.modelId} on ${d.nodeName}${d.modelDirectory ? ` (${d.modelDirectory})` : ''}`,
            text: deleting ? 'Deleting…' : 'Delete',
            onclick: () => deleteDownload(d),
          })
        : null),
    progressBar(d.fraction, d.status === 'failed' ? 'failed' : d.status === 'completed' ? 'done' : ''),
    details ? h('div', { class: 'download-details', text: details }) : null,
    d.status === 'failed' ? h('div', { class: 'error-text', text: d.errorMessage || 'the download failed' }) : null);
}

/** The "Add a Hugging Face model" box: busy while the daemon fetches the
 * model's config, the reason under it when it fails. */
function renderAddModel() {
  const btn = $('add-model-btn');
  btn.disabled = ui.adding;
  btn.textContent = ui.adding ? 'Adding…' : 'Add';
  $('add-model-id').disabled = ui.adding;
  const search = $('add-model-search');
  search.disabled = ui.adding || ui.searching;
  search.textContent = ui.searching ? 'Searching…' : 'Search';
  const err = $('add-model-error');
  err.hidden = !ui.addError;
  err.textContent = ui.addError || '';
  const list = $('add-model-results');
  const found = ui.searchResults;
  list.hidden = !found;
  list.replaceChildren(
    ...(found || []).map((m) =>
      h('button', {
        type: 'button',
        class: 'search-result',
        title: `Put ${m.id} in the box, to add it`,
        onclick: () => pickSearchResult(m.id),
      },
      h('span', { class: 'search-id', text: m.id }),
      h('span', {
        class: 'search-meta',
        text: `${formatCount(m.downloads)} downloads · ${formatCount(m.likes)} likes`,
      }))),
    ...(found && !found.length ? [h('p', { class: 'empty', text: 'No model on Hugging Face matches.' })] : []));
}

// ---- rendering: models -----------------------------------------------------------------

function renderModels() {
  const all = ui.views.models;
  const q = ui.filter.trim().toLowerCase();
  const sf = ui.statusFilter;
  const list = all.filter(
    (m) =>
      (!sf || m.status === sf) &&
      (!q || [m.id, m.name, m.family, m.quantization].some((s) => s && s.toLowerCase().includes(q))),
  );
  const by = (st) => all.filter((m) => m.status === st).length;
  $('models-summary').textContent = ui.models
    ? [
        `${by('downloaded')} on disk${all.some((m) => !m.local) ? ' in the cluster' : ''}`,
        by('downloading') ? `${by('downloading')} downloading` : null,
        by('downloadable') ? `${by('downloadable')} to download` : null,
      ].filter(Boolean).join(' · ')
    : '';
  const placing = {};
  for (const [id, p] of ui.placing) {
    placing[id] = {
      status: p.status,
      error: p.error,
      launching: p.launching,
      errors: p.errors,
      view: p.status === 'ok' ? buildPreviewsView(p.data, ui.views.nodes, id) : null,
    };
  }
  const vm = {
    list,
    q,
    launching: [...ui.launching],
    errors: [...ui.launchErrors],
    busy: [...ui.busy],
    nodeId: ui.nodeId,
    placing,
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
      out.push(h('p', { class: 'empty', text: 'No models yet. Add one from Hugging Face above, or put model folders in a models dir (<models dir>/<org>--<name>/).' }));
    } else if (!list.length) {
      out.push(h('p', { class: 'empty', text: 'No model matches the filter.' }));
    }
    return out.concat(list.map((m) => modelRow(m, own(placing, m.id))));
  });
}


/** The tooltip of a model's status badge. */
function statusTitle(m) {
  if (m.status === 'downloaded') {
    return m.onNodes.length ? `on disk on:\n${m.onNodes.join('\n')}` : 'on disk';
  }
  if (m.status === 'downloading') {
    return m.downloadingOn.length ? `downloading on:\n${m.downloadingOn.join('\n')}` : 'a download is under way';
  }
  return 'not on any node: Download fetches it to this node; Launch makes the nodes it runs on download it first';
}

function modelRow(m, placing) {
  const busy = ui.launching.has(m.id);
  const err = ui.launchErrors.get(m.id);
  const badge = modelStatusBadge(m.status, m.downloadFraction, m.downloadFailed);
  const starting = ui.busy.has(busyKey('start', ui.nodeId, m.id));
  const removing = ui.busy.has(busyKey('remove', '', m.id));
  const tags = [
    h('span', { class: `pill model-status ${badge.kind}`, title: statusTitle(m), text: badge.text }),
    m.isCustom ? h('span', { class: 'pill', title: 'a model you added', text: 'custom' }) : null,
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
    m.onNodes.length
      ? h('span', { class: 'pill', title: `on disk on:\n${m.onNodes.join('\n')}`, text: `on ${m.onNodes.length === 1 ? m.onNodes[0] : `${m.onNodes.length} nodes`}` })
      : null,
  ];
  return h('div', { class: `model${placing ? ' placing' : ''}` },
    h('div', { class: 'model-name', text: m.name }),
    h('div', { class: 'model-actions' },
      h('button', {
        type: 'button',
        class: placing ? 'btn btn-ghost btn-small' : 'btn btn-primary btn-small',
        disabled: busy,
        'aria-expanded': placing ? 'true' : 'false',
        title: placing ? 'Close the placement options' : `See where ${m.id} can run, then launch it`,
        text: busy ? 'Launching…' : placing ? 'Cancel' : 'Launch',
        onclick: () => togglePlacements(m.id),
      }),
      m.status === 'downloadable'
        ? h('button', {
            type: 'button',
            class: 'btn btn-small',
            disabled: starting,
            title: `Download ${m.id} to this node${m.sizeBytes !== null ? ` (${formatBytes(m.sizeBytes)})` : ''}`,
            text: starting ? 'Starting…' : 'Download',
            onclick: () => startDownload(m.id),
          })
        : null,
      m.isCustom
        ? h('button', {
            type: 'button',
            class: 'btn btn-ghost btn-danger btn-small',
            disabled: removing,
            title: `Remove ${m.id} from the models list`,
            text: removing ? 'Removing…' : 'Remove',
            onclick: () => removeCustomModel(m.id),
          })
        : null),
    h('div', { class: 'model-id', text: m.id }),
    h('div', { class: 'model-tags' }, tags),
    m.status === 'downloading' && m.downloadFraction !== null ? progressBar(m.downloadFraction, 'model-progress') : null,
    err ? h('div', { class: 'error-text', text: err }) : null,
    placing ? placementPicker(m, placing) : null);
}

/** The options of GET /instance/previews: valid ones with a Launch button
 * each, invalid ones with the reason (grouped by it). */
function placementPicker(m, p) {
  const busy = ui.launching.has(m.id);
  const body = [];
  if (p.status === 'loading') body.push(h('p', { class: 'muted small', text: 'Finding where it can run…' }));
  else if (p.status === 'error') {
    body.push(h('p', { class: 'error-text', text: `No placement preview: ${p.error}` }));
    body.push(h('div', { class: 'placement-actions' },
      h('button', {
        type: 'button',
        class: 'btn btn-primary btn-small',
        disabled: busy,
        title: 'Let the daemon pick the placement',
        text: p.launching === '' ? 'Launching…' : 'Launch with defaults',
        onclick: () => launch(m.id, { model_id: m.id }, ''),
      })));
    if (own(p.errors, '') !== undefined) body.push(h('div', { class: 'error-text', text: p.errors[''] }));
  } else {
    const v = p.view;
    if (!v.valid.length) body.push(h('p', { class: 'muted small', text: 'No valid placement for this model on this cluster.' }));
    for (const o of v.valid) body.push(placementOption(m, o, p, busy));
    if (v.invalid.length) {
      const n = v.invalid.reduce((s, g) => s + g.options.length, 0);
      body.push(keptDetails(`invalid:${m.id}`, { class: 'placement-invalid' },
        h('summary', { text: `${n} option${n === 1 ? '' : 's'} not possible` }),
        v.invalid.map((g) =>
          h('div', { class: 'invalid-group' },
            h('div', { class: 'error-text', text: g.error }),
            h('div', { class: 'invalid-options' }, g.options.map((o) => h('span', { class: 'pill', text: o.label })))))));
    }
  }
  return h('div', { class: 'placements' },
    h('div', { class: 'placements-title', text: 'Where to run it' }),
    m.status !== 'downloaded'
      ? h('p', { class: 'muted small', text: 'Not on disk yet: the nodes it runs on download it first (see Downloads); it is ready once they have.' })
      : null,
    body);
}

function placementOption(m, o, p, busy) {
  const launchingThis = p.launching === o.key;
  const err = own(p.errors, o.key);
  const shardOf = new Map(o.shards.map((s) => [s.nodeId, s]));
  return h('div', { class: `placement${err !== undefined ? ' failed' : ''}` },
    h('div', { class: 'placement-head' },
      h('span', { class: 'placement-label', text: o.label }),
      h('span', { class: 'muted small', title: 'memory the instance needs, all nodes together', text: `needs ${formatBytes(o.totalBytes)}` }),
      o.predictedTps ? h('span', { class: 'muted small', title: 'decode speed of one request the cluster predicts from its nodes\' measured memory bandwidth and links', text: `~${o.predictedTps.toFixed(o.predictedTps < 10 ? 1 : 0)} tok/s` }) : null,
      o.fits ? null : h('span', { class: 'pill warn', title: 'a node would need more memory than it has free', text: 'may not fit' }),
      h('button', {
        type: 'button',
        class: 'btn btn-primary btn-small',
        disabled: busy,
        title: `POST /place_instance ${JSON.stringify(o.request)}`,
        text: launchingThis ? 'Launching…' : 'Launch',
        onclick: () => launch(m.id, o.request, o.key),
      })),
    h('ul', { class: 'placement-nodes' },
      o.nodes.map((n) => {
        const s = shardOf.get(n.id);
        return h('li', { title: n.id },
          h('span', { class: 'rank', text: s && s.deviceRank !== null ? `#${s.deviceRank}` : '' }),
          h('span', { class: 'runner-node', text: n.name }),
          h('span', { class: 'muted', text: s ? formatLayers(s.startLayer, s.endLayer, s.nLayers) : '' }),
          h('span', { class: n.fits ? 'muted num' : 'warn-text num', text: `+${formatBytes(n.deltaBytes)}${n.room !== null ? ` of ${formatBytes(n.room)} free` : ''}`,
            title: n.room !== null && n.room !== n.ramAvailable ? 'free memory and GPU memory' : undefined }));
      })),
    err !== undefined ? h('div', { class: 'error-text', text: err }) : null);
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
  if (typeof window !== 'undefined' && typeof window.addEventListener === 'function') {
    let pending = null;
    window.addEventListener('resize', () => {
      clearTimeout(pending);
      pending = setTimeout(render, 150);
    });
  }
  $('model-filter').addEventListener('input', (e) => {
    ui.filter = e.target.value;
    renderModels();
  });
  $('model-status-filter').addEventListener('change', (e) => {
    ui.statusFilter = e.target.value || '';
    renderModels();
  });
  $('add-model').addEventListener('submit', (e) => {
    e.preventDefault();
    addModel();
  });
  $('add-model-search').addEventListener('click', () => searchModels());
  $('add-model-id').addEventListener('input', () => {
    if (ui.addError) {
      ui.addError = null;
      renderAddModel();
    }
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
