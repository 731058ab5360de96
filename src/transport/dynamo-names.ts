// Dynamo's names on the wire, in one place: the NATS subjects workers publish KV events and load
// on, and the etcd keys they register under. The router reads them (nats.ts, etcd.ts) and the
// simulated engines write them (src/sim/mocker/), so both sides agree by construction. The
// durable path (JetStream stream, snapshot bucket) has its names here too.

/**
 * The KV-event subjects of a worker component: `kv-events`, the older `kv_events`, and those of
 * its endpoints (`…endpoint.{e}.kv-events`, where workers since Dynamo's endpoint-scoped event
 * channels publish; `{e}` is one percent-encoded segment, so `*` matches every endpoint).
 */
export function kvEventSubjects(namespace: string, component: string): string[] {
  const prefix = `namespace.${namespace}.component.${component}`
  return [`${prefix}.kv-events`, `${prefix}.kv_events`, `${prefix}.endpoint.*.kv-events`]
}

/** The subject a worker publishes its KV events on: one RouterEvent JSON per message. */
export function kvEventsSubject(namespace: string, component: string): string {
  return kvEventSubjects(namespace, component)[0] as string
}

/** The subject workers publish their load (`kv_metrics`) on. */
export function kvMetricsSubject(namespace: string): string {
  return `namespace.${namespace}.kv_metrics`
}

/**
 * The subject routers share their bookings on (replica sync, `ACTIVE_SEQUENCES_SUBJECT`), scoped
 * to the workers' component: one `ActiveSequenceEvent` per message.
 */
export function activeSequencesSubject(namespace: string, component: string): string {
  return `namespace.${namespace}.component.${component}.active_sequences_events`
}

/** The etcd prefix of an endpoint's instance records (one key per worker, under its lease). */
export function instancesPrefix(ns: string, component: string, endpoint: string): string {
  return `v1/instances/${ns}/${component}/${endpoint}/`
}

/** The etcd prefix of an endpoint's model cards (block size, KV capacity, data-parallel size). */
export function cardsPrefix(ns: string, component: string, endpoint: string): string {
  return `v1/mdc/${ns}/${component}/${endpoint}/`
}

/**
 * Dynamo's `Slug::slugify` followed by its `_`→`-`: lowercase; anything but a-z, 0-9, `-` and `_`
 * becomes `_`; leading `_` dropped; then every `_` becomes `-`. Stream and bucket names go
 * through it, so `.` and `_` both end up as `-`.
 */
export function slugify(text: string): string {
  return text
    .toLowerCase()
    .replace(/[^a-z0-9_-]/g, '_')
    .replace(/^_+/, '')
    .replaceAll('_', '-')
}

/** The JetStream stream of durable KV events: `namespace-{ns}-component-{comp}-kv-events`. */
export function kvEventsStream(namespace: string, component: string): string {
  return slugify(`namespace.${namespace}.component.${component}.kv-events`)
}

/** The subjects of that stream: Dynamo's queue binds `{stream}.*`. */
export function kvEventsStreamSubjects(stream: string): string[] {
  return [`${stream}.*`]
}

/** The subject durable publishers write to (Dynamo's `NatsQueue` publishes as `queue`). */
export function kvEventsQueueSubject(stream: string): string {
  return `${stream}.queue`
}

/** The object-store bucket of index snapshots: `namespace-{ns}-component-{comp}-radix-bucket`. */
export function radixBucket(namespace: string, component: string): string {
  return slugify(`namespace.${namespace}.component.${component}-radix-bucket`)
}

/** The snapshot's object in that bucket. */
export const RADIX_STATE_OBJECT = 'radix-state'
