import { test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import { REQUIRED, build, checkSources, references } from '../build.mjs';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SRC = path.join(HERE, '..', 'src');

function tmpRoot(t) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-dash-build-'));
  t.after(() => fs.rmSync(root, { recursive: true, force: true }));
  fs.cpSync(SRC, path.join(root, 'src'), { recursive: true });
  return root;
}

test('the real sources pass the checks', () => {
  const files = checkSources(SRC);
  for (const f of REQUIRED) assert.ok(files.includes(f), f);
});

test('references: index.html assets and relative imports', () => {
  const html = fs.readFileSync(path.join(SRC, 'index.html'), 'utf8');
  assert.deepEqual(references('index.html', html).sort(), ['app.js', 'style.css']);
  const app = fs.readFileSync(path.join(SRC, 'app.js'), 'utf8');
  assert.deepEqual(references('app.js', app), ['lib.js']);
  assert.deepEqual(
    references('a/b.js', "import x from './c.js';\nexport { y } from '../d.js';\nconst z = await import('./e.mjs');\nimport './side.js';"),
    ['a/c.js', 'd.js', 'a/e.mjs', 'a/side.js'],
  );
  assert.deepEqual(references('index.html', '<link href="data:,"><a href="#top"><script src="https://x/y.js"></script><img src="/favicon.ico">'), []);
  assert.throws(() => references('index.html', '<script src="app.js"></script>'), /dashboard\/<file>/);
});

test('build: copies src/ to dist/ byte for byte, leaves no dist.tmp', (t) => {
  const root = tmpRoot(t);
  fs.mkdirSync(path.join(root, 'src', 'img'));
  fs.writeFileSync(path.join(root, 'src', 'img', 'logo.svg'), '<svg/>');
  fs.writeFileSync(path.join(root, 'src', '.DS_Store'), 'junk');
  const files = build(root);
  assert.deepEqual(files, ['app.js', 'img/logo.svg', 'index.html', 'lib.js', 'style.css']);
  for (const f of files) {
    assert.deepEqual(fs.readFileSync(path.join(root, 'dist', f)), fs.readFileSync(path.join(root, 'src', f)), f);
  }
  assert.equal(fs.existsSync(path.join(root, 'dist', '.DS_Store')), false);
  assert.equal(fs.existsSync(path.join(root, 'dist.tmp')), false);
  assert.equal(fs.existsSync(path.join(root, 'dist.old')), false);
});

test('build: a rebuild replaces dist/ whole (stale files go)', (t) => {
  const root = tmpRoot(t);
  build(root);
  fs.writeFileSync(path.join(root, 'dist', 'stale.js'), 'old');
  fs.appendFileSync(path.join(root, 'src', 'style.css'), '\n/* new */\n');
  build(root);
  assert.equal(fs.existsSync(path.join(root, 'dist', 'stale.js')), false);
  assert.match(fs.readFileSync(path.join(root, 'dist', 'style.css'), 'utf8'), /\/\* new \*\//);
});

test('build: a missing file fails and leaves the previous dist/ alone', (t) => {
  const root = tmpRoot(t);
  build(root);
  const before = fs.readFileSync(path.join(root, 'dist', 'lib.js'));
  for (const f of REQUIRED) {
    const p = path.join(root, 'src', f);
    const saved = fs.readFileSync(p);
    fs.rmSync(p);
    assert.throws(() => build(root), new RegExp(`missing file: src/${f.replace('.', '\\.')}`));
    fs.writeFileSync(p, saved);
    assert.deepEqual(fs.readFileSync(path.join(root, 'dist', 'lib.js')), before);
    assert.equal(fs.existsSync(path.join(root, 'dist.tmp')), false);
  }
});

test('build: a dangling reference or an unservable name fails', (t) => {
  const root = tmpRoot(t);
  const html = path.join(root, 'src', 'index.html');
  const orig = fs.readFileSync(html, 'utf8');
  fs.writeFileSync(html, orig.replace('</head>', '<link rel="stylesheet" href="dashboard/extra.css"></head>'));
  assert.throws(() => build(root), /refers to a missing file: extra\.css/);
  fs.writeFileSync(html, orig);
  const app = path.join(root, 'src', 'app.js');
  fs.appendFileSync(app, "\nimport './nope.js';\n");
  assert.throws(() => build(root), /src\/app\.js refers to a missing file: nope\.js/);
  fs.writeFileSync(app, fs.readFileSync(path.join(SRC, 'app.js')));
  fs.writeFileSync(path.join(root, 'src', 'bad name.js'), '');
  assert.throws(() => build(root), /only serves names/);
  assert.equal(fs.existsSync(path.join(root, 'dist')), false);
});

test('build: no src/ at all fails', (t) => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'exo-dash-build-'));
  t.after(() => fs.rmSync(root, { recursive: true, force: true }));
  assert.throws(() => build(root), /no such directory/);
});
