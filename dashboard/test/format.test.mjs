import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  errorMessageFromBody,
  errorMessageFromJson,
  formatBytes,
  formatContext,
  formatCount,
  formatDuration,
  formatPercent,
  formatRate,
  megabytesToBytes,
  shortId,
} from '../src/lib.js';

test('formatBytes: binary units, one decimal, no "1024.0"', () => {
  assert.equal(formatBytes(0), '0 B');
  assert.equal(formatBytes(1), '1 B');
  assert.equal(formatBytes(1023), '1023 B');
  assert.equal(formatBytes(1024), '1.0 KiB');
  assert.equal(formatBytes(1536), '1.5 KiB');
  assert.equal(formatBytes(1024 * 1024), '1.0 MiB');
  assert.equal(formatBytes(25276502016), '23.5 GiB');
  assert.equal(formatBytes(24192163840), '22.5 GiB');
  assert.equal(formatBytes(150 * 1024 * 1024), '150 MiB');
  assert.equal(formatBytes(1024 * 1024 - 1), '1.0 MiB');
  assert.equal(formatBytes(2 ** 40), '1.0 TiB');
  assert.equal(formatBytes(5 * 2 ** 50), '5.0 PiB');
  assert.equal(formatBytes(2 ** 62), '4096 PiB');
  assert.equal(formatBytes(1536, 2), '1.50 KiB');
});

test('formatBytes: not a size -> dash', () => {
  for (const v of [null, undefined, NaN, Infinity, -1, '12', {}]) assert.equal(formatBytes(v), '—');
});

test('megabytesToBytes reads storage_size_megabytes as MiB', () => {
  assert.equal(megabytesToBytes(1), 1048576);
  assert.equal(megabytesToBytes(0), 0);
  assert.equal(megabytesToBytes(null), null);
  assert.equal(megabytesToBytes(-3), null);
  assert.equal(formatBytes(megabytesToBytes(4506)), '4.4 GiB');
});

test('formatPercent clamps and rounds', () => {
  assert.equal(formatPercent(0), '0%');
  assert.equal(formatPercent(0.4567), '46%');
  assert.equal(formatPercent(1), '100%');
  assert.equal(formatPercent(1.7), '100%');
  assert.equal(formatPercent(-0.2), '0%');
  assert.equal(formatPercent(null), '—');
});

test('formatRate', () => {
  assert.equal(formatRate(0), '0.00');
  assert.equal(formatRate(0.1234), '0.12');
  assert.equal(formatRate(9.999), '10.00');
  assert.equal(formatRate(12.345), '12.3');
  assert.equal(formatRate(14918.5526), '14,919');
  assert.equal(formatRate(null), '—');
  assert.equal(formatRate(-1), '—');
});

test('formatDuration', () => {
  assert.equal(formatDuration(0), '0 ms');
  assert.equal(formatDuration(850.4), '850 ms');
  assert.equal(formatDuration(1500), '1.50 s');
  assert.equal(formatDuration(12345), '12.3 s');
  assert.equal(formatDuration(75000), '1m 15s');
  assert.equal(formatDuration(null), '—');
});

test('formatCount: thousands and millions for people', () => {
  assert.equal(formatCount(0), '0');
  assert.equal(formatCount(950), '950');
  assert.equal(formatCount(1000), '1k');
  assert.equal(formatCount(12345), '12.3k');
  assert.equal(formatCount(4567890), '4.6M');
  assert.equal(formatCount(45678901), '46M');
  assert.equal(formatCount(-1), '—');
  assert.equal(formatCount(undefined), '—');
});

test('formatContext and shortId', () => {
  assert.equal(formatContext(512), '512');
  assert.equal(formatContext(4096), '4k');
  assert.equal(formatContext(131072), '128k');
  assert.equal(formatContext(40960), '40k');
  assert.equal(formatContext(1048576), '1M');
  assert.equal(formatContext(0), '—');
  assert.equal(shortId('25d2d2b1-3cc0-4918-a21a-956ed124c610'), '25d2d2b1');
  assert.equal(shortId('12D3KooWabcdefghijk'), '12D3KooW');
  assert.equal(shortId(null), '');
});

test('errorMessageFromBody: exo / OpenAI error body', () => {
  const body = '{"error":{"message":"model nope/x is not in any models directory","type":"not_found_error","param":null,"code":404}}';
  assert.equal(errorMessageFromBody(404, body), 'model nope/x is not in any models directory');
});

test('errorMessageFromBody: FastAPI detail, plain message, text, empty', () => {
  assert.equal(errorMessageFromBody(400, '{"detail":"No placement"}'), 'No placement');
  assert.equal(
    errorMessageFromBody(422, '{"detail":[{"loc":["body","model_id"],"msg":"Field required","type":"missing"},{"msg":"bad"}]}'),
    'Field required; bad',
  );
  assert.equal(errorMessageFromBody(500, '{"message":"boom"}'), 'boom');
  assert.equal(errorMessageFromBody(502, '<html>Bad Gateway</html>'), '<html>Bad Gateway</html>');
  assert.equal(errorMessageFromBody(503, ''), 'HTTP 503');
  assert.equal(errorMessageFromBody(503, '{}'), 'HTTP 503');
  assert.equal(errorMessageFromBody(0, undefined), 'request failed');
  assert.equal(errorMessageFromBody(500, 'x'.repeat(400)).length, 301);
  assert.equal(errorMessageFromBody(500, '{"error":"flat"}'), 'flat');
  assert.equal(errorMessageFromBody(500, '{"error":{"type":"InternalServerError"}}'), 'InternalServerError');
});

test('errorMessageFromJson: non-objects', () => {
  assert.equal(errorMessageFromJson(null), null);
  assert.equal(errorMessageFromJson('oops'), 'oops');
  assert.equal(errorMessageFromJson({ ok: true }), null);
});
