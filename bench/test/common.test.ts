// The machine's steal time as the proxy benchmark reads it from /proc/stat, beside each round.
import t from 'tap'
import { readFileSync } from 'node:fs'
import { machineStealTicks, stealTicksOf } from '../lib/common.js'

t.test('stealTicksOf: the eighth field of the aggregate cpu line', async (t) => {
  const text = 'cpu  3593537 6429 794712 9712117 7946 0 225532 11561 0 0\ncpu0 1780707 3199 388158 4886630 767 0 111943 5806 0 0\n'
  t.equal(stealTicksOf(text), 11561)
  t.equal(stealTicksOf('cpu  1 2 3 4 5 6 7 42'), 42, 'a text of one line, no newline')
  t.equal(stealTicksOf('cpu0 1 2 3 4 5 6 7 8 0 0\n'), null, "a per-CPU line is not the machine's")
  t.equal(stealTicksOf('cpu  1 2 3 4 5 6 7\n'), null, 'a kernel without the field')
  t.equal(stealTicksOf('cpu  1 2 3 4 5 6 7 x\n'), null, 'a field that is not a count')
  t.equal(stealTicksOf(''), null)
})

t.test('machineStealTicks: this machine has the field, and it never runs backwards', async (t) => {
  // the tests run on Linux (the harness starts nats-server and etcd from Debian packages)
  const a = machineStealTicks()
  t.type(a, 'number', `/proc/stat begins: ${readFileSync('/proc/stat', 'utf8').slice(0, 80)}`)
  const b = machineStealTicks() as number
  t.ok(b >= (a as number))
})
