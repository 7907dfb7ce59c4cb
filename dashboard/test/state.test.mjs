import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  buildDeletedInstancesView,
  buildInstancesView,
  formatAgo,
  buildModelsView,
  buildNodesView,
  chatModelOptions,
  isServing,
  pickChatModel,
  runnerStatusView,
  unwrapTagged,
} from '../src/lib.js';

const SELF = '25d2d2b1-3cc0-4918-a21a-956ed124c610';
const OTHER = '9b1f0c2e-7a4d-4c1e-8f00-1234567890ab';

// GET /state of the daemon with one ready instance (as served), plus a
// second node, a two-node instance still loading, a failed one and tasks.
const STATE = {
  instances: {
    'aac087a5-78ff-4976-9c90-52d070c84c9b': {
      MlxRingInstance: {
        instanceId: 'aac087a5-78ff-4976-9c90-52d070c84c9b',
        shardAssignments: {
          modelId: 'karpathy/stories260K',
          runnerToShard: {
            '7f4c0f40-ea6b-4fc5-8f63-939a530654d5': {
              PipelineShardMetadata: {
                modelCard: { modelId: 'karpathy/stories260K' },
                deviceRank: 0,
                worldSize: 1,
                startLayer: 0,
                endLayer: 5,
                nLayers: 5,
              },
            },
          },
          nodeToRunner: { [SELF]: '7f4c0f40-ea6b-4fc5-8f63-939a530654d5' },
        },
        sharding: 'Pipeline',
      },
    },
    'bbbbbbbb-0000-4000-8000-000000000001': {
      MlxRingInstance: {
        instanceId: 'bbbbbbbb-0000-4000-8000-000000000001',
        shardAssignments: {
          modelId: 'mlx-community/Llama-3.2-1B-Instruct-4bit',
          runnerToShard: {
            'r-second': { PipelineShardMetadata: { deviceRank: 1, worldSize: 2, startLayer: 10, endLayer: 16, nLayers: 16 } },
            'r-first': { PipelineShardMetadata: { deviceRank: 0, worldSize: 2, startLayer: 0, endLayer: 10, nLayers: 16 } },
          },
          nodeToRunner: { [SELF]: 'r-first', [OTHER]: 'r-second' },
        },
      },
    },
    'cccccccc-0000-4000-8000-000000000002': {
      MlxJacclInstance: {
        instanceId: 'cccccccc-0000-4000-8000-000000000002',
        shardAssignments: {
          modelId: 'mlx-community/Qwen3-0.6B-4bit',
          runnerToShard: { 'r-bad': { TensorShardMetadata: { deviceRank: 0, worldSize: 1, startLayer: 0, endLayer: 28, nLayers: 28 } } },
          nodeToRunner: { [OTHER]: 'r-bad' },
        },
      },
    },
  },
  runners: {
    '7f4c0f40-ea6b-4fc5-8f63-939a530654d5': { RunnerReady: { prefillServerPort: null } },
    'r-first': { RunnerLoading: { layersLoaded: 5, totalLayers: 10 } },
    'r-second': { RunnerReady: {} },
    'r-bad': { RunnerFailed: { errorMessage: 'out of memory loading layer 3' } },
  },
  tasks: {
    't1': { TextGeneration: { taskId: 't1', taskStatus: 'Running', instanceId: 'aac087a5-78ff-4976-9c90-52d070c84c9b' } },
    't2': { TextGeneration: { taskId: 't2', taskStatus: 'Complete', instanceId: 'aac087a5-78ff-4976-9c90-52d070c84c9b' } },
    't3': { TextGeneration: { taskId: 't3', taskStatus: 'Pending', instanceId: 'aac087a5-78ff-4976-9c90-52d070c84c9b' } },
  },
  lastSeen: { [SELF]: '2026-11-29T23:46:53.949Z', [OTHER]: '2026-11-29T23:46:50.000Z' },
  nodeIdentities: {
    [SELF]: { friendlyName: 'vm', cpuCount: 2 },
    [OTHER]: { friendlyName: 'alpha', cpuCount: 16 },
  },
  nodeMemory: {
    [SELF]: { ramTotal: { inBytes: 25276502016 }, ramAvailable: { inBytes: 24192163840 } },
    [OTHER]: { ramTotal: { inBytes: 68719476736 }, ramAvailable: { inBytes: 34359738368 } },
  },
  nodeBackends: { [SELF]: ['Cpu'], [OTHER]: ['Cpu', 'Cuda'] },
  lastEventAppliedIdx: 8,
};

const MODELS = {
  object: 'list',
  data: [
    {
      id: 'karpathy/stories260K',
      object: 'model',
      created: 1795996012,
      owned_by: 'exo',
      hugging_face_id: 'karpathy/stories260K',
      name: 'stories260K',
      description: '',
      context_length: 512,
      tags: [],
      storage_size_megabytes: 1,
      supports_tensor: true,
      tasks: ['TextGeneration'],
      is_custom: false,
      family: 'llama',
      quantization: 'fp32',
      base_model: 'stories260K',
      capabilities: ['text'],
      reasoning_dialect: null,
    },
    { id: 'mlx-community/Llama-3.2-1B-Instruct-4bit', name: 'Llama 3.2 1B', storage_size_megabytes: 695, family: 'llama', quantization: '4bit', context_length: 131072, capabilities: ['text', 'tools'] },
    { id: 'big/model', name: 'Big', storage_size_megabytes: 200000, capabilities: ['text', 'thinking'] },
    { id: 'x/no-name' },
    { name: 'no id: dropped' },
  ],
};

test('unwrapTagged', () => {
  assert.deepEqual(unwrapTagged({ RunnerReady: {} }), ['RunnerReady', {}]);
  assert.deepEqual(unwrapTagged({ RunnerLoading: { layersLoaded: 1 } }), ['RunnerLoading', { layersLoaded: 1 }]);
  assert.deepEqual(unwrapTagged('RunnerIdle'), ['RunnerIdle', {}]);
  assert.deepEqual(unwrapTagged({ RunnerReady: null }), ['RunnerReady', {}]);
  assert.deepEqual(unwrapTagged(null), [null, {}]);
  assert.deepEqual(unwrapTagged([1]), [null, {}]);
  assert.deepEqual(unwrapTagged({ a: 1, b: 2 }), [null, { a: 1, b: 2 }]);
});

test('runnerStatusView: every status exo has', () => {
  const v = (s) => runnerStatusView(s);
  assert.deepEqual(v({ RunnerLoading: { layersLoaded: 3, totalLayers: 12 } }), {
    tag: 'RunnerLoading', label: 'Loading', phase: 'loading', progress: 0.25, detail: '3/12 layers', error: null,
  });
  assert.equal(v({ RunnerLoading: { layers_loaded: 12, total_layers: 12 } }).progress, 1);
  assert.equal(v({ RunnerLoading: {} }).progress, 0);
  assert.equal(v({ RunnerLoaded: {} }).progress, 1);
  assert.equal(v({ RunnerWarmingUp: {} }).label, 'Warming up');
  assert.equal(v({ RunnerReady: { prefillServerPort: null } }).phase, 'ready');
  assert.equal(v({ RunnerRunning: {} }).phase, 'running');
  assert.equal(v({ RunnerIdle: {} }).phase, 'starting');
  assert.equal(v({ RunnerConnecting: {} }).label, 'Connecting');
  assert.equal(v({ RunnerShuttingDown: {} }).phase, 'stopping');
  assert.equal(v({ RunnerShutdown: {} }).label, 'Shut down');
  const failed = v({ RunnerFailed: { errorMessage: 'boom', diagnostics: null } });
  assert.equal(failed.phase, 'failed');
  assert.equal(failed.error, 'boom');
  assert.equal(v({ RunnerFailed: {} }).error, 'runner failed');
  assert.equal(v(undefined).label, 'Pending');
  const odd = v({ RunnerDoingSomethingNew: {} });
  assert.equal(odd.label, 'Doing Something New');
  assert.equal(odd.phase, 'unknown');
});

test('buildNodesView: this node first, memory and backends', () => {
  const nodes = buildNodesView(STATE, SELF);
  assert.equal(nodes.length, 2);
  const [self, other] = nodes;
  assert.deepEqual(self, {
    id: SELF,
    shortId: '25d2d2b1',
    name: 'vm',
    displayName: 'vm',
    isSelf: true,
    isMaster: false,
    cpuCount: 2,
    cpuModel: null,
    os: null,
    backends: ['Cpu'],
    ramTotal: 25276502016,
    ramAvailable: 24192163840,
    ramUsed: 25276502016 - 24192163840,
    usedFraction: (25276502016 - 24192163840) / 25276502016,
    diskTotal: null,
    diskAvailable: null,
    diskUsed: null,
    diskFraction: null,
    gpus: [],
    weightRoom: 24192163840,
    models: [],
    interfaces: [],
    apiPort: null,
    clusterPort: null,
    lastSeen: '2026-11-29T23:46:53.949Z',
    runnerCount: 2,
  });
  assert.equal(other.name, 'alpha');
  assert.equal(other.isSelf, false);
  assert.deepEqual(other.backends, ['Cpu', 'Cuda']);
  assert.equal(other.usedFraction, 0.5);
  assert.equal(other.runnerCount, 2);
  // without knowing our id: sorted by name
  assert.deepEqual(buildNodesView(STATE, null).map((n) => n.name), ['alpha', 'vm']);
});

test('buildNodesView: partial and empty states', () => {
  assert.deepEqual(buildNodesView({}, SELF), []);
  assert.deepEqual(buildNodesView(null, SELF), []);
  const nodes = buildNodesView({ lastSeen: { [OTHER]: 'x' } }, SELF);
  assert.equal(nodes.length, 1);
  assert.equal(nodes[0].name, '9b1f0c2e');
  assert.equal(nodes[0].ramTotal, null);
  assert.equal(nodes[0].usedFraction, null);
  assert.equal(nodes[0].cpuCount, null);
  assert.deepEqual(nodes[0].backends, []);
  // snake_case memory (exo's plain pydantic) also reads
  const snake = buildNodesView({ nodeMemory: { a: { ram_total: { in_bytes: 100 }, ram_available: { in_bytes: 25 } } } }, 'a');
  assert.equal(snake[0].usedFraction, 0.75);
});

test('buildInstancesView: ready, loading over two nodes, failed; tasks', () => {
  const insts = buildInstancesView(STATE);
  assert.deepEqual(insts.map((i) => i.modelId), [
    'karpathy/stories260K',
    'mlx-community/Llama-3.2-1B-Instruct-4bit',
    'mlx-community/Qwen3-0.6B-4bit',
  ]);
  const [ready, loading, failed] = insts;

  assert.equal(ready.id, 'aac087a5-78ff-4976-9c90-52d070c84c9b');
  assert.equal(ready.kind, 'MlxRingInstance');
  assert.equal(ready.kindLabel, 'MLX Ring');
  assert.equal(ready.sharding, 'Pipeline');
  assert.equal(ready.phase, 'ready');
  assert.equal(ready.label, 'Ready');
  assert.equal(ready.progress, null);
  assert.equal(ready.error, null);
  assert.equal(ready.activeTasks, 2);
  assert.equal(isServing(ready), true);
  assert.deepEqual(ready.runners, [{
    runnerId: '7f4c0f40-ea6b-4fc5-8f63-939a530654d5',
    nodeId: SELF,
    device: null,
    nodeName: 'vm',
    nodeGone: false,
    shardKind: 'Pipeline',
    startLayer: 0,
    endLayer: 5,
    nLayers: 5,
    deviceRank: 0,
    worldSize: 1,
    status: runnerStatusView({ RunnerReady: { prefillServerPort: null } }),
  }]);

  assert.equal(loading.phase, 'loading');
  assert.equal(loading.label, 'Loading');
  assert.equal(isServing(loading), false);
  assert.equal(loading.sharding, 'Pipeline'); // from the shards
  // ranks in order; 5 of 10 layers + 6 of 6 layers = 11/16
  assert.deepEqual(loading.runners.map((r) => [r.runnerId, r.nodeName, r.deviceRank]), [
    ['r-first', 'vm', 0],
    ['r-second', 'alpha', 1],
  ]);
  assert.equal(loading.progress, 11 / 16);
  assert.equal(loading.activeTasks, 0);

  assert.equal(failed.phase, 'failed');
  assert.equal(failed.kindLabel, 'MLX Jaccl');
  assert.equal(failed.sharding, 'Tensor');
  assert.equal(failed.error, 'out of memory loading layer 3');
  assert.equal(failed.progress, null);
});

test('buildInstancesView: runner states combine into the instance', () => {
  const inst = (statuses) => ({
    instances: {
      i: {
        MlxRingInstance: {
          instanceId: 'i',
          shardAssignments: {
            modelId: 'm',
            runnerToShard: Object.fromEntries(statuses.map((_, k) => [`r${k}`, { PipelineShardMetadata: { deviceRank: k, startLayer: k * 4, endLayer: k * 4 + 4, nLayers: 4 * statuses.length } }])),
            nodeToRunner: Object.fromEntries(statuses.map((_, k) => [`n${k}`, `r${k}`])),
          },
        },
      },
    },
    runners: Object.fromEntries(statuses.map((s, k) => [`r${k}`, s]).filter(([, s]) => s)),
  });
  const one = (statuses) => buildInstancesView(inst(statuses))[0];
  assert.equal(one([{ RunnerReady: {} }, { RunnerRunning: {} }]).phase, 'running');
  assert.equal(one([{ RunnerReady: {} }, { RunnerRunning: {} }]).label, 'Generating');
  assert.equal(one([{ RunnerRunning: {} }]).phase, 'running');
  assert.equal(one([{ RunnerReady: {} }, { RunnerReady: {} }]).phase, 'ready');
  assert.equal(one([{ RunnerReady: {} }, { RunnerWarmingUp: {} }]).phase, 'loading');
  assert.equal(one([{ RunnerReady: {} }, { RunnerWarmingUp: {} }]).progress, 1);
  const pending = one([undefined, { RunnerIdle: {} }]);
  assert.equal(pending.phase, 'starting');
  assert.equal(pending.progress, 0);
  assert.equal(pending.label, 'Starting');
  assert.equal(one([{ RunnerReady: {} }, { RunnerShuttingDown: {} }]).phase, 'stopping');
  assert.equal(one([{ RunnerFailed: { errorMessage: 'x' } }, { RunnerLoading: { layersLoaded: 1, totalLayers: 4 } }]).phase, 'failed');
  assert.equal(one([{ RunnerLoading: { layersLoaded: 2, totalLayers: 4 } }, { RunnerLoading: { layersLoaded: 0, totalLayers: 4 } }]).progress, 0.25);
});

test('buildInstancesView: empty and odd input', () => {
  assert.deepEqual(buildInstancesView({}), []);
  assert.deepEqual(buildInstancesView(null), []);
  const [i] = buildInstancesView({ instances: { k: { SomethingNew: {} } } });
  assert.equal(i.id, 'k');
  assert.equal(i.modelId, '?');
  assert.equal(i.kindLabel, 'SomethingNew');
  assert.deepEqual(i.runners, []);
  assert.equal(i.phase, 'starting');
});

test('chatModelOptions and pickChatModel', () => {
  const insts = buildInstancesView(STATE);
  const opts = chatModelOptions(insts, MODELS.data);
  assert.deepEqual(opts, [
    { modelId: 'karpathy/stories260K', ready: true, label: 'stories260K' },
    { modelId: 'mlx-community/Llama-3.2-1B-Instruct-4bit', ready: false, label: 'Llama 3.2 1B (loading 69%)' },
    { modelId: 'mlx-community/Qwen3-0.6B-4bit', ready: false, label: 'mlx-community/Qwen3-0.6B-4bit (failed)' },
  ]);
  assert.equal(pickChatModel(opts, null), 'karpathy/stories260K');
  assert.equal(pickChatModel(opts, 'mlx-community/Qwen3-0.6B-4bit'), 'mlx-community/Qwen3-0.6B-4bit');
  assert.equal(pickChatModel(opts, 'gone/model'), 'karpathy/stories260K');
  assert.equal(pickChatModel([], 'gone/model'), null);
  assert.equal(pickChatModel([opts[1]], null), 'mlx-community/Llama-3.2-1B-Instruct-4bit');
  // one ready instance among several of a model makes it ready
  const two = [
    { modelId: 'm', phase: 'loading', progress: 0.5 },
    { modelId: 'm', phase: 'ready', progress: null },
  ];
  assert.deepEqual(chatModelOptions(two, []), [{ modelId: 'm', ready: true, label: 'm' }]);
  assert.deepEqual(chatModelOptions([{ modelId: 'm', phase: 'starting', progress: null }], []), [
    { modelId: 'm', ready: false, label: 'm (starting)' },
  ]);
});

test('buildModelsView: fields, sizes, instances, fit, sorting', () => {
  const nodes = buildNodesView(STATE, SELF);
  const insts = buildInstancesView(STATE);
  const models = buildModelsView(MODELS, insts, nodes);
  assert.deepEqual(models.map((m) => m.id), [
    'big/model',
    'mlx-community/Llama-3.2-1B-Instruct-4bit',
    'karpathy/stories260K',
    'x/no-name',
  ]);
  const stories = models.find((m) => m.id === 'karpathy/stories260K');
  assert.deepEqual(stories, {
    id: 'karpathy/stories260K',
    name: 'stories260K',
    family: 'llama',
    quantization: 'fp32',
    sizeBytes: 1048576,
    contextLength: 512,
    capabilities: ['text'],
    instances: 1,
    readyInstances: 1,
    fits: true,
    local: true,
    onNodes: [],
    // no `status` in the card (an older daemon lists only what is on disk)
    status: 'downloaded',
    isCustom: false,
    downloadFraction: null,
    downloadFailed: false,
    downloadingOn: [],
  });
  const llama = models.find((m) => m.id === 'mlx-community/Llama-3.2-1B-Instruct-4bit');
  assert.equal(llama.instances, 1);
  assert.equal(llama.readyInstances, 0);
  const big = models.find((m) => m.id === 'big/model');
  assert.equal(big.fits, false); // 195 GiB > 22.5 + 32 GiB free
  const bare = models.find((m) => m.id === 'x/no-name');
  assert.equal(bare.name, 'x/no-name');
  assert.equal(bare.sizeBytes, null);
  assert.equal(bare.contextLength, null);
  assert.equal(bare.fits, true);
  assert.deepEqual(bare.capabilities, []);
  // a plain array also works; no memory known -> everything fits
  assert.equal(buildModelsView(MODELS.data, [], [])[0].fits, true);
  assert.deepEqual(buildModelsView(null, [], []), []);
});

test('buildDeletedInstancesView: newest first, with the reason and time; older records without them', () => {
  const st = {
    deletedInstances: {
      'i-old': { instanceId: 'i-old', modelId: 'org/a', reason: null, deletedAt: null },
      'i-user': { instanceId: 'i-user', modelId: 'org/b', reason: 'deleted by user', deletedAt: '2026-01-01T00:00:00.000Z' },
      'i-node': { instanceId: 'i-node', modelId: 'org/c', reason: 'node 9b1f left the cluster', deletedAt: '2026-01-01T00:01:00.500Z' },
      junk: 7,
    },
  };
  assert.deepEqual(buildDeletedInstancesView(st), [
    { id: 'i-node', modelId: 'org/c', reason: 'node 9b1f left the cluster', when: Date.UTC(2026, 0, 1, 0, 1, 0, 500) },
    { id: 'i-user', modelId: 'org/b', reason: 'deleted by user', when: Date.UTC(2026, 0, 1) },
    { id: 'i-old', modelId: 'org/a', reason: null, when: null },
  ]);
  // a daemon that does not report them, or no State at all
  assert.deepEqual(buildDeletedInstancesView({ instances: {} }), []);
  assert.deepEqual(buildDeletedInstancesView(null), []);
});

test('formatAgo', () => {
  const now = Date.UTC(2026, 0, 2);
  assert.equal(formatAgo(now - 1000, now), 'just now');
  assert.equal(formatAgo(now - 42000, now), '42 s ago');
  assert.equal(formatAgo(now - 5 * 60000, now), '5 min ago');
  assert.equal(formatAgo(now - 3 * 3600000, now), '3 h ago');
  assert.equal(formatAgo(now - 2 * 86400000, now), '2 d ago');
  assert.equal(formatAgo(now + 5000, now), 'just now', 'a clock ahead of ours');
  assert.equal(formatAgo(null, now), '');
});
