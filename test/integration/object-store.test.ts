// Objects of NATS's object store written and read with node's SHA-256
// (src/transport/object-store.ts), against a real nats-server: what the client wrote reads back
// byte for byte, and what is written here the client reads back, info and metadata included,
// whatever the size against the chunk size; an object written again leaves no old chunk; data
// that is not the object's (changed, cut short, more of it, gone) is refused rather than returned.
import t from 'tap'
import * as nats from 'nats'
import { createHash, randomBytes } from 'node:crypto'
import { readObject, writeObject } from '../../src/transport/object-store.js'
import { natsAndClient } from '../helpers/durable.js'

t.test('objects the client wrote read back; damaged ones are refused', async (t) => {
  const { nc } = await natsAndClient(t)
  const js = nc.jetstream()
  const jsm = await nc.jetstreamManager()
  const os = await js.views.os('objects')
  const chunk = 128 * 1024
  for (const size of [0, 1, chunk - 1, chunk, chunk + 1, 5 * chunk + 17]) {
    const data = randomBytes(size)
    await os.putBlob({ name: `o${size}` }, data)
    const info = await os.info(`o${size}`)
    if (info === null) throw new Error('no info')
    const got = await readObject(nats, js, info)
    t.equal(Buffer.compare(Buffer.from(got), data), 0, `${size} bytes, ${info.chunks} chunk(s)`)
  }

  // the chunks replaced under the object's info
  const data = randomBytes(3 * chunk)
  await os.putBlob({ name: 'x' }, data)
  const info = await os.info('x')
  if (info === null) throw new Error('no info')
  const subject = `$O.objects.C.${info.nuid}`
  const replace = async (chunks: Uint8Array[]): Promise<void> => {
    await jsm.streams.purge('OBJ_objects', { filter: subject })
    for (const c of chunks) await js.publish(subject, c)
  }
  const changed = Buffer.from(data)
  changed[chunk + 5] = (changed[chunk + 5] as number) ^ 1
  await replace([changed.subarray(0, chunk), changed.subarray(chunk, 2 * chunk), changed.subarray(2 * chunk)])
  await t.rejects(readObject(nats, js, info), /is corrupt: its SHA-256 does not match/, 'a byte changed')
  await replace([data.subarray(0, chunk), data.subarray(chunk, 2 * chunk)])
  await t.rejects(readObject(nats, js, info), /of its \d+ bytes arrived/, 'cut short')
  await replace([data.subarray(0, 2 * chunk), data.subarray(chunk)])
  await t.rejects(readObject(nats, js, info), /holds more than its/, 'more than its size')
  await replace([])
  await t.rejects(readObject(nats, js, info, 300), /0 of its \d+ bytes arrived/, 'gone: the read ends once idle')
  await replace([data])
  t.equal(Buffer.compare(Buffer.from(await readObject(nats, js, info)), data), 0, 'restored, it reads again')
  // the info's fields are getters: copied by name
  const withDigest = (digest: string): nats.ObjectInfo =>
    ({
      name: info.name,
      bucket: info.bucket,
      nuid: info.nuid,
      size: info.size,
      chunks: info.chunks,
      mtime: info.mtime,
      deleted: false,
      digest,
    }) as nats.ObjectInfo
  await t.rejects(readObject(nats, js, withDigest('MD5=abc')), /digest of unknown type/)
  t.equal((await readObject(nats, js, withDigest(`SHA-256=${createHash('sha256').update(data).digest('hex')}`))).length, data.length, 'a digest written in hex')
  t.equal((await readObject(nats, js, withDigest(`SHA-256=${createHash('sha256').update(data).digest('base64')}`))).length, data.length, 'in base64')
})

t.test('objects written here read back through the client, and an object written again leaves no old chunk', async (t) => {
  const { nc } = await natsAndClient(t)
  const js = nc.jetstream()
  const jsm = await nc.jetstreamManager()
  const os = await js.views.os('written')
  const chunk = 128 * 1024
  const target = { nats, nc, js, jsm, os, bucket: 'written', name: 'radix-state' }
  let previous: string | null = null
  for (const size of [0, 1, chunk, chunk + 1, 40 * chunk + 3]) {
    const data = randomBytes(size)
    await writeObject(target, data, { kvr_stream_seq: String(size), other: 'x' })
    const info = await os.info('radix-state')
    if (info === null) throw new Error('no info')
    t.same([info.size, info.chunks, info.metadata], [size, Math.ceil(size / chunk), { kvr_stream_seq: String(size), other: 'x' }], `${size} bytes: its info`)
    t.equal(Buffer.compare(Buffer.from((await os.getBlob('radix-state')) as Uint8Array), data), 0, `${size} bytes: the client reads it, its digest checked`)
    t.equal(Buffer.compare(Buffer.from(await readObject(nats, js, info)), data), 0, `${size} bytes: and so does readObject`)
    const chunksOf = async (nuid: string): Promise<number> =>
      (await jsm.streams.info('OBJ_written', { subjects_filter: `$O.written.C.${nuid}` })).state.subjects?.[`$O.written.C.${nuid}`] ?? 0
    t.equal(await chunksOf(info.nuid), info.chunks, `${size} bytes: its chunks in the stream`)
    if (previous !== null) t.equal(await chunksOf(previous), 0, `${size} bytes: the chunks of the object before are gone`)
    previous = info.nuid
  }
  const names: string[] = []
  for await (const o of await os.list()) names.push(o.name)
  t.same(names, ['radix-state'], 'one object')
})
