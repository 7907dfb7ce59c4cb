// Builds the dashboard: copies src/ to dist/ (no bundling, no dependencies).
//
// It fails (exit 1, dist/ untouched) when a required file is missing, when
// index.html or a module refers to a file that is not there, or when a file
// name is one the daemon would not serve (GET /dashboard/{file} takes
// [A-Za-z0-9._-] segments that do not start with a dot). dist/ is written
// atomically: everything goes to dist.tmp/ first, then replaces dist/ by
// renames, so the daemon never serves half a build.
//
//   node build.mjs            (npm run build)

import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const REQUIRED = ['index.html', 'app.js', 'lib.js', 'style.css'];

const SAFE_SEGMENT = /^[A-Za-z0-9_-][A-Za-z0-9._-]*$/;

/** The files under dir (relative, '/'-separated), dotfiles left out. */
function listFiles(dir, prefix = '') {
  const out = [];
  for (const ent of fs.readdirSync(dir, { withFileTypes: true })) {
    if (ent.name.startsWith('.')) continue;
    const rel = prefix ? `${prefix}/${ent.name}` : ent.name;
    const full = path.join(dir, ent.name);
    if (ent.isDirectory()) out.push(...listFiles(full, rel));
    else if (ent.isFile()) out.push(rel);
    else throw new Error(`${rel}: not a regular file`);
  }
  return out.sort();
}

/** The files a page or module refers to, relative to src/. */
export function references(name, text) {
  const refs = [];
  if (name.endsWith('.html')) {
    // index.html is served at "/", the rest at "/dashboard/...".
    for (const m of text.matchAll(/\b(?:src|href)\s*=\s*["']([^"'#?]+)[^"']*["']/g)) {
      const url = m[1];
      if (/^(?:[a-z]+:|\/\/|\/|#)/i.test(url)) continue; // absolute, data:, external
      if (!url.startsWith('dashboard/')) {
        throw new Error(`${name}: "${url}" must be referenced as dashboard/<file> (index.html is served at /)`);
      }
      refs.push(url.slice('dashboard/'.length));
    }
  } else if (/\.m?js$/.test(name)) {
    const dir = path.posix.dirname(name);
    const re = /(?:\bimport\s*(?:[\w*{}\s,]+from\s*)?|\bexport\s*[\w*{}\s,]+from\s*|\bimport\s*\(\s*)["'](\.{1,2}\/[^"']+)["']/g;
    for (const m of text.matchAll(re)) refs.push(path.posix.normalize(path.posix.join(dir, m[1])));
  }
  return refs;
}

/** Checks src/ and returns its file list; throws on the first problem. */
export function checkSources(srcDir) {
  if (!fs.existsSync(srcDir) || !fs.statSync(srcDir).isDirectory()) {
    throw new Error(`${srcDir}: no such directory`);
  }
  const files = listFiles(srcDir);
  const have = new Set(files);
  for (const f of REQUIRED) {
    if (!have.has(f)) throw new Error(`missing file: src/${f}`);
  }
  for (const f of files) {
    if (!f.split('/').every((seg) => SAFE_SEGMENT.test(seg))) {
      throw new Error(`src/${f}: the daemon only serves names of [A-Za-z0-9._-] (not starting with a dot)`);
    }
    if (!/\.(html|m?js|css)$/.test(f)) continue;
    const text = fs.readFileSync(path.join(srcDir, f), 'utf8');
    for (const ref of references(f, text)) {
      if (ref.startsWith('../') || !have.has(ref)) {
        throw new Error(`src/${f} refers to a missing file: ${ref}`);
      }
    }
  }
  return files;
}

/** Copies root/src to root/dist through root/dist.tmp; returns the files. */
export function build(root) {
  const src = path.join(root, 'src');
  const dist = path.join(root, 'dist');
  const tmp = path.join(root, 'dist.tmp');
  const old = path.join(root, 'dist.old');
  fs.rmSync(tmp, { recursive: true, force: true });
  try {
    const files = checkSources(src);
    for (const f of files) {
      const to = path.join(tmp, f);
      fs.mkdirSync(path.dirname(to), { recursive: true });
      fs.copyFileSync(path.join(src, f), to);
    }
    // The copy must match the sources byte for byte (a file that changed
    // or vanished while we copied fails the build).
    for (const f of files) {
      const a = fs.readFileSync(path.join(src, f));
      const b = fs.readFileSync(path.join(tmp, f));
      if (!a.equals(b)) throw new Error(`src/${f} changed during the build`);
    }
    fs.rmSync(old, { recursive: true, force: true });
    if (fs.existsSync(dist)) fs.renameSync(dist, old);
    fs.renameSync(tmp, dist);
    fs.rmSync(old, { recursive: true, force: true });
    return files;
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });
    // A failure between the two renames: put the previous build back.
    if (!fs.existsSync(dist) && fs.existsSync(old)) fs.renameSync(old, dist);
    throw e;
  }
}

function main() {
  const root = path.dirname(fileURLToPath(import.meta.url));
  try {
    const files = build(root);
    let bytes = 0;
    for (const f of files) bytes += fs.statSync(path.join(root, 'dist', f)).size;
    console.log(`dashboard: built dist/ (${files.length} files, ${bytes} bytes): ${files.join(', ')}`);
  } catch (e) {
    console.error(`dashboard build failed: ${e.message}`);
    process.exit(1);
  }
}

if (process.argv[1] && import.meta.url === pathToFileURL(path.resolve(process.argv[1])).href) main();
