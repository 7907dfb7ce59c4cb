// Time to first token of a new request while N streams decode, through the
// daemon, against the same request on an idle runner, in this run; and
// what the new prompt costs the running streams: their tokens/s before
// and while it is prefilled, and the longest gap between two tokens of
// any of them. A benchmark, not a test: it prints times and ratios
// (issue 16: prefill is chunked and mixed with decode, so running streams
// never stall for a long prompt).
//
//   node bench/bench_busy_ttft.mjs [PRESET [STREAMS [PROMPT_TOKENS]]]
//
// PRESET (default llama-3.2-1b) is built with `exo synth-model --quant q4`
// and the byte-level tokenizer and Qwen3 chat template of the end-to-end
// tests, so a prompt of N ASCII letters is about N tokens. The runner uses
// every CPU (EXO_BENCH_THREADS sets another count), or the GPU where the
// build and the machine have one, and EXO_BATCH is set to STREAMS + 1
// (default 16 + 1). EXO_BIN selects the binary (default build/exo);
// EXO_PREFILL_SLICE_MS, how long a slice of a prompt's chunk runs while
// streams decode (the runner's default when unset; 0: whole chunks).
import fsp from 'node:fs/promises';
import * as D from '../tests/e2e/daemon.mjs';
import { text, startSynthDaemon, BENCH_THREADS } from './synth_daemon.mjs';

const preset = process.argv[2] || 'llama-3.2-1b';
const nStreams = Number(process.argv[3] || 16);
const promptTokens = Number(process.argv[4] || 512);

// A chunk per token: with logprobs asked for, a token whose text is empty
// (the synthetic model's ids past the small tokenizer's) still has its chunk.
const TOKEN = /"logprob":/g;
const count = (text) => (text.match(TOKEN) || []).length;

// arrival times (ms, Date.now()) of a stream's tokens so far
function tokenTimes(st) {
  const out = [];
  for (const p of st.pieces)
    for (let k = count(p.text); k > 0; k--) out.push(st.t0 + p.t);
  return out;
}

async function ttft(base, model, prompt) {
  const t0 = Date.now();
  const s = await D.openStream(base, '/v1/chat/completions', {
    model, messages: [{ role: 'user', content: prompt }], max_tokens: 2, temperature: 0, stream: true,
    logprobs: true,
  });
  await s.until((b) => count(b) > 0, 600000);
  const ms = Date.now() - t0;
  await s.rest();
  return { ms, t0, t1: t0 + ms };
}

const median = (a) => { const s = [...a].sort((x, y) => x - y); return s.length ? s[s.length >> 1] : NaN; };

const tmp = await D.tmpDir('exo-bench-busy-');
let daemon;
const streams = [];
try {
  process.env.EXO_BATCH = String(nStreams + 1);
  let id;
  ({ daemon, id } = await startSynthDaemon(tmp, preset, { ctx: 4096 }));

  // idle: the new request alone (different prompts each time: no prefix reuse)
  const alone = [];
  for (let k = 0; k < 3; k++) alone.push((await ttft(daemon.base, id, text(promptTokens, 100 + k))).ms);

  // busy: N streams decoding, then the same kind of request
  for (let i = 0; i < nStreams; i++)
    streams.push(await D.openStream(daemon.base, '/v1/chat/completions', {
      model: id, messages: [{ role: 'user', content: text(16, 1 + i) }], max_tokens: 3000, temperature: 0,
      stream: true, logprobs: true,
    }));
  await Promise.all(streams.map((s) => s.until((b) => count(b) >= 4, 600000)));
  await D.sleep(3000);
  const busy = [];
  for (let k = 0; k < 3; k++) {
    busy.push(await ttft(daemon.base, id, text(promptTokens, 200 + k)));
    await D.sleep(1500);
  }
  const times = streams.map(tokenTimes);
  const live = times.filter((t) => t.length > 8).length;
  // stream tokens/s and the longest gap, inside and outside the new requests' prefills
  const inside = (t) => busy.some((b) => t > b.t0 && t <= b.t1 + 50);
  const w0 = busy[0].t0 - 2500, w1 = busy[0].t0;
  let before = 0, during = 0, durMs = 0, gapIn = 0, gapOut = 0;
  for (const b of busy) durMs += b.ms;
  for (const t of times) {
    for (let i = 0; i < t.length; i++) {
      if (t[i] > w0 && t[i] <= w1) before++;
      if (inside(t[i])) during++;
      if (i > 0) {
        const g = t[i] - t[i - 1];
        if (inside(t[i])) gapIn = Math.max(gapIn, g);
        else if (t[i] > w0 && t[i] <= w1) gapOut = Math.max(gapOut, g);
      }
    }
  }
  const a = median(alone), b = median(busy.map((x) => x.ms));
  console.log(`${preset} q4, ${BENCH_THREADS} threads, ${promptTokens}-token prompts, ${nStreams} streams ` +
    `(${live} still decoding at the end), EXO_PREFILL_SLICE_MS ${process.env.EXO_PREFILL_SLICE_MS ?? 'unset'}`);
  console.log(`time to first token alone          ${a.toFixed(0).padStart(7)} ms (median of 3)`);
  console.log(`time to first token, ${String(nStreams).padStart(2)} streams busy ${b.toFixed(0).padStart(7)} ms (median of 3): ` +
    `x${(b / a).toFixed(2)} alone`);
  console.log(`streams' tokens/s before           ${(before / 2.5).toFixed(1).padStart(7)}`);
  // a model this fast finishes its streams before the window: no ratio to print
  console.log(`streams' tokens/s during prefills  ${(during / (durMs / 1000)).toFixed(1).padStart(7)} ` +
    (before ? `(x${((during / (durMs / 1000)) / (before / 2.5)).toFixed(2)} of before)`
      : '(no ratio: no stream decoded in the 2.5 s before; the streams ended first)'));
  console.log(`longest gap between a stream's tokens: ${gapOut} ms in the 2.5 s before, ${gapIn} ms during a prefill`);
} finally {
  for (const s of streams) s.abort();
  if (daemon) await daemon.stop('SIGKILL');
  await fsp.rm(tmp, { recursive: true, force: true });
}
