// Serving the query board. The main thread writes a query's blocks into a slot and the slot's
// number into the query ring; this shard answers from its own index into its column of the
// slot's results and clears its pending bit, and the last shard to answer wakes the main thread
// if it waits.
import {
  B_ANSWERS,
  B_MAIN_WAITING,
  HEARTBEAT,
  Q_FLAGS,
  Q_N,
  Q_PENDING,
  QF_EARLY_EXIT,
  QRING_BASE,
  QRING_READ,
  QRING_SIZE,
  QRING_WRITE,
  RESULT_WORDS,
} from '../../src/thread/protocol.js'
import { board, counters, ctrl, index, init, layout, me } from './state.js'

const loViews: Uint32Array[] = []
const hiViews: Uint32Array[] = []
for (let s = 0; s < init.geometry.slots; s++) {
  loViews.push(new Uint32Array(init.board, layout.lo(s) * 4, init.geometry.maxBlocks))
  hiViews.push(new Uint32Array(init.board, layout.hi(s) * 4, init.geometry.maxBlocks))
}

/** QRING_READ as this thread last stored it: only this thread moves it while it runs. */
let qRead = Atomics.load(ctrl, QRING_READ) >>> 0

export function queriesWaiting(): boolean {
  return Atomics.load(ctrl, QRING_WRITE) >>> 0 !== qRead
}

function answer(slot: number): void {
  const base = layout.slot(slot)
  const n = board[base + Q_N] as number
  const early = ((board[base + Q_FLAGS] as number) & QF_EARLY_EXIT) !== 0
  const m = index.findMatches(loViews[slot] as Uint32Array, hiViews[slot] as Uint32Array, n, early)
  let o = layout.results(slot, me)
  board[o++] = m
  const ws = index.matchWorkers
  for (let i = 0; i < m; i++, o += RESULT_WORDS) {
    const w = ws[i] as number
    board[o] = index.workerIdLo(w)
    board[o + 1] = index.workerIdHi(w)
    board[o + 2] = index.workerRank(w)
    board[o + 3] = index.depth(w)
    board[o + 4] = index.treeSize(w)
    board[o + 5] = index.hostDepth(w)
    board[o + 6] = index.diskDepth(w)
  }
  counters.queries++
  const bit = 1 << me
  const before = Atomics.and(board, base + Q_PENDING, ~bit)
  if ((before & bit) !== 0 && (before & ~bit) === 0) {
    Atomics.add(board, B_ANSWERS, 1)
    if (Atomics.load(board, B_MAIN_WAITING) !== 0) Atomics.notify(board, B_ANSWERS)
  }
}

/** Answers waiting queries in order; stops at one whose read-your-writes barrier is not met. */
export function serveQueries(): number {
  let qr = qRead
  const qw = Atomics.load(ctrl, QRING_WRITE) >>> 0
  const start = qr
  while (qr !== qw) {
    const slot = ctrl[QRING_BASE + (qr & (QRING_SIZE - 1))] as number
    const barrier = board[layout.barrier(slot, me)] as number
    if (barrier !== -1 && ((counters.processed - barrier) | 0) < 0) break
    answer(slot)
    qr = (qr + 1) >>> 0
  }
  if (qr !== start) {
    qRead = qr
    Atomics.store(ctrl, QRING_READ, qr | 0)
  }
  return (qr - start) >>> 0
}

/** Called from inside long work (a big event, a recovery): lookups are not held up by it. */
export function interrupt(): void {
  // long work still beats: the watchdog must not take a busy shard for a stalled one
  Atomics.add(ctrl, HEARTBEAT, 1)
  if (queriesWaiting()) serveQueries()
}
