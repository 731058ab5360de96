// The worker list the end-to-end benchmarks read from a router's GET /v1/workers: exact u64 ids,
// registered workers only.
import t from 'tap'
import { createServer } from 'node:http'
import type { AddressInfo } from 'node:net'
import { workerIds } from '../lib/processes.js'

t.test('workerIds: the id_str of each registered worker, not an unregistered rank’s; cached blocks summed', async (t) => {
  const body =
    '{"workers":[{"id":18446744073709551557,"id_str":"18446744073709551557","url":"http://127.0.0.1:1","ranks":[{"dp_rank":0,"index":"exact",' +
    '"cached_blocks":7,"last_event_id":3,"active_blocks":0,"prefill_tokens":0,"in_flight":0}]},' +
    '{"id":1001,"id_str":"1001","url":"http://127.0.0.1:2","ranks":[{"dp_rank":0,"index":"exact","cached_blocks":5,"last_event_id":null,' +
    '"active_blocks":0,"prefill_tokens":0,"in_flight":0}]}],' +
    '"unregistered":[{"worker_id":99,"worker_id_str":"99","dp_rank":0,"cached_blocks":2,"last_event_id":40}]}'
  const server = createServer((_req, res) => res.end(body))
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r))
  t.teardown(() => new Promise<void>((r) => server.close(() => r())))
  const { ids, cachedBlocks } = await workerIds(`http://127.0.0.1:${(server.address() as AddressInfo).port}`)
  t.same(ids, ['18446744073709551557', '1001'])
  t.equal(cachedBlocks, 14)
})
