// Growing the typed arrays that hold the scheduler's per-slot, per-request and per-entry state.
// One helper for every module, so each array family grows the same way.

export type TypedArray = Uint8Array | Int32Array | Uint32Array | Float64Array

/** A copy of `a` with length max(n, a.length), contents preserved; `a` itself when long enough. */
export function growTo<T extends TypedArray>(a: T, n: number): T {
  if (n <= a.length) return a
  const Ctor = a.constructor as new (len: number) => T
  const b = new Ctor(n)
  b.set(a as never)
  return b
}

/** Like growTo, but at least doubles, for arrays grown one element at a time. */
export function grow<T extends TypedArray>(a: T, n: number): T {
  return n <= a.length ? a : growTo(a, Math.max(n, a.length * 2))
}
