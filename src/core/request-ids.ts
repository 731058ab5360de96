import { randomBytes } from 'node:crypto'

/**
 * Booking ids the router makes. The proxy's own are marked (`~` is no base-36 digit) so that the
 * release routes of /v1/route can tell them apart: a proxied request's booking ends with its
 * stream, and a client guessing its sequential id must not free it early. Random bits after the
 * start time keep the ids of replicas started in the same millisecond apart: a Dynamo router that
 * shares bookings knows them by request id alone.
 */
export class RequestIds {
  /** The prefix of every id this router makes. */
  readonly prefix = `r${Date.now().toString(36)}${randomBytes(4).readUInt32BE(0).toString(36)}-`
  private readonly proxiedPrefix = `${this.prefix}~`
  private next = 0

  /** A fresh id; `proxied` marks it as one of the proxy's bookings. */
  create(proxied = false): string {
    return (proxied ? this.proxiedPrefix : this.prefix) + (this.next++).toString(36)
  }

  /** Whether an id is one of the proxy's bookings (create(true)). */
  isProxied(id: string): boolean {
    return id.startsWith(this.proxiedPrefix)
  }

  /**
   * Whether an id is in the space create() draws from. Every booking answer shows that space's
   * prefix and counter, so a client that booked the next ids under its own name would make
   * unrelated proxied requests fail as duplicates; client-chosen ids are kept out of it instead.
   */
  isOurs(id: string): boolean {
    return id.startsWith(this.prefix)
  }
}
