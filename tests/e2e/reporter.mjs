// node:test reporter for the integration runner: one line per test (indented
// by nesting), the failure's message under a failing test, and a last line
// `N passed, M failed` that counts leaf tests only (a parent that fails
// because a subtest failed is not counted twice).
export default async function* reporter(source) {
  const children = []; // completed subtests per nesting level, for the leaf test
  let pass = 0, fail = 0, skip = 0;
  const failures = [];
  for await (const ev of source) {
    if (ev.type === 'test:diagnostic') {
      if (ev.data.nesting === 0 && /^(tests|suites|pass|fail|cancelled|skipped|todo|duration_ms) /.test(ev.data.message)) continue;
      yield `# ${ev.data.message}\n`;
      continue;
    }
    if (ev.type === 'test:stdout' || ev.type === 'test:stderr') {
      yield ev.data.message;
      continue;
    }
    if (ev.type !== 'test:pass' && ev.type !== 'test:fail') continue;
    const n = ev.data.nesting;
    const leaf = !children[n + 1];
    children[n + 1] = 0;
    children[n] = (children[n] || 0) + 1;
    const ms = ev.data.details?.duration_ms;
    const took = ms === undefined ? '' : ` (${ms < 1000 ? `${ms.toFixed(0)} ms` : `${(ms / 1000).toFixed(1)} s`})`;
    const pad = '  '.repeat(n);
    const skipped = ev.data.skip !== undefined || ev.data.todo !== undefined;
    if (ev.type === 'test:pass') {
      if (leaf) skipped ? skip++ : pass++;
      yield `${pad}${skipped ? 'skip' : 'ok  '} ${ev.data.name}${took}\n`;
    } else {
      const err = ev.data.details?.error;
      const cause = err?.cause ?? err;
      // long enough for the cluster tests' log tails (every node's and runner's)
      const msg = String(cause?.message ?? cause ?? 'failed').split('\n').slice(0, 400).join(`\n${pad}     `);
      if (leaf) {
        fail++;
        failures.push(ev.data.name);
      }
      yield `${pad}FAIL ${ev.data.name}${took}\n`;
      if (leaf || err?.failureType !== 'subtestsFailed') yield `${pad}     ${msg}\n`;
    }
  }
  if (failures.length) yield `failed:\n${failures.map((f) => `  - ${f}\n`).join('')}`;
  if (skip) yield `${skip} skipped\n`;
  yield `${pass} passed, ${fail} failed\n`;
}
