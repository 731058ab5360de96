// Dynamo's names on the wire, in one place: the NATS subjects workers publish KV events and load
// on, and the etcd keys they register under. The router reads them (nats.ts, etcd.ts) and the
// simulated engines write them (src/sim/mocker/), so both sides agree by construction.

/** The KV-event subjects of a worker component: `kv-events`, and the older `kv_events`. */
export function kvEventSubjects(namespace: string, component: string): string[] {
  const prefix = `namespace.${namespace}.component.${component}`
  return [`${prefix}.kv-events`, `${prefix}.kv_events`]
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
