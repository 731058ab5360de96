// A deliberately naive model of the index: object nodes, Maps and Sets, written straight from
// Dynamo's indexer semantics plus the choices documented at the top of src/index/kv-index.ts. Property tests
// drive it and the typed-array index with the same events and compare every answer.
import type { RouterEvent } from '../../src/codec/events.js'

interface MNode {
  tok: bigint
  parent: MNode | null
  children: Map<bigint, MNode>
  /** worker key → the block hashes by which that worker names this node */
  workers: Map<string, Set<bigint>>
}

export type ModelStatus = 'ok' | 'parent_block_not_found' | 'block_not_found' | 'invalid_block' | 'capacity'

export class ModelIndex {
  private root: MNode = { tok: 0n, parent: null, children: new Map(), workers: new Map() }
  private lookup = new Map<string, Map<bigint, MNode>>()
  constructor(private readonly maxBlocks = Number.MAX_SAFE_INTEGER) {}

  private total(): number {
    let n = 0
    for (const m of this.lookup.values()) n += m.size
    return n
  }

  private attached(n: MNode): boolean {
    return n.parent !== null && n.parent.children.get(n.tok) === n
  }

  private isAncestorOrSelf(node: MNode, of: MNode): boolean {
    let x: MNode = of
    while (x !== this.root) {
      if (x === node) return true
      if (!this.attached(x)) return false
      x = x.parent as MNode
    }
    return false
  }

  private removeHash(w: string, bh: bigint): void {
    const map = this.lookup.get(w) as Map<bigint, MNode>
    const node = map.get(bh) as MNode
    map.delete(bh)
    const set = node.workers.get(w) as Set<bigint>
    set.delete(bh)
    if (set.size === 0) node.workers.delete(w)
    if (node.workers.size === 0) {
      if (this.attached(node)) (node.parent as MNode).children.delete(node.tok)
      node.children.clear()
    }
  }

  apply(ev: RouterEvent): ModelStatus {
    const w = `${ev.worker_id}:${ev.event.dp_rank}`
    if (!this.lookup.has(w)) this.lookup.set(w, new Map())
    const map = this.lookup.get(w) as Map<bigint, MNode>
    const data = ev.event.data
    if (data === 'cleared') {
      this.clear(ev.worker_id, false)
      return 'ok'
    }
    if ('removed' in data) {
      let status: ModelStatus = 'ok'
      for (const h of data.removed.block_hashes) {
        if (!map.has(h)) {
          if (status === 'ok') status = 'block_not_found'
          continue
        }
        this.removeHash(w, h)
      }
      return status
    }
    let cur: MNode = this.root
    if (data.stored.parent_hash !== null) {
      const p = map.get(data.stored.parent_hash)
      if (p === undefined) return 'parent_block_not_found'
      cur = p
    }
    for (const b of data.stored.blocks) {
      const known = map.get(b.block_hash)
      if (known !== undefined && this.isAncestorOrSelf(known, cur)) return 'invalid_block'
      let child = cur.children.get(b.tokens_hash)
      if (child === undefined) {
        if (known !== undefined && !this.attached(known)) {
          child = known
          child.parent = cur
          child.tok = b.tokens_hash
        } else {
          child = { tok: b.tokens_hash, parent: cur, children: new Map(), workers: new Map() }
        }
        cur.children.set(b.tokens_hash, child)
      }
      if (known !== undefined) {
        if (known === child) {
          cur = child
          continue
        }
        this.removeHash(w, b.block_hash)
      } else if (this.total() >= this.maxBlocks) {
        if (child.workers.size === 0) cur.children.delete(b.tokens_hash)
        return 'capacity'
      }
      let set = child.workers.get(w)
      if (set === undefined) child.workers.set(w, (set = new Set()))
      set.add(b.block_hash)
      map.set(b.block_hash, child)
      cur = child
    }
    return 'ok'
  }

  clear(workerId: bigint, forget: boolean): void {
    for (const [w, map] of [...this.lookup]) {
      if (!w.startsWith(`${workerId}:`)) continue
      for (const h of [...map.keys()]) this.removeHash(w, h)
      if (forget) this.lookup.delete(w)
    }
  }

  /**
   * Dynamo's find_matches with exact sets: a worker's depth is the number of leading query blocks whose
   * nodes all hold it (Dynamo's count shortcut assumes a child's workers are a subset of its
   * parent's; with exact sets the answer stays right when they are not, and it splits cleanly
   * over shards). Early exit as Dynamo has it. Returns "worker:rank" → depth.
   */
  findMatches(local: readonly bigint[], earlyExit = false): Map<string, number> {
    const scores = new Map<string, number>()
    if (local.length === 0) return scores
    let cur = this.root.children.get(local[0] as bigint)
    if (cur === undefined) return scores
    const active = new Set(cur.workers.keys())
    let depth = 1
    if (!(earlyExit && active.size === 1)) {
      for (let i = 1; i < local.length; i++) {
        const child: MNode | undefined = cur.children.get(local[i] as bigint)
        if (child === undefined) break
        for (const w of [...active]) {
          if (!child.workers.has(w)) {
            scores.set(w, i)
            active.delete(w)
          }
        }
        if (active.size === 0) break
        cur = child
        depth = i + 1
        if (earlyExit && active.size === 1) break
      }
    }
    for (const w of active) scores.set(w, depth)
    return scores
  }

  treeSizes(): Map<string, number> {
    const out = new Map<string, number>()
    for (const [w, m] of this.lookup) out.set(w, m.size)
    return out
  }

  /** Distinct live nodes (those some worker names), plus the root. */
  nodeCount(): number {
    const nodes = new Set<MNode>()
    for (const m of this.lookup.values()) for (const n of m.values()) nodes.add(n)
    return nodes.size + 1
  }
}
