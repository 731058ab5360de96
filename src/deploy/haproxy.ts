// The deployment's HAProxy configuration (deploy/haproxy/haproxy.cfg, written for compose)
// rendered for replicas on one host: what `npm run cluster` runs and what the tests put in front
// of their routers, from the one source of HAProxy's settings.

/** A backend server: its name (the `x-router-replica` header HAProxy adds) and its port on 127.0.0.1. */
export interface HaproxyBackend {
  name: string
  port: number
}

/**
 * The deployment's HAProxy configuration for loopback, everything else as it is: each `bind` on
 * 127.0.0.1 and the port `ports` maps its own to, the `server` lines replaced by one per backend
 * (with the first one's options), and Docker's DNS (the `resolvers` section and its uses) dropped.
 */
export function renderHaproxyConfig(text: string, ports: ReadonlyMap<number, number>, backends: readonly HaproxyBackend[]): string {
  const out: string[] = []
  let section = ''
  let servers = false
  for (const line of text.split('\n')) {
    if (/^\S/.test(line)) section = line.split(/\s+/)[0] as string
    if (section === 'resolvers') continue
    const bind = /^(\s*)bind\s+\S*:(\d+)(.*)$/.exec(line)
    if (bind !== null) {
      const port = ports.get(Number(bind[2]))
      if (port === undefined) throw new Error(`no port given for the bind on ${bind[2]}`)
      out.push(`${bind[1]}bind 127.0.0.1:${port}${bind[3]}`)
      continue
    }
    const plain = line.replace(/\s+resolvers\s+\S+/, '')
    const server = /^(\s*)server\s+\S+\s+\S+(.*)$/.exec(plain)
    if (server !== null) {
      if (!servers) for (const b of backends) out.push(`${server[1]}server ${b.name} 127.0.0.1:${b.port}${server[2]}`)
      servers = true
      continue
    }
    out.push(plain)
  }
  if (!servers) throw new Error('the HAProxy configuration has no server line')
  return out.join('\n')
}

/** The ports the configuration's `bind` lines name, in order: the first is the clients' frontend. */
export function haproxyBindPorts(text: string): number[] {
  return [...text.matchAll(/^\s*bind\s+\S*:(\d+)/gm)].map((m) => Number(m[1]))
}
