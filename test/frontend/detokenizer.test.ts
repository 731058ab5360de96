// Token ids back to text one token at a time, on real tokenizers: a byte-level BPE
// tokenizer.json (a character's bytes split across tokens never come out broken, and come out
// whole once complete), the word-level fixture (spaces between words come from the window of
// earlier tokens), the bytes tokenizer; and the model's EOS ids read beside tokenizer.json.
import t from 'tap'
import { copyFileSync, mkdtempSync, readFileSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { Tokenizer } from '@huggingface/tokenizers'
import { IncrementalDetokenizer } from '../../src/frontend/detokenizer.js'
import { BytesDecoder, HfDecoder, tokenDecoderFor } from '../../src/tokenizer/token-decoder.js'
import { fromRoot } from '../helpers/paths.js'

const byteLevel = fromRoot('test', 'fixtures', 'byte-level', 'tokenizer.json')
const wordLevel = fromRoot('test', 'fixtures', 'tokenizer.json')

function encode(path: string, text: string): number[] {
  const tok = new Tokenizer(JSON.parse(readFileSync(path, 'utf8')) as object, {})
  return tok.encode(text, { add_special_tokens: false }).ids
}

t.test('byte-level BPE: split UTF-8 is held until the character is whole', async (t) => {
  const decoder = HfDecoder.load(byteLevel)
  const text = 'héllo world 🚀 naïve ✓'
  const ids = encode(byteLevel, text)
  // the rocket is four byte tokens, ✓ three: the fixture has no merges for them
  t.ok(ids.length > [...text].length, 'some characters span several tokens')
  const d = new IncrementalDetokenizer(decoder, true)
  const pieces = ids.map((id) => d.push(id))
  for (const p of pieces) t.notOk(p.includes('\uFFFD'), `no broken character in ${JSON.stringify(p)}`)
  t.equal(pieces.join('') + d.flush(), text)
  const rocket = pieces.findIndex((p) => p.includes('🚀'))
  t.same(pieces.slice(rocket - 3, rocket), ['', '', ''], 'the rocket waits for its fourth byte')
  t.equal(pieces[rocket], '🚀')
})

t.test('byte-level BPE: the prompt gives the first token its context; special tokens are skipped or kept', async (t) => {
  const decoder = HfDecoder.load(byteLevel)
  const ids = encode(byteLevel, 'hello world')
  const split = ids.indexOf(encode(byteLevel, ' w')[0] as number)
  t.ok(split > 0)
  const d = new IncrementalDetokenizer(decoder, true, ids.slice(0, split))
  t.equal(
    ids
      .slice(split)
      .map((id) => d.push(id))
      .join(''),
    ' world',
    'the leading space of the first output token is kept',
  )
  const eos = decoder.eosTokenIds[0] as number
  t.same(decoder.eosTokenIds, [262], 'tokenizer_config.json eos_token, looked up in the vocabulary')
  const skip = new IncrementalDetokenizer(decoder, true)
  t.equal([...encode(byteLevel, 'hi'), eos].map((id) => skip.push(id)).join('') + skip.flush(), 'hi')
  const keep = new IncrementalDetokenizer(decoder, false)
  t.equal([...encode(byteLevel, 'hi'), eos].map((id) => keep.push(id)).join('') + keep.flush(), 'hi<|endoftext|>')
})

t.test('an unfinished character at the end of the stream is flushed as U+FFFD', async (t) => {
  const decoder = HfDecoder.load(byteLevel)
  const ids = encode(byteLevel, 'a🚀').slice(0, 3)
  const d = new IncrementalDetokenizer(decoder, true)
  t.equal(ids.map((id) => d.push(id)).join(''), 'a')
  t.equal(d.flush(), '\uFFFD')
  t.equal(d.flush(), '', 'nothing twice')
})

t.test('bytes that never form a character are released after a bound', async (t) => {
  const d = new IncrementalDetokenizer(new BytesDecoder(), true)
  let out = ''
  for (let i = 0; i < 40; i++) out += d.push(0xff)
  t.ok(out.length > 0, 'invalid bytes do not hold the stream for ever')
  t.match(out, /^\uFFFD+$/, 'they come out as replacement characters')
  t.equal(out + d.flush() + d.push(0x41), `${'\uFFFD'.repeat(40)}A`, 'one per byte, and the stream goes on')
})

t.test('word-level fixture: words and the spaces between them', async (t) => {
  const decoder = tokenDecoderFor(wordLevel) as HfDecoder
  t.same(decoder.eosTokenIds, [], 'no EOS known')
  const d = new IncrementalDetokenizer(decoder, true, [1])
  t.equal([2, 3, 4, 5].map((id) => d.push(id)).join(''), ' world kv cache router')
})

t.test('bytes tokenizer and the decoder choice', async (t) => {
  const d = new IncrementalDetokenizer(tokenDecoderFor('bytes') as BytesDecoder, true)
  const bytes = [...Buffer.from('hé✓', 'utf8')]
  const pieces = bytes.map((b) => d.push(b))
  t.same(pieces, ['h', '', 'é', '', '', '✓'])
  t.equal(new BytesDecoder().decode([104, 300, 105]), 'hi', 'ids past 255 have no text')
  t.equal(tokenDecoderFor(null), null)
  t.throws(() => tokenDecoderFor('/nonexistent/tokenizer.json'), { code: 'KVR_ERR_INVALID_OPTION', message: /no such file/ })
  const dir = mkdtempSync(join(tmpdir(), 'kvr-dec-'))
  writeFileSync(join(dir, 'bad.json'), '{"model":{"type":"NoSuchModel"}}')
  t.throws(() => HfDecoder.load(join(dir, 'bad.json')), { code: 'KVR_ERR_INVALID_OPTION', message: /could not be loaded for decoding/ })
})

t.test('EOS ids: generation_config.json, then config.json, then tokenizer_config.json', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'kvr-eos-'))
  copyFileSync(byteLevel, join(dir, 'tokenizer.json'))
  writeFileSync(join(dir, 'tokenizer_config.json'), JSON.stringify({ eos_token: { content: '<|endoftext|>' } }))
  t.same(HfDecoder.load(join(dir, 'tokenizer.json')).eosTokenIds, [262], 'eos_token as an object')
  writeFileSync(join(dir, 'config.json'), JSON.stringify({ eos_token_id: 100 }))
  t.same(HfDecoder.load(join(dir, 'tokenizer.json')).eosTokenIds, [100])
  writeFileSync(join(dir, 'generation_config.json'), JSON.stringify({ eos_token_id: [100, 101, 'x'] }))
  t.same(HfDecoder.load(join(dir, 'tokenizer.json')).eosTokenIds, [100, 101], 'a list; what is not an id is left out')
  writeFileSync(join(dir, 'generation_config.json'), '{ not json')
  t.same(HfDecoder.load(join(dir, 'tokenizer.json')).eosTokenIds, [100], 'an unreadable file is passed over')
})

t.test('a long answer decodes whole while the window stays short', async (t) => {
  const decoder = HfDecoder.load(byteLevel)
  const text = 'naïve 🚀 rockets, héllo world. '.repeat(20)
  const ids = encode(byteLevel, text)
  t.ok(ids.length > 200)
  const d = new IncrementalDetokenizer(decoder, true, encode(byteLevel, 'prompt'))
  t.equal(ids.map((id) => d.push(id)).join('') + d.flush(), text)
})

t.test('a run of skipped special tokens does not hold the text after it', async (t) => {
  const decoder = HfDecoder.load(byteLevel)
  const d = new IncrementalDetokenizer(decoder, true)
  const out = [...Array(50).fill(262), ...encode(byteLevel, 'after')].map((id) => d.push(id)).join('')
  t.equal(out + d.flush(), 'after')
})
