// Seedable pseudo-random numbers for selection (tie-breaks, softmax draws, random and
// power-of-two modes). Math.random cannot be seeded, and tests must replay the exact same
// decisions, so the scheduler owns its generator: xoshiro128** seeded through splitmix32.
import { fmix32 } from '../codec/hash-mix.js'

export interface Rng {
  /** Uniform in [0, 1). */
  next(): number
  /** Uniform integer in [0, n); n must be a positive integer below 2^32. */
  int(n: number): number
}

export class Xoshiro128 implements Rng {
  private a: number
  private b: number
  private c: number
  private d: number

  constructor(seed: number = (Math.random() * 0x100000000) >>> 0) {
    // splitmix32 spreads a small seed (0, 1, 2 …) over the 128-bit state so that nearby seeds
    // give unrelated streams and the state is never all zeros.
    let s = seed >>> 0
    const step = (): number => {
      s = (s + 0x9e3779b9) >>> 0
      return fmix32(s)
    }
    this.a = step()
    this.b = step()
    this.c = step()
    this.d = step()
  }

  private u32(): number {
    const result = Math.imul(rotl(Math.imul(this.b, 5), 7), 9) >>> 0
    const t = this.b << 9
    this.c ^= this.a
    this.d ^= this.b
    this.b ^= this.c
    this.a ^= this.d
    this.c ^= t
    this.d = rotl(this.d, 11)
    return result
  }

  next(): number {
    return this.u32() / 0x100000000
  }

  int(n: number): number {
    return Math.floor(this.next() * n)
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k))
}
