// `--event-plane` / DYN_EVENT_PLANE: zmq by default, nats on request, nothing else; said to do
// nothing without --etcd-url, where no publisher can be discovered.
import t from 'tap'
import { ConfigError, parseServe, parseServeConfig, serveWithoutEffect } from '../../src/config.js'
import type { ServeConfig } from '../../src/config.js'

const parse = (argv: string[], env: NodeJS.ProcessEnv = {}): ServeConfig => {
  const c = parseServeConfig(argv, env)
  if (c === 'help') throw new Error('unexpected help')
  return c
}

t.test('values, environment, refusal', async (t) => {
  t.equal(parse([]).eventPlane, 'zmq', "Dynamo's default since 1.3")
  t.equal(parse(['--event-plane', 'nats']).eventPlane, 'nats')
  t.equal(parse([], { DYN_EVENT_PLANE: 'nats' }).eventPlane, 'nats', 'as Dynamo names the variable')
  t.equal(parse(['--event-plane', 'zmq'], { DYN_EVENT_PLANE: 'nats' }).eventPlane, 'zmq', 'the command line wins')
  t.throws(() => parse(['--event-plane', 'kafka']), ConfigError)
})

t.test('no effect without --etcd-url', async (t) => {
  const lone = parseServe(['--event-plane', 'nats'], {})
  const withEtcd = parseServe(['--event-plane', 'nats', '--etcd-url', 'http://127.0.0.1:2379'], {})
  if (lone === 'help' || withEtcd === 'help') throw new Error('unexpected help')
  t.match(serveWithoutEffect(lone), ['--event-plane has no effect without --etcd-url'])
  t.same(serveWithoutEffect(withEtcd), [])
})
