// `kv-router mocker`: simulated engines that register with a router and post their KV events.
import { SimEngine } from '../sim-engine.js'
import { die, flagValue, intFlag } from '../cli-flags.js'

const mockerHelp = `usage: kv-router mocker --router-url URL [options]

  --router-url URL        router to register with and post KV events to (required)
  --num-workers N         engines to start (default 1)
  --block-size N          KV block size in tokens (default 128; must match the router's)
  --capacity N            KV blocks per engine (default 4096)
  --first-worker-id N     worker id of the first engine (default 1000)
  --host HOST             address the engines listen on (default 127.0.0.1)
  --ttft-ms N, --itl-ms N simulated delays (default 5 and 2)
  --api-key KEY           the router's --api-key
`

export async function mockerMain(argv: string[]): Promise<void> {
  if (argv.includes('--help') || argv.includes('-h')) {
    process.stdout.write(mockerHelp)
    return
  }
  const routerUrl = flagValue(argv, '--router-url')
  if (routerUrl === undefined || !/^https?:\/\//.test(routerUrl)) die('mocker: --router-url must be a URL (http://host:port)')
  const n = intFlag('mocker', argv, '--num-workers', 1, 1, 256)
  const bs = intFlag('mocker', argv, '--block-size', 128, 1, 65536)
  const capacity = intFlag('mocker', argv, '--capacity', 4096, 1, 1 << 26)
  const first = intFlag('mocker', argv, '--first-worker-id', 1000, 0, Number.MAX_SAFE_INTEGER)
  const ttftMs = intFlag('mocker', argv, '--ttft-ms', 5, 0, 60_000)
  const itlMs = intFlag('mocker', argv, '--itl-ms', 2, 0, 60_000)
  const apiKey = flagValue(argv, '--api-key')
  const host = flagValue(argv, '--host') ?? '127.0.0.1'
  const engines: SimEngine[] = []
  const headers: Record<string, string> = { 'content-type': 'application/json' }
  if (apiKey !== undefined) headers.authorization = `Bearer ${apiKey}`
  for (let i = 0; i < n; i++) {
    const o: ConstructorParameters<typeof SimEngine>[0] = { workerId: BigInt(first + i), blockSize: bs, capacity, host, routerUrl, ttftMs, itlMs }
    if (apiKey !== undefined) o.apiKey = apiKey
    const e = new SimEngine(o)
    await e.listen()
    const res = await fetch(`${routerUrl}/v1/workers`, { method: 'POST', headers, body: JSON.stringify({ id: String(e.workerId), url: e.url, block_size: bs, capacity }) })
    if (!res.ok) die(`mocker: the router refused worker ${e.workerId}: ${res.status} ${await res.text()}`)
    engines.push(e)
  }
  process.stdout.write(`kv-router mocker: ${n} engine(s) registered with ${routerUrl}: ${engines.map((e) => e.url).join(' ')}\n`)
  const stop = (): void => {
    void Promise.all(engines.map((e) => e.close())).then(() => process.exit(0))
  }
  process.on('SIGTERM', stop)
  process.on('SIGINT', stop)
}

