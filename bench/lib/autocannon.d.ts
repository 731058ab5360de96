// The part of autocannon's programmatic API that bench/route.ts uses (the package has no types).
declare module 'autocannon' {
  interface Latency {
    average: number
    p50: number
    p90: number
    p99: number
    max: number
  }
  interface Result {
    requests: { average: number; total: number }
    latency: Latency
    errors: number
    timeouts: number
    non2xx: number
    '2xx': number
  }
  interface Request {
    method?: string
    path?: string
    headers?: Record<string, string>
    body?: string | Buffer
  }
  interface Options {
    url: string
    connections?: number
    duration?: number
    pipelining?: number
    method?: string
    headers?: Record<string, string>
    body?: string | Buffer
    requests?: Request[]
    timeout?: number
    /** Requests per second over all connections (open-loop pacing). */
    overallRate?: number
  }
  function autocannon(opts: Options): Promise<Result>
  export default autocannon
}
