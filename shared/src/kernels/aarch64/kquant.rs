//! AArch64 K-quant dots (`dot_q4k`, `dot_q5k`, `dot_q6k`: one Q4_K / Q5_K /
//! Q6_K weight row · one row of Q8 activation blocks, and their four-row
//! forms `dot_q4k_x4` ..., which unpack each super-block's codes once for
//! the four rows: a prompt reads each weight row once per four tokens),
//! written once for the
//! AArch64 builds and generic over the 16-byte i8 · i8 dot `dot16(acc, a, b)`
//! (acc + the 16 products a[k]·b[k] summed into four i32 lanes): NEON's
//! `smull` + `sadalp` (`neon::imp::dot16`) or dotprod's `sdot`
//! (`neon_dotprod::imp::sdot`). Nothing else in here depends on the build.
//!
//! Per super-block s the eight sub-blocks' codes are unpacked to signed
//! bytes in vectors (nibble masks and shifts, Q5_K's fifth bit with `cmtst`,
//! Q6_K's two high bits shifted into place and the −32 offset subtracted),
//! each sub-block j is dotted with activation block 8s + j, and the eight
//! exact integer sums are folded into i32 lanes 0..4 and 4..8 (`addp`),
//! block j in lane j.
//!
//! Float contract (`portable::dot_q4k`, `dot_q5k`, `dot_q6k`): lane j of two
//! f32 vectors is `portable`'s partial sum acc[j], and every operation is
//! the one `portable` does on that lane, with the same operands in the same
//! order, one rounding each (`fmul`, `fsub`, `fadd`; never `fmla`/`fmls`,
//! which would round once instead of twice):
//! * Q4_K / Q5_K: acc[j] + ((d·d_x)·(S as f32) − (dmin·d_x)·(M as f32)),
//!   S = sc[j]·Σ q·q_x, M = m[j]·sum_x (`portable::k_min_term`);
//! * Q6_K: acc[j] + (d·d_x)·(S as f32), S = sc[2j]·Σ_{first 16} (q − 32)·q_x
//!   + sc[2j+1]·Σ_{last 16} (q − 32)·q_x;
//!
//! then the lanes are combined as `portable::combine8` (`neon::imp::hsum8`).
//! The f16 scales are converted exactly (`f16_bits_to_f32`, the same value
//! as `half`'s `to_f32`), the activation scales and sums come from the
//! contiguous side arrays when the `ActRef` has them, else from the blocks
//! (the same values).
//!
//! Integer exactness. Activation quants are i8 (|q_x| ≤ 128, in practice
//! ≤ 127). Every product fed to `dot16` is i8 · i8 with one factor a code:
//! Q4_K 0..=15, Q5_K 0..=31, Q6_K −32..=31, so |product| ≤ 32·128 = 4096;
//! `smull` holds it exactly in i16 and `sadalp`/`sdot` add into i32. A
//! sub-block's sum has |Σ| ≤ 32·31·128 = 126976 (Q4_K/Q5_K) or, per half of
//! 16, 16·32·128 = 65536 (Q6_K), and any partial sum of it is smaller, so
//! no i32 lane overflows and the lane-folding order does not matter
//! (integer addition is associative): the result is exactly `portable`'s
//! isum. Then |S| = sc·|Σ| ≤ 63·126976 < 2^23 (sc, m < 64), |M| =
//! m·|sum_x| ≤ 63·32·128 < 2^18, and Q6_K's |S| ≤ 2·128·65536 = 2^24:
//! `mul` in i32 is exact, and `scvtf` converts the same i32 to the same f32
//! as `as f32` (exactly, all being ≤ 2^24).

use super::neon::imp::{hsum8, ld, ld16, ld_i32, q8_halves, reduce4};
use crate::kernels::portable::f16_bits_to_f32;
use crate::quant::{scales_mins_k4, ActRef, BlockQ4K, BlockQ5K, BlockQ6K};
use core::arch::aarch64::*;

isa_features!(
    /// Activation scales of blocks i..i+8 as lanes 0..4, 4..8: from the
    /// contiguous array when the `ActRef` has one, else from the blocks.
    #[inline]
    fn act_d8(x: ActRef, i: usize) -> [float32x4_t; 2] {
        if x.has_side() {
            [ld(&x.d[i..i + 4]), ld(&x.d[i + 4..i + 8])]
        } else {
            let b = &x.blocks()[i..i + 8];
            let d: [f32; 8] = core::array::from_fn(|j| b[j].d);
            [ld(&d[..4]), ld(&d[4..])]
        }
    }

    /// Activation sums (Σ q_x) of blocks i..i+8 as lanes 0..4, 4..8, as `act_d8`.
    #[inline]
    fn act_sum8(x: ActRef, i: usize) -> [int32x4_t; 2] {
        if x.has_side() {
            [ld_i32(&x.sum[i..i + 4]), ld_i32(&x.sum[i + 4..i + 8])]
        } else {
            let b = &x.blocks()[i..i + 8];
            let s: [i32; 8] = core::array::from_fn(|j| b[j].sum);
            [ld_i32(&s[..4]), ld_i32(&s[4..])]
        }
    }

    /// Eight 6-bit values (0..64) as i32 lanes 0..4, 4..8.
    #[inline]
    fn widen8(v: [u8; 8]) -> [int32x4_t; 2] {
        // SAFETY: `v` is 8 readable bytes; `ld1` of bytes needs no alignment.
        let h = vmovl_u8(unsafe { vld1_u8(v.as_ptr()) });
        [vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(h))), vreinterpretq_s32_u32(vmovl_high_u16(h))]
    }

    /// The 32 bytes `b` as two 16-byte vectors.
    #[inline]
    fn ld32(b: &[u8]) -> [uint8x16_t; 2] {
        [
            vreinterpretq_u8_s8(ld16(b[..16].try_into().unwrap())),
            vreinterpretq_u8_s8(ld16(b[16..32].try_into().unwrap())),
        ]
    }

    /// The 4-bit codes of a Q4_K / Q5_K super-block's `qs`: sub-block 2p is
    /// the low nibbles of bytes 32p..32p+32, sub-block 2p + 1 their high
    /// nibbles (`quant::q4k_code`), each as two 16-byte halves (0..=15).
    #[inline]
    fn nibbles_k4(qs: &[u8; 128]) -> [[uint8x16_t; 2]; 8] {
        let m = vdupq_n_u8(0x0f);
        let mut c = [[vdupq_n_u8(0); 2]; 8];
        for p in 0..4 {
            let q = ld32(&qs[32 * p..32 * p + 32]);
            for h in 0..2 {
                c[2 * p][h] = vandq_u8(q[h], m);
                c[2 * p + 1][h] = vshrq_n_u8::<4>(q[h]);
            }
        }
        c
    }

    /// Σ over super-blocks of the Q4_K / Q5_K terms in `portable`'s order
    /// (module doc), for N activation rows at once: `head(s)` is
    /// super-block s's (d bits, dmin bits, packed scales and mins),
    /// `codes(s)` its eight sub-blocks' codes (0..=31) as signed bytes in
    /// two 16-byte halves, unpacked once for all N rows; each row's sums and
    /// float steps are the one-row form's, so row t's result is the same
    /// bits as with N = 1.
    #[inline]
    fn kmin_dot_n<const N: usize>(
        w_len: usize,
        xs: [ActRef; N],
        head: impl Fn(usize) -> (u16, u16, [u8; 12]),
        codes: impl Fn(usize) -> [[int8x16_t; 2]; 8],
        dot16: impl Fn(int32x4_t, int8x16_t, int8x16_t) -> int32x4_t,
    ) -> [f32; N] {
        debug_assert!(xs.iter().all(|x| w_len * 8 == x.len()));
        let zero = vdupq_n_s32(0);
        let mut acc = [[vdupq_n_f32(0.0); 2]; N];
        for s in 0..w_len {
            let i = 8 * s;
            let (d, dmin, packed) = head(s);
            let c = codes(s);
            let (sc, mn) = scales_mins_k4(&packed);
            let (sc, mn) = (widen8(sc), widen8(mn));
            let (d, dmin) = (vdupq_n_f32(f16_bits_to_f32(d)), vdupq_n_f32(f16_bits_to_f32(dmin)));
            for (x, acc) in xs.iter().zip(acc.iter_mut()) {
                let xb = x.blocks();
                // sub-block j · activation block i + j, four i32 lanes each (exact)
                let p: [int32x4_t; 8] = unroll!(8, |j| {
                    let xq = q8_halves(&xb[i + j].qs);
                    dot16(dot16(zero, c[j][0], xq[0]), c[j][1], xq[1])
                });
                let isum = [reduce4([p[0], p[1], p[2], p[3]]), reduce4([p[4], p[5], p[6], p[7]])];
                let sumx = act_sum8(*x, i);
                let dx = act_d8(*x, i);
                for h in 0..2 {
                    let s_int = vmulq_s32(sc[h], isum[h]); // S = sc·Σ q·q_x, exact
                    let m_int = vmulq_s32(mn[h], sumx[h]); // M = m·Σ q_x, exact
                    let a = vmulq_f32(vmulq_f32(d, dx[h]), vcvtq_f32_s32(s_int)); // (d·d_x)·S
                    let b = vmulq_f32(vmulq_f32(dmin, dx[h]), vcvtq_f32_s32(m_int)); // (dmin·d_x)·M
                    acc[h] = vaddq_f32(acc[h], vsubq_f32(a, b));
                }
            }
        }
        acc.map(|a| hsum8(a[0], a[1]))
    }

    /// Q4_K weights · N rows of Q8 activations (`portable::dot_q4k` of
    /// each, bit for bit), the 16-byte products summed by `dot16`.
    #[inline]
    pub(crate) fn dot_q4k_with<const N: usize>(
        w: &[BlockQ4K],
        xs: [ActRef; N],
        dot16: impl Fn(int32x4_t, int8x16_t, int8x16_t) -> int32x4_t,
    ) -> [f32; N] {
        kmin_dot_n(
            w.len(),
            xs,
            |s| (w[s].d.to_bits(), w[s].dmin.to_bits(), w[s].scales),
            |s| nibbles_k4(&w[s].qs).map(|c| c.map(|v| vreinterpretq_s8_u8(v))),
            dot16,
        )
    }

    /// Q5_K weights · N rows of Q8 activations (`portable::dot_q5k` of
    /// each, bit for bit): the Q4_K nibbles with bit j of `qh[l]` as bit 4
    /// of sub-block j's code l.
    #[inline]
    pub(crate) fn dot_q5k_with<const N: usize>(
        w: &[BlockQ5K],
        xs: [ActRef; N],
        dot16: impl Fn(int32x4_t, int8x16_t, int8x16_t) -> int32x4_t,
    ) -> [f32; N] {
        kmin_dot_n(
            w.len(),
            xs,
            |s| (w[s].d.to_bits(), w[s].dmin.to_bits(), w[s].scales),
            |s| {
                let mut c = nibbles_k4(&w[s].qs);
                let qh = ld32(&w[s].qh);
                let sixteen = vdupq_n_u8(16);
                for (j, cj) in c.iter_mut().enumerate() {
                    let bit = vdupq_n_u8(1 << j);
                    for h in 0..2 {
                        // 16 where bit j of qh[16h + l] is set, else 0
                        cj[h] = vorrq_u8(cj[h], vandq_u8(vtstq_u8(qh[h], bit), sixteen));
                    }
                }
                c.map(|c| c.map(|v| vreinterpretq_s8_u8(v)))
            },
            dot16,
        )
    }

    /// Q6_K weights · N rows of Q8 activations (`portable::dot_q6k` of
    /// each, bit for bit), the 16-byte products summed by `dot16`; each
    /// super-block's codes unpacked once for all N rows. Activation block
    /// j = 4h + r of a super-block holds elements 128h + 32r + l
    /// (`quant::q6k_code`): the low (r < 2) or high nibble of `ql[64h +
    /// 32(r mod 2) + l]` and bits 2r, 2r+1 of `qh[32h + l]`.
    #[inline]
    pub(crate) fn dot_q6k_with<const N: usize>(
        w: &[BlockQ6K],
        xs: [ActRef; N],
        dot16: impl Fn(int32x4_t, int8x16_t, int8x16_t) -> int32x4_t,
    ) -> [f32; N] {
        debug_assert!(xs.iter().all(|x| w.len() * 8 == x.len()));
        let zero = vdupq_n_s32(0);
        let (m4, m30, off) = (vdupq_n_u8(0x0f), vdupq_n_u8(0x30), vdupq_n_s8(32));
        let mut acc = [[vdupq_n_f32(0.0); 2]; N];
        for (s, b) in w.iter().enumerate() {
            let i = 8 * s;
            // q[j][k]: half k (elements 16k..16k+16) of block j's codes − 32
            let mut q = [[vdupq_n_s8(0); 2]; 8];
            for h in 0..2 {
                let lo = [ld32(&b.ql[64 * h..64 * h + 32]), ld32(&b.ql[64 * h + 32..64 * h + 64])];
                let hi = ld32(&b.qh[32 * h..32 * h + 32]);
                for r in 0..4 {
                    for k in 0..2 {
                        let nib = if r < 2 { vandq_u8(lo[r][k], m4) } else { vshrq_n_u8::<4>(lo[r - 2][k]) };
                        // bits 2r, 2r+1 of qh moved to bits 4, 5
                        let top = vandq_u8(
                            match r {
                                0 => vshlq_n_u8::<4>(hi[k]),
                                1 => vshlq_n_u8::<2>(hi[k]),
                                2 => hi[k],
                                _ => vshrq_n_u8::<2>(hi[k]),
                            },
                            m30,
                        );
                        q[4 * h + r][k] = vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib, top)), off);
                    }
                }
            }
            // SAFETY: `b.scales` is 16 readable i8; `ld1` of bytes needs no alignment.
            let sc = unsafe { vld1q_s8(b.scales.as_ptr()) };
            let (sl, sh) = (vmovl_s8(vget_low_s8(sc)), vmovl_high_s8(sc));
            let sc4 =
                [vmovl_s16(vget_low_s16(sl)), vmovl_high_s16(sl), vmovl_s16(vget_low_s16(sh)), vmovl_high_s16(sh)];
            let d = vdupq_n_f32(f16_bits_to_f32(b.d.to_bits()));
            for (x, acc) in xs.iter().zip(acc.iter_mut()) {
                let xb = x.blocks();
                // p[2j + k]: half k of block j · the same half of activation
                // block i + j, four i32 lanes (exact)
                let mut p = [zero; 16];
                for j in 0..8 {
                    let xq = q8_halves(&xb[i + j].qs);
                    for k in 0..2 {
                        p[2 * j + k] = dot16(zero, q[j][k], xq[k]);
                    }
                }
                // the 16 half sums in order [b0h0, b0h1, b1h0, b1h1], [b2h0, ...], ...,
                // which is also the order of the 16 scales
                let t: [int32x4_t; 4] = unroll!(4, |u| reduce4([p[4 * u], p[4 * u + 1], p[4 * u + 2], p[4 * u + 3]]));
                let st: [int32x4_t; 4] = unroll!(4, |u| vmulq_s32(sc4[u], t[u]));
                // S_j = sc[2j]·Σ half 0 + sc[2j+1]·Σ half 1 (exact), blocks 0..4 and 4..8
                let isum = [vpaddq_s32(st[0], st[1]), vpaddq_s32(st[2], st[3])];
                let dx = act_d8(*x, i);
                for h in 0..2 {
                    acc[h] = vaddq_f32(acc[h], vmulq_f32(vmulq_f32(d, dx[h]), vcvtq_f32_s32(isum[h])));
                }
            }
        }
        acc.map(|a| hsum8(a[0], a[1]))
    }
);
