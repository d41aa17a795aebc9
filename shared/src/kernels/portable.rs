//! Portable kernels: plain Rust, no target features assumed.
//!
//! `Portable` is both the kernel set of builds for an architecture without
//! an ISA module and the scalar reference every ISA module is tested
//! against, bit for bit.
//!
//! Reductions run in a fixed order that does not depend on threads or batch
//! size; integer parts of quantised dot products are exact.

use half::f16;

use super::set::Kernels;
pub(crate) use crate::quant::f16_bits_to_f32;
use crate::quant::{
    e8m0_half, f16_to_f32, q4k_code, q5k_code, q6k_code, scales_mins_k4, ActRef, BlockMxfp4, BlockMxfp4x8, BlockQ4K,
    BlockQ4Kx8, BlockQ4_0x8, BlockQ5K, BlockQ5Kx8, BlockQ6K, BlockQ6Kx8, BlockQ8_0x8, Q4Block, Q8Block, Rows8,
    MXFP4_VALUES, QK,
};

/// The scalar kernel set.
pub struct Portable;

impl Kernels for Portable {
    const ROWS8: bool = false;
    /// Bias of the quants in `BlockQ8_0x8` for `dot_q8_r8` below: none.
    const Q8_X8_BIAS: u8 = 0;

    /// Σ a[i]·b[i] with eight interleaved partial sums combined pairwise.
    #[inline]
    fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        let mut acc = [0.0f32; 8];
        let chunks = a.len() / 8;
        for c in 0..chunks {
            for l in 0..8 {
                acc[l] += a[c * 8 + l] * b[c * 8 + l];
            }
        }
        let mut tail = 0.0f32;
        for i in chunks * 8..a.len() {
            tail += a[i] * b[i];
        }
        combine8(acc) + tail
    }

    /// Σ w[i]·x[i] for f16 weights, same summation order as `dot_f32`.
    #[inline]
    fn dot_f16_f32(w: &[f16], x: &[f32]) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let mut acc = [0.0f32; 8];
        let chunks = w.len() / 8;
        for c in 0..chunks {
            for l in 0..8 {
                acc[l] += f16_to_f32(w[c * 8 + l]) * x[c * 8 + l];
            }
        }
        let mut tail = 0.0f32;
        for i in chunks * 8..w.len() {
            tail += f16_to_f32(w[i]) * x[i];
        }
        combine8(acc) + tail
    }

    /// Q8 weights · Q8 activations: Σ_blocks d_w·d_x·(Σ q_w·q_x), the inner sum exact.
    ///
    /// Reduction order (every ISA module follows it, so all builds agree bit for
    /// bit): block i adds (d_w·d_x)·isum as f32 into partial sum i % 8 (no FMA),
    /// and the eight partial sums are combined as in `dot_f32`.
    #[inline]
    fn dot_q8<'a, B: Q8Block>(w: &[B], x: impl Into<ActRef<'a>>) -> f32 {
        let x = x.into();
        debug_assert_eq!(w.len(), x.len());
        let mut acc = [0.0f32; 8];
        for (i, (bw, bx)) in w.iter().zip(x.blocks()).enumerate() {
            let mut isum = 0i32;
            for (&a, &b) in bw.quants().iter().zip(&bx.qs) {
                isum += a as i32 * b as i32;
            }
            acc[i % 8] += (bw.scale() * bx.d) * isum as f32;
        }
        combine8(acc)
    }

    /// Q4 weights · Q8 activations: Σ_blocks d_w·d_x·(Σ nibble·q_x − 8·Σ q_x),
    /// in `dot_q8`'s order.
    #[inline]
    fn dot_q4<'a, B: Q4Block>(w: &[B], x: impl Into<ActRef<'a>>) -> f32 {
        let x = x.into();
        debug_assert_eq!(w.len(), x.len());
        let mut acc = [0.0f32; 8];
        for (i, (bw, bx)) in w.iter().zip(x.blocks()).enumerate() {
            let mut isum = 0i32;
            for (j, &byte) in bw.nibbles().iter().enumerate() {
                isum += (byte & 0x0f) as i32 * bx.qs[j] as i32;
                isum += (byte >> 4) as i32 * bx.qs[j + QK / 2] as i32;
            }
            isum -= 8 * bx.sum;
            acc[i % 8] += (bw.scale() * bx.d) * isum as f32;
        }
        combine8(acc)
    }

    /// MXFP4 weights · Q8 activations: as `dot_q8`, the weight quants
    /// `MXFP4_VALUES`[nibble] and the scale `e8m0_half(e)`.
    fn dot_mxfp4(w: &[BlockMxfp4], x: ActRef) -> f32 {
        debug_assert_eq!(w.len(), x.len());
        let mut acc = [0.0f32; 8];
        for (i, (bw, bx)) in w.iter().zip(x.blocks()).enumerate() {
            let mut isum = 0i32;
            for (j, &byte) in bw.qs.iter().enumerate() {
                isum += MXFP4_VALUES[(byte & 0x0f) as usize] as i32 * bx.qs[j] as i32;
                isum += MXFP4_VALUES[(byte >> 4) as usize] as i32 * bx.qs[j + QK / 2] as i32;
            }
            acc[i % 8] += (e8m0_half(bw.e) * bx.d) * isum as f32;
        }
        combine8(acc)
    }

    /// Eight interleaved MXFP4 rows (`quant::repack_mxfp4_x8`) · one
    /// activation row: row k's result is `dot_mxfp4` of row k taken out of
    /// the groups (`Rows8::row`).
    fn dot_mxfp4_r8(w: &[BlockMxfp4x8], x: ActRef) -> [f32; 8] {
        std::array::from_fn(|k| Self::dot_mxfp4(&w.iter().map(|b| b.row(k, 0)).collect::<Vec<_>>(), x))
    }

    /// Eight interleaved Q8 rows (`quant::repack_q8_x8` with `Q8_X8_BIAS`) ·
    /// one activation row: row k's result is `dot_q8` of row k, same order.
    fn dot_q8_r8(w: &[BlockQ8_0x8], x: ActRef) -> [f32; 8] {
        debug_assert_eq!(w.len(), x.len());
        let mut acc = [[0.0f32; 8]; 8]; // [row][partial sum]
        for (i, (bw, bx)) in w.iter().zip(x.blocks()).enumerate() {
            for (k, row) in acc.iter_mut().enumerate() {
                let mut isum = 0i32;
                for j in 0..QK {
                    let q = (bw.qs[32 * (j / 4) + 4 * k + j % 4] ^ Self::Q8_X8_BIAS) as i8;
                    isum += q as i32 * bx.qs[j] as i32;
                }
                row[i % 8] += (f16_to_f32(bw.d[k]) * bx.d) * isum as f32;
            }
        }
        acc.map(combine8)
    }

    /// Eight interleaved Q4 rows (`quant::repack_q4_x8`) · one activation row:
    /// row k's result is `dot_q4` of row k, same order.
    fn dot_q4_r8(w: &[BlockQ4_0x8], x: ActRef) -> [f32; 8] {
        debug_assert_eq!(w.len(), x.len());
        let mut acc = [[0.0f32; 8]; 8]; // [row][partial sum]
        for (i, (bw, bx)) in w.iter().zip(x.blocks()).enumerate() {
            for (k, row) in acc.iter_mut().enumerate() {
                let mut isum = 0i32;
                for j in 0..QK / 2 {
                    let byte = bw.qs[32 * (j / 4) + 4 * k + j % 4];
                    isum += (byte & 0x0f) as i32 * bx.qs[j] as i32;
                    isum += (byte >> 4) as i32 * bx.qs[j + QK / 2] as i32;
                }
                isum -= 8 * bx.sum;
                row[i % 8] += (f16_to_f32(bw.d[k]) * bx.d) * isum as f32;
            }
        }
        acc.map(combine8)
    }

    /// Q4_K weights · Q8 activations (`dot_kmin`).
    fn dot_q4k(w: &[BlockQ4K], x: ActRef) -> f32 {
        dot_kmin(w, x, |b| (b.d, b.dmin, &b.scales), q4k_code)
    }

    /// Q5_K weights · Q8 activations (`dot_kmin`).
    fn dot_q5k(w: &[BlockQ5K], x: ActRef) -> f32 {
        dot_kmin(w, x, |b| (b.d, b.dmin, &b.scales), q5k_code)
    }

    /// Q6_K weights · Q8 activations. Activation block i = 8·s + j covers
    /// the groups 2j and 2j + 1 of super-block s; its integer part is exact,
    /// S = sc[2j]·Σ (q − 32)·q_x over the first 16 + sc[2j+1]·Σ over the
    /// second 16 (|S| < 2^24, so S as f32 is exact), and it adds (d·d_x)·S
    /// into partial sum j; then `combine8`.
    fn dot_q6k(w: &[BlockQ6K], x: ActRef) -> f32 {
        debug_assert_eq!(w.len() * 8, x.len());
        let mut acc = [0.0f32; 8];
        for (s, bw) in w.iter().enumerate() {
            for (j, bx) in x.blocks()[8 * s..8 * s + 8].iter().enumerate() {
                let mut isum = 0i32;
                for g in 0..2 {
                    let part: i32 = (0..16)
                        .map(|l| (q6k_code(bw, 32 * j + 16 * g + l) as i32 - 32) * bx.qs[16 * g + l] as i32)
                        .sum();
                    isum += bw.scales[2 * j + g] as i32 * part;
                }
                acc[j] += (f16_to_f32(bw.d) * bx.d) * isum as f32;
            }
        }
        combine8(acc)
    }

    /// Eight interleaved Q4_K rows (`quant::repack_q4k_x8`) · one activation
    /// row: row k's result is `dot_q4k` of row k, the same operations.
    fn dot_q4k_r8(w: &[BlockQ4Kx8], x: ActRef) -> [f32; 8] {
        dot_kmin_r8(w, x, |b, k, j| (b.d[k], b.dmin[k], b.scales[j][k], b.mins[j][k]), |b, k, j, l| b.code(k, j, l))
    }

    /// Eight interleaved Q5_K rows (`quant::repack_q5k_x8`) · one activation
    /// row: row k's result is `dot_q5k` of row k, the same operations.
    fn dot_q5k_r8(w: &[BlockQ5Kx8], x: ActRef) -> [f32; 8] {
        dot_kmin_r8(w, x, |b, k, j| (b.d[k], b.dmin[k], b.scales[j][k], b.mins[j][k]), |b, k, j, l| b.code(k, j, l))
    }

    /// Eight interleaved Q6_K rows (`quant::repack_q6k_x8`) · one activation
    /// row: row k's result is `dot_q6k` of row k, the same operations.
    fn dot_q6k_r8(w: &[BlockQ6Kx8], x: ActRef) -> [f32; 8] {
        debug_assert_eq!(w.len() * 8, x.len());
        let mut acc = [[0.0f32; 8]; 8]; // [row][partial sum]
        for (s, bw) in w.iter().enumerate() {
            for (k, row) in acc.iter_mut().enumerate() {
                for (j, bx) in x.blocks()[8 * s..8 * s + 8].iter().enumerate() {
                    let mut isum = 0i32;
                    for g in 0..2 {
                        let part: i32 = (0..16)
                            .map(|l| {
                                let e = 16 * g + l;
                                let q = bw.code(k, 32 * j + e);
                                (q as i32 - 32) * bx.qs[e] as i32
                            })
                            .sum();
                        isum += bw.scales[2 * j + g][k] as i32 * part;
                    }
                    row[j] += (f16_to_f32(bw.d[k]) * bx.d) * isum as f32;
                }
            }
        }
        acc.map(combine8)
    }

    /// out = x / sqrt(mean(x²) + eps) · w.
    #[inline]
    fn rmsnorm(x: &[f32], w: &[f32], eps: f32, out: &mut [f32]) {
        let ss = Self::dot_f32(x, x);
        let inv = 1.0 / (ss / x.len() as f32 + eps).sqrt();
        for ((o, &v), &g) in out.iter_mut().zip(x).zip(w) {
            *o = v * inv * g;
        }
    }

    /// In-place softmax.
    #[inline]
    fn softmax(x: &mut [f32]) {
        let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        let mut sum = 0.0f32;
        for v in x.iter_mut() {
            *v = (*v - max).exp();
            sum += *v;
        }
        let inv = 1.0 / sum;
        x.iter_mut().for_each(|v| *v *= inv);
    }

    /// y += a·x
    #[inline]
    fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
        for (yv, &xv) in y.iter_mut().zip(x) {
            *yv += a * xv;
        }
    }

    /// gate ← silu(gate) · up  (SwiGLU)
    #[inline]
    fn silu_mul(gate: &mut [f32], up: &[f32]) {
        for (g, &u) in gate.iter_mut().zip(up) {
            *g = *g / (1.0 + (-*g).exp()) * u;
        }
    }

    /// gate ← gelu_tanh(gate) · up  (GeGLU with the tanh approximation)
    #[inline]
    fn gelu_tanh_mul(gate: &mut [f32], up: &[f32]) {
        const SQRT_2_OVER_PI: f32 = 0.797_884_6;
        for (g, &u) in gate.iter_mut().zip(up) {
            let x = *g;
            *g = 0.5 * x * (1.0 + (SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)).tanh()) * u;
        }
    }

    /// f16 → f32 conversion of a slice.
    #[inline]
    fn f16_to_f32(src: &[f16], dst: &mut [f32]) {
        for (d, s) in dst.iter_mut().zip(src) {
            *d = crate::quant::f16_to_f32(*s);
        }
    }

    fn exp(x: &mut [f32]) {
        x.iter_mut().for_each(|v| *v = v.exp());
    }
}

/// Q4_K or Q5_K weights · Q8 activations (`head`: a super-block's d, dmin
/// and packed scales; `code(b, j, l)`: the code of weight l of sub-block j).
/// Activation block i = 8·s + j is sub-block j of super-block s; its
/// integer parts are exact, S = sc[j]·Σ q·q_x and M = m[j]·Σ q_x (the
/// block's `sum`), and it adds (d·d_x)·S − (dmin·d_x)·M (each product
/// rounded, no FMA) into partial sum j = i mod 8, as every quantised dot
/// does; then `combine8`.
#[inline(always)]
fn dot_kmin<B>(
    w: &[B],
    x: ActRef,
    head: impl Fn(&B) -> (f16, f16, &[u8; 12]),
    code: impl Fn(&B, usize, usize) -> u8,
) -> f32 {
    debug_assert_eq!(w.len() * 8, x.len());
    let mut acc = [0.0f32; 8];
    for (s, bw) in w.iter().enumerate() {
        let (d, dmin, scales) = head(bw);
        let (sc, mn) = scales_mins_k4(scales);
        for (j, bx) in x.blocks()[8 * s..8 * s + 8].iter().enumerate() {
            let isum: i32 = (0..QK).map(|l| code(bw, j, l) as i32 * bx.qs[l] as i32).sum();
            acc[j] += k_min_term(f16_to_f32(d), f16_to_f32(dmin), bx.d, sc[j] as i32 * isum, mn[j] as i32 * bx.sum);
        }
    }
    combine8(acc)
}

/// Eight interleaved Q4_K or Q5_K rows · Q8 activations in `dot_kmin`'s
/// operations for each row (`head(b, k, j)`: row k's d, dmin, and sub-block
/// j's scale and min; `code(b, k, j, l)`: row k's code of weight l of
/// sub-block j).
fn dot_kmin_r8<B>(
    w: &[B],
    x: ActRef,
    head: impl Fn(&B, usize, usize) -> (f16, f16, u8, u8),
    code: impl Fn(&B, usize, usize, usize) -> u8,
) -> [f32; 8] {
    debug_assert_eq!(w.len() * 8, x.len());
    let mut acc = [[0.0f32; 8]; 8]; // [row][partial sum]
    for (s, bw) in w.iter().enumerate() {
        for (k, row) in acc.iter_mut().enumerate() {
            for (j, bx) in x.blocks()[8 * s..8 * s + 8].iter().enumerate() {
                let (d, dmin, sc, mn) = head(bw, k, j);
                let isum: i32 = (0..QK).map(|l| code(bw, k, j, l) as i32 * bx.qs[l] as i32).sum();
                row[j] += k_min_term(f16_to_f32(d), f16_to_f32(dmin), bx.d, sc as i32 * isum, mn as i32 * bx.sum);
            }
        }
    }
    acc.map(combine8)
}

/// One Q4_K / Q5_K sub-block's share: (d·d_x)·S − (dmin·d_x)·M with
/// S = sc·Σ q·q_x and M = m·Σ q_x exact integers below 2^24 (so exact as
/// f32), every product rounded on its own (no FMA).
#[inline(always)]
pub(crate) fn k_min_term(d: f32, dmin: f32, dx: f32, s: i32, m: i32) -> f32 {
    (d * dx) * s as f32 - (dmin * dx) * m as f32
}

/// ((a0 + a4) + (a1 + a5)) + ((a2 + a6) + (a3 + a7)).
#[inline]
pub(crate) fn combine8(a: [f32; 8]) -> f32 {
    ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]))
}

/// The x86 builds' `exp4` (`sse2::exp4`, a Cephes polynomial) as scalar IEEE
/// f32, one rounding per operation and `cvtps2dq`'s round to nearest even:
/// the model the builds without x86's instructions (AArch64 NEON, armv7 NEON)
/// are tested against, bit for bit.
#[cfg(test)]
#[cfg_attr(not(any(target_arch = "aarch64", target_arch = "arm")), allow(dead_code))]
pub(crate) fn exp4_model(x: f32) -> f32 {
    let (hi, lo) = (88.72283f32, -103.97208f32);
    if x.is_nan() {
        return x;
    }
    let xc = hi.min(lo.max(x));
    let n = (xc * std::f32::consts::LOG2_E).round_ties_even() as i32;
    let nf = n as f32;
    let r = (xc - nf * 0.693_359_4) - nf * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4f32;
    #[allow(clippy::excessive_precision)]
    for c in [1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1] {
        p = p * r + c;
    }
    let y = ((p * r) * r + r) + 1.0;
    let n1 = n >> 1;
    let pow2 = |k: i32| f32::from_bits(((k + 127) as u32) << 23);
    let v = (y * pow2(n1)) * pow2(n - n1);
    if x > hi {
        f32::INFINITY
    } else if x < lo {
        0.0
    } else {
        v
    }
}
