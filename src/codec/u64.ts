// u64 values (worker ids, block hashes, event ids) travel as two u32 halves on hot paths so that
// no bigint is allocated per block; bigint appears only at the API edges.

const TWO32 = 4294967296

export function u64FromParts(lo: number, hi: number): bigint {
  return (BigInt(hi >>> 0) << 32n) | BigInt(lo >>> 0)
}

export function u64Lo(v: bigint): number {
  return Number(v & 0xffffffffn)
}

export function u64Hi(v: bigint): number {
  return Number((v >> 32n) & 0xffffffffn)
}

export const U64_MAX = 0xffffffffffffffffn

export function isU64(v: bigint): boolean {
  return v >= 0n && v <= U64_MAX
}

/** Exact decimal text of a u64 given as halves, without a bigint. */
export function u64ToString(lo: number, hi: number): string {
  if (hi < 0x200000) return String(hi * TWO32 + lo)
  // long division by 1e8 over 16-bit limbs (hi's upper limb is below 1e8): every step stays below 2^53
  const D = 1e8
  const q2 = Math.floor(hi / D)
  let r = hi - q2 * D
  let t = r * 65536 + (lo >>> 16)
  const q1 = Math.floor(t / D)
  r = t - q1 * D
  t = r * 65536 + (lo & 0xffff)
  const q0 = Math.floor(t / D)
  r = t - q0 * D
  const q = q2 * TWO32 + q1 * 65536 + q0
  const rs = String(r)
  return String(q) + '00000000'.slice(rs.length) + rs
}
