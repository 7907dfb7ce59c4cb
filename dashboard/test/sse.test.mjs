import { test } from 'node:test';
import assert from 'node:assert/strict';

import {
  SSEParser,
  chatActionFromSSE,
  finishAssistant,
  formatMessageStats,
  messageStats,
  newAssistantMessage,
  reduceAssistant,
} from '../src/lib.js';

const ID = '1b7aa701-31c5-4914-a949-7eb083ca5f8a';
const chunk = (delta, extra = {}) =>
  `data: ${JSON.stringify({
    id: ID,
    object: 'chat.completion.chunk',
    created: 1795996019,
    model: 'karpathy/stories260K',
    choices: [{ index: 0, delta, logprobs: null, finish_reason: extra.finish_reason ?? null }],
    ...(extra.usage ? { usage: extra.usage } : {}),
  })}\n\n`;

const USAGE = {
  prompt_tokens: 20,
  completion_tokens: 4,
  total_tokens: 24,
  prompt_tokens_details: { cached_tokens: 0 },
  completion_tokens_details: { reasoning_tokens: 2 },
};

// A stream as the daemon writes it (keep-alive first, prefill progress,
// thinking, answer, final chunk with usage, stats comment, [DONE]).
const STREAM =
  ': keep-alive\n\n' +
  ': prefill_progress {"model":"karpathy/stories260K","processed_tokens":10,"total_tokens":20}\n\n' +
  chunk({ role: 'assistant', reasoning_content: 'Let me ' }) +
  chunk({ role: 'assistant', reasoning_content: 'think.' }) +
  ': keep-alive\n\n' +
  chunk({ role: 'assistant', content: 'Once upon' }) +
  chunk({ role: 'assistant', content: ' a time “é”' }) +
  chunk({}, { finish_reason: 'stop', usage: USAGE }) +
  ': generation_stats {"prompt_tps":10327.2286,"generation_tps":14918.5526,"prompt_tokens":20,"generation_tokens":4,"peak_memory_usage":16289792}\n\n' +
  'data: [DONE]\n\n';

function parseAll(pieces) {
  const p = new SSEParser();
  const out = [];
  for (const piece of pieces) out.push(...p.push(piece));
  out.push(...p.end());
  return out;
}

test('SSEParser: whole stream -> events and comments in order', () => {
  const items = parseAll([STREAM]);
  assert.deepEqual(
    items.map((i) => i.type),
    ['comment', 'comment', 'event', 'event', 'comment', 'event', 'event', 'event', 'comment', 'event'],
  );
  assert.equal(items[0].text, 'keep-alive');
  assert.ok(items[1].text.startsWith('prefill_progress {'));
  assert.equal(items[2].event, 'message');
  assert.equal(JSON.parse(items[2].data).choices[0].delta.reasoning_content, 'Let me ');
  assert.equal(items.at(-1).data, '[DONE]');
});

test('SSEParser: the same items whatever the chunking (every split point)', () => {
  const whole = parseAll([STREAM]);
  for (let i = 1; i < STREAM.length; i++) {
    assert.deepEqual(parseAll([STREAM.slice(0, i), STREAM.slice(i)]), whole, `split at ${i}`);
  }
  // one character at a time
  assert.deepEqual(parseAll([...STREAM]), whole);
});

test('SSEParser: bytes split inside a multi-byte character', () => {
  const bytes = new TextEncoder().encode(STREAM);
  const whole = parseAll([STREAM]);
  for (let i = 1; i < bytes.length; i += 7) {
    assert.deepEqual(parseAll([bytes.subarray(0, i), bytes.subarray(i)]), whole, `byte split at ${i}`);
  }
  const oneByOne = [];
  for (let i = 0; i < bytes.length; i++) oneByOne.push(bytes.subarray(i, i + 1));
  assert.deepEqual(parseAll(oneByOne), whole);
});

test('SSEParser: CRLF and CR line endings, split between CR and LF', () => {
  const crlf = 'data: a\r\n\r\n: keep-alive\r\n\r\ndata: b\r\r';
  const expected = [
    { type: 'event', event: 'message', data: 'a', id: '' },
    { type: 'comment', text: 'keep-alive' },
    { type: 'event', event: 'message', data: 'b', id: '' },
  ];
  assert.deepEqual(parseAll([crlf]), expected);
  for (let i = 1; i < crlf.length; i++) {
    assert.deepEqual(parseAll([crlf.slice(0, i), crlf.slice(i)]), expected, `split at ${i}`);
  }
});

test('SSEParser: multi-line data, event/id fields, no space after colon, unknown fields', () => {
  const s = 'event: update\nid: 7\ndata: line1\ndata:line2\nretry: 100\nfoo: bar\n\ndata\n\n';
  assert.deepEqual(parseAll([s]), [
    { type: 'event', event: 'update', data: 'line1\nline2', id: '7' },
    { type: 'event', event: 'message', data: '', id: '7' },
  ]);
});

test('SSEParser: blank lines alone dispatch nothing; comments without space', () => {
  assert.deepEqual(parseAll(['\n\n\n:ping\n\n']), [{ type: 'comment', text: 'ping' }]);
});

test('SSEParser: end() keeps an event missing its blank line or last newline', () => {
  assert.deepEqual(parseAll(['data: {"a":1}\n']), [{ type: 'event', event: 'message', data: '{"a":1}', id: '' }]);
  assert.deepEqual(parseAll(['data: [DONE]']), [{ type: 'event', event: 'message', data: '[DONE]', id: '' }]);
  const p = new SSEParser();
  assert.deepEqual(p.push('data: x'), []);
  assert.deepEqual(p.end(), [{ type: 'event', event: 'message', data: 'x', id: '' }]);
});

test('chatActionFromSSE: comments', () => {
  assert.deepEqual(chatActionFromSSE({ type: 'comment', text: 'keep-alive' }), { kind: 'keepalive' });
  assert.deepEqual(
    chatActionFromSSE({ type: 'comment', text: 'prefill_progress {"model":"m","processed_tokens":512,"total_tokens":2048}' }),
    { kind: 'prefill', processed: 512, total: 2048 },
  );
  const stats = chatActionFromSSE({ type: 'comment', text: 'generation_stats {"prompt_tps":1.5,"generation_tps":20}' });
  assert.equal(stats.kind, 'stats');
  assert.equal(stats.stats.generation_tps, 20);
  assert.deepEqual(chatActionFromSSE({ type: 'comment', text: 'prefill_progress {broken' }), { kind: 'ignore' });
  assert.deepEqual(chatActionFromSSE({ type: 'comment', text: 'something else' }), { kind: 'ignore' });
});

test('chatActionFromSSE: data events', () => {
  const ev = (data) => ({ type: 'event', event: 'message', data, id: '' });
  assert.deepEqual(chatActionFromSSE(ev('[DONE]')), { kind: 'done' });
  const d = chatActionFromSSE(ev(chunk({ role: 'assistant', content: 'hi' }).slice(6).trim()));
  assert.equal(d.kind, 'delta');
  assert.equal(d.content, 'hi');
  assert.equal(d.reasoning, '');
  assert.equal(d.finishReason, null);
  assert.equal(d.model, 'karpathy/stories260K');
  const r = chatActionFromSSE(ev(JSON.stringify({ choices: [{ delta: { reasoning_content: 'hmm' } }] })));
  assert.equal(r.reasoning, 'hmm');
  const fin = chatActionFromSSE(ev(chunk({}, { finish_reason: 'length', usage: USAGE }).slice(6).trim()));
  assert.equal(fin.finishReason, 'length');
  assert.deepEqual(fin.usage, USAGE);
  // usage-only chunk of OpenAI's include_usage (no choices)
  const u = chatActionFromSSE(ev(JSON.stringify({ choices: [], usage: USAGE })));
  assert.equal(u.kind, 'delta');
  assert.deepEqual(u.usage, USAGE);
  // a role-only first chunk carries nothing
  assert.deepEqual(chatActionFromSSE(ev(JSON.stringify({ choices: [{ delta: { role: 'assistant' } }] }))), { kind: 'ignore' });
  // errors
  assert.deepEqual(
    chatActionFromSSE(ev('{"error":{"message":"runner crashed","type":"InternalServerError","code":500}}')),
    { kind: 'error', message: 'runner crashed' },
  );
  assert.equal(chatActionFromSSE(ev('{not json')).kind, 'error');
  assert.deepEqual(chatActionFromSSE(null), { kind: 'ignore' });
});

test('chatActionFromSSE: tool calls', () => {
  const a = chatActionFromSSE({
    type: 'event',
    data: JSON.stringify({
      choices: [{
        delta: { tool_calls: [{ id: 'c1', index: 0, type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
      }],
    }),
  });
  assert.equal(a.toolCalls.length, 1);
  let m = reduceAssistant(newAssistantMessage('m', 0), a, 5);
  assert.deepEqual(m.toolCalls, [{ id: 'c1', name: 'get_weather', arguments: '{"city":"Paris"}' }]);
  // OpenAI-style pieces of the same call
  const piece = (args) => ({ kind: 'delta', content: '', reasoning: '', toolCalls: [{ index: 0, function: { arguments: args } }], finishReason: null, usage: null, model: null });
  m = reduceAssistant(newAssistantMessage('m', 0), { ...piece('{"a"'), toolCalls: [{ index: 0, id: 'x', function: { name: 'f', arguments: '{"a"' } }] }, 1);
  m = reduceAssistant(m, piece(':1}'), 2);
  assert.deepEqual(m.toolCalls, [{ id: 'x', name: 'f', arguments: '{"a":1}' }]);
});

function runStream(pieces, times) {
  // feeds the stream piece by piece; the i-th piece arrives at times[i] ms
  const p = new SSEParser();
  let msg = newAssistantMessage('karpathy/stories260K', 1000);
  const seen = [];
  pieces.forEach((piece, i) => {
    for (const item of p.push(piece)) {
      const a = chatActionFromSSE(item);
      seen.push(a.kind);
      msg = reduceAssistant(msg, a, times[i]);
    }
  });
  for (const item of p.end()) msg = reduceAssistant(msg, chatActionFromSSE(item), times.at(-1));
  return { msg: finishAssistant(msg, 'eof', times.at(-1) + 1), seen };
}

test('reduceAssistant: a full stream -> content, thinking, usage, stats', () => {
  const events = STREAM.split(/(?<=\n\n)/);
  const times = events.map((_, i) => 1000 + i * 100);
  const { msg, seen } = runStream(events, times);
  assert.deepEqual(seen, ['keepalive', 'prefill', 'delta', 'delta', 'keepalive', 'delta', 'delta', 'delta', 'stats', 'done']);
  assert.equal(msg.status, 'done');
  assert.equal(msg.reasoning, 'Let me think.');
  assert.equal(msg.content, 'Once upon a time “é”');
  assert.equal(msg.finishReason, 'stop');
  assert.deepEqual(msg.usage, USAGE);
  assert.equal(msg.serverStats.generation_tps, 14918.5526);
  assert.equal(msg.prefill, null);
  assert.equal(msg.tokens, 4);
  assert.equal(msg.firstTokenAt, 1200);
  assert.equal(msg.lastTokenAt, 1600);
  assert.equal(msg.endedAt, 1900);
  const st = messageStats(msg);
  assert.equal(st.tokens, 4);
  assert.equal(st.ttftMs, 200);
  // 3 tokens after the first in 400 ms
  assert.equal(st.tps, 7.5);
  assert.equal(st.promptTokens, 20);
  assert.equal(st.serverTps, 14918.5526);
  assert.equal(formatMessageStats(st), '4 tokens · 7.50 tok/s · TTFT 200 ms');
});

test('reduceAssistant: prefill progress shows until the first token', () => {
  let m = newAssistantMessage('m', 0);
  m = reduceAssistant(m, { kind: 'prefill', processed: 512, total: 1024 }, 10);
  assert.deepEqual(m.prefill, { processed: 512, total: 1024 });
  m = reduceAssistant(m, { kind: 'delta', content: 'x', reasoning: '', toolCalls: [], finishReason: null, usage: null, model: null }, 20);
  assert.equal(m.prefill, null);
  m = reduceAssistant(m, { kind: 'prefill', processed: 1, total: 2 }, 30);
  assert.equal(m.prefill, null);
});

test('reduceAssistant: does not mutate, ignores keep-alives', () => {
  const m0 = newAssistantMessage('m', 0);
  const frozen = JSON.stringify(m0);
  const m1 = reduceAssistant(m0, { kind: 'delta', content: 'a', reasoning: '', toolCalls: [], finishReason: null, usage: null, model: null }, 1);
  assert.equal(JSON.stringify(m0), frozen);
  assert.notEqual(m1, m0);
  assert.equal(reduceAssistant(m1, { kind: 'keepalive' }, 2), m1);
  assert.equal(reduceAssistant(m1, { kind: 'ignore' }, 2), m1);
});

test('an error event mid-stream: partial content kept, error shown, [DONE] does not hide it', () => {
  const s = chunk({ content: 'Hello' }) + 'data: {"error":{"message":"runner died: signal 9","type":"InternalServerError","code":500}}\n\ndata: [DONE]\n\n';
  const { msg } = runStream([s], [1100]);
  assert.equal(msg.status, 'error');
  assert.equal(msg.error, 'runner died: signal 9');
  assert.equal(msg.content, 'Hello');
});

test('finishAssistant: stopped, cut off, request error', () => {
  let m = reduceAssistant(newAssistantMessage('m', 0), { kind: 'delta', content: 'a', reasoning: '', toolCalls: [], finishReason: null, usage: null, model: null }, 100);
  const stopped = finishAssistant(m, 'stopped', 300);
  assert.equal(stopped.status, 'stopped');
  assert.equal(stopped.endedAt, 300);
  assert.equal(stopped.error, null);
  const cut = finishAssistant(m, 'eof', 300);
  assert.equal(cut.status, 'error');
  assert.match(cut.error, /ended unexpectedly/);
  const failed = finishAssistant(newAssistantMessage('m', 0), 'error', 5, 'No instance found for model m');
  assert.equal(failed.status, 'error');
  assert.equal(failed.error, 'No instance found for model m');
  // a finished message is not changed by a late stop
  m = reduceAssistant(m, { kind: 'done' }, 200);
  assert.equal(finishAssistant(m, 'stopped', 300).status, 'done');
  assert.equal(finishAssistant(m, 'stopped', 300).endedAt, 200);
});

test('messageStats: without usage counts deltas; all tokens at once -> over total time', () => {
  let m = newAssistantMessage('m', 0);
  const d = { kind: 'delta', content: 'a', reasoning: '', toolCalls: [], finishReason: null, usage: null, model: null };
  for (let i = 0; i < 10; i++) m = reduceAssistant(m, d, 500);
  m = finishAssistant(m, 'stopped', 500);
  const st = messageStats(m);
  assert.equal(st.tokens, 10);
  assert.equal(st.ttftMs, 500);
  assert.equal(st.tps, 20); // 10 tokens / 0.5 s
  assert.equal(st.promptTokens, null);
  assert.equal(formatMessageStats({ tokens: 1, tps: null, ttftMs: null }), '1 token');
  // nothing generated yet
  const empty = messageStats(newAssistantMessage('m', 0), 50);
  assert.equal(empty.tokens, 0);
  assert.equal(empty.tps, null);
  assert.equal(empty.ttftMs, null);
  assert.equal(empty.elapsedMs, 50);
});
