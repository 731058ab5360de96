// Reading one object of NATS's object store with its digest checked by node's SHA-256. An
// object's data are the messages of subject `$O.{bucket}.C.{nuid}` and its info (nuid, size,
// digest) the last message of its meta subject (NATS ADR-20); the info comes from the client
// (ObjectStore.info), the data are read here in order, as the client's get reads them. The client
// hashes them in JavaScript, which for a snapshot of a few megabytes costs several times the
// transfer (docs/benchmarks.md, bench:durable); node's hash is native.
import { createHash } from 'node:crypto'
import type { JetStreamClient, ObjectInfo } from 'nats'

type Nats = typeof import('nats')

const DIGEST_TYPE = 'SHA-256='
/** A read that receives nothing for this long ends: a newer upload purged the chunks under it. */
const IDLE_MS = 10_000

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
