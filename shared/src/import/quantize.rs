//! The quantiser: float rows to Q8_0 blocks and to fitted Q4_0 blocks, by
//! the rules of `tools/mlb.py` (docs/QUANT.md), operation for operation in
//! f32, so that a GGUF file loaded here and the same file converted by
//! `tools/convert.py` give the same bytes.
//!
//! * Q8_0: d = max|x| / 127, q = round-half-even(x · (1/d)), d stored as f16.
//! * Q4_0 (fitted): the llama.cpp rule first (d0 = m / −8 for the signed
//!   element of largest magnitude, q = clamp(⌊x · (1/d0) + 8.5⌋, 0, 15)),
//!   then d = d0 · f for the 26 factors f of `fit_factors`, each with the
//!   scale rounded to f16 as stored and q = 8 + round-half-even(x · (1/d))
//!   clamped to 0..15; the lowest squared error wins, summed in f32
//!   element by element, an earlier candidate on ties.

use half::f16;

use crate::quant::{BlockQ4_0, BlockQ8_0, QK};

/// `numpy.linspace(0.8, 1.3, 26, dtype=float32)`: computed in f64 as
/// i · ((1.3 − 0.8) / 25) + 0.8, the last one 1.3, then rounded to f32.
fn fit_factors() -> [f32; FACTORS] {
    let step = (1.3f64 - 0.8) / 25.0;
    std::array::from_fn(|i| if i == 25 { 1.3f32 } else { (i as f64 * step + 0.8) as f32 })
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
        // as f32::max does)
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
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Q4Rule {
    /// The fitted search: the max rule and 26 scaled candidates, the
    /// lowest (importance-weighted) squared error.
    Fit,
    /// llama.cpp's rule: the element of largest magnitude on level −8.
    Max,
}

impl Q4Rule {
    pub fn name(self) -> &'static str {
        match self {
            Q4Rule::Fit => "fit",
            Q4Rule::Max => "max",
        }
    }
}

/// Q4_0 blocks of `x` (whole rows of `cols`, a multiple of 32) by `rule`.
/// With `weights` (one per column: the mean square of the activations the
/// column meets, an importance matrix), the fitted search weights each
/// element's squared error by its column's: Σ_j (r_j² · w_j), in order.
///
/// The blocks go through the search `GROUP` at a time, one block per lane
/// (`fit_group`), so that the compiler vectorises every step across blocks
/// while each block's error is still summed element by element in order;
/// a group holding a block the fast arithmetic does not cover (a
/// non-finite value) goes block by block (`fit_block`), with the same
/// results.
pub fn quantize_q4_0(x: &[f32], cols: usize, rule: Q4Rule, weights: Option<&[f32]>, out: &mut [BlockQ4_0]) {
    let n = (x.len() / QK).min(out.len());
    let col = |i: usize| i * QK % cols.max(QK);
    if rule == Q4Rule::Max {
        for (b, blk) in x.chunks_exact(QK).zip(out.iter_mut()) {
            *blk = fit_block(b.try_into().expect("a block of 32"), rule, None);
        }
        return;
    }
    for g in (0..n).step_by(GROUP) {
        let group = Group::gather(x, g, n, |i| weights.map(|w| &w[col(i)..col(i) + QK]));
        let blocks = &mut out[g..(g + GROUP).min(n)];
        if !group.fast(weights.is_some()) {
            for (l, blk) in blocks.iter_mut().enumerate() {
                let b: &[f32; QK] = x[(g + l) * QK..][..QK].try_into().expect("a block of 32");
                let w = weights.map(|w| w[col(g + l)..col(g + l) + QK].try_into().expect("a block of 32 weights"));
                *blk = fit_block(b, rule, w);
            }
        } else if weights.is_some() {
            fit_group::<true>(&group, blocks);
        } else {
            fit_group::<false>(&group, blocks);
        }
    }
}

/// Blocks searched side by side, one per lane.
const GROUP: usize = 8;

/// Candidates a pass of `fit_group` evaluates together (26 = 13 passes).
const PASS: usize = 2;

/// The fitted candidates.
const FACTORS: usize = 26;

/// `GROUP` blocks transposed, `x[j][l]` element j of block l, with their
/// weights likewise (ones without weights); past the last block, zero
/// blocks. `m` is each block's first element of largest magnitude (with
/// its sign), `d0` the max rule's scale m / −8, `d[c]` candidate c's scale as
/// stored, `inv0` and `inv[c]` their inverses.
struct Group {
    x: [[f32; GROUP]; QK],
    w: [[f32; GROUP]; QK],
    m: [f32; GROUP],
    d0: [f32; GROUP],
    inv0: [f32; GROUP],
    d: [[f32; GROUP]; FACTORS],
    inv: [[f32; GROUP]; FACTORS],
}

impl Group {
    fn gather<'a>(x: &[f32], first: usize, n: usize, weights: impl Fn(usize) -> Option<&'a [f32]>) -> Group {
        let mut x_t = [[0.0; GROUP]; QK];
        let mut w_t = [[1.0; GROUP]; QK];
        for l in 0..GROUP.min(n - first) {
            for (row, &v) in x_t.iter_mut().zip(&x[(first + l) * QK..][..QK]) {
                row[l] = v;
            }
            if let Some(w) = weights(first + l) {
                for (row, &v) in w_t.iter_mut().zip(w) {
                    row[l] = v;
                }
            }
        }
        let mut m = x_t[0];
        for row in &x_t[1..] {
            for (m, &v) in m.iter_mut().zip(row) {
                *m = if v.abs() > m.abs() { v } else { *m };
            }
        }
        let d0: [f32; GROUP] = std::array::from_fn(|l| m[l] / -8.0);
        let factors = fit_factors();
        let d: [[f32; GROUP]; FACTORS] = std::array::from_fn(|c| std::array::from_fn(|l| stored(d0[l] * factors[c])));
        Group { x: x_t, w: w_t, m, d0, inv0: d0.map(inverse), d, inv: d.map(|d| d.map(inverse)) }
    }

    /// Whether every block (and its weights, if any) is finite and every
    /// |x · (1/d)| of the max rule and the candidates is below 2^22
    /// (checked at the largest |x|), where `fit_group`'s arithmetic gives
    /// `fit_block`'s codes.
    fn fast(&self, weighted: bool) -> bool {
        let finite = |rows: &[[f32; GROUP]; QK]| rows.iter().flatten().all(|v| v.is_finite());
        let small = |inv: &[f32; GROUP]| (0..GROUP).all(|l| self.m[l].abs() * inv[l].abs() < 4194304.0);
        finite(&self.x) && (!weighted || finite(&self.w)) && small(&self.inv0) && self.inv.iter().all(small)
    }
}

/// The fitted search over a group of finite blocks (`Group::fast`), lane l
/// for block l: the max rule, then the 26 candidates in order, each lane's
/// error summed over j in order, the lowest error kept (an earlier
/// candidate on ties), exactly as `fit_block` does block by block. The
/// codes minus 8 are clamp(round(x · (1/d)), −8, 7), rounded by adding and
/// taking away 1.5·2^23 (exact below 2^22).
fn fit_group<const WEIGHTED: bool>(g: &Group, out: &mut [BlockQ4_0]) {
    const ROUND: f32 = 12582912.0;
    // the max rule: codes ⌊x · (1/d0) + 8.5⌋ clamped to 0..15
    let mut best_d = g.d0.map(stored);
    let mut best_e = [0.0f32; GROUP];
    for (row, w) in g.x.iter().zip(&g.w) {
        for l in 0..GROUP {
            let q = floor(row[l] * g.inv0[l] + 8.5).clamp(0.0, 15.0) - 8.0;
            let r = row[l] - best_d[l] * q;
            best_e[l] += if WEIGHTED { r * r * w[l] } else { r * r };
        }
    }
    // the candidates PASS at a time: their errors are independent sums, so
    // the passes keep that many additions in flight
    let mut best: [Option<usize>; GROUP] = [None; GROUP];
    for first in (0..FACTORS).step_by(PASS) {
        let (d, inv) = (&g.d[first..first + PASS], &g.inv[first..first + PASS]);
        let mut e = [[0.0f32; GROUP]; PASS];
        for (row, w) in g.x.iter().zip(&g.w) {
            for k in 0..PASS {
                for l in 0..GROUP {
                    let q = ((row[l] * inv[k][l] + ROUND) - ROUND).clamp(-8.0, 7.0);
                    let r = row[l] - d[k][l] * q;
                    e[k][l] += if WEIGHTED { r * r * w[l] } else { r * r };
                }
            }
        }
        for k in 0..PASS {
            for l in 0..GROUP {
                if e[k][l] < best_e[l] {
                    (best[l], best_e[l], best_d[l]) = (Some(first + k), e[k][l], d[k][l]);
                }
            }
        }
    }
    for (l, blk) in out.iter_mut().enumerate() {
        let q: [u8; QK] = match best[l] {
            Some(c) => std::array::from_fn(|j| code_to_u8(code(g.x[j][l], g.inv[c][l]))),
            None => std::array::from_fn(|j| code_to_u8(floor(g.x[j][l] * g.inv0[l] + 8.5).clamp(0.0, 15.0))),
        };
        pack_q4(blk, best_d[l], &q);
    }
}

/// One block by `rule`, candidate by candidate, for any values (NaN and
/// infinities included): the max rule, then (for `Fit`) the 26 candidates,
/// the lowest (weighted) squared error kept, an earlier one on ties.
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
        let mut best_e = squared_error(b, w, best_d, &best_q);
        for f in fit_factors() {
            let d = stored(d0 * f);
            let q: [u8; QK] = std::array::from_fn(|j| code_to_u8(code(b[j], inverse(d))));
            let e = squared_error(b, w, d, &q);
            if e < best_e {
                (best_d, best_q, best_e) = (d, q, e);
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
    /// loop (f32::max, round_ties_even, `as i8`), on random blocks with
    /// extreme and non-finite values mixed in.
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
            let amax = b.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
            let qs: Vec<i8> = b.iter().map(|v| (v * inv).round_ties_even() as i8).collect();
            assert_eq!(g.d.to_bits(), f16::from_f32(d).to_bits());
            assert_eq!(&g.qs[..], &qs[..], "{b:?}");
        }
    }

    /// A block by one candidate at a time, in plain loops: the max rule,
    /// then (for `Fit`) the 26 factors, the lowest (weighted) error first.
    fn plain(b: &[f32; QK], rule: Q4Rule, w: Option<&[f32; QK]>) -> BlockQ4_0 {
        let mut m = b[0];
        b.iter().for_each(|&v| {
            if v.abs() > m.abs() {
                m = v
            }
        });
        let err = |d: f32, q: &[u8; QK]| {
            let mut e = 0.0f32;
            for j in 0..QK {
                let r = b[j] - d * (q[j] as f32 - 8.0);
                e += match w {
                    Some(w) => r * r * w[j],
                    None => r * r,
                };
            }
            e
        };
        let d0 = m / -8.0;
        let mut best_q: [u8; QK] = std::array::from_fn(|j| (b[j] * inverse(d0) + 8.5).floor().clamp(0.0, 15.0) as u8);
        let mut best_d = stored(d0);
        let mut best_e = err(best_d, &best_q);
        if rule == Q4Rule::Fit {
            for f in fit_factors() {
                let d = stored(d0 * f);
                let q: [u8; QK] =
                    std::array::from_fn(|j| ((b[j] * inverse(d)).round_ties_even() + 8.0).clamp(0.0, 15.0) as u8);
                let e = err(d, &q);
                if e < best_e {
                    (best_d, best_q, best_e) = (d, q, e);
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

    /// The blocks side by side (eight lanes a group, the tail group part
    /// empty, groups across rows) pick what one block and one candidate at a
    /// time picks, for both rules, with and without column weights (each
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
            let blocks = &blocks[..(blocks.len() / 3 - 1) * 3];
            assert_ne!(blocks.len() % GROUP, 0);
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
        // numpy.linspace(0.8, 1.3, 26, dtype=float32), first, middle and last bits
        let f = fit_factors();
        assert_eq!(f[0].to_bits(), 0x3f4c_cccd);
        assert_eq!(f[10].to_bits(), 0x3f80_0000);
        assert_eq!(f[11].to_bits(), 0x3f82_8f5c);
        assert_eq!(f[25].to_bits(), 0x3fa6_6666);
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
