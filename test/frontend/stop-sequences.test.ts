// Stop strings over text that arrives in pieces: a match across pieces is found, text that
// could start a stop string is held until ruled out, the earliest match wins (the longer one at
// the same place), and the stop string is kept only when asked.
import t from 'tap'
import { StopSequences } from '../../src/frontend/stop-sequences.js'

t.test('matches across pieces, earliest first, longer at a tie', async (t) => {
  const s = new StopSequences(['world', 'wor', 'lo'], false)
  t.same(s.feed('hel'), { text: 'he', matched: null }, '"l" could start "lo"')
  t.same(s.feed('lo world'), { text: 'l', matched: 'lo' }, 'the earliest match ends it: "hel" in all')
  const tie = new StopSequences(['ab', 'abc'], true)
  t.same(tie.feed('xabcd'), { text: 'xabc', matched: 'abc' }, 'at one place the longer wins; kept when asked')
  const split = new StopSequences(['</s>'], false)
  t.same(
    ['a<', '/', 's', '>b'].map((p) => split.feed(p)),
    [
      { text: 'a', matched: null },
      { text: '', matched: null },
      { text: '', matched: null },
      { text: '', matched: '</s>' },
    ],
  )
})

t.test('held text is released when ruled out or at the end; no stops, no holding', async (t) => {
  const s = new StopSequences(['END', ''], false)
  t.same(s.feed('xEN'), { text: 'x', matched: null })
  t.same(s.feed('D?'.slice(1)), { text: 'EN?', matched: null })
  t.same(s.feed('E'), { text: '', matched: null })
  t.equal(s.flush(), 'E')
  t.equal(s.flush(), '')
  const none = new StopSequences([], false)
  t.equal(none.active, false)
  t.same(none.feed('END'), { text: 'END', matched: null })
  t.equal(new StopSequences([''], false).active, false, 'an empty stop string stops nothing')
})
