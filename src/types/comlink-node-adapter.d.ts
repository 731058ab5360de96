// comlink ships its Node adapter without a declaration next to the ESM build.
declare module 'comlink/dist/esm/node-adapter.mjs' {
  import type { Endpoint } from 'comlink'
  interface NodeEndpointLike {
    postMessage(message: unknown, transfer?: readonly unknown[]): void
    // biome-ignore lint/suspicious/noExplicitAny: the adapter's own signature: listeners take whatever the port emits
    on(type: string, listener: (...args: any[]) => void): unknown
    // biome-ignore lint/suspicious/noExplicitAny: the adapter's own signature: listeners take whatever the port emits
    off(type: string, listener: (...args: any[]) => void): unknown
  }
  export default function nodeEndpoint(nep: NodeEndpointLike): Endpoint
}
