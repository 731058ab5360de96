// No Kubernetes runs on the machines that test this project, so the manifests in deploy/k8s are
// checked here: every YAML document parses, the router's command line and environment go
// through its own parser (an unknown or misspelt DYN_* variable would be ignored by the router,
// so it fails here), and the objects agree with each other and with the router's behaviour
// (ports, probe paths, the grace period against the drain deadline, the selectors, resources).
import t from 'tap'
import { existsSync, readFileSync } from 'node:fs'
import { join } from 'node:path'
import { parse, parseAllDocuments } from 'yaml'
import { FLAGS, parseServeConfig, type ServeConfig } from '../src/config.js'
import { repoRoot } from './helpers/paths.js'

const root = `${repoRoot}/`
const dir = join(root, 'deploy', 'k8s')

interface Probe {
  httpGet?: { path: string; port: string | number }
  periodSeconds?: number
  failureThreshold?: number
}
interface Container {
  name: string
  image: string
  args?: string[]
  command?: string[]
  ports?: { name?: string; containerPort: number }[]
  env?: { name: string; value?: string; valueFrom?: unknown }[]
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> }
  startupProbe?: Probe
  livenessProbe?: Probe
  readinessProbe?: Probe
  lifecycle?: { preStop?: { exec?: { command: string[] }; sleep?: { seconds: number } } }
}
interface Doc {
  apiVersion: string
  kind: string
  metadata: { name: string; labels?: Record<string, string> }
  // biome-ignore lint/suspicious/noExplicitAny: each kind has its own spec, read field by field below
  spec: any
}

const kustomization = parse(readFileSync(join(dir, 'kustomization.yaml'), 'utf8')) as {
  resources: string[]
  images?: { name: string; newName?: string; newTag?: string }[]
}
const docs: Doc[] = []
const parseErrors: string[] = []
for (const file of kustomization.resources) {
  if (!existsSync(join(dir, file))) continue
  for (const d of parseAllDocuments(readFileSync(join(dir, file), 'utf8'))) {
    for (const e of d.errors) parseErrors.push(`${file}: ${e.message}`)
    docs.push(d.toJS() as Doc)
  }
}
const one = (kind: string): Doc => {
  const found = docs.filter((d) => d.kind === kind)
  if (found.length !== 1) throw new Error(`deploy/k8s has ${found.length} ${kind}s`)
  return found[0] as Doc
}
const deployment = one('Deployment')
const podLabels = (deployment.spec.template.metadata.labels ?? {}) as Record<string, string>
const containers = deployment.spec.template.spec.containers as Container[]
const router = containers.find((c) => c.name === 'router') as Container
const env = Object.fromEntries((router?.env ?? []).map((e) => [e.name, e.value]))
const cfg = (): ServeConfig => {
  const c = parseServeConfig((router.args ?? []).slice(1), env)
  if (c === 'help') throw new Error('the router asks for help')
  return c
}
/** A selector's matchLabels all on the Deployment's pods. */
const selects = (labels: Record<string, string> | undefined): boolean =>
  labels !== undefined && Object.keys(labels).length > 0 && Object.entries(labels).every(([k, v]) => podLabels[k] === v)
/** Kubernetes quantities: CPUs, or bytes. */
function quantity(q: string | undefined): number {
  const m = /^(\d+(?:\.\d+)?)(m|Ki|Mi|Gi|Ti|k|M|G|T)?$/.exec(q ?? '')
  if (m === null) throw new Error(`not a quantity: ${q}`)
  const unit = { m: 1e-3, Ki: 2 ** 10, Mi: 2 ** 20, Gi: 2 ** 30, Ti: 2 ** 40, k: 1e3, M: 1e6, G: 1e9, T: 1e12 }[m[2] ?? ''] ?? 1
  return Number(m[1]) * unit
}

t.test('the manifests parse and are the objects of a replicated router', async (t) => {
  for (const file of kustomization.resources) t.ok(existsSync(join(dir, file)), `kustomization resource ${file} exists`)
  t.same(parseErrors, [], 'every document is valid YAML')
  t.same(docs.map((d) => d.kind).sort(), ['Deployment', 'PodDisruptionBudget', 'Service'])
  for (const d of docs) {
    t.ok(d.apiVersion && d.metadata?.name, `${d.kind} has an apiVersion and a name`)
    t.notOk(d.metadata.name.includes('_'), `${d.kind} ${d.metadata.name} is a DNS-1123 name`)
  }
  t.equal(one('PodDisruptionBudget').apiVersion, 'policy/v1')
  t.equal(deployment.apiVersion, 'apps/v1')
  t.ok(deployment.spec.replicas >= 2, `${deployment.spec.replicas} replicas`)
  t.ok(selects(deployment.spec.selector.matchLabels), "the Deployment's selector matches its pods")
  t.equal(deployment.spec.strategy?.rollingUpdate?.maxUnavailable, 0, 'a rollout never drops below the replica count')
})

t.test("the router's command line and environment are a valid `kv-router serve` with replica sync", async (t) => {
  t.ok(router, 'a container named router')
  t.same(router.args, ['serve'], "the image's entrypoint, the kv-router executable, runs serve")
  t.notOk(router.command, 'the entrypoint is the one the Dockerfile sets (its shebang carries the V8 flags)')
  const image = router.image.split(':')
  const version = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { version: string }).version
  t.same(image, ['kv-router', version], "the image is kv-router at the package's version")
  t.same(
    kustomization.images?.map((i) => [i.name, i.newTag]),
    [['kv-router', version]],
    'kustomize sets that image, where a registry can be put',
  )
  const readable = new Set(FLAGS.flatMap((f) => f.env))
  for (const e of router.env ?? []) {
    t.ok(readable.has(e.name), `${e.name} is a variable the router reads`)
    t.equal(typeof e.value, 'string', `${e.name} has a literal value`)
  }
  let c: ServeConfig | undefined
  t.doesNotThrow(() => {
    c = cfg()
  }, 'every value is accepted')
  if (c === undefined) return
  t.equal(c.replicaSync, true, 'replicas share their bookings (DYN_ROUTER_REPLICA_SYNC)')
  t.equal(c.mode, 'kv')
  t.ok(c.natsUrl, 'KV events from NATS (NATS_SERVER)')
  t.ok(c.etcdUrl, 'workers from etcd (ETCD_ENDPOINTS)')
  t.equal(c.httpHost, '0.0.0.0', 'it listens on the pod IP')
})

t.test('ports and probes: /health for liveness and start-up, /ready for readiness, on the port it listens on', async (t) => {
  const c = cfg()
  const http = router.ports?.find((p) => p.name === 'http')
  t.equal(http?.containerPort, c.httpPort, 'the container port named http is the one the router listens on')
  const portOf = (p: string | number | undefined): number | undefined => (typeof p === 'number' ? p : router.ports?.find((x) => x.name === p)?.containerPort)
  const probes = { startupProbe: '/health', livenessProbe: '/health', readinessProbe: '/ready' } as const
  for (const [probe, path] of Object.entries(probes)) {
    const p = router[probe as keyof typeof probes]
    t.equal(p?.httpGet?.path, path, `${probe} asks ${path}`)
    t.equal(portOf(p?.httpGet?.port), c.httpPort, `${probe} on port ${c.httpPort}`)
  }
  // out of the Service within a few seconds of draining or recovering a shard
  const ready = router.readinessProbe
  t.ok((ready?.periodSeconds ?? 10) * (ready?.failureThreshold ?? 3) <= 10, 'an unready replica leaves the Service within 10 s')
  const annotations = deployment.spec.template.metadata.annotations as Record<string, string> | undefined
  if (annotations?.['prometheus.io/port'] !== undefined) {
    t.equal(Number(annotations['prometheus.io/port']), c.httpPort, 'Prometheus scrapes the router port')
    t.equal(annotations['prometheus.io/path'], '/metrics')
  }
})

t.test('the grace period covers preStop and the drain deadline', async (t) => {
  const c = cfg()
  const pre = router.lifecycle?.preStop
  const sleep = pre?.sleep?.seconds ?? (pre?.exec?.command[0] === 'sleep' ? Number(pre.exec.command[1]) : 0)
  t.ok(sleep > 0, `preStop waits ${sleep} s for the endpoints to go before SIGTERM`)
  const grace = deployment.spec.template.spec.terminationGracePeriodSeconds as number
  t.ok(
    grace >= sleep + c.shutdownTimeoutSecs + 5,
    `terminationGracePeriodSeconds ${grace} leaves 5 s after preStop (${sleep} s) and the drain deadline (${c.shutdownTimeoutSecs} s)`,
  )
})

t.test('the Service and the PodDisruptionBudget select the router pods', async (t) => {
  const c = cfg()
  const svc = one('Service')
  t.ok(selects(svc.spec.selector), "the Service's selector matches the Deployment's pods")
  const port = (svc.spec.ports as { port: number; targetPort: string | number }[])[0]
  const target = typeof port?.targetPort === 'number' ? port.targetPort : router.ports?.find((p) => p.name === port?.targetPort)?.containerPort
  t.equal(target, c.httpPort, 'its target port is the router port')
  const pdb = one('PodDisruptionBudget')
  t.ok(selects(pdb.spec.selector?.matchLabels), "the PodDisruptionBudget's selector matches the Deployment's pods")
  const min = pdb.spec.minAvailable as number
  t.ok(min >= 1, 'a voluntary disruption leaves a replica routing')
  t.ok(min < deployment.spec.replicas, 'and a node drain can still evict one')
})

t.test('resources: a CPU limit that sizes the shards, memory for the bounded index', async (t) => {
  const c = cfg()
  const { requests, limits } = router.resources ?? {}
  for (const r of ['cpu', 'memory']) {
    t.ok(requests?.[r], `requests ${r}`)
    t.ok(limits?.[r], `limits ${r}`)
    t.ok(quantity(requests?.[r]) <= quantity(limits?.[r]), `the ${r} request is within the limit`)
  }
  // the shard count the router derives from the CPU quota (docs/operations.md#threads)
  const shards = c.eventThreads > 0 ? c.eventThreads : Math.max(1, Math.ceil(quantity(limits?.cpu)) - 1)
  // about 60 bytes per (block, worker-rank) entry (docs/operations.md#memory), plus 1 GiB for
  // the heap, the event backlog and requests in flight
  const need = shards * c.maxIndexBlocks * 60 + 2 ** 30
  t.ok(need <= quantity(limits?.memory), `${shards} shard(s) of ${c.maxIndexBlocks} blocks fit in ${limits?.memory} (${(need / 2 ** 30).toFixed(2)} GiB)`)
})

t.test('docs/deployment.md shows how to apply deploy/k8s', async (t) => {
  const doc = readFileSync(join(root, 'docs', 'deployment.md'), 'utf8')
  t.match(doc, /kubectl apply -k deploy\/k8s/, 'kubectl apply -k deploy/k8s')
})
