// Crafted models for the tool-call end-to-end tests (toolcalls.test.mjs): a
// tiny dense "llama" checkpoint whose greedy output is a chosen token chain,
// and a byte-level BPE tokenizer in which every token of that chain is a
// distinct id.
//
// The model is a bigram table. Every layer's o_proj and down_proj are zero,
// so the residual stream at the last position is the current token's
// embedding; the final RMSNorm (weight 1) scales it to norm sqrt(hidden), and
// the LM head gives logits = lm_head . normalize(embed[current]). The chain's
// tokens get orthonormal embeddings (a seeded Gram-Schmidt), and lm_head row
// next(t) = GAIN * embed[t] for each step t -> next(t) of the chain, every
// other row zero: after the chain token t the next one scores GAIN*sqrt(hidden)
// and every other token 0, so greedy (and any sampling) follows the chain.
// Tokens outside the chain get random embeddings; they only appear in the
// prompt, whose last token must be the chain's first.
//
// The tokenizer: ids 0-255 are the 256 byte-level symbols (no merges, so any
// text encodes), then the added tokens: the template's special tokens, then
// one non-special added token per text piece of the completion. A piece that
// is one byte uses that byte's id; "\n" may also be written ALIAS_NL, a second
// id for a newline (a vocabulary entry spelt with a raw newline, which the
// byte-level decoder passes through as it is), for completions with two
// newlines between markup tokens; {byte: N} is byte N's token (to split a
// UTF-8 character across tokens).
import fs from 'node:fs';
import fsp from 'node:fs/promises';
import path from 'node:path';
import { REPO, bytesToUnicode } from './daemon.mjs';

export const HIDDEN = 64;
export const GAIN = 4;
export const ALIAS_NL = { alias: '\n' };
const B = (byte) => ({ byte });
const U_UMLAUT = [B(0xc3), B(0xbc)]; // "ü" as two byte tokens

// ---- safetensors --------------------------------------------------------------------

// tensors: name -> {shape: [..], data: Float32Array}; written F32, sorted by
// name, the header padded with spaces to a multiple of 8 (as tools/make_fixtures.py).
export function safetensorsBytes(tensors, metadata = { format: 'pt' }) {
  const names = Object.keys(tensors).sort();
  const header = {};
  let off = 0;
  for (const n of names) {
    const { shape, data } = tensors[n];
    const count = shape.reduce((a, b) => a * b, 1);
    if (data.length !== count) throw new Error(`${n}: ${data.length} values for shape ${shape}`);
    header[n] = { dtype: 'F32', shape, data_offsets: [off, off + 4 * count] };
    off += 4 * count;
  }
  header.__metadata__ = metadata;
  let hj = Buffer.from(JSON.stringify(header));
  const pad = (8 - (hj.length % 8)) % 8;
  hj = Buffer.concat([hj, Buffer.alloc(pad, 0x20)]);
  const out = Buffer.alloc(8 + hj.length + off);
  out.writeBigUInt64LE(BigInt(hj.length), 0);
  hj.copy(out, 8);
  let p = 8 + hj.length;
  for (const n of names) {
    const { data } = tensors[n];
    for (let i = 0; i < data.length; i++, p += 4) out.writeFloatLE(data[i], p);
  }
  return out;
}

// ---- deterministic randomness ----------------------------------------------------------

export function prng(seed) {
  let s = seed >>> 0;
  const next = () => { // mulberry32
    s = (s + 0x6d2b79f5) >>> 0;
    let t = s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  const gauss = () => {
    const u = Math.max(next(), 1e-12), v = next();
    return Math.sqrt(-2 * Math.log(u)) * Math.cos(2 * Math.PI * v);
  };
  return { next, gauss };
}

// ---- the model -----------------------------------------------------------------------------

// A llama checkpoint (config.json + model.safetensors) in `dir` whose greedy
// continuation of chain[0] is chain[1..]. eos: the id(s) for config.eos_token_id.
export async function writeBigramModel(dir, { vocab, chain, eos, bos, seed = 1 }) {
  if (new Set(chain).size !== chain.length) throw new Error(`chain repeats a token: ${chain}`);
  if (chain.length > HIDDEN) throw new Error('chain longer than the hidden size');
  const H = HIDDEN, I = 64, L = 1, HEAD = 32, NH = 2, NKV = 1;
  const rnd = prng(seed);
  const embed = new Float32Array(vocab * H);
  for (let i = 0; i < embed.length; i++) embed[i] = rnd.gauss() / Math.sqrt(H);
  // orthonormal embeddings for the chain's tokens
  const basis = [];
  for (const t of chain) {
    const v = Array.from({ length: H }, () => rnd.gauss());
    for (const b of basis) {
      const d = v.reduce((a, x, i) => a + x * b[i], 0);
      for (let i = 0; i < H; i++) v[i] -= d * b[i];
    }
    const n = Math.hypot(...v);
    const u = v.map((x) => x / n);
    basis.push(u);
    embed.set(u, t * H);
  }
  const head = new Float32Array(vocab * H);
  for (let k = 0; k + 1 < chain.length; k++) {
    const row = chain[k + 1];
    for (let i = 0; i < H; i++) head[row * H + i] = GAIN * basis[k][i];
  }
  const zeros = (...shape) => ({ shape, data: new Float32Array(shape.reduce((a, b) => a * b, 1)) });
  const ones = (n) => ({ shape: [n], data: new Float32Array(n).fill(1) });
  const t = {
    'model.embed_tokens.weight': { shape: [vocab, H], data: embed },
    'lm_head.weight': { shape: [vocab, H], data: head },
    'model.norm.weight': ones(H),
  };
  for (let l = 0; l < L; l++) {
    const p = `model.layers.${l}.`;
    t[p + 'input_layernorm.weight'] = ones(H);
    t[p + 'post_attention_layernorm.weight'] = ones(H);
    t[p + 'self_attn.q_proj.weight'] = zeros(NH * HEAD, H);
    t[p + 'self_attn.k_proj.weight'] = zeros(NKV * HEAD, H);
    t[p + 'self_attn.v_proj.weight'] = zeros(NKV * HEAD, H);
    t[p + 'self_attn.o_proj.weight'] = zeros(H, NH * HEAD);
    t[p + 'mlp.gate_proj.weight'] = zeros(I, H);
    t[p + 'mlp.up_proj.weight'] = zeros(I, H);
    t[p + 'mlp.down_proj.weight'] = zeros(H, I);
  }
  const config = {
    architectures: ['LlamaForCausalLM'], model_type: 'llama', hidden_size: H, intermediate_size: I,
    num_hidden_layers: L, num_attention_heads: NH, num_key_value_heads: NKV, head_dim: HEAD,
    hidden_act: 'silu', rms_norm_eps: 1e-5, rope_theta: 10000.0, max_position_embeddings: 32768,
    tie_word_embeddings: false, attention_bias: false, mlp_bias: false, vocab_size: vocab,
    bos_token_id: bos ?? null, eos_token_id: eos, torch_dtype: 'float32',
  };
  await fsp.mkdir(dir, { recursive: true });
  await fsp.writeFile(path.join(dir, 'model.safetensors'), safetensorsBytes(t));
  await fsp.writeFile(path.join(dir, 'config.json'), JSON.stringify(config, null, 2));
}

// ---- the tokenizer --------------------------------------------------------------------------


// A vocabulary: the 256 byte symbols, the specials ([content, special]) and
// the pieces' added tokens. Returns {json (tokenizer.json), idOf(piece), size}.
export function buildTokenizer(specials, pieces) {
  const b2u = bytesToUnicode();
  const vocab = {};
  b2u.forEach((s, i) => (vocab[s] = i));
  const added = [];
  const byContent = new Map();
  let next = 256, aliasNl = -1;
  const add = (content, special) => {
    if (byContent.has(content)) return byContent.get(content);
    const id = next++;
    added.push({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special });
    byContent.set(content, id);
    return id;
  };
  for (const [c, s] of specials) add(c, s);
  const idOf = (piece) => {
    if (typeof piece === 'object' && piece.byte !== undefined) return piece.byte;
    if (piece === ALIAS_NL) {
      if (aliasNl < 0) { aliasNl = next++; vocab['\n'] = aliasNl; }
      return aliasNl;
    }
    if (byContent.has(piece)) return byContent.get(piece);
    const bytes = Buffer.from(piece, 'utf8');
    if (bytes.length === 1) return bytes[0];
    return add(piece, false);
  };
  for (const p of pieces) idOf(p);
  // added tokens also live in the model's vocabulary (as HF writes them)
  for (const a of added) vocab[a.content] = a.id;
  const json = {
    version: '1.0', truncation: null, padding: null, added_tokens: added, normalizer: null,
    pre_tokenizer: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    post_processor: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false },
    decoder: { type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: true },
    model: {
      type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '', end_of_word_suffix: '',
      fuse_unk: false, byte_fallback: false, ignore_merges: false, vocab, merges: [],
    },
  };
  return { json, idOf, size: () => next, added };
}

// ---- the formats ---------------------------------------------------------------------------------

// Each spec: the real chat template, the tokenizer's special tokens, bos/eos,
// the prompt's last token (`start`: what the template's generation prompt
// ends with) and the completion as pieces (the last is the end-of-turn token,
// the config's eos; `prefix`: pieces before `start`, for a prompt that ends
// earlier in the chain). `expect` is what the APIs must return: reasoning text,
// visible text (both compared trimmed) and the tool call (`call`), or calls
// (`calls`), if any.
const QWEN_SPECIALS = [
  ['<|endoftext|>', true], ['<|im_start|>', true], ['<|im_end|>', true],
  ['<think>', false], ['</think>', false], ['<tool_call>', false], ['</tool_call>', false],
  ['<tool_response>', false], ['</tool_response>', false],
];
const REASON = 'The user wants the weather in Paris.';
const CALL = { name: 'get_weather', arguments: { city: 'Paris' } };

export const FORMATS = {
  // Qwen3.5: the generation prompt opens <think>; XML call after the reasoning.
  qwen35: {
    template: 'Qwen-Qwen3.5-4B.jinja', specials: QWEN_SPECIALS, bos: null, eos: '<|im_end|>',
    start: '\n',
    pieces: [`${REASON}\n`, '</think>', '\n\n', '<tool_call>',
      '\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n', '</tool_call>', '<|im_end|>'],
    expect: { reasoning: REASON, text: '', call: CALL },
  },
  // Qwen3 (Hermes JSON): the model opens its own <think> block.
  hermes: {
    template: 'Qwen-Qwen3-0.6B.jinja', specials: QWEN_SPECIALS, bos: null, eos: '<|im_end|>',
    start: '\n',
    pieces: ['<think>', `\n${REASON}\n`, '</think>', '\n\n', '<tool_call>',
      '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', '</tool_call>', '<|im_end|>'],
    expect: { reasoning: REASON, text: '', call: CALL },
  },
  // GLM-4.6: `<|assistant|>` then "\n<think>..</think>\n<tool_call>NAME\n<arg_key>.."
  // (the four newlines between markup need two newline ids and one combined piece).
  glm46: {
    template: 'zai-org-GLM-4.6.jinja',
    specials: [['<|endoftext|>', true], ['[gMASK]', true], ['<sop>', true], ['<|system|>', true],
      ['<|user|>', true], ['<|assistant|>', true], ['<|observation|>', true], ['<think>', false],
      ['</think>', false], ['<tool_call>', false], ['</tool_call>', false], ['<tool_response>', false],
      ['</tool_response>', false], ['<arg_key>', false], ['</arg_key>', false], ['<arg_value>', false],
      ['</arg_value>', false]],
    bos: null, eos: ['<|endoftext|>', '<|user|>', '<|observation|>'], start: '<|assistant|>',
    pieces: ['\n', '<think>', REASON, '</think>', ALIAS_NL, '<tool_call>', 'get_weather\n',
      '<arg_key>', 'city', '</arg_key>', '\n<arg_value>Paris</arg_value>\n', '</tool_call>', '<|observation|>'],
    expect: { reasoning: REASON, text: '', call: CALL },
  },
  // GLM-4.7: the generation prompt opens <think>; the markup has no newlines,
  // so every marker is its own token.
  glm47: {
    template: 'zai-org-GLM-4.7-Flash.jinja',
    specials: [['<|endoftext|>', true], ['[gMASK]', true], ['<sop>', true], ['<|system|>', true],
      ['<|user|>', true], ['<|assistant|>', true], ['<|observation|>', true], ['<think>', false],
      ['</think>', false], ['<tool_call>', false], ['</tool_call>', false], ['<tool_response>', false],
      ['</tool_response>', false], ['<arg_key>', false], ['</arg_key>', false], ['<arg_value>', false],
      ['</arg_value>', false]],
    bos: null, eos: ['<|endoftext|>', '<|user|>', '<|observation|>'], start: '<think>',
    pieces: [REASON, '</think>', '<tool_call>', 'get_weather', '<arg_key>', 'city', '</arg_key>',
      '<arg_value>', 'Paris', '</arg_value>', '</tool_call>', '<|observation|>'],
    expect: { reasoning: REASON, text: '', call: CALL },
  },
  // Kimi K2 (no reasoning): some text, then a tool-call section.
  kimi: {
    template: 'moonshotai-Kimi-K2.jinja', specials: KIMI_SPECIALS(), bos: '[BOS]', eos: '<|im_end|>',
    start: '<|im_middle|>',
    pieces: ['Let me check the weather.', '<|tool_calls_section_begin|>', '<|tool_call_begin|>',
      'functions.get_weather:0', '<|tool_call_argument_begin|>', '{"city": "Paris"}', '<|tool_call_end|>',
      '<|tool_calls_section_end|>', '<|im_end|>'],
    expect: { reasoning: '', text: 'Let me check the weather.', call: CALL },
  },
  // Kimi K2 Thinking: <think>..</think> then the section.
  kimiThinking: {
    template: 'moonshotai-Kimi-K2-Thinking.jinja', specials: KIMI_SPECIALS(), bos: '[BOS]', eos: '<|im_end|>',
    start: '<|im_middle|>',
    pieces: ['<think>', REASON, '</think>', '<|tool_calls_section_begin|>', '<|tool_call_begin|>',
      'functions.get_weather:0', '<|tool_call_argument_begin|>', '{"city": "Paris"}', '<|tool_call_end|>',
      '<|tool_calls_section_end|>', '<|im_end|>'],
    expect: { reasoning: REASON, text: '', call: CALL },
  },
  // DeepSeek-V3.1 (thinking off: the generation prompt ends </think>).
  deepseek: {
    template: 'deepseek-ai-DeepSeek-V3.1.jinja',
    specials: [['<｜begin▁of▁sentence｜>', true], ['<｜end▁of▁sentence｜>', true], ['<｜User｜>', false],
      ['<｜Assistant｜>', false], ['<think>', false], ['</think>', false], ['<｜tool▁calls▁begin｜>', false],
      ['<｜tool▁calls▁end｜>', false], ['<｜tool▁call▁begin｜>', false], ['<｜tool▁call▁end｜>', false],
      ['<｜tool▁sep｜>', false], ['<｜tool▁output▁begin｜>', false], ['<｜tool▁output▁end｜>', false]],
    bos: '<｜begin▁of▁sentence｜>', eos: '<｜end▁of▁sentence｜>', start: '</think>',
    // with thinking on the prompt ends <think> instead: the chain runs from there
    prefix: ['<think>', REASON],
    pieces: ['<｜tool▁calls▁begin｜>', '<｜tool▁call▁begin｜>', 'get_weather', '<｜tool▁sep｜>',
      '{"city": "Paris"}', '<｜tool▁call▁end｜>', '<｜tool▁calls▁end｜>', '<｜end▁of▁sentence｜>'],
    expect: { reasoning: '', text: '', call: CALL },
  },
  // GPT-OSS harmony: after `<|start|>assistant` a commentary message to functions.get_weather.
  harmony: {
    template: 'openai-gpt-oss-120b.jinja', specials: HARMONY_SPECIALS(), bos: '<|startoftext|>',
    eos: ['<|return|>', '<|call|>'], eosToken: '<|return|>', start: 't',
    pieces: ['<|channel|>', 'commentary to=functions.get_weather', ' ', '<|constrain|>', 'json', '<|message|>',
      '{"city":"Paris"}', '<|call|>'],
    expect: { reasoning: '', text: '', call: CALL },
  },
  // GPT-OSS: an analysis message (reasoning), then the call (its header one
  // combined piece: a bigram model cannot emit <|channel|> twice).
  harmonyAnalysis: {
    template: 'openai-gpt-oss-120b.jinja', specials: HARMONY_SPECIALS(), bos: '<|startoftext|>',
    eos: ['<|return|>', '<|call|>'], eosToken: '<|return|>', start: 't',
    pieces: ['<|channel|>', 'analysis', '<|message|>', REASON, '<|end|>',
      '<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>',
      '{"city":"Paris"}', '<|call|>'],
    expect: { reasoning: REASON, text: '', call: CALL },
  },
  // Gemma 3: no tool format and no reasoning tags: everything is text, also
  // what looks like reasoning or a Hermes call (tools are declared).
  gemma3: {
    template: 'google-gemma-3-it.jinja',
    specials: [['<pad>', true], ['<eos>', true], ['<bos>', true], ['<start_of_turn>', true], ['<end_of_turn>', true]],
    bos: '<bos>', eos: ['<eos>', '<end_of_turn>'], eosToken: '<end_of_turn>', start: '\n',
    pieces: ['<think>', REASON, '</think>', 'It is sunny in Paris. ', '<tool_call>',
      '{"name": "get_weather", "arguments": {"city": "Paris"}}', '</tool_call>', '<end_of_turn>'],
    expect: {
      reasoning: '', call: null,
      text: `<think>${REASON}</think>It is sunny in Paris. <tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>`,
    },
  },
};

// Two calls in one turn, with markers split across tokens (held back by the
// parser until they complete) and "Zürich" split inside its "ü" (held back by
// the detokenizer), and an integer argument.
const REASON2 = 'I need the weather and the time.';
const CALLS2 = [{ name: 'get_weather', arguments: { city: 'Zürich', days: 3 } },
  { name: 'get_time', arguments: { zone: 'Europe/Zurich' } }];
Object.assign(FORMATS, {
  qwen35Multi: {
    ...FORMATS.qwen35,
    pieces: [`${REASON2}\n</thi`, 'nk>\n\n<tool_', 'call>\n<function=get_weather>\n<parameter=city>\nZ', ...U_UMLAUT,
      'rich\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>\n', '<tool_call>',
      '\n<function=get_time>\n<parameter=zone>\nEurope/Zurich\n</parameter>\n</function>\n</tool_', 'call>', '<|im_end|>'],
    expect: { reasoning: REASON2, text: '', calls: CALLS2 },
  },
  hermesMulti: {
    ...FORMATS.hermes,
    pieces: ['<think>', `\n${REASON2}\n`, '</think>', '\n\n', '<tool_call>', '\n{"name": "get_weather", "arguments": {"city": "Z',
      ...U_UMLAUT, 'rich", "days": 3}}\n', '</tool_call>', '\n<tool_',
      'call>\n{"name": "get_time", "arguments": {"zone": "Europe/Zurich"}}\n</tool_', 'call>', '<|im_end|>'],
    expect: { reasoning: REASON2, text: '', calls: CALLS2 },
  },
  glm47Multi: {
    ...FORMATS.glm47,
    pieces: [REASON2, '</think>', '<tool_call>', 'get_weather', '<arg_key>', 'city', '</arg_key>', '<arg_value>', 'Z',
      ...U_UMLAUT, 'rich', '</arg_value>', '<arg_key>days</arg_key><arg_value>3</arg_value>' +
      '<arg_key>zip</arg_key><arg_value>75001</arg_value><arg_key>units</arg_key><arg_value>{"temp": "C"}</arg_value>',
      '</tool_call>', '<tool_', 'call>get_time<arg_key>zone</arg_key><arg_value>Europe/Zurich</arg_value></tool_', 'call>',
      '<|observation|>'],
    // values: JSON where the declared type is not string, else the text
    expect: { reasoning: REASON2, text: '', calls: [{ name: 'get_weather', arguments: { ...CALLS2[0].arguments, zip: '75001',
      units: { temp: 'C' } } }, CALLS2[1]] },
  },
  kimiMulti: {
    ...FORMATS.kimiThinking,
    pieces: ['<think>', REASON2, '</think>', '<|tool_calls_section_begin|>', '<|tool_call_begin|>', 'functions.get_weather:0',
      '<|tool_call_argument_begin|>', '{"city": "Z', ...U_UMLAUT, 'rich", "days": 3}', '<|tool_call_end|>',
      '<|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"zone": "Europe/Zurich"}<|tool_call_end|>',
      '<|tool_calls_section_end|>', '<|im_end|>'],
    expect: { reasoning: REASON2, text: '', calls: CALLS2 },
  },
  // the second call's <｜tool▁call▁begin｜> split inside its first "｜" (EF BD 9C)
  deepseekMulti: {
    ...FORMATS.deepseek,
    pieces: ['<｜tool▁calls▁begin｜>', '<｜tool▁call▁begin｜>', 'get_weather', '<｜tool▁sep｜>', '{"city": "Z', ...U_UMLAUT,
      'rich", "days": 3}', '<｜tool▁call▁end｜>', '<', B(0xef), B(0xbd), B(0x9c),
      'tool▁call▁begin｜>get_time<｜tool▁sep｜>{"zone": "Europe/Zurich"}<｜tool▁call▁end｜>', '<｜tool▁calls▁end｜>',
      '<｜end▁of▁sentence｜>'],
    expect: { reasoning: '', text: '', calls: CALLS2 },
  },
});

Object.assign(FORMATS, {
  // A plain answer after the reasoning (tools declared, none called); the
  // reasoning mentions <tool_call>, which is not a call there.
  qwen35Answer: {
    ...FORMATS.qwen35,
    pieces: ['I could use <tool_call> here, but I know it.\n', '</think>', '\n\n', 'It is sunny in Paris.', '<|im_end|>'],
    expect: { reasoning: 'I could use <tool_call> here, but I know it.', text: 'It is sunny in Paris.', call: null },
  },
  // GPT-OSS: analysis, then the final channel (header one combined piece).
  harmonyFinal: {
    ...FORMATS.harmony,
    pieces: ['<|channel|>', 'analysis', '<|message|>', REASON, '<|end|>', '<|start|>assistant<|channel|>final<|message|>',
      'It is sunny in Paris.', '<|return|>'],
    expect: { reasoning: REASON, text: 'It is sunny in Paris.', call: null },
  },
});

const DS_SPECIALS = FORMATS.deepseek.specials;
const LLAMA3_SPECIALS = [['<|begin_of_text|>', true], ['<|end_of_text|>', true], ['<|start_header_id|>', true],
  ['<|end_header_id|>', true], ['<|eot_id|>', true], ['<|eom_id|>', true], ['<|python_tag|>', true]];
const LLAMA3_EOS = ['<|end_of_text|>', '<|eom_id|>', '<|eot_id|>'];
Object.assign(FORMATS, {
  // DeepSeek-R1 (V3 call layout: function<sep>NAME + a json fence); the generation prompt opens <think>.
  r1: {
    template: 'deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja', specials: DS_SPECIALS,
    bos: '<｜begin▁of▁sentence｜>', eos: '<｜end▁of▁sentence｜>', start: '\n',
    pieces: [`${REASON}\n`, '</think>', '\n\n', '<｜tool▁calls▁begin｜>', '<｜tool▁call▁begin｜>', 'function', '<｜tool▁sep｜>',
      'get_weather\n```json\n{"city": "Paris"}\n```', '<｜tool▁call▁end｜>', '<｜tool▁calls▁end｜>', '<｜end▁of▁sentence｜>'],
    expect: { reasoning: REASON, text: '', call: CALL },
  },
  // Llama 3.2: the whole answer is the JSON call.
  llama32: {
    template: 'meta-llama-Llama-3.2-3B-Instruct.jinja', specials: LLAMA3_SPECIALS, bos: '<|begin_of_text|>',
    eos: LLAMA3_EOS, eosToken: '<|eot_id|>', start: '\n',
    pieces: ['{"name": "get_weather", ', '"parameters": {"city": "Paris"}}', '<|eot_id|>'],
    expect: { reasoning: '', text: '', call: CALL },
  },
  // Llama 3.1: a call after <|python_tag|>, ended by <|eom_id|>.
  llama31: {
    template: 'meta-llama-Llama-3.1-8B-Instruct.jinja', specials: LLAMA3_SPECIALS, bos: '<|begin_of_text|>',
    eos: LLAMA3_EOS, eosToken: '<|eot_id|>', start: '\n',
    pieces: ['<|python_tag|>', '{"name": "get_weather", "parameters": {"city": "Paris"}}', '<|eom_id|>'],
    expect: { reasoning: '', text: '', call: CALL },
  },
  // Qwen3-Coder: text, then a bare <function=...> (no <tool_call> wrapper), its markers split.
  qwen3coder: {
    template: 'Qwen-Qwen3-Coder-30B-A3B-Instruct.jinja', specials: QWEN_SPECIALS, bos: null, eos: '<|im_end|>',
    start: '\n',
    // values are text, typed by the schema: integer, string (digits stay a string), object, boolean
    pieces: ['Let me check.\n', '<func', 'tion=get_weather>\n<parameter=days>\n2\n</parameter>\n<parameter=city>\nParis\n</parameter>\n' +
      '<parameter=zip>\n75001\n</parameter>\n<parameter=units>\n{"temp": "C", "wind": ["km/h"]}\n</parameter>\n' +
      '<parameter=alerts>\ntrue\n</parameter>\n</func', 'tion>', '<|im_end|>'],
    expect: { reasoning: '', text: 'Let me check.', call: { name: 'get_weather',
      arguments: { city: 'Paris', days: 2, zip: '75001', units: { temp: 'C', wind: ['km/h'] }, alerts: true } } },
  },
});

function KIMI_SPECIALS() {
  return [['[BOS]', true], ['[EOS]', true], ['<|im_end|>', true], ['<|im_user|>', true],
    ['<|im_assistant|>', true], ['<|im_system|>', true], ['<|im_middle|>', true], ['<think>', false],
    ['</think>', false], ['<|tool_calls_section_begin|>', true], ['<|tool_calls_section_end|>', true],
    ['<|tool_call_begin|>', true], ['<|tool_call_argument_begin|>', true], ['<|tool_call_end|>', true]];
}

function HARMONY_SPECIALS() {
  return [['<|startoftext|>', true], ['<|endoftext|>', true], ['<|return|>', true], ['<|constrain|>', true],
    ['<|channel|>', true], ['<|start|>', true], ['<|end|>', true], ['<|message|>', true], ['<|call|>', true]];
}

// MODELS/exo-e2e--crafted-<name>/ for one spec: weights, config, tokenizer,
// tokenizer_config.json (bos/eos names) and chat_template.jinja. Returns
// {dir, id, chain (ids, chain[0] = the prompt's last token), spec}.
export async function buildCraftedModel(modelsDir, name, spec = FORMATS[name]) {
  const id = `exo-e2e/crafted-${name}`;
  const dir = path.join(modelsDir, id.replace('/', '--'));
  const prefix = spec.prefix ?? [];
  const tok = buildTokenizer(spec.specials, [...prefix, spec.start, ...spec.pieces]);
  const chain = [spec.start, ...spec.pieces].map(tok.idOf);
  const ids = (x) => (Array.isArray(x) ? x.map(tok.idOf) : tok.idOf(x));
  const eosIds = ids(spec.eos);
  const eosToken = spec.eosToken ?? (Array.isArray(spec.eos) ? spec.eos[0] : spec.eos);
  if (!(Array.isArray(eosIds) ? eosIds : [eosIds]).includes(chain.at(-1)))
    throw new Error(`${name}: the chain must end with an eos token`);
  await writeBigramModel(dir, {
    vocab: tok.size(), chain: [...prefix.map(tok.idOf), ...chain], eos: eosIds, bos: spec.bos ? tok.idOf(spec.bos) : null,
    seed: [...name].reduce((a, c) => a * 31 + c.charCodeAt(0), 7),
  });
  await fsp.writeFile(path.join(dir, 'tokenizer.json'), JSON.stringify(tok.json));
  const addedDecoder = {};
  for (const a of tok.added) {
    addedDecoder[String(a.id)] = { content: a.content, lstrip: false, normalized: false, rstrip: false,
      single_word: false, special: a.special };
  }
  await fsp.writeFile(path.join(dir, 'tokenizer_config.json'), JSON.stringify({
    add_bos_token: false, add_eos_token: false, added_tokens_decoder: addedDecoder,
    bos_token: spec.bos, eos_token: eosToken, pad_token: null, clean_up_tokenization_spaces: false,
    model_max_length: 32768, tokenizer_class: 'PreTrainedTokenizerFast',
  }, null, 2));
  const template = fs.readFileSync(path.join(REPO, 'tests/fixtures/chat-templates', spec.template), 'utf8');
  await fsp.writeFile(path.join(dir, 'chat_template.jinja'), template);
  return { dir, id, chain, spec, name };
}
