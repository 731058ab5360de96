// A router replica's instance id: the u64 that names it to the rest of the deployment (its durable
// JetStream consumer; anything else that must tell replicas apart should use the same one). Drawn
// at random at each start, as Dynamo's come from a discovery lease granted at each start: a
// restarted replica is a new instance, and what the old one left behind is cleaned up as a gone
// replica's.
import { randomBytes } from 'node:crypto'

/** A random instance id in [1, 2^63): positive, as Dynamo's (i64 lease ids), and never 0. */
export function randomInstanceId(): bigint {
  for (;;) {
    const v = randomBytes(8).readBigUInt64BE() & 0x7fffffffffffffffn
    if (v !== 0n) return v
  }
}
