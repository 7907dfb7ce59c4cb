// What the daemon benches share: a daemon serving a synthetic model of a
// preset's shapes (`exo synth-model --quant q4`, random weights) with the
// byte-level tokenizer and Qwen3 chat template of the end-to-end tests, so
// a prompt of N ASCII letters is about N tokens; and such prompts.
import os from 'node:os';
import path from 'node:path';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import * as D from '../tests/e2e/daemon.mjs';

const run = promisify(execFile);

// a prompt of n ASCII characters from a seed (each one token or so)
export function text(n, seed) {
  let s = '', x = seed;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    s += i % 6 === 5 ? ' ' : String.fromCharCode(97 + (x >>> 16) % 26);
  }
  return s;
}

// Threads of the daemon's runner: every core (EXO_BENCH_THREADS sets
// another count), where the test suite's daemons take one each so that
// several run side by side; a bench times the machine, not a share of it.
export const BENCH_THREADS = process.env.EXO_BENCH_THREADS || String(os.availableParallelism());

// Builds PRESET under tmp, starts a daemon on it (extra: more `exo serve`
// arguments) and places it; returns { daemon, id }. The caller stops it.
export async function startSynthDaemon(tmp, preset, { ctx, extra = [] } = {}) {
  const models = path.join(tmp, 'models');
  const { qwen } = await D.buildModels(models);
  const id = `exo-bench/${preset}`;
  await run(D.EXO_BIN, ['synth-model', preset, path.join(models, id.replace('/', '--')), '--quant', 'q4',
    '--tokenizer', qwen]);
  const daemon = await D.startDaemon({ dataDir: path.join(tmp, 'data'), modelsDir: models, ctx,
    extra: ['--threads', BENCH_THREADS, ...extra] });
  await D.placeInstance(daemon.base, id);
  return { daemon, id };
}
