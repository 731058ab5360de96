;; XXH3-64 (xxHash 0.8 family, seeded) in WebAssembly, written for kv-router's two hot shapes:
;; many equal-sized token blocks hashed in one call, and the chained 16-byte sequence hash.
;; The native binding costs ~0.4 µs per call in N-API and bigint traffic; here a whole prompt is
;; one call, and results land in memory as little-endian u64s that JS reads as u32 halves.
;;
;; Memory map (JS owns everything from 1024 up):
;;   [0, 192)    the default secret (data segment)
;;   [192, 384)  the seed-derived secret used by inputs longer than 240 bytes
;;   [384, 448)  the eight accumulators of the long path
(module
  (memory (export "memory") 1)
  (global $seed (mut i64) (i64.const 0))

  (data (i32.const 0)
    "\b8\fe\6c\39\23\a4\4b\be\7c\01\81\2c\f7\21\ad\1c"
    "\de\d4\6d\e9\83\90\97\db\72\40\a4\a4\b7\b3\67\1f"
    "\cb\79\e6\4e\cc\c0\e5\78\82\5a\d0\7d\cc\ff\72\21"
    "\b8\08\46\74\f7\43\24\8e\e0\35\90\e6\81\3a\26\4c"
    "\3c\28\52\bb\91\c3\00\cb\88\d0\65\8b\1b\53\2e\a3"
    "\71\64\48\97\a2\0d\f9\4e\38\19\ef\46\a9\de\ac\d8"
    "\a8\fa\76\3f\e3\9c\34\3f\f9\dc\bb\c7\c7\0b\4f\1d"
    "\8a\51\e0\4b\cd\b4\59\31\c8\9f\7e\c9\d9\78\73\64"
    "\ea\c5\ac\83\34\d3\eb\c3\c5\81\a0\ff\fa\13\63\eb"
    "\17\0d\dd\51\b7\f0\da\49\d3\16\55\26\29\d4\68\9e"
    "\2b\16\be\58\7d\47\a1\fc\8f\f8\b8\d1\7a\d0\31\ce"
    "\45\cb\3a\8f\95\16\04\28\af\d7\fb\ca\bb\4b\40\7e")

  ;; 64×64 → 128-bit product, folded (low ^ high), from four 32×32 products
  (func $fold (param $a i64) (param $b i64) (result i64)
    (local $al i64) (local $ah i64) (local $bl i64) (local $bh i64)
    (local $ll i64) (local $hl i64) (local $cross i64)
    (local.set $al (i64.and (local.get $a) (i64.const 0xffffffff)))
    (local.set $ah (i64.shr_u (local.get $a) (i64.const 32)))
    (local.set $bl (i64.and (local.get $b) (i64.const 0xffffffff)))
    (local.set $bh (i64.shr_u (local.get $b) (i64.const 32)))
    (local.set $ll (i64.mul (local.get $al) (local.get $bl)))
    (local.set $hl (i64.mul (local.get $ah) (local.get $bl)))
    (local.set $cross
      (i64.add
        (i64.add (i64.shr_u (local.get $ll) (i64.const 32)) (i64.and (local.get $hl) (i64.const 0xffffffff)))
        (i64.mul (local.get $al) (local.get $bh))))
    (i64.xor
      ;; low half
      (i64.or (i64.shl (local.get $cross) (i64.const 32)) (i64.and (local.get $ll) (i64.const 0xffffffff)))
      ;; high half
      (i64.add
        (i64.add (i64.shr_u (local.get $hl) (i64.const 32)) (i64.shr_u (local.get $cross) (i64.const 32)))
        (i64.mul (local.get $ah) (local.get $bh)))))

  (func $avalanche (param $h i64) (result i64)
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 37))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x165667919E3779F9)))
    (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 32))))

  (func $avalanche64 (param $h i64) (result i64)
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 33))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0xC2B2AE3D27D4EB4F)))
    (local.set $h (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 29))))
    (local.set $h (i64.mul (local.get $h) (i64.const 0x165667B19E3779F9)))
    (i64.xor (local.get $h) (i64.shr_u (local.get $h) (i64.const 32))))

  (func $swap64 (param $x i64) (result i64)
    (local.set $x
      (i64.or
        (i64.shr_u (i64.and (local.get $x) (i64.const 0xff00ff00ff00ff00)) (i64.const 8))
        (i64.shl (i64.and (local.get $x) (i64.const 0x00ff00ff00ff00ff)) (i64.const 8))))
    (local.set $x
      (i64.or
        (i64.shr_u (i64.and (local.get $x) (i64.const 0xffff0000ffff0000)) (i64.const 16))
        (i64.shl (i64.and (local.get $x) (i64.const 0x0000ffff0000ffff)) (i64.const 16))))
    (i64.rotl (local.get $x) (i64.const 32)))

  (func $swap32 (param $x i32) (result i32)
    (local.set $x
      (i32.or
        (i32.shr_u (i32.and (local.get $x) (i32.const 0xff00ff00)) (i32.const 8))
        (i32.shl (i32.and (local.get $x) (i32.const 0x00ff00ff)) (i32.const 8))))
    (i32.rotl (local.get $x) (i32.const 16)))

  ;; 16 input bytes against 16 secret bytes
  (func $mix16 (param $p i32) (param $s i32) (result i64)
    (call $fold
      (i64.xor (i64.load (local.get $p)) (i64.add (i64.load (local.get $s)) (global.get $seed)))
      (i64.xor (i64.load offset=8 (local.get $p)) (i64.sub (i64.load offset=8 (local.get $s)) (global.get $seed)))))

  ;; the 9..16-byte path on two words: lo = first 8 bytes, hi = last 8 bytes
  (func $h9to16 (param $lo i64) (param $hi i64) (param $len i64) (result i64)
    (local.set $lo (i64.xor (local.get $lo)
      (i64.add (i64.xor (i64.load offset=24 (i32.const 0)) (i64.load offset=32 (i32.const 0))) (global.get $seed))))
    (local.set $hi (i64.xor (local.get $hi)
      (i64.sub (i64.xor (i64.load offset=40 (i32.const 0)) (i64.load offset=48 (i32.const 0))) (global.get $seed))))
    (call $avalanche
      (i64.add
        (i64.add (i64.add (local.get $len) (call $swap64 (local.get $lo))) (local.get $hi))
        (call $fold (local.get $lo) (local.get $hi)))))

  (func $h0to16 (param $p i32) (param $len i32) (result i64)
    (local $s i64) (local $x i64)
    (if (i32.gt_u (local.get $len) (i32.const 8))
      (then (return (call $h9to16
        (i64.load (local.get $p))
        (i64.load (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 8)))
        (i64.extend_i32_u (local.get $len))))))
    (if (i32.ge_u (local.get $len) (i32.const 4))
      (then
        (local.set $s (i64.xor (global.get $seed)
          (i64.shl (i64.extend_i32_u (call $swap32 (i32.wrap_i64 (global.get $seed)))) (i64.const 32))))
        (local.set $x
          (i64.xor
            (i64.add
              (i64.extend_i32_u (i32.load (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 4))))
              (i64.shl (i64.extend_i32_u (i32.load (local.get $p))) (i64.const 32)))
            (i64.sub (i64.xor (i64.load offset=8 (i32.const 0)) (i64.load offset=16 (i32.const 0))) (local.get $s))))
        ;; rrmxmx
        (local.set $x (i64.xor (local.get $x)
          (i64.xor (i64.rotl (local.get $x) (i64.const 49)) (i64.rotl (local.get $x) (i64.const 24)))))
        (local.set $x (i64.mul (local.get $x) (i64.const 0x9FB21C651E98DF25)))
        (local.set $x (i64.xor (local.get $x)
          (i64.add (i64.shr_u (local.get $x) (i64.const 35)) (i64.extend_i32_u (local.get $len)))))
        (local.set $x (i64.mul (local.get $x) (i64.const 0x9FB21C651E98DF25)))
        (return (i64.xor (local.get $x) (i64.shr_u (local.get $x) (i64.const 28))))))
    (if (i32.gt_u (local.get $len) (i32.const 0))
      (then (return (call $avalanche64
        (i64.xor
          (i64.extend_i32_u
            (i32.or
              (i32.or
                (i32.shl (i32.load8_u (local.get $p)) (i32.const 16))
                (i32.shl (i32.load8_u (i32.add (local.get $p) (i32.shr_u (local.get $len) (i32.const 1)))) (i32.const 24)))
              (i32.or
                (i32.load8_u (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 1)))
                (i32.shl (local.get $len) (i32.const 8)))))
          (i64.add
            (i64.extend_i32_u (i32.xor (i32.load (i32.const 0)) (i32.load offset=4 (i32.const 0))))
            (global.get $seed)))))))
    (call $avalanche64 (i64.xor (global.get $seed)
      (i64.xor (i64.load offset=56 (i32.const 0)) (i64.load offset=64 (i32.const 0))))))

  (func $h17to128 (param $p i32) (param $len i32) (result i64)
    (local $acc i64) (local $end i32)
    (local.set $end (i32.add (local.get $p) (local.get $len)))
    (local.set $acc (i64.mul (i64.extend_i32_u (local.get $len)) (i64.const 0x9E3779B185EBCA87)))
    (if (i32.gt_u (local.get $len) (i32.const 32))
      (then
        (if (i32.gt_u (local.get $len) (i32.const 64))
          (then
            (if (i32.gt_u (local.get $len) (i32.const 96))
              (then
                (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.add (local.get $p) (i32.const 48)) (i32.const 96))))
                (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.sub (local.get $end) (i32.const 64)) (i32.const 112))))))
            (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.add (local.get $p) (i32.const 32)) (i32.const 64))))
            (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.sub (local.get $end) (i32.const 48)) (i32.const 80))))))
        (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.add (local.get $p) (i32.const 16)) (i32.const 32))))
        (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.sub (local.get $end) (i32.const 32)) (i32.const 48))))))
    (local.set $acc (i64.add (local.get $acc) (call $mix16 (local.get $p) (i32.const 0))))
    (local.set $acc (i64.add (local.get $acc) (call $mix16 (i32.sub (local.get $end) (i32.const 16)) (i32.const 16))))
    (call $avalanche (local.get $acc)))

  (func $h129to240 (param $p i32) (param $len i32) (result i64)
    (local $acc i64) (local $accEnd i64) (local $i i32) (local $rounds i32)
    (local.set $acc (i64.mul (i64.extend_i32_u (local.get $len)) (i64.const 0x9E3779B185EBCA87)))
    (local.set $i (i32.const 0))
    (loop $first
      (local.set $acc (i64.add (local.get $acc)
        (call $mix16 (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 4))) (i32.shl (local.get $i) (i32.const 4)))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $first (i32.lt_u (local.get $i) (i32.const 8))))
    ;; the last 16 bytes use the secret at 136 - 17
    (local.set $accEnd (call $mix16 (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 16)) (i32.const 119)))
    (local.set $acc (call $avalanche (local.get $acc)))
    (local.set $rounds (i32.shr_u (local.get $len) (i32.const 4)))
    (block $done
      (loop $rest
        (br_if $done (i32.ge_u (local.get $i) (local.get $rounds)))
        (local.set $accEnd (i64.add (local.get $accEnd)
          (call $mix16
            (i32.add (local.get $p) (i32.shl (local.get $i) (i32.const 4)))
            (i32.add (i32.shl (i32.sub (local.get $i) (i32.const 8)) (i32.const 4)) (i32.const 3)))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $rest)))
    (call $avalanche (i64.add (local.get $acc) (local.get $accEnd))))

  ;; n 64-byte stripes from p into the accumulators at 384, stripe i keyed by the secret at
  ;; s + 8i. Two 64-bit lanes per 128-bit vector: each lane adds its neighbour's raw input (the
  ;; swap) and the product of its keyed input's 32-bit halves (one widening multiply for both).
  ;; The four vectors are written out rather than looped or called: V8 neither unrolls the loop
  ;; nor inlines the call.
  (func $accumulate (param $p i32) (param $n i32) (param $s i32)
    (local $end i32) (local $d v128) (local $k v128)
    (local $a0 v128) (local $a1 v128) (local $a2 v128) (local $a3 v128)
    (local.set $a0 (v128.load offset=384 (i32.const 0)))
    (local.set $a1 (v128.load offset=400 (i32.const 0)))
    (local.set $a2 (v128.load offset=416 (i32.const 0)))
    (local.set $a3 (v128.load offset=432 (i32.const 0)))
    (local.set $end (i32.add (local.get $p) (i32.shl (local.get $n) (i32.const 6))))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $p) (local.get $end)))
        (local.set $d (v128.load offset=0 (local.get $p)))
        (local.set $k (v128.xor (local.get $d) (v128.load offset=0 (local.get $s))))
        (local.set $a0 (i64x2.add (local.get $a0) (i64x2.add
          (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d))
          (i64x2.extmul_low_i32x4_u
            (i8x16.shuffle 0 1 2 3 8 9 10 11 0 1 2 3 8 9 10 11 (local.get $k) (local.get $k))
            (i8x16.shuffle 4 5 6 7 12 13 14 15 4 5 6 7 12 13 14 15 (local.get $k) (local.get $k))))))
        (local.set $d (v128.load offset=16 (local.get $p)))
        (local.set $k (v128.xor (local.get $d) (v128.load offset=16 (local.get $s))))
        (local.set $a1 (i64x2.add (local.get $a1) (i64x2.add
          (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d))
          (i64x2.extmul_low_i32x4_u
            (i8x16.shuffle 0 1 2 3 8 9 10 11 0 1 2 3 8 9 10 11 (local.get $k) (local.get $k))
            (i8x16.shuffle 4 5 6 7 12 13 14 15 4 5 6 7 12 13 14 15 (local.get $k) (local.get $k))))))
        (local.set $d (v128.load offset=32 (local.get $p)))
        (local.set $k (v128.xor (local.get $d) (v128.load offset=32 (local.get $s))))
        (local.set $a2 (i64x2.add (local.get $a2) (i64x2.add
          (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d))
          (i64x2.extmul_low_i32x4_u
            (i8x16.shuffle 0 1 2 3 8 9 10 11 0 1 2 3 8 9 10 11 (local.get $k) (local.get $k))
            (i8x16.shuffle 4 5 6 7 12 13 14 15 4 5 6 7 12 13 14 15 (local.get $k) (local.get $k))))))
        (local.set $d (v128.load offset=48 (local.get $p)))
        (local.set $k (v128.xor (local.get $d) (v128.load offset=48 (local.get $s))))
        (local.set $a3 (i64x2.add (local.get $a3) (i64x2.add
          (i8x16.shuffle 8 9 10 11 12 13 14 15 0 1 2 3 4 5 6 7 (local.get $d) (local.get $d))
          (i64x2.extmul_low_i32x4_u
            (i8x16.shuffle 0 1 2 3 8 9 10 11 0 1 2 3 8 9 10 11 (local.get $k) (local.get $k))
            (i8x16.shuffle 4 5 6 7 12 13 14 15 4 5 6 7 12 13 14 15 (local.get $k) (local.get $k))))))
        (local.set $p (i32.add (local.get $p) (i32.const 64)))
        (local.set $s (i32.add (local.get $s) (i32.const 8)))
        (br $l)))
    (v128.store offset=384 (i32.const 0) (local.get $a0))
    (v128.store offset=400 (i32.const 0) (local.get $a1))
    (v128.store offset=416 (i32.const 0) (local.get $a2))
    (v128.store offset=432 (i32.const 0) (local.get $a3)))

  (func $scramble
    (local $lane i32) (local $a i32) (local $x i64)
    (loop $l
      (local.set $a (i32.add (i32.const 384) (i32.shl (local.get $lane) (i32.const 3))))
      (local.set $x (i64.load (local.get $a)))
      (local.set $x (i64.xor (i64.xor (local.get $x) (i64.shr_u (local.get $x) (i64.const 47)))
        (i64.load (i32.add (i32.const 320) (i32.shl (local.get $lane) (i32.const 3))))))
      (i64.store (local.get $a) (i64.mul (local.get $x) (i64.const 0x9E3779B1)))
      (local.set $lane (i32.add (local.get $lane) (i32.const 1)))
      (br_if $l (i32.lt_u (local.get $lane) (i32.const 8)))))

  (func $long (param $p i32) (param $len i32) (result i64)
    (local $blocks i32) (local $b i32) (local $r i64) (local $i i32)
    (i64.store offset=384 (i32.const 0) (i64.const 0xC2B2AE3D))
    (i64.store offset=392 (i32.const 0) (i64.const 0x9E3779B185EBCA87))
    (i64.store offset=400 (i32.const 0) (i64.const 0xC2B2AE3D27D4EB4F))
    (i64.store offset=408 (i32.const 0) (i64.const 0x165667B19E3779F9))
    (i64.store offset=416 (i32.const 0) (i64.const 0x85EBCA77C2B2AE63))
    (i64.store offset=424 (i32.const 0) (i64.const 0x85EBCA77))
    (i64.store offset=432 (i32.const 0) (i64.const 0x27D4EB2F165667C5))
    (i64.store offset=440 (i32.const 0) (i64.const 0x9E3779B1))
    ;; 16 stripes of 64 bytes per 1 KiB block, each block followed by a scramble
    (local.set $blocks (i32.shr_u (i32.sub (local.get $len) (i32.const 1)) (i32.const 10)))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $b) (local.get $blocks)))
        (call $accumulate (i32.add (local.get $p) (i32.shl (local.get $b) (i32.const 10))) (i32.const 16) (i32.const 192))
        (call $scramble)
        (local.set $b (i32.add (local.get $b) (i32.const 1)))
        (br $l)))
    (call $accumulate
      (i32.add (local.get $p) (i32.shl (local.get $blocks) (i32.const 10)))
      (i32.shr_u (i32.sub (i32.sub (local.get $len) (i32.const 1)) (i32.shl (local.get $blocks) (i32.const 10))) (i32.const 6))
      (i32.const 192))
    ;; the last stripe overlaps the previous one; its secret starts 7 bytes before the scramble key
    (call $accumulate (i32.sub (i32.add (local.get $p) (local.get $len)) (i32.const 64)) (i32.const 1) (i32.const 313))
    (local.set $r (i64.mul (i64.extend_i32_u (local.get $len)) (i64.const 0x9E3779B185EBCA87)))
    (loop $m
      (local.set $r (i64.add (local.get $r)
        (call $fold
          (i64.xor (i64.load (i32.add (i32.const 384) (i32.shl (local.get $i) (i32.const 4))))
                   (i64.load (i32.add (i32.const 203) (i32.shl (local.get $i) (i32.const 4)))))
          (i64.xor (i64.load (i32.add (i32.const 392) (i32.shl (local.get $i) (i32.const 4))))
                   (i64.load (i32.add (i32.const 211) (i32.shl (local.get $i) (i32.const 4))))))))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $m (i32.lt_u (local.get $i) (i32.const 4))))
    (call $avalanche (local.get $r)))

  (func $hash (param $p i32) (param $len i32) (result i64)
    (if (i32.le_u (local.get $len) (i32.const 16)) (then (return (call $h0to16 (local.get $p) (local.get $len)))))
    (if (i32.le_u (local.get $len) (i32.const 128)) (then (return (call $h17to128 (local.get $p) (local.get $len)))))
    (if (i32.le_u (local.get $len) (i32.const 240)) (then (return (call $h129to240 (local.get $p) (local.get $len)))))
    (call $long (local.get $p) (local.get $len)))

  ;; Sets the seed. Long inputs use a secret derived from it; with seed 0 that is the default
  ;; secret itself, which is what the reference does too.
  (func (export "setSeed") (param $lo i32) (param $hi i32)
    (local $i i32)
    (global.set $seed (i64.or (i64.extend_i32_u (local.get $lo)) (i64.shl (i64.extend_i32_u (local.get $hi)) (i64.const 32))))
    (loop $l
      (i64.store offset=192 (local.get $i) (i64.add (i64.load (local.get $i)) (global.get $seed)))
      (i64.store offset=200 (local.get $i) (i64.sub (i64.load offset=8 (local.get $i)) (global.get $seed)))
      (local.set $i (i32.add (local.get $i) (i32.const 16)))
      (br_if $l (i32.lt_u (local.get $i) (i32.const 192)))))

  ;; the hash of [p, p + len) stored as a u64 at out
  (func (export "hashInto") (param $p i32) (param $len i32) (param $out i32)
    (i64.store (local.get $out) (call $hash (local.get $p) (local.get $len))))

  ;; n blocks of `size` bytes from p; hashes to out[0..n)
  (func (export "blocks") (param $p i32) (param $size i32) (param $n i32) (param $out i32)
    (local $i i32)
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (i64.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 3)))
          (call $hash (i32.add (local.get $p) (i32.mul (local.get $i) (local.get $size))) (local.get $size)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l))))

  ;; chained sequence hashes: out[0] = local[0], out[i] = hash(LE64(out[i-1]) ‖ LE64(local[i]))
  (func (export "chain") (param $local i32) (param $n i32) (param $out i32)
    (local $i i32) (local $prev i64)
    (if (i32.eqz (local.get $n)) (then (return)))
    (local.set $prev (i64.load (local.get $local)))
    (i64.store (local.get $out) (local.get $prev))
    (local.set $i (i32.const 1))
    (block $done
      (loop $l
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (local.set $prev (call $h9to16
          (local.get $prev)
          (i64.load (i32.add (local.get $local) (i32.shl (local.get $i) (i32.const 3))))
          (i64.const 16)))
        (i64.store (i32.add (local.get $out) (i32.shl (local.get $i) (i32.const 3))) (local.get $prev))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $l))))
)
