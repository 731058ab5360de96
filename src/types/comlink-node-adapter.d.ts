// comlink ships its Node adapter without a declaration next to the ESM build.
declare module 'comlink/dist/esm/node-adapter.mjs' {
  import type { Endpoint } from 'comlink'
  interface NodeEndpointLike {
    postMessage(message: unknown, transfer?: readonly unknown[]): void
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    on(type: string, listener: (...args: any[]) => void): unknown
    // eslint-disable-next-line @typescript-eslint/no-explicit-any
    off(type: string, listener: (...args: any[]) => void): unknown
  }
  export default function nodeEndpoint(nep: NodeEndpointLike): Endpoint
}
