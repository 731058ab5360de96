// The value readers `mocker` and `replay` share: they must take exactly what `serve` takes for
// the same kind of value, so each is held against parseServeConfig over the same inputs.
import t from 'tap'
import { parseIntArg, parseNumArg } from '../../src/config/table.js'
import { isHttpUrl } from '../../src/core/endpoints.js'
import { parseServeConfig } from '../../src/config.js'

const serveTakes = (argv: string[]): boolean => {
  try {
    parseServeConfig(argv, {})
    return true
  } catch {
    return false
  }
}

const NUMBERS = [
  '0',
  '1',
  '7',
  ' 42 ',
  '-1',
  '-0',
  '65535',
  '65536',
  '1.5',
  '.5',
  '1e3',
  '1E-2',
  '+3',
  '0x10',
  '0b11',
  '0o7',
  '1_000',
  'Infinity',
  '-Infinity',
  'NaN',
  '',
  ' ',
  'abc',
  '1-2',
  '9007199254740993',
  '3.',
  'e',
]

t.test('parseIntArg: decimal digits only, within the bounds, as serve reads --http-port', async (t) => {
  for (const text of NUMBERS) t.equal(parseIntArg(text, 0, 65535) !== undefined, serveTakes([`--http-port=${text}`]), JSON.stringify(text))
  t.equal(parseIntArg(' 42 ', 0, 65535), 42)
  t.equal(parseIntArg('0x10', 0, 100), undefined)
  t.equal(parseIntArg('0b11', 0, 100), undefined)
  t.equal(parseIntArg('1e3', 0, 10_000), undefined)
  t.equal(parseIntArg('-3', -5, 5), -3)
  t.equal(parseIntArg('6', -5, 5), undefined)
})

t.test('parseNumArg: finite decimal numbers within the bounds, as serve reads --router-temperature', async (t) => {
  for (const text of NUMBERS) t.equal(parseNumArg(text, 0, Infinity) !== undefined, serveTakes([`--router-temperature=${text}`]), JSON.stringify(text))
  t.equal(parseNumArg('1e3', 0, Infinity), 1000)
  t.equal(parseNumArg('.5', 0, 1), 0.5)
  t.equal(parseNumArg('0x10', 0, Infinity), undefined)
  t.equal(parseNumArg('0b11', 0, Infinity), undefined)
  t.equal(parseNumArg('Infinity', 0, Infinity), undefined)
  t.equal(parseNumArg('2', 0, 1), undefined)
})

t.test('isHttpUrl: http(s) URLs the WHATWG parser takes, as serve reads --worker', async (t) => {
  const urls = [
    'http://127.0.0.1:8000',
    'https://h',
    'http://h/',
    'HTTP://H:1',
    'http://[::1]:80',
    'http://127.0.0.1:99999',
    'http://h:-1',
    'ftp://h',
    'nats://h:4222',
    'localhost:8000',
    'h',
    '',
    'http://',
    'http://a b',
    'http://999.1.1.1',
  ]
  for (const u of urls) t.equal(isHttpUrl(u), serveTakes([`--worker=${u}`]), JSON.stringify(u))
  t.equal(isHttpUrl('http://127.0.0.1:99999'), false, 'a port above 65535')
  t.equal(isHttpUrl('https://h'), true)
})
