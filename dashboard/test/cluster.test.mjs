// The cluster views of lib.js: nodes, GET /cluster, the topology graph's
// links and geometry, where shards run, placement previews. Most cases use
// real payloads of 3-node clusters (test/fixtures/cluster3.json); the rest
// feed partial, null and hostile State to every builder.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';

import {
  bandwidthTier,
  buildClusterView,
  buildInstancesView,
  buildLinks,
  buildModelsView,
  buildNodesView,
  buildPreviewsView,
  buildTopologyView,
  circleLayout,
  clusterNodeIds,
  compareConnections,
  edgeWidth,
  formatBandwidth,
  formatLatency,
  formatLayers,
  formatUsedOfTotal,
  linkTitle,
  nodeNames,
  placeEdgeLabels,
  placementLabel,
} from '../src/lib.js';

const FX = JSON.parse(fs.readFileSync(new URL('./fixtures/cluster3.json', import.meta.url), 'utf8'));
const PLACED = FX.placed; // the model on one node, an instance on it; served by a follower
const SPREAD = FX.spread; // the model on every node, no instance; served by the master

const A = '51969ef392f2604f7db1ceeac7042735'; // placed: this node, has the model and the runner
const M = 'de6d0091d3f40e1d7350a19de8ac86e7'; // placed: the master
const C = '896a4eefe9978e460befff9d58ba303d'; // placed: the third
const S = 'b02c8465224d2a020a52b4f17324a95f'; // spread: this node and the master
const T = '18bc3ea0086df0a7d6f5046527a6a0a9';
const U = '70fcb4a9abb6b825b314eab76e82f9ee';

const clone = (v) => JSON.parse(JSON.stringify(v));

// ---- formatting ------------------------------------------------------------------------

test('formatLatency: µs below a millisecond, then ms, then s', () => {
  assert.equal(formatLatency(0), '0 µs');
  assert.equal(formatLatency(130), '130 µs');
  assert.equal(formatLatency(999.4), '999 µs');
  assert.equal(formatLatency(999.6), '1.0 ms'); // not "1000 µs"
  assert.equal(formatLatency(1500), '1.5 ms');
  assert.equal(formatLatency(9960), '10 ms'); // not "10.0 ms"
  assert.equal(formatLatency(25300), '25 ms');
  assert.equal(formatLatency(999600), '1.00 s'); // not "1000 ms"
  assert.equal(formatLatency(2.5e6), '2.50 s');
  for (const bad of [-1, NaN, Infinity, null, undefined, '130', {}]) assert.equal(formatLatency(bad), '—');
});

test('formatBandwidth: bits per second in decimal units, three digits', () => {
  assert.equal(formatBandwidth(0), '0 bit/s');
  assert.equal(formatBandwidth(999), '999 bit/s');
  assert.equal(formatBandwidth(999.6), '1.00 kbit/s');
  assert.equal(formatBandwidth(56000), '56.0 kbit/s');
  assert.equal(formatBandwidth(283665094), '284 Mbit/s');
  assert.equal(formatBandwidth(1649676116), '1.65 Gbit/s');
  assert.equal(formatBandwidth(999.5e6), '1.00 Gbit/s'); // not "1000 Mbit/s"
  assert.equal(formatBandwidth(2.5e10), '25.0 Gbit/s');
  assert.equal(formatBandwidth(4e11), '400 Gbit/s');
  assert.equal(formatBandwidth(1.5e12), '1.50 Tbit/s');
  assert.equal(formatBandwidth(2e15), '2000 Tbit/s'); // no larger unit
  for (const bad of [-1, NaN, null, undefined, '1e9']) assert.equal(formatBandwidth(bad), '—');
});

test('bandwidthTier and edgeWidth: by factors of ten from 100 Mbit/s', () => {
  assert.equal(bandwidthTier(null), 'unknown');
  assert.equal(bandwidthTier(-5), 'unknown');
  assert.equal(bandwidthTier(0), 'slow');
  assert.equal(bandwidthTier(99999999), 'slow');
  assert.equal(bandwidthTier(1e8), 'medium');
  assert.equal(bandwidthTier(1e9), 'fast');
  assert.equal(bandwidthTier(9.99e9), 'fast');
  assert.equal(bandwidthTier(1e10), 'fastest');
  assert.equal(edgeWidth(null), 1.5);
  assert.equal(edgeWidth(0), 1.5);
  assert.equal(edgeWidth(1e6), 1.5);
  assert.equal(edgeWidth(1e8), 1.5);
  assert.equal(edgeWidth(1e9), 3);
  assert.equal(edgeWidth(1e10), 4.5);
  assert.equal(edgeWidth(1e11), 6);
  assert.equal(edgeWidth(1e14), 6);
  assert.ok(edgeWidth(5e9) > edgeWidth(1e9) && edgeWidth(5e9) < edgeWidth(1e10));
});

test('formatUsedOfTotal and formatLayers', () => {
  assert.equal(formatUsedOfTotal(1.1 * 2 ** 30, 23.5 * 2 ** 30), '1.1 / 23.5 GiB');
  assert.equal(formatUsedOfTotal(512 * 2 ** 20, 23.5 * 2 ** 30), '512 MiB / 23.5 GiB');
  assert.equal(formatUsedOfTotal(null, 2 ** 30), '— / 1.0 GiB');
  assert.equal(formatUsedOfTotal(0, 100), '0 / 100 B');
  assert.equal(formatLayers(0, 2, 2), 'layers 0–1 of 2'); // [start, end): end is not a layer of it
  assert.equal(formatLayers(1, 2, 2), 'layer 1 of 2');
  assert.equal(formatLayers(10, 16, null), 'layers 10–15');
  assert.equal(formatLayers(null, 2, 2), '');
  assert.equal(formatLayers(3, 3, 4), 'layer 3 of 4'); // empty range: no negative end
});

// ---- nodes -------------------------------------------------------------------------------

test('clusterNodeIds: nodeIdentities decides; without it, every map counts', () => {
  assert.deepEqual(clusterNodeIds(PLACED.state).sort(), [A, C, M].sort());
  // a node that timed out left nodeIdentities; stale maps do not bring it back
  const st = clone(PLACED.state);
  delete st.nodeIdentities[C];
  assert.deepEqual(clusterNodeIds(st).sort(), [A, M].sort());
  // an older daemon without nodeIdentities
  assert.deepEqual(clusterNodeIds({ nodeMemory: { x: {} }, lastSeen: { y: '' }, topology: { nodes: ['z', null, 3] } }).sort(), ['x', 'y', 'z']);
  assert.deepEqual(clusterNodeIds({ nodeIdentities: {}, nodeMemory: { x: {} } }), []);
  for (const bad of [null, undefined, 5, 'x', [], { nodeIdentities: null }, { nodeIdentities: [1] }]) {
    assert.deepEqual(clusterNodeIds(bad), []);
  }
});

test('nodeNames: friendly names, told apart by short id when shared', () => {
  const names = nodeNames(PLACED.state); // every VM is called "vm"
  assert.equal(names.get(A), 'vm (51969ef3)');
  assert.equal(names.get(M), 'vm (de6d0091)');
  const st = { nodeIdentities: { n1: { friendlyName: 'alpha' }, n2: { friendlyName: 'beta' }, n3: {}, n4: null, __proto__x: 1 } };
  const n = nodeNames(st);
  assert.equal(n.get('n1'), 'alpha');
  assert.equal(n.get('n3'), 'n3');
  assert.equal(n.get('n4'), 'n4');
  // an id that is a property name of Object.prototype is just an id
  const hostile = JSON.parse('{"nodeIdentities": {"__proto__": {"friendlyName": "p"}, "constructor": {"friendlyName": "c"}}}');
  const h = nodeNames(hostile);
  assert.equal(h.get('__proto__'), 'p');
  assert.equal(h.get('constructor'), 'c');
});

test('buildNodesView: a real 3-node cluster', () => {
  const nodes = buildNodesView(PLACED.state, A, PLACED.cluster.masterNodeId);
  assert.deepEqual(nodes.map((n) => n.id), [A, C, M]); // this node first, then by name, id
  const [self, , master] = nodes;
  assert.equal(self.isSelf, true);
  assert.equal(self.isMaster, false);
  assert.equal(master.isMaster, true);
  assert.equal(nodes.filter((n) => n.isMaster).length, 1);
  assert.equal(self.name, 'vm');
  assert.equal(self.displayName, 'vm (51969ef3)');
  assert.equal(self.shortId, '51969ef3');
  assert.equal(self.cpuModel, 'Intel(R) Xeon(R) Processor');
  assert.equal(self.os, 'Linux 6.18.44-fc-v669 x86_64');
  assert.equal(self.cpuCount, 2);
  assert.deepEqual(self.backends, ['Cpu']);
  assert.deepEqual(self.models, ['exo-cluster/qwen3-tiny']);
  assert.deepEqual(master.models, []);
  assert.deepEqual(self.gpus, []);
  assert.equal(self.runnerCount, 1);
  assert.equal(master.runnerCount, 0);
  const disk = PLACED.state.nodeDisk[A];
  assert.equal(self.diskTotal, disk.total.inBytes);
  assert.equal(self.diskAvailable, disk.available.inBytes);
  assert.equal(self.diskUsed, disk.total.inBytes - disk.available.inBytes);
  assert.ok(self.diskFraction > 0 && self.diskFraction < 1);
  assert.equal(self.interfaces.length, 5);
  assert.deepEqual(self.interfaces[1], { name: 'eth0', ip: '192.0.2.2', kind: 'ethernet' });
  assert.equal(self.clusterPort, PLACED.state.nodeNetwork[A].clusterPort);
  assert.equal(self.apiPort, null); // reported as 0: unknown
  // no master known: nobody is
  assert.equal(buildNodesView(PLACED.state, A).some((n) => n.isMaster), false);
  assert.equal(buildNodesView(PLACED.state, A, null).some((n) => n.isMaster), false);
});

test('buildNodesView: GPUs, in bytes or {inBytes}, snake_case too', () => {
  const st = {
    nodeIdentities: { g: { friendlyName: 'gpu' } },
    nodeGpus: {
      g: [
        { index: 1, name: 'NVIDIA H200', memoryTotal: 1000, memoryUsed: 250 },
        { index: 0, name: 'NVIDIA H200', memory_total: { inBytes: 1000 }, memory_used: { in_bytes: 2000 } },
        null,
        { name: '' },
      ],
    },
  };
  const [n] = buildNodesView(st, null);
  assert.deepEqual(n.gpus, [
    { index: 1, name: 'NVIDIA H200', memoryTotal: 1000, memoryUsed: 250, usedFraction: 0.25 },
    { index: 0, name: 'NVIDIA H200', memoryTotal: 1000, memoryUsed: 2000, usedFraction: 1 }, // clamped
    { index: 3, name: 'GPU', memoryTotal: null, memoryUsed: null, usedFraction: null },
  ]);
});

test('buildNodesView: a node that leaves nodeIdentities disappears', () => {
  const st = clone(PLACED.state);
  delete st.nodeIdentities[C];
  const nodes = buildNodesView(st, A, M);
  assert.deepEqual(nodes.map((n) => n.id), [A, M]);
  // the names of the rest no longer need... they still share "vm"
  assert.equal(nodes[1].displayName, 'vm (de6d0091)');
});

test('buildNodesView: any field missing, null or of the wrong type', () => {
  const id = 'n1';
  const wrecks = [
    { nodeIdentities: { [id]: null } },
    { nodeIdentities: { [id]: 'x' }, nodeMemory: null, nodeDisk: [], nodeSystem: 5, nodeGpus: 'x', nodeModels: {}, nodeNetwork: null },
    {
      nodeIdentities: { [id]: { friendlyName: 7, cpuCount: '2' } },
      nodeMemory: { [id]: { ramTotal: { inBytes: -1 }, ramAvailable: 'a' } },
      nodeDisk: { [id]: { total: null, available: { inBytes: NaN } } },
      nodeSystem: { [id]: { cpuModel: null, os: 3, cpuCount: null } },
      nodeGpus: { [id]: null },
      nodeBackends: { [id]: [null, 3, 'Cpu', { Cuda: {} }] },
      nodeModels: { [id]: ['m', null, 5, ''] },
      nodeNetwork: { [id]: { interfaces: [null, 'x', { name: 3 }], apiPort: 'x', clusterPort: null } },
      lastSeen: { [id]: 5 },
      instances: { i: null, j: { MlxRingInstance: null }, k: { MlxRingInstance: { shardAssignments: { nodeToRunner: null } } } },
    },
  ];
  for (const st of wrecks) {
    const [n] = buildNodesView(st, id, 'other');
    assert.equal(n.id, id);
    assert.equal(n.name, 'n1');
    assert.equal(n.isSelf, true);
    assert.equal(n.isMaster, false);
    assert.equal(n.ramTotal, null);
    assert.equal(n.usedFraction, null);
    assert.equal(n.diskTotal, null);
    assert.equal(n.diskFraction, null);
    assert.equal(n.cpuModel, null);
    assert.equal(n.os, null);
    assert.deepEqual(n.gpus, []);
    assert.equal(n.lastSeen, null);
    assert.equal(n.runnerCount, 0);
    assert.equal(n.apiPort, null);
  }
  const [last] = buildNodesView(wrecks[2], id);
  assert.deepEqual(last.backends, ['Cpu', 'Cuda']);
  assert.deepEqual(last.models, ['m']);
  assert.deepEqual(last.interfaces, [{ name: '', ip: '', kind: '' }]);
  assert.equal(last.cpuCount, null);
});

// ---- GET /cluster ----------------------------------------------------------------------

test('buildClusterView: a follower\'s view of a real cluster', () => {
  const nodes = buildNodesView(PLACED.state, A, PLACED.cluster.masterNodeId);
  const v = buildClusterView(PLACED.cluster, nodes);
  assert.equal(v.nodeId, A);
  assert.equal(v.namespace, PLACED.cluster.namespace);
  assert.equal(v.masterId, M);
  assert.equal(v.masterName, 'vm (de6d0091)');
  assert.equal(v.isMaster, false);
  assert.equal(v.electing, false);
  assert.equal(v.caughtUp, true);
  assert.equal(v.sessionClock, 0);
  assert.equal(v.peers.length, 2);
  assert.deepEqual(v.peers.map((p) => p.id), [C, M]); // by name
  for (const p of v.peers) {
    assert.equal(p.known, true);
    assert.equal(typeof p.rttUs, 'number');
    assert.match(p.remote, /^127\.0\.0\.1:\d+$/);
    assert.equal(p.dialed, false);
  }
  const m = buildClusterView(SPREAD.cluster, buildNodesView(SPREAD.state, S, S));
  assert.equal(m.isMaster, true);
  assert.equal(m.masterId, S);
  assert.ok(m.peers.every((p) => p.dialed === true));
});

test('buildClusterView: an election, unknown peers, partial and absent replies', () => {
  const v = buildClusterView({ electionInProgress: true, masterNodeId: null, caughtUp: false, peers: [{ nodeId: 'zz', rttUs: -3 }, null, { rttUs: 5 }, { nodeId: 'aa', dialed: 'yes', remote: 5 }] }, []);
  assert.equal(v.electing, true);
  assert.equal(v.masterId, null);
  assert.equal(v.masterName, null);
  assert.equal(v.caughtUp, false);
  assert.equal(v.namespace, null);
  assert.equal(v.sessionClock, null);
  assert.deepEqual(v.peers, [
    { id: 'aa', name: 'aa', known: false, remote: '', dialed: null, rttUs: null },
    { id: 'zz', name: 'zz', known: false, remote: '', dialed: null, rttUs: null },
  ]);
  // a master the State does not list (yet): its short id
  assert.equal(buildClusterView({ masterNodeId: M }, []).masterName, 'de6d0091');
  assert.equal(buildClusterView({}, null).caughtUp, true); // unknown is not "behind"
  for (const bad of [null, undefined, 'x', 3, []]) assert.equal(buildClusterView(bad, []), null);
});

// ---- links -------------------------------------------------------------------------------

test('compareConnections: bandwidth, then latency, then address; unknowns last', () => {
  const c = (address, bandwidthBps, latencyUs) => ({ address, bandwidthBps, latencyUs });
  const list = [
    c('e', null, null),
    c('d', null, 10),
    c('c', 1e9, null),
    c('b', 1e9, 300),
    c('a2', 1e9, 100),
    c('a1', 1e9, 100),
    c('f', 2e9, 900),
  ];
  assert.deepEqual([...list].sort(compareConnections).map((x) => x.address), ['f', 'a1', 'a2', 'b', 'c', 'd', 'e']);
});

test('buildLinks: one link per pair, each direction best first, from real probes', () => {
  const ids = [S, T, U];
  const links = buildLinks(SPREAD.state.topology, ids);
  assert.equal(links.length, 3);
  assert.deepEqual(links.map((l) => [l.a, l.b]), [[S, T], [S, U], [T, U]]); // in the order of ids
  const conns = SPREAD.state.topology.connections;
  assert.equal(links.reduce((s, l) => s + l.count, 0), conns.length);
  for (const l of links) {
    assert.equal(l.ab.length, conns.filter((c) => c.source === l.a && c.sink === l.b).length);
    assert.equal(l.ba.length, conns.filter((c) => c.source === l.b && c.sink === l.a).length);
    for (const dir of [l.ab, l.ba]) {
      for (let i = 1; i < dir.length; i++) assert.ok(compareConnections(dir[i - 1], dir[i]) <= 0);
    }
    const expect = [l.ab[0], l.ba[0]].filter(Boolean).sort((x, y) => y.bandwidthBps - x.bandwidthBps)[0];
    assert.equal(l.best, expect);
    assert.equal(l.latencyUs, expect.latencyUs);
    assert.equal(l.bandwidthBps, expect.bandwidthBps);
  }
  // S -> T measured 127.0.0.1:37105 fastest (1.51 Gbit/s); T -> S only 683 Mbit/s at best
  const st = links[0];
  assert.equal(st.ab[0].address, '127.0.0.1:37105');
  assert.equal(st.ba[0].address, '[::1]:34319');
  assert.equal(st.best, st.ab[0]);
  assert.equal(formatBandwidth(st.bandwidthBps), '1.51 Gbit/s');
  assert.equal(formatLatency(st.latencyUs), '275 µs');
});

test('buildLinks: gone nodes, self loops, duplicates, junk; one-way links', () => {
  const conns = [
    { source: 'a', sink: 'b', address: 'x', latencyUs: 100, bandwidthBps: 1e9 },
    { source: 'a', sink: 'b', address: 'x', latencyUs: 90, bandwidthBps: 2e9 }, // the same address again: the better one stays
    { source: 'a', sink: 'b', address: 'y', latencyUs: 50, bandwidthBps: null },
    { source: 'b', sink: 'gone', address: 'z', latencyUs: 1, bandwidthBps: 1e12 },
    { source: 'a', sink: 'a', address: 'lo', latencyUs: 1, bandwidthBps: 1e12 },
    { source: 'c', sink: 'a', address: 'w', latency_us: 7, bandwidth_bps: 5e7 },
    { source: 'a', sink: 'c', address: 'w', latencyUs: -4, bandwidthBps: 'fast' },
    null,
    'x',
    { source: 'a' },
    { source: 3, sink: 'b' },
  ];
  const links = buildLinks({ connections: conns }, ['a', 'b', 'c']);
  assert.equal(links.length, 2);
  const [ab, ac] = links;
  assert.deepEqual(ab.ab.map((c) => [c.address, c.bandwidthBps, c.latencyUs]), [['x', 2e9, 90], ['y', null, 50]]);
  assert.deepEqual(ab.ba, []); // b never measured a: one way
  assert.equal(ab.count, 2);
  assert.equal(ab.bandwidthBps, 2e9);
  assert.deepEqual(ac.ab.map((c) => [c.address, c.bandwidthBps, c.latencyUs]), [['w', null, null]]);
  assert.deepEqual(ac.ba.map((c) => [c.address, c.bandwidthBps, c.latencyUs]), [['w', 5e7, 7]]);
  assert.equal(ac.best, ac.ba[0]);
  // the array form, and nothing at all
  assert.equal(buildLinks(conns, ['a', 'b']).length, 1);
  for (const bad of [null, undefined, {}, { connections: null }, { connections: 'x' }, 5]) assert.deepEqual(buildLinks(bad, ['a', 'b']), []);
  assert.deepEqual(buildLinks({ connections: conns }, null), []);
});

test('linkTitle: both directions, the best of each', () => {
  const links = buildLinks(SPREAD.state.topology, [S, T, U]);
  const names = new Map([[S, 'one'], [T, 'two']]);
  assert.equal(linkTitle(links[0], names), [
    'one ↔ two',
    'one → two: 275 µs, 1.51 Gbit/s via 127.0.0.1:37105 (best of 5 addresses)',
    'two → one: 523 µs, 683 Mbit/s via [::1]:34319 (best of 3 addresses)',
  ].join('\n'));
  const oneWay = buildLinks([{ source: 'a', sink: 'b', address: '', latencyUs: null, bandwidthBps: null }], ['a', 'b'])[0];
  assert.equal(linkTitle(oneWay, null), 'a ↔ b\na → b: no figures\nb → a: not measured');
});

// ---- the graph's geometry ----------------------------------------------------------------

const dist = (p, q) => Math.hypot(p.x - q.x, p.y - q.y);

test('circleLayout: on a circle, centered, inside the box', () => {
  assert.deepEqual(circleLayout(0, 560, 330, 70, 72), []);
  assert.deepEqual(circleLayout(1, 560, 330, 70, 72), [{ x: 280, y: 165 }]);
  const two = circleLayout(2, 560, 170, 70, 72);
  assert.deepEqual(two, [{ x: 70, y: 85 }, { x: 490, y: 85 }]); // side by side, as far apart as fits
  const three = circleLayout(3, 560, 330, 70, 72);
  assert.equal(three[0].x, 280); // the first at the top
  assert.equal(three[0].y, 72);
  assert.equal(three[1].y, 330 - 72); // the bounding box fills the height
  assert.equal(three[1].y, three[2].y);
  assert.ok(three[1].x > 280 && three[2].x < 280); // clockwise
  for (const n of [3, 4, 5, 6, 7, 12]) {
    const pts = circleLayout(n, 560, 330, 70, 72);
    assert.equal(pts.length, n);
    for (const p of pts) {
      assert.ok(p.x >= 70 - 0.05 && p.x <= 490 + 0.05, `x ${p.x} (${n})`);
      assert.ok(p.y >= 72 - 0.05 && p.y <= 258 + 0.05, `y ${p.y} (${n})`);
    }
    // a circle: neighbours equally far apart
    const sides = pts.map((p, i) => dist(p, pts[(i + 1) % n]));
    for (const s of sides) assert.ok(Math.abs(s - sides[0]) < 0.5, `${n}: ${sides}`);
    // centered on the box
    const xs = pts.map((p) => p.x);
    const ys = pts.map((p) => p.y);
    assert.ok(Math.abs((Math.min(...xs) + Math.max(...xs)) / 2 - 280) < 0.1);
    assert.ok(Math.abs((Math.min(...ys) + Math.max(...ys)) / 2 - 165) < 0.1);
  }
  // a box smaller than its padding: everything in the middle, no NaN
  for (const p of circleLayout(3, 10, 10, 20, 20)) assert.deepEqual(p, { x: 5, y: 5 });
});

test('placeEdgeLabels: the middle, unless a label or a node is there', () => {
  const nodes = [{ x: 0, y: 0 }, { x: 200, y: 0 }];
  assert.deepEqual(placeEdgeLabels([{ x1: 0, y1: 0, x2: 200, y2: 0 }], nodes), [{ x: 100, y: 0 }]);
  // a square's two diagonals cross in the middle: the second label moves along its own edge
  const sq = [{ x: 200, y: 0 }, { x: 400, y: 200 }, { x: 200, y: 400 }, { x: 0, y: 200 }];
  const diag = [
    { x1: 200, y1: 0, x2: 200, y2: 400 },
    { x1: 400, y1: 200, x2: 0, y2: 200 },
  ];
  const [p, q] = placeEdgeLabels(diag, sq, { nodeR: 24, boxW: 64, boxH: 18 });
  assert.deepEqual(p, { x: 200, y: 200 });
  assert.equal(q.y, 200);
  assert.ok(Math.abs(q.x - 200) >= 64, `moved clear of the first: ${q.x}`);
  assert.ok(Math.abs(q.x - 400) >= 32 + 24 && q.x >= 32 + 24, `clear of the nodes: ${q.x}`);
  // a short edge: no spot is clear; still one label, on the edge
  const [r] = placeEdgeLabels([{ x1: 0, y1: 0, x2: 30, y2: 0 }], [{ x: 0, y: 0 }, { x: 30, y: 0 }]);
  assert.equal(r.y, 0);
  assert.ok(r.x >= 0 && r.x <= 30);
  assert.deepEqual(placeEdgeLabels([], nodes), []);
});

test('buildTopologyView: the real cluster, as drawn', () => {
  const nodes = buildNodesView(PLACED.state, A, M);
  const t = buildTopologyView(PLACED.state, nodes);
  assert.equal(t.width, 560);
  assert.equal(t.height, 330);
  assert.equal(t.nodeR, 24);
  assert.equal(t.labels, true);
  assert.deepEqual(t.nodes.map((n) => [n.id, n.isSelf, n.isMaster, n.above]), [
    [A, true, false, true], // this node at the top, its text above it
    [C, false, false, false],
    [M, false, true, false],
  ]);
  assert.equal(t.links.length, 3);
  assert.equal(t.connections, PLACED.state.topology.connections.length);
  for (const l of t.links) {
    const a = t.nodes.find((n) => n.id === l.a);
    const b = t.nodes.find((n) => n.id === l.b);
    assert.deepEqual([l.x1, l.y1, l.x2, l.y2], [a.x, a.y, b.x, b.y]);
    assert.equal(l.label, formatLatency(l.latencyUs));
    assert.equal(l.width, edgeWidth(l.bandwidthBps));
    assert.equal(l.tier, bandwidthTier(l.bandwidthBps));
    assert.ok(l.title.startsWith(`${l.aName} ↔ ${l.bName}\n`));
    assert.match(l.aName, /^vm \([0-9a-f]{8}\)$/);
    // the label sits on its edge, clear of both ends
    const t0 = ((l.lx - l.x1) * (l.x2 - l.x1) + (l.ly - l.y1) * (l.y2 - l.y1)) / ((l.x2 - l.x1) ** 2 + (l.y2 - l.y1) ** 2);
    assert.ok(t0 > 0.15 && t0 < 0.85);
  }
  // a link without latency is labelled with its bandwidth
  const st = { nodeIdentities: { a: {}, b: {} }, topology: { connections: [{ source: 'a', sink: 'b', bandwidthBps: 2e9 }] } };
  assert.equal(buildTopologyView(st, buildNodesView(st, 'a')).links[0].label, '2.00 Gbit/s');
});

test('buildTopologyView: no nodes, one, two, many', () => {
  const none = buildTopologyView({}, []);
  assert.equal(none.height, 0);
  assert.deepEqual(none.nodes, []);
  assert.deepEqual(none.links, []);
  assert.equal(buildTopologyView(null, null).nodes.length, 0);
  const one = buildTopologyView({ nodeIdentities: { a: {} } }, buildNodesView({ nodeIdentities: { a: {} } }, 'a'));
  assert.equal(one.nodes.length, 1);
  assert.equal(one.nodes[0].above, false);
  const two = buildTopologyView({}, [{ id: 'a', name: 'a' }, { id: 'b', name: 'b' }]);
  assert.equal(two.height, 170);
  assert.ok(two.nodes.every((n) => n.above === false && n.usedFraction === null));
  const many = Array.from({ length: 20 }, (_, i) => ({ id: `n${i}`, name: `n${i}` }));
  const big = buildTopologyView({}, many);
  assert.equal(big.labels, false);
  assert.equal(big.nodeR, 10);
  for (const n of big.nodes) assert.ok(n.x >= 0 && n.x <= big.width && n.y >= 0 && n.y <= big.height);
});

// ---- instances -------------------------------------------------------------------------

test('buildInstancesView: the real instance; a shard on a node that left', () => {
  const [inst] = buildInstancesView(PLACED.state);
  assert.equal(inst.modelId, 'exo-cluster/qwen3-tiny');
  assert.equal(inst.phase, 'ready');
  assert.deepEqual(inst.runners.map((r) => [r.deviceRank, r.nodeId, r.nodeName, r.nodeGone, r.startLayer, r.endLayer, r.nLayers, r.status.label]), [
    [0, A, 'vm (51969ef3)', false, 0, 2, 2, 'Ready'],
  ]);
  const st = clone(PLACED.state);
  delete st.nodeIdentities[A];
  const [gone] = buildInstancesView(st);
  assert.equal(gone.runners[0].nodeGone, true);
  assert.equal(gone.runners[0].nodeName, '51969ef3'); // its short id: no name left
  // a runner id that is a property name of Object.prototype
  const hostile = JSON.parse(`{"instances": {"i": {"MlxRingInstance": {"shardAssignments": {"modelId": "m",
    "runnerToShard": {"constructor": {"PipelineShardMetadata": {"deviceRank": 0}}}, "nodeToRunner": {"n": "constructor"}}}}},
    "runners": {}, "nodeIdentities": {"n": {"friendlyName": "x"}}}`);
  const [h] = buildInstancesView(hostile);
  assert.equal(h.runners[0].runnerId, 'constructor');
  assert.equal(h.runners[0].status.label, 'Pending');
  assert.equal(h.runners[0].nodeName, 'x');
  // a node with a rank per GPU: nodeToRunner names its first; the shards say where each runs
  const duo = JSON.parse(`{"instances": {"i": {"MlxRingInstance": {"shardAssignments": {"modelId": "m",
    "runnerToShard": {"r1": {"TensorShardMetadata": {"deviceRank": 1, "nodeId": "n", "device": "cuda:1"}},
                      "r0": {"TensorShardMetadata": {"deviceRank": 0, "nodeId": "n", "device": "cuda:0"}}},
    "nodeToRunner": {"n": "r0"}}}}}, "runners": {}, "nodeIdentities": {"n": {"friendlyName": "x"}}}`);
  const [d] = buildInstancesView(duo);
  assert.deepEqual(d.runners.map((r) => [r.runnerId, r.nodeId, r.device]), [['r0', 'n', 'cuda:0'], ['r1', 'n', 'cuda:1']]);
  assert.equal(buildNodesView(duo, 'n').find((n) => n.id === 'n')?.runnerCount, 2);
  // its GPUs' free memory counts where weights go; a preview of its two ranks says so
  duo.nodeMemory = { n: { ramTotal: 64, ramAvailable: 40 } };
  duo.nodeGpus = { n: [{ index: 0, memoryTotal: 100, memoryUsed: 10 }, { index: 1, memoryTotal: 100, memoryUsed: 30 }] };
  const nodes = buildNodesView(duo, 'n');
  assert.equal(nodes[0].weightRoom, 40 + 90 + 70);
  const tp = duo.instances.i;
  tp.MlxRingInstance.sharding = 'Tensor';
  const pv = buildPreviewsView([{ sharding: 'Tensor', instance_meta: 'MlxRing', node_count: 2, instance: tp, error: null,
    memory_delta_by_node: { n: 180 } }], nodes, 'm');
  assert.equal(pv.valid[0].label, 'Tensor · MLX Ring · 2 ranks on 1 node');
  assert.deepEqual(pv.valid[0].nodes.map((n) => [n.id, n.room, n.fits]), [['n', 200, true]]);
});

// ---- placement previews ----------------------------------------------------------------

test('buildPreviewsView: every option of a real 3-node cluster', () => {
  const nodes = buildNodesView(SPREAD.state, S, S);
  const v = buildPreviewsView(SPREAD.previews, nodes, 'exo-cluster/qwen3-tiny');
  assert.equal(v.modelId, 'exo-cluster/qwen3-tiny');
  assert.deepEqual(v.valid.map((o) => o.label), ['Pipeline · MLX Ring · 1 node', 'Pipeline · MLX Ring · 2 nodes']);
  const [one, two] = v.valid;
  assert.deepEqual(one.request, { model_id: 'exo-cluster/qwen3-tiny', sharding: 'Pipeline', instance_meta: 'MlxRing', min_nodes: 1 });
  assert.deepEqual(two.request, { model_id: 'exo-cluster/qwen3-tiny', sharding: 'Pipeline', instance_meta: 'MlxRing', min_nodes: 2 });
  assert.equal(one.totalBytes, 251544);
  assert.equal(two.totalBytes, 251544);
  // by rank: the nodes of the preview's instance, with its memory deltas
  const raw = SPREAD.previews.previews.find((p) => p.node_count === 2 && !p.error);
  const ntr = Object.values(raw.instance)[0].shardAssignments.nodeToRunner;
  const rts = Object.values(raw.instance)[0].shardAssignments.runnerToShard;
  const byRank = Object.keys(ntr).sort((x, y) => rts[ntr[x]].PipelineShardMetadata.deviceRank - rts[ntr[y]].PipelineShardMetadata.deviceRank);
  assert.deepEqual(two.nodes.map((n) => [n.id, n.deltaBytes, n.fits]), byRank.map((id) => [id, 125772, true]));
  assert.equal(two.nodes[0].ramAvailable, nodes.find((n) => n.id === byRank[0]).ramAvailable);
  assert.equal(two.nodes[0].name, `vm (${byRank[0].slice(0, 8)})`);
  assert.deepEqual(two.shards.map((s) => [s.deviceRank, s.nodeId, formatLayers(s.startLayer, s.endLayer, s.nLayers)]), [
    [0, byRank[0], 'layer 0 of 2'],
    [1, byRank[1], 'layer 1 of 2'],
  ]);
  assert.equal(two.fits, true);
  // seven invalid options under three reasons, each listed once
  assert.deepEqual(v.invalid.map((g) => [g.error, g.options.map((o) => o.label)]), [
    ['cannot split 2 layers over 3 nodes', ['Pipeline · MLX Ring · 3 nodes']],
    ['MlxJaccl needs RDMA links between the nodes, and none of them reports any (use MlxRing)', [
      'Pipeline · MLX Jaccl · 2 nodes',
      'Tensor · MLX Jaccl · 2 nodes',
      'Pipeline · MLX Jaccl · 3 nodes',
      'Tensor · MLX Jaccl · 3 nodes',
    ]],
    ['exo-cluster/qwen3-tiny does not support tensor sharding', ['Tensor · MLX Ring · 2 nodes', 'Tensor · MLX Ring · 3 nodes']],
  ]);
  // the other cluster: the model on one node only, one option
  const placed = buildPreviewsView(PLACED.previews, buildNodesView(PLACED.state, A, M));
  assert.deepEqual(placed.valid.map((o) => [o.label, o.nodes.map((n) => n.id)]), [['Pipeline · MLX Ring · 1 node', [A]]]);
  assert.deepEqual(placed.invalid, []);
});

test('buildPreviewsView: memory that does not fit, odd and partial replies', () => {
  const nodes = [{ id: 'a', name: 'alpha', displayName: 'alpha', ramAvailable: 100 }];
  const inst = (n) => ({ MlxRingInstance: { shardAssignments: { modelId: 'm', runnerToShard: { r: { PipelineShardMetadata: { deviceRank: 0, startLayer: 0, endLayer: 4, nLayers: 4 } } }, nodeToRunner: { [n]: 'r' } } } });
  const v = buildPreviewsView({
    previews: [
      { modelId: 'm', sharding: 'Pipeline', instanceMeta: 'MlxRing', nodeCount: 1, instance: inst('a'), error: null, memoryDeltaByNode: { a: 150 }, predicted_tokens_per_second: 12.5 },
      { model_id: 'm', sharding: 'Pipeline', instance_meta: 'MlxRing', node_count: 1, instance: inst('a'), error: null, memory_delta_by_node: { a: 1 } }, // the same option twice
      { sharding: 'Tensor', instance_meta: 'MlxRing', node_count: 1, instance: inst('ghost'), memory_delta_by_node: { ghost: { inBytes: 10 } } },
      { sharding: 'Pipeline', instance_meta: 'MlxJaccl', node_count: 2, instance: null, error: { message: 'no <RDMA>' } },
      { sharding: 'Pipeline', instance_meta: 'MlxJaccl', node_count: 3, error: null }, // neither instance nor error
      null,
      'x',
    ],
  }, nodes, 'm');
  assert.deepEqual(v.valid.map((o) => [o.label, o.fits]), [['Pipeline · MLX Ring · 1 node', false], ['Tensor · MLX Ring · 1 node', true]]);
  assert.deepEqual(v.valid[0].nodes, [{ id: 'a', name: 'alpha', deltaBytes: 150, ramAvailable: 100, room: 100, fits: false }]);
  assert.deepEqual(v.valid[1].nodes, [{ id: 'ghost', name: 'ghost', deltaBytes: 10, ramAvailable: null, room: null, fits: true }]);
  assert.equal(v.valid[1].shards[0].nodeGone, true);
  assert.equal(v.valid[0].predictedTps, 12.5, 'the daemon\'s prediction');
  assert.equal(v.valid[1].predictedTps, null, 'none: not measured');
  assert.deepEqual(v.valid[1].request, { model_id: 'm', sharding: 'Tensor', instance_meta: 'MlxRing', min_nodes: 1 });
  assert.deepEqual(v.invalid.map((g) => [g.error, g.options.map((o) => o.key)]), [
    ['no <RDMA>', ['Pipeline/MlxJaccl/2']],
    ['no placement', ['Pipeline/MlxJaccl/3']],
  ]);
  // an option without its figures still launches as the daemon decides
  const bare = buildPreviewsView([{ instance: inst('a') }], nodes, 'm').valid[0];
  assert.deepEqual(bare.request, { model_id: 'm' });
  assert.equal(bare.nodeCount, 1);
  assert.equal(placementLabel(bare), '1 node');
  assert.equal(placementLabel({ sharding: 'Tensor', instanceMeta: 'SomethingNew', nodeCount: null }), 'Tensor · SomethingNew');
  for (const bad of [null, undefined, {}, { previews: null }, { previews: 'x' }, 4]) {
    assert.deepEqual(buildPreviewsView(bad, nodes, 'm'), { modelId: 'm', valid: [], invalid: [] });
  }
});

// ---- models across the cluster ------------------------------------------------------------

test('buildModelsView: models other nodes have on disk, and where', () => {
  // the master of the placed cluster has no models dir: its /v1/models is empty
  const nodes = buildNodesView(PLACED.state, M, M);
  const insts = buildInstancesView(PLACED.state);
  const [m] = buildModelsView({ object: 'list', data: [] }, insts, nodes);
  assert.equal(m.id, 'exo-cluster/qwen3-tiny');
  assert.equal(m.name, 'exo-cluster/qwen3-tiny');
  assert.equal(m.local, false);
  assert.deepEqual(m.onNodes, ['vm (51969ef3)']);
  assert.equal(m.readyInstances, 1);
  assert.equal(m.sizeBytes, null);
  assert.equal(m.fits, true);
  // listed by this node too: one entry, with its card's fields
  const card = { id: 'exo-cluster/qwen3-tiny', name: 'qwen3-tiny', family: 'qwen3', storage_size_megabytes: 0 };
  const both = buildModelsView({ data: [card] }, insts, buildNodesView(SPREAD.state, S, S));
  assert.equal(both.length, 1);
  assert.equal(both[0].name, 'qwen3-tiny');
  assert.equal(both[0].local, true);
  assert.deepEqual(both[0].onNodes.length, 3);
  // nodes without model lists
  assert.deepEqual(buildModelsView(null, [], [{ id: 'a', models: null }, { id: 'b' }]), []);
});
