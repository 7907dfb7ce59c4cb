// Hostile clients for the reliability suite and bench/bench_hostile.mjs:
// slowloris (headers trickled a line at a time), body floods (a large
// Content-Length, the body trickled), and a well-behaved prober whose
// latency is what the attacks must not hurt. Attackers connect from other
// loopback addresses (127.0.0.0/8 is all loopback on Linux), as clients on
// other machines would, so the per-client limits apply to them and not to
// the prober on 127.0.0.1.
import net from 'node:net';
import fs from 'node:fs';

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

export function sourceAddrs(n, first = 2) {
  return Array.from({ length: n }, (_, i) => `127.0.${Math.floor((first + i) / 250)}.${((first + i) % 250) + 1}`);
}

// Memory of a process, in bytes: {rss, hwm} (VmHWM: peak RSS).
export function memOf(pid) {
  const s = fs.readFileSync(`/proc/${pid}/status`, 'utf8');
  const kb = (k) => +(new RegExp(`^${k}:\\s+(\\d+)`, 'm').exec(s)?.[1] || 0) * 1024;
  return { rss: kb('VmRSS'), hwm: kb('VmHWM') };
}

// Resets VmHWM to the current RSS (/proc/PID/clear_refs, "5").
export function resetPeak(pid) {
  try { fs.writeFileSync(`/proc/${pid}/clear_refs`, '5'); return true; } catch { return false; }
}

function openSocket(port, localAddress) {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port, localAddress });
    const st = { s, t0: Date.now(), closedAt: null, data: '', connected: false, error: null };
    s.on('data', (d) => { st.data += d.toString('latin1'); });
    s.on('error', (e) => { st.error = e.code || String(e); });
    s.on('close', () => { st.closedAt = Date.now(); });
    s.on('connect', () => { st.connected = true; resolve(st); });
    s.on('close', () => resolve(st));
  });
}

// Opens perSource connections from each address, each sending a request
// line and then one header line every trickleMs, never finishing. Resolves
// once all are open (or refused); returns a handle to watch and stop them.
export async function slowloris({ port, sources, perSource, trickleMs = 1000, path = '/v1/chat/completions' }) {
  const socks = [];
  const opening = [];
  for (const src of sources) {
    for (let i = 0; i < perSource; i++) {
      opening.push(openSocket(port, src).then((st) => {
        socks.push(st);
        if (st.connected && !st.closedAt) st.s.write(`POST ${path} HTTP/1.1\r\nHost: x\r\n`);
      }));
      if (opening.length % 200 === 0) await Promise.all(opening.slice(-200));
    }
  }
  await Promise.all(opening);
  let n = 0;
  const timer = setInterval(() => {
    for (const st of socks) if (!st.closedAt && st.connected) st.s.write(`X-Slow-${n}: 1\r\n`);
    n++;
  }, trickleMs);
  return {
    socks,
    open: () => socks.filter((st) => !st.closedAt).length,
    // connections the server closed (not the attacker), and after how long
    closed: () => socks.filter((st) => st.closedAt).map((st) => st.closedAt - st.t0),
    stop: () => { clearInterval(timer); for (const st of socks) st.s.destroy(); },
  };
}

// conns connections (spread over sources) each declaring contentLength
// bytes of JSON body (spaces) and sending it chunkBytes every intervalMs,
// never the last byte until finish(), which sends the rest and waits for the
// answers (a refused body is drained before it is answered).
export async function bodyFlood({ port, sources, conns, contentLength, chunkBytes = 65536, intervalMs = 100,
  path = '/v1/chat/completions' }) {
  const socks = [];
  await Promise.all(Array.from({ length: conns }, async (_, i) => {
    const st = await openSocket(port, sources[i % sources.length]);
    socks.push(st);
    if (!st.connected || st.closedAt) return;
    st.sent = 0;
    st.s.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${contentLength}\r\n\r\n`);
  }));
  const chunk = Buffer.alloc(chunkBytes, 0x20); // spaces: valid JSON whitespace
  const timer = setInterval(() => {
    for (const st of socks) {
      if (st.closedAt || !st.connected || st.sent >= contentLength - 1) continue;
      const n = Math.min(chunkBytes, contentLength - 1 - st.sent); // never complete it
      st.s.write(n === chunkBytes ? chunk : chunk.subarray(0, n));
      st.sent += n;
    }
  }, intervalMs);
  const status = (st) => +(/^HTTP\/1\.1 (\d+)/.exec(st.data)?.[1] || 0);
  return {
    socks,
    statuses: () => socks.reduce((m, st) => { const k = status(st); m[k] = (m[k] || 0) + 1; return m; }, {}),
    bytesSent: () => socks.reduce((a, st) => a + (st.sent || 0), 0),
    finish: async (waitMs = 5000) => {
      clearInterval(timer);
      const open = socks.filter((st) => st.connected && !st.closedAt);
      for (const st of open) st.s.write(Buffer.alloc(contentLength - st.sent, 0x20));
      const t0 = Date.now();
      while (Date.now() - t0 < waitMs && open.some((st) => !st.closedAt && !/^HTTP\/1\.1 \d+/.test(st.data))) await sleep(50);
    },
    stop: () => { clearInterval(timer); for (const st of socks) st.s.destroy(); },
  };
}

function pct(sorted, p) {
  if (!sorted.length) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))];
}

// A well-behaved client: one request at a time (alternating GET /v1/models
// and a short chat completion), each on a fresh connection, as long as it
// runs. stop() resolves to {n, errors, p50, p99, max} in ms.
export function prober(base, { model, maxTokens = 4, pauseMs = 20 } = {}) {
  const lat = [];
  const errors = [];
  let running = true;
  const loop = (async () => {
    for (let i = 0; running; i++) {
      const t0 = performance.now();
      try {
        let r;
        if (model && i % 2) {
          r = await fetch(`${base}/v1/chat/completions`, {
            method: 'POST', headers: { 'content-type': 'application/json', connection: 'close' },
            body: JSON.stringify({ model, messages: [{ role: 'user', content: 'Once upon a time' }],
              max_tokens: maxTokens, temperature: 0 }),
          });
        } else {
          r = await fetch(`${base}/v1/models`, { headers: { connection: 'close' } });
        }
        await r.text();
        if (r.status !== 200) errors.push(`status ${r.status}`);
      } catch (e) {
        errors.push(String(e.cause?.code || e));
      }
      lat.push(performance.now() - t0);
      await sleep(pauseMs);
    }
  })();
  return {
    stop: async () => {
      running = false;
      await loop;
      const s = lat.slice().sort((a, b) => a - b);
      return { n: s.length, errors, p50: pct(s, 0.5), p99: pct(s, 0.99), max: s[s.length - 1] };
    },
  };
}

// A raw request on its own connection: resolves to {status, head, body, closed}.
export function rawRequest(port, bytes, { waitMs = 2000 } = {}) {
  return new Promise((resolve) => {
    const s = net.connect({ host: '127.0.0.1', port });
    let data = '';
    let closed = false;
    const done = () => {
      const status = +(/^HTTP\/1\.[01] (\d+)/.exec(data)?.[1] || 0);
      const i = data.indexOf('\r\n\r\n');
      resolve({ status, head: i >= 0 ? data.slice(0, i) : data, body: i >= 0 ? data.slice(i + 4) : '', closed });
    };
    const timer = setTimeout(() => { s.destroy(); done(); }, waitMs);
    s.on('data', (d) => { data += d.toString('latin1'); });
    s.on('error', () => {});
    s.on('close', () => { closed = true; clearTimeout(timer); done(); });
    s.write(bytes);
  });
}
