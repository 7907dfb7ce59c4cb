// Downloads and the model catalogue: state.downloads -> rows, the model
// status badge, speed / ETA formatting, and the check of a Hugging Face id
// before POST /models/add.
import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  buildDownloadsView,
  buildModelsView,
  downloadDetails,
  downloadStatusText,
  downloadsSummary,
  formatEta,
  formatSpeed,
  modelDownloadState,
  modelPath,
  modelStatusBadge,
  parseDownloadEntry,
  validateHfModelId,
} from '../src/lib.js';

const SELF = '25d2d2b1-3cc0-4918-a21a-956ed124c610';
const OTHER = '9b1f0c2e-7a4d-4c1e-8f00-1234567890ab';
const GiB = 2 ** 30;
const MiB = 2 ** 20;

/** A download entry as the daemon sends it (camelCase body under its tag). */
function entry(tag, body = {}) {
  return {
    [tag]: {
      nodeId: SELF,
      modelId: 'mlx-community/Qwen3-0.6B-4bit',
      startLayer: 0,
      endLayer: 28,
      nLayers: 28,
      modelDirectory: '/models/mlx-community--Qwen3-0.6B-4bit',
      total: 4 * GiB,
      downloaded: GiB,
      downloadedThisSession: 512 * MiB,
      completedFiles: 3,
      totalFiles: 7,
      speed: 12.5 * MiB,
      etaMs: 245000,
      readOnly: false,
      errorMessage: '',
      ...body,
    },
  };
}

// ---- formatting ------------------------------------------------------------------------

test('formatSpeed: bytes per second in binary units', () => {
  assert.equal(formatSpeed(0), '0 B/s');
  assert.equal(formatSpeed(900), '900 B/s');
  assert.equal(formatSpeed(1536), '1.5 KiB/s');
  assert.equal(formatSpeed(12.5 * MiB), '12.5 MiB/s');
  assert.equal(formatSpeed(1.25 * GiB), '1.3 GiB/s');
  for (const bad of [null, undefined, NaN, Infinity, -1, '5']) assert.equal(formatSpeed(bad), '—');
});

test('formatEta: seconds (rounded up), then m ss, h mm, d h', () => {
  assert.equal(formatEta(0), '0s');
  assert.equal(formatEta(1), '1s'); // never "0s" while something is left
  assert.equal(formatEta(4200), '5s');
  assert.equal(formatEta(59000), '59s');
  assert.equal(formatEta(60000), '1m 00s');
  assert.equal(formatEta(185000), '3m 05s');
  assert.equal(formatEta(3599000), '59m 59s');
  assert.equal(formatEta(3600000), '1h 00m');
  assert.equal(formatEta(7500000), '2h 05m');
  assert.equal(formatEta((2 * 24 + 3) * 3600000 + 5000), '2d 3h');
  for (const bad of [null, undefined, NaN, Infinity, -1, '100']) assert.equal(formatEta(bad), '—');
});

// ---- Hugging Face ids ------------------------------------------------------------------

test('validateHfModelId: org/name of safe characters', () => {
  for (const id of [
    'mlx-community/Qwen3-0.6B-4bit',
    'karpathy/stories260K',
    'meta-llama/Llama-3.2-1B-Instruct',
    'a/b',
    'Org_1/name.v2_final-x',
  ]) {
    assert.deepEqual(validateHfModelId(id), { ok: true, id }, id);
  }
  // spaces around it, a pasted address, a trailing slash
  assert.deepEqual(validateHfModelId('  karpathy/stories260K \n'), { ok: true, id: 'karpathy/stories260K' });
  assert.deepEqual(validateHfModelId('https://huggingface.co/mlx-community/Qwen3-0.6B-4bit'), { ok: true, id: 'mlx-community/Qwen3-0.6B-4bit' });
  assert.deepEqual(validateHfModelId('huggingface.co/karpathy/stories260K/'), { ok: true, id: 'karpathy/stories260K' });
  assert.deepEqual(validateHfModelId('https://hf.co/a/b'), { ok: true, id: 'a/b' });
});

test('validateHfModelId: what is refused, and why', () => {
  const err = (v) => {
    const r = validateHfModelId(v);
    assert.equal(r.ok, false, JSON.stringify(v));
    assert.equal(typeof r.error, 'string');
    assert.ok(r.error.length > 0);
    assert.equal(r.id, undefined);
    return r.error;
  };
  assert.match(err(''), /org\/name/);
  assert.match(err('   '), /org\/name/);
  assert.match(err(null), /org\/name/);
  assert.match(err(42), /org\/name/);
  assert.match(err('stories260K'), /not of the form org\/name/);
  assert.match(err('/name'), /not of the form/);
  assert.match(err('org/'), /not of the form/); // "org/" -> "org" (the slash is trailing)
  assert.match(err('org//name'), /not of the form/);
  assert.match(err('a/b/c'), /not of the form/);
  assert.match(err('https://huggingface.co/a/b/tree/main'), /not of the form/);
  assert.match(err('org/na me'), /letters, digits/);
  assert.match(err('org/name?x=1'), /letters, digits/);
  assert.match(err('ørg/name'), /letters, digits/);
  assert.match(err('org\\name/x'), /letters, digits/);
  assert.match(err('org/name%2F'), /letters, digits/);
  assert.match(err('org--x/name'), /"--"/);
  assert.match(err('org/na--me'), /"--"/);
  assert.match(err('org/na..me'), /"\.\."/);
  assert.match(err('../name'), /start with "\."/);
  assert.match(err('org/..'), /start with "\."/);
  assert.match(err('org/.hidden'), /start with "\."/);
  assert.match(err(`org/${'x'.repeat(252)}`), /at most 255/);
  assert.equal(validateHfModelId(`org/${'x'.repeat(251)}`).ok, true); // 255 exactly
});

test('modelPath: each segment URL-encoded, the slash kept', () => {
  assert.equal(modelPath('mlx-community/Qwen3-0.6B-4bit'), 'mlx-community/Qwen3-0.6B-4bit');
  assert.equal(modelPath('a b/c?d'), 'a%20b/c%3Fd');
  assert.equal(modelPath('solo'), 'solo');
});

// ---- state.downloads -> rows -----------------------------------------------------------

test('parseDownloadEntry: an ongoing download', () => {
  const r = parseDownloadEntry(entry('DownloadOngoing'), SELF);
  assert.deepEqual(r, {
    nodeId: SELF,
    modelId: 'mlx-community/Qwen3-0.6B-4bit',
    tag: 'DownloadOngoing',
    status: 'ongoing',
    label: 'Downloading',
    total: 4 * GiB,
    downloaded: GiB,
    downloadedThisSession: 512 * MiB,
    fraction: 0.25,
    percent: 25,
    completedFiles: 3,
    totalFiles: 7,
    speed: 12.5 * MiB,
    etaMs: 245000,
    readOnly: false,
    errorMessage: '',
    startLayer: 0,
    endLayer: 28,
    nLayers: 28,
    partial: false,
    modelDirectory: '/models/mlx-community--Qwen3-0.6B-4bit',
  });
  assert.equal(downloadStatusText(r), 'Downloading 25%');
  assert.equal(downloadDetails(r), '1.0 / 4.0 GiB · 12.5 MiB/s · ETA 4m 05s · files 3/7');
});

test('parseDownloadEntry: each tag gives its status', () => {
  const st = (tag, body) => parseDownloadEntry(entry(tag, body), SELF);
  assert.equal(st('DownloadPending').status, 'pending');
  assert.equal(st('DownloadPending').label, 'Queued');
  assert.equal(st('DownloadCompleted').status, 'completed');
  assert.equal(st('DownloadCompleted').label, 'Downloaded');
  const failed = st('DownloadFailed', { errorMessage: 'HTTP 401 from huggingface.co' });
  assert.equal(failed.status, 'failed');
  assert.equal(failed.errorMessage, 'HTTP 401 from huggingface.co');
  assert.equal(downloadStatusText(failed), 'Failed');
  // a tag this dashboard does not know yet
  const odd = st('DownloadPaused');
  assert.equal(odd.status, 'unknown');
  assert.equal(odd.label, 'Paused');
  // speed and ETA only mean something while it downloads
  for (const tag of ['DownloadPending', 'DownloadCompleted', 'DownloadFailed']) {
    assert.equal(st(tag).speed, 0, tag);
    assert.equal(st(tag).etaMs, null, tag);
  }
  assert.equal(downloadDetails(st('DownloadPending')), '1.0 / 4.0 GiB · files 3/7');
});

test('parseDownloadEntry: progress is clamped; a total of 0 is "not known yet"', () => {
  const p = (body, tag = 'DownloadOngoing') => parseDownloadEntry(entry(tag, body), SELF);
  // total not known yet: 0%, no division by zero, no ETA from bytes
  const unknown = p({ total: 0, downloaded: 0, etaMs: 0, speed: 0 });
  assert.equal(unknown.fraction, 0);
  assert.equal(unknown.percent, 0);
  assert.equal(unknown.etaMs, null);
  assert.equal(downloadDetails(unknown), '0 B/s · files 3/7');
  const noTotal = p({ total: 0, downloaded: 5 * MiB });
  assert.equal(noTotal.fraction, 0);
  assert.equal(noTotal.downloaded, 5 * MiB);
  assert.ok(downloadDetails(noTotal).startsWith('5.0 MiB · '));
  // more than the total: clamped to it (99% until it completes)
  const over = p({ total: 100, downloaded: 250 });
  assert.equal(over.downloaded, 100);
  assert.equal(over.fraction, 1);
  assert.equal(over.percent, 99);
  assert.equal(p({ total: 1000, downloaded: 999 }).percent, 99); // floored: never 100% early
  // completed: 100% even without a total
  const done = p({ total: 0, downloaded: 0 }, 'DownloadCompleted');
  assert.equal(done.fraction, 1);
  assert.equal(done.percent, 100);
  // garbage numbers: 0
  const bad = p({ total: -5, downloaded: NaN, speed: 'fast', completedFiles: null, totalFiles: Infinity, etaMs: 'soon' });
  assert.equal(bad.total, 0);
  assert.equal(bad.downloaded, 0);
  assert.equal(bad.speed, 0);
  assert.equal(bad.completedFiles, 0);
  assert.equal(bad.totalFiles, 0);
  assert.equal(bad.etaMs, null);
  assert.equal(bad.fraction, 0);
});

test('parseDownloadEntry: the ETA from the speed when the daemon has none', () => {
  const p = (body) => parseDownloadEntry(entry('DownloadOngoing', body), SELF);
  assert.equal(p({ etaMs: 0, total: 100 * MiB, downloaded: 40 * MiB, speed: 20 * MiB }).etaMs, 3000);
  assert.equal(p({ etaMs: null, total: 100 * MiB, downloaded: 40 * MiB, speed: 0 }).etaMs, null);
  assert.equal(p({ etaMs: 0, total: 100, downloaded: 100, speed: 0 }).etaMs, 0); // all bytes in
  assert.equal(p({ etaMs: 1500 }).etaMs, 1500);
});

test('parseDownloadEntry: a shard of the model, snake_case keys, entries that are not ones', () => {
  const shard = parseDownloadEntry(entry('DownloadOngoing', { startLayer: 14, endLayer: 28 }), SELF);
  assert.equal(shard.partial, true);
  assert.equal(parseDownloadEntry(entry('DownloadOngoing', { startLayer: 0, endLayer: 14 }), SELF).partial, true);
  assert.equal(parseDownloadEntry(entry('DownloadOngoing', { startLayer: null, endLayer: null, nLayers: null }), SELF).partial, false);
  const snake = parseDownloadEntry(
    { DownloadFailed: { node_id: OTHER, model_id: 'a/b', total: 10, downloaded: 5, read_only: true, error_message: 'disk full', start_layer: 2, end_layer: 4, n_layers: 8, total_files: 2, completed_files: 1 } },
    undefined,
  );
  assert.equal(snake.nodeId, OTHER); // the body's, when no key is given
  assert.equal(snake.modelId, 'a/b');
  assert.equal(snake.readOnly, true);
  assert.equal(snake.errorMessage, 'disk full');
  assert.equal(snake.partial, true);
  assert.equal(snake.fraction, 0.5);
  // the map's key wins over the body's nodeId
  assert.equal(parseDownloadEntry(entry('DownloadOngoing', { nodeId: OTHER }), SELF).nodeId, SELF);
  // an error object instead of a string
  assert.equal(parseDownloadEntry(entry('DownloadFailed', { errorMessage: { message: 'boom' } }), SELF).errorMessage, 'boom');
  for (const bad of [null, 'DownloadPending', [], {}, { DownloadOngoing: {} }, { DownloadOngoing: { modelId: '' } }, { a: 1, b: 2 }]) {
    assert.equal(parseDownloadEntry(bad, SELF), null, JSON.stringify(bad));
  }
});

const STATE = {
  nodeIdentities: { [SELF]: { friendlyName: 'vm' }, [OTHER]: { friendlyName: 'gpu-box' } },
  downloads: {
    [SELF]: [
      entry('DownloadCompleted', { modelId: 'karpathy/stories260K', total: MiB, downloaded: MiB }),
      entry('DownloadOngoing'),
      entry('DownloadFailed', { modelId: 'z/broken', errorMessage: 'HTTP 404: Repository Not Found', total: 0, downloaded: 0 }),
      entry('DownloadCompleted', { modelId: 'ro/model', readOnly: true }),
      'garbage',
    ],
    [OTHER]: [
      entry('DownloadPending', { nodeId: OTHER, total: 0, downloaded: 0, startLayer: 14 }),
      entry('DownloadOngoing', { nodeId: OTHER, modelId: 'a/first', total: 10 * GiB, downloaded: 9 * GiB }),
    ],
    'cafebabe-0000-4000-8000-00000000dead': [entry('DownloadOngoing', { modelId: 'gone/model' })],
    'not-a-list': { x: entry('DownloadCompleted', { modelId: 'obj/model' }) },
    weird: 'nope',
  },
};

test('buildDownloadsView: one row per (node, model), under way first', () => {
  const rows = buildDownloadsView(STATE);
  assert.deepEqual(
    rows.map((r) => [r.status, r.modelId, r.nodeName]),
    [
      ['ongoing', 'a/first', 'gpu-box'],
      ['ongoing', 'gone/model', 'cafebabe'],
      ['ongoing', 'mlx-community/Qwen3-0.6B-4bit', 'vm'],
      ['pending', 'mlx-community/Qwen3-0.6B-4bit', 'gpu-box'],
      ['failed', 'z/broken', 'vm'],
      ['completed', 'karpathy/stories260K', 'vm'],
      ['completed', 'obj/model', 'not'], // shortId of an id that is not a member
      ['completed', 'ro/model', 'vm'],
    ],
  );
  const by = (model, node) => rows.find((r) => r.modelId === model && r.nodeName === node);
  const ongoing = by('mlx-community/Qwen3-0.6B-4bit', 'vm');
  assert.equal(ongoing.key, `${SELF}\u0000mlx-community/Qwen3-0.6B-4bit`);
  assert.equal(ongoing.nodeGone, false);
  assert.equal(ongoing.files, '3/7');
  assert.equal(ongoing.layers, '');
  assert.deepEqual([ongoing.canCancel, ongoing.canDelete, ongoing.canRetry], [true, false, false]);
  const pending = by('mlx-community/Qwen3-0.6B-4bit', 'gpu-box');
  assert.equal(pending.layers, 'layers 14–27 of 28');
  assert.deepEqual([pending.canCancel, pending.canDelete, pending.canRetry], [true, false, false]);
  assert.equal(downloadDetails(pending), 'files 3/7 · layers 14–27 of 28');
  const failed = by('z/broken', 'vm');
  assert.deepEqual([failed.canCancel, failed.canDelete, failed.canRetry], [false, false, true]);
  assert.equal(failed.errorMessage, 'HTTP 404: Repository Not Found');
  const done = by('karpathy/stories260K', 'vm');
  assert.deepEqual([done.canCancel, done.canDelete, done.canRetry], [false, true, false]);
  assert.equal(downloadStatusText(done), 'Downloaded');
  assert.equal(downloadDetails(done), '1.0 / 1.0 MiB · files 3/7');
  const ro = by('ro/model', 'vm');
  assert.equal(ro.readOnly, true);
  assert.equal(ro.canDelete, false); // read-only: nothing to delete from here
  assert.equal(rows.find((r) => r.modelId === 'gone/model').nodeGone, true);
  assert.equal(downloadsSummary(rows), '3 downloading · 1 queued · 1 failed · 3 done');
});

test('buildDownloadsView: no downloads, an older daemon, node ids that are not plain keys', () => {
  assert.deepEqual(buildDownloadsView({}), []);
  assert.deepEqual(buildDownloadsView(null), []);
  assert.deepEqual(buildDownloadsView({ downloads: [] }), []);
  assert.deepEqual(buildDownloadsView({ downloads: { [SELF]: [] } }), []);
  assert.equal(downloadsSummary([]), '');
  const rows = buildDownloadsView(JSON.parse(`{"downloads": {"__proto__": [${JSON.stringify(entry('DownloadOngoing'))}]}}`));
  assert.equal(rows.length, 1);
  assert.equal(rows[0].nodeId, '__proto__');
});

// ---- a model's status --------------------------------------------------------------------

const row = (status, body = {}) => ({ status, nodeId: SELF, nodeName: 'vm', total: 100, downloaded: 50, partial: false, ...body });

test('modelDownloadState: the card, made fresher by the State', () => {
  assert.deepEqual(modelDownloadState('downloadable', []), { status: 'downloadable', fraction: null, failed: false, nodes: [] });
  assert.deepEqual(modelDownloadState('downloaded', []), { status: 'downloaded', fraction: null, failed: false, nodes: [] });
  // no status in the card: an older daemon, that lists only what is on disk
  assert.equal(modelDownloadState(undefined, []).status, 'downloaded');
  assert.equal(modelDownloadState(null, []).status, 'downloaded');
  assert.equal(modelDownloadState('something-new', []).status, 'downloadable');
  // a download started since the list was loaded
  assert.deepEqual(modelDownloadState('downloadable', [row('ongoing'), row('pending', { nodeId: OTHER, nodeName: 'gpu-box', total: 300, downloaded: 0 })]), {
    status: 'downloading',
    fraction: 0.125,
    failed: false,
    nodes: ['vm', 'gpu-box'],
  });
  assert.equal(modelDownloadState('downloading', [row('pending', { total: 0, downloaded: 0 })]).fraction, 0);
  // the card says downloading, the State has no row yet
  assert.deepEqual(modelDownloadState('downloading', []), { status: 'downloading', fraction: null, failed: false, nodes: [] });
  // it completed since: downloaded; a completed shard alone is not the model
  assert.equal(modelDownloadState('downloading', [row('completed')]).status, 'downloaded');
  assert.equal(modelDownloadState('downloadable', [row('completed', { partial: true })]).status, 'downloadable');
  // on disk already, fetched to one more node: still downloaded
  assert.equal(modelDownloadState('downloaded', [row('ongoing')]).status, 'downloaded');
  // failed, nothing under way
  assert.equal(modelDownloadState('downloadable', [row('failed')]).failed, true);
  assert.equal(modelDownloadState('downloadable', [row('failed'), row('ongoing')]).failed, false);
  assert.equal(modelDownloadState('downloaded', [row('failed')]).failed, false);
  assert.equal(modelDownloadState('downloadable', null).status, 'downloadable');
});

test('modelStatusBadge: text and pill', () => {
  assert.deepEqual(modelStatusBadge('downloaded'), { text: 'downloaded', kind: 'ok' });
  assert.deepEqual(modelStatusBadge('downloading', 0.456), { text: 'downloading 45%', kind: 'busy' });
  assert.deepEqual(modelStatusBadge('downloading', 0), { text: 'downloading 0%', kind: 'busy' });
  assert.deepEqual(modelStatusBadge('downloading', 1), { text: 'downloading 99%', kind: 'busy' });
  assert.deepEqual(modelStatusBadge('downloading', null), { text: 'downloading', kind: 'busy' });
  assert.deepEqual(modelStatusBadge('downloading', NaN), { text: 'downloading', kind: 'busy' });
  assert.deepEqual(modelStatusBadge('downloadable'), { text: 'downloadable', kind: '' });
  assert.deepEqual(modelStatusBadge('downloadable', null, true), { text: 'download failed', kind: 'bad' });
});

test('buildModelsView: status, custom cards, downloads from the State, on disk first', () => {
  const models = {
    object: 'list',
    data: [
      { id: 'z/catalogue', name: 'A catalogue model', status: 'downloadable', storage_size_megabytes: 4096, is_custom: false },
      { id: 'me/custom', name: 'custom', status: 'downloadable', is_custom: true },
      { id: 'karpathy/stories260K', name: 'stories260K', status: 'downloaded', storage_size_megabytes: 1 },
      { id: 'mlx-community/Qwen3-0.6B-4bit', name: 'Qwen3-0.6B-4bit', status: 'downloadable' },
      { id: 'b/fetching', name: 'fetching', status: 'downloading' },
    ],
  };
  const nodes = [{ id: SELF, name: 'vm', displayName: 'vm', ramAvailable: 8 * GiB, models: ['karpathy/stories260K'] }];
  const downloads = buildDownloadsView(STATE);
  const list = buildModelsView(models, [], nodes, downloads);
  assert.deepEqual(
    list.map((m) => [m.id, m.status]),
    [
      ['karpathy/stories260K', 'downloaded'],
      ['b/fetching', 'downloading'],
      ['mlx-community/Qwen3-0.6B-4bit', 'downloading'], // the State is fresher than the list
      ['z/catalogue', 'downloadable'],
      ['me/custom', 'downloadable'],
    ],
  );
  const qwen = list.find((m) => m.id === 'mlx-community/Qwen3-0.6B-4bit');
  assert.equal(qwen.downloadFraction, 0.25); // 1 GiB of 4 on vm, the pending shard's total not known yet
  assert.deepEqual(qwen.downloadingOn, ['vm', 'gpu-box']);
  assert.equal(modelStatusBadge(qwen.status, qwen.downloadFraction).text, 'downloading 25%');
  const custom = list.find((m) => m.id === 'me/custom');
  assert.equal(custom.isCustom, true);
  assert.equal(list.find((m) => m.id === 'z/catalogue').isCustom, false);
  assert.equal(list.find((m) => m.id === 'z/catalogue').sizeBytes, 4 * GiB);
  assert.equal(list.find((m) => m.id === 'b/fetching').downloadFraction, null);
  // a model only another node has on disk is downloaded
  const remote = buildModelsView({ data: [] }, [], [{ id: OTHER, name: 'gpu-box', models: ['x/y'] }]);
  assert.deepEqual(remote.map((m) => [m.id, m.status, m.local]), [['x/y', 'downloaded', false]]);
  // without downloads (the old three-argument call)
  assert.equal(buildModelsView(models, [], nodes).find((m) => m.id === 'mlx-community/Qwen3-0.6B-4bit').status, 'downloadable');
});

test('buildModelsView: a failed download of a downloadable model', () => {
  const list = buildModelsView({ data: [{ id: 'z/broken', status: 'downloadable' }] }, [], [], buildDownloadsView(STATE));
  assert.equal(list[0].downloadFailed, true);
  assert.deepEqual(modelStatusBadge(list[0].status, list[0].downloadFraction, list[0].downloadFailed), { text: 'download failed', kind: 'bad' });
});
