// --nice: the scheduling priority of the router's threads. Where the router shares cores with
// engines, tokenizers or a load generator, each wake-up of its event loop can wait for a core
// behind them, and every request pays that wait on the way in and on the way out; those
// processes wait instead (docs/operations.md, "Scheduling priority"). A negative niceness lets
// the kernel run the router first, as nginx's worker_priority does for its workers.
//
// Linux keeps a niceness per thread: setpriority() on an id changes that one thread, and a new
// thread starts with its creator's. So every thread that exists now is set by its id (V8's GC
// helpers, which a scavenge waits for, and libuv's pool), and the shard and tokenizer threads,
// started later from the main thread, inherit the main thread's. Elsewhere one call covers the
// process.
import { readdirSync } from 'node:fs'
import { setPriority } from 'node:os'
import { KvrError } from '../errors.js'

/** The code of a failed libuv call (os.setPriority throws a SystemError carrying it in .info). */
function errnoOf(err: unknown): string {
  const e = err as { code?: unknown; info?: { code?: unknown } } | null
  const c = e?.info?.code ?? e?.code
  return typeof c === 'string' ? c : 'unknown error'
}

function threadIds(): number[] {
  try {
    return readdirSync('/proc/self/task')
      .map(Number)
      .filter((n) => Number.isInteger(n) && n > 0)
  } catch {
    return []
  }
}

/**
 * Sets the niceness of every thread of this process (and, through inheritance, of the threads it
 * starts later). Throws KVR_ERR_PRIORITY_DENIED when the system refuses: a niceness below the
 * current one needs root, CAP_SYS_NICE or an RLIMIT_NICE of at least 20 - nice (what a container
 * of an unprivileged user can be given).
 */
function refused(nice: number, what: string, err: unknown): KvrError {
  const code = errnoOf(err)
  // EACCES is the one refusal a privilege lifts (EPERM would be a thread of another user)
  const why = code === 'EACCES' ? `; a niceness below the current one needs root, CAP_SYS_NICE or an RLIMIT_NICE (ulimit -e) of at least ${20 - nice}` : ''
  return new KvrError('KVR_ERR_PRIORITY_DENIED', `--nice ${nice}: the system refused ${what} (${code})${why}`)
}

export function applyNice(nice: number): void {
  const tids = threadIds()
  try {
    // the calling thread first: a refusal then comes before any other thread was changed
    setPriority(0, nice)
  } catch (err) {
    throw refused(nice, 'the priority', err)
  }
  for (const tid of tids) {
    if (tid === process.pid) continue
    try {
      setPriority(tid, nice)
    } catch (err) {
      // a thread that ended since the listing is no loss
      if (errnoOf(err) !== 'ESRCH') throw refused(nice, `the priority of thread ${tid}`, err)
    }
  }
}
