;; Token ids of a JSON array, `1,22,333,…`, read in WebAssembly with 128-bit SIMD: the hot loop
;; of POST /v1/route, whose 4,096-token prompts are ~25 KB of digits and commas.
;;
;; A byte-at-a-time loop (or a word-at-a-time one, as route-body.ts had) chains every id on the
;; one before it: where an id ends is only known once its digits are read. Here each 64-byte
;; block is classified first, four 16-byte compares giving a 64-bit mask of its commas and one
;; of the bytes that may not appear (anything but digits, commas and spaces; the array's `]`
;; ends the run that way too). Between two commas lie the id's digits, so every id is one
;; unaligned 8-byte load converted in three multiply steps, independent of its neighbours.
;;
;; It takes only what it can take whole: ids of 1–7 digits without a leading zero, each
;; followed by a comma. It stops at the start of the first id it does not take and leaves that
;; and everything after it to route-body.ts's byte loop, which also reports every error.
;;
;; Memory map (route-body's JS side owns it):
;;   [64, 64 + 65536)        the window of body bytes scanned per call
;;   64 more bytes           slack: block reads run up to 63 bytes past the window's end
;;   [OUT, OUT + 131076)     the ids taken, u32 little-endian (≤ one per two bytes, +1)
(module
  (memory (export "memory") 4)
  (global $stop (mut i32) (i32.const 0))

  ;; Where the last call stopped: the first byte of the first id it did not take.
  (func (export "stop") (result i32) (global.get $stop))

  ;; Reads ids from [p, end) into out; returns how many.
  (func (export "tokens") (param $p i32) (param $end i32) (param $out i32) (result i32)
    (local $n i32) (local $start i32) (local $q i32) (local $j i32) (local $last i32) (local $spaces i32) (local $own i32) (local $prev i32)
    (local $chunk v128) (local $comma v128) (local $space v128)
    (local $commas i64) (local $bad i64)
    (local $c i32) (local $s i32) (local $k i32) (local $d i64) (local $v i64)
    (local.set $start (local.get $p))
    (local.set $q (local.get $p))
    (block $done
      (loop $block
        (br_if $done (i32.ge_u (local.get $q) (local.get $end)))
        ;; classify 64 bytes, last chunk first so that byte i of the block is bit i of the masks
        (local.set $commas (i64.const 0))
        (local.set $bad (i64.const 0))
        (local.set $own (i32.const 0))
        (local.set $j (i32.const 48))
        (loop $classify
          (local.set $chunk (v128.load (i32.add (local.get $q) (local.get $j))))
          (local.set $comma (i8x16.eq (local.get $chunk) (i8x16.splat (i32.const 44))))
          (local.set $space (i8x16.eq (local.get $chunk) (i8x16.splat (i32.const 32))))
          (local.set $commas (i64.or (i64.shl (local.get $commas) (i64.const 16))
                                     (i64.extend_i32_u (i8x16.bitmask (local.get $comma)))))
          ;; digit: byte - '0' < 10 unsigned
          (local.set $bad (i64.or (i64.shl (local.get $bad) (i64.const 16))
            (i64.extend_i32_u (i32.xor (i32.const 0xffff) (i8x16.bitmask
              (v128.or (v128.or (local.get $comma) (local.get $space))
                       (i8x16.lt_u (i8x16.sub (local.get $chunk) (i8x16.splat (i32.const 48)))
                                   (i8x16.splat (i32.const 10)))))))))
          (local.set $own (i32.or (local.get $own) (v128.any_true (local.get $space))))
          (local.set $j (i32.sub (local.get $j) (i32.const 16)))
          (br_if $classify (i32.ge_s (local.get $j) (i32.const 0))))
        ;; bytes past the end count as not allowed
        (if (i32.lt_u (i32.sub (local.get $end) (local.get $q)) (i32.const 64))
          (then (local.set $bad (i64.or (local.get $bad)
            (i64.shl (i64.const -1) (i64.extend_i32_u (i32.sub (local.get $end) (local.get $q))))))))
        ;; only commas before the first byte not allowed close an id; this is the last block
        (if (i64.ne (local.get $bad) (i64.const 0))
          (then
            (local.set $commas (i64.and (local.get $commas)
              (i64.sub (i64.and (local.get $bad) (i64.sub (i64.const 0) (local.get $bad))) (i64.const 1))))
            (local.set $last (i32.const 1))))
        ;; An id closed in this block may have begun in the previous one (7 digits and a space at
        ;; most reach back that far; anything longer is refused by its length), so the previous
        ;; block's spaces count too.
        (local.set $spaces (i32.or (local.get $own) (local.get $prev)))
        (local.set $prev (local.get $own))
        ;; Two copies of the id loop, for blocks without and with spaces: one loop testing a
        ;; flag per id timed 20% slower, and a shared function for the value is not inlined.
        (if (i32.eqz (local.get $spaces))
          (then
            ;; digits and commas only: the bytes between two commas are digits, so an id needs
            ;; only its length (1–7) and no leading zero checked
            (block $ids
              (loop $id
                (br_if $ids (i64.eqz (local.get $commas)))
                (local.set $c (i32.add (local.get $q) (i32.wrap_i64 (i64.ctz (local.get $commas)))))
                (local.set $k (i32.sub (local.get $c) (local.get $start)))
                (br_if $done (i32.gt_u (i32.sub (local.get $k) (i32.const 1)) (i32.const 6)))
                (local.set $d (i64.xor (i64.load (local.get $start)) (i64.const 0x3030303030303030)))
                (br_if $done (i32.and (i64.eqz (i64.and (local.get $d) (i64.const 0xff)))
                                      (i32.gt_u (local.get $k) (i32.const 1))))
                ;; The k digits, first digit lowest, shifted to the top read as an 8-digit
                ;; number with leading zeros, which folds pairwise: digit pairs, 4-digit
                ;; groups, all 8.
                (local.set $v (i64.shl (local.get $d) (i64.extend_i32_u (i32.sub (i32.const 64) (i32.shl (local.get $k) (i32.const 3))))))
                (local.set $v (i64.and (i64.add (i64.mul (local.get $v) (i64.const 10)) (i64.shr_u (local.get $v) (i64.const 8)))
                                       (i64.const 0x00ff00ff00ff00ff)))
                (local.set $v (i64.and (i64.add (i64.mul (local.get $v) (i64.const 100)) (i64.shr_u (local.get $v) (i64.const 16)))
                                       (i64.const 0x0000ffff0000ffff)))
                (i32.store (local.get $out)
                  (i32.wrap_i64 (i64.add (i64.mul (local.get $v) (i64.const 10000)) (i64.shr_u (local.get $v) (i64.const 32)))))
                (local.set $out (i32.add (local.get $out) (i32.const 4)))
                (local.set $n (i32.add (local.get $n) (i32.const 1)))
                (local.set $start (i32.add (local.get $c) (i32.const 1)))
                (local.set $commas (i64.and (local.get $commas) (i64.sub (local.get $commas) (i64.const 1))))
                (br $id))))
          (else
            ;; one space may lead an id (Python's ", " separator); a space anywhere else leaves
            ;; the id to the byte loop, so each id's bytes are checked to be digits
            (block $ids
              (loop $id
                (br_if $ids (i64.eqz (local.get $commas)))
                (local.set $c (i32.add (local.get $q) (i32.wrap_i64 (i64.ctz (local.get $commas)))))
                (local.set $s (i32.add (local.get $start) (i32.eq (i32.load8_u (local.get $start)) (i32.const 32))))
                (local.set $k (i32.sub (local.get $c) (local.get $s)))
                (br_if $done (i32.gt_u (i32.sub (local.get $k) (i32.const 1)) (i32.const 6)))
                (local.set $d (i64.xor (i64.load (local.get $s)) (i64.const 0x3030303030303030)))
                ;; a byte is no digit when it is ≥ 10 after the xor: adding 0x76 sets its top bit
                ;; (one ≥ 0x80 has it already); a carry out of such a byte only touches later ones
                (br_if $done (i64.ne (i64.const 0)
                  (i64.and (i64.and (i64.or (i64.add (local.get $d) (i64.const 0x7676767676767676)) (local.get $d))
                                    (i64.const 0x8080808080808080))
                           (i64.sub (i64.shl (i64.const 1) (i64.extend_i32_u (i32.shl (local.get $k) (i32.const 3))))
                                    (i64.const 1)))))
                (br_if $done (i32.and (i64.eqz (i64.and (local.get $d) (i64.const 0xff)))
                                      (i32.gt_u (local.get $k) (i32.const 1))))
                (local.set $v (i64.shl (local.get $d) (i64.extend_i32_u (i32.sub (i32.const 64) (i32.shl (local.get $k) (i32.const 3))))))
                (local.set $v (i64.and (i64.add (i64.mul (local.get $v) (i64.const 10)) (i64.shr_u (local.get $v) (i64.const 8)))
                                       (i64.const 0x00ff00ff00ff00ff)))
                (local.set $v (i64.and (i64.add (i64.mul (local.get $v) (i64.const 100)) (i64.shr_u (local.get $v) (i64.const 16)))
                                       (i64.const 0x0000ffff0000ffff)))
                (i32.store (local.get $out)
                  (i32.wrap_i64 (i64.add (i64.mul (local.get $v) (i64.const 10000)) (i64.shr_u (local.get $v) (i64.const 32)))))
                (local.set $out (i32.add (local.get $out) (i32.const 4)))
                (local.set $n (i32.add (local.get $n) (i32.const 1)))
                (local.set $start (i32.add (local.get $c) (i32.const 1)))
                (local.set $commas (i64.and (local.get $commas) (i64.sub (local.get $commas) (i64.const 1))))
                (br $id)))))
        (br_if $done (local.get $last))
        (local.set $q (i32.add (local.get $q) (i32.const 64)))
        (br $block)))
    (global.set $stop (local.get $start))
    (local.get $n))
)
