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

/** Exact decimal text of a u64 given as halves, without bigint when it fits a double. */
export function u64ToString(lo: number, hi: number): string {
  if (hi < 0x200000) return String(hi * TWO32 + lo)
  return u64FromParts(lo, hi).toString()
}
