#!/usr/bin/env node
// Expected tokenizations from HF's own Rust library (npm `tokenizers`), the
// oracle for exo's C tokenizer.
//
//   node tests/tokenizer/oracle.js DIR OUT.jsonl [CORPUS...]
//
// DIR holds tokenizer.json + tokenizer_config.json. Writes one JSON object per
// line: {"t": text} or {"hex": bytes} (for invalid UTF-8 input, which the C
// side encodes raw and the oracle sees as Node decodes it: one U+FFFD per
// maximal invalid subpart, like Rust's from_utf8_lossy), then
//   ids   encode(text, add_special_tokens=false)
//   sids  encode(text, add_special_tokens=true); for tokenizer classes that
//         transformers rebuilds from add_bos_token/add_eos_token
//         (Llama/Gemma/CodeLlama) it is bos? + ids + eos?, as transformers does
//   dec   decode(ids, skip_special_tokens=false)
//   sdec  decode(sids, skip_special_tokens=true)
'use strict';
const fs = require('fs');
const path = require('path');
const { Tokenizer } = require(path.join(__dirname, '..', 'node_modules', 'tokenizers'));

const [dir, out, ...corpora] = process.argv.slice(2);
if (!dir || !out) {
  console.error('usage: oracle.js DIR OUT.jsonl [CORPUS...]');
  process.exit(2);
}
const tok = Tokenizer.fromFile(path.join(dir, 'tokenizer.json'));
const tj = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer.json'), 'utf8'));
let cfg = {};
try { cfg = JSON.parse(fs.readFileSync(path.join(dir, 'tokenizer_config.json'), 'utf8')); } catch (e) {}

const FLAG_CLASSES = ['LlamaTokenizer', 'LlamaTokenizerFast', 'GemmaTokenizer', 'GemmaTokenizerFast',
  'CodeLlamaTokenizer', 'CodeLlamaTokenizerFast'];
const tokName = (t) => (t && typeof t === 'object' ? t.content : t);
const byFlags = FLAG_CLASSES.includes(cfg.tokenizer_class);
const bosId = tokName(cfg.bos_token) != null ? tok.tokenToId(tokName(cfg.bos_token)) : null;
const eosId = tokName(cfg.eos_token) != null ? tok.tokenToId(tokName(cfg.eos_token)) : null;
const addBos = cfg.add_bos_token === undefined ? true : !!cfg.add_bos_token;
const addEos = !!cfg.add_eos_token;

// ---- inputs ----
const cases = []; // {t} or {hex}
const add = (t) => { if (typeof t === 'string') cases.push({ t }); };

// Generated edge cases: scripts, emoji (incl. ZWJ), digits, whitespace.
const edge = [
  '', ' ', '  ', '   ', '\t', '\n', '\n\n', '\r\n', ' \n \n ', '\t\t\tx', 'a\u00a0b', 'x\u3000y',
  'Hello world', ' Hello world', 'Hello  world', 'Hello world ', 'hello   \n\n   world',
  "I'm can't won't they're we've he'll she'd it's", "I'M CAN'T YOU'LL", "'s 't 're", "''''",
  '1', '12', '123', '1234', '12345678901234567890', '3.14159 2,718 1e-9 0x1F 007',
  '١٢٣ ۴۵۶ १२३ 一二三 Ⅻ ½ ²',
  'Ünïcödé façade naïve coöperate', 'Straße ß ẞ', 'İstanbul ıi', 'Ελληνικά ΣΊΣΥΦΟΣ σς',
  'Русский текст, ещё!', 'עברית ומילים', 'العربية النص', 'हिन्दी पाठ क्षत्रिय', 'தமிழ்', 'ไทย ภาษา',
  '中文文本，标点！', '日本語のテキスト、カタカナ。', '한국어 텍스트', '混合 mixed 文本 text 123',
  '😀', '😀😃😄', '👍🏽', '👨‍👩‍👧‍👦 family', '🏳️‍🌈 flag', '🇺🇸🇯🇵', 'a😀b😃c',
  'e\u0301 vs \u00e9', 'Å vs A\u030a', 'ﬁ ﬀ ㎏ ① Ｆｕｌｌｗｉｄｔｈ', '\u200b\u200c\u200d\ufeff',
  '<>[]{}()!?.,;:\'"`~@#$%^&*-_=+|\\/', '...', '!!!???', '---', '___', '***bold***', '~~~',
  'def f(x):\n    return x ** 2\n\n\nclass A:\n\tpass\n', '    indented\n        more\n',
  'for (int i = 0; i < n; i++) { a[i] += b[i]; }', '<html><body class="x">text</body></html>',
  'https://example.com/path?q=1&r=2#frag', 'user@example.com', '{"key": [1, 2, {"x": null}]}',
  'trailing spaces    ', '    leading spaces', 'mixed \t tabs \t and  spaces', 'a\n\n\n\nb',
  'end with newline\n', '\n\nstarts with newlines', 'CamelCaseWords and snake_case_words',
  'ALLCAPS lowercase MiXeD', 'x'.repeat(300), 'ab'.repeat(200), ' '.repeat(100), '\n'.repeat(50),
  '9'.repeat(100), '😀'.repeat(30), '▁ leading metaspace char', '▁▁▁', 'Ġ Ċ ĉ', '<0x41> <unk>',
  '\u0000nul\u0001ctl\u007f', '\ud83d\ude00 surrogate pair',
];
edge.forEach(add);

// Every added token embedded in text (at most 300, spread over the list).
const added = tj.added_tokens || [];
const step = Math.max(1, Math.floor(added.length / 300));
for (let i = 0; i < added.length; i += step) {
  const c = added[i].content;
  add(c);
  add(`Hello ${c} world`);
  add(`${c}${c}x ${c}`);
  add(`x${c}\n${c} y`);
}
add(added.map((a) => a.content).slice(0, 40).join(' text '));

// Corpora: paragraphs (blank-line separated), plus one large chunk.
for (const f of corpora) {
  const text = fs.readFileSync(f, 'utf8');
  for (const p of text.split(/\n\s*\n/)) if (p.length) add(p + '\n');
  add(text.slice(0, 200000));
}

// Invalid UTF-8 inputs (the C side gets the raw bytes).
const bad = ['ff', '80', 'c3', 'e4b8', 'f09f98', 'c328', 'eda080', 'f4908080', 'c0af', 'fe', 'e0808f',
  '48656c6c6fff20776f726c64', 'f09f9880f09f98', '20e4b8ade6', 'c3a9c3', '61808080808062'];
for (const h of bad) cases.push({ hex: h });

// ---- oracle ----
(async () => {
  const fd = fs.openSync(out, 'w');
  const B = 256;
  for (let i = 0; i < cases.length; i += B) {
    const batch = cases.slice(i, i + B);
    const texts = batch.map((c) => (c.hex !== undefined ? Buffer.from(c.hex, 'hex').toString('utf8') : c.t));
    const plain = await tok.encodeBatch(texts, { addSpecialTokens: false });
    const spec = byFlags ? null : await tok.encodeBatch(texts, { addSpecialTokens: true });
    const lines = [];
    for (let k = 0; k < batch.length; k++) {
      const ids = plain[k].getIds();
      let sids;
      if (byFlags) {
        sids = (addBos && bosId !== null ? [bosId] : []).concat(ids, addEos && eosId !== null ? [eosId] : []);
      } else sids = spec[k].getIds();
      const dec = await tok.decode(ids, false);
      const sdec = await tok.decode(sids, true);
      lines.push(JSON.stringify({ ...batch[k], ids, sids, dec, sdec }));
    }
    fs.writeSync(fd, lines.join('\n') + '\n');
  }
  fs.closeSync(fd);
})().catch((e) => { console.error(e); process.exit(1); });
