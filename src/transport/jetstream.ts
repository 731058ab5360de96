// The durable KV-event stream, set up as Dynamo's `NatsQueue` sets it up: router replicas and
// durable publishers (`kv-router mocker --durable-kv-events`) each create it when it is missing,
// with the same configuration, so whichever starts first makes it. A stream that exists is used
// as it is (an operator may have given it another retention).
import type { JetStreamManager } from 'nats'
import { kvEventsStream, kvEventsStreamSubjects } from './dynamo-names.js'

/** How long the stream keeps a message: an hour, Dynamo's default. */
export const STREAM_MAX_AGE_MS = 3_600_000

/** JetStream API error codes this code reacts to. */
export const JS_STREAM_NOT_FOUND = 10059
export const JS_CONSUMER_NOT_FOUND = 10014
const JS_STREAM_NAME_IN_USE = 10058

/** The JetStream API error code of a failed request, or undefined for other failures. */
export function jsErrorCode(err: unknown): number | undefined {
  const api = (err as { api_error?: { err_code?: unknown } } | null)?.api_error
  return typeof api?.err_code === 'number' ? api.err_code : undefined
}

/** The stream's name, after creating it if it did not exist. */
export async function ensureKvEventsStream(jsm: JetStreamManager, namespace: string, component: string): Promise<string> {
  const name = kvEventsStream(namespace, component)
  try {
    await jsm.streams.info(name)
    return name
  } catch (err) {
    if (jsErrorCode(err) !== JS_STREAM_NOT_FOUND) throw err
  }
  const { nanos, StorageType } = await import('nats')
  try {
    await jsm.streams.add({ name, subjects: kvEventsStreamSubjects(name), max_age: nanos(STREAM_MAX_AGE_MS), storage: StorageType.File })
  } catch (err) {
    // another replica or publisher made it between the two requests
    if (jsErrorCode(err) !== JS_STREAM_NAME_IN_USE) throw err
  }
  return name
}
