import { test } from 'node:test';
import assert from 'node:assert/strict';

import { buildChatRequest, newAssistantMessage, toApiMessages } from '../src/lib.js';

const conversation = [
  { role: 'user', content: 'Once upon a time' },
  { ...newAssistantMessage('m', 0), content: 'there was a cat.', reasoning: 'a story', status: 'done' },
  { role: 'user', content: 'And then?' },
  { ...newAssistantMessage('m', 0), content: '', status: 'error', error: 'runner crashed' },
  { role: 'user', content: 'Try again' },
];

test('toApiMessages: user and assistant text only; failed turns dropped', () => {
  assert.deepEqual(toApiMessages(conversation), [
    { role: 'user', content: 'Once upon a time' },
    { role: 'assistant', content: 'there was a cat.' },
    { role: 'user', content: 'And then?' },
    { role: 'user', content: 'Try again' },
  ]);
});

test('toApiMessages: a system prompt goes first, blank ones are left out', () => {
  assert.deepEqual(toApiMessages([{ role: 'user', content: 'hi' }], '  Be brief.  '), [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'hi' },
  ]);
  assert.deepEqual(toApiMessages([{ role: 'user', content: 'hi' }], '   '), [{ role: 'user', content: 'hi' }]);
});

test('buildChatRequest: streaming with usage', () => {
  assert.deepEqual(buildChatRequest('karpathy/stories260K', [{ role: 'user', content: 'hi' }]), {
    model: 'karpathy/stories260K',
    messages: [{ role: 'user', content: 'hi' }],
    stream: true,
    stream_options: { include_usage: true },
  });
});

test('buildChatRequest: settings from the form (strings), invalid ones ignored', () => {
  const body = buildChatRequest('m', [{ role: 'user', content: 'hi' }], {
    systemPrompt: 'sys',
    temperature: '0.7',
    maxTokens: '128',
  });
  assert.equal(body.temperature, 0.7);
  assert.equal(body.max_tokens, 128);
  assert.deepEqual(body.messages[0], { role: 'system', content: 'sys' });
  const zero = buildChatRequest('m', [], { temperature: '0', maxTokens: '' });
  assert.equal(zero.temperature, 0);
  assert.equal('max_tokens' in zero, false);
  for (const bad of [{ temperature: '' }, { temperature: 'abc' }, { temperature: '-1' }, { maxTokens: '0' }, { maxTokens: '1.5' }, { maxTokens: 'x' }]) {
    const b = buildChatRequest('m', [], bad);
    assert.equal('temperature' in b, false, JSON.stringify(bad));
    assert.equal('max_tokens' in b, false, JSON.stringify(bad));
  }
});
