// Second reference renderer: @huggingface/jinja (what transformers.js uses).
// usage: node oracle_hfjinja.mjs BATCH.json OUT.json  (same formats as
// oracle_jinja2.py).
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(join(here, "..", "package.json"));
const { Template } = require("@huggingface/jinja");

// @huggingface/jinja has its own strftime_now() reading the clock: pin the
// clock (run with TZ=UTC) so dates match the other renderers.
const NOW_MS = Date.UTC(2024, 6, 26, 0, 0, 0);
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...a) { if (a.length === 0) super(NOW_MS); else super(...a); }
  static now() { return NOW_MS; }
};

const batch = JSON.parse(readFileSync(process.argv[2], "utf8"));
const cache = new Map();
const out = {};
for (const c of batch) {
  try {
    let t;
    if (c.source !== undefined) {
      if (!cache.has(c.source)) cache.set(c.source, new Template(c.source));
      t = cache.get(c.source);
    }
    else {
      if (!cache.has(c.template)) cache.set(c.template, new Template(readFileSync(c.template, "utf8")));
      t = cache.get(c.template);
    }
    out[c.id] = { ok: true, out: t.render(c.context) };
  } catch (e) {
    out[c.id] = { ok: false, err: String(e && e.message ? e.message : e) };
  }
}
writeFileSync(process.argv[3], JSON.stringify(out));
