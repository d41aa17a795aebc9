//! The quantiser: float rows to Q8_0 blocks and to fitted Q4_0 blocks, by
//! the rules of `tools/mlb.py` (docs/QUANT.md), operation for operation in
//! f32, so that a GGUF file loaded here and the same file converted by
//! `tools/convert.py` give the same bytes.
//!
//! * Q8_0: d = max|x| / 127, q = round-half-even(x · (1/d)), d stored as f16.
//! * Q4_0, max rule (llama.cpp's): for the signed element m of largest
//!   magnitude, d0 = m / −8, codes q = clamp(⌊x · (1/d0) + 8.5⌋, 0, 15).
//! * Q4_0, fitted (the default): the max rule's squared error E0 first;
//!   then eight trial scales d = d0 · f (f in 0.8 … 1.3, `trial_factors`),
//!   each rounded to f16 as stored, with levels q − 8 = round-half-even(
//!   clamp(x · (1/d), −8, 7)), and their least-squares sums S_xq = Σ (x·w)·
//!   (q − 8), S_qq = Σ (w·(q − 8))·(q − 8); the trial with the largest
//!   S_xq² / S_qq (the most error its codes' best scale removes; an earlier
//!   one on ties) gives the scale d* = S_xq / S_qq, rounded to f16, whose
//!   codes are computed as the trials' are; it is kept if its squared error
//!   Σ (x − d*·(q − 8))²·w is below E0, else the max rule. Every sum runs in
//!   f32 element by element in order; w is the column's importance (1
//!   without an importance matrix).

use half::f16;

use crate::quant::{BlockQ4_0, BlockQ8_0, QK};

/// `numpy.linspace(0.8, 1.3, 8, dtype=float32)`: computed in f64 as
/// i · ((1.3 − 0.8) / 7) + 0.8, the last one 1.3, then rounded to f32.
fn trial_factors() -> [f32; TRIALS] {
    let step = (1.3f64 - 0.8) / (TRIALS - 1) as f64;
    std::array::from_fn(|i| if i == TRIALS - 1 { 1.3f32 } else { (i as f64 * step + 0.8) as f32 })
}

/// A scale as an f16 field holds it.
fn stored(d: f32) -> f32 {
    f16::from_f32(d).to_f32()
}

/// 1/d, or 0 for a zero scale.
fn inverse(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// Q8_0 blocks of `x` (a multiple of 32 long).
pub fn quantize_q8_0(x: &[f32], out: &mut [BlockQ8_0]) {
    for (b, blk) in x.chunks_exact(QK).zip(out.iter_mut()) {
        let b: &[f32; QK] = b.try_into().expect("a block of 32");
        // the largest magnitude, in eight lanes (a maximum is exact, so the
        // order does not matter; a NaN compares false and is passed over,
        // as in llama.cpp, on every platform, which f32::max is not on armv7)
        let mut lanes = [0.0f32; 8];
        for c in b.chunks_exact(8) {
            for (m, &v) in lanes.iter_mut().zip(c) {
                *m = if v.abs() > *m { v.abs() } else { *m };
            }
        }
        let amax = lanes.iter().fold(0.0f32, |m, &v| if v > m { v } else { m });
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        let mut q = [0.0f32; QK];
        for (q, &v) in q.iter_mut().zip(b) {
            *q = round_even(v * inv);
        }
        for (o, &v) in blk.qs.iter_mut().zip(&q) {
            *o = to_i8(v);
        }
        blk.d = f16::from_f32(d);
    }
}

/// `v as i8` for a whole number `v` (NaN to 0, saturating outside
/// -128..=127) in operations every build vectorises: once clamped, v +
/// 1.5·2^23 is exact and holds v in the low byte of its bits.
#[inline(always)]
fn to_i8(v: f32) -> i8 {
    #[allow(clippy::eq_op)] // v == v: false for NaN only
    let c = if v >= 127.0 {
        127.0
    } else if v <= -128.0 {
        -128.0
    } else if v == v {
        v
    } else {
        0.0
    };
    (c + 12582912.0).to_bits() as u8 as i8
}

/// Rounds half to even, as `f32::round_ties_even`, in plain arithmetic
/// that every build vectorises (SSE2 has no rounding instruction): below
/// 2^23 adding and taking away 2^23 rounds in the current (nearest-even)
/// mode; from 2^23 on every f32 is an integer already.
#[inline(always)]
fn round_even(x: f32) -> f32 {
    let big = 8388608.0f32.copysign(x);
    if x.abs() < 8388608.0 {
        (x + big) - big
    } else {
        x
    }
}

/// `x.floor()` but for the sign of a zero result, in operations every
/// build vectorises (SSE2 has no floor instruction).
#[inline(always)]
fn floor(x: f32) -> f32 {
    let r = round_even(x);
    if r > x {
        r - 1.0
    } else {
        r
    }
}

/// How a Q4_0 block's scale is chosen (`--q4-scale`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Q4Rule {
    Fit,
    Max,
}

impl Q4Rule {
    pub const ALL: [Q4Rule; 2] = [Q4Rule::Fit, Q4Rule::Max];

    /// What it does, for `--help`.
    pub fn help(self) -> &'static str {
        match self {
            Q4Rule::Fit => {
                "The fitted rule: the max rule, or the least-squares scale of the best of eight trial scales' codes, \
                 whichever has the lower (importance-weighted) squared error"
            }
            Q4Rule::Max => "llama.cpp's rule: the element of largest magnitude on level −8",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Q4Rule::Fit => "fit",
            Q4Rule::Max => "max",
        }
    }
}

/// Q4_0 blocks of `x` (whole rows of `cols`, a multiple of 32) by `rule`.
/// With `weights` (one per column: the mean square of the activations the
/// column meets, an importance matrix), the fitted rule weights each
/// element's squared error by its column's (module comment).
///
/// The blocks go through `GROUP` at a time, one block per vector lane
/// (`Group`), so that the compiler vectorises every step across blocks
/// while each block's sums still run element by element in order: in bands
/// of `GROUP` rows, lane l the block of row l at one column (so the lanes
/// share their column weights), and the rows after the last whole band
/// `GROUP` consecutive blocks at a time. A group holding a block the fast
/// arithmetic does not cover (a non-finite value, or a max-rule scale
/// whose inverse overflows) goes block by block (`fit_block`), with the
/// same results.
pub fn quantize_q4_0(x: &[f32], cols: usize, rule: Q4Rule, weights: Option<&[f32]>, out: &mut [BlockQ4_0]) {
    let n = (x.len() / QK).min(out.len());
    let nb = (cols / QK).max(1);
    let weights = weights.filter(|_| rule == Q4Rule::Fit);
    let col = |i: usize| i % nb * QK;
    let block = |i: usize| -> &[f32; QK] { x[i * QK..][..QK].try_into().expect("a block of 32") };
    let block_weights =
        |i: usize| -> Option<&[f32; QK]> { weights.map(|w| w[col(i)..][..QK].try_into().expect("32 weights")) };
    // the lanes' block indices, and the group made from them
    let mut quantize = |lanes: &[usize], group: Group| {
        let made = if group.fast(weights.is_some()) {
            match (rule, weights.is_some()) {
                (Q4Rule::Max, _) => group.pack(&group.max_rule_levels(), &group.d0.map(stored)),
                (Q4Rule::Fit, true) => group.fit::<true>(),
                (Q4Rule::Fit, false) => group.fit::<false>(),
            }
        } else {
            std::array::from_fn(|l| {
                lanes.get(l).map_or_else(BlockQ4_0::default, |&i| fit_block(block(i), rule, block_weights(i)))
            })
        };
        for (&i, blk) in lanes.iter().zip(made) {
            out[i] = blk;
        }
    };
    let banded = n / nb / GROUP * GROUP;
    for r in (0..banded).step_by(GROUP) {
        for c in 0..nb {
            let lanes: [usize; GROUP] = std::array::from_fn(|l| (r + l) * nb + c);
            let group = Group::new(|l| Some(block(lanes[l])), |_| block_weights(c));
            quantize(&lanes, group);
        }
    }
    for first in (banded * nb..n).step_by(GROUP) {
        let lanes: Vec<usize> = (first..(first + GROUP).min(n)).collect();
        let group = Group::new(|l| lanes.get(l).map(|&i| block(i)), |l| lanes.get(l).and_then(|&i| block_weights(i)));
        quantize(&lanes, group);
    }
}

/// Blocks quantised side by side, one per lane: 16 f32 on AVX-512 builds
/// (one register), 8 on the others (one AVX2 register, two SSE or NEON
/// ones).
const GROUP: usize = if cfg!(target_feature = "avx512f") { 16 } else { 8 };

/// Rows `quantize_q4_0` takes together (its lanes): whole bands of them
/// avoid its slower path for the rows after the last band.
pub const BAND_ROWS: usize = GROUP;

/// Trial scales a pass of `Group::fit` evaluates together (8 = 4 passes):
/// their sums are independent, so a pass keeps four chains of additions
/// in flight.
const PASS: usize = 2;

/// The trial scales of the fitted rule.
const TRIALS: usize = 8;

/// Adding and taking away 1.5·2^23 rounds an f32 of magnitude below 2^22
/// to a whole number, half to even.
const ROUND: f32 = 12582912.0;

/// `GROUP` blocks transposed, `x[j][l]` element j of block l, with their
/// weights likewise (ones without weights); past the last block, zero
/// blocks. `m` is each block's first element of largest magnitude (with
/// its sign), `d0` the max rule's scale m / −8 (before rounding to f16) and
/// `inv0` its inverse.
struct Group {
    x: [[f32; GROUP]; QK],
    w: [[f32; GROUP]; QK],
    m: [f32; GROUP],
    d0: [f32; GROUP],
    inv0: [f32; GROUP],
}

impl Group {
    /// Lane l's block and weights (`None` past the last block: a zero
    /// block; weights `None`: ones); lanes whose weights are the same
    /// slice (a band of rows) copy it once and share it.
    fn new<'a>(
        block: impl Fn(usize) -> Option<&'a [f32; QK]>,
        weights: impl Fn(usize) -> Option<&'a [f32; QK]>,
    ) -> Group {
        let mut x_t = [[0.0; GROUP]; QK];
        let mut w_t = [[1.0; GROUP]; QK];
        for l in 0..GROUP {
            if let Some(b) = block(l) {
                for (row, &v) in x_t.iter_mut().zip(b) {
                    row[l] = v;
                }
            }
        }
        match weights(0) {
            Some(w) if (1..GROUP).all(|l| weights(l).is_some_and(|wl| std::ptr::eq(wl, w))) => {
                for (row, &v) in w_t.iter_mut().zip(w) {
                    *row = [v; GROUP];
                }
            }
            _ => {
                for l in 0..GROUP {
                    if let Some(w) = weights(l) {
                        for (row, &v) in w_t.iter_mut().zip(w) {
                            row[l] = v;
                        }
                    }
                }
            }
        }
        let mut m = x_t[0];
        for row in &x_t[1..] {
            for (m, &v) in m.iter_mut().zip(row) {
                *m = if v.abs() > m.abs() { v } else { *m };
            }
        }
        let d0 = m.map(|m| m / -8.0);
        Group { x: x_t, w: w_t, m, d0, inv0: d0.map(inverse) }
    }

    /// Whether every block (and its weights, if any) is finite and every
    /// |m · (1/d0)| is below 2^22, where the arithmetic of `fit` and
    /// `max_rule_levels` gives `fit_block`'s codes.
    fn fast(&self, weighted: bool) -> bool {
        // the largest magnitude's bits: below infinity's iff all are finite
        let widest = |rows: &[[f32; GROUP]; QK]| {
            let mut widest = [0u32; GROUP];
            for row in rows {
                for (m, v) in widest.iter_mut().zip(row) {
                    *m = (*m).max(v.to_bits() & 0x7fff_ffff);
                }
            }
            widest.into_iter().max().unwrap_or(0)
        };
        let small = (0..GROUP).all(|l| (self.m[l] * self.inv0[l]).abs() < 4194304.0);
        small && widest(&self.x) < 0x7f80_0000 && (!weighted || widest(&self.w) < 0x7f80_0000)
    }

    /// The max rule's levels (codes minus 8): ⌊x · (1/d0) + 8.5⌋ clamped to
    /// 0..15, less 8.
    fn max_rule_levels(&self) -> [[f32; GROUP]; QK] {
        let mut q = [[0.0; GROUP]; QK];
        for (q, x) in q.iter_mut().zip(&self.x) {
            for l in 0..GROUP {
                q[l] = floor(x[l] * self.inv0[l] + 8.5).clamp(0.0, 15.0) - 8.0;
            }
        }
        q
    }

    /// Each lane's levels for the scales with inverses `inv`:
    /// round(clamp(x · inv, −8, 7)) (the same numbers as clamp(round(x ·
    /// inv), −8, 7) for any x · inv, infinities included), rounded by
    /// `ROUND`.
    #[inline(always)]
    fn level(x: f32, inv: f32) -> f32 {
        ((x * inv).clamp(-8.0, 7.0) + ROUND) - ROUND
    }

    /// Each lane's squared error Σ_j (x_j − d·q_j)² · w_j, j in order.
    #[inline(always)]
    fn error<const WEIGHTED: bool>(&self, d: &[f32; GROUP], q: &[[f32; GROUP]; QK]) -> [f32; GROUP] {
        let mut e = [0.0f32; GROUP];
        for ((x, w), q) in self.x.iter().zip(&self.w).zip(q) {
            for l in 0..GROUP {
                let r = x[l] - d[l] * q[l];
                e[l] += if WEIGHTED { r * r * w[l] } else { r * r };
            }
        }
        e
    }

    /// The fitted rule, lane l for block l, exactly as `fit_block` does it
    /// block by block: the eight trial scales' least-squares sums, two
    /// trials a pass, the best trial's scale refitted, and that or the max
    /// rule by their errors.
    fn fit<const WEIGHTED: bool>(&self) -> [BlockQ4_0; GROUP] {
        let q0 = self.max_rule_levels();
        let d_max = self.d0.map(stored);
        let e_max = self.error::<WEIGHTED>(&d_max, &q0);
        let mut wx = self.x;
        if WEIGHTED {
            for (wx, w) in wx.iter_mut().zip(&self.w) {
                for l in 0..GROUP {
                    wx[l] *= w[l];
                }
            }
        }
        // the best trial's S_xq² / S_qq (0: none yet) and its two sums
        let (mut best_v, mut best_xq, mut best_qq) = ([0.0f32; GROUP], [0.0f32; GROUP], [0.0f32; GROUP]);
        let factors = trial_factors();
        for first in (0..TRIALS).step_by(PASS) {
            let mut inv = [[0.0f32; GROUP]; PASS];
            for (k, inv) in inv.iter_mut().enumerate() {
                for (inv, &d0) in inv.iter_mut().zip(&self.d0) {
                    *inv = inverse(stored_fast(d0 * factors[first + k]));
                }
            }
            let (mut xq, mut qq) = ([[0.0f32; GROUP]; PASS], [[0.0f32; GROUP]; PASS]);
            for ((x, w), wx) in self.x.iter().zip(&self.w).zip(&wx) {
                for k in 0..PASS {
                    for l in 0..GROUP {
                        let q = Self::level(x[l], inv[k][l]);
                        xq[k][l] += wx[l] * q;
                        qq[k][l] += if WEIGHTED { w[l] * q * q } else { q * q };
                    }
                }
            }
            for k in 0..PASS {
                for l in 0..GROUP {
                    let v = if qq[k][l] > 0.0 { xq[k][l] * xq[k][l] / qq[k][l] } else { 0.0 };
                    let better = v > best_v[l];
                    best_v[l] = if better { v } else { best_v[l] };
                    best_xq[l] = if better { xq[k][l] } else { best_xq[l] };
                    best_qq[l] = if better { qq[k][l] } else { best_qq[l] };
                }
            }
        }
        let mut d_fit = [0.0f32; GROUP];
        let mut inv_fit = [0.0f32; GROUP];
        for l in 0..GROUP {
            // 0/1 where no trial was found: those lanes keep the max rule below
            d_fit[l] = stored_fast(best_xq[l] / if best_v[l] > 0.0 { best_qq[l] } else { 1.0 });
            inv_fit[l] = inverse(d_fit[l]);
        }
        let mut q_fit = [[0.0f32; GROUP]; QK];
        for (q, x) in q_fit.iter_mut().zip(&self.x) {
            for l in 0..GROUP {
                q[l] = Self::level(x[l], inv_fit[l]);
            }
        }
        let e_fit = self.error::<WEIGHTED>(&d_fit, &q_fit);
        let fitted: [bool; GROUP] = std::array::from_fn(|l| best_v[l] > 0.0 && e_fit[l] < e_max[l]);
        for (q, q0) in q_fit.iter_mut().zip(&q0) {
            for l in 0..GROUP {
                q[l] = if fitted[l] { q[l] } else { q0[l] };
            }
        }
        let d: [f32; GROUP] = std::array::from_fn(|l| if fitted[l] { d_fit[l] } else { d_max[l] });
        self.pack(&q_fit, &d)
    }

    /// Lane l's levels and scale as block l: the nibble bytes made across
    /// the lanes (a level plus 8 + 1.5·2^23 holds the code in the low bits
    /// of its f32), then handed out block by block.
    fn pack(&self, q: &[[f32; GROUP]; QK], d: &[f32; GROUP]) -> [BlockQ4_0; GROUP] {
        let mut bytes = [[0u8; GROUP]; QK / 2];
        for (j, b) in bytes.iter_mut().enumerate() {
            for l in 0..GROUP {
                let lo = (q[j][l] + (8.0 + ROUND)).to_bits() & 15;
                let hi = (q[j + QK / 2][l] + (8.0 + ROUND)).to_bits() & 15;
                b[l] = (lo | hi << 4) as u8;
            }
        }
        std::array::from_fn(|l| BlockQ4_0 { d: f16::from_f32(d[l]), qs: std::array::from_fn(|j| bytes[j][l]) })
    }
}

/// `stored(d)` (f16::from_f32(d).to_f32()) for any d but NaN, in integer
/// and float operations every build vectorises: from 2^−14 (f16's
/// smallest normal) on, the f32 bits rounded half to even at bit 13 (a
/// carry moves into the exponent as it should; 65520 and more become
/// infinity); below, the nearest multiple of 2^−24, half to even.
#[inline(always)]
fn stored_fast(d: f32) -> f32 {
    let bits = d.to_bits();
    let abs = bits & 0x7fff_ffff;
    let rounded = if abs >= 0x3880_0000 {
        let r = (abs + 0x0fff + ((abs >> 13) & 1)) & !0x1fff;
        if r >= 0x4780_0000 {
            0x7f80_0000
        } else {
            r
        }
    } else {
        // exact scalings by powers of two around a rounding to a whole number
        let v = f32::from_bits(abs) * 16777216.0;
        (((v + 8388608.0) - 8388608.0) * (1.0 / 16777216.0)).to_bits()
    };
    f32::from_bits((bits & 0x8000_0000) | rounded)
}

/// One block by `rule` for any values (NaN and infinities included), in
/// plain order: the max rule, then (for `Fit`) the trial scales' sums, the
/// best one's least-squares scale, and the lower error of the two.
fn fit_block(b: &[f32; QK], rule: Q4Rule, w: Option<&[f32; QK]>) -> BlockQ4_0 {
    let mut m = b[0];
    for &v in &b[1..] {
        if v.abs() > m.abs() {
            m = v;
        }
    }
    let d0 = m / -8.0;
    let inv0 = inverse(d0);
    let mut best_q: [u8; QK] = std::array::from_fn(|j| code_to_u8(floor(b[j] * inv0 + 8.5).clamp(0.0, 15.0)));
    let mut best_d = stored(d0);
    if rule == Q4Rule::Fit {
        let weight = |j: usize| w.map_or(1.0, |w| w[j]);
        let (mut best_v, mut best_xq, mut best_qq) = (0.0f32, 0.0f32, 0.0f32);
        for f in trial_factors() {
            let inv = inverse(stored(d0 * f));
            let (mut xq, mut qq) = (0.0f32, 0.0f32);
            for (j, &x) in b.iter().enumerate() {
                let q = code_to_u8(code(x, inv)) as f32 - 8.0;
                xq += x * weight(j) * q;
                qq += weight(j) * q * q;
            }
            let v = if qq > 0.0 { xq * xq / qq } else { 0.0 };
            if v > best_v {
                (best_v, best_xq, best_qq) = (v, xq, qq);
            }
        }
        if best_v > 0.0 {
            let d = stored(best_xq / best_qq);
            let q: [u8; QK] = std::array::from_fn(|j| code_to_u8(code(b[j], inverse(d))));
            if squared_error(b, w, d, &q) < squared_error(b, w, best_d, &best_q) {
                (best_d, best_q) = (d, q);
            }
        }
    }
    let mut blk = BlockQ4_0::default();
    pack_q4(&mut blk, best_d, &best_q);
    blk
}

/// A Q4_0 block of scale `d` and codes `q`: byte j holds codes j and j + 16.
fn pack_q4(blk: &mut BlockQ4_0, d: f32, q: &[u8; QK]) {
    for j in 0..QK / 2 {
        blk.qs[j] = q[j] | (q[j + QK / 2] << 4);
    }
    blk.d = f16::from_f32(d);
}

/// The Q4 code of `v` for the scale with inverse `inv`, as a float:
/// round-half-even(v · inv) + 8 clamped to 0..15, NaN as 0 (what `as u8`
/// makes of it).
#[inline(always)]
fn code(v: f32, inv: f32) -> f32 {
    let q = (round_even(v * inv) + 8.0).clamp(0.0, 15.0);
    if q.is_nan() {
        0.0
    } else {
        q
    }
}

/// `q as u8` for a code: a whole number in 0..=15, or NaN (0), in
/// operations every build vectorises (see `to_i8`).
#[inline(always)]
fn code_to_u8(q: f32) -> u8 {
    #[allow(clippy::eq_op)] // q == q: false for NaN only
    let q = if q == q { q } else { 0.0 };
    (q + 12582912.0).to_bits() as u8
}

/// Σ_j (x_j − d·(q_j − 8))² (each times w_j if there are weights) in f32, j in order.
fn squared_error(b: &[f32; QK], w: Option<&[f32; QK]>, d: f32, q: &[u8; QK]) -> f32 {
    let mut e = 0.0f32;
    for j in 0..QK {
        let r = b[j] - d * (q[j] as f32 - 8.0);
        e += match w {
            Some(w) => r * r * w[j],
            None => r * r,
        };
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_rng::Rng;

    /// `got` equals `want` (or both are NaN) on halves, the edges of the
    /// 2^23 trick, extremes, and random bit patterns and fractions.
    fn same_as(got: fn(f32) -> f32, want: fn(f32) -> f32) {
        let mut vals = vec![0.5f32, 1.5, 2.5, -0.5, -1.5, -2.5, 8.5, -8.5, 0.49999997, -0.49999997, 4194303.5];
        vals.extend([4194304.5, 8388607.5, -8388607.5, 8388608.0, 8388609.0, 1e30, -1e30, f32::MAX, f32::MIN_POSITIVE]);
        vals.extend([1e-45, -1e-45, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..100_000 {
            let s = rng.next();
            vals.push(f32::from_bits(s as u32));
            vals.push((s >> 40) as f32 / 64.0 - 131072.0);
        }
        for v in vals {
            let (g, w) = (got(v), want(v));
            assert!(g == w || (g.is_nan() && w.is_nan()), "{v:e}: {g:e} vs {w:e}");
        }
    }

    /// `stored_fast` is `stored` on f16's edges (the normal and subnormal
    /// ranges, their boundary, ties, overflow, zeros, infinities) and on
    /// random bit patterns; `cargo test -- --ignored` checks every f32.
    #[test]
    fn stored_fast_is_stored() {
        let mut vals = vec![0.0f32, -0.0, 65504.0, 65519.996, 65520.0, -65520.0, 6.1035156e-5, 6.1035153e-5];
        vals.extend([5.9604645e-8, 2.9802322e-8, 2.9802326e-8, 8.940697e-8, 1e-40, 1e-45, f32::MAX, f32::INFINITY]);
        vals.extend([f32::NEG_INFINITY, 1.0 + 1.0 / 2048.0, 1.0 + 3.0 / 2048.0, 1.0 + 1.0 / 4096.0, 2047.5, 2048.5]);
        let mut rng = Rng(0x5851_f42d_4c95_7f2d);
        for _ in 0..1_000_000 {
            let s = rng.next();
            vals.push(f32::from_bits(s as u32));
            // around f16's range: exponents 2^-30 .. 2^17
            vals.push(f32::from_bits((s as u32 & 0x807f_ffff) | (((s >> 32) as u32 % 48 + 97) << 23)));
        }
        for v in vals.into_iter().filter(|v| !v.is_nan()) {
            assert_eq!(stored_fast(v).to_bits(), stored(v).to_bits(), "{v:e}");
        }
    }

    #[test]
    #[ignore = "every f32: about a minute"]
    fn stored_fast_is_stored_everywhere() {
        for bits in 0..=u32::MAX {
            let v = f32::from_bits(bits);
            if !v.is_nan() {
                assert_eq!(stored_fast(v).to_bits(), stored(v).to_bits(), "{v:e}");
            }
        }
    }

    #[test]
    fn round_even_is_round_ties_even() {
        same_as(round_even, f32::round_ties_even);
    }

    #[test]
    fn floor_is_floor() {
        same_as(floor, f32::floor);
    }

    #[test]
    fn to_i8_is_as_i8_on_whole_numbers() {
        let mut vals = vec![0.0f32, -0.0, 127.0, 128.0, -128.0, -129.0, 1e30, -1e30, f32::NAN, f32::INFINITY];
        vals.extend([f32::NEG_INFINITY, 8388608.0, -8388608.0, 4194304.0, 3e9]);
        vals.extend((-300..300).map(|i| i as f32));
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..100_000 {
            vals.push(f32::from_bits(rng.next() as u32).round_ties_even());
        }
        for v in vals {
            assert_eq!(to_i8(v), v as i8, "{v:e}");
        }
    }

    /// Q8_0 blocks as llama.cpp's reference rule makes them, in a plain
    /// loop (the largest magnitude by `>`, round_ties_even, `as i8`), on
    /// random blocks with extreme and non-finite values mixed in. A NaN
    /// compares false and is passed over, as in llama.cpp, on every
    /// platform; f32::max is not relied on (on armv7 it returned the NaN).
    #[test]
    fn q8_0_is_the_plain_rule() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut x = Vec::new();
        for i in 0..QK * 4096 {
            let s = rng.next();
            x.push(match i % 97 {
                0 => f32::from_bits(s as u32),
                1 if i % 3 == 0 => f32::INFINITY,
                _ => ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * (1 << (i / QK % 20)) as f32,
            });
        }
        let mut got = vec![BlockQ8_0 { d: f16::ZERO, qs: [0; QK] }; x.len() / QK];
        quantize_q8_0(&x, &mut got);
        for (b, g) in x.chunks_exact(QK).zip(&got) {
            let amax = b.iter().fold(0.0f32, |m, v| if v.abs() > m { v.abs() } else { m });
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let qs: Vec<i8> = b.iter().map(|v| (v * inv).round_ties_even() as i8).collect();
            assert_eq!(g.d.to_bits(), f16::from_f32(d).to_bits());
            assert_eq!(&g.qs[..], &qs[..], "{b:?}");
        }
    }

    /// A block in plain loops, from the rule's text (module comment): the
    /// max rule, then (for `Fit`) the trials, the refit and the choice.
    fn plain(b: &[f32; QK], rule: Q4Rule, w: Option<&[f32; QK]>) -> BlockQ4_0 {
        let mut m = b[0];
        b.iter().for_each(|&v| {
            if v.abs() > m.abs() {
                m = v
            }
        });
        let wt = |j: usize| w.map_or(1.0f32, |w| w[j]);
        let err = |d: f32, q: &[u8; QK]| {
            let mut e = 0.0f32;
            for j in 0..QK {
                let r = b[j] - d * (q[j] as f32 - 8.0);
                e += r * r * wt(j);
            }
            e
        };
        let codes = |d: f32| -> [u8; QK] {
            std::array::from_fn(|j| ((b[j] * inverse(d)).round_ties_even() + 8.0).clamp(0.0, 15.0) as u8)
        };
        let d0 = m / -8.0;
        let mut best_q: [u8; QK] = std::array::from_fn(|j| (b[j] * inverse(d0) + 8.5).floor().clamp(0.0, 15.0) as u8);
        let mut best_d = stored(d0);
        if rule == Q4Rule::Fit {
            let mut best: Option<(f32, f32, f32)> = None;
            for f in trial_factors() {
                let q = codes(stored(d0 * f));
                let (mut xq, mut qq) = (0.0f32, 0.0f32);
                for j in 0..QK {
                    let l = q[j] as f32 - 8.0;
                    xq += b[j] * wt(j) * l;
                    qq += wt(j) * l * l;
                }
                let v = if qq > 0.0 { xq * xq / qq } else { 0.0 };
                if v > best.map_or(0.0, |b| b.0) {
                    best = Some((v, xq, qq));
                }
            }
            if let Some((_, xq, qq)) = best {
                let d = stored(xq / qq);
                let q = codes(d);
                if err(d, &q) < err(best_d, &best_q) {
                    (best_d, best_q) = (d, q);
                }
            }
        }
        let mut blk = BlockQ4_0 { d: f16::from_f32(best_d), ..Default::default() };
        for j in 0..QK / 2 {
            blk.qs[j] = best_q[j] | (best_q[j + QK / 2] << 4);
        }
        blk
    }

    /// Random blocks at many scales, with zeros, outliers, grid values and non-finite values.
    fn hostile_blocks(n: usize) -> Vec<[f32; QK]> {
        let mut rng = Rng(0x1234_5678_9abc_def0);
        (0..n)
            .map(|i| {
                let scale = [1e-6f32, 0.02, 1.0, 300.0, 6e4, 1e-30, 1e30, 1e-7][i % 8];
                let mut b: [f32; QK] = std::array::from_fn(|_| rng.f32() * scale);
                match i % 7 {
                    0 => b[(rng.next() % 32) as usize] = 0.0,
                    1 => b = [0.0; QK],
                    2 => b[(rng.next() % 32) as usize] *= 40.0,
                    3 => b.iter_mut().for_each(|v| *v = (*v * 4.0).round() / 4.0 * scale),
                    4 => b[3] = f32::NAN,
                    5 => b[7] = f32::INFINITY,
                    _ => {}
                }
                b
            })
            .collect()
    }

    /// The blocks side by side (bands of rows, then groups of blocks across
    /// rows, the last one part empty) pick what the rule's plain loops pick, for both rules, with and without column weights (each
    /// block weighted by its own columns within a row of three blocks), on
    /// finite blocks (the groups' arithmetic) and with non-finite ones mixed
    /// in (their groups go block by block).
    #[test]
    fn lanes_pick_what_a_plain_loop_picks() {
        const COLS: usize = 3 * QK;
        let mut rng = Rng(0x0bad_5eed_0123_4567);
        let row_w: Vec<f32> = (0..COLS)
            .map(|j| match j % 9 {
                0 => 0.0,
                1 => 1e6,
                _ => rng.f32().abs() * 3.0,
            })
            .collect();
        let hostile = hostile_blocks(30_000);
        let finite: Vec<[f32; QK]> = hostile.iter().filter(|b| b.iter().all(|v| v.is_finite())).copied().collect();
        for (set, blocks) in [("finite", &finite), ("hostile", &hostile)] {
            // whole rows, and a block count that leaves a part group at the end
            // whole rows of three blocks: bands of GROUP rows, then a tail of
            // rows % GROUP rows that goes GROUP blocks at a time, the last group part empty
            let rows = (blocks.len() / 3 - 1) / GROUP * GROUP - 3;
            let blocks = &blocks[..rows * 3];
            assert!(!rows.is_multiple_of(GROUP) && !(rows * 3).is_multiple_of(GROUP));
            let x: Vec<f32> = blocks.iter().flatten().copied().collect();
            for rule in [Q4Rule::Fit, Q4Rule::Max] {
                for weighted in [false, true] {
                    let mut got = vec![BlockQ4_0::default(); blocks.len()];
                    quantize_q4_0(&x, COLS, rule, weighted.then_some(&row_w[..]), &mut got);
                    for (i, b) in blocks.iter().enumerate() {
                        let w: Option<&[f32; QK]> = weighted.then(|| row_w[i % 3 * QK..][..QK].try_into().unwrap());
                        let want = plain(b, rule, w);
                        let what = format!("{set}: {rule:?} weighted {weighted} block {i}: {b:?}");
                        assert_eq!(bytemuck::bytes_of(&got[i]), bytemuck::bytes_of(&want), "{what}");
                    }
                }
            }
        }
    }

    /// Weighting changes the choice: a heavy column is fitted at the others' cost.
    #[test]
    fn weights_move_the_error_to_unimportant_columns() {
        let b: [f32; QK] =
            std::array::from_fn(|j| ((j * 37 % 29) as f32 - 14.0) * 0.013 + if j == 5 { 0.07 } else { 0.0 });
        let mut w = [1.0f32; QK];
        w[5] = 1e4;
        let (mut plain_blk, mut weighted_blk) = ([BlockQ4_0::default()], [BlockQ4_0::default()]);
        quantize_q4_0(&b, QK, Q4Rule::Fit, None, &mut plain_blk);
        quantize_q4_0(&b, QK, Q4Rule::Fit, Some(&w), &mut weighted_blk);
        let value = |blk: &BlockQ4_0, j: usize| {
            let q = if j < 16 { blk.qs[j] & 15 } else { blk.qs[j - 16] >> 4 };
            blk.d.to_f32() * (q as f32 - 8.0)
        };
        let e5 = |blk: &BlockQ4_0| (value(blk, 5) - b[5]).abs();
        assert!(e5(&weighted_blk[0]) < e5(&plain_blk[0]), "{} vs {}", e5(&weighted_blk[0]), e5(&plain_blk[0]));
    }

    #[test]
    fn factors_are_numpys() {
        // numpy.linspace(0.8, 1.3, 8, dtype=float32)
        let bits = trial_factors().map(f32::to_bits);
        assert_eq!(
            bits,
            [0x3f4c_cccd, 0x3f5f_15f1, 0x3f71_5f16, 0x3f81_d41d, 0x3f8a_f8b0, 0x3f94_1d42, 0x3f9d_41d4, 0x3fa6_6666]
        );
    }

    #[test]
    fn quantised_blocks_are_close_and_never_worse_than_the_max_rule() {
        let x: Vec<f32> = Rng(0x1234_5678_9abc_def0).vec(64 * QK).iter().map(|v| v * 0.05).collect();
        let mut q8 = vec![BlockQ8_0::default(); 64];
        quantize_q8_0(&x, &mut q8);
        let mut q4 = vec![BlockQ4_0::default(); 64];
        quantize_q4_0(&x, x.len(), Q4Rule::Fit, None, &mut q4);
        for (i, b) in x.chunks_exact(QK).enumerate() {
            let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d8 = q8[i].d.to_f32();
            for (j, &v) in b.iter().enumerate() {
                assert!((v - d8 * q8[i].qs[j] as f32).abs() <= d8 * 0.51 + amax * 1e-3, "q8 block {i} elt {j}");
            }
            // the fitted scale's error is at most the max rule's (its first candidate)
            let d4 = q4[i].d.to_f32();
            let q: [u8; QK] = std::array::from_fn(|j| {
                let byte = q4[i].qs[j % 16];
                if j < 16 {
                    byte & 15
                } else {
                    byte >> 4
                }
            });
            let bb: &[f32; QK] = b.try_into().unwrap();
            let mut m = bb[0];
            bb.iter().for_each(|&v| {
                if v.abs() > m.abs() {
                    m = v
                }
            });
            let d0 = m / -8.0;
            let q0: [u8; QK] = std::array::from_fn(|j| (bb[j] * inverse(d0) + 8.5).floor().clamp(0.0, 15.0) as u8);
            let (e4, e0) = (squared_error(bb, None, d4, &q), squared_error(bb, None, stored(d0), &q0));
            assert!(e4 <= e0, "q4 block {i}");
        }
        // zero blocks: zero scales
        let mut z4 = [BlockQ4_0::default()];
        quantize_q4_0(&[0.0; QK], QK, Q4Rule::Fit, None, &mut z4);
        assert_eq!(z4[0].d.to_f32(), 0.0);
    }
}
