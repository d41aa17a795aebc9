//! armv7 NEON K-quant dots (`dot_q4k`, `dot_q5k`, `dot_q6k`): the exact
//! integer sums of each 32-weight sub-block against its activation block in
//! `asm!` (`vmull.s8` + `vpadal.s16`, as `int8.rs`), then the scales, mins
//! and the float part in scalar VFP code in `portable`'s order, so the
//! results are bit-identical to `Portable`'s.
//!
//! Integer part. Activation block 8·s + j is sub-block j of super-block s.
//! * Q4_K: isum_j = Σ_l q·q_x over the 32 weights, q = the low (j even) or
//!   high (j odd) nibble of `qs[32·⌊j/2⌋ + l]`, 0..=15.
//! * Q5_K: as Q4_K with q | bit j of `qh[l]` << 4, 0..=31.
//! * Q6_K: two sums per sub-block, g_k = Σ_{l in 16k..16k+16} (q − 32)·q_x,
//!   q the 6-bit code of `q6k_code` (q − 32 in −32..=31).
//!
//! Exactness. Every code (0..=31, or −32..=31) and every activation quant
//! is an i8, so `vmull.s8` gives each product exactly in an i16 (|p| ≤
//! 32·128 = 4096 < 2^15). `vpaddl.s16` / `vpadal.s16` add the products
//! pairwise into four i32 lanes: a lane holds at most 8 products (Q4_K /
//! Q5_K: |lane| ≤ 8·31·128 < 2^15; Q6_K: 4 products per lane), and
//! `vpadd.i32` adds the lanes: |isum| ≤ 32·31·128 = 126 976, |g_k| ≤
//! 16·32·128 = 65 536, so no i32 sum can wrap and each is the exact integer
//! `portable` computes. From them the scalar code forms `portable`'s
//! integers: Q4_K / Q5_K S = sc[j]·isum_j (|S| ≤ 63·126 976 < 2^23) and
//! M = m[j]·sum_x (|M| ≤ 63·32·127 < 2^18); Q6_K S = sc[2j]·g_0 +
//! sc[2j+1]·g_1 (|S| ≤ 2·128·65 536 = 2^24, and with the real bounds
//! |q_x| ≤ 127 below 2^24; in any case an i32 computed exactly, converted
//! as `portable` converts it).
//!
//! Float part. armv7 NEON arithmetic flushes subnormal inputs and results
//! to zero (mod.rs), and K-quant scales can be subnormal (f16 d and dmin,
//! whose smallest values are f32 normals but whose products with d_x need
//! not be), so rather than a NEON pass with `int8.rs`'s check and scalar
//! fallback, the scaling runs in scalar VFP code, which is IEEE (Linux does
//! not set flush-to-zero), with `portable`'s very expressions: Q4_K / Q5_K
//! acc[j] += (d·d_x)·S − (dmin·d_x)·M (`portable::k_min_term`, each product
//! rounded on its own, no FMA), Q6_K acc[j] += (d·d_x)·S, super-block by
//! super-block, then `combine8`. The scales d_x and sums Σ q_x are read
//! from the activation blocks, as `portable` reads them, so activations
//! with and without their side arrays give the same bits. The compiler does
//! not vectorise this float code into NEON (the disassembled kernels use
//! only VFP s-register `vmul` / `vadd` / `vcvt` and the non-fused VFP
//! `vmla` / `vmls`, which round the product and the sum separately).
//!
//! The four-token forms stay the trait's defaults (four single dots).

use core::arch::asm;

use crate::kernels::portable::{combine8, k_min_term};
use crate::quant::{f16_to_f32, scales_mins_k4, ActRef, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8Act};

/// Super-blocks whose integer sums one `asm!` call computes at most (the stack buffer).
const CHUNK: usize = 8;

/// Byte distance between the quants of consecutive activation blocks.
const ACT_STRIDE: usize = core::mem::size_of::<BlockQ8Act>();

/// One Q4_K / Q5_K sub-block pair: the codes of sub-block 2p in q2, q3 and
/// of sub-block 2p + 1 in q0, q1 (byte l = weight l); loads the two
/// activation blocks (q4, q5 and q6, q7), multiplies (`vmull.s8`, exact
/// i16), adds the products into the i32 lanes of q8 and q10 and stores
/// [isum_2p, isum_2p+1] at `{out}`. Temporaries q9, q11.
#[rustfmt::skip]
macro_rules! pair_sums {
    () => {
        concat!(
            "vld1.8 {{d8-d11}}, [{x}], {xs}\n",
            "vld1.8 {{d12-d15}}, [{x}], {xs}\n",
            "vmull.s8 q8, d4, d8\n",
            "vmull.s8 q9, d5, d9\n",
            "vpaddl.s16 q8, q8\n",
            "vpadal.s16 q8, q9\n",
            "vmull.s8 q9, d6, d10\n",
            "vpadal.s16 q8, q9\n",
            "vmull.s8 q9, d7, d11\n",
            "vpadal.s16 q8, q9\n",
            "vmull.s8 q10, d0, d12\n",
            "vmull.s8 q11, d1, d13\n",
            "vpaddl.s16 q10, q10\n",
            "vpadal.s16 q10, q11\n",
            "vmull.s8 q11, d2, d14\n",
            "vpadal.s16 q10, q11\n",
            "vmull.s8 q11, d3, d15\n",
            "vpadal.s16 q10, q11\n",
            "vpadd.i32 d16, d16, d17\n",
            "vpadd.i32 d20, d20, d21\n",
            "vpadd.i32 d16, d16, d20\n",
            "vst1.32 {{d16}}, [{out}]!\n",
        )
    };
}

/// One Q4_K sub-block pair: 32 bytes of `qs` (q14 = 0x0f bytes), low
/// nibbles → q2, q3, high nibbles → q0, q1, then `pair_sums!`.
#[rustfmt::skip]
macro_rules! q4k_pair {
    () => {
        concat!(
            "vld1.8 {{d0-d3}}, [{w}]!\n",
            "vand q2, q0, q14\n",
            "vand q3, q1, q14\n",
            "vshr.u8 q0, q0, #4\n",
            "vshr.u8 q1, q1, #4\n",
            pair_sums!(),
        )
    };
}

/// One Q5_K sub-block pair: as `q4k_pair!`, with the fifth bits from the
/// super-block's `qh` in q12, q13 (shifted right by 2 after each pair, so
/// bits 0 and 1 belong to this pair): bit 0 << 4 into sub-block 2p's codes,
/// bit 1 << 3 into 2p + 1's (q15 = 0x10 bytes; temporaries q8, q9).
#[rustfmt::skip]
macro_rules! q5k_pair {
    () => {
        concat!(
            "vld1.8 {{d0-d3}}, [{w}]!\n",
            "vand q2, q0, q14\n",
            "vand q3, q1, q14\n",
            "vshr.u8 q0, q0, #4\n",
            "vshr.u8 q1, q1, #4\n",
            "vshl.i8 q8, q12, #4\n",
            "vshl.i8 q9, q13, #4\n",
            "vand q8, q8, q15\n",
            "vand q9, q9, q15\n",
            "vorr q2, q2, q8\n",
            "vorr q3, q3, q9\n",
            "vshl.i8 q8, q12, #3\n",
            "vshl.i8 q9, q13, #3\n",
            "vand q8, q8, q15\n",
            "vand q9, q9, q15\n",
            "vorr q0, q0, q8\n",
            "vorr q1, q1, q9\n",
            "vshr.u8 q12, q12, #2\n",
            "vshr.u8 q13, q13, #2\n",
            pair_sums!(),
        )
    };
}

/// The address of x[0]'s quants, with the provenance of all of `x`.
fn act_qs(x: &[BlockQ8Act]) -> *const i8 {
    x.as_ptr().cast::<i8>().wrapping_add(core::mem::offset_of!(BlockQ8Act, qs))
}

/// out[8k + j] = isum_j of super-block k (module doc), exact, for the
/// `out.len() / 8` super-blocks whose bytes start `w` (Q4_K blocks when
/// `qh` is false, else Q5_K) against activation blocks x[0..].
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
unsafe fn isums_q4k_q5k(qh: bool, w: &[u8], x: &[BlockQ8Act], out: &mut [i32]) {
    let n = out.len() / 8;
    let (size, start) = if qh {
        (core::mem::size_of::<BlockQ5K>(), core::mem::offset_of!(BlockQ5K, qh))
    } else {
        (core::mem::size_of::<BlockQ4K>(), core::mem::offset_of!(BlockQ4K, qs))
    };
    assert!(n > 0 && out.len() == 8 * n && w.len() >= n * size && x.len() >= 8 * n);
    let wptr = w[start..].as_ptr();
    macro_rules! run {
        ($setup:expr, $pair:expr) => {
            asm!(
                "vmov.i8 q14, #15",
                "vmov.i8 q15, #16",
                "2:",
                $setup,
                $pair,
                $pair,
                $pair,
                $pair,
                "add {w}, {w}, #16", // the next super-block's qh / qs
                "subs {n}, {n}, #1",
                "bne 2b",
                n = inout(reg) n => _,
                w = inout(reg) wptr => _,
                x = inout(reg) act_qs(x) => _,
                xs = in(reg) ACT_STRIDE,
                out = inout(reg) out.as_mut_ptr() => _,
                out("q0") _, out("q1") _, out("q2") _, out("q3") _,
                out("q4") _, out("q5") _, out("q6") _, out("q7") _,
                out("q8") _, out("q9") _, out("q10") _, out("q11") _,
                out("q12") _, out("q13") _, out("q14") _, out("q15") _,
                options(nostack),
            )
        };
    }
    // SAFETY: `wptr` points at `qh` (Q5_K) or `qs` (Q4_K) of the first of
    // the n super-blocks in `w` (w holds ≥ n blocks' bytes, asserted): per super-block
    // the loop reads qh's 32 bytes (Q5_K) and qs's 128, which follow it,
    // then steps 16 bytes to the next block's qh / qs (Q5_K: 16 + 32 + 128
    // = 176, Q4_K: 16 + 128 = 144 bytes, the block sizes), so it reads
    // inside the n blocks; it reads the 32 quants of 8·n activation blocks
    // at stride ACT_STRIDE from x[0].qs (x holds ≥ 8·n, asserted) and
    // writes 8·n i32 to `out` (its length); it touches only the declared
    // NEON registers and the flags; NEON is the caller's contract.
    unsafe {
        if qh {
            run!("vld1.8 {{d24-d27}}, [{w}]!", q5k_pair!())
        } else {
            run!("", q4k_pair!())
        }
    }
}

/// One Q6_K sub-block with r = $r (its 32 `ql` bytes just loaded into q0,
/// q1, the half's `qh` in q12, q13; q14 = 0x0f, q15 = 0x30, q6 = 32
/// bytes): code = low (r < 2) or high nibble | ((qh >> 2r) & 3) << 4, minus
/// 32, in q2, q3; the next activation block in q4, q5; stores [g_0, g_1].
#[rustfmt::skip]
macro_rules! q6k_sub {
    ($lo:expr, $hi:expr) => {
        concat!(
            $lo,
            $hi,
            "vand q8, q8, q15\n",
            "vand q9, q9, q15\n",
            "vorr q2, q2, q8\n",
            "vorr q3, q3, q9\n",
            "vsub.i8 q2, q2, q6\n",
            "vsub.i8 q3, q3, q6\n",
            "vld1.8 {{d8-d11}}, [{x}], {xs}\n",
            "vmull.s8 q8, d4, d8\n",
            "vmull.s8 q9, d5, d9\n",
            "vpaddl.s16 q8, q8\n",
            "vpadal.s16 q8, q9\n",   // group 2j: weights 0..16
            "vmull.s8 q10, d6, d10\n",
            "vmull.s8 q11, d7, d11\n",
            "vpaddl.s16 q10, q10\n",
            "vpadal.s16 q10, q11\n", // group 2j + 1: weights 16..32
            "vpadd.i32 d16, d16, d17\n",
            "vpadd.i32 d20, d20, d21\n",
            "vpadd.i32 d16, d16, d20\n",
            "vst1.32 {{d16}}, [{out}]!\n",
        )
    };
}

/// One Q6_K half (h): its 32 `qh` bytes, then r = 0..4, r reading `ql`
/// bytes 32·(r mod 2).. of the half (the pointer advances by 64 in all).
#[rustfmt::skip]
macro_rules! q6k_half {
    () => {
        concat!(
            "vld1.8 {{d24-d27}}, [{qh}]!\n",
            "vld1.8 {{d0-d3}}, [{ql}]!\n",
            q6k_sub!("vand q2, q0, q14\nvand q3, q1, q14\n", "vshl.i8 q8, q12, #4\nvshl.i8 q9, q13, #4\n"),
            "vld1.8 {{d0-d3}}, [{ql}]\n",
            "sub {ql}, {ql}, #32\n",
            q6k_sub!("vand q2, q0, q14\nvand q3, q1, q14\n", "vshl.i8 q8, q12, #2\nvshl.i8 q9, q13, #2\n"),
            "vld1.8 {{d0-d3}}, [{ql}]!\n",
            q6k_sub!("vshr.u8 q2, q0, #4\nvshr.u8 q3, q1, #4\n", "vmov q8, q12\nvmov q9, q13\n"),
            "vld1.8 {{d0-d3}}, [{ql}]!\n",
            q6k_sub!("vshr.u8 q2, q0, #4\nvshr.u8 q3, q1, #4\n", "vshr.u8 q8, q12, #2\nvshr.u8 q9, q13, #2\n"),
        )
    };
}

/// out[16k + 2j + g] = g_g of sub-block j of super-block w[k] (module
/// doc), exact, for the `out.len() / 16` super-blocks, against activation
/// blocks x[0..].
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
unsafe fn isums_q6k(w: &[BlockQ6K], x: &[BlockQ8Act], out: &mut [i32]) {
    let n = out.len() / 16;
    assert!(n > 0 && out.len() == 16 * n && w.len() >= n && x.len() >= 8 * n);
    let bytes: &[u8] = bytemuck::cast_slice(w);
    // SAFETY: per super-block the loop reads `ql`'s 128 bytes (the pointer
    // steps 128, then 82 to the next block's `ql`: 210 = the block size) and
    // `qh`'s 64 (steps 64, then 146: 210), so it reads inside w's first n
    // blocks (w holds ≥ n, asserted); it reads the 32 quants of 8·n
    // activation blocks at stride ACT_STRIDE from x[0].qs (x holds ≥ 8·n)
    // and writes 16·n i32 to `out` (its length); it touches only the
    // declared NEON registers and the flags; NEON is the caller's contract.
    unsafe {
        asm!(
            "vmov.i8 q14, #15",
            "vmov.i8 q15, #48",
            "vmov.i8 q6, #32",
            "2:",
            q6k_half!(),
            q6k_half!(),
            "add {ql}, {ql}, #82",
            "add {qh}, {qh}, #146",
            "subs {n}, {n}, #1",
            "bne 2b",
            n = inout(reg) n => _,
            ql = inout(reg) bytes[core::mem::offset_of!(BlockQ6K, ql)..].as_ptr() => _,
            qh = inout(reg) bytes[core::mem::offset_of!(BlockQ6K, qh)..].as_ptr() => _,
            x = inout(reg) act_qs(x) => _,
            xs = in(reg) ACT_STRIDE,
            out = inout(reg) out.as_mut_ptr() => _,
            out("q0") _, out("q1") _, out("q2") _, out("q3") _,
            out("q4") _, out("q5") _, out("q6") _, out("q7") _,
            out("q8") _, out("q9") _, out("q10") _, out("q11") _,
            out("q12") _, out("q13") _, out("q14") _, out("q15") _,
            options(nostack),
        )
    }
}

/// Q4_K / Q5_K's float part for super-blocks s0.. (one per 8 `sums`), in
/// `portable::dot_q4k`'s order (module doc).
#[inline(always)]
fn scale_q4k_q5k(
    acc: &mut [f32; 8],
    sums: &[i32],
    xb: &[BlockQ8Act],
    s0: usize,
    head: impl Fn(usize) -> (half::f16, half::f16, [u8; 12]),
) {
    for (k, isum) in sums.chunks_exact(8).enumerate() {
        let s = s0 + k;
        let (d, dmin, scales) = head(s);
        let (d, dmin) = (f16_to_f32(d), f16_to_f32(dmin));
        let (sc, mn) = scales_mins_k4(&scales);
        for (j, bx) in xb[8 * s..8 * s + 8].iter().enumerate() {
            acc[j] += k_min_term(d, dmin, bx.d, sc[j] as i32 * isum[j], mn[j] as i32 * bx.sum);
        }
    }
}

/// Q4_K or Q5_K (`q5`) weights · Q8 activations for N activation rows (one
/// token, or four of a prompt): the exact sub-block sums in asm, then
/// `scale_q4k_q5k`; `head(b)` is a block's d, dmin and scales. Each chunk of
/// `CHUNK` super-blocks is summed for all N rows in turn (its weights from
/// memory once, then from the L1 cache), each row with the one-row
/// operations: the same bits.
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
#[inline(always)]
unsafe fn dot_kmin<B: bytemuck::Pod, const N: usize>(
    w: &[B],
    xs: [ActRef; N],
    q5: bool,
    head: impl Fn(&B) -> (half::f16, half::f16, [u8; 12]),
) -> [f32; N] {
    let xb = xs.map(|x| x.blocks());
    for x in &xb {
        debug_assert_eq!(w.len() * 8, x.len());
        assert!(x.len() >= 8 * w.len());
    }
    let mut acc = [[0.0f32; 8]; N];
    let mut sums = [0i32; 8 * CHUNK];
    for s0 in (0..w.len()).step_by(CHUNK) {
        let m = CHUNK.min(w.len() - s0);
        for (acc, xb) in acc.iter_mut().zip(&xb) {
            // SAFETY: NEON is this function's contract.
            unsafe { isums_q4k_q5k(q5, bytemuck::cast_slice(&w[s0..]), &xb[8 * s0..], &mut sums[..8 * m]) };
            scale_q4k_q5k(acc, &sums[..8 * m], xb, s0, |s| head(&w[s]));
        }
    }
    acc.map(combine8)
}

/// Q4_K weights · Q8 activations, bit-identical to `Portable::dot_q4k`.
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
#[inline]
pub(crate) unsafe fn dot_q4k(w: &[BlockQ4K], x: ActRef) -> f32 {
    // SAFETY: NEON is this function's contract.
    unsafe { dot_kmin(w, [x], false, |b| (b.d, b.dmin, b.scales))[0] }
}

/// `dot_q4k` of one weight row with four activation rows.
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
#[inline]
pub(crate) unsafe fn dot_q4k_x4(w: &[BlockQ4K], xs: [ActRef; 4]) -> [f32; 4] {
    // SAFETY: NEON is this function's contract.
    unsafe { dot_kmin(w, xs, false, |b| (b.d, b.dmin, b.scales)) }
}

/// Q5_K weights · Q8 activations, bit-identical to `Portable::dot_q5k`.
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
#[inline]
pub(crate) unsafe fn dot_q5k(w: &[BlockQ5K], x: ActRef) -> f32 {
    // SAFETY: NEON is this function's contract.
    unsafe { dot_kmin(w, [x], true, |b| (b.d, b.dmin, b.scales))[0] }
}

/// `dot_q5k` of one weight row with four activation rows.
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
#[inline]
pub(crate) unsafe fn dot_q5k_x4(w: &[BlockQ5K], xs: [ActRef; 4]) -> [f32; 4] {
    // SAFETY: NEON is this function's contract.
    unsafe { dot_kmin(w, xs, true, |b| (b.d, b.dmin, b.scales)) }
}

/// Q6_K weights · Q8 activations for N activation rows, each chunk of
/// super-blocks for all N rows in turn (as `dot_kmin`).
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
#[inline(always)]
unsafe fn dot_q6k_n<const N: usize>(w: &[BlockQ6K], xs: [ActRef; N]) -> [f32; N] {
    let xb = xs.map(|x| x.blocks());
    for x in &xb {
        debug_assert_eq!(w.len() * 8, x.len());
        assert!(x.len() >= 8 * w.len());
    }
    let mut acc = [[0.0f32; 8]; N];
    let mut sums = [0i32; 16 * CHUNK];
    for s0 in (0..w.len()).step_by(CHUNK) {
        let m = CHUNK.min(w.len() - s0);
        for (acc, xb) in acc.iter_mut().zip(&xb) {
            // SAFETY: NEON is this function's contract.
            unsafe { isums_q6k(&w[s0..], &xb[8 * s0..], &mut sums[..16 * m]) };
            for (k, g) in sums[..16 * m].chunks_exact(16).enumerate() {
                let bw = &w[s0 + k];
                let d = f16_to_f32(bw.d);
                for (j, bx) in xb[8 * (s0 + k)..8 * (s0 + k) + 8].iter().enumerate() {
                    let isum = bw.scales[2 * j] as i32 * g[2 * j] + bw.scales[2 * j + 1] as i32 * g[2 * j + 1];
                    acc[j] += (d * bx.d) * isum as f32;
                }
            }
        }
    }
    acc.map(combine8)
}

/// Q6_K weights · Q8 activations, bit-identical to `Portable::dot_q6k`.
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
#[inline]
pub(crate) unsafe fn dot_q6k(w: &[BlockQ6K], x: ActRef) -> f32 {
    // SAFETY: NEON is this function's contract.
    unsafe { dot_q6k_n(w, [x])[0] }
}

/// `dot_q6k` of one weight row with four activation rows.
///
/// # Safety
/// The CPU must have NEON (the armv7 build's start-up guard ensures it).
#[inline]
pub(crate) unsafe fn dot_q6k_x4(w: &[BlockQ6K], xs: [ActRef; 4]) -> [f32; 4] {
    // SAFETY: NEON is this function's contract.
    unsafe { dot_q6k_n(w, xs) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{q4k_code, q5k_code, q6k_code};
    use bytemuck::Zeroable;

    /// The NEON integer sums against scalar sums from the layout accessors,
    /// for 1..=19 super-blocks (several chunks and a partial one), random
    /// bits and i8 activations including −128.
    #[test]
    fn armv7_kquant_sums_match_scalar() {
        let mut s = 0x9e37_79b9u32;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s
        };
        for n in 1..=19usize {
            let x: Vec<BlockQ8Act> = (0..8 * n)
                .map(|_| {
                    let mut b = BlockQ8Act::default();
                    b.qs.iter_mut().for_each(|q| *q = next() as i8);
                    b
                })
                .collect();
            let (mut w4, mut w5, mut w6) =
                (vec![BlockQ4K::zeroed(); n], vec![BlockQ5K::zeroed(); n], vec![BlockQ6K::zeroed(); n]);
            let bytes = bytemuck::cast_slice_mut::<_, u8>(&mut w4).iter_mut();
            let bytes = bytes.chain(bytemuck::cast_slice_mut::<_, u8>(&mut w5).iter_mut());
            bytes.chain(bytemuck::cast_slice_mut::<_, u8>(&mut w6).iter_mut()).for_each(|b| *b = next() as u8);
            let (mut g4, mut g5, mut g6) = (vec![0; 8 * n], vec![0; 8 * n], vec![0; 16 * n]);
            // SAFETY: the armv7 test executable runs only where NEON is (qemu cortex-a7 / a15).
            unsafe {
                isums_q4k_q5k(false, bytemuck::cast_slice(&w4), &x, &mut g4);
                isums_q4k_q5k(true, bytemuck::cast_slice(&w5), &x, &mut g5);
                isums_q6k(&w6, &x, &mut g6);
            }
            for s in 0..n {
                for j in 0..8 {
                    let bx = &x[8 * s + j];
                    let want4: i32 = (0..32).map(|l| q4k_code(&w4[s], j, l) as i32 * bx.qs[l] as i32).sum();
                    let want5: i32 = (0..32).map(|l| q5k_code(&w5[s], j, l) as i32 * bx.qs[l] as i32).sum();
                    assert_eq!(g4[8 * s + j], want4, "q4_k n={n} s={s} j={j}");
                    assert_eq!(g5[8 * s + j], want5, "q5_k n={n} s={s} j={j}");
                    for g in 0..2 {
                        let want6: i32 = (0..16)
                            .map(|l| (q6k_code(&w6[s], 32 * j + 16 * g + l) as i32 - 32) * bx.qs[16 * g + l] as i32)
                            .sum();
                        assert_eq!(g6[16 * s + 2 * j + g], want6, "q6_k n={n} s={s} j={j} g={g}");
                    }
                }
            }
        }
    }
}
