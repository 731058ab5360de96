// One object of NATS's object store, written and read with its digest computed by node's
// SHA-256. An object's data are the messages of subject `$O.{bucket}.C.{nuid}`, in chunks, and its
// info (nuid, size, digest, metadata) the last message of `$O.{bucket}.M.{name in base64}` (NATS
// ADR-20): written here as the client's put writes them, and read as its get reads them, the info
// itself through the client. The client hashes in JavaScript, which for a snapshot of a few
// megabytes costs several times the transfer (docs/benchmarks.md, bench:durable); node's hash is
// native.
import { createHash } from 'node:crypto'
import type { JetStreamClient, JetStreamManager, NatsConnection, ObjectInfo, ObjectStore, PubAck } from 'nats'

type Nats = typeof import('nats')

const DIGEST_TYPE = 'SHA-256='
/** A read that receives nothing for this long ends: a newer upload purged the chunks under it. */
const IDLE_MS = 10_000
/** The client's chunk size, and chunks in flight at once (all at once, 60 MB of them time out on a busy server). */
const CHUNK_BYTES = 128 * 1024
const IN_FLIGHT = 32

/** Where an object is written: its bucket (which exists, as `os`) and its name. */
export interface ObjectTarget {
  nats: Nats
  nc: NatsConnection
  js: JetStreamClient
  jsm: JetStreamManager
  os: ObjectStore
  bucket: string
  name: string
}

/**
 * Writes `data` as object `name` of a bucket that exists, replacing what it held: the chunks,
 * then the info (a rollup of its subject), then the old chunks purged. A failed write purges the
 * chunks it wrote and leaves the object as it was.
 */
export async function writeObject(t: ObjectTarget, data: Uint8Array, metadata: Record<string, string>): Promise<void> {
  const old = await t.os.info(t.name)
  const stream = `OBJ_${t.bucket}`
  const nuid = t.nats.nuid.next()
  const chunks = `$O.${t.bucket}.C.${nuid}`
  const size = Math.min(CHUNK_BYTES, t.nc.info?.max_payload ?? CHUNK_BYTES)
  const digest = createHash('sha256').update(data).digest('base64url')
  try {
    const flight: Promise<PubAck>[] = []
    for (let at = 0; at < data.length; at += size) {
      if (flight.length === IN_FLIGHT) await flight.shift()
      flight.push(t.js.publish(chunks, data.subarray(at, at + size)))
    }
    await Promise.all(flight)
  } catch (err) {
    await t.jsm.streams.purge(stream, { filter: chunks }).catch(() => undefined)
    throw err
  }
  const info = {
    bucket: t.bucket,
    nuid,
    size: data.length,
    chunks: Math.ceil(data.length / size),
    name: t.name,
    description: '',
    options: { max_chunk_size: size },
    metadata,
    mtime: new Date().toISOString(),
    // padded, as the client writes it
    digest: `${DIGEST_TYPE}${digest}${'='.repeat((4 - (digest.length % 4)) % 4)}`,
    deleted: false,
  }
  const h = t.nats.headers()
  h.set('Nats-Rollup', 'sub')
  await t.js.publish(`$O.${t.bucket}.M.${padded(t.name)}`, Buffer.from(JSON.stringify(info)), { headers: h })
  // the old data, now named by nothing (a failure leaves it in the stream, as the client's put does)
  if (old !== null && old.nuid !== nuid) await t.jsm.streams.purge(stream, { filter: `$O.${t.bucket}.C.${old.nuid}` }).catch(() => undefined)
}

function padded(name: string): string {
  const b = Buffer.from(name).toString('base64url')
  return b + '='.repeat((4 - (b.length % 4)) % 4)
}

/** The object's bytes; rejects when they do not all arrive or their digest does not match. */
export async function readObject(nats: Nats, js: JetStreamClient, info: ObjectInfo, idleMs = IDLE_MS): Promise<Uint8Array> {
  if (info.options?.link !== undefined) throw new Error(`object ${info.name} is a link`)
  if (!info.digest.startsWith(DIGEST_TYPE)) throw new Error(`object ${info.name} has a digest of unknown type: ${info.digest}`)
  const out = new Uint8Array(info.size)
  const hash = createHash('sha256')
  let n = 0
  if (info.size > 0) {
    const opts = nats.consumerOpts()
    opts.orderedConsumer()
    const sub = await js.subscribe(`$O.${info.bucket}.C.${info.nuid}`, opts)
    const idle = setTimeout(() => sub.unsubscribe(), idleMs)
    try {
      for await (const m of sub) {
        idle.refresh()
        if (n + m.data.length > out.length) throw new Error(`object ${info.name} holds more than its ${info.size} bytes`)
        out.set(m.data, n)
        n += m.data.length
        hash.update(m.data)
        if (m.info.pending === 0) break
      }
    } finally {
      clearTimeout(idle)
      sub.unsubscribe()
    }
  }
  if (n !== info.size) throw new Error(`object ${info.name}: ${n} of its ${info.size} bytes arrived`)
  if (!hash.digest().equals(digestBytes(info.digest.slice(DIGEST_TYPE.length)))) throw new Error(`object ${info.name} is corrupt: its SHA-256 does not match`)
  return out
}

/** A digest as writers spell it: base64 (URL-safe or not, padded or not) or hex. */
function digestBytes(text: string): Buffer {
  return /^[0-9a-f]{64}$/i.test(text) ? Buffer.from(text, 'hex') : Buffer.from(text, 'base64url')
}
