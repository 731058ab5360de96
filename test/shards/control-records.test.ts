import t from 'tap'
import { DecodedEvent } from '../../src/codec/event-decoder.js'
import { toRouterEvent } from '../../src/codec/events.js'
import * as records from '../../src/shards/control-records.js'
import { ENGINE_BATCH, PARK, PREDICTED, RECOVERY, REMOVE_WORKER, RecoveryKind, readPredicted, readU32, recordOp } from '../../src/thread/records.js'

const W = 0x1234_0000_0005n

t.test('a PREDICTED record reads back as the stored or removed event it stands for', async (t) => {
  const seqLo = Uint32Array.of(1, 0xffffffff, 7)
  const seqHi = Uint32Array.of(0, 2, 0x80000000)
  const localLo = Uint32Array.of(10, 11, 12)
  const localHi = Uint32Array.of(0, 0, 1)
  const stored = records.predictedStoredRecord(W, 3, 41n, localLo, localHi, seqLo, seqHi, 3)
  t.equal(recordOp(stored), PREDICTED.op)
  t.equal(stored.length, PREDICTED.length + 16 * 3)
  t.same(toRouterEvent(readPredicted(stored, new DecodedEvent())), {
    worker_id: W,
    event: {
      event_id: 41n,
      dp_rank: 3,
      data: {
        stored: {
          parent_hash: null,
          blocks: [
            { block_hash: 1n, tokens_hash: 10n },
            { block_hash: (2n << 32n) | 0xffffffffn, tokens_hash: 11n },
            { block_hash: (0x80000000n << 32n) | 7n, tokens_hash: (1n << 32n) | 12n },
          ],
        },
      },
    },
  })
  // only the first n of the tracker's (longer, reused) arrays
  const removed = records.predictedRemovedRecord(W, 0, (1n << 40n) + 2n, seqLo, seqHi, 2)
  t.equal(removed.length, PREDICTED.length + 8 * 2)
  t.same(toRouterEvent(readPredicted(removed, new DecodedEvent())), {
    worker_id: W,
    event: { event_id: (1n << 40n) + 2n, dp_rank: 0, data: { removed: { block_hashes: [1n, (2n << 32n) | 0xffffffffn] } } },
  })
  t.throws(() => readPredicted(stored.subarray(0, stored.length - 1), new DecodedEvent()), /short/, 'a short record is a bug')
})

t.test('the other records carry their fields where the table says', async (t) => {
  const rm = records.removeWorkerRecord(W)
  t.equal(recordOp(rm), REMOVE_WORKER.op)
  t.equal(readU32(rm, REMOVE_WORKER.at.workerLo), 5)
  t.equal(readU32(rm, REMOVE_WORKER.at.workerHi), 0x1234)
  const park = records.parkRecord(W, 2, 99)
  t.equal(recordOp(park), PARK.op)
  t.equal(readU32(park, PARK.at.rank), 2)
  t.equal(readU32(park, PARK.at.ticket), 99)
  const rec = records.recoveryRecord(W, 1, 7, RecoveryKind.TreeDump, Uint8Array.of(0x5b, 0x5d), (3n << 32n) | 4n)
  t.equal(rec[RECOVERY.at.flag], RecoveryKind.TreeDump)
  t.equal(rec[RECOVERY.at.hasLastId], 1)
  t.equal(readU32(rec, RECOVERY.at.lastIdLo), 4)
  t.equal(readU32(rec, RECOVERY.at.lastIdHi), 3)
  t.same([...rec.subarray(RECOVERY.length)], [0x5b, 0x5d], 'the events follow the fixed part')
  t.equal(records.recoveryRecord(W, 1, 7, RecoveryKind.Failed, null, null)[RECOVERY.at.hasLastId], 0)
  const batch = records.engineBatchRecord(W, 4, 16, Uint8Array.of(0x93, 1, 2, 3))
  t.equal(recordOp(batch), ENGINE_BATCH.op)
  t.equal(readU32(batch, ENGINE_BATCH.at.blockSize), 16)
  t.equal(readU32(batch, ENGINE_BATCH.at.rank), 4)
  t.same([...batch.subarray(ENGINE_BATCH.length)], [0x93, 1, 2, 3])
})
