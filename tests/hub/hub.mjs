#!/usr/bin/env node
// An imitation of the Hugging Face hub for exo's tests and benchmarks: the
// model API (info, tree), /resolve with its LFS redirect to a "CDN", Range,
// tokens and gated repos, plus a control API that injects faults (status
// codes, dropped / corrupted / stalled / slow bodies) and records every
// request. See README.md next to this file.
//
//   node tests/hub/hub.mjs --root DIR [--port 0] [--host 127.0.0.1]
//        [--token TOKEN] [--lfs-threshold BYTES] [--warm] [--tree-page N]
//        [--link-origin URL]
//
// DIR/<org>/<name>/ is the repo "org/name". Once listening it prints exactly
// one line, {"port":N}, on stdout and runs until SIGTERM / SIGINT.
//
// No npm dependencies: node >= 18, node: built-ins only.
import http from 'node:http';
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import crypto from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';

const MiB = 1 << 20;
// Large reads keep the per-chunk overhead negligible next to the copy itself;
// the benchmark pushes multi-GB files through here and compares with curl.
const STREAM_CHUNK = 4 * MiB;
const LFS_SUFFIXES = ['.safetensors', '.bin', '.gguf'];
const EMPTY = Buffer.alloc(0);
const JSON_TYPE = 'application/json; charset=utf-8';

// ---- command line ------------------------------------------------------------

function usage(msg) {
  if (msg) process.stderr.write(`hub: ${msg}\n`);
  process.stderr.write('usage: node hub.mjs --root DIR [--port 0] [--host 127.0.0.1] ' +
    '[--token TOKEN] [--lfs-threshold BYTES] [--warm] [--tree-page N] [--link-origin URL]\n');
  process.exit(2);
}

function parseArgs(argv) {
  const opts = { root: null, port: 0, host: '127.0.0.1', token: null, lfsThreshold: MiB, warm: false,
    treePage: 1000, linkOrigin: null };
  for (let i = 0; i < argv.length; i++) {
    let [flag, value] = argv[i].split(/=(.*)/s);
    const next = () => {
      if (value === undefined) value = argv[++i];
      if (value === undefined) usage(`${flag} needs a value`);
      return value;
    };
    const int = () => {
      const n = Number(next());
      if (!Number.isInteger(n) || n < 0) usage(`${flag}: not a non-negative integer: ${value}`);
      return n;
    };
    switch (flag) {
      case '--root': opts.root = path.resolve(next()); break;
      case '--port': opts.port = int(); break;
      case '--host': opts.host = next(); break;
      case '--token': opts.token = next(); break;
      case '--lfs-threshold': opts.lfsThreshold = int(); break;
      case '--warm': opts.warm = true; break; // hash every file before announcing the port
      // huggingface.co answers a tree in pages of 1000 entries, the next one named by a Link header
      case '--tree-page': opts.treePage = int(); if (!opts.treePage) usage('--tree-page must be >= 1'); break;
      // where the Link header's next page points (default: the origin asked); a test of a hub
      // that sends a client elsewhere
      case '--link-origin': opts.linkOrigin = next(); break;
      case '-h': case '--help': usage();
      default: usage(`unknown argument ${argv[i]}`);
    }
  }
  if (!opts.root) usage('--root is required');
  let isDir = false;
  try { isDir = fs.statSync(opts.root).isDirectory(); } catch { /* reported below */ }
  if (!isDir) usage(`--root ${opts.root}: not a directory`);
  return opts;
}

const OPTS = parseArgs(process.argv.slice(2));

// ---- hashes --------------------------------------------------------------------

// Hashes stream the file (GB files must work) and are cached per path, valid
// while size and mtime are unchanged. Promises are cached so concurrent first
// requests for one big file hash it once.
const hashCache = new Map(); // absolute path -> { size, mtimeMs, sha256?, gitSha1? }

function cacheEntry(file, st) {
  let e = hashCache.get(file);
  if (!e || e.size !== st.size || e.mtimeMs !== st.mtimeMs) {
    e = { size: st.size, mtimeMs: st.mtimeMs };
    hashCache.set(file, e);
  }
  return e;
}

function digestFile(file, algo, prefix) {
  return new Promise((resolve, reject) => {
    const h = crypto.createHash(algo);
    if (prefix) h.update(prefix);
    fs.createReadStream(file, { highWaterMark: STREAM_CHUNK })
      .on('error', reject)
      .on('data', (c) => h.update(c))
      .on('end', () => resolve(h.digest('hex')));
  });
}

function cachedDigest(file, st, key, algo, prefix) {
  const e = cacheEntry(file, st);
  if (!e[key]) {
    // A failed hash (file vanished, EACCES) must not stick in the cache.
    e[key] = digestFile(file, algo, prefix).catch((err) => {
      if (hashCache.get(file) === e) delete e[key];
      throw err;
    });
  }
  return e[key];
}

const sha256Of = (file, st) => cachedDigest(file, st, 'sha256', 'sha256', null);
// git's blob id: sha1 over "blob <size>\0" + content.
const gitSha1Of = (file, st) => cachedDigest(file, st, 'gitSha1', 'sha1', `blob ${st.size}\0`);
const gitBlobSha1 = (buf) => crypto.createHash('sha1').update(`blob ${buf.length}\0`).update(buf).digest('hex');
const sha1Hex = (s) => crypto.createHash('sha1').update(s).digest('hex');

const isLfs = (rel, size) => size >= OPTS.lfsThreshold || LFS_SUFFIXES.some((s) => rel.endsWith(s));

// What the hub knows about one file: its git oid, and for LFS files the
// sha256 (the CDN's ETag) and the pointer git actually stores.
async function fileMeta(f) {
  if (!isLfs(f.path, f.st.size)) return { lfs: false, oid: await gitSha1Of(f.abs, f.st) };
  const sha256 = await sha256Of(f.abs, f.st);
  const pointer = Buffer.from(`version https://git-lfs.github.com/spec/v1\noid sha256:${sha256}\nsize ${f.st.size}\n`);
  return { lfs: true, oid: gitBlobSha1(pointer), sha256, pointerSize: pointer.length };
}

// ---- repositories ----------------------------------------------------------------

// Depth-first in name order, each directory before its contents. Root-level
// dot files (.gated, .git, ...) are control files, never listed or served.
// stat (not lstat) so symlinked files, e.g. a multi-GB checkpoint linked in
// by a benchmark, are served as regular files.
async function walk(dir, rel, out) {
  const names = (await fsp.readdir(rel ? path.join(dir, rel) : dir)).sort();
  for (const name of names) {
    if (!rel && name.startsWith('.')) continue;
    const p = rel ? `${rel}/${name}` : name;
    const abs = path.join(dir, p);
    const st = await fsp.stat(abs).catch(() => null); // dangling symlink, or deleted meanwhile
    if (st?.isDirectory()) {
      out.push({ type: 'directory', path: p, abs, st });
      await walk(dir, p, out);
    } else if (st?.isFile()) {
      out.push({ type: 'file', path: p, abs, st });
    }
  }
  return out;
}

// Read afresh per request (repos are small; tests may change them while the
// hub runs). The commit sha is derived from the file list, sizes and mtimes:
// stable while the repo is unchanged, and cheap (no content hashing).
async function openRepo(org, name) {
  const dir = path.join(OPTS.root, org, name);
  const st = await fsp.stat(dir).catch(() => null);
  if (!st?.isDirectory()) return null;
  const entries = await walk(dir, '', []);
  const h = crypto.createHash('sha1').update(`${org}/${name}`);
  for (const e of entries) h.update(`\n${e.type}\t${e.path}\t${e.st.size}\t${e.st.mtimeMs}`);
  const gated = fs.existsSync(path.join(dir, '.gated'));
  return { id: `${org}/${name}`, dir, entries, sha: h.digest('hex'), gated };
}

// ---- responses ---------------------------------------------------------------------
// A handler returns a plan: { status, headers, body } or, for file bytes,
// { status, headers, file, start, end, size }. Plans are only sent after the
// fault list has been consulted, so a fault can replace any of them.

function jsonPlan(status, obj, headers = {}) {
  return { status, headers: { 'content-type': JSON_TYPE, ...headers }, body: Buffer.from(JSON.stringify(obj)) };
}

// The hub's error shape: {"error": message} plus x-error-code / x-error-message.
function errorPlan(status, code, message, headers = {}) {
  // Messages may echo the URL (a revision name); headers must stay printable ASCII.
  const h = { 'x-error-message': message.replace(/[^\x20-\x7e]/g, '?'), ...headers };
  if (code) h['x-error-code'] = code;
  return jsonPlan(status, { error: message }, h);
}

const notFound = () => errorPlan(404, null, 'Not Found');
const badPath = () => errorPlan(400, 'BadRequest', 'Invalid path');
const repoNotFound = () => errorPlan(404, 'RepoNotFound', 'Repository not found');
const entryNotFound = () => errorPlan(404, 'EntryNotFound', 'Entry not found');
const revisionNotFound = (rev) => errorPlan(404, 'RevisionNotFound', `Invalid rev id: ${rev}`);

class BadPath extends Error {}

// Percent-decodes raw URL segments and re-splits on "/" so an encoded slash
// cannot smuggle ".." past the check; anything empty, ".", ".." or with a NUL
// is refused rather than normalised, as a path in a repo never contains them.
function decodePath(rawSegs) {
  let parts;
  try {
    parts = rawSegs.map((s) => decodeURIComponent(s)).join('/').split('/');
  } catch {
    throw new BadPath();
  }
  for (const p of parts) if (p === '' || p === '.' || p === '..' || p.includes('\0')) throw new BadPath();
  return parts.join('/');
}

// Lexical containment check on top of decodePath (belt and braces); symlinks
// inside the repo may point anywhere, on purpose.
function repoFile(repo, rel) {
  const abs = path.resolve(repo.dir, rel);
  if (!abs.startsWith(repo.dir + path.sep)) throw new BadPath();
  return abs;
}

// Single ranges only ("bytes=a-b", "bytes=a-", "bytes=-n"); anything else is
// ignored and the whole file served, which RFC 9110 allows.
function parseRange(header, size) {
  const m = header && /^bytes=(\d*)-(\d*)$/.exec(header.trim());
  if (!m || (m[1] === '' && m[2] === '')) return null;
  let start;
  let end = size - 1;
  if (m[1] === '') {
    const n = Number(m[2]);
    if (n === 0) return 'unsatisfiable';
    start = Math.max(0, size - n);
  } else {
    start = Number(m[1]);
    if (m[2] !== '') {
      if (Number(m[2]) < start) return null;
      end = Math.min(Number(m[2]), size - 1);
    }
  }
  if (start >= size) return 'unsatisfiable';
  return { start, end };
}

function bytesPlan(req, f, headers) {
  const size = f.st.size;
  const base = { 'accept-ranges': 'bytes', ...headers };
  const range = parseRange(req.headers.range, size);
  if (range === 'unsatisfiable')
    return errorPlan(416, 'RangeNotSatisfiable', 'Requested range not satisfiable', { ...base, 'content-range': `bytes */${size}` });
  if (size === 0) return { status: 200, headers: base, body: EMPTY };
  const { start, end } = range ?? { start: 0, end: size - 1 };
  const h = { ...base, 'content-length': String(end - start + 1) };
  if (range) h['content-range'] = `bytes ${start}-${end}/${size}`;
  return { status: range ? 206 : 200, headers: h, file: f.abs, start, end, size };
}

function contentType(p) {
  if (p.endsWith('.json')) return JSON_TYPE;
  if (/\.(txt|md|jinja|py|model)$/.test(p)) return 'text/plain; charset=utf-8';
  return 'application/octet-stream';
}

// ---- routes ----------------------------------------------------------------------

function bearer(req) {
  const m = /^Bearer\s+(.+)$/i.exec(req.headers.authorization ?? '');
  return m ? m[1].trim() : null;
}

// Token, repo lookup and gating shared by api, resolve and cdn routes.
async function access(req, rawOrg, rawName) {
  if (OPTS.token !== null && bearer(req) !== OPTS.token)
    return { plan: errorPlan(401, null, 'Invalid credentials in Authorization header') };
  const org = decodePath([rawOrg ?? '']);
  const name = decodePath([rawName ?? '']);
  if (org.includes('/') || name.includes('/')) throw new BadPath();
  const repo = await openRepo(org, name);
  if (!repo) return { plan: repoNotFound() };
  // Without --token no request can carry "the right" token: gated is always 403.
  if (repo.gated && (OPTS.token === null || bearer(req) !== OPTS.token))
    return { plan: errorPlan(403, 'GatedRepo', `Access to model ${repo.id} is restricted`) };
  return { repo };
}

const revisionOk = (repo, rev) => rev === 'main' || rev === repo.sha;

function modelInfo(repo) {
  return jsonPlan(200, {
    id: repo.id,
    modelId: repo.id,
    sha: repo.sha,
    private: false,
    gated: repo.gated ? 'manual' : false,
    siblings: repo.entries.filter((e) => e.type === 'file').map((e) => ({ rfilename: e.path })),
  });
}

// A page of a tree: entries from the cursor's offset on, and a Link header
// naming the next page while any are left (huggingface_hub's paginate()
// follows rel="next"; the cursor is opaque to clients).
async function tree(req, repo, sub, recursive, cursor) {
  if (sub && !repo.entries.some((e) => e.type === 'directory' && e.path === sub)) return entryNotFound();
  const prefix = sub ? `${sub}/` : '';
  const out = [];
  for (const e of repo.entries) {
    if (!e.path.startsWith(prefix)) continue;
    if (!recursive && e.path.slice(prefix.length).includes('/')) continue;
    if (e.type === 'directory') {
      // Not a real git tree id (that would need every child's hash); stable per commit and path.
      out.push({ type: 'directory', oid: sha1Hex(`tree\0${repo.sha}\0${e.path}`), size: 0, path: e.path });
      continue;
    }
    const m = await fileMeta(e);
    const item = { type: 'file', oid: m.oid, size: e.st.size };
    if (m.lfs) item.lfs = { oid: m.sha256, size: e.st.size, pointerSize: m.pointerSize };
    item.path = e.path;
    out.push(item);
  }
  const from = cursor === null ? 0 : Number(Buffer.from(cursor, 'base64url').toString());
  if (!Number.isInteger(from) || from < 0 || from > out.length) return errorPlan(400, null, 'Invalid cursor');
  const page = out.slice(from, from + OPTS.treePage), headers = {};
  if (from + page.length < out.length) {
    const url = new URL(req.url, OPTS.linkOrigin ?? `http://${req.headers.host}`);
    url.searchParams.set('cursor', Buffer.from(String(from + page.length)).toString('base64url'));
    headers.link = `<${url}>; rel="next"`;
  }
  return jsonPlan(200, page, headers);
}

// /api/models/<org>/<name>[/tree/<rev>[/<dir>]|/revision/<rev>]
async function apiRoute(req, segs, query) {
  const { plan, repo } = await access(req, segs[0], segs[1]);
  if (plan) return plan;
  const rest = segs.slice(2);
  if (rest.length === 0) return modelInfo(repo);
  if (rest[0] === 'revision' && rest.length === 2) {
    const rev = decodePath([rest[1]]);
    return revisionOk(repo, rev) ? modelInfo(repo) : revisionNotFound(rev);
  }
  if (rest[0] === 'tree' && rest.length >= 2) {
    const rev = decodePath([rest[1]]);
    if (!revisionOk(repo, rev)) return revisionNotFound(rev);
    let subSegs = rest.slice(2);
    if (subSegs.length && subSegs[subSegs.length - 1] === '') subSegs = subSegs.slice(0, -1); // "tree/main/"
    const sub = subSegs.length ? decodePath(subSegs) : '';
    const r = (query.get('recursive') ?? '').toLowerCase();
    return tree(req, repo, sub, r === 'true' || r === '1', query.get('cursor'));
  }
  return notFound();
}

async function findFile(repo, rawSegs) {
  const rel = decodePath(rawSegs);
  repoFile(repo, rel);
  return repo.entries.find((e) => e.type === 'file' && e.path === rel) ?? null;
}

// /<org>/<name>/resolve/<rev>/<path>: small files directly, LFS files by a
// 302 to the CDN, carrying the X-Linked-* headers clients read the size and
// sha256 from.
async function resolveRoute(req, segs) {
  const { plan, repo } = await access(req, segs[0], segs[1]);
  if (plan) return plan;
  if (segs.length < 5) return entryNotFound();
  const rev = decodePath([segs[3]]);
  const f = await findFile(repo, segs.slice(4));
  if (!revisionOk(repo, rev)) return revisionNotFound(rev);
  if (!f) return entryNotFound();
  const m = await fileMeta(f);
  if (!m.lfs) {
    return bytesPlan(req, f, {
      'content-type': contentType(f.path), etag: `"${m.oid}"`, 'x-repo-commit': repo.sha,
    });
  }
  const location = '/_cdn/' + [...repo.id.split('/'), ...f.path.split('/')].map(encodeURIComponent).join('/');
  return {
    status: 302,
    headers: {
      location, 'x-linked-size': String(f.st.size), 'x-linked-etag': `"${m.sha256}"`,
      etag: `"${m.sha256}"`, 'x-repo-commit': repo.sha,
    },
    body: EMPTY,
  };
}

// /_cdn/<org>/<name>/<path>: the bytes, ETag = sha256 like the LFS CDN.
async function cdnRoute(req, segs) {
  const { plan, repo } = await access(req, segs[0], segs[1]);
  if (plan) return plan;
  if (segs.length < 3) return entryNotFound();
  const f = await findFile(repo, segs.slice(2));
  if (!f) return entryNotFound();
  return bytesPlan(req, f, {
    'content-type': 'application/octet-stream', etag: `"${await sha256Of(f.abs, f.st)}"`,
  });
}

// /api/models?search=Q[&author=ORG][&sort=downloads&direction=-1][&limit=N]:
// the public repos whose id contains Q (case-insensitive), as the hub's
// model list answers without full=true (no author, no lastModified). A
// repo's downloads and likes come from root control files .downloads and
// .likes (a number each; 0 without). Gated repos are listed, as on the hub.
async function searchRoute(req, query) {
  if (OPTS.token !== null && bearer(req) !== OPTS.token)
    return errorPlan(401, null, 'Invalid credentials in Authorization header');
  const q = (query.get('search') ?? '').toLowerCase(), author = query.get('author');
  const limit = Number(query.get('limit') ?? 1000);
  if (!Number.isInteger(limit) || limit < 1) return errorPlan(400, null, 'Invalid limit');
  const count = async (dir, f) => Number((await fsp.readFile(path.join(dir, f), 'utf8').catch(() => '0')).trim()) || 0;
  const out = [];
  for (const org of (await fsp.readdir(OPTS.root)).sort()) {
    if (author && org !== author) continue;
    const orgDir = path.join(OPTS.root, org);
    if (!(await fsp.stat(orgDir)).isDirectory()) continue;
    for (const name of (await fsp.readdir(orgDir)).sort()) {
      const id = `${org}/${name}`, dir = path.join(orgDir, name);
      if (!id.toLowerCase().includes(q) || !(await fsp.stat(dir)).isDirectory()) continue;
      out.push({ _id: sha1Hex(id).slice(0, 24), id, likes: await count(dir, '.likes'), private: false,
        downloads: await count(dir, '.downloads'), tags: ['safetensors', 'text-generation'],
        pipeline_tag: 'text-generation', createdAt: (await fsp.stat(dir)).birthtime.toISOString(), modelId: id });
    }
  }
  if (query.get('sort') === 'downloads') out.sort((x, y) => y.downloads - x.downloads || x.id.localeCompare(y.id));
  return jsonPlan(200, out.slice(0, limit));
}

async function route(req, rawPath, query) {
  if (req.method !== 'GET' && req.method !== 'HEAD') return notFound();
  const segs = rawPath.split('/').slice(1);
  try {
    if (segs[0] === 'api' && segs[1] === 'models' && segs.length === 2) return await searchRoute(req, query);
    if (segs[0] === 'api' && segs[1] === 'models' && segs.length >= 4) return await apiRoute(req, segs.slice(2), query);
    if (segs[0] === '_cdn') return await cdnRoute(req, segs.slice(1));
    if (segs[2] === 'resolve') return await resolveRoute(req, segs);
    return notFound();
  } catch (err) {
    if (err instanceof BadPath) return badPath();
    throw err;
  }
}

// ---- faults ------------------------------------------------------------------------

const FAULT_KINDS = new Set(['status', 'drop', 'corrupt', 'stall', 'slow']);
const BYTE_KINDS = new Set(['drop', 'corrupt', 'stall', 'slow']);
const faults = [];

function checkFault(f) {
  if (!f || typeof f !== 'object' || Array.isArray(f)) throw new Error('a fault is a JSON object');
  if (typeof f.match !== 'string') throw new Error('fault.match must be a string');
  if (!FAULT_KINDS.has(f.kind)) throw new Error(`fault.kind must be one of ${[...FAULT_KINDS].join('|')}`);
  const times = f.times ?? 1;
  if (!Number.isInteger(times) || times < -1) throw new Error('fault.times must be an integer >= -1');
  if (f.kind === 'status' && !(Number.isInteger(f.code) && f.code >= 100 && f.code <= 599))
    throw new Error('a status fault needs an integer code');
  if (f.kind === 'slow' && !(f.bytes_per_second > 0)) throw new Error('a slow fault needs bytes_per_second > 0');
  for (const k of ['after_bytes', 'offset', 'seconds', 'retry_after'])
    if (f[k] !== undefined && !(typeof f[k] === 'number' && f[k] >= 0)) throw new Error(`fault.${k} must be a number >= 0`);
  return { ...f, times };
}

// The first active fault that matches and could act on this response; only
// then is one of its `times` spent, so e.g. a drop on "model.safetensors" is
// not used up by the resolve's 302 but by the CDN download after it.
function takeFault(rawPath, method, servesBytes) {
  const i = faults.findIndex((f) => f.times !== 0 && rawPath.includes(f.match) &&
    (method !== 'HEAD' || f.head === true) && (f.kind === 'status' || servesBytes));
  if (i < 0) return null;
  const f = faults[i];
  if (f.times > 0 && --f.times === 0) faults.splice(i, 1);
  return f;
}

function statusFaultPlan(f) {
  const headers = {};
  if (f.retry_after !== undefined) {
    headers['retry-after'] = String(f.retry_after);
    if (f.code === 429) {
      headers.ratelimit = `"api";r=0;t=${f.retry_after}`;
      headers['ratelimit-policy'] = '"fixed window";"api";q=500;w=300';
    }
  }
  const msg = f.message ?? http.STATUS_CODES[f.code] ?? `Injected status ${f.code}`;
  return errorPlan(f.code, f.error_code ?? null, msg, headers);
}

// ---- sending -----------------------------------------------------------------------

const log = [];

function drained(res) {
  return new Promise((resolve) => {
    if (res.destroyed) return resolve();
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}

function sendPlan(req, res, plan, entry) {
  const body = plan.body ?? EMPTY;
  const headers = { ...plan.headers };
  headers['content-length'] ??= String(body.length);
  res.writeHead(plan.status, headers);
  const head = req.method === 'HEAD';
  res.end(head ? undefined : body, () => { entry.bytes = head ? 0 : body.length; });
}

// Streams plan.start..plan.end of plan.file, applying a byte fault if one was
// drawn. Body bytes are counted in write callbacks, i.e. once they reached
// the socket, so the log shows what a client could actually have received.
async function sendBytes(res, plan, fault, entry) {
  const length = plan.end - plan.start + 1;
  const kind = fault?.kind;
  const cut = kind === 'drop' || kind === 'stall'
    ? Math.min(length, Math.floor(fault.after_bytes ?? length / 2)) : length;
  const flip = kind === 'corrupt' ? Math.floor(fault.offset ?? plan.size / 2) : -1;
  const bps = kind === 'slow' ? fault.bytes_per_second : 0;
  // Small chunks (~20 per second) keep a throttled stream smooth.
  const chunkSize = bps ? Math.max(1, Math.min(64 * 1024, Math.floor(bps / 20))) : STREAM_CHUNK;

  res.writeHead(plan.status, plan.headers);
  if (kind && kind !== 'corrupt') res.flushHeaders(); // headers go out even if no body byte does
  let sent = 0;
  const t0 = performance.now();
  if (cut > 0) {
    const rs = fs.createReadStream(plan.file, { start: plan.start, end: plan.start + cut - 1, highWaterMark: chunkSize });
    for await (let chunk of rs) {
      if (res.destroyed) break;
      const pos = plan.start + sent;
      if (flip >= pos && flip < pos + chunk.length) {
        chunk = Buffer.from(chunk); // never modify a buffer the stream may share
        chunk[flip - pos] ^= 0xff;
      }
      // Pace so that byte k arrives around k / bps seconds after the start.
      if (bps) await sleep(Math.max(0, t0 + ((sent + chunk.length) / bps) * 1000 - performance.now()));
      sent += chunk.length;
      const n = chunk.length;
      if (!res.write(chunk, (err) => { if (!err) entry.bytes += n; })) await drained(res);
    }
  }
  if (res.destroyed) return;
  const socket = res.socket;
  if (kind === 'drop') {
    // end() (not destroy()) so what was written is flushed before the FIN.
    socket?.end();
    setTimeout(() => socket?.destroy(), 2000).unref();
  } else if (kind === 'stall') {
    if (fault.seconds !== undefined) {
      const timer = setTimeout(() => socket?.destroy(), fault.seconds * 1000);
      res.once('close', () => clearTimeout(timer));
    }
  } else {
    res.end();
  }
}

async function handle(req, res) {
  const rawPath = req.url.replace(/^[a-z][a-z0-9+.-]*:\/\/[^/]*/i, '').split('?')[0] || '/';
  if (rawPath.startsWith('/_control/')) return control(req, res, rawPath);

  const entry = {
    method: req.method,
    path: rawPath,
    range: req.headers.range ?? null,
    auth: req.headers.authorization ?? null,
    user_agent: req.headers['user-agent'] ?? null,
    status: null,
    bytes: 0,
  };
  log.push(entry);
  const fill = () => { entry.status = res.headersSent ? res.statusCode : null; };
  res.once('finish', fill);
  res.once('close', fill);

  const qi = req.url.indexOf('?');
  const query = new URLSearchParams(qi >= 0 ? req.url.slice(qi + 1) : '');
  const plan = await route(req, rawPath, query);
  const servesBytes = req.method === 'GET' && plan.file !== undefined;
  const fault = takeFault(rawPath, req.method, servesBytes);
  if (fault?.kind === 'status') return sendPlan(req, res, statusFaultPlan(fault), entry);
  if (servesBytes) return sendBytes(res, plan, fault, entry);
  return sendPlan(req, res, plan, entry);
}

// ---- control API (no auth, never faulted, never logged) --------------------------

async function readBody(req, limit = MiB) {
  const chunks = [];
  let n = 0;
  for await (const c of req) {
    n += c.length;
    if (n > limit) throw new Error('body too large');
    chunks.push(c);
  }
  return Buffer.concat(chunks).toString('utf8');
}

async function control(req, res, p) {
  const reply = (status, obj) => {
    const body = JSON.stringify(obj);
    res.writeHead(status, { 'content-type': JSON_TYPE, 'content-length': Buffer.byteLength(body) });
    res.end(body);
  };
  if (req.method === 'POST' && p === '/_control/faults') {
    let list;
    try {
      const parsed = JSON.parse(await readBody(req));
      list = (Array.isArray(parsed) ? parsed : [parsed]).map(checkFault);
    } catch (err) {
      return reply(400, { error: `bad fault list: ${err.message}` });
    }
    faults.push(...list.filter((f) => f.times !== 0));
    return reply(200, { ok: true, active: faults.length });
  }
  if (req.method === 'POST' && p === '/_control/reset') {
    faults.length = 0;
    log.length = 0;
    return reply(200, { ok: true });
  }
  if (req.method === 'GET' && p === '/_control/log') return reply(200, log);
  if (req.method === 'GET' && p === '/_control/faults') return reply(200, faults);
  return reply(404, { error: 'Not Found' });
}

// ---- server ------------------------------------------------------------------------

// Hash everything up front so a benchmark's first tree call does not pay for it.
async function warm() {
  for (const org of await fsp.readdir(OPTS.root)) {
    const orgDir = path.join(OPTS.root, org);
    if (!(await fsp.stat(orgDir)).isDirectory()) continue;
    for (const name of await fsp.readdir(orgDir)) {
      const repo = await openRepo(org, name);
      for (const e of repo?.entries ?? []) {
        if (e.type !== 'file') continue;
        await fileMeta(e);
        await sha256Of(e.abs, e.st);
      }
    }
  }
}

const server = http.createServer({ keepAlive: true, requestTimeout: 0 }, (req, res) => {
  handle(req, res).catch((err) => {
    process.stderr.write(`hub: ${req.method} ${req.url}: ${err?.stack ?? err}\n`);
    if (!res.headersSent) {
      try {
        sendPlan(req, res, errorPlan(500, null, 'Internal Error'), { bytes: 0 });
      } catch {
        res.destroy();
      }
    } else {
      res.destroy();
    }
  });
});
server.keepAliveTimeout = 120_000;
server.headersTimeout = 125_000;
server.on('clientError', (err, socket) => {
  if (socket.writable && err.code !== 'ECONNRESET') socket.end('HTTP/1.1 400 Bad Request\r\nConnection: close\r\n\r\n');
  else socket.destroy();
});

process.on('uncaughtException', (err) => process.stderr.write(`hub: uncaught: ${err?.stack ?? err}\n`));
process.on('unhandledRejection', (err) => process.stderr.write(`hub: unhandled: ${err?.stack ?? err}\n`));
for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => {
    server.close();
    server.closeAllConnections?.();
    process.exit(0);
  });
}

if (OPTS.warm) await warm();
server.once('error', (err) => {
  process.stderr.write(`hub: cannot listen on ${OPTS.host}:${OPTS.port}: ${err.message}\n`);
  process.exit(1);
});
server.listen(OPTS.port, OPTS.host, () => {
  process.stdout.write(JSON.stringify({ port: server.address().port }) + '\n');
});
